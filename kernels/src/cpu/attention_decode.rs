//! Decode attention (one query token) in three parallel passes, so that every thread has work
//! however few kv heads the model has (SmolLM2: 3) and however long the context is:
//!
//! 1. scores: tasks of (kv head, run of keys); each widens its K rows once for the whole
//!    group of query heads;
//! 2. softmax: one task per query head (inside pass 1's task when one task scores all keys
//!    of its heads, up to 256 keys);
//! 3. weighted sum of V: tasks of (kv head, block of output columns). Every output element is
//!    its own sum over the keys, so splitting by column changes no sum's order.
//!
//! The arithmetic is [`crate::attention`]'s `Order::Vec` path (ggml's `vec_dot_f16` order),
//! element for element: the output has the same bits with any split and any thread count.

use half::f16;

use crate::activation::softmax_padded;
use crate::attention::{round_f16, widen, AttnGeometry, KvBlock};
use crate::attention_sums::VEC_STEP;
use crate::attention_sums::{dot_vec, weighted_add, weighted_finish, weighted_start, Order};
#[cfg(target_arch = "x86_64")]
use crate::attention_sums::{dot_vec_avx2, weighted_add_avx2, weighted_add_vec_lanes_avx2};
use crate::isa::Isa;
use crate::parallel::Parallel;
use crate::scratch;

/// Keys per score task (and per widened chunk inside it: 64 x 64-wide rows = 16 KiB).
const SCORE_KEYS: usize = 256;
const CHUNK: usize = 64;
/// Output columns per weighted-sum task.
const COLS: usize = 16;
/// Keys widened at a time by a weighted-sum task (16 columns: 32 KiB): each accumulator lane
/// takes eight of them between a load and a store.
const SUM_KEYS: usize = 8 * VEC_STEP;

thread_local! {
    /// A thread's buffers for the score and sum tasks (one task at a time): the widened keys
    /// or values, and the sums' accumulators.
    static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// A buffer written at disjoint indices by the tasks of one pass.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: each task writes only its own elements and the buffer outlives the pass.
unsafe impl Send for Shared {}
// SAFETY: as for `Send`.
unsafe impl Sync for Shared {}

/// One sequence's query for [`decode_many`]: its query row at position `keys - 1`, the pages
/// of its keys `0..keys`, and its output row.
pub struct DecodeQuery<'a, 'b> {
    /// `heads * head_dim` query values.
    pub q: &'a [f32],
    /// Keys attended over (the query's position plus one).
    pub keys: usize,
    /// The sequence's K/V blocks of this layer, page by page.
    pub blocks: &'a [KvBlock<'b>],
    /// `heads * head_dim` output values.
    pub out: &'a mut [f32],
}

