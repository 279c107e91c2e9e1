//! The transformer forward pass over a batch of sequences, each contributing one or more
//! consecutive tokens. All sequences' rows go through each matmul together (weights are
//! read once per batch); attention runs per sequence over that sequence's pages only. The
//! layer recipe is the architecture's (`arch/`); this file holds what every recipe uses.
//!
//! A sequence whose KV write or read fails (generation mismatch, pool exhausted) is marked
//! failed: its rows stop contributing, its error is returned, and its `len` is unchanged.

use half::f16;
use pagewarden_kernels::attention_flash::flash_attention;
use pagewarden_kernels::norm::rms_norm;
use pagewarden_kernels::quant::dequantize_row;
use pagewarden_kernels::rope::Rope;
use pagewarden_kernels::{
    matmul, matmul_many, paged_attention, paged_attention_decode_many, AttnGeometry, DecodeQuery,
    KvBlock, QMatrix,
};
use pagewarden_kvcache::{ReadablePages, SharedPages};

use super::{Model, ModelError};
use crate::arch::{Arch, LayerExtra};
use crate::config::LlamaConfig;
use crate::weights::LayerWeights;

/// One sequence's share of a forward pass. Its KV is a cached prefix's read-only pages (none
/// outside prefill's prefix cache), then its own pages, which this pass writes.
pub(crate) struct SeqWork<'p> {
    prefix: Option<&'p SharedPages>,
    pages: &'p mut ReadablePages,
    tokens: &'p [u32],
    /// Position of `tokens[0]` (the sequence's length before this pass, prefix included).
    start: usize,
    /// First row of this sequence in the batch.
    row0: usize,
    /// Which rows' logits the pass returns.
    pub(crate) logits: Logits,
    error: Option<ModelError>,
}

/// Which rows of a sequence's pass end in logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Logits {
    /// The last token's (decode, and a prompt's last chunk).
    Last,
    /// Every token's (scoring a prompt).
    Every,
    /// None: a prompt chunk before the last, which only fills the cache (its last layer's
    /// FFN and the output head are skipped).
    Skip,
}

impl<'p> SeqWork<'p> {
    pub(crate) fn new(pages: &'p mut ReadablePages, tokens: &'p [u32]) -> SeqWork<'p> {
        Self::after(None, pages, tokens)
    }

    /// A sequence whose first `prefix.len()` positions are the pinned pages of `prefix`.
    pub(crate) fn after(
        prefix: Option<&'p SharedPages>,
        pages: &'p mut ReadablePages,
        tokens: &'p [u32],
    ) -> SeqWork<'p> {
        let start = prefix.map_or(0, SharedPages::len) + pages.len();
        SeqWork {
            prefix,
            pages,
            tokens,
            start,
            row0: 0,
            logits: Logits::Last,
            error: None,
        }
    }

    fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// Positions held by the prefix's pages (whole pages).
    fn prefix_tokens(&self) -> usize {
        self.prefix.map_or(0, SharedPages::len)
    }

    /// The K and V blocks of `layer` in the sequence's page `pg`, prefix pages first; every
    /// read is generation-checked (I1).
    fn layer_block(&self, layer: usize, pg: usize) -> Result<KvBlock<'_>, ModelError> {
        let shared = self.prefix.map_or(0, |p| p.table().len());
        let (k, v) = match self.prefix {
            Some(p) if pg < shared => p.layer_block(layer, pg)?,
            _ => self.pages.layer_block(layer, pg - shared)?,
        };
        Ok(KvBlock { k, v })
    }
}

/// RoPE cos/sin per row of the batch for one frequency base.
type RopeTable = (f32, Vec<Vec<(f32, f32)>>);

