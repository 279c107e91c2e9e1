//! Prefill attention on x86 (AVX2 + FMA, or AVX-512 with each 16-lane chain in one
//! register), tiled over query rows and keys: the same sums as the reference task in
//! `attention` (llama.cpp's non-flash path, tinyBLAS order), computed so that each K or V row
//! is loaded once for four query rows and the accumulators stay in registers, instead of a
//! reload and store of every accumulator per key and query.
//!
//! One task is a kv head and a block of query tokens; its rows are (token, query head of the
//! group) pairs. Three passes, each over the task's keys:
//!
//! 1. scores: 4 rows x 2 keys per micro-tile (one 8-lane half of the chains at a time on AVX2),
//!    each score tinyBLAS's 16-lane fused multiply-add chain over the head dimension (two
//!    8-lane registers, or one 16-lane), four chains reduced together by a transposing tree
//!    that adds exactly the pairs `_mm512_reduce_add_ps` adds (`expf::reduce16`);
//! 2. softmax per row (`softmax_padded`), probabilities rounded to f16, zero past the row's
//!    last key;
//! 3. weighted sum of V: accumulator lane `j % 16` of a row takes key `j`, keys ascending,
//!    four rows sharing each V load, 16 keys of a lane between a load and a store of its
//!    accumulators; the 16 lanes are reduced at the end
//!    (`weighted_finish`). A key past a row's causal limit has probability +0 and adds
//!    nothing (an accumulator that starts at +0 never becomes -0), so rows of different
//!    tokens can share a key range, as they do in llama.cpp's masked, padded cache.
//!
//! Every score and output element is the reference's sum in the reference's order: the bits
//! are `Isa::Portable`'s (tested in `kernels/tests/attention.rs`).

use half::f16;
use std::arch::x86_64::*;

use crate::activation::softmax_padded;
use crate::attention::{round_f16, AttnGeometry};
use crate::attention_sums::{weighted_finish, Order};
use crate::isa::Isa;

/// Query rows per score micro-tile and weighted-sum tile: four rows share each K load (eight
/// score chains) and each V load (with two rows the loads were both passes' bound). With 16
/// AVX2 registers a tile takes one 8-lane half of its chains at a time (the halves are
/// separate chains).
const RB: usize = 4;
/// Bytes of K per score tile: 64 rows of a 64-wide head, 16 rows of a 256-wide one, 16 KiB
/// of f32 that stay in L1 while every row block of the task passes over them.
const KEY_TILE_BYTES: usize = 16 << 10;
/// Keys per V tile: 16 per accumulator lane between a load and a store of the lane.
const V_TILE: usize = 256;

/// One task: kv head `g`, query tokens `i0..i1`.
pub(crate) struct TiledTask<'a> {
    pub geo: &'a AttnGeometry,
    /// All queries of the call, `n * heads * head_dim`.
    pub q: &'a [f32],
    pub first_pos: usize,
    /// The first key of `k` and `v` (a multiple of 16; no query of the call sees an earlier
    /// one).
    pub kbase: usize,
    /// This kv head's keys from `kbase` as f32 rows of `head_dim`, at least
    /// `(first_pos + i1).next_multiple_of(16) - kbase` rows (zero padded).
    pub k: &'a [f32],
    /// Its values for the same keys (as many, zero padded) in blocks of 16 columns,
    /// `[head_dim / 16][key][16]`: the weighted sum reads a block of consecutive keys.
    pub v: &'a [f32],
    pub g: usize,
    pub i0: usize,
    pub i1: usize,
    /// `Avx2` or `Avx512` (both run this code; it picks the softmax).
    pub isa: Isa,
}

/// Whether the tiled kernel handles this head size (whole 16-lane accumulators).
pub(crate) fn supports(geo: &AttnGeometry) -> bool {
    geo.head_dim.is_multiple_of(16)
}

