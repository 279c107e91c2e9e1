//! RMSNorm: `y = x / sqrt(mean(x^2) + eps) * w` (squares summed in f64, as ggml does).

/// RMS-normalizes each `w.len()`-wide row of `x` into `out`, multiplying by `w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let dim = w.len();
    assert_eq!(x.len(), out.len(), "rms_norm: shape");
    assert_eq!(x.len() % dim, 0, "rms_norm: width");
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        // Squares in f32, summed in f64: the same rounding as ggml.
        let ss: f64 = xr.iter().map(|v| (v * v) as f64).sum();
        let mean = (ss / dim as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, v), g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}