/// Attention of one query token at position `keys - 1` over keys `0..keys`.
pub(crate) fn decode(
    isa: Isa,
    geo: &AttnGeometry,
    q: &[f32],
    keys: usize,
    blocks: &[KvBlock<'_>],
    out: &mut [f32],
    par: &Parallel,
) {
    decode_many(
        isa,
        geo,
        &mut [DecodeQuery {
            q,
            keys,
            blocks,
            out,
        }],
        par,
    );
}

/// [`decode`] for every sequence of a batched decode step at once: each pass is one parallel
/// region over the tasks of all the sequences (a step of 16 sequences ran 32 regions a layer
/// one sequence after another, most of them shorter than the threads' hand-over). Every task
/// is the one [`decode`] runs for its sequence alone, so each output has the same bits.
pub(crate) fn decode_many(
    isa: Isa,
    geo: &AttnGeometry,
    queries: &mut [DecodeQuery<'_, '_>],
    par: &Parallel,
) {
    let (hd, heads) = (geo.head_dim, geo.heads);
    let group = heads / geo.kv_heads;
    // Every entry point has checked each query's shapes (`AttnGeometry::check_call`).
    let outs: Vec<Shared> = queries
        .iter_mut()
        .map(|d| Shared(d.out.as_mut_ptr()))
        .collect();
    let queries: &[DecodeQuery<'_, '_>] = queries;
    // Like llama.cpp with an f16 KV cache, q is rounded to f16 before it meets K.
    let qhs: Vec<Vec<f32>> = queries
        .iter()
        .map(|d| {
            let mut qh = d.q.to_vec();
            let mut tmp = vec![f16::ZERO; qh.len()];
            round_f16(&mut qh, &mut tmp);
            qh
        })
        .collect();
    // The fast paths visit a sliding window's keys only, from a multiple of `VEC_STEP` (the
    // weighted sums' lanes; `AttnGeometry::first_visited`); the reference scans every key.
    let bases: Vec<usize> = queries
        .iter()
        .map(|d| match isa {
            Isa::Portable => 0,
            Isa::Avx2 | Isa::Avx512 => geo.first_visited(d.keys, VEC_STEP),
        })
        .collect();
    let spans: Vec<usize> = queries
        .iter()
        .zip(&bases)
        .map(|(d, b)| d.keys - b)
        .collect();
    let runs: Vec<usize> = spans.iter().map(|s| s.div_ceil(SCORE_KEYS)).collect();
    let mut scores: Vec<Vec<f32>> = spans.iter().map(|s| vec![0f32; heads * s]).collect();
    let sps: Vec<Shared> = scores.iter_mut().map(|s| Shared(s.as_mut_ptr())).collect();

    // Pass 1 (and the softmax of sequences whose keys one task scores): every sequence's
    // (kv head, run of keys) tasks.
    let score_tasks: Vec<(usize, usize)> = runs
        .iter()
        .enumerate()
        .flat_map(|(i, &r)| (0..geo.kv_heads * r).map(move |t| (i, t)))
        .collect();
    par.for_each_index(score_tasks.len(), |k| {
        let (i, t) = score_tasks[k];
        let (d, base, span, runs, sp) = (&queries[i], bases[i], spans[i], runs[i], sps[i]);
        let (g, r) = (t / runs, t % runs);
        let (j0, j1) = (
            base + r * SCORE_KEYS,
            (base + (r + 1) * SCORE_KEYS).min(d.keys),
        );
        let job = ScoreTask {
            geo,
            qh: &qhs[i],
            base,
            span,
            blocks: d.blocks,
            g,
            j0,
            j1,
            scores: sp,
            isa,
        };
        match isa {
            Isa::Portable => job.run(),
            // SAFETY: Avx2 and Avx512 are only detected when the CPU has avx2, fma and f16c.
            Isa::Avx2 | Isa::Avx512 => unsafe { run_scores_avx2(&job) },
        }
        if runs == 1 {
            // This task scored every key of its query heads: their softmax follows here,
            // one parallel region fewer per layer for contexts up to `SCORE_KEYS`.
            // SAFETY: the rows of heads g*group..(g+1)*group belong to this task alone.
            let rows =
                unsafe { std::slice::from_raw_parts_mut(sp.0.add(g * group * span), group * span) };
            rows.chunks_exact_mut(span)
                .for_each(|s| softmax_row(isa, geo, base, s));
        }
    });
    // Pass 2: the softmax of the other sequences' rows, a query head a task.
    let softmax_tasks: Vec<(usize, usize)> = runs
        .iter()
        .enumerate()
        .filter(|(_, &r)| r > 1)
        .flat_map(|(i, _)| (0..heads).map(move |h| (i, h)))
        .collect();
    par.for_each_index(softmax_tasks.len(), |k| {
        let (i, h) = softmax_tasks[k];
        let span = spans[i];
        // SAFETY: row h of sequence i's scores belongs to this task alone.
        let row = unsafe { std::slice::from_raw_parts_mut(sps[i].0.add(h * span), span) };
        softmax_row(isa, geo, bases[i], row);
    });

    // Pass 3: every sequence's (kv head, block of output columns) tasks.
    let cols = if hd.is_multiple_of(COLS) { COLS } else { hd };
    let cblocks = hd / cols;
    let scores = &scores;
    let sum_tasks = queries.len() * geo.kv_heads * cblocks;
    par.for_each_index(sum_tasks, |k| {
        let (i, t) = (k / (geo.kv_heads * cblocks), k % (geo.kv_heads * cblocks));
        let job = SumTask {
            geo,
            base: bases[i],
            keys: queries[i].keys,
            blocks: queries[i].blocks,
            g: t / cblocks,
            c0: (t % cblocks) * cols,
            cols,
            group,
            scores: &scores[i],
            out: outs[i],
            isa,
        };
        match isa {
            Isa::Portable => job.run(),
            // SAFETY: as above.
            Isa::Avx2 | Isa::Avx512 => unsafe { run_sums_avx2(&job) },
        }
    });
}

/// One query head's scores of keys `base..` into probabilities, rounded to f16 as
/// llama.cpp's are.
fn softmax_row(isa: Isa, geo: &AttnGeometry, base: usize, s: &mut [f32]) {
    let mut tmp = vec![f16::ZERO; s.len()];
    geo.mask_window_from(base, s);
    softmax_padded(isa, s);
    round_f16(s, &mut tmp);
}

/// Scores of keys `j0..j1` for every query head of kv head `g`, into rows of `span` scores
/// from key `base`.
struct ScoreTask<'a, 'b> {
    geo: &'a AttnGeometry,
    qh: &'a [f32],
    base: usize,
    span: usize,
    blocks: &'a [KvBlock<'b>],
    g: usize,
    j0: usize,
    j1: usize,
    scores: Shared,
    isa: Isa,
}