impl TiledTask<'_> {
    /// The number of keys row `r` of this task sees (its token's causal limit).
    fn limit(&self, r: usize) -> usize {
        let group = self.geo.heads / self.geo.kv_heads;
        self.first_pos + self.i0 + r / group + 1
    }

    /// The first key row `r` visits: rows see a sliding window's keys only, and a row's
    /// earlier keys are skipped in whole 16-key lanes (`AttnGeometry::first_visited`).
    fn first(&self, r: usize) -> usize {
        self.geo.first_visited(self.limit(r), 16)
    }

    /// Returns `(i1 - i0) * group * head_dim` outputs, laid out as the reference task's, with
    /// the widest registers the task's instruction set has.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and for `Isa::Avx512` AVX-512 F.
    pub(crate) unsafe fn run(&self) -> Vec<f32> {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            match self.isa {
                Isa::Avx512 => self.run_avx512(),
                _ => self.run_avx2(),
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run_avx2(&self) -> Vec<f32> {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe { self.body::<false>() }
    }

    /// One 16-lane accumulator per register: the same sums as the AVX2 pairs, half the
    /// instructions.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn run_avx512(&self) -> Vec<f32> {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe { self.body::<true>() }
    }

    #[inline(always)]
    unsafe fn body<const W512: bool>(&self) -> Vec<f32> {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let geo = self.geo;
            let hd = geo.head_dim;
            assert!(supports(geo));
            let group = geo.heads / geo.kv_heads;
            let qw = geo.heads * hd;
            let rows = (self.i1 - self.i0) * group;
            let rows_pad = rows.next_multiple_of(RB);
            // Keys are counted from `base` below (scores, K and V rows, lanes): a multiple of 16,
            // so each key keeps its lane.
            let base = self.first(0);
            assert!(base >= self.kbase && base.is_multiple_of(16) && self.kbase.is_multiple_of(16));
            let kr = &self.k[(base - self.kbase) * hd..];
            // Keys per V column block, and this task's first key in a block.
            let vkeys = self.v.len() / hd;
            let voff = base - self.kbase;
            let lim = |r: usize| self.limit(r) - base;
            let first = |r: usize| self.first(r) - base;
            let kmax = lim(rows - 1);
            let keys16 = kmax.next_multiple_of(16);
            assert!(kr.len() >= keys16 * hd && vkeys >= voff + keys16);
            // Score rows one 64-byte line longer than their keys: rows a multiple of 4 KiB
            // apart would put a tile's four rows in the same L1 sets as each other.
            let stride = keys16 + 16;
            assert_eq!(self.v.len(), vkeys * hd);

            // Query rows, rounded to f16 as llama.cpp's f16 cache has them; padding rows are zero.
            let mut qh = vec![0f32; rows_pad * hd];
            for t in 0..self.i1 - self.i0 {
                let src = &self.q[(self.i0 + t) * qw + self.g * group * hd..][..group * hd];
                qh[t * group * hd..(t + 1) * group * hd].copy_from_slice(src);
            }
            let mut half = vec![f16::ZERO; stride.max(rows * hd)];
            round_f16(&mut qh[..rows * hd], &mut half);

            let scale = geo.scale();
            let mut s = vec![0f32; rows_pad * stride];
            let key_tile = (KEY_TILE_BYTES / (4 * hd)).next_multiple_of(2).max(2);
            for kt in (0..kmax).step_by(key_tile) {
                for rb in (0..rows_pad).step_by(RB) {
                    let lim = lim((rb + RB - 1).min(rows - 1));
                    let end = (kt + key_tile).min(lim.next_multiple_of(2));
                    for j in (kt.max(first(rb))..end).step_by(2) {
                        let at = rb * stride + j;
                        let (q4, k2) = (&qh[rb * hd..(rb + RB) * hd], &kr[j * hd..]);
                        let sc = if W512 {
                            scores_4x2_512(q4, k2, hd)
                        } else {
                            scores_4x2(q4, k2, hd)
                        };
                        for (r, pair) in sc.chunks_exact(2).enumerate() {
                            s[at + r * stride] = pair[0] * scale;
                            s[at + r * stride + 1] = pair[1] * scale;
                        }
                    }
                }
            }
            for r in 0..rows {
                let (f, lim) = (first(r), lim(r));
                let row = &mut s[r * stride..(r + 1) * stride];
                let (p, rest) = row.split_at_mut(lim);
                let (before, p) = p.split_at_mut(f);
                geo.mask_window_from(base + f, p);
                softmax_padded(self.isa, p);
                round_f16(p, &mut half);
                // Keys this row does not visit weigh zero in the tiles it shares with other rows.
                before.fill(0.0);
                rest.fill(0.0);
            }

            // The weighted sum's accumulators by 16-column block, `[hd / 16][row][lane][16]`: a
            // pass's lines are contiguous (in `[row][lane][hd]` a 256-wide head's lines for one
            // column block would all fall in four L1 sets).
            let mut acc = vec![0f32; rows_pad * 16 * hd];
            // Columns per pass: 16 on AVX2 (8 accumulators, 2 V registers, a broadcast), up to
            // 64 with 512-bit registers (8 accumulators, 4 V registers).
            let cols = if !W512 {
                16
            } else if hd.is_multiple_of(64) {
                64
            } else if hd.is_multiple_of(32) {
                32
            } else {
                16
            };
            for vt in (0..kmax).step_by(V_TILE) {
                // Every row block passes over a tile's column blocks (16 KiB of V per 16
                // columns) while they are in L1.
                for c0 in (0..hd).step_by(cols) {
                    for rb in (0..rows_pad).step_by(RB) {
                        let lim = lim((rb + RB - 1).min(rows - 1));
                        let end = (vt + V_TILE).min(lim.next_multiple_of(16));
                        // A multiple of 16 at or after `vt`: every key keeps its accumulator lane.
                        let start = vt.max(first(rb));
                        if start >= end {
                            continue;
                        }
                        let pv = PvTile {
                            s: &s,
                            stride,
                            rows_pad,
                            v: self.v,
                            vkeys,
                            voff,
                            hd,
                            rb,
                            vt: start,
                            end,
                        };
                        match (W512, cols) {
                            (true, 64) => pv.run512::<4>(c0, &mut acc),
                            (true, 32) => pv.run512::<2>(c0, &mut acc),
                            (true, _) => pv.run512::<1>(c0, &mut acc),
                            (false, _) => pv.run::<2>(c0, &mut acc),
                        }
                    }
                }
            }
            let mut out = vec![0f32; rows * hd];
            let mut lanes = vec![0f32; 16 * hd];
            for (r, o) in out.chunks_exact_mut(hd).enumerate() {
                // Row r's accumulators as `weighted_finish` takes them, `[lane][hd]`.
                for (lane, l) in lanes.chunks_exact_mut(hd).enumerate() {
                    for (b, cols) in l.chunks_exact_mut(16).enumerate() {
                        let at = acc_at(rows_pad, b, r, lane);
                        cols.copy_from_slice(&acc[at..at + 16]);
                    }
                }
                weighted_finish(Order::Gemm, hd, &mut lanes, o);
            }
            out
        }
    }
}

