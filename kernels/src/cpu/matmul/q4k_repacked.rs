//! Q4_K products in the float order of llama.cpp's repacked CPU kernels, the reference for
//! every ISA.
//!
//! On x86 with AVX2, llama.cpp (the 0.3.36 sdist's ggml) does not run a Q4_K matrix whose row
//! count is a multiple of 8 through `ggml_vec_dot_q4_K_q8_K` (our `kquant_portable`) but
//! repacks it at load into blocks of eight interleaved rows (`block_q4_Kx8`) and runs
//! `ggml_gemm_q4_K_8x8_q8_K` on the activation rows in groups of four and
//! `ggml_gemv_q4_K_8x8_q8_K` on the leftover rows (`forward_mul_mat_one_chunk`: the first
//! `tokens - tokens % 4` rows, then one at a time; decode is all gemv). No other type of
//! Gemma's Q4_K_M mix (Q5_0, Q6_K, Q8_0) has an x86 repacked kernel in that version (Q6_K
//! takes its tiled kernel from 8 rows on: `kquant_tiled`).
//!
//! Both kernels form exact integer sums and differ only in how often they go to floats; with
//! `da` the activation block's scale and `d`, `dmin` the row's f16 scales:
//!
//! - gemv, once per super-block: `acc = fma(f32(sum_j sc_j * dot_j), d * da, acc)` and
//!   `accm = fma(f32(sum_j m_j * bsum_j), dmin * da, accm)`, over the eight 32-element
//!   sub-blocks `j` (`dot_j` the sub-block's `sum q * y`, `bsum_j` the sum of its `y`);
//! - gemm, once per pair of sub-blocks `(2s, 2s + 1)`, four times per super-block, the same
//!   two fused multiply-adds over the pair's two terms.
//!
//! The result is `acc - accm`. The AVX-512 and AVX2 branches of each kernel share this order
//! per output, and so do the activation quantizers (`ggml_quantize_mat_q8_K_4x8` for the
//! gemm rows, `quantize_row_q8_K` for the others: the same values, up to the sign of a block
//! whose largest magnitude appears with both signs, which leaves every product's bits).

use super::QMatrix;
use crate::act_k::QuantizedActsK;
use crate::quant::{f16_at, WeightType};
use crate::quant_k::{q45_k_values, scales_mins, QK_K};

/// Rows per interleaved block in llama.cpp: matrices with another row count keep the
/// `vec_dot` order.
pub const INTERLEAVE: usize = 8;

/// Whether llama.cpp runs `w` repacked: Q4_K in whole blocks of [`INTERLEAVE`] rows.
pub fn applies(w: &QMatrix<'_>) -> bool {
    w.ty == WeightType::Q4_K && w.rows.is_multiple_of(INTERLEAVE)
}

/// Which of llama.cpp's two repacked kernels computes an activation row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `ggml_gemm_q4_K_8x8_q8_K`: rows in whole groups of four; floats per sub-block pair.
    Gemm,
    /// `ggml_gemv_q4_K_8x8_q8_K`: the `tokens % 4` last rows; floats per super-block.
    Gemv,
}

impl Route {
    /// The kernel llama.cpp runs token `t` of a `tokens`-row product through.
    pub fn of(t: usize, tokens: usize) -> Route {
        if t < tokens - tokens % 4 {
            Route::Gemm
        } else {
            Route::Gemv
        }
    }

    /// Integer partial sums per super-block that go to floats one at a time.
    pub(crate) fn parts(self) -> usize {
        match self {
            Route::Gemm => 4,
            Route::Gemv => 1,
        }
    }
}

/// The float side of one (row, token) product: two fused chains and a final difference.
#[derive(Clone, Copy, Default)]
pub(crate) struct RepackAcc {
    acc: f32,
    acc_min: f32,
}

impl RepackAcc {
    /// Adds one exact partial sum (a super-block or a sub-block pair) and its minimum term.
    #[inline(always)]
    pub(crate) fn add(&mut self, sum: i32, scale: f32, mins: i32, min_scale: f32) {
        self.acc = (sum as f32).mul_add(scale, self.acc);
        self.acc_min = (mins as f32).mul_add(min_scale, self.acc_min);
    }

    /// `acc - accm`.
    #[inline(always)]
    pub(crate) fn finish(self) -> f32 {
        self.acc - self.acc_min
    }
}

/// `m_{2s} * bsum_{2s} + m_{2s+1} * bsum_{2s+1}` summed over the `n` pairs `s` of part `p`
/// (`n` = 4 / parts): the minimum term of one partial sum; `bsums` are the 16-element sums.
#[inline(always)]
pub(crate) fn mins_part(m: &[u8; 8], bsums: &[i16], p: usize, parts: usize) -> i32 {
    let per = 8 / parts;
    (p * per..(p + 1) * per)
        .map(|j| m[j] as i32 * (bsums[2 * j] as i32 + bsums[2 * j + 1] as i32))
        .sum()
}

/// Dot of one Q4_K row with token `t` of `a`, in `route`'s order.
pub fn dot_q4_k(route: Route, row: &[u8], a: &QuantizedActsK, t: usize) -> f32 {
    let nb = a.blocks();
    let parts = route.parts();
    let per = 8 / parts;
    let mut acc = RepackAcc::default();
    for b in 0..nb {
        let blk = &row[b * 144..(b + 1) * 144];
        let y = &a.qs[t * a.cols + b * QK_K..][..QK_K];
        let k = t * nb + b;
        let (sc, m) = scales_mins(blk);
        let q = q45_k_values(false, blk);
        let da = a.d[k];
        let (scale, min_scale) = (f16_at(blk, 0) * da, f16_at(blk, 2) * da);
        for p in 0..parts {
            let sum: i32 = (p * per..(p + 1) * per)
                .map(|j| {
                    let e = 32 * j..32 * j + 32;
                    let dot: i32 = q[e.clone()]
                        .iter()
                        .zip(&y[e])
                        .map(|(&q, &y)| q as i32 * y as i32)
                        .sum();
                    sc[j] as i32 * dot
                })
                .sum();
            let mins = mins_part(&m, &a.bsums[k * 16..(k + 1) * 16], p, parts);
            acc.add(sum, scale, mins, min_scale);
        }
    }
    acc.finish()
}