/// The batch's residual stream and the scratch buffers of one forward pass (row-major,
/// one row per token of the batch).
pub(crate) struct Pass {
    /// Rows in the batch.
    pub rows: usize,
    /// Position of each row in its sequence.
    positions: Vec<usize>,
    /// RoPE cos/sin per row, for each RoPE base the layers use.
    rope_tables: Vec<RopeTable>,
    /// Residual stream, `rows x dim`.
    pub x: Vec<f32>,
    /// Normalized rows, `rows x dim`.
    pub xn: Vec<f32>,
    /// Queries, `rows x q_width`.
    pub q: Vec<f32>,
    /// Keys and values, `rows x kv_width`.
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Attention output, `rows x q_width`.
    pub att: Vec<f32>,
    /// Output of a projection back to the residual width, `rows x dim`.
    pub proj: Vec<f32>,
    /// FFN gate and up, `rows x ffn`.
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// The layer after whose attention only the rows whose logits are wanted go on, and those
    /// rows ([`Pass::keep_output_rows`]).
    keep: Option<(usize, Vec<usize>)>,
}

impl Pass {
    fn new(cfg: &LlamaConfig, positions: Vec<usize>) -> Pass {
        let rows = positions.len();
        Pass {
            rows,
            positions,
            rope_tables: Vec::new(),
            x: vec![0f32; rows * cfg.dim],
            xn: vec![0f32; rows * cfg.dim],
            q: vec![0f32; rows * cfg.q_width()],
            k: vec![0f32; rows * cfg.kv_width()],
            v: vec![0f32; rows * cfg.kv_width()],
            att: vec![0f32; rows * cfg.q_width()],
            proj: vec![0f32; rows * cfg.dim],
            gate: vec![0f32; rows * cfg.ffn],
            up: vec![0f32; rows * cfg.ffn],
            keep: None,
        }
    }

    /// After layer `layer`'s attention output projection, drops every row but `rows`
    /// (ascending): the rest of the last layer runs on the rows whose logits are wanted only,
    /// as llama.cpp's graphs do (`inp_out_ids`). That saves the last FFN on every other row and
    /// gives those products llama.cpp's row count, which picks its kernel (a lone row takes
    /// `gemv`, not the tiled or `gemm` kernels).
    fn keep_output_rows(&mut self, layer: usize, dim: usize) {
        if self.keep.as_ref().is_none_or(|(l, _)| *l != layer) {
            return;
        }
        let (_, rows) = self.keep.take().expect("checked");
        if rows.len() == self.rows {
            return;
        }
        for (i, &r) in rows.iter().enumerate() {
            // Ascending rows: a row only ever moves down, onto one already copied or dropped.
            self.x.copy_within(r * dim..(r + 1) * dim, i * dim);
            self.proj.copy_within(r * dim..(r + 1) * dim, i * dim);
        }
        let n = rows.len();
        let ffn = self.gate.len() / self.rows;
        self.x.truncate(n * dim);
        self.proj.truncate(n * dim);
        self.xn.truncate(n * dim);
        self.gate.truncate(n * ffn);
        self.up.truncate(n * ffn);
        self.rows = n;
    }

    /// Rotates every row's Q and K by its position (NeoX pairs if `neox`).
    pub(crate) fn rope(&mut self, cfg: &LlamaConfig, base: f32, neox: bool) {
        let rope = Rope {
            base,
            n_dims: cfg.rope_dims,
            head_dim: cfg.head_dim,
        };
        let i = match self.rope_tables.iter().position(|(b, _)| *b == base) {
            Some(i) => i,
            None => {
                let (scale, factors) = (
                    cfg.rope_scaling.freq_scale,
                    cfg.rope_scaling.factors.as_deref(),
                );
                let t = self
                    .positions
                    .iter()
                    .map(|&p| rope.cos_sin_scaled(p, scale, factors))
                    .collect();
                self.rope_tables.push((base, t));
                self.rope_tables.len() - 1
            }
        };
        let table = &self.rope_tables[i].1;
        let (qw, kvw) = (cfg.q_width(), cfg.kv_width());
        for (r, cs) in table.iter().enumerate() {
            let (q, k) = (
                &mut self.q[r * qw..(r + 1) * qw],
                &mut self.k[r * kvw..][..kvw],
            );
            if neox {
                rope.apply_neox_with(q, cs);
                rope.apply_neox_with(k, cs);
            } else {
                rope.apply_with(q, cs);
                rope.apply_with(k, cs);
            }
        }
    }