/// Scores (unscaled) of query rows 0..4 of `q` against keys 0 and 1 of `k` (rows of `hd`), as
/// `[r0k0, r0k1, r1k0, r1k1, r2k0, r2k1, r3k0, r3k1]`. Each score is a 16-lane chain held as
/// two 8-lane halves; the halves are independent chains, so the 16 registers take one half of
/// all eight scores at a time (8 accumulators, 2 K rows, a query row).
#[inline(always)]
unsafe fn scores_4x2(q: &[f32], k: &[f32], hd: usize) -> [f32; 8] {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        assert!(q.len() >= RB * hd && k.len() >= 2 * hd);
        let (qp, kp) = (q.as_ptr(), k.as_ptr());
        // halves[s][h] is lanes 8h..8h + 8 of score s = 2 * row + key.
        let mut halves = [[_mm256_setzero_ps(); 2]; 8];
        for h in 0..2 {
            let mut acc = [_mm256_setzero_ps(); 8];
            for c in (8 * h..hd).step_by(16) {
                let k0 = _mm256_loadu_ps(kp.add(c));
                let k1 = _mm256_loadu_ps(kp.add(hd + c));
                for r in 0..RB {
                    let q = _mm256_loadu_ps(qp.add(r * hd + c));
                    acc[2 * r] = _mm256_fmadd_ps(k0, q, acc[2 * r]);
                    acc[2 * r + 1] = _mm256_fmadd_ps(k1, q, acc[2 * r + 1]);
                }
            }
            for (s, a) in halves.iter_mut().zip(acc) {
                s[h] = a;
            }
        }
        let mut out = [0f32; 8];
        for (quad, o) in halves.chunks_exact(4).zip(out.chunks_exact_mut(4)) {
            let f = reduce16x4(quad.try_into().expect("four scores"));
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), f);
            // Lane 4h + m holds input 2m + h.
            o.copy_from_slice(&[lanes[0], lanes[4], lanes[1], lanes[5]]);
        }
        out
    }
}

