//! x86 K-quant kernels, inlined into `avx2.rs`'s tiles (and so compiled with their target
//! features: AVX2, or AVX-512 VNNI): each super-block is unpacked once into eight registers
//! of 32 unsigned values, then multiplied with up to four tokens' Q8_K blocks. The eight
//! integer lanes are ggml's (AVX2: `maddubs` then `madd` by the sub-block scales; VNNI:
//! `vpdpbusd` then a 32-bit multiply, the same exact sums) and go through the reference's
//! [`KAcc`], so every path has the reference's bits.

use std::arch::x86_64::*;

use crate::act_k::QuantizedActsK;
use crate::matmul::kquant_portable::{mins_lanes, q6_k_take_offset, KAcc};
use crate::matmul::kquant_tiled::TiledAcc;
use crate::matmul::q4k_repacked::{mins_part, RepackAcc, Route};
use crate::quant::{f16_at, WeightType};
use crate::quant_k::{q6_k_scales, scales_mins, Q6_K_D, QK_K};

/// A scale for the low 16 and the high 16 values of a register, in the form `scaled_dot`
/// multiplies by (i16 pairs for `madd`, i32 lanes for VNNI).
#[inline(always)]
unsafe fn scale_vec<const VNNI: bool>(lo: i32, hi: i32) -> __m256i {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        if VNNI {
            _mm256_set_m128i(_mm_set1_epi32(hi), _mm_set1_epi32(lo))
        } else {
            _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
        }
    }
}

/// Eight i32 lanes whose sum is `sum_i u[i] * y[i] * scale(i)`.
#[inline(always)]
unsafe fn scaled_dot<const VNNI: bool>(u: __m256i, y: __m256i, sc: __m256i) -> __m256i {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        if VNNI {
            _mm256_mullo_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, y), sc)
        } else {
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), sc)
        }
    }
}

/// One unpacked super-block: values in element order (register `r` holds elements
/// `32r..32r+32`) and their scales.
struct Unpacked {
    q: [__m256i; 8],
    sc: [__m256i; 8],
}

/// Q4_K / Q5_K: registers `2c` and `2c + 1` are the low and high nibbles of bytes
/// `32c..32c+32` (plus bits `2c`, `2c + 1` of the high-bit bytes for Q5_K).
#[inline(always)]
unsafe fn unpack_q45<const VNNI: bool>(five: bool, blk: &[u8], sc: &[u8; 8]) -> Unpacked {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let p = blk.as_ptr();
        let qs = if five { p.add(48) } else { p.add(16) };
        let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
        let mut u = Unpacked {
            q: [_mm256_setzero_si256(); 8],
            sc: [_mm256_setzero_si256(); 8],
        };
        for c in 0..4 {
            let b = _mm256_loadu_si256(qs.add(32 * c) as *const __m256i);
            let mut lo = _mm256_and_si256(b, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            if five {
                let bit = |s: i32| {
                    let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s));
                    _mm256_slli_epi16(_mm256_and_si256(h, one), 4)
                };
                lo = _mm256_or_si256(lo, bit(2 * c as i32));
                hi = _mm256_or_si256(hi, bit(2 * c as i32 + 1));
            }
            u.q[2 * c] = lo;
            u.q[2 * c + 1] = hi;
        }
        u.sc = std::array::from_fn(|r| scale_vec::<VNNI>(sc[r] as i32, sc[r] as i32));
        u
    }
}

/// Q6_K: values plus 32 (0..=63); the offset is taken back with the activations' sums
/// (`q6_k_take_offset`).
/// Register `4n + k` holds elements `128n + 32k..`, scales `sc[8n + 2k]` and `sc[8n + 2k + 1]`.
#[inline(always)]
unsafe fn unpack_q6<const VNNI: bool>(blk: &[u8], sc: &[i8; 16]) -> Unpacked {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let m3 = _mm256_set1_epi8(3);
        let p = blk.as_ptr();
        let mut u = Unpacked {
            q: [_mm256_setzero_si256(); 8],
            sc: [_mm256_setzero_si256(); 8],
        };
        for n in 0..2 {
            let ql1 = _mm256_loadu_si256(p.add(64 * n) as *const __m256i);
            let ql2 = _mm256_loadu_si256(p.add(64 * n + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * n) as *const __m256i);
            let high = |s: i32| {
                let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s));
                _mm256_slli_epi16(_mm256_and_si256(h, m3), 4)
            };
            let low = |b: __m256i, s: i32| {
                _mm256_and_si256(_mm256_srl_epi16(b, _mm_cvtsi32_si128(s)), m4)
            };
            u.q[4 * n] = _mm256_or_si256(low(ql1, 0), high(0));
            u.q[4 * n + 1] = _mm256_or_si256(low(ql2, 0), high(2));
            u.q[4 * n + 2] = _mm256_or_si256(low(ql1, 4), high(4));
            u.q[4 * n + 3] = _mm256_or_si256(low(ql2, 4), high(6));
        }
        for r in 0..8 {
            u.sc[r] = scale_vec::<VNNI>(sc[2 * r] as i32, sc[2 * r + 1] as i32);
        }
        u
    }
}

/// The eight exact lanes of `sum_i q[i] * y[i] * scale(i)` over one super-block (lane `m`:
/// elements `4m..4m+4` of each register).
#[inline(always)]
unsafe fn block_lanes<const VNNI: bool>(u: &Unpacked, y: *const i8) -> [i32; 8] {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let mut acc = _mm256_setzero_si256();
        for r in 0..8 {
            let yv = _mm256_loadu_si256(y.add(32 * r) as *const __m256i);
            acc = _mm256_add_epi32(acc, scaled_dot::<VNNI>(u.q[r], yv, u.sc[r]));
        }
        let mut out = [0i32; 8];
        _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, acc);
        out
    }
}

