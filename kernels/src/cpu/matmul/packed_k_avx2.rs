//! Q4_K and Q6_K matrices packed at load (`packed_k.rs`, the records of the 512-bit kernels) on
//! AVX2: half a group, eight rows, per register (one token takes a record's two halves one after
//! the other, so each record is read from memory once; several tokens, whose tiles after the
//! first read the group from cache, go half by half), up to four tokens per pass over a record, in
//! the float orders of `kquant_avx512`'s kernels for sixteen rows: Q4_K in llama.cpp's
//! repacked order (`q4k_repacked`, by `Route`), Q6_K in ggml's eight-lane order or, from
//! `kquant_tiled::MIN_TOKENS` tokens on, the tiled one.
//!
//! The integer side differs from the 512-bit kernels' only in how it forms the same exact
//! sums. Q4_K: `vpmaddubsw` products of a nibble line and four broadcast activation bytes (at most
//! 15 * 127 * 2 = 3,810 a pair) are added in 16 bits over a sub-block's eight lines (at most
//! 30,480: no overflow), and one `vpmaddwd` by the row's sub-block scale (held in both halves
//! of its lane) widens and scales them; the minimums' term is one `vpmaddwd` of the rows'
//! `(m_lo, m_hi)` pairs by the token's two sub-block activation sums. Q6_K: each value line
//! (plus 32, at most 63) is put together from its nibble line and high line with shifts and
//! masks (the 512-bit kernel's one ternary-logic instruction), its `vpmaddubsw` products by the
//! activations (at most 63 * 127 * 2 = 16,002 a pair) go through `vpmaddwd` by the line's
//! scale; the offset's `32 * (sc * bsum + sc' * bsum')` is one `vpmaddwd` of the scale pair
//! by the sum pair, times 32. The float side is the 512-bit kernels', lane for lane, so every
//! output has their bits (and the portable reference's).

use std::arch::x86_64::*;

use super::dest::Dest;
use super::kquant_tiled;
use super::packed::{PackedRows, GROUP};
use super::packed_k::{q6_k_high_line, q6_k_nibble_line, Q4_K_QUANTS, Q6_K_SCALES};
use super::q4k_repacked::{self, Route};
use super::QMatrix;
use crate::act_k::QuantizedActsK;
use crate::quant::WeightType;
use crate::quant_k::QK_K;

/// Tokens per pass over a record.
const TILE: usize = 4;

/// Rows `r0..r0 + n` of `w` through its K-quant packing, whole groups only, for every token,
/// into `out` (row `r - r0`, token `t`); returns how many rows it did (none unless `w` is a packed
/// Q6_K matrix, or a packed Q4_K matrix that llama.cpp repacks, and `r0` starts a group).
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
    mut out: Dest<'_>,
) -> usize {
    let Some(pk) = w.packed.filter(|p| {
        r0.is_multiple_of(GROUP) && matches!(p.ty(), WeightType::Q4_K | WeightType::Q6_K)
    }) else {
        return 0;
    };
    let is_q4_k = pk.ty() == WeightType::Q4_K;
    if is_q4_k && !q4k_repacked::applies(w) {
        return 0;
    }
    let tiled = kquant_tiled::applies(w, tokens);
    assert!(pk.packs(w), "packing of another matrix");
    assert_eq!(a.qs.len(), tokens * w.cols, "activation shape");
    assert_eq!(a.d.len(), tokens * a.blocks());
    assert_eq!(a.bsums.len(), tokens * a.blocks() * 16);
    let groups = n / GROUP;
    for gi in 0..groups {
        let g = r0 / GROUP + gi;
        let mut t0 = 0;
        while t0 < tokens {
            let nt = (tokens - t0).min(TILE);
            let route = Route::of(t0, tokens);
            let mut res = [[[0f32; 8]; TILE]; 2];
            // SAFETY: the caller vouches for the CPU; `pk` packs `w` (checked), so group `g`
            // exists, and the activations hold `tokens` rows (checked).
            unsafe {
                match (is_q4_k, nt) {
                    (true, 4) => q4_k::<4>(pk, g, a, t0, route, &mut res),
                    (true, 3) => q4_k::<3>(pk, g, a, t0, route, &mut res),
                    (true, 2) => q4_k::<2>(pk, g, a, t0, route, &mut res),
                    (true, _) => q4_k::<1>(pk, g, a, t0, route, &mut res),
                    (false, 4) => q6_k::<4>(pk, g, a, t0, tiled, &mut res),
                    (false, 3) => q6_k::<3>(pk, g, a, t0, tiled, &mut res),
                    (false, 2) => q6_k::<2>(pk, g, a, t0, tiled, &mut res),
                    (false, _) => q6_k::<1>(pk, g, a, t0, tiled, &mut res),
                }
            }
            for (h, half) in res.iter().enumerate() {
                for (j, rows) in half.iter().take(nt).enumerate() {
                    out.put(gi * GROUP + 8 * h, t0 + j, rows);
                }
            }
            t0 += nt;
        }
    }
    groups * GROUP
}

