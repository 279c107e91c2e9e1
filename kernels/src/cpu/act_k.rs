//! Q8_K activations for the K-quant dot products (ggml's `quantize_row_q8_K_ref`): per
//! 256-element block, `d = max / -127` where `max` is the value of largest magnitude (kept
//! in f32), `q = min(127, round_even(x * -127 / max))`, and the sums of each 16 values.

use crate::isa::Isa;
use crate::parallel::Parallel;
use crate::quant_k::QK_K;

/// A batch of activation rows quantized per 256-element block.
#[derive(Clone, Debug, Default)]
pub struct QuantizedActsK {
    /// Elements per row.
    pub cols: usize,
    /// Number of rows (tokens).
    pub rows: usize,
    /// `rows * cols` quantized values, row-major.
    pub qs: Vec<i8>,
    /// `rows * cols / 256` block scales.
    pub d: Vec<f32>,
    /// `rows * cols / 16` sums of 16 consecutive values.
    pub bsums: Vec<i16>,
}

impl QuantizedActsK {
    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.cols / QK_K
    }
}

/// Quantizes `rows` rows of `cols` elements (`cols % 256 == 0`) with the best ISA.
pub fn quantize_acts_k(x: &[f32], rows: usize, cols: usize) -> QuantizedActsK {
    quantize_acts_k_with(Isa::detect(), x, rows, cols, &Parallel::single())
}

/// [`quantize_acts_k`] with an explicit instruction set, split over `par`'s threads by rows
/// (each block depends on its own 256 values only, so the split changes no bit). Every ISA
/// gives the same bits.
pub fn quantize_acts_k_with(
    isa: Isa,
    x: &[f32],
    rows: usize,
    cols: usize,
    par: &Parallel,
) -> QuantizedActsK {
    assert_eq!(
        cols % QK_K,
        0,
        "Q8_K activation width must be a multiple of 256"
    );
    assert_eq!(x.len(), rows * cols, "activation length");
    let nb = rows * cols / QK_K;
    let mut q = QuantizedActsK {
        cols,
        rows,
        qs: vec![0; rows * cols],
        d: vec![0.0; nb],
        bsums: vec![0; rows * cols / 16],
    };
    let bpr = cols / QK_K;
    let ptrs = Ptrs(q.qs.as_mut_ptr(), q.d.as_mut_ptr(), q.bsums.as_mut_ptr());
    par.for_each_index(rows.div_ceil(ROWS_PER_TASK), |c| {
        let ptrs = &ptrs;
        let (r0, r1) = (c * ROWS_PER_TASK, ((c + 1) * ROWS_PER_TASK).min(rows));
        let (e0, e1, b0, b1) = (r0 * cols, r1 * cols, r0 * bpr, r1 * bpr);
        // SAFETY: task `c` alone writes rows r0..r1 of the three buffers, which outlive the
        // region.
        let (qs, d, bsums) = unsafe {
            (
                std::slice::from_raw_parts_mut(ptrs.0.add(e0), e1 - e0),
                std::slice::from_raw_parts_mut(ptrs.1.add(b0), b1 - b0),
                std::slice::from_raw_parts_mut(ptrs.2.add(16 * b0), 16 * (b1 - b0)),
            )
        };
        let xs = &x[e0..e1];
        match isa {
            // SAFETY: Avx512 is only detected when the CPU has avx512f and avx512bw.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { quantize_blocks_avx512(xs, qs, d, bsums) },
            _ => quantize_blocks(xs, qs, d, bsums),
        }
    });
    q
}

/// Activation rows per quantization task.
const ROWS_PER_TASK: usize = 16;

/// The three output buffers, written at disjoint rows by the tasks of one region.
struct Ptrs(*mut i8, *mut f32, *mut i16);
// SAFETY: see `quantize_acts_k_with`.
unsafe impl Send for Ptrs {}
// SAFETY: as for `Send`.
unsafe impl Sync for Ptrs {}

/// Quantizes whole blocks: `xs` into `qs`, a scale per 256 values into `d`, the sums of
/// each 16 values into `bsums`.
fn quantize_blocks(xs: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    for (b, (xs, qs)) in xs
        .chunks_exact(QK_K)
        .zip(qs.chunks_exact_mut(QK_K))
        .enumerate()
    {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in xs {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            // qs and bsums stay zero.
            continue;
        }
        let iscale = -127.0 / max;
        for (o, v) in qs.iter_mut().zip(xs) {
            *o = (round_even_small(iscale * v) as i32).min(127) as i8;
        }
        for (s, g) in bsums[b * 16..(b + 1) * 16]
            .iter_mut()
            .zip(qs.chunks_exact(16))
        {
            *s = g.iter().map(|&v| v as i16).sum();
        }
        d[b] = 1.0 / iscale;
    }
}

