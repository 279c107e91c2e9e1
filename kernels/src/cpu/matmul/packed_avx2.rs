//! Packed Q4_0/Q4_1/Q5_0/Q8_0 groups (`packed.rs`) against several tokens on AVX2: prefill's
//! kernel where the CPU has no AVX-512.
//!
//! The one-token kernel (`avx2.rs`, `packed_half`) keeps a half group's eight ggml lanes in
//! eight registers and unpacks every record again for every token: with sixteen registers
//! there is no room for a second token's lanes. Here the loop runs lane by lane instead: each
//! of ggml's eight lanes is its own chain of fused multiply-adds over the blocks, so one lane
//! of one record is unpacked once and multiplied with up to [`TILE`] tokens, whose
//! accumulators for that lane fill eight registers. The lane sums are kept and reduced at the
//! end in ggml's order (lanes `k` and `k + 4`, then the pairs), so every output has the bits of
//! the one-token kernel. Each token's block scale times the rows' scales is computed once per
//! token tile and group half, not once per lane. The signed types' quants are made signed
//! once per lane and record and take ggml's sign trick per token (the integer sums are exact
//! either way; an offset start per token and lane cost a load and an add more).

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::dest::Dest;
use super::packed::{PackedRows, GROUP, Q5_0_HIGH_LINE};
use super::QMatrix;
use crate::act::QuantizedActs;
use crate::quant::{WeightType, QK};

/// Most tokens per pass over a lane: eight accumulators.
const TILE: usize = 8;

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;
const Q5_0: u8 = 3;

thread_local! {
    /// A thread's scale products of a tile (`[TILE][nb][8]`), kept from job to job.
    static SCALES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Rows `r0..r0 + n` of `w` through its packing, whole groups only, for every token, into
/// `out` (row `r - r0`, token `t`); returns how many rows it did (none unless `w` has a packing
/// of one of these types and `r0` starts a group).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run_groups(
    w: &QMatrix<'_>,
    r0: usize,
    n: usize,
    a: &QuantizedActs,
    tokens: usize,
    mut out: Dest<'_>,
) -> usize {
    let Some(pk) = w.packed.filter(|p| {
        r0.is_multiple_of(GROUP)
            && matches!(
                p.ty(),
                WeightType::Q4_0 | WeightType::Q4_1 | WeightType::Q5_0 | WeightType::Q8_0
            )
    }) else {
        return 0;
    };
    assert!(pk.packs(w), "packing of another matrix");
    assert_eq!(a.qs.len(), tokens * w.cols, "activation shape");
    assert_eq!(a.d.len(), tokens * a.blocks());
    if pk.ty() == WeightType::Q4_1 {
        assert_eq!(a.s.len(), tokens * a.blocks());
    }
    let groups = n / GROUP;
    let nb = a.blocks();
    // Each group in turn against every tile of tokens, as `packed_k_avx2.rs` does: its records
    // stay in L1 while the tiles pass, and the activations come from L2. (Tiles outermost read
    // the whole matrix again for every tile, from L3 where it passes L2: a 2,048 x 640 product
    // over 256 tokens took 4-5% longer on a Zen 3.) A decode batch's few tiles leave a group
    // too soon for the hardware to fetch the next one, so each group asks for its successor's
    // lines ([`PackedRows::prefetch_group`]); prefill's many tiles per group leave time, and
    // the requests would only take slots.
    let stream = tokens <= 2 * TILE;
    SCALES.with_borrow_mut(|scales| {
        scales.resize(TILE * nb * 8, 0.0);
        for gi in 0..groups {
            let g = r0 / GROUP + gi;
            if stream && gi + 1 < groups {
                pk.prefetch_group(g + 1);
            }
            let mut t0 = 0;
            while t0 < tokens {
                let nt = match tokens - t0 {
                    r if r >= 8 => 8,
                    r if r >= 4 => 4,
                    r if r >= 2 => 2,
                    _ => 1,
                };
                for h in 0..2 {
                    let mut res = [[0f32; 8]; TILE];
                    // SAFETY: the caller vouches for the CPU; `pk` packs `w` (checked), so its
                    // groups `r0 / GROUP..` up to `n` rows exist, and the activations hold
                    // `tokens` rows (checked); the table holds `TILE * nb * 8` elements.
                    unsafe {
                        match pk.ty() {
                            WeightType::Q4_0 => tile::<Q4_0>(pk, g, h, a, t0, nt, scales, &mut res),
                            WeightType::Q4_1 => tile::<Q4_1>(pk, g, h, a, t0, nt, scales, &mut res),
                            WeightType::Q5_0 => tile::<Q5_0>(pk, g, h, a, t0, nt, scales, &mut res),
                            _ => tile::<Q8_0>(pk, g, h, a, t0, nt, scales, &mut res),
                        }
                    }
                    for (j, rows) in res.iter().take(nt).enumerate() {
                        out.put(gi * GROUP + 8 * h, t0 + j, rows);
                    }
                }
                t0 += nt;
            }
        }
    });
    groups * GROUP
}

