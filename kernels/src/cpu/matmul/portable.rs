//! Reference dot products: plain Rust, one (row, token) pair at a time.

use super::kquant_portable::{dot_q45_k, dot_q6_k};
use super::{kquant_tiled, q4k_repacked};
use super::{Acts, KOrder, QMatrix};
use crate::act::QuantizedActs;
use crate::quant::{f16_at, q5_0_values, WeightType, QK};

/// Integer dot of one Q4_0 row with one quantized activation row.
pub fn dot_q4_0(row: &[u8], a: &QuantizedActs, t: usize) -> f32 {
    let nb = a.blocks();
    let mut sum = 0f32;
    for b in 0..nb {
        let blk = &row[b * 18..(b + 1) * 18];
        let y = &a.qs[t * a.cols + b * QK..][..QK];
        let mut si = 0i32;
        for j in 0..16 {
            si += ((blk[2 + j] & 0xF) as i32 - 8) * y[j] as i32;
            si += ((blk[2 + j] >> 4) as i32 - 8) * y[j + 16] as i32;
        }
        sum += f16_at(blk, 0) * a.d[t * nb + b] * si as f32;
    }
    sum
}

/// Integer dot of one Q4_1 row with one quantized activation row (uses the block sums).
pub fn dot_q4_1(row: &[u8], a: &QuantizedActs, t: usize) -> f32 {
    let nb = a.blocks();
    let mut sum = 0f32;
    for b in 0..nb {
        let blk = &row[b * 20..(b + 1) * 20];
        let y = &a.qs[t * a.cols + b * QK..][..QK];
        let mut si = 0i32;
        for j in 0..16 {
            si += (blk[4 + j] & 0xF) as i32 * y[j] as i32;
            si += (blk[4 + j] >> 4) as i32 * y[j + 16] as i32;
        }
        sum += f16_at(blk, 0) * a.d[t * nb + b] * si as f32 + f16_at(blk, 2) * a.s[t * nb + b];
    }
    sum
}

/// Integer dot of one Q5_0 row with one quantized activation row.
pub fn dot_q5_0(row: &[u8], a: &QuantizedActs, t: usize) -> f32 {
    let nb = a.blocks();
    let mut sum = 0f32;
    for b in 0..nb {
        let blk = &row[b * 22..(b + 1) * 22];
        let y = &a.qs[t * a.cols + b * QK..][..QK];
        let si: i32 = q5_0_values(blk)
            .iter()
            .zip(y)
            .map(|(&q, &y)| q as i32 * y as i32)
            .sum();
        sum += f16_at(blk, 0) * a.d[t * nb + b] * si as f32;
    }
    sum
}

/// Integer dot of one Q8_0 row with one quantized activation row.
pub fn dot_q8_0(row: &[u8], a: &QuantizedActs, t: usize) -> f32 {
    let nb = a.blocks();
    let mut sum = 0f32;
    for b in 0..nb {
        let blk = &row[b * 34..(b + 1) * 34];
        let y = &a.qs[t * a.cols + b * QK..][..QK];
        let si: i32 = (0..QK)
            .map(|j| (blk[2 + j] as i8) as i32 * y[j] as i32)
            .sum();
        sum += f16_at(blk, 0) * a.d[t * nb + b] * si as f32;
    }
    sum
}

/// Dot of one F32 row with f32 activations.
pub fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    row.chunks_exact(4)
        .zip(x)
        .map(|(c, v)| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * v)
        .sum()
}

/// Dot of one F16 row with f32 activations.
pub fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    row.chunks_exact(2)
        .zip(x)
        .map(|(c, v)| half::f16::from_le_bytes([c[0], c[1]]).to_f32() * v)
        .sum()
}

pub(super) fn rows(
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    acts: &Acts<'_>,
    tokens: usize,
    out: &mut [f32],
) {
    for i in 0..n {
        let row = w.row(r0 + i);
        for t in 0..tokens {
            out[i * tokens + t] = match (w.ty, acts, KOrder::of(w, t, tokens)) {
                (WeightType::Q4_K, Acts::QuantK(a), KOrder::Repacked(route)) => {
                    q4k_repacked::dot_q4_k(route, row, a, t)
                }
                (
                    WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K,
                    Acts::QuantK(a),
                    KOrder::Tiled,
                ) => kquant_tiled::dot(w.ty, row, a, t),
                (WeightType::Q4_0, Acts::Quant(a), _) => dot_q4_0(row, a, t),
                (WeightType::Q4_1, Acts::Quant(a), _) => dot_q4_1(row, a, t),
                (WeightType::Q5_0, Acts::Quant(a), _) => dot_q5_0(row, a, t),
                (WeightType::Q8_0, Acts::Quant(a), _) => dot_q8_0(row, a, t),
                (WeightType::Q4_K, Acts::QuantK(a), _) => dot_q45_k(false, row, a, t),
                (WeightType::Q5_K, Acts::QuantK(a), _) => dot_q45_k(true, row, a, t),
                (WeightType::Q6_K, Acts::QuantK(a), _) => dot_q6_k(row, a, t),
                (WeightType::F32, Acts::Float(x), _) => dot_f32(row, &x[t * w.cols..][..w.cols]),
                (WeightType::F16, Acts::Float(x), _) => dot_f16(row, &x[t * w.cols..][..w.cols]),
                (ty, _, _) => unreachable!("activations prepared for the wrong type {ty:?}"),
            };
        }
    }
}
