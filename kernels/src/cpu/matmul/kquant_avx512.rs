//! 512-bit kernels for K-quant matrices packed at load (`packed_k.rs`): sixteen rows per
//! register, up to four tokens per pass over a record, so each weight line is loaded and
//! unpacked once for four tokens and each `vpdpbusd` does 64 of the product's
//! multiply-adds.
//!
//! The integer sums are exact, so only the float side has to follow the reference, and it
//! does, lane `r` of each register being row `r`'s accumulator:
//! - Q4_K takes `q4k_repacked`'s order (llama.cpp's repacked `gemm`/`gemv`, by `Route`): one
//!   pair of fused multiply-adds per sub-block pair (gemm) or per super-block (gemv);
//! - Q6_K takes `kquant_portable`'s (`ggml_vec_dot_q6_K_q8_K`, which llama.cpp runs for it):
//!   eight float lanes per row, each its own chain of fused multiply-adds, reduced at the end
//!   in `KAcc::finish`'s order. llama.cpp has no repacked Q6_K kernel on x86; ours differs only
//!   in the memory layout and so keeps its bits (its six-bit values are put together from a
//!   nibble line and a high line, three instructions a line, then multiplied unsigned by the
//!   signed activations, as ggml's `vpmaddubsw` does). From `kquant_tiled::MIN_TOKENS` activation
//!   rows on, Q6_K takes `kquant_tiled`'s order instead (one float product per super-block).

use std::arch::x86_64::*;

use super::dest::Dest;
use super::packed::{prefetch_ahead, PackedRows, GROUP};
use super::packed_k::{
    q6_k_high_line, q6_k_nibble_line, Q4_K_LINES, Q4_K_QUANTS, Q6_K_LINES, Q6_K_SCALES,
};
use super::q4k_repacked::Route;
use super::QMatrix;
use crate::act_k::QuantizedActsK;
use crate::quant::WeightType;
use crate::quant_k::QK_K;

/// Tokens per pass over a record.
const TILE: usize = 4;

/// Rows `r0..r0 + n` of `w` through its K-quant packing, whole groups only, for every token,
/// into `out` (row `r - r0`, token `t`); returns how many rows it did (none unless `w` has a
/// K-quant packing and `r0` starts a group).
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C.
pub(crate) unsafe fn run_groups(
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    a: &QuantizedActsK,
    tokens: usize,
    mut out: Dest<'_>,
) -> usize {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let Some(pk) = w.packed.filter(|p| {
            r0.is_multiple_of(GROUP) && matches!(p.ty(), WeightType::Q4_K | WeightType::Q6_K)
        }) else {
            return 0;
        };
        let tiled = super::kquant_tiled::applies(w, tokens);
        if tiled && pk.ty() == WeightType::Q4_K {
            // Only a Q4_K matrix llama.cpp does not repack takes the tiled order; the unpacked
            // kernels have it.
            return 0;
        }
        assert!(pk.packs(w), "packing of another matrix");
        assert_eq!(a.qs.len(), tokens * w.cols, "activation shape");
        assert_eq!(a.d.len(), tokens * a.blocks());
        assert_eq!(a.bsums.len(), tokens * a.blocks() * 16);
        let mut done = 0;
        while done + GROUP <= n {
            let g = (r0 + done) / GROUP;
            let mut t0 = 0;
            while t0 < tokens {
                let nt = (tokens - t0).min(TILE);
                let mut res = [[0f32; GROUP]; TILE];
                // SAFETY: the caller vouches for the CPU; `pk` packs `w` (checked), so group `g`
                // exists, and the activations hold `tokens` rows (checked).
                match pk.ty() {
                    WeightType::Q4_K => {
                        let route = Route::of(t0, tokens);
                        match nt {
                            4 => q4_k::<4>(pk, g, a, t0, route, &mut res),
                            3 => q4_k::<3>(pk, g, a, t0, route, &mut res),
                            2 => q4_k::<2>(pk, g, a, t0, route, &mut res),
                            _ => q4_k::<1>(pk, g, a, t0, route, &mut res),
                        }
                    }
                    _ => match nt {
                        4 => q6_k::<4>(pk, g, a, t0, tiled, &mut res),
                        3 => q6_k::<3>(pk, g, a, t0, tiled, &mut res),
                        2 => q6_k::<2>(pk, g, a, t0, tiled, &mut res),
                        _ => q6_k::<1>(pk, g, a, t0, tiled, &mut res),
                    },
                }
                for (j, row) in res.iter().take(nt).enumerate() {
                    out.put(done, t0 + j, row);
                }
                t0 += nt;
            }
            done += GROUP;
        }
        done
    }
}

