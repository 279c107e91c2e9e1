//! Causal grouped-query attention over paged f16 K/V.
//!
//! The caller passes, in order, the K and V blocks of every page of one sequence for one layer
//! (in Pagewarden these come from `ReadablePages::layer_block`, which checks the page
//! generation; this kernel never sees a page it was not handed). Query token `i` sits at
//! position `first_pos + i` and attends to keys `0..=first_pos + i`.
//!
//! Work is split over (kv head, block of query tokens). Each task converts the K/V rows of its
//! kv head to f32 once and reuses them for every query head of the group and every token.
//!
//! The arithmetic follows llama.cpp's CPU attention (flash attention off, f16 cache) on its
//! reference machine step by step, so the output is bit-identical: q and the probabilities
//! are rounded to f16, scores and weighted sums use ggml's accumulation order (see `Order`),
//! and the softmax is ggml's (`activation::softmax_blocks`).

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::activation::{softmax_blocks, LANES};
use crate::expf::reduce16;
use crate::isa::Isa;
use crate::parallel::Parallel;

/// Query tokens per task.
const Q_BLOCK: usize = 16;

/// Shape of attention for one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnGeometry {
    /// Query heads.
    pub heads: usize,
    /// K/V heads (divides `heads`).
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Tokens per page.
    pub page_size: usize,
}

impl AttnGeometry {
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
    let qw = geo.heads * geo.head_dim;
    assert!(
        geo.kv_heads > 0 && geo.heads.is_multiple_of(geo.kv_heads),
        "attention: head counts"
    );
    assert_eq!(q.len(), n * qw, "attention: q shape");
    assert_eq!(out.len(), n * qw, "attention: out shape");
    let block_elems = geo.page_size * geo.token_width();
    for b in blocks {
        assert_eq!(b.k.len(), block_elems, "attention: K block size");
        assert_eq!(b.v.len(), block_elems, "attention: V block size");
    }
    assert!(
        first_pos + n <= blocks.len() * geo.page_size,
        "attention: {} tokens need more than {} pages",
        first_pos + n,
        blocks.len()
    );
    if n == 0 {
        return;
    }
    let qblocks = n.div_ceil(Q_BLOCK);
    let results = par.map(geo.kv_heads * qblocks, |task| {
        let (g, qb) = (task / qblocks, task % qblocks);
        let (i0, i1) = (qb * Q_BLOCK, ((qb + 1) * Q_BLOCK).min(n));
        let job = Task {
            geo,
            q,
            first_pos,
            blocks,
            g,
            i0,
            i1,
            order: if n >= 2 { Order::Gemm } else { Order::Vec },
        };
        match isa {
            Isa::Portable => job.run(),
            // SAFETY: Avx2 is only detected when the CPU has avx2 and fma.
            Isa::Avx2 => unsafe { run_avx2(&job) },
        }
    });
    let group = geo.heads / geo.kv_heads;
    let gw = group * geo.head_dim;
    for (task, res) in results.into_iter().enumerate() {
        let (g, qb) = (task / qblocks, task % qblocks);
        for (k, row) in res.chunks_exact(gw).enumerate() {
            let i = qb * Q_BLOCK + k;
            out[i * qw + g * gw..i * qw + (g + 1) * gw].copy_from_slice(row);
        }
    }
}

/// Which of ggml's f16 matmul paths llama.cpp takes, which fixes the order of every sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// Two or more query tokens (prefill): llamafile's tinyBLAS, one 16-lane accumulator
    /// per output, reduced once at the end.
    Gemm,
    /// One query token (decode): `ggml_vec_dot_f16`, four 16-lane accumulators over
    /// 64-element steps, folded pairwise, then reduced.
    Vec,
}

struct Task<'a, 'b> {
    geo: &'a AttnGeometry,
    q: &'a [f32],
    first_pos: usize,
    blocks: &'a [KvBlock<'b>],
    g: usize,
    i0: usize,
    i1: usize,
    order: Order,
}

#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn run_avx2(job: &Task<'_, '_>) -> Vec<f32> {
    job.run()
}

