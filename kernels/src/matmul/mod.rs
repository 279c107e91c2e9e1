//! Matrix products `out[t][r] = sum_c w[r][c] * x[t][c]` for quantized or float weights.
//!
//! Quantized weights take the llama.cpp route: the activations are quantized to 8 bits per
//! 32-block and the dot products run in integers (`act`). Work is split over output rows; inside
//! one chunk of rows the activations are walked in tiles of tokens so each weight block is
//! unpacked once per tile (prefill reuses the weights across tokens).

mod avx2;
pub mod portable;

use crate::act::{quantize_acts, QuantizedActs};
use crate::isa::Isa;
use crate::parallel::Parallel;
use crate::quant::WeightType;

/// A borrowed row-major weight matrix in one of the supported storage types.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    /// Storage type.
    pub ty: WeightType,
    /// Output rows.
    pub rows: usize,
    /// Elements per row (the contiguous dimension).
    pub cols: usize,
    /// `rows * ty.row_bytes(cols)` bytes.
    pub data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// Wraps `data`, checking its length against the shape.
    pub fn new(ty: WeightType, rows: usize, cols: usize, data: &'a [u8]) -> Option<QMatrix<'a>> {
        let need = ty.row_bytes(cols)?.checked_mul(rows)?;
        (data.len() == need).then_some(QMatrix {
            ty,
            rows,
            cols,
            data,
        })
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.ty
            .row_bytes(self.cols)
            .expect("checked at construction")
    }

    /// The bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// The activations in the form the weight type's dot product wants.
pub(crate) enum Acts<'a> {
    /// For F32/F16 weights: plain floats, `tokens * cols`.
    Float(&'a [f32]),
    /// For quantized weights.
    Quant(QuantizedActs),
}

/// `out[t * w.rows + r] = dot(w.row(r), x[t * w.cols..])` for `t < tokens`, with the best ISA.
pub fn matmul(w: &QMatrix<'_>, x: &[f32], tokens: usize, out: &mut [f32], par: &Parallel) {
    matmul_with(Isa::detect(), w, x, tokens, out, par)
}

/// [`matmul`] with an explicit instruction set (tests compare every ISA with `Portable`).
pub fn matmul_with(
    isa: Isa,
    w: &QMatrix<'_>,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
    par: &Parallel,
) {
    assert_eq!(x.len(), tokens * w.cols, "activation shape");
    assert_eq!(out.len(), tokens * w.rows, "output shape");
    if tokens == 0 || w.rows == 0 {
        return;
    }
    let acts = match w.ty {
        WeightType::F32 | WeightType::F16 => Acts::Float(x),
        WeightType::Q4_0 | WeightType::Q4_1 | WeightType::Q8_0 => {
            Acts::Quant(quantize_acts(x, tokens, w.cols))
        }
    };
    let chunk_rows = (w.rows / (par.threads() * 4)).clamp(8, 64);
    // Each chunk computes `chunk_rows x tokens` (row-major by weight row), then it is transposed.
    let mut tmp = vec![0f32; w.rows * tokens];
    par.for_each_chunk(&mut tmp, chunk_rows * tokens, |i, chunk| {
        let r0 = i * chunk_rows;
        let n = chunk.len() / tokens;
        rows_kernel(isa, w, r0, n, &acts, tokens, chunk);
    });
    for r in 0..w.rows {
        for t in 0..tokens {
            out[t * w.rows + r] = tmp[r * tokens + t];
        }
    }
}

/// Computes rows `r0..r0+n` for all tokens into `out[(r - r0) * tokens + t]`.
fn rows_kernel(
    isa: Isa,
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    acts: &Acts<'_>,
    tokens: usize,
    out: &mut [f32],
) {
    match isa {
        Isa::Portable => portable::rows(w, r0, n, acts, tokens, out),
        Isa::Avx2 => avx2::rows(w, r0, n, acts, tokens, out),
    }
}
