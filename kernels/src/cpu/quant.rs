//! ggml block layouts for weights. The legacy quantized types pack 32 elements per block:
//!
//! - Q4_0 (18 bytes): f16 `d`, 16 bytes of nibbles; low nibbles are elements 0..15, high
//!   nibbles 16..31; value = (q - 8) * d.
//! - Q4_1 (20 bytes): f16 `d`, f16 `m`, 16 bytes of nibbles (same order); value = q * d + m.
//! - Q5_0 (22 bytes): f16 `d`, 32 high bits (u32 LE, bit j for element j), 16 bytes of
//!   nibbles (same order as Q4_0); value = (q - 16) * d.
//! - Q8_0 (34 bytes): f16 `d`, 32 x i8; value = q * d.
//!
//! The K-quants (Q4_K, Q5_K, Q6_K) pack 256 elements per super-block (`quant_k`).
//! F16, BF16 and F32 are plain little-endian arrays.

use half::{bf16, f16};

use crate::quant_k::{self, QK_K};

/// Elements per quantized block.
pub const QK: usize = 32;

/// Storage type of a weight matrix (the subset of ggml types the kernels compute with), named
/// as ggml names them.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// bfloat16: the top half of an f32.
    BF16,
    /// 4-bit, symmetric, one f16 scale per 32 elements.
    Q4_0,
    /// 4-bit, scale + minimum per 32 elements.
    Q4_1,
    /// 5-bit, symmetric, one f16 scale per 32 elements.
    Q5_0,
    /// 8-bit, one f16 scale per 32 elements.
    Q8_0,
    /// 4-bit K-quant: 256-element super-blocks of eight 32-element sub-blocks, 6-bit scales
    /// and minimums.
    Q4_K,
    /// 5-bit K-quant, laid out as Q4_K plus one high bit per element.
    Q5_K,
    /// 6-bit K-quant: sixteen 16-element sub-blocks with 8-bit scales.
    Q6_K,
}

/// The activation format a weight type's dot product takes (`matmul` prepares each once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActKind {
    /// Plain f32 (float weights).
    Float,
    /// 8-bit per 32-element block (`act::QuantizedActs`, ggml's Q8_0 / Q8_1).
    Q8,
    /// 8-bit per 256-element block with 16-element sums (`act_k::QuantizedActsK`, Q8_K).
    Q8K,
}

impl WeightType {
    /// Elements per block (1 for float types).
    pub fn block_size(self) -> usize {
        match self {
            WeightType::F32 | WeightType::F16 | WeightType::BF16 => 1,
            WeightType::Q4_0 | WeightType::Q4_1 | WeightType::Q5_0 | WeightType::Q8_0 => QK,
            WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K => QK_K,
        }
    }

    /// The activation format the type's dot product multiplies with.
    pub fn act_kind(self) -> ActKind {
        match self {
            WeightType::F32 | WeightType::F16 | WeightType::BF16 => ActKind::Float,
            WeightType::Q4_0 | WeightType::Q4_1 | WeightType::Q5_0 | WeightType::Q8_0 => {
                ActKind::Q8
            }
            WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K => ActKind::Q8K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            WeightType::F32 => 4,
            WeightType::F16 | WeightType::BF16 => 2,
            WeightType::Q4_0 => 18,
            WeightType::Q4_1 => 20,
            WeightType::Q5_0 => 22,
            WeightType::Q8_0 => 34,
            WeightType::Q4_K => quant_k::Q4_K_BYTES,
            WeightType::Q5_K => quant_k::Q5_K_BYTES,
            WeightType::Q6_K => quant_k::Q6_K_BYTES,
        }
    }

    /// Bytes of one row of `cols` elements; `None` if `cols` is not a multiple of the block.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        if !cols.is_multiple_of(self.block_size()) {
            return None;
        }
        (cols / self.block_size()).checked_mul(self.block_bytes())
    }
}

