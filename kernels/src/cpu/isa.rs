//! Run-time selection of the instruction set for the fast paths.
//!
//! `PAGEWARDEN_ISA=portable|avx2|avx512` caps the choice (for A/B measurements and for
//! reproducing a bug on a smaller machine); `PAGEWARDEN_FORCE_PORTABLE` is the older spelling
//! of `portable`. A cap above what the CPU has is ignored.

use std::sync::OnceLock;

/// The instruction set a kernel runs with. `Portable` is the reference every SIMD path is
/// tested against; every path gives the same bits on the quantized matmuls (integer dot
/// products, the same float order) and on the elementwise kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, no target-specific code.
    Portable,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 + FMA + F16C and AVX-512 F, BW, VL with VNNI (`vpdpbusd` for the 8-bit dot
    /// products): Intel since Ice Lake / Cascade Lake, AMD since Zen 4.
    Avx512,
}

impl Isa {
    /// The best instruction set this CPU supports, within `PAGEWARDEN_ISA` (detected once,
    /// cached).
    pub fn detect() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            let best = Isa::available().into_iter().max().unwrap_or(Isa::Portable);
            let cap = if std::env::var_os("PAGEWARDEN_FORCE_PORTABLE").is_some() {
                Some(Isa::Portable)
            } else {
                std::env::var("PAGEWARDEN_ISA")
                    .ok()
                    .and_then(|v| Isa::parse(&v))
            };
            cap.map_or(best, |c| c.min(best))
        })
    }

    /// Every instruction set usable on this CPU, portable first (tests run each of them).
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        v.extend(detect_x86());
        v
    }

    /// The lower-case name (`portable`, `avx2`, `avx512`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Parses [`Isa::name`]'s spelling.
    pub fn parse(s: &str) -> Option<Isa> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_x86() -> Vec<Isa> {
    let mut v = Vec::new();
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        v.push(Isa::Avx2);
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
        {
            v.push(Isa::Avx512);
        }
    }
    v
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_x86() -> Vec<Isa> {
    Vec::new()
}
