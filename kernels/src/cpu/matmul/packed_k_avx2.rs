//! Q4_K matrices packed at load (`packed_k.rs`, the records of the 512-bit kernel) on AVX2:
//! half a group, eight rows, per register, up to four tokens per pass over a record, in
//! llama.cpp's repacked order (`q4k_repacked`, by `Route`), as `kquant_avx512::q4_k` does for
//! sixteen rows.
//!
//! The integer side differs from the 512-bit kernel's only in how it forms the same exact
//! sums: `vpmaddubsw` products of a nibble line and four broadcast activation bytes (at most
//! 15 * 127 * 2 = 3,810 a pair) are added in 16 bits over a sub-block's eight lines (at most
//! 30,480: no overflow), and one `vpmaddwd` by the row's sub-block scale (held in both halves
//! of its lane) widens and scales them; the minimums' term is one `vpmaddwd` of the rows'
//! `(m_lo, m_hi)` pairs by the token's two sub-block activation sums. The float side is the
//! 512-bit kernel's, lane for lane, so every output has its bits (and the portable
//! reference's).

use std::arch::x86_64::*;

use super::packed::{PackedRows, GROUP};
use super::packed_k::Q4_K_QUANTS;
use super::q4k_repacked::{self, Route};
use super::QMatrix;
use crate::act_k::QuantizedActsK;
use crate::quant::WeightType;
use crate::quant_k::QK_K;

/// Tokens per pass over a record.
const TILE: usize = 4;

/// Rows `r0..r0 + n` of `w` through its Q4_K packing, whole groups only, for every token, into
/// `out[(r - r0) * tokens + t]`; returns how many rows it did (none unless `w` is a packed
/// Q4_K matrix that llama.cpp repacks and `r0` starts a group).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run_groups(
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    a: &QuantizedActsK,
    tokens: usize,
    out: &mut [f32],
) -> usize {
    let Some(pk) = w
        .packed
        .filter(|p| r0.is_multiple_of(GROUP) && p.ty() == WeightType::Q4_K)
    else {
        return 0;
    };
    if !q4k_repacked::applies(w) {
        return 0;
    }
    assert!(pk.packs(w), "packing of another matrix");
    assert_eq!(a.qs.len(), tokens * w.cols, "activation shape");
    assert_eq!(a.d.len(), tokens * a.blocks());
    assert_eq!(a.bsums.len(), tokens * a.blocks() * 16);
    assert!(out.len() >= n * tokens);
    let groups = n / GROUP;
    for gi in 0..groups {
        let g = r0 / GROUP + gi;
        for h in 0..2 {
            let mut t0 = 0;
            while t0 < tokens {
                let nt = (tokens - t0).min(TILE);
                let route = Route::of(t0, tokens);
                let mut res = [[0f32; 8]; TILE];
                // SAFETY: the caller vouches for the CPU; `pk` packs `w` (checked), so group
                // `g` exists, and the activations hold `tokens` rows (checked).
                unsafe {
                    match nt {
                        4 => q4_k::<4>(pk, g, h, a, t0, route, &mut res),
                        3 => q4_k::<3>(pk, g, h, a, t0, route, &mut res),
                        2 => q4_k::<2>(pk, g, h, a, t0, route, &mut res),
                        _ => q4_k::<1>(pk, g, h, a, t0, route, &mut res),
                    }
                }
                for (j, rows) in res.iter().take(nt).enumerate() {
                    for (r, v) in rows.iter().enumerate() {
                        out[(gi * GROUP + 8 * h + r) * tokens + t0 + j] = *v;
                    }
                }
                t0 += nt;
            }
        }
    }
    groups * GROUP
}

/// Eight bytes at `p` as eight i32 lanes, each value in both 16-bit halves of its lane (a
/// `vpmaddwd` factor that multiplies both products of a pair).
#[inline(always)]
unsafe fn both_halves(p: *const u8) -> __m256i {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
        _mm256_or_si256(v, _mm256_slli_epi32::<16>(v))
    }
}

