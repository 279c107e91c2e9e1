//! Reference K-quant dot products against Q8_K activations, one (row, token) pair at a time,
//! in the float order of ggml's AVX2 kernels (`ggml_vec_dot_q4_K_q8_K` & co.): each
//! super-block's exact integer sums land in eight 32-bit lanes (lane `m` holds elements
//! `4m..4m+4` of every 32), each lane is multiplied into its own f32 accumulator with a fused
//! multiply-add, the Q4_K/Q5_K minimums go to four more lanes, and the lanes are reduced at the
//! end in ggml's order ([`KAcc`]). The SIMD paths form the same integer lanes, so every path
//! gives the same bits.

use crate::act_k::QuantizedActsK;
use crate::quant::{f16_at, WeightType};
use crate::quant_k::{q45_k_values, q6_k_scales, q6_k_values, scales_mins, Q6_K_D, QK_K};

/// ggml's AVX2 accumulators for one (row, token) dot product.
#[derive(Clone, Copy, Default)]
pub(crate) struct KAcc {
    acc: [f32; 8],
    acc_m: [f32; 4],
}

impl KAcc {
    /// Adds one super-block: `acc += d * lanes`, `acc_m += dmin * mins` (fused).
    #[inline(always)]
    pub(crate) fn add(&mut self, d: f32, lanes: [i32; 8], dmin: f32, mins: [i32; 4]) {
        for (a, l) in self.acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
        for (a, m) in self.acc_m.iter_mut().zip(mins) {
            *a = dmin.mul_add(m as f32, *a);
        }
    }

    /// `hsum_float_8(acc) + hsum(acc_m)` in ggml's order.
    #[inline(always)]
    pub(crate) fn finish(&self) -> f32 {
        let a = &self.acc;
        let r: [f32; 4] = std::array::from_fn(|i| a[i + 4] + a[i]);
        let m = &self.acc_m;
        ((r[0] + r[2]) + (r[1] + r[3])) + ((m[0] + m[2]) + (m[1] + m[3]))
    }
}

/// The four minimum lanes of Q4_K / Q5_K: lane `k` is
/// `m[2k] * (bsums[4k] + bsums[4k+1]) + m[2k+1] * (bsums[4k+2] + bsums[4k+3])`.
#[inline(always)]
pub(crate) fn mins_lanes(m: &[u8; 8], bsums: &[i16]) -> [i32; 4] {
    let pair = |s: usize| bsums[2 * s] as i32 + bsums[2 * s + 1] as i32;
    std::array::from_fn(|k| m[2 * k] as i32 * pair(2 * k) + m[2 * k + 1] as i32 * pair(2 * k + 1))
}

/// Q6_K's lanes are formed over the values plus 32; ggml takes the offset back per pair of
/// sub-blocks from the activations' sums: lane `m` loses `32 * (sc[2m] * bsums[2m] +
/// sc[2m + 1] * bsums[2m + 1])`. The total is the same whichever lane carries which part, but
/// the lanes are rounded apart (one fused multiply-add each), so this split is ggml's.
#[inline(always)]
pub(crate) fn q6_k_take_offset(lanes: &mut [i32; 8], sc: &[i8; 16], bsums: &[i16]) {
    for (m, l) in lanes.iter_mut().enumerate() {
        *l -= 32
            * (sc[2 * m] as i32 * bsums[2 * m] as i32
                + sc[2 * m + 1] as i32 * bsums[2 * m + 1] as i32);
    }
}

/// The eight integer lanes: lane `m` is `sum_r scale(r, m) * sum(q[e] * y[e])` over elements
/// `e = 32r + 4m .. 32r + 4m + 4`.
pub(crate) fn lanes<Q: Copy + Into<i32>>(
    q: &[Q; QK_K],
    y: &[i8],
    scale: impl Fn(usize, usize) -> i32,
) -> [i32; 8] {
    std::array::from_fn(|m| {
        (0..8)
            .map(|r| {
                let e = 32 * r + 4 * m;
                let part: i32 = (e..e + 4).map(|e| q[e].into() * y[e] as i32).sum();
                scale(r, m) * part
            })
            .sum()
    })
}

/// Runs `block(blk, y, k)` on each super-block of `row` (`bytes` each), where `y` is token
/// `t`'s Q8_K values under the block and `k` the index of their scale in `a`.
fn sum_blocks(
    row: &[u8],
    bytes: usize,
    a: &QuantizedActsK,
    t: usize,
    mut block: impl FnMut(&[u8], &[i8], usize),
) {
    let nb = a.blocks();
    for b in 0..nb {
        let blk = &row[b * bytes..(b + 1) * bytes];
        let y = &a.qs[t * a.cols + b * QK_K..][..QK_K];
        block(blk, y, t * nb + b);
    }
}

/// Dot of one Q4_K (`five == false`) or Q5_K row with token `t` of `a`.
pub fn dot_q45_k(five: bool, row: &[u8], a: &QuantizedActsK, t: usize) -> f32 {
    let ty = if five {
        WeightType::Q5_K
    } else {
        WeightType::Q4_K
    };
    let mut acc = KAcc::default();
    sum_blocks(row, ty.block_bytes(), a, t, |blk, y, k| {
        let (sc, m) = scales_mins(blk);
        let l = lanes(&q45_k_values(five, blk), y, |r, _| sc[r] as i32);
        let mins = mins_lanes(&m, &a.bsums[k * 16..(k + 1) * 16]);
        let (d, dmin) = (a.d[k] * f16_at(blk, 0), -a.d[k] * f16_at(blk, 2));
        acc.add(d, l, dmin, mins);
    });
    acc.finish()
}

/// Dot of one Q6_K row with token `t` of `a`.
pub fn dot_q6_k(row: &[u8], a: &QuantizedActsK, t: usize) -> f32 {
    let mut acc = KAcc::default();
    sum_blocks(row, WeightType::Q6_K.block_bytes(), a, t, |blk, y, k| {
        let sc = q6_k_scales(blk);
        let plus32 = q6_k_values(blk).map(|v| v as i32 + 32);
        let mut l = lanes(&plus32, y, |r, m| sc[2 * r + m / 4] as i32);
        q6_k_take_offset(&mut l, &sc, &a.bsums[k * 16..(k + 1) * 16]);
        acc.add(a.d[k] * f16_at(blk, Q6_K_D), l, 0.0, [0; 4]);
    });
    acc.finish()
}
