//! The transformer forward pass on the GPU for a batch of sequences, each with one or more
//! consecutive tokens: every matmul runs once over all rows; K/V go into each sequence's pages
//! and attention reads only the pages of its table, both generation-checked on the device.
//! Only the logits (one row per sequence) come back to the host.

use pagewarden_kernels::cuda::cudarc::driver::CudaSlice;
use pagewarden_kernels::cuda::{AttentionBatch, CudaBackend, DeviceMatrix, DeviceQ8Acts};
use pagewarden_kernels::quant::ActKind;

use super::error::{driver, GpuError};
use super::kv_store::KvRows;
use super::model::GpuModel;
use super::pages::GpuSequence;

/// The host-side plan of one step: which rows belong to which live sequence, and where each
/// row's K/V go.
#[derive(Default)]
struct Plan {
    /// Indices (into the batch) of the sequences that run.
    live: Vec<usize>,
    /// Per live sequence: its page table as the kernels take it.
    tables: Vec<Vec<(u32, u64)>>,
    /// Per live sequence: its last row.
    last_row: Vec<usize>,
    ids: Vec<u32>,
    pos: Vec<u32>,
    row_seq: Vec<u32>,
    row_page: Vec<u32>,
    row_slot: Vec<u32>,
    row_gen: Vec<u64>,
}

/// Scratch activations for `rows` rows.
struct Acts {
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    att: CudaSlice<f32>,
    proj: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    /// A quantized weight's matmul input, quantized to 8 bits as the CPU quantizes it.
    xq: DeviceQ8Acts,
}

/// `x` (`rows` rows of `ws[0].cols`) quantized to 8 bits into `buf` as the CPU quantizes it,
/// once for every quantized matrix in `ws` that reads it (q, k and v read one input, gate and
/// up another); `None` when activations stay f32 (`exact` off) or no matrix in `ws` is
/// quantized.
fn quantize_once<'a>(
    b: &CudaBackend,
    exact: bool,
    ws: &[&DeviceMatrix],
    x: &CudaSlice<f32>,
    rows: usize,
    buf: &'a mut DeviceQ8Acts,
) -> Result<Option<&'a DeviceQ8Acts>, GpuError> {
    let quantized = ws.iter().any(|w| w.ty.act_kind() != ActKind::Float);
    if !(exact && quantized) {
        return Ok(None);
    }
    b.quantize_q8(x, rows * ws[0].cols, buf)?;
    Ok(Some(buf))
}

/// `out = w · x` for `rows` rows. A quantized `w` multiplies `xq`, `x` quantized to 8 bits as
/// the CPU quantizes it, with the CPU's integer dot products (as llama.cpp and
/// `pagewarden_kernels::matmul` do), so both backends multiply the same numbers and pick the
/// same tokens; with no `xq` (`exact_acts` off) it multiplies `x` in f32.
fn mm(
    b: &CudaBackend,
    w: &DeviceMatrix,
    x: &CudaSlice<f32>,
    xq: Option<&DeviceQ8Acts>,
    rows: usize,
    out: &mut CudaSlice<f32>,
) -> Result<(), GpuError> {
    match xq {
        Some(xq) if w.ty.act_kind() != ActKind::Float => b.matmul_q8(w, xq, rows, out)?,
        Some(_) | None => b.matmul(w, x, rows, out)?,
    }
    Ok(())
}

impl GpuModel {
    /// Checks a sequence can run `tokens` now, growing its pages.
    fn admit(&mut self, seq: &mut GpuSequence, tokens: &[u32]) -> Result<(), GpuError> {
        if tokens.is_empty() {
            return Err(GpuError::EmptyInput);
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(GpuError::TokenOutOfRange {
                token: t,
                vocab: self.cfg.vocab,
            });
        }
        let end = seq.len + tokens.len();
        if end > self.cfg.context_length {
            return Err(GpuError::ContextExceeded {
                tokens: end,
                context: self.cfg.context_length,
            });
        }
        seq.grow(&mut self.book, end, self.opts.page_size)
            .map_err(|(needed, free)| GpuError::PoolExhausted { needed, free })
    }