/// Q4_K, rows `8h..8h + 8` of group `g`, tokens `t0..t0 + NT`, in `route`'s float order.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn q4_k<const NT: usize>(
    pk: &PackedRows,
    g: usize,
    h: usize,
    a: &QuantizedActsK,
    t0: usize,
    route: Route,
    res: &mut [[f32; 8]; TILE],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let nb = a.blocks();
        let m4 = _mm256_set1_epi8(0x0F);
        let zero = _mm256_setzero_si256();
        let mut acc = [_mm256_setzero_ps(); NT];
        let mut acc_min = [_mm256_setzero_ps(); NT];
        let ys: [*const i8; NT] = std::array::from_fn(|j| a.qs.as_ptr().add((t0 + j) * a.cols));
        let y4 = |p: *const i8| (p as *const i32).read_unaligned();
        for b in 0..nb {
            let rec = pk.record(g, b);
            let d = _mm256_cvtph_ps(_mm_load_si128(rec.add(16 * h) as *const __m128i));
            let dmin = _mm256_cvtph_ps(_mm_load_si128(rec.add(32 + 16 * h) as *const __m128i));
            let mut da = [_mm256_setzero_ps(); NT];
            for (j, v) in da.iter_mut().enumerate() {
                *v = _mm256_set1_ps(*a.d.get_unchecked((t0 + j) * nb + b));
            }
            let q = rec.add(64 * Q4_K_QUANTS + 32 * h);
            let mut sum = [zero; NT];
            let mut mins = [zero; NT];
            for c in 0..4 {
                // Each token's sub-block 2c (low nibbles) and 2c + 1 (high) products in 16 bits.
                let mut lo16 = [zero; NT];
                let mut hi16 = [zero; NT];
                for i in 0..8 {
                    let v = _mm256_load_si256(q.add(64 * (8 * c + i)) as *const __m256i);
                    let lo = _mm256_and_si256(v, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                    for j in 0..NT {
                        let y = ys[j].add(b * QK_K + 64 * c + 4 * i);
                        let ylo = _mm256_set1_epi32(y4(y));
                        let yhi = _mm256_set1_epi32(y4(y.add(32)));
                        lo16[j] = _mm256_add_epi16(lo16[j], _mm256_maddubs_epi16(lo, ylo));
                        hi16[j] = _mm256_add_epi16(hi16[j], _mm256_maddubs_epi16(hi, yhi));
                    }
                }
                // Sub-blocks 2c and 2c + 1: their scales and (as pairs) their minimums.
                let sc_lo = both_halves(rec.add(64 + 32 * c + 8 * h));
                let sc_hi = both_halves(rec.add(64 + 32 * c + 16 + 8 * h));
                let m_lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                    rec.add(3 * 64 + 32 * c + 8 * h) as *const __m128i
                ));
                let m_hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                    rec.add(3 * 64 + 32 * c + 16 + 8 * h) as *const __m128i,
                ));
                let m_pair = _mm256_or_si256(m_lo, _mm256_slli_epi32::<16>(m_hi));
                for j in 0..NT {
                    let pair = _mm256_add_epi32(
                        _mm256_madd_epi16(lo16[j], sc_lo),
                        _mm256_madd_epi16(hi16[j], sc_hi),
                    );
                    let k = (t0 + j) * nb + b;
                    let bs = a.bsums.as_ptr().add(k * 16 + 4 * c);
                    let (s0, s1) = (
                        *bs as i32 + *bs.add(1) as i32,
                        *bs.add(2) as i32 + *bs.add(3) as i32,
                    );
                    // (m_lo, m_hi) by (s0, s1): both sums fit 16 bits (4 * 16 * 127).
                    let s = _mm256_set1_epi32((s0 & 0xFFFF) | (s1 << 16));
                    let m = _mm256_madd_epi16(m_pair, s);
                    match route {
                        Route::Gemm => {
                            let (scale, min_scale) =
                                (_mm256_mul_ps(d, da[j]), _mm256_mul_ps(dmin, da[j]));
                            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair), scale, acc[j]);
                            acc_min[j] =
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), min_scale, acc_min[j]);
                        }
                        Route::Gemv => {
                            sum[j] = _mm256_add_epi32(sum[j], pair);
                            mins[j] = _mm256_add_epi32(mins[j], m);
                        }
                    }
                }
            }
            if route == Route::Gemv {
                for j in 0..NT {
                    let (scale, min_scale) = (_mm256_mul_ps(d, da[j]), _mm256_mul_ps(dmin, da[j]));
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[j]), scale, acc[j]);
                    acc_min[j] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins[j]), min_scale, acc_min[j]);
                }
            }
        }
        for j in 0..NT {
            _mm256_storeu_ps(res[j].as_mut_ptr(), _mm256_sub_ps(acc[j], acc_min[j]));
        }
    }
}
