//! `Cpu`: the [`Backend`] of the CPU, the reference: activations in `Vec<f32>`, the kernels
//! of `pagewarden_kernels`, K/V read and written in the host pool's pages, each read
//! generation-checked by `ReadablePages::layer_block` (I1).

use std::convert::Infallible;

use half::f16;
use pagewarden_kernels::activation::{geglu, swiglu};
use pagewarden_kernels::attention_flash::flash_attention;
use pagewarden_kernels::norm::rms_norm;
use pagewarden_kernels::quant::dequantize_row;
use pagewarden_kernels::rope::Rope;
use pagewarden_kernels::{
    matmul_many, paged_attention, paged_attention_decode_many, AttnGeometry, DecodeQuery, KvBlock,
    Parallel, QMatrix,
};

use super::{Backend, Glu};
use crate::llama::forward::{Pass, SeqWork};
use crate::llama::ModelError;

/// The CPU's kernels on a model's thread pool.
pub(crate) struct Cpu<'m> {
    pub(crate) par: &'m Parallel,
    /// llama.cpp's flash-attention arithmetic (`LoadOptions::flash_attention`).
    pub(crate) flash: bool,
}

/// `x += y`, elementwise.
fn add_into(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

fn to_f16(src: &[f32], dst: &mut [f16]) {
    use half::slice::HalfFloatSliceExt;
    dst.convert_from_f32_slice(src);
}

/// Elementwise work smaller than this runs on the calling thread: a parallel region costs
/// a hand-over, which a decode step's few rows do not repay.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 16;

/// Elements per task when `len` elements, rows of `width`, are split over `par`'s threads in
/// whole rows, about four tasks a thread; `None` (one task, on the caller) when the work is
/// small or there is one thread.
fn split(len: usize, width: usize, par: &Parallel) -> Option<usize> {
    if len < PARALLEL_MIN_ELEMENTS || par.threads() < 2 || width == 0 {
        return None;
    }
    let rows = len / width;
    Some(rows.div_ceil(4 * par.threads()).max(1) * width)
}

impl Backend for Cpu<'_> {
    type Buf = Vec<f32>;
    type Error = Infallible;
    type Step = ();

    fn len(x: &Vec<f32>) -> usize {
        x.len()
    }

    fn zeros(&self, len: usize) -> Result<Vec<f32>, Infallible> {
        Ok(vec![0f32; len])
    }

    fn begin(&self, _: &[SeqWork<'_>]) -> Result<(), Infallible> {
        Ok(())
    }

    fn embed(
        &self,
        table: &QMatrix<'_>,
        rows: &[(usize, u32)],
        scale: Option<f32>,
        out: &mut Vec<f32>,
    ) -> Result<(), Infallible> {
        let dim = table.cols;
        for &(r, t) in rows {
            let x = &mut out[r * dim..][..dim];
            dequantize_row(table.ty, table.row(t as usize), x);
            if let Some(sc) = scale {
                x.iter_mut().for_each(|v| *v *= sc);
            }
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &Vec<f32>,
        w: &[f32],
        eps: f32,
        out: &mut Vec<f32>,
    ) -> Result<(), Infallible> {
        let out = &mut out[..x.len()];
        // A pass of many rows (prefill) normalizes its rows on every thread; each row's bits
        // are the same either way.
        match split(x.len(), w.len(), self.par) {
            None => rms_norm(x, w, eps, out),
            Some(len) => self.par.for_each_chunk(out, len, |i, o| {
                rms_norm(&x[i * len..i * len + o.len()], w, eps, o)
            }),
        }
        Ok(())
    }

    fn matmul_many(
        &self,
        ws: &[QMatrix<'_>],
        x: &Vec<f32>,
        rows: usize,
        outs: &mut [&mut Vec<f32>],
    ) -> Result<(), Infallible> {
        let mut outs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        matmul_many(ws, &x[..rows * ws[0].cols], rows, &mut outs, self.par);
        Ok(())
    }

    fn add_rows(&self, x: &mut Vec<f32>, bias: &[f32]) -> Result<(), Infallible> {
        x.chunks_exact_mut(bias.len())
            .for_each(|row| add_into(row, bias));
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<(), Infallible> {
        add_into(x, y);
        Ok(())
    }

    fn scale(&self, x: &mut Vec<f32>, s: f32) -> Result<(), Infallible> {
        x.iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn softcap(&self, x: &mut Vec<f32>, cap: f32) -> Result<(), Infallible> {
        // llama.cpp: scale by 1/cap, tanh, scale by cap.
        x.iter_mut()
            .for_each(|v| *v = (*v * (1.0 / cap)).tanh() * cap);
        Ok(())
    }

    fn rope(
        &self,
        rope: &Rope,
        table: &[Vec<(f32, f32)>],
        neox: bool,
        q: &mut Vec<f32>,
        k: &mut Vec<f32>,
    ) -> Result<(), Infallible> {
        let rows = table.len();
        let (qw, kvw) = (q.len() / rows.max(1), k.len() / rows.max(1));
        for (r, cs) in table.iter().enumerate() {
            let (q, k) = (&mut q[r * qw..(r + 1) * qw], &mut k[r * kvw..][..kvw]);
            if neox {
                rope.apply_neox_with(q, cs);
                rope.apply_neox_with(k, cs);
            } else {
                rope.apply_with(q, cs);
                rope.apply_with(k, cs);
            }
        }
        Ok(())
    }

    fn glu(&self, act: Glu, gate: &mut Vec<f32>, up: &Vec<f32>) -> Result<(), Infallible> {
        assert_eq!(gate.len(), up.len(), "glu: shape");
        // Elementwise: on every thread for a pass of many rows, the same bits.
        let glu = |g: &mut [f32], u: &[f32]| match act {
            Glu::Silu => swiglu(g, u),
            Glu::Gelu => geglu(g, u),
        };
        match split(gate.len(), 64, self.par) {
            None => glu(gate, up),
            Some(len) => self
                .par
                .for_each_chunk(gate, len, |i, g| glu(g, &up[i * len..i * len + g.len()])),
        }
        Ok(())
    }

    fn keep_rows(&self, x: &mut Vec<f32>, width: usize, rows: &[usize]) -> Result<(), Infallible> {
        for (i, &r) in rows.iter().enumerate() {
            // Ascending rows: a row only ever moves down, onto one already copied or dropped.
            x.copy_within(r * width..(r + 1) * width, i * width);
        }
        x.truncate(rows.len() * width);
        Ok(())
    }

    fn truncate(&self, x: &mut Vec<f32>, len: usize) -> Result<(), Infallible> {
        x.truncate(len);
        Ok(())
    }

    fn attention(
        &self,
        _: &mut (),
        layer: usize,
        geo: &AttnGeometry,
        seqs: &mut [SeqWork<'_>],
        p: &mut Pass<Self>,
    ) -> Result<(), Infallible> {
        p.att.fill(0.0);
        let one_token_each = seqs.iter().filter(|s| s.ok()).all(|s| s.tokens.len() == 1);
        if one_token_each && !self.flash {
            self.attend_decode(seqs, layer, geo, p);
        } else {
            for s in seqs.iter_mut().filter(|s| s.ok()) {
                if let Err(e) = self.attend(s, layer, geo, p) {
                    s.error = Some(e);
                }
            }
        }
        Ok(())
    }

    fn finish(&self, _: (), _: &mut [SeqWork<'_>]) -> Result<(), Infallible> {
        Ok(())
    }

    fn to_host(&self, x: Vec<f32>) -> Result<Vec<f32>, Infallible> {
        Ok(x)
    }
}

impl Cpu<'_> {
    /// Writes this sequence's K/V rows of layer `l` (its tokens' rows of `p.k`, `p.v`) into
    /// its pages.
    fn write_kv(
        &self,
        s: &mut SeqWork<'_>,
        l: usize,
        kvw: usize,
        p: &Pass<Self>,
    ) -> Result<(), ModelError> {
        let own0 = s.start - s.prefix_tokens();
        for i in 0..s.tokens.len() {
            let r = s.row0 + i;
            let (kr, vr) = s.pages.kv_row_mut(l, own0 + i)?;
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
    /// page it owns up to its last token.
    fn attend(
        &self,
        s: &mut SeqWork<'_>,
        l: usize,
        geo: &AttnGeometry,
        p: &mut Pass<Self>,
    ) -> Result<(), ModelError> {
        let qw = geo.heads * geo.head_dim;
        let n = s.tokens.len();
        self.write_kv(s, l, geo.kv_heads * geo.head_dim, p)?;
        let blocks = self.blocks(s, l, geo.page_size)?;
        let r0 = s.row0;
        let (q, out) = (
            &p.q[r0 * qw..(r0 + n) * qw],
            &mut p.att[r0 * qw..(r0 + n) * qw],
        );
        if self.flash {
            flash_attention(geo, q, n, s.start, &blocks, out, geo.scale(), self.par);
        } else {
            paged_attention(geo, q, n, s.start, &blocks, out, self.par);
        }
        Ok(())
    }

    /// [`Self::attend`] for a decode step, every live sequence one token: the K/V rows are
    /// written sequence by sequence, then all of them attend at once
    /// ([`paged_attention_decode_many`]); the arithmetic per sequence is the same. A sequence
    /// whose write or read fails is marked failed; the others attend.
    fn attend_decode(
        &self,
        seqs: &mut [SeqWork<'_>],
        l: usize,
        geo: &AttnGeometry,
        p: &mut Pass<Self>,
    ) {
        for s in seqs.iter_mut().filter(|s| s.ok()) {
            if let Err(e) = self.write_kv(s, l, geo.kv_heads * geo.head_dim, p) {
                s.error = Some(e);
            }
        }
        let qw = geo.heads * geo.head_dim;
        let mut failed = Vec::new();
        {
            let mut outs: Vec<Option<&mut [f32]>> = p.att.chunks_exact_mut(qw).map(Some).collect();
            let mut live = Vec::new();
            for (i, s) in seqs.iter().enumerate().filter(|(_, s)| s.ok()) {
                match self.blocks(s, l, geo.page_size) {
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
            paged_attention_decode_many(geo, &mut queries, self.par);
        }
        for (i, e) in failed {
            seqs[i].error = Some(e);
        }
    }
}
