//! Activation quantization for the integer dot products: each 32-element block of an f32
//! activation row becomes 32 i8 values with one scale `d` (rounded through f16, as ggml does)
//! and, for Q4_1 weights, `s = d * sum(q)` so the weight minimum can be applied per block.

use crate::isa::Isa;
use crate::quant::{round_f16, QK};

/// A batch of activation rows quantized per 32-element block.
#[derive(Clone, Debug, Default)]
pub struct QuantizedActs {
    /// Elements per row.
    pub cols: usize,
    /// Number of rows (tokens).
    pub rows: usize,
    /// `rows * cols` quantized values, row-major.
    pub qs: Vec<i8>,
    /// `rows * cols / 32` block scales.
    pub d: Vec<f32>,
    /// `rows * cols / 32` block sums times scale (Q8_1's `s`).
    pub s: Vec<f32>,
}

impl QuantizedActs {
    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.cols / QK
    }
}

/// Quantizes `rows` rows of `cols` elements (`cols % 32 == 0`).
pub fn quantize_acts(x: &[f32], rows: usize, cols: usize) -> QuantizedActs {
    assert_eq!(cols % QK, 0, "activation width must be a multiple of 32");
    assert_eq!(x.len(), rows * cols, "activation length");
    let nb = rows * cols / QK;
    let mut q = QuantizedActs {
        cols,
        rows,
        qs: vec![0; rows * cols],
        d: vec![0.0; nb],
        s: vec![0.0; nb],
    };
    match Isa::detect() {
        Isa::Portable => quantize_blocks(x, &mut q),
        // SAFETY: Avx2 is only detected when the CPU has avx2 (and so SSE4.1's `roundps`).
        Isa::Avx2 | Isa::Avx512 => unsafe { quantize_blocks_avx2(x, &mut q) },
    }
    q
}

/// [`quantize_blocks`] compiled for AVX2, where rounding is one instruction, not a libm call.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn quantize_blocks_avx2(x: &[f32], q: &mut QuantizedActs) {
    quantize_blocks(x, q)
}

/// ggml's `quantize_row_q8_1` (x86): `d = amax / 127`, `q = round_even(x * (127 / amax))`.
#[inline(always)]
fn quantize_blocks(x: &[f32], q: &mut QuantizedActs) {
    for (b, (xs, qs)) in x
        .chunks_exact(QK)
        .zip(q.qs.chunks_exact_mut(QK))
        .enumerate()
    {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (o, v) in qs.iter_mut().zip(xs) {
            let r = (v * id).round_ties_even() as i32;
            sum += r;
            *o = r as i8;
        }
        q.d[b] = round_f16(d);
        q.s[b] = round_f16(d * sum as f32);
    }
}