/// Four activation bytes at `p`, broadcast to every 32-bit lane.
#[inline(always)]
unsafe fn y4(p: *const i8) -> __m512i {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe { _mm512_set1_epi32((p as *const i32).read_unaligned()) }
}

/// Sixteen bytes at `p` widened to sixteen i32 lanes (unsigned).
#[inline(always)]
unsafe fn u8x16(p: *const u8) -> __m512i {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe { _mm512_cvtepu8_epi32(_mm_load_si128(p as *const __m128i)) }
}

/// Q4_K, group `g`, tokens `t0..t0 + NT`, in `route`'s float order.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4_k<const NT: usize>(
    pk: &PackedRows,
    g: usize,
    a: &QuantizedActsK,
    t0: usize,
    route: Route,
    res: &mut [[f32; GROUP]; TILE],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let nb = a.blocks();
        let (m4, m4_high) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0xF0_u8 as i8));
        let zero = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); NT];
        let mut acc_min = [_mm512_setzero_ps(); NT];
        let ys: [*const i8; NT] = std::array::from_fn(|j| a.qs.as_ptr().add((t0 + j) * a.cols));
        for b in 0..nb {
            let rec = pk.record(g, b);
            prefetch_ahead(rec, Q4_K_LINES, t0);
            let d = _mm512_cvtph_ps(_mm256_load_si256(rec as *const __m256i));
            let dmin = _mm512_cvtph_ps(_mm256_load_si256(rec.add(32) as *const __m256i));
            // (No closures with intrinsics: they would not inherit the target features.)
            let mut da = [_mm512_setzero_ps(); NT];
            for (j, v) in da.iter_mut().enumerate() {
                *v = _mm512_set1_ps(a.d[(t0 + j) * nb + b]);
            }
            let bs: [&[i16]; NT] = std::array::from_fn(|j| {
                let k = (t0 + j) * nb + b;
                &a.bsums[k * 16..(k + 1) * 16]
            });
            let q = rec.add(64 * Q4_K_QUANTS) as *const __m512i;
            // Gemv: the super-block's exact sums, to floats once.
            let mut sum = [zero; NT];
            let mut mins = [zero; NT];
            for c in 0..4 {
                // One token alone has only two chains of `vpdpbusd`, each waiting on the last:
                // it keeps two of each, on alternate lines (integer sums: the same bits).
                let mut lo_dot = [[zero; NT]; 2];
                let mut hi_dot = [[zero; NT]; 2];
                for i in 0..8 {
                    let s = if NT == 1 { i % 2 } else { 0 };
                    let v = _mm512_load_si512(q.add(8 * c + i));
                    // The high nibbles stay in place, sixteen times their value: one
                    // instruction a line instead of two, divided out once a sub-block below.
                    let lo = _mm512_and_si512(v, m4);
                    let hi = _mm512_and_si512(v, m4_high);
                    for j in 0..NT {
                        let y = ys[j].add(b * QK_K + 64 * c + 4 * i);
                        lo_dot[s][j] = _mm512_dpbusd_epi32(lo_dot[s][j], lo, y4(y));
                        hi_dot[s][j] = _mm512_dpbusd_epi32(hi_dot[s][j], hi, y4(y.add(32)));
                    }
                }
                let [mut lo_dot, lo_odd] = lo_dot;
                let [mut hi_dot, hi_odd] = hi_dot;
                if NT == 1 {
                    lo_dot[0] = _mm512_add_epi32(lo_dot[0], lo_odd[0]);
                    hi_dot[0] = _mm512_add_epi32(hi_dot[0], hi_odd[0]);
                }
                // Each high sum is a multiple of 16 (at most 32 * 240 * 128 in size, far inside
                // an i32), so the shift divides it exactly: the same integers as before.
                for h in hi_dot.iter_mut() {
                    *h = _mm512_srai_epi32::<4>(*h);
                }
                // Sub-blocks 2c and 2c + 1: their scales and minimums.
                let (sc_lo, sc_hi) = (
                    u8x16(rec.add(64 + 32 * c)),
                    u8x16(rec.add(64 + 32 * c + 16)),
                );
                let (m_lo, m_hi) = (
                    u8x16(rec.add(3 * 64 + 32 * c)),
                    u8x16(rec.add(3 * 64 + 32 * c + 16)),
                );
                for j in 0..NT {
                    let pair = _mm512_add_epi32(
                        _mm512_mullo_epi32(lo_dot[j], sc_lo),
                        _mm512_mullo_epi32(hi_dot[j], sc_hi),
                    );
                    let b = bs[j];
                    let (s0, s1) = (
                        b[4 * c] as i32 + b[4 * c + 1] as i32,
                        b[4 * c + 2] as i32 + b[4 * c + 3] as i32,
                    );
                    let m = _mm512_add_epi32(
                        _mm512_mullo_epi32(m_lo, _mm512_set1_epi32(s0)),
                        _mm512_mullo_epi32(m_hi, _mm512_set1_epi32(s1)),
                    );
                    match route {
                        Route::Gemm => {
                            let (scale, min_scale) =
                                (_mm512_mul_ps(d, da[j]), _mm512_mul_ps(dmin, da[j]));
                            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pair), scale, acc[j]);
                            acc_min[j] =
                                _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), min_scale, acc_min[j]);
                        }
                        Route::Gemv => {
                            sum[j] = _mm512_add_epi32(sum[j], pair);
                            mins[j] = _mm512_add_epi32(mins[j], m);
                        }
                    }
                }
            }
            if route == Route::Gemv {
                for j in 0..NT {
                    let (scale, min_scale) = (_mm512_mul_ps(d, da[j]), _mm512_mul_ps(dmin, da[j]));
                    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[j]), scale, acc[j]);
                    acc_min[j] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins[j]), min_scale, acc_min[j]);
                }
            }
        }
        for j in 0..NT {
            _mm512_storeu_ps(res[j].as_mut_ptr(), _mm512_sub_ps(acc[j], acc_min[j]));
        }
    }
}

