//! 512-bit kernels for `Isa::Avx512`: matrices packed at load (`packed.rs`) take the
//! interleaved kernel, sixteen rows per register and eight registers of ggml's lanes per
//! group, for every token count, with the bits of the AVX2 kernels; packed Q4_K and Q6_K take
//! `kquant_avx512.rs`. Everything else (unpacked rows, float weights, leftover rows) runs the
//! AVX2 kernels with VNNI.

use super::dest::Dest;
use super::{avx2, packed, Acts, QMatrix};

/// The offset of `w`'s stored quants when this ISA's product with it reads
/// [`QuantizedActs::lane_starts`] (`crate::act::QuantizedActs`): the interleaved kernel of an
/// offset-stored type.
pub(super) fn lane_offset(w: &QMatrix<'_>) -> Option<i32> {
    w.packed.as_ref()?;
    offset(w.ty)
}

/// What the interleaved kernel adds to `ty`'s signed quants to store them unsigned.
fn offset(ty: crate::quant::WeightType) -> Option<i32> {
    use crate::quant::WeightType;
    match ty {
        WeightType::Q4_0 => Some(8),
        WeightType::Q5_0 => Some(16),
        WeightType::Q8_0 => Some(128),
        _ => None,
    }
}

/// Rows `r0..r0 + n` of `w`'s whole packed groups for every token into `out`; returns how
/// many rows it did (none unless `w` is packed and `r0` starts a group).
pub(super) fn packed_rows(
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    acts: &Acts<'_>,
    tokens: usize,
    out: Dest<'_>,
) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `Isa::Avx512` is only detected when avx2, fma, f16c and
        // avx512f/bw/vl/vnni are.
        unsafe {
            match acts {
                Acts::Quant(a) => packed::run_groups(
                    x86::packed_group,
                    Some(x86::packed_group2),
                    w,
                    r0,
                    n,
                    a,
                    tokens,
                    out,
                ),
                Acts::QuantK(a) => super::kquant_avx512::run_groups(w, r0, n, a, tokens, out),
                Acts::Float(_) => 0,
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (w, r0, n, acts, tokens, out);
        0
    }
}

