//! 512-bit kernels for `Isa::Avx512`.
//!
//! Matrices packed at load (`packed.rs`) take the interleaved kernel: sixteen rows per register,
//! eight registers of lanes per group, for every token count. Unpacked Q4_0, Q4_1 and Q8_0
//! rows take, for one token (decode), a kernel with two weight rows per register. Each 256-bit half of a register is one row's eight-lane
//! accumulator, updated exactly as the AVX2 kernel updates it (the same `vpdpbusd` lane sums,
//! the same `dw * dy` rounding, the same fused multiply-add, the same horizontal sum at the
//! end), so the bits equal the AVX2 path's and ggml's; what halves is the instruction count:
//! one dot product, conversion and multiply-add serve two rows, and one activation load serves
//! four. Everything else (prefill tiles, Q5_0, K-quants, float weights, leftover rows) runs the
//! AVX2 kernels with VNNI.

use super::packed::GROUP as PACKED_GROUP;
use super::{avx2, Acts, QMatrix};
use crate::quant::WeightType;

/// Rows per call of the inner kernel: two registers of two rows each.
const GROUP: usize = 4;

pub(super) fn rows(
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    acts: &Acts<'_>,
    tokens: usize,
    out: &mut [f32],
) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if let (Some(pk), Acts::Quant(a)) = (w.packed, acts) {
        assert!(pk.packs(w), "packing of another matrix");
        assert_eq!(a.qs.len(), tokens * w.cols, "activation shape");
        assert_eq!(a.d.len(), tokens * a.blocks());
        if r0.is_multiple_of(PACKED_GROUP) {
            let mut group = [0f32; PACKED_GROUP];
            while done + PACKED_GROUP <= n {
                let g = (r0 + done) / PACKED_GROUP;
                for t in 0..tokens {
                    // SAFETY: as below; `pk` packs `w` (checked), so group `g` exists.
                    group = unsafe { x86::packed_group(pk, g, a, t) };
                    for (r, v) in group.iter().enumerate() {
                        out[(done + r) * tokens + t] = *v;
                    }
                }
                done += PACKED_GROUP;
            }
            let _ = group;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if let (1, Acts::Quant(a), WeightType::Q4_0 | WeightType::Q4_1 | WeightType::Q8_0) =
        (tokens, acts, w.ty)
    {
        assert_eq!(a.qs.len(), w.cols, "one token's activations");
        assert_eq!(a.d.len(), a.blocks());
        while done + GROUP <= n && tokens == 1 {
            let rows = std::array::from_fn(|k| w.row(r0 + done + k));
            // SAFETY: `Isa::Avx512` is only detected when avx2, fma, f16c and
            // avx512f/bw/vl/vnni are; every row is `a.blocks()` whole blocks (`QMatrix::new`)
            // and the activations were checked above.
            let r = unsafe { x86::decode(w.ty, rows, a) };
            out[done..done + GROUP].copy_from_slice(&r);
            done += GROUP;
        }
    }
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
    use super::GROUP;
    use crate::act::QuantizedActs;
    use crate::matmul::avx2::x86::hsum;
    use crate::matmul::packed::{PackedRows, GROUP as PACKED_GROUP};
    use crate::quant::{WeightType, QK};
    use std::arch::x86_64::*;

    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q8_0: u8 = 2;

    /// `GROUP` rows of type `ty` against one token's activations.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn decode(
        ty: WeightType,
        rows: [&[u8]; GROUP],
        a: &QuantizedActs,
    ) -> [f32; GROUP] {
        match ty {
            WeightType::Q4_0 => decode_ty::<Q4_0>(rows, a),
            WeightType::Q4_1 => decode_ty::<Q4_1>(rows, a),
            WeightType::Q8_0 => decode_ty::<Q8_0>(rows, a),
            other => unreachable!("{other:?} has no 512-bit decode kernel"),
        }
    }

    #[inline(always)]
    unsafe fn decode_ty<const TY: u8>(rows: [&[u8]; GROUP], a: &QuantizedActs) -> [f32; GROUP] {
        let nb = a.blocks();
        let bb = match TY {
            Q4_0 => 18,
            Q4_1 => 20,
            _ => 34,
        };
        for row in &rows {
            debug_assert_eq!(row.len(), nb * bb);
        }
        const PAIRS: usize = GROUP / 2;
        let mut acc = [_mm512_setzero_ps(); PAIRS];
        // Q4_1's `sum(m * s)` per row, in lanes 1 (first row) and 3 (second row).
        let mut msum = [_mm_setzero_ps(); PAIRS];
        // Scale lanes: element 0 of a pair's products for the first row's eight lanes, element
        // 2 (Q4_1: `[dw, mw]` pairs) or 1 (one `dw` per row) for the second's.
        let second = if TY == Q4_1 { 2 } else { 1 };
        let spread = _mm512_set_epi32(
            second, second, second, second, second, second, second, second, 0, 0, 0, 0, 0, 0, 0, 0,
        );
        let qp = a.qs.as_ptr();
        for b in 0..nb {
            // The token's block in both halves.
            let y = _mm512_broadcast_i64x4(_mm256_loadu_si256(qp.add(b * QK) as *const __m256i));
            let dy = *a.d.get_unchecked(b);
            let dys = if TY == Q4_1 {
                let s = *a.s.get_unchecked(b);
                _mm_setr_ps(dy, s, dy, s)
            } else {
                _mm_set1_ps(dy)
            };
            for p in 0..PAIRS {
                let b0 = rows[2 * p].as_ptr().add(b * bb);
                let b1 = rows[2 * p + 1].as_ptr().add(b * bb);
                // The rows' f16 scales (and Q4_1's minimums) converted together (exact), then
                // multiplied by the token's scale as the AVX2 kernel does, one f32 product each.
                let halves = if TY == Q4_1 {
                    _mm_insert_epi32::<1>(
                        _mm_cvtsi32_si128((b0 as *const i32).read_unaligned()),
                        (b1 as *const i32).read_unaligned(),
                    )
                } else {
                    let h0 = (b0 as *const u16).read_unaligned() as i32;
                    let h1 = (b1 as *const u16).read_unaligned() as i32;
                    _mm_cvtsi32_si128(h0 | (h1 << 16))
                };
                let prod = _mm_mul_ps(_mm_cvtph_ps(halves), dys);
                if TY == Q4_1 {
                    msum[p] = _mm_add_ps(msum[p], prod);
                }
                let sc = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(prod));
                let dot = match TY {
                    Q4_1 => _mm512_dpbusd_epi32(
                        _mm512_setzero_si512(),
                        nibbles(b0.add(4), b1.add(4)),
                        y,
                    ),
                    _ => {
                        // Signed weights: the AVX2 kernel's sign trick (|w| times y with w's
                        // sign), with a mask in place of `vpsignb`, which has no 512-bit form;
                        // where w is 0 both give a zero product.
                        let w = if TY == Q4_0 {
                            _mm512_sub_epi8(nibbles(b0.add(2), b1.add(2)), _mm512_set1_epi8(8))
                        } else {
                            _mm512_inserti64x4::<1>(
                                _mm512_castsi256_si512(_mm256_loadu_si256(
                                    b0.add(2) as *const __m256i
                                )),
                                _mm256_loadu_si256(b1.add(2) as *const __m256i),
                            )
                        };
                        let neg = _mm512_movepi8_mask(w);
                        let sy = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), sy)
                    }
                };
                acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc[p]);
            }
        }
        let mut out = [0f32; GROUP];
        for p in 0..PAIRS {
            let lo = _mm512_castps512_ps256(acc[p]);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[p])));
            out[2 * p] = hsum(lo);
            out[2 * p + 1] = hsum(hi);
            if TY == Q4_1 {
                out[2 * p] += _mm_cvtss_f32(_mm_shuffle_ps::<1>(msum[p], msum[p]));
                out[2 * p + 1] += _mm_cvtss_f32(_mm_shuffle_ps::<3>(msum[p], msum[p]));
            }
        }
        out
    }

    /// Group `g` of `pk` (sixteen rows) against token `t`'s activations.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn packed_group(
        pk: &PackedRows,
        g: usize,
        a: &QuantizedActs,
        t: usize,
    ) -> [f32; PACKED_GROUP] {
        match pk.ty() {
            WeightType::Q4_0 => packed_ty::<Q4_0>(pk, g, a, t),
            WeightType::Q4_1 => packed_ty::<Q4_1>(pk, g, a, t),
            WeightType::Q8_0 => packed_ty::<Q8_0>(pk, g, a, t),
            other => unreachable!("{other:?} is never packed"),
        }
    }

    /// [`packed_group`] for the weight type `TY`. `acc[k]` holds, in lane `r`, row `r`'s
    /// ggml lane `k` (the products of elements `4k..4k + 4` of every block).
    #[inline(always)]
    unsafe fn packed_ty<const TY: u8>(
        pk: &PackedRows,
        g: usize,
        a: &QuantizedActs,
        t: usize,
    ) -> [f32; PACKED_GROUP] {
        let nb = a.blocks();
        let mut acc = [_mm512_setzero_ps(); 8];
        let mut msum = _mm512_setzero_ps();
        let low = _mm512_set1_epi8(0x0F);
        let ones = _mm256_set1_epi8(1);
        let qy = a.qs.as_ptr().add(t * a.cols);
        for b in 0..nb {
            let rec = pk.record(g, b);
            let yb = qy.add(b * QK);
            let k = t * nb + b;
            let dy = *a.d.get_unchecked(k);
            // Each row's `dw * dy`, one f32 product as in the scalar-broadcast kernels.
            let dw = _mm512_cvtph_ps(_mm256_load_si256(rec as *const __m256i));
            let sc = _mm512_mul_ps(dw, _mm512_set1_ps(dy));
            if TY == Q4_1 {
                let mw = _mm512_cvtph_ps(_mm256_load_si256(rec.add(32) as *const __m256i));
                let s = *a.s.get_unchecked(k);
                msum = _mm512_add_ps(msum, _mm512_mul_ps(mw, _mm512_set1_ps(s)));
            }
            // The lanes' starting values: 0, or `-offset * sum(y)` over the lane's four
            // activations for the offset-stored signed quants.
            let mut init = [0i32; 8];
            if TY != Q4_1 {
                let y = _mm256_loadu_si256(yb as *const __m256i);
                let sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, y);
                let shift = if TY == Q4_0 { 3 } else { 7 };
                let c = _mm256_sub_epi32(
                    _mm256_setzero_si256(),
                    _mm256_sllv_epi32(sums, _mm256_set1_epi32(shift)),
                );
                _mm256_storeu_si256(init.as_mut_ptr() as *mut __m256i, c);
            }
            let y4 = |k: usize| _mm512_set1_epi32((yb.add(4 * k) as *const i32).read_unaligned());
            let q = rec.add(64) as *const __m512i;
            if TY == Q8_0 {
                for k in 0..8 {
                    let p = _mm512_dpbusd_epi32(
                        _mm512_set1_epi32(init[k]),
                        _mm512_load_si512(q.add(k)),
                        y4(k),
                    );
                    acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[k]);
                }
            } else {
                for j in 0..4 {
                    let v = _mm512_load_si512(q.add(j));
                    let lo = _mm512_and_si512(v, low);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                    let p = _mm512_dpbusd_epi32(_mm512_set1_epi32(init[j]), lo, y4(j));
                    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[j]);
                    let p = _mm512_dpbusd_epi32(_mm512_set1_epi32(init[j + 4]), hi, y4(j + 4));
                    acc[j + 4] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[j + 4]);
                }
            }
        }
        // ggml's horizontal sum, for sixteen rows at once: lanes k and k + 4, then the
        // pairs (0, 2) and (1, 3), then the two; Q4_1 adds its `sum(m * s)` last.
        let s0 = _mm512_add_ps(acc[0], acc[4]);
        let s1 = _mm512_add_ps(acc[1], acc[5]);
        let s2 = _mm512_add_ps(acc[2], acc[6]);
        let s3 = _mm512_add_ps(acc[3], acc[7]);
        let mut r = _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3));
        if TY == Q4_1 {
            r = _mm512_add_ps(r, msum);
        }
        let mut out = [0f32; PACKED_GROUP];
        _mm512_storeu_ps(out.as_mut_ptr(), r);
        out
    }

    /// Two rows' 16 packed bytes as 64 nibbles in element order: the first row's low then high
    /// nibbles, then the second row's.
    #[inline(always)]
    unsafe fn nibbles(p0: *const u8, p1: *const u8) -> __m512i {
        let q0 = _mm256_broadcastsi128_si256(_mm_loadu_si128(p0 as *const __m128i));
        let q1 = _mm256_broadcastsi128_si256(_mm_loadu_si128(p1 as *const __m128i));
        let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q0), q1);
        // The second and fourth 128-bit lanes take the high nibbles.
        let q = _mm512_mask_srli_epi16::<4>(q, 0xFF00_FF00, q);
        _mm512_and_si512(q, _mm512_set1_epi8(0x0F))
    }
}