#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma,f16c"))]
unsafe fn run_scores_avx2(job: &ScoreTask<'_, '_>) {
    job.run()
}

impl ScoreTask<'_, '_> {
    #[inline(always)]
    fn run(&self) {
        // Common head widths as constants, so each dot product is straight-line vector code.
        match self.geo.head_dim {
            64 => self.run_hd(64),
            128 => self.run_hd(128),
            hd => self.run_hd(hd),
        }
    }

    /// [`dot_vec`] on this task's instruction set (same bits).
    #[inline(always)]
    fn dot(&self, k: &[f32], q: &[f32]) -> f32 {
        match self.isa {
            // SAFETY: Avx2 and Avx512 are only detected when the CPU has avx2 and fma (this
            // runs inside `run_scores_avx2` for them).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512 => unsafe { dot_vec_avx2(k, q) },
            _ => dot_vec(k, q),
        }
    }

    #[inline(always)]
    fn run_hd(&self, hd: usize) {
        // Taken out and put back, not borrowed in a closure: called directly, the task keeps
        // its constant width (inside `with_borrow_mut`'s closure the sum task lost it and
        // the suite's 16 streams fell from ~160 to ~90 tok/s).
        let (mut buf, acc) = SCRATCH.take();
        self.run_hd_in(hd, scratch::prefix(&mut buf, CHUNK * hd));
        SCRATCH.set((buf, acc));
    }

    /// [`Self::run_hd`] with a thread's buffer for the widened keys (`widen` writes every
    /// element read).
    #[inline(always)]
    fn run_hd_in(&self, hd: usize, buf: &mut [f32]) {
        let geo = self.geo;
        let group = geo.heads / geo.kv_heads;
        let scale = geo.scale();
        for c0 in (self.j0..self.j1).step_by(CHUNK) {
            let nc = CHUNK.min(self.j1 - c0);
            let kb = &mut buf[..nc * hd];
            widen(self.isa, geo, self.blocks, true, self.g, c0, 0, hd, kb);
            for h in 0..group {
                let head = self.g * group + h;
                let qv = &self.qh[head * hd..(head + 1) * hd];
                for (jj, k) in kb.chunks_exact(hd).enumerate() {
                    // SAFETY: (head, c0 + jj - base) is inside `heads * span` and belongs to
                    // this task alone (its kv head's query heads, its run of keys).
                    unsafe {
                        *self.scores.0.add(head * self.span + c0 + jj - self.base) =
                            self.dot(k, qv) * scale
                    };
                }
            }
        }
    }
}