/// [`scores_4x2`] with each 16-lane chain in one 512-bit register; the halves then go through
/// the same reduction, so the bits are the same.
#[inline(always)]
unsafe fn scores_4x2_512(q: &[f32], k: &[f32], hd: usize) -> [f32; 8] {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        assert!(q.len() >= 4 * hd && k.len() >= 2 * hd);
        let (qp, kp) = (q.as_ptr(), k.as_ptr());
        // acc[s] is score s = 2 * row + key.
        let mut acc = [_mm512_setzero_ps(); 8];
        for c in (0..hd).step_by(16) {
            let k0 = _mm512_loadu_ps(kp.add(c));
            let k1 = _mm512_loadu_ps(kp.add(hd + c));
            for r in 0..4 {
                let q = _mm512_loadu_ps(qp.add(r * hd + c));
                acc[2 * r] = _mm512_fmadd_ps(k0, q, acc[2 * r]);
                acc[2 * r + 1] = _mm512_fmadd_ps(k1, q, acc[2 * r + 1]);
            }
        }
        let mut out = [0f32; 8];
        for (quad, o) in acc.chunks_exact(4).zip(out.chunks_exact_mut(4)) {
            // (No closure: it would not inherit the target features.)
            let mut halves = [[_mm256_setzero_ps(); 2]; 4];
            for (h, a) in halves.iter_mut().zip(quad) {
                h[0] = _mm512_castps512_ps256(*a);
                h[1] = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a)));
            }
            let f = reduce16x4(&halves);
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), f);
            o.copy_from_slice(&[lanes[0], lanes[4], lanes[1], lanes[5]]);
        }
        out
    }
}

/// Four `reduce16`s at once (each input a 16-lane accumulator as two 8-lane halves), with
/// the same additions for every input: halves, then quarters, then pairs. Lane `4h + m` of the
/// result is the sum of input `2m + h` (lanes 2, 3, 6, 7 repeat 0, 1, 4, 5).
#[inline(always)]
pub(crate) unsafe fn reduce16x4(v: &[[__m256; 2]; 4]) -> __m256 {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        // Halves: `a[i] + a[i + 8]`. (No closures: they would not inherit the target features.)
        let mut t3 = [_mm256_setzero_ps(); 4];
        for (t, vs) in t3.iter_mut().zip(v) {
            *t = _mm256_add_ps(vs[0], vs[1]);
        }
        // Quarters: z0 = [inputs 0 | 1], z1 = [inputs 2 | 3], four partial sums each.
        let z0 = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(t3[0], t3[1]),
            _mm256_permute2f128_ps::<0x31>(t3[0], t3[1]),
        );
        let z1 = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(t3[2], t3[3]),
            _mm256_permute2f128_ps::<0x31>(t3[2], t3[3]),
        );
        // Pairs (0 + 2, 1 + 3): half h holds inputs h and 2 + h.
        let x = _mm256_add_ps(
            _mm256_shuffle_ps::<0x44>(z0, z1),
            _mm256_shuffle_ps::<0xEE>(z0, z1),
        );
        // The last addition.
        _mm256_add_ps(
            _mm256_shuffle_ps::<0x88>(x, x),
            _mm256_shuffle_ps::<0xDD>(x, x),
        )
    }
}

/// Where the accumulator of column block `b`, row `row` and lane `lane` starts (16 columns),
/// with `rows_pad` rows.
#[inline(always)]
fn acc_at(rows_pad: usize, b: usize, row: usize, lane: usize) -> usize {
    ((b * rows_pad + row) * 16 + lane) * 16
}

/// The weighted sum of V rows `vt..end` for the four rows from `rb`, accumulated in
/// `acc[row][key % 16][hd]`.
struct PvTile<'a> {
    s: &'a [f32],
    stride: usize,
    /// Rows of the task's accumulators ([`acc_at`]).
    rows_pad: usize,
    /// V in 16-column blocks of `vkeys` keys each ([`TiledTask::v`]); key `j` of the tile is
    /// key `voff + j` of a block.
    v: &'a [f32],
    vkeys: usize,
    voff: usize,
    hd: usize,
    rb: usize,
    vt: usize,
    end: usize,
}

