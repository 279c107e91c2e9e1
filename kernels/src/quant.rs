//! ggml block layouts for weights. All quantized types pack 32 elements per block:
//!
//! - Q4_0 (18 bytes): f16 `d`, 16 bytes of nibbles; low nibbles are elements 0..15, high
//!   nibbles 16..31; value = (q - 8) * d.
//! - Q4_1 (20 bytes): f16 `d`, f16 `m`, 16 bytes of nibbles (same order); value = q * d + m.
//! - Q8_0 (34 bytes): f16 `d`, 32 x i8; value = q * d.
//!
//! F16 and F32 are plain little-endian arrays.

use half::f16;

/// Elements per quantized block.
pub const QK: usize = 32;

/// Storage type of a weight matrix (the subset of ggml types the kernels compute with).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// 4-bit, symmetric, one f16 scale per 32 elements.
    Q4_0,
    /// 4-bit, scale + minimum per 32 elements.
    Q4_1,
    /// 8-bit, one f16 scale per 32 elements.
    Q8_0,
}

impl WeightType {
    /// Elements per block (1 for float types).
    pub fn block_size(self) -> usize {
        match self {
            WeightType::F32 | WeightType::F16 => 1,
            WeightType::Q4_0 | WeightType::Q4_1 | WeightType::Q8_0 => QK,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            WeightType::F32 => 4,
            WeightType::F16 => 2,
            WeightType::Q4_0 => 18,
            WeightType::Q4_1 => 20,
            WeightType::Q8_0 => 34,
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
        WeightType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(row.chunks_exact(34)) {
                let d = f16_at(b, 0);
                for j in 0..QK {
                    o[j] = (b[2 + j] as i8) as f32 * d;
                }
            }
        }
    }
}

/// Quantizes one row of weights to `ty` (ggml's reference quantizers); `x.len()` must be a
/// multiple of the block size. Used to build test models.
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