/// Q6_K, group `g`, tokens `t0..t0 + NT`, in `KAcc`'s float order.
#[allow(clippy::needless_range_loop)] // `m` picks a lane of every token's accumulators.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k<const NT: usize>(
    pk: &PackedRows,
    g: usize,
    a: &QuantizedActsK,
    t0: usize,
    tiled: bool,
    res: &mut [[f32; GROUP]; TILE],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let nb = a.blocks();
        let low4 = _mm512_set1_epi8(0x0F);
        let two = _mm512_set1_epi8(0x30);
        let low16 = _mm512_set1_epi32(0xFFFF);
        // acc[j][m]: token j's ggml lane m, sixteen rows.
        let mut acc = [[_mm512_setzero_ps(); 8]; NT];
        // With `tiled`, token j's `kquant_tiled` sum, sixteen rows.
        let mut tacc = [_mm512_setzero_ps(); NT];
        let ys: [*const i8; NT] = std::array::from_fn(|j| a.qs.as_ptr().add((t0 + j) * a.cols));
        for b in 0..nb {
            let rec = pk.record(g, b);
            prefetch_ahead(rec, Q6_K_LINES, t0);
            let d = _mm512_cvtph_ps(_mm256_load_si256(rec as *const __m256i));
            // Each scale as an i16 pair per row, the form `vpdpwssd` multiplies by.
            let mut sc = [_mm512_setzero_si512(); 16];
            let mut sc32 = [_mm512_setzero_si512(); 16];
            for s in 0..16 {
                let x = _mm512_cvtepi8_epi32(_mm_load_si128(
                    rec.add(64 * Q6_K_SCALES + 16 * s) as *const __m128i
                ));
                sc32[s] = x;
                sc[s] = _mm512_or_si512(_mm512_and_si512(x, low16), _mm512_slli_epi32::<16>(x));
            }
            let lines = rec as *const __m512i;
            let mut dd = [_mm512_setzero_ps(); NT];
            for (j, v) in dd.iter_mut().enumerate() {
                *v = _mm512_mul_ps(_mm512_set1_ps(a.d[(t0 + j) * nb + b]), d);
            }
            let mut s1 = [_mm512_setzero_si512(); NT];
            for m in 0..8 {
                // Lane m: line 8 run + m of every 32-element run, scale `(8 run + m) / 4`.
                let high = [
                    _mm512_load_si512(lines.add(q6_k_high_line(m))),
                    _mm512_load_si512(lines.add(q6_k_high_line(m + 8))),
                ];
                let mut lane = [_mm512_setzero_si512(); NT];
                for run in 0..QK_K / 32 {
                    let line = 8 * run + m;
                    let w = q6_k_line(lines, &high, m, run, low4, two);
                    let s = sc[line / 4];
                    for j in 0..NT {
                        let y = y4(ys[j].add(b * QK_K + 4 * line));
                        lane[j] = _mm512_dpwssd_epi32(lane[j], _mm512_maddubs_epi16(w, y), s);
                    }
                }
                for j in 0..NT {
                    // The values were packed plus 32: take 32 * (sc[2m] * bsums[2m] +
                    // sc[2m + 1] * bsums[2m + 1]) back from this lane, as `q6_k_take_offset`.
                    let bs = &a.bsums[((t0 + j) * nb + b) * 16..][..16];
                    let off = _mm512_add_epi32(
                        _mm512_mullo_epi32(sc32[2 * m], _mm512_set1_epi32(32 * bs[2 * m] as i32)),
                        _mm512_mullo_epi32(
                            sc32[2 * m + 1],
                            _mm512_set1_epi32(32 * bs[2 * m + 1] as i32),
                        ),
                    );
                    let l = _mm512_sub_epi32(lane[j], off);
                    if tiled {
                        s1[j] = _mm512_add_epi32(s1[j], l);
                    } else {
                        acc[j][m] = _mm512_fmadd_ps(dd[j], _mm512_cvtepi32_ps(l), acc[j][m]);
                    }
                }
            }
            if tiled {
                for j in 0..NT {
                    let r = _mm512_mul_ps(_mm512_cvtepi32_ps(s1[j]), d);
                    let da = _mm512_set1_ps(a.d[(t0 + j) * nb + b]);
                    tacc[j] = _mm512_fmadd_ps(r, da, tacc[j]);
                }
            }
        }
        if tiled {
            for j in 0..NT {
                _mm512_storeu_ps(res[j].as_mut_ptr(), tacc[j]);
            }
            return;
        }
        for j in 0..NT {
            let a = &acc[j];
            let mut r = [_mm512_setzero_ps(); 4];
            for (i, v) in r.iter_mut().enumerate() {
                *v = _mm512_add_ps(a[i + 4], a[i]);
            }
            let sum = _mm512_add_ps(_mm512_add_ps(r[0], r[2]), _mm512_add_ps(r[1], r[3]));
            // `KAcc::finish` adds the (zero) minimum lanes last: the same +0 here.
            let sum = _mm512_add_ps(sum, _mm512_setzero_ps());
            _mm512_storeu_ps(res[j].as_mut_ptr(), sum);
        }
    }
}

