//! Q8_K activations for the K-quant dot products (ggml's `quantize_row_q8_K_ref`): per
//! 256-element block, `d = max / -127` where `max` is the value of largest magnitude (kept
//! in f32), `q = min(127, round_even(x * -127 / max))`, and the sums of each 16 values.

use crate::quant_k::QK_K;

/// A batch of activation rows quantized per 256-element block.
#[derive(Clone, Debug, Default)]
pub struct QuantizedActsK {
    /// Elements per row.
    pub cols: usize,
    /// Number of rows (tokens).
    pub rows: usize,
    /// `rows * cols` quantized values, row-major.
    pub qs: Vec<i8>,
    /// `rows * cols / 256` block scales.
    pub d: Vec<f32>,
    /// `rows * cols / 16` sums of 16 consecutive values.
    pub bsums: Vec<i16>,
}

impl QuantizedActsK {
    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.cols / QK_K
    }
}

/// Quantizes `rows` rows of `cols` elements (`cols % 256 == 0`).
pub fn quantize_acts_k(x: &[f32], rows: usize, cols: usize) -> QuantizedActsK {
    assert_eq!(
        cols % QK_K,
        0,
        "Q8_K activation width must be a multiple of 256"
    );
    assert_eq!(x.len(), rows * cols, "activation length");
    let nb = rows * cols / QK_K;
    let mut q = QuantizedActsK {
        cols,
        rows,
        qs: vec![0; rows * cols],
        d: vec![0.0; nb],
        bsums: vec![0; rows * cols / 16],
    };
    for (b, (xs, qs)) in x
        .chunks_exact(QK_K)
        .zip(q.qs.chunks_exact_mut(QK_K))
        .enumerate()
    {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in xs {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            // qs and bsums stay zero.
            continue;
        }
        let iscale = -127.0 / max;
        for (o, v) in qs.iter_mut().zip(xs) {
            *o = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (s, g) in q.bsums[b * 16..(b + 1) * 16]
            .iter_mut()
            .zip(qs.chunks_exact(16))
        {
            *s = g.iter().map(|&v| v as i16).sum();
        }
        q.d[b] = 1.0 / iscale;
    }
    q
}
