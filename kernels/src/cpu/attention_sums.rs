//! The sums inside attention, in the order llama.cpp's CPU backend (AVX-512 build) adds them,
//! so attention output is bit-identical to its reference:
//!
//! - `Order::Gemm` (two or more query tokens: llamafile's tinyBLAS): one 16-lane accumulator
//!   per output, element `e` in lane `e % 16`, fused multiply-adds, one `reduce16` at the end.
//! - `Order::Vec` (one query token: `ggml_vec_dot_f16`): four 16-lane accumulators over
//!   64-element steps (element `e` in accumulator `e % 64`), folded 0+2 and 1+3, then
//!   together, then `reduce16`; a tail shorter than 64 is added in f64.
//!
//! Every function is `#[inline(always)]` so it is compiled with the caller's target features
//! (the attention task runs with AVX2 + FMA where the CPU has them).

use crate::activation::LANES;
use crate::expf::reduce16;

/// Which of ggml's f16 matmul paths llama.cpp takes, which fixes the order of every sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// Prefill: tinyBLAS.
    Gemm,
    /// Decode: `ggml_vec_dot_f16`.
    Vec,
}

/// `ggml_vec_dot_f16`'s step: four accumulators of 16 lanes.
pub(crate) const VEC_STEP: usize = 4 * LANES;

/// tinyBLAS's dot product (`a.len()` a multiple of 16).
#[inline(always)]
pub(crate) fn dot_gemm(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (x, y) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    reduce16(&acc)
}

/// `ggml_vec_dot_f16`'s dot product.
#[inline(always)]
pub(crate) fn dot_vec(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; VEC_STEP];
    let (ac, bc) = (a.chunks_exact(VEC_STEP), b.chunks_exact(VEC_STEP));
    let (at, bt) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for e in 0..VEC_STEP {
            acc[e] = x[e].mul_add(y[e], acc[e]);
        }
    }
    let mut folded = [0f32; LANES];
    for l in 0..LANES {
        folded[l] = (acc[l] + acc[2 * LANES + l]) + (acc[LANES + l] + acc[3 * LANES + l]);
    }
    let mut sum = reduce16(&folded) as f64;
    for (x, y) in at.iter().zip(bt) {
        sum += (x * y) as f64;
    }
    sum as f32
}

/// [`dot_vec`] with eight-lane vectors: accumulator `e` of 64 is lane `e % 8` of vector
/// `e / 8`, and the fold and `reduce16` pair the same lanes in the same order (same bits).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn dot_vec_avx2(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        use std::arch::x86_64::*;
        let n = a.len().min(b.len());
        let body = n / VEC_STEP * VEC_STEP;
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 8];
        for i in (0..body).step_by(VEC_STEP) {
            for (k, ak) in acc.iter_mut().enumerate() {
                let (x, y) = (
                    _mm256_loadu_ps(pa.add(i + 8 * k)),
                    _mm256_loadu_ps(pb.add(i + 8 * k)),
                );
                *ak = _mm256_fmadd_ps(x, y, *ak);
            }
        }
        // folded[l] = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]), l < 16.
        let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        // reduce16: t3 = hi + lo, t6 = t3[4..8] + t3[0..4], (t6[0] + t6[2]) + (t6[1] + t6[3]).
        let t3 = _mm256_add_ps(hi, lo);
        let t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
        let u = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
        let r = _mm_add_ss(u, _mm_movehdup_ps(u));
        let mut sum = _mm_cvtss_f32(r) as f64;
        for i in body..n {
            sum += (a[i] * b[i]) as f64;
        }
        sum as f32
    }
}

// A weighted sum `o[d] = sum_j p[j] * v[j * hd + d]` in `order` is `weighted_start`, then
// `weighted_add` over the keys in ascending runs, then `weighted_finish`; `acc` holds at least
// `VEC_STEP * hd`. llama.cpp's cache is padded with masked keys whose weight is exactly 0, so
// a `Vec` sum over it has no tail: the missing lanes are zeros here.

/// Accumulator lanes of `order`.
#[inline(always)]
fn lanes(order: Order) -> usize {
    match order {
        Order::Gemm => LANES,
        Order::Vec => VEC_STEP,
    }
}

/// Zeroes the accumulators of a weighted sum.
#[inline(always)]
pub(crate) fn weighted_start(order: Order, hd: usize, acc: &mut [f32]) {
    acc[..lanes(order) * hd].fill(0.0);
}

