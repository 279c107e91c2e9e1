//! K-quant products in the float order of llama.cpp's tiled CPU matmul, which the 0.3.36
//! sdist's ggml runs instead of `ggml_vec_dot_*_q8_K` (`kquant_portable`'s order) when a
//! product has at least [`MIN_TOKENS`] activation rows and its weights are Q6_K, Q5_K, or a
//! Q4_K matrix that is not repacked ([`q4k_repacked::applies`]): `ggml-cpu/tiled`,
//! `ggml_compute_forward_mul_mat_tiled`, taken unless `GGML_CPU_TILED_MM=0`.
//!
//! Its integer sums are per super-block: with `q` the weight values (Q6_K's minus 32), `y` the
//! token's Q8_K values, `sc_j` / `m_j` sub-block `j`'s scale and minimum and `bsum_j` the sum
//! of its `y`,
//!
//! - `s1 = sum_j sc_j * sum(q * y)` and `s2 = sum_j m_j * bsum_j` (Q4_K / Q5_K), exact;
//! - `r = f32(s1) * d`, then `r = fma(-dmin, f32(s2), r)` (Q4_K / Q5_K);
//! - `acc = fma(r, da, acc)`, `da` the activation block's scale.
//!
//! That is the epilogue of its AVX2 microkernel, and the reference build's bits (checked on
//! Gemma 3's Q6_K `ffn_down` against `llama-eval-callback`'s dump: equal for 8, 16 and 17
//! rows). Its AVX-512 VNNI microkernel rounds the last step twice (a product, then a sum), which
//! that build does not show. Both of our instruction sets take the fused step, so they agree
//! with each other and with the reference.

use super::q4k_repacked;
use super::QMatrix;
use crate::act_k::QuantizedActsK;
use crate::matmul::kquant_portable::{lanes, mins_lanes, q6_k_take_offset};
use crate::quant::{f16_at, WeightType};
use crate::quant_k::{q45_k_values, q6_k_scales, q6_k_values, scales_mins, Q6_K_D, QK_K};

/// Activation rows from which llama.cpp takes the tiled path (`ggml_tiled_min_batch`).
pub const MIN_TOKENS: usize = 8;

/// Whether llama.cpp computes `w` times `tokens` activation rows through the tiled path.
pub fn applies(w: &QMatrix<'_>, tokens: usize) -> bool {
    tokens >= MIN_TOKENS
        && match w.ty {
            WeightType::Q5_K | WeightType::Q6_K => true,
            WeightType::Q4_K => !q4k_repacked::applies(w),
            _ => false,
        }
}

/// The float side of one (row, token) product in the tiled order.
#[derive(Clone, Copy, Default)]
pub(crate) struct TiledAcc(f32);

impl TiledAcc {
    /// Adds one super-block: its exact sums `s1`, `s2`, the row's `d`, `dmin` and the
    /// activation block's `da` (`dmin` and `s2` are zero for Q6_K).
    #[inline(always)]
    pub(crate) fn add(&mut self, s1: i32, d: f32, s2: i32, dmin: f32, da: f32) {
        let r = (-dmin).mul_add(s2 as f32, s1 as f32 * d);
        self.0 = r.mul_add(da, self.0);
    }

    /// The product.
    #[inline(always)]
    pub(crate) fn finish(self) -> f32 {
        self.0
    }
}

/// Dot of one Q4_K, Q5_K or Q6_K row with token `t` of `a`, in the tiled order.
pub fn dot(ty: WeightType, row: &[u8], a: &QuantizedActsK, t: usize) -> f32 {
    let nb = a.blocks();
    let bytes = ty.block_bytes();
    let mut acc = TiledAcc::default();
    for b in 0..nb {
        let blk = &row[b * bytes..(b + 1) * bytes];
        let y = &a.qs[t * a.cols + b * QK_K..][..QK_K];
        let k = t * nb + b;
        let bsums = &a.bsums[k * 16..(k + 1) * 16];
        match ty {
            WeightType::Q4_K | WeightType::Q5_K => {
                let (sc, m) = scales_mins(blk);
                let q = q45_k_values(ty == WeightType::Q5_K, blk);
                let s1: i32 = lanes(&q, y, |r, _| sc[r] as i32).iter().sum();
                let s2: i32 = mins_lanes(&m, bsums).iter().sum();
                acc.add(s1, f16_at(blk, 0), s2, f16_at(blk, 2), a.d[k]);
            }
            WeightType::Q6_K => {
                let sc = q6_k_scales(blk);
                let plus32 = q6_k_values(blk).map(|v| v as i32 + 32);
                let mut l = lanes(&plus32, y, |r, m| sc[2 * r + m / 4] as i32);
                q6_k_take_offset(&mut l, &sc, bsums);
                acc.add(l.iter().sum(), f16_at(blk, Q6_K_D), 0, 0.0, a.d[k]);
            }
            other => unreachable!("{other:?} has no tiled kernel"),
        }
    }
    acc.finish()
}