/// Runs `$first` (the first half's work on record `b`) and `$second` (the second half's) for
/// every record `b < $nb`, in the order that suits `$nt` tokens: one token takes each record's
/// two halves one after the other, so the record is read from memory once; several tokens,
/// whose tiles after the first read the group from cache, go half by half, with fewer
/// accumulators live at once. (A macro: closures would not inherit the target features.)
macro_rules! by_halves {
    ($nt:expr, $nb:expr, |$b:ident| $first:expr, |$b2:ident| $second:expr) => {
        if $nt == 1 {
            for $b in 0..$nb {
                $first;
                let $b2 = $b;
                $second;
            }
        } else {
            for $b in 0..$nb {
                $first;
            }
            for $b2 in 0..$nb {
                $second;
            }
        }
    };
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

/// Q4_K, group `g`, tokens `t0..t0 + NT`, in `route`'s float order: rows `8h..8h + 8` into
/// `res[h]`, the records' halves in `by_halves!`'s order (one pass over the whole group for
/// each half had one token read the group's lines twice, the second time with the memory idle).
#[inline(always)]
unsafe fn q4_k<const NT: usize>(
    pk: &PackedRows,
    g: usize,
    a: &QuantizedActsK,
    t0: usize,
    route: Route,
    res: &mut [[[f32; 8]; TILE]; 2],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        // One set of accumulators per half, each its own variable (indexed by a loop
        // variable, they stayed in memory).
        let zero = _mm256_setzero_ps();
        let (mut acc0, mut min0, mut acc1, mut min1) =
            ([zero; NT], [zero; NT], [zero; NT], [zero; NT]);
        let nb = a.blocks();
        by_halves!(
            NT,
            nb,
            |b| q4_k_record::<NT>(pk, g, 0, b, a, t0, route, &mut acc0, &mut min0),
            |b| q4_k_record::<NT>(pk, g, 1, b, a, t0, route, &mut acc1, &mut min1)
        );
        for (half, (acc, min)) in res.iter_mut().zip([(acc0, min0), (acc1, min1)]) {
            for j in 0..NT {
                _mm256_storeu_ps(half[j].as_mut_ptr(), _mm256_sub_ps(acc[j], min[j]));
            }
        }
    }
}

/// Record `b` of group `g`, rows `8h..8h + 8`, tokens `t0..t0 + NT`, added to the tokens'
/// accumulators in `route`'s order.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
#[inline(always)]
unsafe fn q4_k_record<const NT: usize>(
    pk: &PackedRows,
    g: usize,
    h: usize,
    b: usize,
    a: &QuantizedActsK,
    t0: usize,
    route: Route,
    acc: &mut [__m256; NT],
    acc_min: &mut [__m256; NT],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let nb = a.blocks();
        let m4 = _mm256_set1_epi8(0x0F);
        let zero = _mm256_setzero_si256();
        let ys: [*const i8; NT] = std::array::from_fn(|j| a.qs.as_ptr().add((t0 + j) * a.cols));
        let y4 = |p: *const i8| (p as *const i32).read_unaligned();
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
                rec.add(3 * 64 + 32 * c + 16 + 8 * h) as *const __m128i
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
                        acc_min[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), min_scale, acc_min[j]);
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
                acc_min[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins[j]), min_scale, acc_min[j]);
            }
        }
    }
}