/// Output columns `c0..c0 + cols` of every query head of kv head `g`, over keys
/// `base..keys` (`scores` has `keys - base` per head).
struct SumTask<'a, 'b> {
    geo: &'a AttnGeometry,
    base: usize,
    keys: usize,
    blocks: &'a [KvBlock<'b>],
    g: usize,
    c0: usize,
    cols: usize,
    group: usize,
    scores: &'a [f32],
    out: Shared,
    isa: Isa,
}

#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma,f16c"))]
unsafe fn run_sums_avx2(job: &SumTask<'_, '_>) {
    job.run()
}

impl SumTask<'_, '_> {
    #[inline(always)]
    fn run(&self) {
        // A constant width lets the compiler unroll the 16-wide fused multiply-adds into two
        // vector instructions (with a run-time width under its 32-wide unrolled loop, they ran
        // one lane at a time).
        if self.cols == COLS {
            self.run_cols(COLS)
        } else {
            self.run_cols(self.cols)
        }
    }

    #[inline(always)]
    fn run_cols(&self, cols: usize) {
        // As in `ScoreTask::run_hd`: taken and put back, so `cols` stays a constant.
        let (mut buf, mut acc) = SCRATCH.take();
        self.run_cols_in(cols, &mut acc, &mut buf);
        SCRATCH.set((buf, acc));
    }

    /// [`Self::run_cols`] on a thread's scratch: `weighted_start` writes every accumulator
    /// and `widen` every value it reads (zeroing them per task was a 48 KiB memset for
    /// Gemma 3's heads, per sequence, layer, head group and 16 columns).
    #[inline(always)]
    fn run_cols_in(&self, cols: usize, acc: &mut Vec<f32>, buf: &mut Vec<f32>) {
        let (group, keys, base) = (self.group, self.keys, self.base);
        let span = keys - base;
        let hd = self.geo.head_dim;
        let acc = scratch::prefix(acc, group * VEC_STEP * cols);
        for a in acc.chunks_exact_mut(VEC_STEP * cols) {
            weighted_start(Order::Vec, cols, a);
        }
        let buf = scratch::prefix(buf, SUM_KEYS * cols);
        for j0 in (base..keys).step_by(SUM_KEYS) {
            let nc = SUM_KEYS.min(keys - j0);
            let vb = &mut buf[..nc * cols];
            widen(
                self.isa,
                self.geo,
                self.blocks,
                false,
                self.g,
                j0,
                self.c0,
                cols,
                vb,
            );
            for (h, a) in acc.chunks_exact_mut(VEC_STEP * cols).enumerate() {
                let head = self.g * group + h;
                let at = head * span + j0 - base;
                let p = &self.scores[at..at + nc];
                match self.isa {
                    // SAFETY: Avx2 and Avx512 are only detected when the CPU has avx2 and
                    // fma (this runs inside `run_sums_avx2` for them).
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 | Isa::Avx512 if cols.is_multiple_of(8) && cols <= 32 => unsafe {
                        weighted_add_vec_lanes_avx2(j0, p, vb, cols, a)
                    },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: as for the arm above.
                    Isa::Avx2 | Isa::Avx512 if cols.is_multiple_of(8) => unsafe {
                        weighted_add_avx2(Order::Vec, j0, p, vb, cols, a)
                    },
                    _ => weighted_add(Order::Vec, j0, p, vb, cols, a),
                }
            }
        }
        let mut o = vec![0f32; cols];
        for (h, a) in acc.chunks_exact_mut(VEC_STEP * cols).enumerate() {
            weighted_finish(Order::Vec, cols, a, &mut o);
            let head = self.g * group + h;
            for (d, v) in o.iter().enumerate() {
                // SAFETY: columns c0..c0+cols of this kv head's query heads belong to this
                // task alone, inside `heads * head_dim`.
                unsafe { *self.out.0.add(head * hd + self.c0 + d) = *v };
            }
        }
    }
}