/// Adds keys `j0..j0 + p.len()` (weights `p`, value rows `v`) to the accumulators; keys
/// must arrive in ascending order across calls.
#[inline(always)]
pub(crate) fn weighted_add(
    order: Order,
    j0: usize,
    p: &[f32],
    v: &[f32],
    hd: usize,
    acc: &mut [f32],
) {
    // Lane counts are powers of two: a mask, not a division per key.
    let mask = lanes(order) - 1;
    for (jj, pj) in p.iter().enumerate() {
        let row = &mut acc[((j0 + jj) & mask) * hd..][..hd];
        for (a, x) in row.iter_mut().zip(&v[jj * hd..(jj + 1) * hd]) {
            *a = x.mul_add(*pj, *a);
        }
    }
}

/// [`weighted_add`] eight columns at a time (`hd` a multiple of 8): the same fused
/// multiply-add per element, so the same bits. The compiler leaves the generic loop scalar
/// for short rows (decode's 16-column tasks fall under its 32-wide unrolled body).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn weighted_add_avx2(
    order: Order,
    j0: usize,
    p: &[f32],
    v: &[f32],
    hd: usize,
    acc: &mut [f32],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        use std::arch::x86_64::*;
        debug_assert_eq!(hd % 8, 0);
        let mask = lanes(order) - 1;
        assert!(v.len() >= p.len() * hd && acc.len() >= lanes(order) * hd);
        for (jj, pj) in p.iter().enumerate() {
            let w = _mm256_set1_ps(*pj);
            let a = acc.as_mut_ptr().add(((j0 + jj) & mask) * hd);
            let x = v.as_ptr().add(jj * hd);
            for d in (0..hd).step_by(8) {
                let r = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(d)), w, _mm256_loadu_ps(a.add(d)));
                _mm256_storeu_ps(a.add(d), r);
            }
        }
    }
}

/// [`weighted_add_avx2`] for `Order::Vec` with each accumulator lane kept in registers while
/// it takes all of its keys in the run: lane `l` takes keys `j0 + l`, `j0 + l + 64`, ... in
/// ascending order, each with the same fused multiply-add, so the bits are the same; the
/// lane's accumulators are loaded and stored once per run instead of once per key. `j0` must
/// be a multiple of [`VEC_STEP`] and `hd` of 8 (at most 32).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn weighted_add_vec_lanes_avx2(
    j0: usize,
    p: &[f32],
    v: &[f32],
    hd: usize,
    acc: &mut [f32],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        use std::arch::x86_64::*;
        assert!(j0.is_multiple_of(VEC_STEP) && hd.is_multiple_of(8) && hd <= 32);
        assert!(v.len() >= p.len() * hd && acc.len() >= VEC_STEP * hd);
        let n = p.len();
        let vecs = hd / 8;
        for l in 0..VEC_STEP.min(n) {
            let a = acc.as_mut_ptr().add(l * hd);
            let mut r = [_mm256_setzero_ps(); 4];
            for (c, x) in r.iter_mut().enumerate().take(vecs) {
                *x = _mm256_loadu_ps(a.add(8 * c));
            }
            let mut jj = l;
            while jj < n {
                let w = _mm256_set1_ps(*p.get_unchecked(jj));
                let x = v.as_ptr().add(jj * hd);
                for (c, rc) in r.iter_mut().enumerate().take(vecs) {
                    *rc = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(8 * c)), w, *rc);
                }
                jj += VEC_STEP;
            }
            for (c, x) in r.iter().enumerate().take(vecs) {
                _mm256_storeu_ps(a.add(8 * c), *x);
            }
        }
    }
}

/// Folds and reduces the accumulators into `o`.
#[inline(always)]
pub(crate) fn weighted_finish(order: Order, hd: usize, acc: &mut [f32], o: &mut [f32]) {
    if order == Order::Vec {
        // Fold accumulators 0+2 and 1+3, then together, into lanes 0..16 (row-wise, so it
        // vectorizes over `d`).
        for l in 0..LANES {
            for d in 0..hd {
                acc[l * hd + d] = (acc[l * hd + d] + acc[(2 * LANES + l) * hd + d])
                    + (acc[(LANES + l) * hd + d] + acc[(3 * LANES + l) * hd + d]);
            }
        }
    }
    reduce16_rows(&mut acc[..LANES * hd], hd, o);
}

/// `o[d] = reduce16(acc[0][d], ..., acc[15][d])` for rows of `hd`, in `reduce16`'s order.
#[inline(always)]
fn reduce16_rows(acc: &mut [f32], hd: usize, o: &mut [f32]) {
    for i in 0..8 {
        for d in 0..hd {
            acc[i * hd + d] += acc[(i + 8) * hd + d];
        }
    }
    for i in 0..4 {
        for d in 0..hd {
            acc[i * hd + d] += acc[(i + 4) * hd + d];
        }
    }
    for (d, od) in o.iter_mut().enumerate() {
        *od = (acc[d] + acc[2 * hd + d]) + (acc[hd + d] + acc[3 * hd + d]);
    }
}
