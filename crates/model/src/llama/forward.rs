//! The transformer forward pass over a batch of sequences, each contributing one or more
//! consecutive tokens, written once for every [`Backend`] (the CPU's, the GPU's). All
//! sequences' rows go through each matmul together (weights are read once per batch);
//! attention runs per sequence over that sequence's pages only. The layer recipe is the
//! architecture's (`arch/`); this file holds what every recipe uses.
//!
//! A sequence whose KV write or read fails (generation mismatch, pool exhausted) is marked
//! failed: its rows stop contributing, its error is returned, and its `len` is unchanged. A
//! device failure fails every sequence of the pass ([`ModelError::Device`]).

use pagewarden_kernels::rope::Rope;
use pagewarden_kernels::{AttnGeometry, KvBlock};
use pagewarden_kvcache::{ReadablePages, SharedPages};

use super::{Model, ModelError};
use crate::arch::{Arch, LayerExtra};
use crate::backend::Backend;
use crate::config::LlamaConfig;
use crate::weights::LayerWeights;

/// One sequence's share of a forward pass. Its KV is a cached prefix's read-only pages (none
/// outside prefill's prefix cache), then its own pages, which this pass writes.
pub(crate) struct SeqWork<'p> {
    pub(crate) prefix: Option<&'p SharedPages>,
    pub(crate) pages: &'p mut ReadablePages,
    pub(crate) tokens: &'p [u32],
    /// Position of `tokens[0]` (the sequence's length before this pass, prefix included).
    pub(crate) start: usize,
    /// First row of this sequence in the batch.
    pub(crate) row0: usize,
    /// Which rows' logits the pass returns.
    pub(crate) logits: Logits,
    pub(crate) error: Option<ModelError>,
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

    pub(crate) fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// Positions held by the prefix's pages (whole pages).
    pub(crate) fn prefix_tokens(&self) -> usize {
        self.prefix.map_or(0, SharedPages::len)
    }

    /// The K and V blocks of `layer` in the sequence's page `pg`, prefix pages first; every
    /// read is generation-checked (I1).
    pub(crate) fn layer_block(&self, layer: usize, pg: usize) -> Result<KvBlock<'_>, ModelError> {
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

/// The batch's residual stream and the scratch buffers of one forward pass on backend `B`
/// (row-major, one row per token of the batch).
pub(crate) struct Pass<B: Backend> {
    /// Rows in the batch.
    pub rows: usize,
    /// Position of each row in its sequence.
    positions: Vec<usize>,
    /// RoPE cos/sin per row, for each RoPE base the layers use.
    rope_tables: Vec<RopeTable>,
    /// Residual stream, `rows x dim`.
    pub x: B::Buf,
    /// Normalized rows, `rows x dim`.
    pub xn: B::Buf,
    /// Queries, `rows x q_width`.
    pub q: B::Buf,
    /// Keys and values, `rows x kv_width`.
    pub k: B::Buf,
    pub v: B::Buf,
    /// Attention output, `rows x q_width`.
    pub att: B::Buf,
    /// Output of a projection back to the residual width, `rows x dim`.
    pub proj: B::Buf,
    /// FFN gate and up, `rows x ffn`.
    pub gate: B::Buf,
    pub up: B::Buf,
    /// The layer after whose attention only the rows whose logits are wanted go on, and those
    /// rows ([`Pass::keep_output_rows`]).
    keep: Option<(usize, Vec<usize>)>,
}

impl<B: Backend> Pass<B> {
    fn new(b: &B, cfg: &LlamaConfig, positions: Vec<usize>) -> Result<Pass<B>, B::Error> {
        let rows = positions.len();
        Ok(Pass {
            rows,
            positions,
            rope_tables: Vec::new(),
            x: b.zeros(rows * cfg.dim)?,
            xn: b.zeros(rows * cfg.dim)?,
            q: b.zeros(rows * cfg.q_width())?,
            k: b.zeros(rows * cfg.kv_width())?,
            v: b.zeros(rows * cfg.kv_width())?,
            att: b.zeros(rows * cfg.q_width())?,
            proj: b.zeros(rows * cfg.dim)?,
            gate: b.zeros(rows * cfg.ffn)?,
            up: b.zeros(rows * cfg.ffn)?,
            keep: None,
        })
    }

