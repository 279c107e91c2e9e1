//! Reference K-quant dot products against Q8_K activations, one (row, token) pair at a time.
//!
//! Each super-block's integer sums are exact (`i32`), and the floats are combined in one
//! order, [`combine`], that the SIMD paths share: they differ only in how they form the
//! integer sums, so every path gives the same bits. (ggml's AVX2 kernels spread the sum
//! over eight float lanes instead; the difference is a rounding of the last bits.)

use crate::act_k::QuantizedActsK;
use crate::quant::{f16_at, WeightType};
use crate::quant_k::{q45_k_values, q6_k_scales, q6_k_values, scales_mins, Q6_K_D, QK_K};

/// One super-block's contribution: `yd * d * isum - yd * dmin * msum`, as ggml's
/// `vec_dot_q4_K_q8_K` forms `d` and `dmin` (activation scale times the f16 weight scale).
#[inline(always)]
pub(crate) fn combine(yd: f32, d: f32, dmin: f32, isum: i32, msum: i32) -> f32 {
    (yd * d) * isum as f32 - (yd * dmin) * msum as f32
}

/// `sum_s m[s] * (bsums[2s] + bsums[2s + 1])`: the minimums' term of Q4_K / Q5_K.
#[inline(always)]
pub(crate) fn mins_sum(m: &[u8; 8], bsums: &[i16]) -> i32 {
    (0..8)
        .map(|s| m[s] as i32 * (bsums[2 * s] as i32 + bsums[2 * s + 1] as i32))
        .sum()
}

/// `sum_g scale(g) * sum(q[e] * y[e] for e in group g)` over groups of `group` elements.
fn scaled_isum<Q: Copy + Into<i32>>(
    q: &[Q; QK_K],
    y: &[i8],
    group: usize,
    scale: impl Fn(usize) -> i32,
) -> i32 {
    q.chunks_exact(group)
        .zip(y.chunks_exact(group))
        .enumerate()
        .map(|(g, (q, y))| {
            let part: i32 = q.iter().zip(y).map(|(&q, &y)| q.into() * y as i32).sum();
            scale(g) * part
        })
        .sum()
}

/// `sum_b block(blk_b, y_b, k_b)` over the super-blocks of `row` (`bytes` each), where `y_b`
/// is token `t`'s Q8_K values under block `b` and `k_b` the index of their scale in `a`.
fn sum_blocks(
    row: &[u8],
    bytes: usize,
    a: &QuantizedActsK,
    t: usize,
    block: impl Fn(&[u8], &[i8], usize) -> f32,
) -> f32 {
    let nb = a.blocks();
    let mut sum = 0f32;
    for b in 0..nb {
        let blk = &row[b * bytes..(b + 1) * bytes];
        let y = &a.qs[t * a.cols + b * QK_K..][..QK_K];
        sum += block(blk, y, t * nb + b);
    }
    sum
}

/// Dot of one Q4_K (`five == false`) or Q5_K row with token `t` of `a`.
pub fn dot_q45_k(five: bool, row: &[u8], a: &QuantizedActsK, t: usize) -> f32 {
    let ty = if five {
        WeightType::Q5_K
    } else {
        WeightType::Q4_K
    };
    sum_blocks(row, ty.block_bytes(), a, t, |blk, y, k| {
        let (sc, m) = scales_mins(blk);
        let isum = scaled_isum(&q45_k_values(five, blk), y, 32, |g| sc[g] as i32);
        let msum = mins_sum(&m, &a.bsums[k * 16..(k + 1) * 16]);
        combine(a.d[k], f16_at(blk, 0), f16_at(blk, 2), isum, msum)
    })
}

/// Dot of one Q6_K row with token `t` of `a`.
pub fn dot_q6_k(row: &[u8], a: &QuantizedActsK, t: usize) -> f32 {
    sum_blocks(row, WeightType::Q6_K.block_bytes(), a, t, |blk, y, k| {
        let sc = q6_k_scales(blk);
        let isum = scaled_isum(&q6_k_values(blk), y, 16, |g| sc[g] as i32);
        combine(a.d[k], f16_at(blk, Q6_K_D), 0.0, isum, 0)
    })
}
