//! Run-time selection of the instruction set for the fast paths.

use std::sync::OnceLock;

/// The instruction set a kernel runs with. `Portable` is the reference every SIMD path is
/// tested against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, no target-specific code.
    Portable,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
}

impl Isa {
    /// The best instruction set this CPU supports (detected once, cached).
    pub fn detect() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            if std::env::var_os("PAGEWARDEN_FORCE_PORTABLE").is_some() {
                return Isa::Portable;
            }
            detect_x86().unwrap_or(Isa::Portable)
        })
    }

    /// Every instruction set usable on this CPU, portable first (for tests).
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        if let Some(isa) = detect_x86() {
            v.push(isa);
        }
        v
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_x86() -> Option<Isa> {
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        Some(Isa::Avx2)
    } else {
        None
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_x86() -> Option<Isa> {
    None
}