/// [`quantize_blocks`] sixteen values at a time, with its bits: the first value of the
/// largest magnitude (a NaN never is: `max(|v|, m)` keeps `m` when `v` is NaN), the same
/// product and rounding per element, a NaN product (an infinite input) quantized to 0 as the
/// scalar cast does, and integer sums (wrapping, truncated to 16 bits as the scalar sums). A block whose scale overflows takes the scalar code.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
unsafe fn quantize_blocks_avx512(xs: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        use std::arch::x86_64::*;
        const LINES: usize = QK_K / 16;
        assert!(xs.len() == qs.len() && xs.len() == d.len() * QK_K && bsums.len() == d.len() * 16);
        for b in 0..d.len() {
            let p = xs.as_ptr().add(b * QK_K);
            let mut v = [_mm512_setzero_ps(); LINES];
            let mut m = _mm512_setzero_ps();
            for (i, v) in v.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(p.add(16 * i));
                m = _mm512_max_ps(_mm512_abs_ps(*v), m);
            }
            let amax = _mm512_reduce_max_ps(m);
            if amax == 0.0 {
                // qs and bsums stay zero.
                continue;
            }
            // The signed value: the first element whose magnitude is the largest.
            let at = v
                .iter()
                .enumerate()
                .find_map(|(i, v)| {
                    let hit =
                        _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(*v), _mm512_set1_ps(amax));
                    (hit != 0).then(|| 16 * i + hit.trailing_zeros() as usize)
                })
                .expect("the largest magnitude is one of the block's");
            let iscale = -127.0 / *p.add(at);
            if !iscale.is_finite() {
                // A largest magnitude under 127 / f32::MAX: the scalar code's casts of
                // infinities, block by block.
                let (e, g) = (b * QK_K..(b + 1) * QK_K, b * 16..(b + 1) * 16);
                quantize_blocks(&xs[e.clone()], &mut qs[e], &mut d[b..=b], &mut bsums[g]);
                continue;
            }
            let (scale, magic) = (_mm512_set1_ps(iscale), _mm512_set1_ps(MAGIC));
            let out = qs.as_mut_ptr().add(b * QK_K);
            for (i, v) in v.iter().enumerate() {
                let x = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(scale, *v), magic), magic);
                // Integers already: the conversion is exact. A NaN lane converts to i32::MIN,
                // whose low byte (the narrowing below) and low 16 bits (the sum's `as i16`)
                // are 0: the scalar cast's 0 in both.
                let q = _mm512_min_epi32(_mm512_cvtps_epi32(x), _mm512_set1_epi32(127));
                // Otherwise within -128..=127: the truncating narrowing is exact.
                _mm_storeu_si128(out.add(16 * i) as *mut __m128i, _mm512_cvtepi32_epi8(q));
                bsums[b * 16 + i] = _mm512_reduce_add_epi32(q) as i16;
            }
            d[b] = 1.0 / iscale;
        }
    }
}

/// The constant of [`round_even_small`].
const MAGIC: f32 = 12_582_912.0;

/// `x.round_ties_even()` for `|x| < 2^22` (here `|x| <= 127`): adding and taking back
/// `1.5 * 2^23` leaves no fraction bits, so the sum rounds to nearest even. Plain float
/// arithmetic that vectorizes, where `round_ties_even` is a `rintf` call per element on
/// the baseline x86-64 target (5% of a Gemma 3 prefill).
#[inline(always)]
fn round_even_small(x: f32) -> f32 {
    (x + MAGIC) - MAGIC
}

#[cfg(test)]
mod tests {
    use super::round_even_small;

    #[test]
    fn small_rounding_is_round_ties_even() {
        // Every quarter step (ties included) and values near them, both signs.
        for i in -600..=600 {
            let x = i as f32 * 0.25;
            for v in [x, x.next_up(), x.next_down(), -x] {
                let (got, want) = (round_even_small(v), v.round_ties_even());
                assert_eq!(got as i32, want as i32, "{v}");
            }
        }
    }
}