/// Value line `8 run + m` of a Q6_K record (`packed_k.rs`): its low nibbles from nibble line
/// `(8 run + m) % 32`, its two high bits from field `run / 2` of high line `m + 8 (run % 2)`
/// (`high[run % 2]`); `low4` is 0x0F and `two` 0x30 in every byte.
#[inline(always)]
unsafe fn q6_k_line(
    lines: *const __m512i,
    high: &[__m512i; 2],
    m: usize,
    run: usize,
    low4: __m512i,
    two: __m512i,
) -> __m512i {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let n = _mm512_load_si512(lines.add(q6_k_nibble_line((8 * run + m) % 32)));
        let n = if run < 4 {
            n
        } else {
            _mm512_srli_epi16::<4>(n)
        };
        let h = high[run % 2];
        // Field `run / 2` to bits 4-5; what the 16-bit shifts carry in from the neighbouring
        // byte lands outside them and `two` drops it.
        let h = match run / 2 {
            0 => _mm512_slli_epi16::<4>(h),
            1 => _mm512_slli_epi16::<2>(h),
            2 => h,
            _ => _mm512_srli_epi16::<2>(h),
        };
        // (n & 0x0F) | (h & 0x30).
        _mm512_ternarylogic_epi32::<0xEC>(n, _mm512_and_si512(h, two), low4)
    }
}