/// One K-quant row against `NT` consecutive tokens starting at `t0`, in `kquant_tiled`'s
/// float order when `tiled`, else in `KAcc`'s.
#[inline(always)]
pub(crate) unsafe fn tile<const NT: usize, const VNNI: bool>(
    ty: WeightType,
    tiled: bool,
    row: &[u8],
    a: &QuantizedActsK,
    t0: usize,
) -> [f32; NT] {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let nb = a.blocks();
        let bytes = ty.block_bytes();
        debug_assert_eq!(row.len(), nb * bytes);
        let mut acc = [KAcc::default(); NT];
        let mut tacc = [TiledAcc::default(); NT];
        for b in 0..nb {
            let blk = &row[b * bytes..(b + 1) * bytes];
            let y = |j: usize| a.qs.as_ptr().add((t0 + j) * a.cols + b * QK_K);
            match ty {
                WeightType::Q4_K | WeightType::Q5_K => {
                    let (sc, m) = scales_mins(blk);
                    let u = unpack_q45::<VNNI>(ty == WeightType::Q5_K, blk, &sc);
                    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
                    for j in 0..NT {
                        let k = (t0 + j) * nb + b;
                        let mins = mins_lanes(&m, &a.bsums[k * 16..(k + 1) * 16]);
                        let l = block_lanes::<VNNI>(&u, y(j));
                        if tiled {
                            let (s1, s2) = (l.iter().sum(), mins.iter().sum());
                            tacc[j].add(s1, d, s2, dmin, a.d[k]);
                        } else {
                            acc[j].add(a.d[k] * d, l, -a.d[k] * dmin, mins);
                        }
                    }
                }
                WeightType::Q6_K => {
                    let sc = q6_k_scales(blk);
                    let u = unpack_q6::<VNNI>(blk, &sc);
                    let d = f16_at(blk, Q6_K_D);
                    for j in 0..NT {
                        let k = (t0 + j) * nb + b;
                        let mut l = block_lanes::<VNNI>(&u, y(j));
                        q6_k_take_offset(&mut l, &sc, &a.bsums[k * 16..(k + 1) * 16]);
                        if tiled {
                            tacc[j].add(l.iter().sum(), d, 0, 0.0, a.d[k]);
                        } else {
                            acc[j].add(a.d[k] * d, l, 0.0, [0; 4]);
                        }
                    }
                }
                other => unreachable!("{other:?} is not a K-quant"),
            }
        }
        if tiled {
            tacc.map(TiledAcc::finish)
        } else {
            acc.map(|a| a.finish())
        }
    }
}

/// The four exact pair sums of one Q4_K super-block: element `s` is
/// `sum_{j in {2s, 2s+1}} sc_j * sum(q * y)` over sub-block `j`.
#[inline(always)]
unsafe fn pair_sums<const VNNI: bool>(u: &Unpacked, y: *const i8) -> [i32; 4] {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let pair = |s: usize| {
            let y0 = _mm256_loadu_si256(y.add(64 * s) as *const __m256i);
            let y1 = _mm256_loadu_si256(y.add(64 * s + 32) as *const __m256i);
            _mm256_add_epi32(
                scaled_dot::<VNNI>(u.q[2 * s], y0, u.sc[2 * s]),
                scaled_dot::<VNNI>(u.q[2 * s + 1], y1, u.sc[2 * s + 1]),
            )
        };
        let h01 = _mm256_hadd_epi32(pair(0), pair(1));
        let h23 = _mm256_hadd_epi32(pair(2), pair(3));
        let h = _mm256_hadd_epi32(h01, h23);
        let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        let mut out = [0i32; 4];
        _mm_storeu_si128(out.as_mut_ptr() as *mut __m128i, s);
        out
    }
}

/// One Q4_K row against `NT` consecutive tokens starting at `t0`, all through `route`'s
/// kernel, in `q4k_repacked`'s float order (the integer sums are exact, so only the order of
/// the fused multiply-adds matters).
#[inline(always)]
pub(crate) unsafe fn tile_repacked<const NT: usize, const VNNI: bool>(
    route: Route,
    row: &[u8],
    a: &QuantizedActsK,
    t0: usize,
) -> [f32; NT] {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let nb = a.blocks();
        let bytes = WeightType::Q4_K.block_bytes();
        debug_assert_eq!(row.len(), nb * bytes);
        let parts = route.parts();
        let mut acc = [RepackAcc::default(); NT];
        for b in 0..nb {
            let blk = &row[b * bytes..(b + 1) * bytes];
            let (sc, m) = scales_mins(blk);
            let u = unpack_q45::<VNNI>(false, blk, &sc);
            let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
            for (j, acc) in acc.iter_mut().enumerate() {
                let k = (t0 + j) * nb + b;
                let sums = pair_sums::<VNNI>(&u, a.qs.as_ptr().add((t0 + j) * a.cols + b * QK_K));
                let da = *a.d.get_unchecked(k);
                let bsums = &a.bsums[k * 16..(k + 1) * 16];
                let (scale, min_scale) = (d * da, dmin * da);
                if parts == 1 {
                    let sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
                    acc.add(sum, scale, mins_part(&m, bsums, 0, 1), min_scale);
                } else {
                    for (p, &sum) in sums.iter().enumerate() {
                        acc.add(sum, scale, mins_part(&m, bsums, p, 4), min_scale);
                    }
                }
            }
        }
        acc.map(|a| a.finish())
    }
}
