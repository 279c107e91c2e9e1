//! The transformer forward pass over a batch of sequences, each contributing one or more
//! consecutive tokens. All sequences' rows go through each matmul together (weights are
//! read once per batch); attention runs per sequence over that sequence's pages only.
//!
//! A sequence whose KV write or read fails (generation mismatch, pool exhausted) is marked
//! failed: its rows stop contributing, its error is returned, and its `len` is unchanged.

use half::f16;
use pagewarden_kernels::activation::swiglu;
use pagewarden_kernels::norm::rms_norm;
use pagewarden_kernels::quant::dequantize_row;
use pagewarden_kernels::rope::Rope;
use pagewarden_kernels::{matmul, matmul_many, paged_attention, AttnGeometry, KvBlock, QMatrix};
use pagewarden_kvcache::ReadablePages;

use super::{Model, ModelError};

/// One sequence's share of a forward pass.
pub(super) struct SeqWork<'p> {
    pages: &'p mut ReadablePages,
    tokens: &'p [u32],
    /// Position of `tokens[0]` (the sequence's length before this pass).
    start: usize,
    /// First row of this sequence in the batch.
    row0: usize,
    error: Option<ModelError>,
}

impl<'p> SeqWork<'p> {
    pub(super) fn new(pages: &'p mut ReadablePages, tokens: &'p [u32]) -> SeqWork<'p> {
        let start = pages.len();
        SeqWork {
            pages,
            tokens,
            start,
            row0: 0,
            error: None,
        }
    }

    fn ok(&self) -> bool {
        self.error.is_none()
    }
}

impl Model {
    /// Runs the batch; returns, per sequence, the logits of its last token or its error.
    pub(super) fn forward(&self, seqs: &mut [SeqWork<'_>]) -> Vec<Result<Vec<f32>, ModelError>> {
        let cfg = &self.config;
        let w = &self.weights;
        let (dim, kvw, hd) = (cfg.dim, cfg.kv_width(), cfg.head_dim);
        let mut rows = 0;
        for s in seqs.iter_mut() {
            s.row0 = rows;
            rows += s.tokens.len();
            s.error = self.admit(s);
        }
        let rope = Rope {
            base: cfg.rope_theta,
            n_dims: cfg.rope_dims,
            head_dim: hd,
        };
        let mut cos_sin = Vec::with_capacity(rows);
        let mut x = vec![0f32; rows * dim];
        for s in seqs.iter() {
            for (i, &t) in s.tokens.iter().enumerate() {
                cos_sin.push(rope.cos_sin(s.start + i));
                if s.ok() {
                    let r = s.row0 + i;
                    dequantize_row(
                        w.token_embd.ty,
                        w.token_embd.row(t as usize),
                        &mut x[r * dim..(r + 1) * dim],
                    );
                }
            }
        }
        let mut xn = vec![0f32; rows * dim];
        let mut q = vec![0f32; rows * dim];
        let mut k = vec![0f32; rows * kvw];
        let mut v = vec![0f32; rows * kvw];
        let mut att = vec![0f32; rows * dim];
        let mut proj = vec![0f32; rows * dim];
        let mut gate = vec![0f32; rows * cfg.ffn];
        let mut up = vec![0f32; rows * cfg.ffn];
        for (l, lw) in w.layers.iter().enumerate() {
            rms_norm(&x, &lw.attn_norm, cfg.rms_eps, &mut xn);
            // Q, K and V read the same normalized rows: quantized once, one parallel pass.
            matmul_many(
                &[lw.wq, lw.wk, lw.wv],
                &xn,
                rows,
                &mut [&mut q, &mut k, &mut v],
                &self.par,
            );
            for r in 0..rows {
                rope.apply_with(&mut q[r * dim..(r + 1) * dim], &cos_sin[r]);
                rope.apply_with(&mut k[r * kvw..(r + 1) * kvw], &cos_sin[r]);
            }
            att.fill(0.0);
            for s in seqs.iter_mut().filter(|s| s.ok()) {
                if let Err(e) = self.attend(s, l, &q, &k, &v, &mut att) {
                    s.error = Some(e);
                }
            }
            self.mm(&lw.wo, &att, rows, &mut proj);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
            rms_norm(&x, &lw.ffn_norm, cfg.rms_eps, &mut xn);
            matmul_many(
                &[lw.gate, lw.up],
                &xn,
                rows,
                &mut [&mut gate, &mut up],
                &self.par,
            );
            swiglu(&mut gate, &up);
            self.mm(&lw.down, &gate, rows, &mut proj);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
        }
        // Logits only for the last token of each live sequence.
        let live: Vec<usize> = (0..seqs.len()).filter(|&i| seqs[i].ok()).collect();
        let mut last = vec![0f32; live.len() * dim];
        for (j, &i) in live.iter().enumerate() {
            let r = seqs[i].row0 + seqs[i].tokens.len() - 1;
            last[j * dim..(j + 1) * dim].copy_from_slice(&x[r * dim..(r + 1) * dim]);
        }
        let mut lastn = vec![0f32; last.len()];
        rms_norm(&last, &w.output_norm, cfg.rms_eps, &mut lastn);
        let mut logits = vec![0f32; live.len() * cfg.vocab];
        self.mm(&w.output, &lastn, live.len(), &mut logits);
        let mut live_logits = logits.chunks_exact(cfg.vocab.max(1));
        seqs.iter_mut()
            .map(|s| match s.error.take() {
                Some(e) => Err(e),
                None => {
                    s.pages.set_len(s.start + s.tokens.len());
                    Ok(live_logits
                        .next()
                        .expect("one row per live sequence")
                        .to_vec())
                }
            })
            .collect()
    }

    fn mm(&self, w: &QMatrix<'_>, x: &[f32], rows: usize, out: &mut [f32]) {
        matmul(w, x, rows, out, &self.par);
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
        s.pages.grow(end).err().map(ModelError::from)
    }

    /// Writes this sequence's K/V rows for layer `l` into its pages, then attends over every
    /// page it owns up to its last token. Every read is generation-checked by `layer_block`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        s: &mut SeqWork<'_>,
        l: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        att: &mut [f32],
    ) -> Result<(), ModelError> {
        let cfg = &self.config;
        let (dim, kvw) = (cfg.dim, cfg.kv_width());
        let n = s.tokens.len();
        // admit() grew the pages, so the table is non-empty.
        let geo = &AttnGeometry {
            heads: cfg.heads,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            page_size: s.pages.capacity() / s.pages.table().len(),
        };
        for i in 0..n {
            let r = s.row0 + i;
            let (kr, vr) = s.pages.kv_row_mut(l, s.start + i)?;
            to_f16(&k[r * kvw..(r + 1) * kvw], kr);
            to_f16(&v[r * kvw..(r + 1) * kvw], vr);
        }
        let end = s.start + n;
        let pages = end.div_ceil(geo.page_size);
        let blocks = (0..pages)
            .map(|p| s.pages.layer_block(l, p).map(|(k, v)| KvBlock { k, v }))
            .collect::<Result<Vec<_>, _>>()?;
        let r0 = s.row0;
        paged_attention(
            geo,
            &q[r0 * dim..(r0 + n) * dim],
            n,
            s.start,
            &blocks,
            &mut att[r0 * dim..(r0 + n) * dim],
            &self.par,
        );
        Ok(())
    }
}

fn to_f16(src: &[f32], dst: &mut [f16]) {
    use half::slice::HalfFloatSliceExt;
    dst.convert_from_f32_slice(src);
}