/// Reads the little-endian f16 at `b[at..at + 2]` as f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Rounds through f16, as ggml stores scales.
#[inline(always)]
pub(crate) fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Dequantizes one row (`row.len() == ty.row_bytes(out.len())`) into `out`.
pub fn dequantize_row(ty: WeightType, row: &[u8], out: &mut [f32]) {
    assert_eq!(Some(row.len()), ty.row_bytes(out.len()), "row size");
    match ty {
        WeightType::F32 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        WeightType::F16 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        WeightType::BF16 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        WeightType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(row.chunks_exact(18)) {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    o[j] = ((b[2 + j] & 0xF) as i32 - 8) as f32 * d;
                    o[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        WeightType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(row.chunks_exact(20)) {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for j in 0..16 {
                    o[j] = (b[4 + j] & 0xF) as f32 * d + m;
                    o[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
                }
            }
        }
        WeightType::Q5_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(row.chunks_exact(22)) {
                let d = f16_at(b, 0);
                let q = q5_0_values(b);
                for (o, q) in o.iter_mut().zip(q) {
                    *o = q as f32 * d;
                }
            }
        }
        WeightType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(row.chunks_exact(34)) {
                let d = f16_at(b, 0);
                for j in 0..QK {
                    o[j] = (b[2 + j] as i8) as f32 * d;
                }
            }
        }
        WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K => {
            quant_k::dequantize_row(ty, row, out)
        }
    }
}

/// The 32 signed values (-16..=15) of one Q5_0 block, in element order.
#[inline(always)]
pub(crate) fn q5_0_values(b: &[u8]) -> [i8; QK] {
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let mut q = [0i8; QK];
    for j in 0..16 {
        let hi0 = ((qh >> j) & 1) << 4;
        let hi1 = ((qh >> (j + 16)) & 1) << 4;
        q[j] = ((b[6 + j] & 0xF) as u32 | hi0) as i8 - 16;
        q[j + 16] = ((b[6 + j] >> 4) as u32 | hi1) as i8 - 16;
    }
    q
}

/// Quantizes one row of weights to `ty` (ggml's reference quantizers); `x.len()` must be a
/// multiple of the block size. Used to build test models.
///
/// # Panics
/// For the K-quants, whose ggml quantizers (an iterative scale search) are not ported: tests
/// build K-quant blocks from random bytes instead, any of which is a valid block.
pub fn quantize_row(ty: WeightType, x: &[f32]) -> Vec<u8> {
    let bytes = ty
        .row_bytes(x.len())
        .expect("row length is a multiple of the block size");
    let mut out = Vec::with_capacity(bytes);
    match ty {
        WeightType::F32 => x.iter().for_each(|v| out.extend(v.to_le_bytes())),
        WeightType::F16 => x
            .iter()
            .for_each(|v| out.extend(f16::from_f32(*v).to_le_bytes())),
        // Round to nearest even, as ggml's `GGML_FP32_TO_BF16`.
        WeightType::BF16 => x
            .iter()
            .for_each(|v| out.extend(bf16::from_f32(*v).to_le_bytes())),
        WeightType::Q4_0 => {
            for b in x.chunks_exact(QK) {
                // ggml: the value with the largest magnitude maps to -8.
                let max = b
                    .iter()
                    .copied()
                    .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                for j in 0..16 {
                    let q = |v: f32| ((v * id + 8.5) as i32).min(15) as u8;
                    out.push(q(b[j]) | (q(b[j + 16]) << 4));
                }
            }
        }
        WeightType::Q4_1 => {
            for b in x.chunks_exact(QK) {
                let min = b.iter().copied().fold(f32::INFINITY, f32::min);
                let max = b.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(f16::from_f32(min).to_le_bytes());
                for j in 0..16 {
                    let q = |v: f32| (((v - min) * id + 0.5) as i32).min(15) as u8;
                    out.push(q(b[j]) | (q(b[j + 16]) << 4));
                }
            }
        }
        WeightType::Q5_0 => {
            for b in x.chunks_exact(QK) {
                // ggml's quantize_row_q5_0_ref: the value with the largest magnitude maps to -16.
                let max = b
                    .iter()
                    .copied()
                    .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
                let d = max / -16.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let q = |v: f32| ((v * id + 16.5) as i32).min(31) as u32;
                let mut qh = 0u32;
                let mut qs = [0u8; 16];
                for j in 0..16 {
                    let (a, c) = (q(b[j]), q(b[j + 16]));
                    qs[j] = (a & 0xF) as u8 | (((c & 0xF) as u8) << 4);
                    qh |= ((a & 0x10) >> 4) << j;
                    qh |= ((c & 0x10) >> 4) << (j + 16);
                }
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(qh.to_le_bytes());
                out.extend(qs);
            }
        }
        WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K => {
            panic!("quantize_row: no quantizer for {ty:?} (build K-quant blocks from bytes)")
        }
        WeightType::Q8_0 => {
            for b in x.chunks_exact(QK) {
                let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
            }
        }
    }
    out
}