    /// Per-head RMSNorm of every row's Q and K (`q_norm`, `k_norm`: `head_dim` each).
    pub(crate) fn norm_heads(&mut self, q_norm: &[f32], k_norm: &[f32], eps: f32) {
        let (nq, nk) = (self.q.len(), self.k.len());
        let mut out = vec![0f32; nq.max(nk)];
        rms_norm(&self.q, q_norm, eps, &mut out[..nq]);
        self.q.copy_from_slice(&out[..nq]);
        rms_norm(&self.k, k_norm, eps, &mut out[..nk]);
        self.k.copy_from_slice(&out[..nk]);
    }
}

/// `x += y`, elementwise (a residual connection).
pub(crate) fn add_into(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

impl Model {
    /// Runs the batch; returns, per sequence, the logits its [`Logits`] asks for (rows one
    /// after another; none for `Skip`) or its error.
    pub(super) fn forward(&self, seqs: &mut [SeqWork<'_>]) -> Vec<Result<Vec<f32>, ModelError>> {
        let cfg = &self.config;
        let w = &self.weights;
        let dim = cfg.dim;
        let mut positions = Vec::new();
        for s in seqs.iter_mut() {
            s.row0 = positions.len();
            positions.extend(s.start..s.start + s.tokens.len());
            s.error = self.admit(s);
        }
        let mut p = Pass::new(cfg, positions);
        let embed_scale = match &cfg.arch {
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 => None,
            Arch::Gemma3(_) => Some((dim as f32).sqrt()),
        };
        for s in seqs.iter().filter(|s| s.ok()) {
            for (i, &t) in s.tokens.iter().enumerate() {
                let x = &mut p.x[(s.row0 + i) * dim..][..dim];
                dequantize_row(w.token_embd.ty, w.token_embd.row(t as usize), x);
                if let Some(sc) = embed_scale {
                    x.iter_mut().for_each(|v| *v *= sc);
                }
            }
        }
        // Logits for the last token of each live sequence (every token of a scored one); the
        // other rows leave the pass after the last layer's attention.
        let out_rows: Vec<std::ops::Range<usize>> = seqs
            .iter()
            .map(|s| {
                let end = s.row0 + s.tokens.len();
                match s.logits {
                    _ if !s.ok() => end..end,
                    Logits::Every => s.row0..end,
                    Logits::Last => end - 1..end,
                    Logits::Skip => end..end,
                }
            })
            .collect();
        if let Some(last) = w.layers.len().checked_sub(1) {
            p.keep = Some((last, out_rows.iter().flat_map(Clone::clone).collect()));
        }
        let recipe = cfg.arch.recipe();
        for (l, lw) in w.layers.iter().enumerate() {
            match &lw.extra {
                LayerExtra::Llama => self.llama_block(&recipe, l, lw, seqs, &mut p),
                LayerExtra::Gemma3(norms) => self.gemma3_block(norms, l, lw, seqs, &mut p),
            }
        }
        let rows: usize = out_rows.iter().map(ExactSizeIterator::len).sum();
        let last = &p.x[..rows * dim];
        let mut lastn = vec![0f32; last.len()];
        rms_norm(last, &w.output_norm, cfg.rms_eps, &mut lastn);
        let mut logits = vec![0f32; rows * cfg.vocab];
        self.mm(&w.output, &lastn, rows, &mut logits);
        if let Arch::Gemma3(g) = &cfg.arch {
            if let Some(cap) = g.final_softcap {
                // llama.cpp: scale by 1/cap, tanh, scale by cap.
                logits
                    .iter_mut()
                    .for_each(|v| *v = (*v * (1.0 / cap)).tanh() * cap);
            }
        }
        let mut taken = 0;
        seqs.iter_mut()
            .zip(out_rows)
            .map(|(s, r)| {
                let n = r.len();
                taken += n;
                match s.error.take() {
                    Some(e) => Err(e),
                    None => {
                        s.pages
                            .set_len(s.start + s.tokens.len() - s.prefix_tokens());
                        Ok(logits[(taken - n) * cfg.vocab..taken * cfg.vocab].to_vec())
                    }
                }
            })
            .collect()
    }

    fn mm(&self, w: &QMatrix<'_>, x: &[f32], rows: usize, out: &mut [f32]) {
        matmul(w, x, rows, out, &self.par);
    }

    /// Q, K and V of the normalized rows `p.xn`: quantized once, one parallel pass.
    pub(crate) fn project_qkv(&self, lw: &LayerWeights<'_>, p: &mut Pass) {
        matmul_many(
            &[lw.wq, lw.wk, lw.wv],
            &p.xn,
            p.rows,
            &mut [&mut p.q, &mut p.k, &mut p.v],
            &self.par,
        );
        if let Some(b) = &lw.qkv_bias {
            for (x, b) in [(&mut p.q, &b.q), (&mut p.k, &b.k), (&mut p.v, &b.v)] {
                x.chunks_exact_mut(b.len()).for_each(|row| add_into(row, b));
            }
        }
    }

    /// FFN gate and up of the normalized rows `p.xn`.
    pub(crate) fn project_gate_up(&self, lw: &LayerWeights<'_>, p: &mut Pass) {
        matmul_many(
            &[lw.gate, lw.up],
            &p.xn,
            p.rows,
            &mut [&mut p.gate, &mut p.up],
            &self.par,
        );
    }

    /// FFN down of the activated `p.gate` into `p.proj`.
    pub(crate) fn project_down(&self, lw: &LayerWeights<'_>, p: &mut Pass) {
        self.mm(&lw.down, &p.gate, p.rows, &mut p.proj);
    }

    /// Attention of every live sequence over its own pages (writing this layer's K/V rows
    /// first), then the output projection into `p.proj`. A decode step (one token per
    /// sequence) attends for all its sequences in the same parallel passes; the arithmetic
    /// per sequence is the same either way.
    pub(crate) fn attention(
        &self,
        l: usize,
        lw: &LayerWeights<'_>,
        seqs: &mut [SeqWork<'_>],
        p: &mut Pass,
    ) {
        p.att.fill(0.0);
        let window = lw.attn.window;
        let one_token_each = seqs.iter().filter(|s| s.ok()).all(|s| s.tokens.len() == 1);
        if one_token_each && !self.flash_attention() {
            self.attend_decode(seqs, l, window, p);
        } else {
            for s in seqs.iter_mut().filter(|s| s.ok()) {
                if let Err(e) = self.attend(s, l, window, p) {
                    s.error = Some(e);
                }
            }
        }
        self.mm(&lw.wo, &p.att, p.rows, &mut p.proj);
        p.keep_output_rows(l, self.config.dim);
    }

    /// Checks a sequence can run: tokens in range, context not exceeded, pages grown.
    fn admit(&self, s: &mut SeqWork<'_>) -> Option<ModelError> {
        let cfg = &self.config;
        if s.tokens.is_empty() {
            return Some(ModelError::EmptyInput);
        }
        if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
            return Some(ModelError::TokenOutOfRange {
                token: t,
                vocab: cfg.vocab,
            });
        }
        let end = s.start + s.tokens.len();
        if end > cfg.context_length {
            return Some(ModelError::ContextExceeded {
                tokens: end,
                context: cfg.context_length,
            });
        }
        s.pages
            .grow(end - s.prefix_tokens())
            .err()
            .map(ModelError::from)
    }

    /// The geometry of layer attention over pages of `page_size` tokens.
    fn geometry(&self, page_size: usize, window: Option<usize>) -> AttnGeometry {
        let cfg = &self.config;
        AttnGeometry {
            heads: cfg.heads,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            page_size,
            window,
            // Gemma 3 and Phi-3 scale their queries before attention (llama.cpp's `kq_scale`
            // is then 1).
            score_scale: cfg.arch.recipe().q_prescaled.then_some(1.0),
        }
    }

    /// Writes this sequence's K/V rows of layer `l` (its tokens' rows of `p.k`, `p.v`) into
    /// its pages.
    fn write_kv(&self, s: &mut SeqWork<'_>, l: usize, p: &Pass) -> Result<(), ModelError> {
        let kvw = self.config.kv_width();
        for i in 0..s.tokens.len() {
            let r = s.row0 + i;
            let (kr, vr) = s.pages.kv_row_mut(l, s.start + i - s.prefix_tokens())?;
            to_f16(&p.k[r * kvw..(r + 1) * kvw], kr);
            to_f16(&p.v[r * kvw..(r + 1) * kvw], vr);
        }
        Ok(())
    }

    /// Layer `l`'s blocks of every page of `s` up to its last token, each generation-checked
    /// by `layer_block`.
    fn blocks<'s>(
        &self,
        s: &'s SeqWork<'_>,
        l: usize,
        page_size: usize,
    ) -> Result<Vec<KvBlock<'s>>, ModelError> {
        let pages = (s.start + s.tokens.len()).div_ceil(page_size);
        (0..pages).map(|pg| s.layer_block(l, pg)).collect()
    }

    /// Writes this sequence's K/V rows for layer `l` into its pages, then attends over every
    /// page it owns up to its last token. Every read is generation-checked by `layer_block`.
    fn attend(
        &self,
        s: &mut SeqWork<'_>,
        l: usize,
        window: Option<usize>,
        p: &mut Pass,
    ) -> Result<(), ModelError> {
        let qw = self.config.q_width();
        let n = s.tokens.len();
        let geo = &self.geometry(s.pages.layout().page_size, window);
        self.write_kv(s, l, p)?;
        let blocks = self.blocks(s, l, geo.page_size)?;
        let r0 = s.row0;
        let (q, out) = (
            &p.q[r0 * qw..(r0 + n) * qw],
            &mut p.att[r0 * qw..(r0 + n) * qw],
        );
        if self.flash_attention() {
            flash_attention(geo, q, n, s.start, &blocks, out, geo.scale(), &self.par);
        } else {
            paged_attention(geo, q, n, s.start, &blocks, out, &self.par);
        }
        Ok(())
    }

    /// [`Self::attend`] for a decode step, every live sequence one token: the K/V rows are
    /// written sequence by sequence, then all of them attend at once
    /// ([`paged_attention_decode_many`]). A sequence whose write or read fails is marked
    /// failed; the others attend.
    fn attend_decode(
        &self,
        seqs: &mut [SeqWork<'_>],
        l: usize,
        window: Option<usize>,
        p: &mut Pass,
    ) {
        for s in seqs.iter_mut().filter(|s| s.ok()) {
            if let Err(e) = self.write_kv(s, l, p) {
                s.error = Some(e);
            }
        }
        let Some(page_size) = seqs
            .iter()
            .find(|s| s.ok())
            .map(|s| s.pages.layout().page_size)
        else {
            return;
        };
        let geo = self.geometry(page_size, window);
        let qw = self.config.q_width();
        let mut failed = Vec::new();
        {
            let mut outs: Vec<Option<&mut [f32]>> = p.att.chunks_exact_mut(qw).map(Some).collect();
            let mut live = Vec::new();
            for (i, s) in seqs.iter().enumerate().filter(|(_, s)| s.ok()) {
                match self.blocks(s, l, page_size) {
                    Ok(blocks) => live.push((s.row0, s.start + 1, blocks)),
                    Err(e) => failed.push((i, e)),
                }
            }
            let mut queries: Vec<DecodeQuery<'_, '_>> = live
                .iter()
                .map(|(row, keys, blocks)| DecodeQuery {
                    q: &p.q[row * qw..(row + 1) * qw],
                    keys: *keys,
                    blocks,
                    out: outs[*row]
                        .take()
                        .expect("each sequence has rows of its own"),
                })
                .collect();
            paged_attention_decode_many(&geo, &mut queries, &self.par);
        }
        for (i, e) in failed {
            seqs[i].error = Some(e);
        }
    }
}

fn to_f16(src: &[f32], dst: &mut [f16]) {
    use half::slice::HalfFloatSliceExt;
    dst.convert_from_f32_slice(src);
}