/// Q6_K, group `g`, tokens `t0..t0 + NT`, in `KAcc`'s float order, or with `tiled` in
/// `kquant_tiled`'s: rows `8h..8h + 8` into `res[h]`, the records' halves in `by_halves!`'s
/// order.
#[inline(always)]
unsafe fn q6_k<const NT: usize>(
    pk: &PackedRows,
    g: usize,
    a: &QuantizedActsK,
    t0: usize,
    tiled: bool,
    res: &mut [[[f32; 8]; TILE]; 2],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        // Token j's ggml lanes (`acc0[j][m]`, `acc1[j][m]` for the two halves) and, with
        // `tiled`, its `kquant_tiled` sums; each half's its own variable, as in `q4_k`.
        let zero = _mm256_setzero_ps();
        let (mut acc0, mut acc1) = ([[zero; 8]; NT], [[zero; 8]; NT]);
        let (mut tacc0, mut tacc1) = ([zero; NT], [zero; NT]);
        let nb = a.blocks();
        by_halves!(
            NT,
            nb,
            |b| q6_k_record::<NT>(pk, g, 0, b, a, t0, tiled, &mut acc0, &mut tacc0),
            |b| q6_k_record::<NT>(pk, g, 1, b, a, t0, tiled, &mut acc1, &mut tacc1)
        );
        let (acc, tacc) = ([acc0, acc1], [tacc0, tacc1]);
        for h in 0..2 {
            for j in 0..NT {
                let sum = if tiled {
                    tacc[h][j]
                } else {
                    let a = &acc[h][j];
                    let mut r = [_mm256_setzero_ps(); 4];
                    for (i, v) in r.iter_mut().enumerate() {
                        *v = _mm256_add_ps(a[i + 4], a[i]);
                    }
                    let sum = _mm256_add_ps(_mm256_add_ps(r[0], r[2]), _mm256_add_ps(r[1], r[3]));
                    // `KAcc::finish` adds the (zero) minimum lanes last: the same +0 here.
                    _mm256_add_ps(sum, _mm256_setzero_ps())
                };
                _mm256_storeu_ps(res[h][j].as_mut_ptr(), sum);
            }
        }
    }
}

