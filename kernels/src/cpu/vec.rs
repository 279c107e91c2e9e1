//! Small f32 vector primitives. Bodies are written once (`#[inline(always)]`, eight independent
//! accumulators so the compiler vectorizes them) and compiled per instruction set.

use crate::isa::Isa;

/// Dot product of two equal-length f32 slices.
#[inline(always)]
pub(crate) fn dot_body(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Dot product of two equal-length f32 slices, with the best instruction set.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    match Isa::detect() {
        Isa::Portable => dot_body(a, b),
        // SAFETY: Avx2 is only detected when the CPU has avx2 and fma.
        Isa::Avx2 | Isa::Avx512 => unsafe { dot_avx2(a, b) },
    }
}

#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_body(a, b)
}
