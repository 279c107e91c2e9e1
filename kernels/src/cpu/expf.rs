//! `exp` and horizontal sums with ggml's rounding, so activations and attention weights are
//! bit-identical to llama.cpp's CPU backend on an AVX-512 machine (the reference build).
//!
//! - [`expf`]: ggml's vectorized `ggml_v_expf` (the AVX-512 variant: Arm's polynomial, then
//!   `scalef(j, n)`), one lane at a time with fused multiply-adds. `expf8` is the same
//!   computation eight lanes wide on AVX2 + FMA; both give the same bits.
//! - [`reduce16`]: `_mm512_reduce_add_ps` (GCC's order: halves, then quarters, then pairs).
//!
//! ggml runs these in 16-lane blocks and uses libm's `expf` for a tail shorter than 16; the
//! callers here do the same.

/// `0x1.8p23`: adding it rounds to an integer in the low mantissa bits.
const SHIFT: f32 = f32::from_bits(0x4b40_0000);
/// `0x1.715476p+0` (log2 e).
const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b);
/// `0x1.62e4p-1` and `0x1.7f7d1cp-20`: ln 2 split in two.
const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
/// Polynomial coefficients, highest degree first (`0x1.0e4020p-7` ... `0x1.ffffecp-1`).
const C4: f32 = f32::from_bits(0x3c07_2010);
const C3: f32 = f32::from_bits(0x3d2b_9f17);
const C2: f32 = f32::from_bits(0x3e2a_af33);
const C1: f32 = f32::from_bits(0x3eff_fedb);
const C0: f32 = f32::from_bits(0x3f7f_fff6);

/// `2^e` for `-126 <= e <= 127`.
#[inline(always)]
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// `j * 2^n` rounded once, like `vscalefps` (`n` is an integer in `[-192, 192]`).
#[inline(always)]
fn scalef(j: f32, n: f32) -> f32 {
    let e = n as i32;
    if e.abs() <= 126 {
        j * pow2(e)
    } else {
        // Two exact power-of-two steps; only the second can round.
        let h = e / 2;
        j * pow2(h) * pow2(e - h)
    }
}

/// e^x with ggml's AVX-512 `ggml_v_expf` rounding (max error about 1.5 ulp).
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    let z = x.mul_add(LOG2E, SHIFT);
    let n = z - SHIFT;
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let u = b * b;
    let j = C4
        .mul_add(b, C3)
        .mul_add(u, C2.mul_add(b, C1))
        .mul_add(u, C0.mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    scalef(j, n)
}

/// `_mm512_reduce_add_ps` of 16 lanes, in GCC's order.
#[inline(always)]
pub fn reduce16(a: &[f32; 16]) -> f32 {
    let mut t3 = [0f32; 8];
    for i in 0..8 {
        t3[i] = a[i + 8] + a[i];
    }
    let mut t6 = [0f32; 4];
    for i in 0..4 {
        t6[i] = t3[i + 4] + t3[i];
    }
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// [`expf`] on eight lanes. Lanes whose exponent leaves the normal range take the scalar
    /// path (same operations, same bits).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn expf8(x: __m256) -> __m256 {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let r = _mm256_set1_ps(SHIFT);
            let z = _mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), r);
            let n = _mm256_sub_ps(z, r);
            let b = _mm256_fnmadd_ps(
                n,
                _mm256_set1_ps(LN2_LO),
                _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x),
            );
            let u = _mm256_mul_ps(b, b);
            let j = _mm256_fmadd_ps(
                _mm256_fmadd_ps(
                    _mm256_fmadd_ps(_mm256_set1_ps(C4), b, _mm256_set1_ps(C3)),
                    u,
                    _mm256_fmadd_ps(_mm256_set1_ps(C2), b, _mm256_set1_ps(C1)),
                ),
                u,
                _mm256_fmadd_ps(_mm256_set1_ps(C0), b, _mm256_set1_ps(1.0)),
            );
            let an = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
            let out_of_range = _mm256_cmp_ps::<_CMP_GT_OQ>(an, _mm256_set1_ps(126.0));
            if _mm256_movemask_ps(out_of_range) == 0 {
                let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
                return _mm256_mul_ps(j, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e)));
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), x);
            for v in lanes.iter_mut() {
                *v = expf(*v);
            }
            _mm256_loadu_ps(lanes.as_ptr())
        }
    }

    /// [`expf`] on sixteen lanes: ggml's `ggml_v_expf` itself, `vscalefps` included, so no
    /// lane needs the scalar path.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub unsafe fn expf16(x: __m512) -> __m512 {
        let r = _mm512_set1_ps(SHIFT);
        let z = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(
            n,
            _mm512_set1_ps(LN2_LO),
            _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x),
        );
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(_mm512_set1_ps(C4), b, _mm512_set1_ps(C3)),
                u,
                _mm512_fmadd_ps(_mm512_set1_ps(C2), b, _mm512_set1_ps(C1)),
            ),
            u,
            _mm512_fmadd_ps(_mm512_set1_ps(C0), b, _mm512_set1_ps(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        let far = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        if far == 0 {
            return res;
        }
        let below = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
        let alt = _mm512_mask_blend_ps(below, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
        _mm512_mask_blend_ps(far, res, alt)
    }

    /// [`reduce16`] of a register (the same order of additions).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub unsafe fn reduce16_zmm(a: __m512) -> f32 {
        let t3 = _mm256_add_ps(
            _mm512_castps512_ps256(a),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a))),
        );
        let t6 = _mm_add_ps(_mm256_castps256_ps128(t3), _mm256_extractf128_ps::<1>(t3));
        // (t6[0] + t6[2]) + (t6[1] + t6[3])
        let t7 = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
        _mm_cvtss_f32(_mm_add_ss(t7, _mm_movehdup_ps(t7)))
    }
}
