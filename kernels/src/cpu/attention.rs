//! Causal grouped-query attention over paged f16 K/V.
//!
//! The caller passes, in order, the K and V blocks of every page of one sequence for one layer
//! (in Pagewarden these come from `ReadablePages::layer_block`, which checks the page
//! generation; this kernel never sees a page it was not handed). Query token `i` sits at
//! position `first_pos + i` and attends to keys `0..=first_pos + i`, or with a sliding window
//! `w` to the last `w` of them (the others are masked to `-inf` before the softmax, as
//! llama.cpp masks them, so they weigh exactly zero).
//!
//! The K/V rows of each kv head are converted to f32 once per call; then work is split over
//! (kv head, block of query tokens), each task serving every query head of its group.
//!
//! The arithmetic follows llama.cpp's CPU attention (flash attention off, f16 cache) on its
//! reference machine step by step, so the output is bit-identical: q and the probabilities
//! are rounded to f16, scores and weighted sums use ggml's accumulation order (`attention_sums`),
//! and the softmax is ggml's (`activation::softmax_blocks`).

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::activation::{softmax_padded, LANES};
use crate::attention_decode::DecodeQuery;
use crate::attention_sums::{
    dot_gemm, dot_vec, weighted_add, weighted_finish, weighted_start, Order, VEC_STEP,
};
use crate::isa::Isa;
use crate::parallel::Parallel;

/// Query tokens per task.
const Q_BLOCK: usize = 16;
/// Query tokens per task of the tiled x86 kernel (`attention_tiled`): its scores, 4 tokens x
/// a group of heads x the keys, stay in L2 at 4k keys.
const TILED_Q_BLOCK: usize = 4;
/// Keys per run in a prefill task (64 rows of a 64-wide head: 16 KiB of K or V, L1-resident).
const KEY_RUN: usize = 64;

/// Shape of attention for one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnGeometry {
    /// Query heads.
    pub heads: usize,
    /// K/V heads (divides `heads`).
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Sliding window: a query sees only the last `window` keys (itself included); `None`
    /// for full causal attention.
    pub window: Option<usize>,
    /// The factor the scores are multiplied by before the softmax; `None` for
    /// `1 / sqrt(head_dim)`. A model that scales its queries itself (Gemma 3, Phi-3) passes
    /// `Some(1.0)` with the scaled queries, as llama.cpp does: the queries are rounded to f16
    /// after that scale, and a small element that becomes an f16 subnormal keeps fewer bits than
    /// the unscaled one would, so scaling the scores instead is not the same product.
    pub score_scale: Option<f32>,
}

impl AttnGeometry {
    /// The factor the scores are multiplied by ([`AttnGeometry::score_scale`]).
    pub fn scale(&self) -> f32 {
        self.score_scale
            .unwrap_or_else(|| 1.0 / (self.head_dim as f32).sqrt())
    }

    /// The first key a query that sees keys `..keys` may attend to.
    pub fn first_key(&self, keys: usize) -> usize {
        self.window.map_or(0, |w| keys.saturating_sub(w))
    }

    /// Masks the scores of the keys before [`AttnGeometry::first_key`].
    pub(crate) fn mask_window(&self, scores: &mut [f32]) {
        self.mask_window_from(0, scores);
    }

    /// [`AttnGeometry::mask_window`] for the scores of keys `first..first + scores.len()`
    /// of a query that sees keys `..first + scores.len()`.
    pub(crate) fn mask_window_from(&self, first: usize, scores: &mut [f32]) {
        let n = scores.len();
        let lo = self.first_key(first + n).saturating_sub(first);
        scores[..lo.min(n)].fill(f32::NEG_INFINITY);
    }

    /// The first key the fast paths visit for a query that sees keys `..keys`: the window's
    /// first key rounded down to a multiple of `align`. The keys before it are masked, weigh
    /// exactly zero, and come in whole blocks of the softmax's and the weighted sums' lanes
    /// (`align` a multiple of both), so skipping them changes no sum: a block of zeros adds
    /// +0 to each lane. This is what keeps a sliding-window layer's cost per token flat in
    /// the context; llama.cpp gets there by keeping only the window in its SWA cache.
    pub(crate) fn first_visited(&self, keys: usize, align: usize) -> usize {
        self.first_key(keys) / align * align
    }

