//! Activation quantization for the integer dot products: each 32-element block of an f32
//! activation row becomes 32 i8 values with one scale `d` (rounded through f16, as ggml does)
//! and, for Q4_1 weights, `s = d * sum(q)` so the weight minimum can be applied per block.

use crate::isa::Isa;
use crate::parallel::Parallel;
use crate::quant::{round_f16, QK};

/// A batch of activation rows quantized per 32-element block.
#[derive(Clone, Debug, Default)]
pub struct QuantizedActs {
    /// Elements per row.
    pub cols: usize,
    /// Number of rows (tokens).
    pub rows: usize,
    /// `rows * cols` quantized values, row-major.
    pub qs: Vec<i8>,
    /// `rows * cols / 32` block scales.
    pub d: Vec<f32>,
    /// `rows * cols / 32` block sums times scale (Q8_1's `s`).
    pub s: Vec<f32>,
    /// For each offset-stored weight type asked for ([`QuantizedActs::add_lane_starts`]: Q4_0,
    /// Q5_0, Q8_0, stored as `q + offset`), `rows * cols / 4` starting values of ggml's lanes:
    /// `-offset * sum` of each four consecutive quants. The 512-bit kernels start a lane's
    /// integer dot product there instead of summing the activations again for every group of
    /// sixteen weight rows (or shifting one sum per type there: a port-0 instruction per lane).
    pub lane_starts: Vec<(i32, Vec<i32>)>,
}

impl QuantizedActs {
    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.cols / QK
    }

    /// Adds the lanes' starting values for weights stored with `offset` (once per offset).
    pub fn add_lane_starts(&mut self, offset: i32) {
        if self.lane_starts(offset).is_none() {
            let starts = self
                .qs
                .chunks_exact(LANE)
                .map(|four| -offset * four.iter().map(|&v| i32::from(v)).sum::<i32>())
                .collect();
            self.lane_starts.push((offset, starts));
        }
    }

    /// The lanes' starting values for weights stored with `offset`, when added.
    pub fn lane_starts(&self, offset: i32) -> Option<&[i32]> {
        self.lane_starts
            .iter()
            .find(|(o, _)| *o == offset)
            .map(|(_, starts)| starts.as_slice())
    }
}

/// Quantizes `rows` rows of `cols` elements (`cols % 32 == 0`) with the best ISA.
pub fn quantize_acts(x: &[f32], rows: usize, cols: usize) -> QuantizedActs {
    quantize_acts_with(Isa::detect(), x, rows, cols, &Parallel::single())
}

/// [`quantize_acts`] with an explicit instruction set, split over `par`'s threads when there
/// are enough rows (prefill). Every ISA gives the same bits.
pub fn quantize_acts_with(
    isa: Isa,
    x: &[f32],
    rows: usize,
    cols: usize,
    par: &Parallel,
) -> QuantizedActs {
    assert_eq!(cols % QK, 0, "activation width must be a multiple of 32");
    assert_eq!(x.len(), rows * cols, "activation length");
    let nb = rows * cols / QK;
    let mut q = QuantizedActs {
        cols,
        rows,
        qs: vec![0; rows * cols],
        d: vec![0.0; nb],
        s: vec![0.0; nb],
        lane_starts: Vec::new(),
    };
    let bpr = cols / QK;
    let ptrs = Ptrs(q.qs.as_mut_ptr(), q.d.as_mut_ptr(), q.s.as_mut_ptr());
    par.for_each_index(rows.div_ceil(ROWS_PER_TASK), |c| {
        let ptrs = &ptrs;
        let (r0, r1) = (c * ROWS_PER_TASK, ((c + 1) * ROWS_PER_TASK).min(rows));
        let (e0, e1, b0, b1) = (r0 * cols, r1 * cols, r0 * bpr, r1 * bpr);
        // SAFETY: task `c` alone writes rows r0..r1 of the three buffers, which outlive
        // the region.
        let (qs, d, s) = unsafe {
            (
                std::slice::from_raw_parts_mut(ptrs.0.add(e0), e1 - e0),
                std::slice::from_raw_parts_mut(ptrs.1.add(b0), b1 - b0),
                std::slice::from_raw_parts_mut(ptrs.2.add(b0), b1 - b0),
            )
        };
        let xs = &x[e0..e1];
        match isa {
            Isa::Portable => quantize_blocks(xs, qs, d, s),
            // SAFETY: Avx2 is only detected when the CPU has avx2.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { quantize_blocks_avx2(xs, qs, d, s) },
            // SAFETY: Avx512 is only detected when the CPU has avx512f and avx512bw.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { quantize_blocks_avx512(xs, qs, d, s) },
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => quantize_blocks(xs, qs, d, s),
        }
    });
    q
}