    fn plan(
        &mut self,
        batch: &mut [(&mut GpuSequence, &[u32])],
        errors: &mut [Option<GpuError>],
    ) -> Plan {
        let ps = self.opts.page_size;
        let mut p = Plan::default();
        for (i, (seq, tokens)) in batch.iter_mut().enumerate() {
            if let Err(e) = self.admit(seq, tokens) {
                errors[i] = Some(e);
                continue;
            }
            let si = p.live.len() as u32;
            p.live.push(i);
            p.tables.push(seq.raw_table());
            for (j, &t) in tokens.iter().enumerate() {
                let pos = seq.len + j;
                let (page, gen) = seq.table[pos / ps];
                p.ids.push(t);
                p.pos.push(pos as u32);
                p.row_seq.push(si);
                p.row_page.push(page.0);
                p.row_slot.push((pos % ps) as u32);
                p.row_gen.push(gen.0);
            }
            p.last_row.push(p.ids.len() - 1);
        }
        p
    }

    fn acts(&self, rows: usize) -> Result<Acts, GpuError> {
        let b = &self.backend;
        let (dim, kvw, ffn) = (self.cfg.dim, self.cfg.kv_width(), self.cfg.ffn);
        Ok(Acts {
            x: b.zeros(rows * dim)?,
            xn: b.zeros(rows * dim)?,
            q: b.zeros(rows * dim)?,
            k: b.zeros(rows * kvw)?,
            v: b.zeros(rows * kvw)?,
            att: b.zeros(rows * dim)?,
            proj: b.zeros(rows * dim)?,
            gate: b.zeros(rows * ffn)?,
            up: b.zeros(rows * ffn)?,
            xq: b.q8_acts(rows * dim.max(ffn))?,
        })
    }

    /// Runs the batch. Outer error: the device failed (the whole step is lost). Inner: per
    /// sequence, the logits of its last token or why it was refused (its length unchanged).
    pub(crate) fn forward(
        &mut self,
        batch: &mut [(&mut GpuSequence, &[u32])],
    ) -> Result<Vec<Result<Vec<f32>, GpuError>>, GpuError> {
        let mut errors: Vec<Option<GpuError>> = batch.iter().map(|_| None).collect();
        let plan = self.plan(batch, &mut errors);
        // Generations bumped by allocations, releases and revocations reach the device first.
        let (ids, gens) = self.book.take_updates();
        if !ids.is_empty() {
            self.backend.set_generations(&mut self.pool, &ids, &gens)?;
        }
        let mut logits = Vec::new();
        let mut faults = Vec::new();
        if !plan.live.is_empty() {
            let (l, f) = self.run(&plan)?;
            logits = l;
            faults = f;
        }
        let vocab = self.cfg.vocab;
        let mut out: Vec<Result<Vec<f32>, GpuError>> = errors
            .into_iter()
            .map(|e| Err(e.unwrap_or(GpuError::EmptyInput)))
            .collect();
        for (j, &i) in plan.live.iter().enumerate() {
            out[i] = match faults[j] {
                Some(fault) => Err(GpuError::PageFault(fault)),
                None => {
                    let (seq, tokens) = &mut batch[i];
                    seq.len += tokens.len();
                    Ok(logits[j * vocab..(j + 1) * vocab].to_vec())
                }
            };
        }
        Ok(out)
    }