    /// After layer `layer`'s attention output projection, drops every row but `rows`
    /// (ascending): the rest of the last layer runs on the rows whose logits are wanted only,
    /// as llama.cpp's graphs do (`inp_out_ids`). That saves the last FFN on every other row and
    /// gives those products llama.cpp's row count, which picks its kernel (a lone row takes
    /// `gemv`, not the tiled or `gemm` kernels).
    fn keep_output_rows(&mut self, b: &B, layer: usize, dim: usize) -> Result<(), B::Error> {
        if self.keep.as_ref().is_none_or(|(l, _)| *l != layer) {
            return Ok(());
        }
        let (_, rows) = self.keep.take().expect("checked");
        if rows.len() == self.rows {
            return Ok(());
        }
        b.keep_rows(&mut self.x, dim, &rows)?;
        b.keep_rows(&mut self.proj, dim, &rows)?;
        let n = rows.len();
        let ffn = B::len(&self.gate) / self.rows;
        b.truncate(&mut self.xn, n * dim)?;
        b.truncate(&mut self.gate, n * ffn)?;
        b.truncate(&mut self.up, n * ffn)?;
        self.rows = n;
        Ok(())
    }

    /// Rotates every row's Q and K by its position (NeoX pairs if `neox`).
    pub(crate) fn rope(
        &mut self,
        b: &B,
        cfg: &LlamaConfig,
        base: f32,
        neox: bool,
    ) -> Result<(), B::Error> {
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
        b.rope(
            &rope,
            &self.rope_tables[i].1,
            neox,
            &mut self.q,
            &mut self.k,
        )
    }

    /// Per-head RMSNorm of every row's Q and K (`q_norm`, `k_norm`: `head_dim` each).
    pub(crate) fn norm_heads(
        &mut self,
        b: &B,
        q_norm: &[f32],
        k_norm: &[f32],
        eps: f32,
    ) -> Result<(), B::Error> {
        let mut qn = b.zeros(B::len(&self.q))?;
        b.rms_norm(&self.q, q_norm, eps, &mut qn)?;
        self.q = qn;
        let mut kn = b.zeros(B::len(&self.k))?;
        b.rms_norm(&self.k, k_norm, eps, &mut kn)?;
        self.k = kn;
        Ok(())
    }
}

