//! ggml's reference quantizers (Q4_0, Q4_1, Q8_0) and dequantizers, bit-exact with ggml's
//! `quantize_row_*_ref` layouts, for writing test files and checking kernels. Q5_0 and the
//! K-quants dequantize through the kernels' unpackers (one definition of each layout).

use half::f16;

use super::{GgmlType, GgufError};

const QK: usize = 32;

/// Little-endian f32 bytes.
pub fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Little-endian f16 bytes (round to nearest even).
pub fn f16_bytes(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect()
}

fn blocks(x: &[f32]) -> std::slice::ChunksExact<'_, f32> {
    assert!(
        x.len().is_multiple_of(QK),
        "quantize: length {} is not a multiple of {QK}",
        x.len()
    );
    x.chunks_exact(QK)
}

/// Q8_0: per 32 values, f16 scale `d = amax / 127` then 32 i8 `round(x / d)`.
///
/// # Panics
/// When `x.len()` is not a multiple of 32.
pub fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK * 34);
    for b in blocks(x) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
    }
    out
}

/// Q4_0: per 32 values, f16 scale `d = max / -8` (max = value of largest magnitude) and 16
/// bytes of nibbles: byte j holds element j (low) and element j+16 (high), offset by 8.
///
/// # Panics
/// When `x.len()` is not a multiple of 32.
pub fn quantize_q4_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK * 18);
    for b in blocks(x) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in b {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        for j in 0..QK / 2 {
            let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
            out.push(q(b[j]) | (q(b[j + QK / 2]) << 4));
        }
    }
    out
}

/// Q4_1: per 32 values, f16 `d = (max - min) / 15`, f16 `m = min`, then 16 nibble bytes laid
/// out as in Q4_0 (no offset).
///
/// # Panics
/// When `x.len()` is not a multiple of 32.
pub fn quantize_q4_1(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK * 20);
    for b in blocks(x) {
        let min = b.iter().fold(f32::MAX, |m, &v| m.min(v));
        let max = b.iter().fold(-f32::MAX, |m, &v| m.max(v));
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
        for j in 0..QK / 2 {
            let q = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
            out.push(q(b[j]) | (q(b[j + QK / 2]) << 4));
        }
    }
    out
}

/// Encodes `x` as `ty` (F32, F16, Q4_0, Q4_1, Q8_0; BF16 with feature `engine`).
///
/// # Panics
/// For other types, or when a quantized length is not a multiple of 32.
pub fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    match ty {
        GgmlType::F32 => f32_bytes(x),
        GgmlType::F16 => f16_bytes(x),
        #[cfg(feature = "engine")]
        GgmlType::BF16 => {
            pagewarden_kernels::quant::quantize_row(pagewarden_kernels::WeightType::BF16, x)
        }
        GgmlType::Q4_0 => quantize_q4_0(x),
        GgmlType::Q4_1 => quantize_q4_1(x),
        GgmlType::Q8_0 => quantize_q8_0(x),
        other => panic!("quantize: {other} is not supported"),
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Reference dequantization of `n` elements of `ty` from `data` (slow; for tests and checks;
/// BF16, Q5_0 and the K-quants through the kernels, with feature `engine`).
pub fn dequantize(ty: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>, GgufError> {
    let need = ty
        .row_bytes(n as u64)
        .filter(|&b| b <= data.len() as u64)
        .ok_or_else(|| GgufError::BadShape {
            tensor: "<dequantize>".into(),
            reason: format!(
                "{n} elements of {ty} need more than the {} bytes given",
                data.len()
            ),
        })? as usize;
    let data = &data[..need];
    let mut out = Vec::with_capacity(n);
    match ty {
        GgmlType::F32 => out.extend(
            data.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        GgmlType::F16 => out.extend(data.chunks_exact(2).map(|c| f16_at(c, 0))),
        GgmlType::Q8_0 => {
            for blk in data.chunks_exact(34) {
                let d = f16_at(blk, 0);
                out.extend(blk[2..].iter().map(|&q| q as i8 as f32 * d));
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let (size, qs) = if ty == GgmlType::Q4_0 {
                (18, 2)
            } else {
                (20, 4)
            };
            for blk in data.chunks_exact(size) {
                let d = f16_at(blk, 0);
                let (m, off) = if ty == GgmlType::Q4_0 {
                    (0.0, 8.0)
                } else {
                    (f16_at(blk, 2), 0.0)
                };
                let nib = &blk[qs..];
                out.extend(nib.iter().map(|&b| ((b & 0x0f) as f32 - off) * d + m));
                out.extend(nib.iter().map(|&b| ((b >> 4) as f32 - off) * d + m));
            }
        }
        #[cfg(feature = "engine")]
        GgmlType::BF16 | GgmlType::Q5_0 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            let kernel = crate::weights::weight_type(ty).expect("a kernel weight type");
            out.resize(n, 0.0);
            pagewarden_kernels::quant::dequantize_row(kernel, data, &mut out);
        }
        other => {
            return Err(GgufError::UnsupportedTensorType {
                tensor: "<dequantize>".into(),
                ty: other.name(),
            })
        }
    }
    Ok(out)
}
