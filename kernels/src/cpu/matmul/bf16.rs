//! BF16 weights. llama.cpp's CPU product rounds the activations to bf16 first (the type's
//! `vec_dot_type` is BF16) and sums bf16 x bf16 products in f32; so does this one. Each
//! product of two bf16 values is exact in f32, so a fused multiply-add gives the same bits as
//! a multiply then an add, and every instruction set here gives the portable bits.

use half::bf16;

use super::{Acts, QMatrix};
use crate::isa::Isa;

/// `x` rounded to bf16 (nearest even, as ggml's `GGML_FP32_TO_BF16`), as f32.
#[inline(always)]
fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// The bf16 value at `c` (little-endian) as f32.
#[inline(always)]
fn load(c: &[u8]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16)
}

/// Dot of one BF16 row with f32 activations rounded to bf16: eight independent sums (so the
/// compiler vectorizes it), then their total.
#[inline(always)]
fn dot_body(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (rc, xc) = (row.chunks_exact(16), x.chunks_exact(8));
    let tail: f32 = rc
        .remainder()
        .chunks_exact(2)
        .zip(xc.remainder())
        .map(|(c, v)| load(c) * round_bf16(*v))
        .sum();
    for (r, v) in rc.zip(xc) {
        for k in 0..8 {
            acc[k] += load(&r[2 * k..]) * round_bf16(v[k]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Reference dot of one BF16 row with f32 activations.
pub fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    dot_body(row, x)
}

#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn dot_avx2(row: &[u8], x: &[f32]) -> f32 {
    dot_body(row, x)
}

/// Rows `r0..r0+n` of a BF16 matrix for all tokens into `out[(r - r0) * tokens + t]`.
pub(super) fn rows(
    isa: Isa,
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    acts: &Acts<'_>,
    tokens: usize,
    out: &mut [f32],
) {
    let Acts::Float(x) = acts else {
        unreachable!("BF16 weights take float activations")
    };
    for i in 0..n {
        let row = w.row(r0 + i);
        for t in 0..tokens {
            let xt = &x[t * w.cols..][..w.cols];
            out[i * tokens + t] = match isa {
                Isa::Portable => dot_bf16(row, xt),
                // SAFETY: Avx2 and Avx512 are only detected when the CPU has avx2 and fma.
                Isa::Avx2 | Isa::Avx512 => unsafe { dot_avx2(row, xt) },
            };
        }
    }
}