impl PvTile<'_> {
    /// Where column block `b` of tile key `j` starts in `v`.
    #[inline(always)]
    fn at_v(&self, b: usize, j: usize) -> usize {
        (b * self.vkeys + self.voff + j) * 16
    }

    /// [`PvTile::run`] for columns `c0..c0 + 16 * NZ` in 512-bit registers: every
    /// output element takes the same fused multiply-adds in the same order.
    #[inline(always)]
    unsafe fn run512<const NZ: usize>(&self, c0: usize, acc: &mut [f32]) {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let hd = self.hd;
            assert!(acc.len() == self.rows_pad * 16 * hd && self.rb + RB <= self.rows_pad);
            assert!(
                self.voff + self.end <= self.vkeys && c0 + 16 * NZ <= hd && c0.is_multiple_of(16)
            );
            assert!(self.s.len() >= (self.rb + RB - 1) * self.stride + self.end);
            let (ap, vp, sp) = (acc.as_mut_ptr(), self.v.as_ptr(), self.s.as_ptr());
            for lane in 0..16 {
                let at = |r: usize, c: usize| acc_at(self.rows_pad, c0 / 16 + c, self.rb + r, lane);
                let mut a = [[_mm512_setzero_ps(); NZ]; RB];
                for (r, ar) in a.iter_mut().enumerate() {
                    for (c, x) in ar.iter_mut().enumerate() {
                        *x = _mm512_loadu_ps(ap.add(at(r, c)));
                    }
                }
                let mut j = self.vt + lane;
                while j < self.end {
                    let mut vv = [_mm512_setzero_ps(); NZ];
                    for (c, x) in vv.iter_mut().enumerate() {
                        *x = _mm512_loadu_ps(vp.add(self.at_v(c0 / 16 + c, j)));
                    }
                    for (r, ar) in a.iter_mut().enumerate() {
                        let p = _mm512_set1_ps(*sp.add((self.rb + r) * self.stride + j));
                        for (x, vc) in ar.iter_mut().zip(&vv) {
                            *x = _mm512_fmadd_ps(*vc, p, *x);
                        }
                    }
                    j += 16;
                }
                for (r, ar) in a.iter().enumerate() {
                    for (c, x) in ar.iter().enumerate() {
                        _mm512_storeu_ps(ap.add(at(r, c)), *x);
                    }
                }
            }
        }
    }

    /// Columns `c0..c0 + 8 * NC`.
    #[inline(always)]
    unsafe fn run<const NC: usize>(&self, c0: usize, acc: &mut [f32]) {
        // SAFETY: the caller upholds this function's contract (its `# Safety`).
        unsafe {
            let hd = self.hd;
            assert!(acc.len() == self.rows_pad * 16 * hd && self.rb + RB <= self.rows_pad);
            assert!(
                self.voff + self.end <= self.vkeys && c0 + 8 * NC <= hd && c0.is_multiple_of(16)
            );
            assert!(self.s.len() >= (self.rb + RB - 1) * self.stride + self.end);
            let (ap, vp, sp) = (acc.as_mut_ptr(), self.v.as_ptr(), self.s.as_ptr());
            for lane in 0..16 {
                let at = |r: usize, c: usize| {
                    acc_at(self.rows_pad, c0 / 16 + c / 2, self.rb + r, lane) + 8 * (c % 2)
                };
                let mut a = [[_mm256_setzero_ps(); NC]; RB];
                for (r, ar) in a.iter_mut().enumerate() {
                    for (c, x) in ar.iter_mut().enumerate() {
                        *x = _mm256_loadu_ps(ap.add(at(r, c)));
                    }
                }
                let mut j = self.vt + lane;
                while j < self.end {
                    let mut vv = [_mm256_setzero_ps(); NC];
                    for (c, x) in vv.iter_mut().enumerate() {
                        *x = _mm256_loadu_ps(vp.add(self.at_v(c0 / 16 + c / 2, j) + 8 * (c % 2)));
                    }
                    for (r, ar) in a.iter_mut().enumerate() {
                        let p = _mm256_broadcast_ss(&*sp.add((self.rb + r) * self.stride + j));
                        for (x, vc) in ar.iter_mut().zip(&vv) {
                            *x = _mm256_fmadd_ps(*vc, p, *x);
                        }
                    }
                    j += 16;
                }
                for (r, ar) in a.iter().enumerate() {
                    for (c, x) in ar.iter().enumerate() {
                        _mm256_storeu_ps(ap.add(at(r, c)), *x);
                    }
                }
            }
        }
    }
}