/// Rows `8h..8h + 8` of group `g` against tokens `t0..t0 + nt` (`nt` of 8, 4, 2, 1) into
/// `res[j][r]`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile<const TY: u8>(
    pk: &PackedRows,
    g: usize,
    h: usize,
    a: &QuantizedActs,
    t0: usize,
    nt: usize,
    scales: &mut [f32],
    res: &mut [[f32; 8]; TILE],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        match nt {
            8 => tile_n::<TY, 8>(pk, g, h, a, t0, scales, res),
            4 => tile_n::<TY, 4>(pk, g, h, a, t0, scales, res),
            2 => tile_n::<TY, 2>(pk, g, h, a, t0, scales, res),
            _ => tile_n::<TY, 1>(pk, g, h, a, t0, scales, res),
        }
    }
}

/// [`tile`] for `NT` tokens.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_n<const TY: u8, const NT: usize>(
    pk: &PackedRows,
    g: usize,
    h: usize,
    a: &QuantizedActs,
    t0: usize,
    scales: &mut [f32],
    res: &mut [[f32; 8]; TILE],
) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let nb = a.blocks();
        assert!(scales.len() >= NT * nb * 8);
        // A group's records lie one after another.
        let per = 64 * pk.record_lines();
        let rec0 = pk.record(g, 0);
        // Each token's scale products `dw * dy` for the eight rows (the one-token kernel's one
        // multiply), and Q4_1's `sum(m * s)` in its order.
        let mut msum = [_mm256_setzero_ps(); NT];
        for b in 0..nb {
            let rec = rec0.add(b * per);
            let dw = _mm256_cvtph_ps(_mm_load_si128(rec.add(16 * h) as *const __m128i));
            let mw = if TY == Q4_1 {
                _mm256_cvtph_ps(_mm_load_si128(rec.add(32 + 16 * h) as *const __m128i))
            } else {
                _mm256_setzero_ps()
            };
            for j in 0..NT {
                let k = (t0 + j) * nb + b;
                let sc = _mm256_mul_ps(dw, _mm256_set1_ps(*a.d.get_unchecked(k)));
                _mm256_storeu_ps(scales.as_mut_ptr().add((j * nb + b) * 8), sc);
                if TY == Q4_1 {
                    let s = *a.s.get_unchecked(k);
                    msum[j] = _mm256_add_ps(msum[j], _mm256_mul_ps(mw, _mm256_set1_ps(s)));
                }
            }
        }
        let qy: [*const u8; NT] =
            std::array::from_fn(|j| a.qs.as_ptr().add((t0 + j) * a.cols) as *const u8);
        let lp = LanePass {
            rec0,
            per,
            h,
            nb,
            qy,
            scales,
        };
        // Eight accumulators a pass: lanes 8 / NT at a time, so a pass reads that many
        // consecutive lines of each record (a decode batch's records come from memory).
        let mut lanes = [[_mm256_setzero_ps(); NT]; 8];
        match NT {
            1 => lanes.copy_from_slice(&lp.run::<TY, 0, 8>()),
            2 => {
                lanes[..4].copy_from_slice(&lp.run::<TY, 0, 4>());
                lanes[4..].copy_from_slice(&lp.run::<TY, 4, 4>());
            }
            4 => {
                for (k0, l) in lanes.chunks_exact_mut(2).enumerate() {
                    l.copy_from_slice(&match k0 {
                        0 => lp.run::<TY, 0, 2>(),
                        1 => lp.run::<TY, 2, 2>(),
                        2 => lp.run::<TY, 4, 2>(),
                        _ => lp.run::<TY, 6, 2>(),
                    });
                }
            }
            _ => {
                lanes[0] = lp.run::<TY, 0, 1>()[0];
                lanes[1] = lp.run::<TY, 1, 1>()[0];
                lanes[2] = lp.run::<TY, 2, 1>()[0];
                lanes[3] = lp.run::<TY, 3, 1>()[0];
                lanes[4] = lp.run::<TY, 4, 1>()[0];
                lanes[5] = lp.run::<TY, 5, 1>()[0];
                lanes[6] = lp.run::<TY, 6, 1>()[0];
                lanes[7] = lp.run::<TY, 7, 1>()[0];
            }
        }
        // ggml's horizontal sum for eight rows at once, as the one-token kernel.
        for j in 0..NT {
            let l = |k: usize| lanes[k][j];
            let s0 = _mm256_add_ps(l(0), l(4));
            let s1 = _mm256_add_ps(l(1), l(5));
            let s2 = _mm256_add_ps(l(2), l(6));
            let s3 = _mm256_add_ps(l(3), l(7));
            let mut r = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
            if TY == Q4_1 {
                r = _mm256_add_ps(r, msum[j]);
            }
            _mm256_storeu_ps(res[j].as_mut_ptr(), r);
        }
    }
}