pub(super) fn rows(
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    acts: &Acts<'_>,
    tokens: usize,
    out: &mut [f32],
) {
    let done = packed_rows(w, r0, n, acts, tokens, Dest::by_row(out, tokens));
    if done < n {
        avx2::rows(
            true,
            w,
            r0 + done,
            n - done,
            acts,
            tokens,
            &mut out[done * tokens..],
        );
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::act::QuantizedActs;
    use crate::matmul::packed::{
        prefetch_ahead, PackedRows, GROUP as PACKED_GROUP, Q5_0_HIGH_LINE as PACKED_Q5_0_HIGH_LINE,
    };
    use crate::quant::{WeightType, QK};
    use std::arch::x86_64::*;

    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q8_0: u8 = 2;
    const Q5_0: u8 = 3;
    /// Q5_0 packed wide (`Packing::Compute`): loaded as Q8_0's lines, started as Q5_0's.
    const Q5_0_WIDE: u8 = 4;

    /// Group `g` of `pk` (sixteen rows) against token `t`'s activations.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn packed_group(
        pk: &PackedRows,
        g: usize,
        a: &QuantizedActs,
        t: usize,
    ) -> [f32; PACKED_GROUP] {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let [r] = match pk.ty() {
                WeightType::Q4_0 => packed_ty::<Q4_0, 1>(pk, g, a, t),
                WeightType::Q4_1 => packed_ty::<Q4_1, 1>(pk, g, a, t),
                WeightType::Q8_0 => packed_ty::<Q8_0, 1>(pk, g, a, t),
                WeightType::Q5_0 if pk.wide() => packed_ty::<Q5_0_WIDE, 1>(pk, g, a, t),
                WeightType::Q5_0 => packed_ty::<Q5_0, 1>(pk, g, a, t),
                other => unreachable!("{other:?} is never packed"),
            };
            r
        }
    }

    /// [`packed_group`] for tokens `t` and `t + 1` at once: each record is loaded and
    /// unpacked once for both, and each token's sums are the one-token kernel's.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn packed_group2(
        pk: &PackedRows,
        g: usize,
        a: &QuantizedActs,
        t: usize,
    ) -> [[f32; PACKED_GROUP]; 2] {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            match pk.ty() {
                WeightType::Q4_0 => packed_ty::<Q4_0, 2>(pk, g, a, t),
                WeightType::Q4_1 => packed_ty::<Q4_1, 2>(pk, g, a, t),
                WeightType::Q8_0 => packed_ty::<Q8_0, 2>(pk, g, a, t),
                WeightType::Q5_0 if pk.wide() => packed_ty::<Q5_0_WIDE, 2>(pk, g, a, t),
                WeightType::Q5_0 => packed_ty::<Q5_0, 2>(pk, g, a, t),
                other => unreachable!("{other:?} is never packed"),
            }
        }
    }

    /// Bit `s` of every byte of a Q5_0 high-bit line (`packed::q5_0_high_bits`) moved to bit
    /// 4, the rest cleared: the high bits of one quant line's low or high nibbles.
    #[inline(always)]
    unsafe fn high_bit(qh: __m512i, s: usize) -> __m512i {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            // 16-bit shifts by at most 4: bit 4 of each byte comes from the same byte.
            let v = match s {
                0 => _mm512_slli_epi16::<4>(qh),
                1 => _mm512_slli_epi16::<3>(qh),
                2 => _mm512_slli_epi16::<2>(qh),
                3 => _mm512_slli_epi16::<1>(qh),
                4 => qh,
                5 => _mm512_srli_epi16::<1>(qh),
                6 => _mm512_srli_epi16::<2>(qh),
                _ => _mm512_srli_epi16::<3>(qh),
            };
            _mm512_and_si512(v, _mm512_set1_epi8(0x10))
        }
    }

    /// [`packed_group`] for the weight type `TY` and tokens `t0..t0 + NT`. `acc[j][k]`
    /// holds, in lane `r`, row `r`'s ggml lane `k` (the products of elements `4k..4k + 4` of
    /// every block) for token `t0 + j`.
    #[inline(always)]
    unsafe fn packed_ty<const TY: u8, const NT: usize>(
        pk: &PackedRows,
        g: usize,
        a: &QuantizedActs,
        t0: usize,
    ) -> [[f32; PACKED_GROUP]; NT] {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let nb = a.blocks();
            let mut acc = [[_mm512_setzero_ps(); 8]; NT];
            let mut msum = [_mm512_setzero_ps(); NT];
            let low = _mm512_set1_epi8(0x0F);
            let mut qy = [a.qs.as_ptr(); NT];
            for (j, p) in qy.iter_mut().enumerate() {
                *p = a.qs.as_ptr().add((t0 + j) * a.cols);
            }
            let lines = pk.record_lines();
            // Read unchecked below: `matmul_many_with` adds them for these types.
            let starts = match super::offset(pk.ty()) {
                Some(o) => {
                    let starts = a.lane_starts(o).expect("the lanes' starting values");
                    assert_eq!(starts.len(), a.qs.len() / 4, "the lanes' starting values");
                    starts.as_ptr()
                }
                None => std::ptr::null(),
            };
            for b in 0..nb {
                let rec = pk.record(g, b);
                prefetch_ahead(rec, lines, t0);
                let dw = _mm512_cvtph_ps(_mm256_load_si256(rec as *const __m256i));
                let q = rec.add(64) as *const __m512i;
                // The record's quants as unsigned lanes, once for every token: Q8_0's (and a
                // wide Q5_0's) eight lines, or the low and high nibbles (Q5_0: with their high
                // bits) of four.
                let mut w = [_mm512_setzero_si512(); 8];
                if TY == Q8_0 || TY == Q5_0_WIDE {
                    for (k, x) in w.iter_mut().enumerate() {
                        *x = _mm512_load_si512(q.add(k));
                    }
                } else {
                    let qh = if TY == Q5_0 {
                        _mm512_load_si512(q.add(PACKED_Q5_0_HIGH_LINE - 1))
                    } else {
                        _mm512_setzero_si512()
                    };
                    for j in 0..4 {
                        let v = _mm512_load_si512(q.add(j));
                        let mut lo = _mm512_and_si512(v, low);
                        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                        if TY == Q5_0 {
                            lo = _mm512_or_si512(lo, high_bit(qh, 2 * j));
                            hi = _mm512_or_si512(hi, high_bit(qh, 2 * j + 1));
                        }
                        w[j] = lo;
                        w[j + 4] = hi;
                    }
                }
                for j in 0..NT {
                    let yb = qy[j].add(b * QK);
                    let k = (t0 + j) * nb + b;
                    let dy = *a.d.get_unchecked(k);
                    // Each row's `dw * dy`, one f32 product as in the scalar-broadcast kernels.
                    let sc = _mm512_mul_ps(dw, _mm512_set1_ps(dy));
                    if TY == Q4_1 {
                        let mw = _mm512_cvtph_ps(_mm256_load_si256(rec.add(32) as *const __m256i));
                        let s = *a.s.get_unchecked(k);
                        msum[j] = _mm512_add_ps(msum[j], _mm512_mul_ps(mw, _mm512_set1_ps(s)));
                    }
                    // The lanes' starting values: 0, or `-offset * sum(y)` over the lane's four
                    // activations for the offset-stored signed quants (they come with the
                    // activations, once per token and block).
                    let lanes = starts.wrapping_add(k * 8);
                    // Lane k takes the activations of elements 4k..4k + 4 (Q8_0: line k; Q4_x
                    // and Q5_0: the low nibbles of line k, or the high ones of line k - 4).
                    for (k, wk) in w.iter().enumerate() {
                        let y4 = _mm512_set1_epi32((yb.add(4 * k) as *const i32).read_unaligned());
                        let init = if TY == Q4_1 {
                            _mm512_setzero_si512()
                        } else {
                            _mm512_set1_epi32(*lanes.add(k))
                        };
                        let p = _mm512_dpbusd_epi32(init, *wk, y4);
                        acc[j][k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[j][k]);
                    }
                }
            }
            // ggml's horizontal sum, for sixteen rows at once: lanes k and k + 4, then the
            // pairs (0, 2) and (1, 3), then the two; Q4_1 adds its `sum(m * s)` last.
            let mut out = [[0f32; PACKED_GROUP]; NT];
            for j in 0..NT {
                let acc = &acc[j];
                let s0 = _mm512_add_ps(acc[0], acc[4]);
                let s1 = _mm512_add_ps(acc[1], acc[5]);
                let s2 = _mm512_add_ps(acc[2], acc[6]);
                let s3 = _mm512_add_ps(acc[3], acc[7]);
                let mut r = _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3));
                if TY == Q4_1 {
                    r = _mm512_add_ps(r, msum[j]);
                }
                _mm512_storeu_ps(out[j].as_mut_ptr(), r);
            }
            out
        }
    }
}