/// Record `b` of group `g`, rows `8h..8h + 8`, tokens `t0..t0 + NT`, added to the tokens'
/// lanes (`acc`) or, with `tiled`, their tiled sums (`tacc`).
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)] // `m` picks a lane of every token's accumulators.
#[inline(always)]
unsafe fn q6_k_record<const NT: usize>(
    pk: &PackedRows,
    g: usize,
    h: usize,
    b: usize,
    a: &QuantizedActsK,
    t0: usize,
    tiled: bool,
    acc: &mut [[__m256; 8]; NT],
    tacc: &mut [__m256; NT],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let nb = a.blocks();
        let low16 = _mm256_set1_epi32(0xFFFF);
        let ys: [*const i8; NT] = std::array::from_fn(|j| a.qs.as_ptr().add((t0 + j) * a.cols));
        let rec = pk.record(g, b);
        let d = _mm256_cvtph_ps(_mm_load_si128(rec.add(16 * h) as *const __m128i));
        // Each scale as an i16 pair per row (the form `vpmaddwd` multiplies by), and the
        // scales of lane m's two offsets as one pair.
        let mut sc = [_mm256_setzero_si256(); 16];
        let mut sc32 = [_mm256_setzero_si256(); 16];
        for s in 0..16 {
            let x = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                rec.add(64 * Q6_K_SCALES + 16 * s + 8 * h) as *const __m128i,
            ));
            sc32[s] = x;
            sc[s] = _mm256_or_si256(_mm256_and_si256(x, low16), _mm256_slli_epi32::<16>(x));
        }
        let line = |l: usize| rec.add(64 * l + 32 * h) as *const __m256i;
        let mut dd = [_mm256_setzero_ps(); NT];
        for (j, v) in dd.iter_mut().enumerate() {
            *v = _mm256_mul_ps(_mm256_set1_ps(a.d[(t0 + j) * nb + b]), d);
        }
        let mut s1 = [_mm256_setzero_si256(); NT];
        for m in 0..8 {
            // Lane m: line 8 run + m of every 32-element run, scale `(8 run + m) / 4`.
            let high = [
                _mm256_load_si256(line(q6_k_high_line(m))),
                _mm256_load_si256(line(q6_k_high_line(m + 8))),
            ];
            let mut lane = [_mm256_setzero_si256(); NT];
            for run in 0..QK_K / 32 {
                let l = 8 * run + m;
                let w = q6_k_line(
                    _mm256_load_si256(line(q6_k_nibble_line(l % 32))),
                    high[run % 2],
                    run,
                );
                for j in 0..NT {
                    let y = _mm256_set1_epi32(
                        (ys[j].add(b * QK_K + 4 * l) as *const i32).read_unaligned(),
                    );
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), sc[l / 4]);
                    lane[j] = _mm256_add_epi32(lane[j], p);
                }
            }
            // The values were packed plus 32: take 32 * (sc[2m] * bsums[2m] +
            // sc[2m + 1] * bsums[2m + 1]) back from this lane, as `q6_k_take_offset`.
            let sc_pair = _mm256_or_si256(
                _mm256_and_si256(sc32[2 * m], low16),
                _mm256_slli_epi32::<16>(sc32[2 * m + 1]),
            );
            for j in 0..NT {
                let bs = a.bsums.as_ptr().add(((t0 + j) * nb + b) * 16 + 2 * m);
                let pair = (*bs as u16 as i32) | ((*bs.add(1) as i32) << 16);
                let off =
                    _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc_pair, _mm256_set1_epi32(pair)));
                let l = _mm256_sub_epi32(lane[j], off);
                if tiled {
                    s1[j] = _mm256_add_epi32(s1[j], l);
                } else {
                    acc[j][m] = _mm256_fmadd_ps(dd[j], _mm256_cvtepi32_ps(l), acc[j][m]);
                }
            }
        }
        if tiled {
            for j in 0..NT {
                let r = _mm256_mul_ps(_mm256_cvtepi32_ps(s1[j]), d);
                let da = _mm256_set1_ps(a.d[(t0 + j) * nb + b]);
                tacc[j] = _mm256_fmadd_ps(r, da, tacc[j]);
            }
        }
    }
}

/// Value line `8 run + m` of a Q6_K record from its nibble line `n` (`(8 run + m) % 32`) and
/// high line `h` (`m + 8 (run % 2)`): the low nibbles (`run < 4`) or high ones, and field
/// `run / 2` of the high line moved to bits 4-5.
#[inline(always)]
unsafe fn q6_k_line(n: __m256i, h: __m256i, run: usize) -> __m256i {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let n = if run < 4 {
            n
        } else {
            _mm256_srli_epi16::<4>(n)
        };
        // What the 16-bit shifts carry in from the neighbouring byte lands outside bits 4-5
        // and the mask drops it.
        let h = match run / 2 {
            0 => _mm256_slli_epi16::<4>(h),
            1 => _mm256_slli_epi16::<2>(h),
            2 => h,
            _ => _mm256_srli_epi16::<2>(h),
        };
        _mm256_or_si256(
            _mm256_and_si256(n, _mm256_set1_epi8(0x0F)),
            _mm256_and_si256(h, _mm256_set1_epi8(0x30)),
        )
    }
}
