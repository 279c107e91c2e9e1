//! RMSNorm: `y = x / sqrt(mean(x^2) + eps) * w` (squares summed in f64, as ggml does).

use crate::isa::Isa;

/// RMS-normalizes each `w.len()`-wide row of `x` into `out`, multiplying by `w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    rms_norm_with(Isa::detect(), x, w, eps, out)
}

/// [`rms_norm`] compiled for an explicit instruction set (every one gives the same bits: the
/// f64 sum keeps ggml's order, the rest is elementwise).
pub fn rms_norm_with(isa: Isa, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "rms_norm: shape");
    assert!(
        x.is_empty() || (!w.is_empty() && x.len().is_multiple_of(w.len())),
        "rms_norm: width"
    );
    match isa {
        Isa::Portable => rms_norm_body(x, w, eps, out),
        // SAFETY: Avx2 is only detected when the CPU has avx2 and fma.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { rms_norm_avx2(x, w, eps, out) },
        // SAFETY: Avx512 is only detected when the CPU has avx512f.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { rms_norm_avx512(x, w, eps, out) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 => rms_norm_body(x, w, eps, out),
    }
}

#[inline(always)]
fn rms_norm_body(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let dim = w.len();
    if dim == 0 {
        return;
    }
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        // Squares in f32, summed in f64 in order: the same rounding as ggml.
        let ss: f64 = xr.iter().map(|v| (v * v) as f64).sum();
        let mean = (ss / dim as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, v), g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rms_norm_avx2(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    rms_norm_body(x, w, eps, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn rms_norm_avx512(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    rms_norm_body(x, w, eps, out)
}