impl Task<'_, '_> {
    /// Returns `(i1 - i0) * group * head_dim` outputs for kv head `g`.
    #[inline(always)]
    fn run(&self) -> Vec<f32> {
        let geo = self.geo;
        let (hd, tw, ps) = (geo.head_dim, geo.token_width(), geo.page_size);
        let group = geo.heads / geo.kv_heads;
        let ctx = self.first_pos + self.i1;
        // Gather this kv head's K and V rows as f32, [ctx][hd].
        let mut k = vec![0f32; ctx * hd];
        let mut v = vec![0f32; ctx * hd];
        for j in 0..ctx {
            let blk = &self.blocks[j / ps];
            let at = (j % ps) * tw + self.g * hd;
            blk.k[at..at + hd].convert_to_f32_slice(&mut k[j * hd..(j + 1) * hd]);
            blk.v[at..at + hd].convert_to_f32_slice(&mut v[j * hd..(j + 1) * hd]);
        }
        let scale = 1.0 / (hd as f32).sqrt();
        let qw = geo.heads * hd;
        // tinyBLAS needs the inner dimension in whole vectors; ggml falls back otherwise.
        let score_order = if hd % LANES == 0 {
            self.order
        } else {
            Order::Vec
        };
        let mut out = vec![0f32; (self.i1 - self.i0) * group * hd];
        let mut scores = vec![0f32; ctx];
        let mut qh = vec![0f32; hd];
        let mut acc = vec![0f32; VEC_STEP * hd];
        for i in self.i0..self.i1 {
            let keys = self.first_pos + i + 1;
            for h in 0..group {
                let head = self.g * group + h;
                // Like llama.cpp with an f16 KV cache, q and the probabilities are rounded to
                // f16 before they meet K and V.
                for (d, x) in qh.iter_mut().zip(&self.q[i * qw + head * hd..][..hd]) {
                    *d = f16::from_f32(*x).to_f32();
                }
                let s = &mut scores[..keys];
                for (j, sj) in s.iter_mut().enumerate() {
                    let kj = &k[j * hd..(j + 1) * hd];
                    *sj = match score_order {
                        Order::Gemm => dot_gemm(kj, &qh),
                        Order::Vec => dot_vec(kj, &qh),
                    } * scale;
                }
                softmax_blocks(s, true);
                s.iter_mut().for_each(|p| *p = f16::from_f32(*p).to_f32());
                let o = &mut out[((i - self.i0) * group + h) * hd..][..hd];
                match self.order {
                    Order::Gemm => weighted_gemm(s, &v, hd, &mut acc, o),
                    Order::Vec => weighted_vec(s, &v, hd, &mut acc, o),
                }
            }
        }
        out
    }
}

/// `ggml_vec_dot_f16`'s step: four accumulators of 16 lanes.
const VEC_STEP: usize = 4 * LANES;

/// tinyBLAS's dot: lane `l` accumulates elements `l, l + 16, ...` with fused multiply-adds.
#[inline(always)]
fn dot_gemm(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (x, y) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    reduce16(&acc)
}

/// Folds `ggml_vec_dot_f16`'s four accumulators (0+2, 1+3, then together) and reduces.
#[inline(always)]
fn fold4(acc: &[f32; VEC_STEP]) -> [f32; LANES] {
    let mut x = [0f32; LANES];
    for l in 0..LANES {
        x[l] = (acc[l] + acc[2 * LANES + l]) + (acc[LANES + l] + acc[3 * LANES + l]);
    }
    x
}

/// `ggml_vec_dot_f16`: 64-element steps into four 16-lane accumulators, the tail in f64.
#[inline(always)]
fn dot_vec(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; VEC_STEP];
    let (ac, bc) = (a.chunks_exact(VEC_STEP), b.chunks_exact(VEC_STEP));
    let (at, bt) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for e in 0..VEC_STEP {
            acc[e] = x[e].mul_add(y[e], acc[e]);
        }
    }
    let mut sum = reduce16(&fold4(&acc)) as f64;
    for (x, y) in at.iter().zip(bt) {
        sum += (x * y) as f64;
    }
    sum as f32
}

/// `o[d] = sum_j p[j] * v[j][d]` in tinyBLAS order (key `j` goes to lane `j % 16`).
#[inline(always)]
fn weighted_gemm(p: &[f32], v: &[f32], hd: usize, acc: &mut [f32], o: &mut [f32]) {
    let acc = &mut acc[..LANES * hd];
    acc.fill(0.0);
    for (j, pj) in p.iter().enumerate() {
        let row = &mut acc[(j % LANES) * hd..][..hd];
        for (a, x) in row.iter_mut().zip(&v[j * hd..(j + 1) * hd]) {
            *a = x.mul_add(*pj, *a);
        }
    }
    for (d, od) in o.iter_mut().enumerate() {
        let mut lanes = [0f32; LANES];
        for (l, x) in lanes.iter_mut().enumerate() {
            *x = acc[l * hd + d];
        }
        *od = reduce16(&lanes);
    }
}

/// `o[d] = sum_j p[j] * v[j][d]` in `ggml_vec_dot_f16` order (key `j` goes to accumulator
/// `j % 64`; the padded keys of llama.cpp's cache add exact zeros, so no tail remains).
#[inline(always)]
fn weighted_vec(p: &[f32], v: &[f32], hd: usize, acc: &mut [f32], o: &mut [f32]) {
    let used = p.len().min(VEC_STEP);
    acc[..used * hd].fill(0.0);
    for (j, pj) in p.iter().enumerate() {
        let row = &mut acc[(j % VEC_STEP) * hd..][..hd];
        for (a, x) in row.iter_mut().zip(&v[j * hd..(j + 1) * hd]) {
            *a = x.mul_add(*pj, *a);
        }
    }
    for (d, od) in o.iter_mut().enumerate() {
        let mut lanes = [0f32; VEC_STEP];
        for (e, x) in lanes.iter_mut().enumerate().take(used) {
            *x = acc[e * hd + d];
        }
        *od = reduce16(&fold4(&lanes));
    }
}