    /// Launches the whole step and reads back the logits and the per-sequence fault flags.
    #[allow(clippy::type_complexity)]
    fn run(
        &mut self,
        plan: &Plan,
    ) -> Result<(Vec<f32>, Vec<Option<pagewarden_kernels::cuda::PageFault>>), GpuError> {
        let cfg = self.cfg.clone();
        let b: &CudaBackend = &self.backend;
        let rows = plan.ids.len();
        let nseq = plan.live.len();
        let (dim, ffn, eps) = (cfg.dim, cfg.ffn, cfg.rms_eps);
        let pos = b.upload(&plan.pos)?;
        let (row_seq, row_page) = (b.upload(&plan.row_seq)?, b.upload(&plan.row_page)?);
        let (row_slot, row_gen) = (b.upload(&plan.row_slot)?, b.upload(&plan.row_gen)?);
        let kv_rows = KvRows {
            seq: &row_seq,
            page: &row_page,
            slot: &row_slot,
            gen: &row_gen,
            rows,
        };
        let mut flags: CudaSlice<u32> = b.zeros(nseq)?;
        let tables: Vec<&[(u32, u64)]> = plan.tables.iter().map(Vec::as_slice).collect();
        let queries: Vec<(u32, u32)> = plan
            .row_seq
            .iter()
            .copied()
            .zip(plan.pos.iter().copied())
            .collect();
        let mut a = self.acts(rows)?;
        let w = &self.weights;
        let exact = self.exact_acts;
        b.get_rows(&w.token_embd, &plan.ids, &mut a.x)?;
        for (l, lw) in w.layers.iter().enumerate() {
            b.rms_norm(&a.x, &lw.attn_norm, eps, rows, &mut a.xn)?;
            let xq = quantize_once(b, exact, &[&lw.wq, &lw.wk, &lw.wv], &a.xn, rows, &mut a.xq)?;
            mm(b, &lw.wq, &a.xn, xq, rows, &mut a.q)?;
            mm(b, &lw.wk, &a.xn, xq, rows, &mut a.k)?;
            mm(b, &lw.wv, &a.xn, xq, rows, &mut a.v)?;
            b.rope(&self.rope, &mut a.q, &pos, cfg.heads)?;
            b.rope(&self.rope, &mut a.k, &pos, cfg.kv_heads)?;
            self.kv
                .store(b, &mut self.pool, l, &a.k, &a.v, &kv_rows, &mut flags)?;
            let att = AttentionBatch {
                heads: cfg.heads,
                layer: l,
                tables: &tables,
                queries: &queries,
            };
            b.paged_attention(&self.pool, &att, &a.q, &mut a.att, &mut flags)?;
            let xq = quantize_once(b, exact, &[&lw.wo], &a.att, rows, &mut a.xq)?;
            mm(b, &lw.wo, &a.att, xq, rows, &mut a.proj)?;
            b.add(&mut a.x, &a.proj, rows * dim)?;
            b.rms_norm(&a.x, &lw.ffn_norm, eps, rows, &mut a.xn)?;
            let xq = quantize_once(b, exact, &[&lw.gate, &lw.up], &a.xn, rows, &mut a.xq)?;
            mm(b, &lw.gate, &a.xn, xq, rows, &mut a.gate)?;
            mm(b, &lw.up, &a.xn, xq, rows, &mut a.up)?;
            b.swiglu(&mut a.gate, &a.up, rows * ffn)?;
            let xq = quantize_once(b, exact, &[&lw.down], &a.gate, rows, &mut a.xq)?;
            mm(b, &lw.down, &a.gate, xq, rows, &mut a.proj)?;
            b.add(&mut a.x, &a.proj, rows * dim)?;
        }
        // Logits of each sequence's last row only.
        let last = if rows == nseq {
            a.x
        } else {
            let mut last: CudaSlice<f32> = b.zeros(nseq * dim)?;
            for (j, &r) in plan.last_row.iter().enumerate() {
                let src = a.x.slice(r * dim..(r + 1) * dim);
                let mut dst = last.slice_mut(j * dim..(j + 1) * dim);
                b.stream()
                    .memcpy_dtod(&src, &mut dst)
                    .map_err(driver("gathering last rows"))?;
            }
            last
        };
        let mut lastn: CudaSlice<f32> = b.zeros(nseq * dim)?;
        b.rms_norm(&last, &w.output_norm, eps, nseq, &mut lastn)?;
        let mut logits: CudaSlice<f32> = b.zeros(nseq * cfg.vocab)?;
        let xq = quantize_once(b, exact, &[w.output()], &lastn, nseq, &mut a.xq)?;
        mm(b, w.output(), &lastn, xq, nseq, &mut logits)?;
        let host = b.download(&logits)?;
        let faults = b.read_faults(&flags)?;
        Ok((host, faults))
    }
}