/// One lane's pass over a group half's records: the tables of [`tile_n`] and where to read.
struct LanePass<'a, const NT: usize> {
    rec0: *const u8,
    /// Bytes per record.
    per: usize,
    h: usize,
    nb: usize,
    qy: [*const u8; NT],
    scales: &'a [f32],
}

impl<const NT: usize> LanePass<'_, NT> {
    /// Lanes `K0..K0 + NL`'s accumulators of the eight rows for each token: each lane's chain
    /// of fused multiply-adds over the blocks, as in the one-token kernel (the lanes are
    /// separate chains; a pass takes several for fewer passes over the records).
    #[allow(clippy::needless_range_loop)] // `j` picks a token's pointer, scales and accumulator.
    #[inline(always)]
    unsafe fn run<const TY: u8, const K0: usize, const NL: usize>(&self) -> [[__m256; NT]; NL] {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let nb = self.nb;
            let mut acc = [[_mm256_setzero_ps(); NT]; NL];
            for b in 0..nb {
                for (kk, acc) in acc.iter_mut().enumerate() {
                    self.lane_block::<TY>(K0 + kk, b, acc);
                }
            }
            acc
        }
    }

    /// Block `b` of lane `k` for every token, into `acc`.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    unsafe fn lane_block<const TY: u8>(&self, k: usize, b: usize, acc: &mut [__m256; NT]) {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let nb = self.nb;
            let low = _mm256_set1_epi8(0x0F);
            let ones16 = _mm256_set1_epi16(1);
            let flip = _mm256_set1_epi8(0x80u8 as i8);
            let q = self.rec0.add(b * self.per + 64 + 32 * self.h);
            // Lane k's quants of the eight rows, signed (Q8_0: line k; Q4_x and Q5_0: the
            // low nibbles of line k, or the high ones of line k - 4, Q5_0 with its high
            // bits, less the offset; Q4_1's stay unsigned, its minimum is added apart).
            let wk = if TY == Q8_0 {
                _mm256_xor_si256(_mm256_load_si256(q.add(64 * k) as *const __m256i), flip)
            } else {
                let v = _mm256_load_si256(q.add(64 * (k % 4)) as *const __m256i);
                let nib = if k < 4 {
                    _mm256_and_si256(v, low)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), low)
                };
                match TY {
                    Q5_0 => {
                        let qh =
                            _mm256_load_si256(q.add(64 * (Q5_0_HIGH_LINE - 1)) as *const __m256i);
                        let u = _mm256_or_si256(nib, high_bit(qh, 2 * (k % 4) + k / 4));
                        _mm256_sub_epi8(u, _mm256_set1_epi8(16))
                    }
                    Q4_0 => _mm256_sub_epi8(nib, _mm256_set1_epi8(8)),
                    _ => nib,
                }
            };
            // ggml's sign trick for the signed types: |w| times y with w's sign, the same
            // sums (activations never reach -128).
            let signed = TY != Q4_1;
            let aw = if signed { _mm256_sign_epi8(wk, wk) } else { wk };
            for j in 0..NT {
                let y4 = _mm256_set1_epi32(
                    (self.qy[j].add(b * QK + 4 * k) as *const i32).read_unaligned(),
                );
                let y = if signed { _mm256_sign_epi8(y4, wk) } else { y4 };
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, y), ones16);
                let sc = _mm256_loadu_ps(self.scales.as_ptr().add((j * nb + b) * 8));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[j]);
            }
        }
    }
}

/// Bit `s` of every byte of a Q5_0 high-bit line (`packed::q5_0_high_bits`) moved to bit 4,
/// the rest cleared (as the 512-bit kernel's `high_bit`); the one-token kernel's too.
#[inline(always)]
pub(super) unsafe fn high_bit(qh: __m256i, s: usize) -> __m256i {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        let v = match s {
            0 => _mm256_slli_epi16::<4>(qh),
            1 => _mm256_slli_epi16::<3>(qh),
            2 => _mm256_slli_epi16::<2>(qh),
            3 => _mm256_slli_epi16::<1>(qh),
            4 => qh,
            5 => _mm256_srli_epi16::<1>(qh),
            6 => _mm256_srli_epi16::<2>(qh),
            _ => _mm256_srli_epi16::<3>(qh),
        };
        _mm256_and_si256(v, _mm256_set1_epi8(0x10))
    }
}