impl Model {
    /// Runs the batch on backend `b`; returns, per sequence, the logits its [`Logits`] asks
    /// for (rows one after another; none for `Skip`) or its error. A device failure fails
    /// every sequence of the pass ([`ModelError::Device`]), each length unchanged.
    pub(crate) fn forward_on<B: Backend>(
        &self,
        b: &B,
        seqs: &mut [SeqWork<'_>],
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        let mut positions = Vec::new();
        for s in seqs.iter_mut() {
            s.row0 = positions.len();
            positions.extend(s.start..s.start + s.tokens.len());
            s.error = self.admit(s);
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
        let logits = match self.pass(b, seqs, positions, &out_rows) {
            Ok(logits) => logits,
            Err(e) => {
                let msg = e.to_string();
                return seqs
                    .iter_mut()
                    .map(|s| Err(s.error.take().unwrap_or(ModelError::Device(msg.clone()))))
                    .collect();
            }
        };
        let vocab = self.config.vocab;
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
                        Ok(logits[(taken - n) * vocab..taken * vocab].to_vec())
                    }
                }
            })
            .collect()
    }

    /// The layers and the output head over the admitted batch: the logits of `out_rows`,
    /// one row after another, on the host.
    fn pass<B: Backend>(
        &self,
        b: &B,
        seqs: &mut [SeqWork<'_>],
        positions: Vec<usize>,
        out_rows: &[std::ops::Range<usize>],
    ) -> Result<Vec<f32>, B::Error> {
        let cfg = &self.config;
        let w = &self.weights;
        let dim = cfg.dim;
        let mut step = b.begin(seqs)?;
        let mut p = Pass::new(b, cfg, positions)?;
        let embed_scale = match &cfg.arch {
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 => None,
            Arch::Gemma3(_) => Some((dim as f32).sqrt()),
        };
        let ids: Vec<(usize, u32)> = seqs
            .iter()
            .filter(|s| s.ok())
            .flat_map(|s| s.tokens.iter().enumerate().map(|(i, &t)| (s.row0 + i, t)))
            .collect();
        b.embed(&w.token_embd, &ids, embed_scale, &mut p.x)?;
        if let Some(last) = w.layers.len().checked_sub(1) {
            p.keep = Some((last, out_rows.iter().flat_map(Clone::clone).collect()));
        }
        let recipe = cfg.arch.recipe();
        for (l, lw) in w.layers.iter().enumerate() {
            match &lw.extra {
                LayerExtra::Llama => {
                    self.llama_block(b, &mut step, &recipe, l, lw, seqs, &mut p)?
                }
                LayerExtra::Gemma3(norms) => {
                    self.gemma3_block(b, &mut step, norms, l, lw, seqs, &mut p)?
                }
            }
        }
        let rows: usize = out_rows.iter().map(ExactSizeIterator::len).sum();
        b.truncate(&mut p.x, rows * dim)?;
        let mut lastn = b.zeros(rows * dim)?;
        b.rms_norm(&p.x, &w.output_norm, cfg.rms_eps, &mut lastn)?;
        let mut logits = b.zeros(rows * cfg.vocab)?;
        b.matmul_many(&[w.output], &lastn, rows, &mut [&mut logits])?;
        if let Arch::Gemma3(g) = &cfg.arch {
            if let Some(cap) = g.final_softcap {
                b.softcap(&mut logits, cap)?;
            }
        }
        b.finish(step, seqs)?;
        b.to_host(logits)
    }

    /// Q, K and V of the normalized rows `p.xn`: quantized once, one parallel pass.
    pub(crate) fn project_qkv<B: Backend>(
        &self,
        b: &B,
        lw: &LayerWeights<'_>,
        p: &mut Pass<B>,
    ) -> Result<(), B::Error> {
        b.matmul_many(
            &[lw.wq, lw.wk, lw.wv],
            &p.xn,
            p.rows,
            &mut [&mut p.q, &mut p.k, &mut p.v],
        )?;
        if let Some(bias) = &lw.qkv_bias {
            b.add_rows(&mut p.q, &bias.q)?;
            b.add_rows(&mut p.k, &bias.k)?;
            b.add_rows(&mut p.v, &bias.v)?;
        }
        Ok(())
    }

    /// FFN gate and up of the normalized rows `p.xn`.
    pub(crate) fn project_gate_up<B: Backend>(
        &self,
        b: &B,
        lw: &LayerWeights<'_>,
        p: &mut Pass<B>,
    ) -> Result<(), B::Error> {
        b.matmul_many(
            &[lw.gate, lw.up],
            &p.xn,
            p.rows,
            &mut [&mut p.gate, &mut p.up],
        )
    }

    /// FFN down of the activated `p.gate` into `p.proj`.
    pub(crate) fn project_down<B: Backend>(
        &self,
        b: &B,
        lw: &LayerWeights<'_>,
        p: &mut Pass<B>,
    ) -> Result<(), B::Error> {
        b.matmul_many(&[lw.down], &p.gate, p.rows, &mut [&mut p.proj])
    }

    /// Attention of every live sequence over its own pages (writing this layer's K/V rows
    /// first), then the output projection into `p.proj`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention<B: Backend>(
        &self,
        b: &B,
        step: &mut B::Step,
        l: usize,
        lw: &LayerWeights<'_>,
        seqs: &mut [SeqWork<'_>],
        p: &mut Pass<B>,
    ) -> Result<(), B::Error> {
        if let Some(page_size) = seqs
            .iter()
            .find(|s| s.ok())
            .map(|s| s.pages.layout().page_size)
        {
            let geo = self.geometry(page_size, lw.attn.window);
            b.attention(step, l, &geo, seqs, p)?;
        }
        b.matmul_many(&[lw.wo], &p.att, p.rows, &mut [&mut p.proj])?;
        p.keep_output_rows(b, l, self.config.dim)
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
}
