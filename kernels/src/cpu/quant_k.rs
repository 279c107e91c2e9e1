//! ggml's K-quant super-blocks (256 elements), unpacked exactly as `ggml-quants.c` does:
//!
//! - Q4_K (144 bytes): f16 `d`, f16 `dmin`, 12 bytes of packed 6-bit scales and minimums for
//!   eight 32-element sub-blocks, 128 bytes of nibbles. Each 64 elements take 32 bytes: low
//!   nibbles are the first sub-block, high nibbles the second. value = d*sc*q - dmin*m.
//! - Q5_K (176 bytes): as Q4_K with 32 bytes of high bits after the scales (element `l` of
//!   sub-block pair `j` takes bits `2j` and `2j + 1` of byte `l`), then the nibbles.
//! - Q6_K (210 bytes): 128 bytes of low nibbles, 64 bytes of 2-bit high parts, sixteen i8
//!   scales (one per 16 elements), f16 `d`. value = d*sc*(q - 32).
//!
//! The unpackers return integer values and scales; the dequantizer and the dot products
//! (`matmul/kquant_*`) share them.

use crate::quant::{f16_at, WeightType};

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of a Q4_K super-block.
pub const Q4_K_BYTES: usize = 144;
/// Bytes of a Q5_K super-block.
pub const Q5_K_BYTES: usize = 176;
/// Bytes of a Q6_K super-block.
pub const Q6_K_BYTES: usize = 210;
/// Offset of Q6_K's f16 `d`.
pub(crate) const Q6_K_D: usize = 208;

/// ggml's `get_scale_min_k4`: the 6-bit scale and minimum of sub-block `j` (0..8).
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The eight (scale, minimum) pairs of a Q4_K / Q5_K super-block.
#[inline(always)]
pub(crate) fn scales_mins(blk: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], m[j]) = scale_min_k4(j, &blk[4..16]);
    }
    (sc, m)
}

/// The 256 unsigned values of a Q4_K (0..=15) or Q5_K (0..=31) super-block, in element order.
#[inline(always)]
pub(crate) fn q45_k_values(five: bool, blk: &[u8]) -> [u8; QK_K] {
    let (qh, qs) = if five {
        (&blk[16..48], &blk[48..176])
    } else {
        (&blk[..0], &blk[16..144])
    };
    let mut v = [0u8; QK_K];
    for j in 0..4 {
        for l in 0..32 {
            let b = qs[32 * j + l];
            let (mut lo, mut hi) = (b & 0xF, b >> 4);
            if five {
                lo |= ((qh[l] >> (2 * j)) & 1) << 4;
                hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
            }
            v[64 * j + l] = lo;
            v[64 * j + 32 + l] = hi;
        }
    }
    v
}

/// The 256 signed values (-32..=31) of a Q6_K super-block, in element order.
#[inline(always)]
pub(crate) fn q6_k_values(blk: &[u8]) -> [i8; QK_K] {
    let (ql, qh) = (&blk[..128], &blk[128..192]);
    let mut v = [0i8; QK_K];
    for n in 0..2 {
        let (ql, qh, y) = (&ql[64 * n..], &qh[32 * n..], &mut v[128 * n..]);
        for l in 0..32 {
            let h = qh[l];
            y[l] = ((ql[l] & 0xF) | ((h & 3) << 4)) as i8 - 32;
            y[l + 32] = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i8 - 32;
            y[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
            y[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    v
}

/// The sixteen i8 scales of a Q6_K super-block.
#[inline(always)]
pub(crate) fn q6_k_scales(blk: &[u8]) -> [i8; 16] {
    std::array::from_fn(|i| blk[192 + i] as i8)
}

/// Dequantizes a row of K-quant super-blocks (ggml's `dequantize_row_q{4,5,6}_K`).
pub(crate) fn dequantize_row(ty: WeightType, row: &[u8], out: &mut [f32]) {
    let bytes = ty.block_bytes();
    for (o, blk) in out.chunks_exact_mut(QK_K).zip(row.chunks_exact(bytes)) {
        match ty {
            WeightType::Q4_K | WeightType::Q5_K => {
                let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
                let (sc, m) = scales_mins(blk);
                let q = q45_k_values(ty == WeightType::Q5_K, blk);
                for (s, (o, q)) in o.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
                    let (d1, m1) = (d * sc[s] as f32, dmin * m[s] as f32);
                    for (o, &q) in o.iter_mut().zip(q) {
                        *o = d1 * q as f32 - m1;
                    }
                }
            }
            WeightType::Q6_K => {
                let d = f16_at(blk, Q6_K_D);
                let sc = q6_k_scales(blk);
                let q = q6_k_values(blk);
                for (s, (o, q)) in o.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
                    let ds = d * sc[s] as f32;
                    for (o, &q) in o.iter_mut().zip(q) {
                        *o = ds * q as f32;
                    }
                }
            }
            other => unreachable!("{other:?} is not a K-quant"),
        }
    }
}