    /// Panics unless `n` query tokens from `first_pos` fit `q`, `out` and `blocks`.
    pub(crate) fn check_call(
        &self,
        q: &[f32],
        n: usize,
        first_pos: usize,
        blocks: &[KvBlock<'_>],
        out: &[f32],
    ) {
        let qw = self.heads * self.head_dim;
        assert!(
            self.kv_heads > 0 && self.heads.is_multiple_of(self.kv_heads),
            "attention: head counts"
        );
        assert_eq!(q.len(), n * qw, "attention: q shape");
        assert_eq!(out.len(), n * qw, "attention: out shape");
        let block_elems = self.page_size * self.token_width();
        for b in blocks {
            assert_eq!(b.k.len(), block_elems, "attention: K block size");
            assert_eq!(b.v.len(), block_elems, "attention: V block size");
        }
        assert!(
            first_pos + n <= blocks.len() * self.page_size,
            "attention: {} tokens need more than {} pages",
            first_pos + n,
            blocks.len()
        );
    }

    /// f16 elements of K (or V) per token: `kv_heads * head_dim`.
    pub fn token_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// One page's K and V blocks for one layer: `page_size * token_width` f16 each, token-major.
#[derive(Clone, Copy, Debug)]
pub struct KvBlock<'a> {
    /// Keys.
    pub k: &'a [f16],
    /// Values.
    pub v: &'a [f16],
}

/// Attention for `n` query tokens: `q` and `out` are `n * heads * head_dim`.
pub fn paged_attention(
    geo: &AttnGeometry,
    q: &[f32],
    n: usize,
    first_pos: usize,
    blocks: &[KvBlock<'_>],
    out: &mut [f32],
    par: &Parallel,
) {
    paged_attention_with(Isa::detect(), geo, q, n, first_pos, blocks, out, par)
}

/// Decode attention of a batch: each query is one sequence's single new token
/// ([`paged_attention`] with `n = 1` and `first_pos = keys - 1`, the same bits), all
/// sequences' work in the same parallel passes.
pub fn paged_attention_decode_many(
    geo: &AttnGeometry,
    queries: &mut [DecodeQuery<'_, '_>],
    par: &Parallel,
) {
    paged_attention_decode_many_with(Isa::detect(), geo, queries, par)
}

/// [`paged_attention_decode_many`] with an explicit instruction set.
pub fn paged_attention_decode_many_with(
    isa: Isa,
    geo: &AttnGeometry,
    queries: &mut [DecodeQuery<'_, '_>],
    par: &Parallel,
) {
    for d in queries.iter() {
        assert!(
            d.keys > 0,
            "attention: a decode query attends over its own key"
        );
        geo.check_call(d.q, 1, d.keys - 1, d.blocks, d.out);
    }
    crate::attention_decode::decode_many(isa, geo, queries, par);
}

/// [`paged_attention`] with an explicit instruction set.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_with(
    isa: Isa,
    geo: &AttnGeometry,
    q: &[f32],
    n: usize,
    first_pos: usize,
    blocks: &[KvBlock<'_>],
    out: &mut [f32],
    par: &Parallel,
) {
    geo.check_call(q, n, first_pos, blocks, out);
    let qw = geo.heads * geo.head_dim;
    if n == 0 {
        return;
    }
    let ctx = first_pos + n;
    if n == 1 {
        // Decode: one query token, split so every thread has work (`attention_decode`).
        crate::attention_decode::decode(isa, geo, q, ctx, blocks, out, par);
        return;
    }
    let tiled = isa != Isa::Portable && tiled_supports(geo);
    // The tiled kernel skips the keys no query of the call sees (a sliding window's), in
    // whole 16-key lanes; the reference task scans and masks every key.
    let kbase = if tiled {
        geo.first_visited(first_pos + 1, LANES)
    } else {
        0
    };
    // Each kv head's K and V rows `kbase..ctx` as f32, converted once for all its tasks: K as
    // [key][hd]; V likewise, or for the tiled kernel in 16-column blocks ([hd / 16][key][16]).
    let v_layout = if tiled {
        VLayout::Blocks
    } else {
        VLayout::Rows
    };
    let kv = par.map(geo.kv_heads, |g| {
        gather(isa, geo, blocks, g, kbase, ctx, v_layout)
    });
    // The tiled kernel keeps a task's scores (rows x keys) in L2: fewer tokens per task.
    let q_block = if tiled { TILED_Q_BLOCK } else { Q_BLOCK };
    let qblocks = n.div_ceil(q_block);
    let order = if n >= 2 { Order::Gemm } else { Order::Vec };
    let results = par.map(geo.kv_heads * qblocks, |task| {
        let (g, qb) = (task / qblocks, task % qblocks);
        let (i0, i1) = (qb * q_block, ((qb + 1) * q_block).min(n));
        #[cfg(target_arch = "x86_64")]
        if tiled {
            let job = crate::attention_tiled::TiledTask {
                geo,
                q,
                first_pos,
                kbase,
                k: &kv[g].0,
                v: &kv[g].1,
                g,
                i0,
                i1,
                isa,
            };
            // SAFETY: `Isa::Avx2` and `Isa::Avx512` are only detected when the CPU has AVX2,
            // FMA and F16C, and `Isa::Avx512` when it has AVX-512 F too.
            return unsafe { job.run() };
        }
        let job = Task {
            geo,
            q,
            first_pos,
            k: &kv[g].0,
            v: &kv[g].1,
            g,
            i0,
            i1,
            order,
            isa,
        };
        match isa {
            Isa::Portable => job.run(),
            // SAFETY: Avx2 is only detected when the CPU has avx2 and fma.
            Isa::Avx2 | Isa::Avx512 => unsafe { run_avx2(&job) },
        }
    });
    let group = geo.heads / geo.kv_heads;
    let gw = group * geo.head_dim;
    for (task, res) in results.into_iter().enumerate() {
        let (g, qb) = (task / qblocks, task % qblocks);
        for (k, row) in res.chunks_exact(gw).enumerate() {
            let i = qb * q_block + k;
            out[i * qw + g * gw..i * qw + (g + 1) * gw].copy_from_slice(row);
        }
    }
}

/// Whether the tiled x86 kernel handles this geometry.
#[cfg(target_arch = "x86_64")]
fn tiled_supports(geo: &AttnGeometry) -> bool {
    crate::attention_tiled::supports(geo)
}

#[cfg(not(target_arch = "x86_64"))]
fn tiled_supports(_: &AttnGeometry) -> bool {
    false
}

/// How [`gather`] lays out V.
#[derive(Clone, Copy, PartialEq, Eq)]
enum VLayout {
    /// Rows of `head_dim`, `[key][hd]`, as K (the reference task's).
    Rows,
    /// 16-column blocks, `[hd / 16][key][16]` (the tiled kernel's: its weighted sum reads one
    /// block of a key at a time; in rows of a power-of-two size those reads would be a page
    /// apart and share a handful of cache sets).
    Blocks,
}

/// K and V of kv head `g` for keys `kbase..ctx` (`kbase` a multiple of 16), K as f32 rows of
/// `head_dim` and V as `v_layout` says, each followed by zeros up to a multiple of 16 keys (the
/// tiled kernel reads whole tiles).
fn gather(
    isa: Isa,
    geo: &AttnGeometry,
    blocks: &[KvBlock<'_>],
    g: usize,
    kbase: usize,
    ctx: usize,
    v_layout: VLayout,
) -> (Vec<f32>, Vec<f32>) {
    let (hd, tw, ps) = (geo.head_dim, geo.token_width(), geo.page_size);
    let rows = ctx.next_multiple_of(16) - kbase;
    let mut k = vec![0f32; rows * hd];
    let mut v = vec![0f32; rows * hd];
    let widen_into = |src: &[f16], dst: &mut [f32]| match isa {
        Isa::Portable => src.convert_to_f32_slice(dst),
        // SAFETY: Avx2 is only detected when the CPU has avx2, fma and f16c.
        Isa::Avx2 | Isa::Avx512 => unsafe { widen_f16c(src, dst) },
    };
    for j in kbase..ctx {
        let blk = &blocks[j / ps];
        let at = (j % ps) * tw + g * hd;
        let r = j - kbase;
        widen_into(&blk.k[at..at + hd], &mut k[r * hd..(r + 1) * hd]);
        if v_layout == VLayout::Blocks {
            for (b, src) in blk.v[at..at + hd].chunks_exact(LANES).enumerate() {
                widen_into(src, &mut v[(b * rows + r) * LANES..][..LANES]);
            }
        } else {
            widen_into(&blk.v[at..at + hd], &mut v[r * hd..(r + 1) * hd]);
        }
    }
    (k, v)
}

/// Widens columns `c0..c0 + width` of rows `j0..j0 + n` of kv head `g` (K if `keys`, else V)
/// into `dst` (`n * width`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn widen(
    isa: Isa,
    geo: &AttnGeometry,
    blocks: &[KvBlock<'_>],
    keys: bool,
    g: usize,
    j0: usize,
    c0: usize,
    width: usize,
    dst: &mut [f32],
) {
    let (hd, tw, ps) = (geo.head_dim, geo.token_width(), geo.page_size);
    for (jj, d) in dst.chunks_exact_mut(width).enumerate() {
        let j = j0 + jj;
        let blk = &blocks[j / ps];
        let src = if keys { blk.k } else { blk.v };
        let at = (j % ps) * tw + g * hd + c0;
        match isa {
            Isa::Portable => src[at..at + width].convert_to_f32_slice(d),
            // SAFETY: Avx2 and Avx512 are only detected when the CPU has avx2, fma and f16c.
            Isa::Avx2 | Isa::Avx512 => unsafe { widen_f16c(&src[at..at + width], d) },
        }
    }
}

/// f16 to f32 with F16C, eight at a time, inline (the slice helper's per-call dispatch cost
/// more than the conversion when called once per 64-element row).
/// Inlined into its callers, which are compiled with AVX2 + F16C.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn widen_f16c(src: &[f16], dst: &mut [f32]) {
    // SAFETY: the caller upholds this function's contract (its `# Safety`).
    unsafe {
        use std::arch::x86_64::*;
        let n = src.len().min(dst.len());
        let body = n / 8 * 8;
        for i in (0..body).step_by(8) {
            let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        for i in body..n {
            dst[i] = src[i].to_f32();
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn widen_f16c(src: &[f16], dst: &mut [f32]) {
    src.convert_to_f32_slice(dst)
}

struct Task<'a> {
    geo: &'a AttnGeometry,
    q: &'a [f32],
    first_pos: usize,
    /// This kv head's keys and values, `[first_pos + n][head_dim]`.
    k: &'a [f32],
    v: &'a [f32],
    g: usize,
    i0: usize,
    i1: usize,
    order: Order,
    isa: Isa,
}

#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn run_avx2(job: &Task<'_>) -> Vec<f32> {
    job.run()
}

/// Rounds every element through f16 (slice conversions use F16C where present).
#[inline(always)]
pub(crate) fn round_f16(x: &mut [f32], tmp: &mut [f16]) {
    let tmp = &mut tmp[..x.len()];
    tmp.convert_from_f32_slice(x);
    tmp.convert_to_f32_slice(x);
}

impl Task<'_> {
    /// Returns `(i1 - i0) * group * head_dim` outputs for kv head `g`.
    #[inline(always)]
    fn run(&self) -> Vec<f32> {
        let geo = self.geo;
        let hd = geo.head_dim;
        let group = geo.heads / geo.kv_heads;
        let ctx = self.first_pos + self.i1;
        let (k, v) = (self.k, self.v);
        let scale = geo.scale();
        let qw = geo.heads * hd;
        // tinyBLAS needs the inner dimension in whole vectors; ggml falls back otherwise.
        let score_order = if hd.is_multiple_of(LANES) {
            self.order
        } else {
            Order::Vec
        };
        let mut out = vec![0f32; (self.i1 - self.i0) * group * hd];
        let mut scores = vec![0f32; group * ctx];
        let mut half = vec![f16::ZERO; ctx.max(group * hd)];
        let mut qh = vec![0f32; group * hd];
        let mut acc = vec![0f32; group * VEC_STEP * hd];
        for i in self.i0..self.i1 {
            let keys = self.first_pos + i + 1;
            // Like llama.cpp with an f16 KV cache, q and the probabilities are rounded to
            // f16 before they meet K and V.
            let head0 = self.g * group;
            qh.copy_from_slice(&self.q[i * qw + head0 * hd..][..group * hd]);
            round_f16(&mut qh, &mut half);
            // Keys in L1-sized runs, each run used by every query head of the group (one
            // read of K and V from L2 per group instead of per head). Each score and each
            // output element is still its own sum in ggml's order.
            for j0 in (0..keys).step_by(KEY_RUN) {
                let j1 = (j0 + KEY_RUN).min(keys);
                for (h, q) in qh.chunks_exact(hd).enumerate() {
                    let s = &mut scores[h * ctx..];
                    for j in j0..j1 {
                        let kj = &k[j * hd..(j + 1) * hd];
                        s[j] = match score_order {
                            Order::Gemm => dot_gemm(kj, q),
                            Order::Vec => dot_vec(kj, q),
                        } * scale;
                    }
                }
            }
            for h in 0..group {
                let s = &mut scores[h * ctx..h * ctx + keys];
                geo.mask_window(s);
                softmax_padded(self.isa, s);
                round_f16(s, &mut half);
            }
            for a in acc.chunks_exact_mut(VEC_STEP * hd) {
                weighted_start(self.order, hd, a);
            }
            for j0 in (0..keys).step_by(KEY_RUN) {
                let j1 = (j0 + KEY_RUN).min(keys);
                for (h, a) in acc.chunks_exact_mut(VEC_STEP * hd).enumerate() {
                    let p = &scores[h * ctx + j0..h * ctx + j1];
                    weighted_add(self.order, j0, p, &v[j0 * hd..j1 * hd], hd, a);
                }
            }
            for (h, a) in acc.chunks_exact_mut(VEC_STEP * hd).enumerate() {
                let o = &mut out[((i - self.i0) * group + h) * hd..][..hd];
                weighted_finish(self.order, hd, a, o);
            }
        }
        out
    }
}