/// Quants per ggml lane (`lane_starts`).
const LANE: usize = 4;

/// Rows per parallel task (one decode row runs inline).
const ROWS_PER_TASK: usize = 16;

/// The three output buffers, written at disjoint rows by the tasks of one region.
struct Ptrs(*mut i8, *mut f32, *mut f32);
// SAFETY: see `quantize_acts_with`.
unsafe impl Sync for Ptrs {}

/// [`quantize_blocks`] eight lanes at a time (same bits: the maximum is exact in any order,
/// the product and the rounding are the same per element, the sum is an integer).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_blocks_avx2(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        use std::arch::x86_64::*;
        assert!(x.len() == qs.len() && x.len() == d.len() * QK && d.len() == s.len());
        let sign = _mm256_set1_ps(-0.0);
        let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for b in 0..d.len() {
            let p = x.as_ptr().add(b * QK);
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let m = _mm256_max_ps(
                _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
            );
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
            let dv = amax / 127.0;
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let i = [
                round8(v[0], id),
                round8(v[1], id),
                round8(v[2], id),
                round8(v[3], id),
            ];
            let sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
            let s4 = _mm_add_epi32(
                _mm256_castsi256_si128(sum),
                _mm256_extracti128_si256::<1>(sum),
            );
            let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            let total = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)));
            // Values are within -127..=127: the saturating packs are exact.
            let packed = _mm256_packs_epi16(
                _mm256_packs_epi32(i[0], i[1]),
                _mm256_packs_epi32(i[2], i[3]),
            );
            let packed = _mm256_permutevar8x32_epi32(packed, perm);
            _mm256_storeu_si256(qs.as_mut_ptr().add(b * QK) as *mut __m256i, packed);
            d[b] = round_f16(dv);
            s[b] = round_f16(dv * total as f32);
        }
    }
}

/// [`quantize_blocks`] sixteen lanes at a time, a block in two registers (same bits, for the
/// reasons [`quantize_blocks_avx2`] gives).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
unsafe fn quantize_blocks_avx512(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        use std::arch::x86_64::*;
        assert!(x.len() == qs.len() && x.len() == d.len() * QK && d.len() == s.len());
        for b in 0..d.len() {
            let p = x.as_ptr().add(b * QK);
            let (v0, v1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            let dv = amax / 127.0;
            let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            // Conversion in the default rounding mode: to nearest, ties to even.
            let (i0, i1) = (
                _mm512_cvtps_epi32(_mm512_mul_ps(v0, id)),
                _mm512_cvtps_epi32(_mm512_mul_ps(v1, id)),
            );
            let total = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
            // Values are within -127..=127: the truncating narrowings are exact.
            let out = qs.as_mut_ptr().add(b * QK);
            _mm_storeu_si128(out as *mut __m128i, _mm512_cvtepi32_epi8(i0));
            _mm_storeu_si128(out.add(16) as *mut __m128i, _mm512_cvtepi32_epi8(i1));
            d[b] = round_f16(dv);
            s[b] = round_f16(dv * total as f32);
        }
    }
}

/// `round_ties_even(x * id)` as i32 lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn round8(
    x: std::arch::x86_64::__m256,
    id: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256i {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        use std::arch::x86_64::*;
        _mm256_cvtps_epi32(_mm256_round_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(_mm256_mul_ps(x, id)))
    }
}

/// ggml's `quantize_row_q8_1` (x86): `d = amax / 127`, `q = round_even(x * (127 / amax))`.
fn quantize_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (b, (xs, qs)) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let dq = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (o, v) in qs.iter_mut().zip(xs) {
            let r = (v * id).round_ties_even() as i32;
            sum += r;
            *o = r as i8;
        }
        d[b] = round_f16(dq);
        s[b] = round_f16(dq * sum as f32);
    }
}
