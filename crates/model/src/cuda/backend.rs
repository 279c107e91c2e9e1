//! `Gpu`: the [`Backend`] of one CUDA device. Activations live in device buffers; the weights
//! are the model's, uploaded once ([`DeviceWeights`]) and found by the host view the forward
//! pass names; K/V pages are the host pool's (device page `i` is kvcache's `PageId(i)`), their
//! data in a [`DeviceKvPool`] whose generations the worker keeps equal to the host pool's, so
//! the device's write and attention kernels refuse a page its sequence no longer owns (I1).
//!
//! What the device refuses is flagged per sequence during the pass and read back once, at
//! [`Backend::finish`]: a refused sequence fails with [`ModelError::DevicePageFault`] and its
//! length is unchanged.

use std::cell::RefCell;
use std::collections::HashMap;

use half::f16;
use pagewarden_kernels::cuda::cudarc::driver::CudaSlice;
use pagewarden_kernels::cuda::{
    AttentionBatch, CudaBackend, CudaError, DeviceKvPool, DeviceMatrix,
};
use pagewarden_kernels::rope::Rope;
use pagewarden_kernels::{AttnGeometry, QMatrix};
use pagewarden_kvcache::KvPool;

use super::error::{driver, GpuError};
use super::kv_store::{KvRows, KvStore};
use crate::arch::LayerExtra;
use crate::backend::{Backend, Glu};
use crate::llama::forward::{Pass, SeqWork};
use crate::llama::ModelError;
use crate::weights::LlamaWeights;

/// A host tensor's identity: the address and length of the bytes the model borrows (from the
/// file's mapping or its own vectors), which never move while the model lives.
type HostKey = (usize, usize);

fn key_of<T>(s: &[T]) -> HostKey {
    (s.as_ptr() as usize, std::mem::size_of_val(s))
}

/// Every weight of a model on the device, found by its host view.
pub(crate) struct DeviceWeights {
    matrices: HashMap<HostKey, DeviceMatrix>,
    vectors: HashMap<HostKey, CudaSlice<f32>>,
    /// The CPU's f16 GELU table (GeGLU's bits).
    pub(crate) gelu: CudaSlice<f16>,
}

impl DeviceWeights {
    /// Uploads `w` (once; about the size of the model file). Fails on a weight type the
    /// device has no kernel for.
    pub(crate) fn upload(b: &CudaBackend, w: &LlamaWeights<'_>) -> Result<DeviceWeights, GpuError> {
        let mut d = DeviceWeights {
            matrices: HashMap::new(),
            vectors: HashMap::new(),
            gelu: b.upload(&pagewarden_kernels::activation::gelu_table()[..])?,
        };
        d.matrix(b, &w.token_embd)?;
        d.matrix(b, &w.output)?;
        d.vector(b, &w.output_norm)?;
        for l in &w.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down] {
                d.matrix(b, m)?;
            }
            d.vector(b, &l.attn_norm)?;
            d.vector(b, &l.ffn_norm)?;
            if let Some(bias) = &l.qkv_bias {
                for v in [&bias.q, &bias.k, &bias.v] {
                    d.vector(b, v)?;
                }
            }
            if let Some(n) = &l.qk_norm {
                d.vector(b, &n.q)?;
                d.vector(b, &n.k)?;
            }
            match &l.extra {
                LayerExtra::Llama => {}
                LayerExtra::Gemma3(n) => {
                    for v in [&n.q_norm, &n.k_norm, &n.post_attn, &n.post_ffn] {
                        d.vector(b, v)?;
                    }
                }
            }
        }
        Ok(d)
    }

    fn matrix(&mut self, b: &CudaBackend, m: &QMatrix<'_>) -> Result<(), GpuError> {
        if let std::collections::hash_map::Entry::Vacant(e) = self.matrices.entry(key_of(m.data)) {
            e.insert(b.upload_matrix(m)?);
        }
        Ok(())
    }

    fn vector(&mut self, b: &CudaBackend, v: &[f32]) -> Result<(), GpuError> {
        if let std::collections::hash_map::Entry::Vacant(e) = self.vectors.entry(key_of(v)) {
            e.insert(b.upload(v)?);
        }
        Ok(())
    }

    fn find_matrix(&self, m: &QMatrix<'_>) -> Result<&DeviceMatrix, CudaError> {
        self.matrices
            .get(&key_of(m.data))
            .ok_or_else(|| unknown("matrix"))
    }

    fn find_vector(&self, v: &[f32]) -> Result<&CudaSlice<f32>, CudaError> {
        self.vectors
            .get(&key_of(v))
            .ok_or_else(|| unknown("vector"))
    }
}

fn unknown(what: &str) -> CudaError {
    CudaError::Shape {
        op: "weights",
        why: format!("a {what} the model did not upload"),
    }
}

/// Activations on the device: the first `len` floats of `data` (a buffer shrinks by its
/// length; its memory stays until it is dropped).
pub(crate) struct DeviceBuf {
    data: CudaSlice<f32>,
    len: usize,
}

/// The per-pass state: where each row's K/V go, each sequence's table, its fault flags.
pub(crate) struct GpuStep {
    /// One flag word per sequence of the pass (sequence `i` of `seqs`).
    flags: CudaSlice<u32>,
    /// Per sequence: its pages (prefix first) and the generations it presents; empty for a
    /// sequence refused before the pass.
    tables: Vec<Vec<(u32, u64)>>,
    /// Per row of the pass: (sequence, position).
    queries: Vec<(u32, u32)>,
    /// Each row's K/V destination, uploaded once for every layer.
    seq: CudaSlice<u32>,
    page: CudaSlice<u32>,
    slot: CudaSlice<u32>,
    gen: CudaSlice<u64>,
    kv_rows: usize,
}

impl Gpu<'_> {
    /// Before a pass: the device generation of every page the live sequences present (prefix
    /// pages too) set to the host pool's current one, so a page revoked or reallocated on the
    /// host fails its old owner on the device (I1); and, with `zero_new_pages`, the own pages
    /// of a sequence nothing was written to yet zeroed.
    fn sync_pages(&self, seqs: &[SeqWork<'_>]) -> Result<(), GpuError> {
        let (mut ids, mut gens, mut fresh) = (Vec::new(), Vec::new(), Vec::new());
        for s in seqs.iter().filter(|s| s.ok()) {
            let own = s.pages.table().iter();
            let prefix = s.prefix.map(|p| p.table().iter()).into_iter().flatten();
            for &(p, _) in prefix.chain(own) {
                if let Some(g) = self.host.generation(p) {
                    ids.push(p.0);
                    gens.push(g.0);
                }
            }
            if self.zero_new_pages && s.pages.is_empty() {
                fresh.extend(s.pages.table().iter().map(|(p, _)| p.0));
            }
        }
        let mut pool = self.pool.borrow_mut();
        self.cuda.zero_pages(&mut pool, &fresh)?;
        self.cuda.set_generations(&mut pool, &ids, &gens)?;
        Ok(())
    }
}

/// One CUDA device running a model's forward pass.
pub(crate) struct Gpu<'w> {
    pub(crate) cuda: &'w CudaBackend,
    pub(crate) weights: &'w DeviceWeights,
    pub(crate) kv: &'w KvStore,
    pub(crate) pool: RefCell<&'w mut DeviceKvPool>,
    /// The host pool that owns the pages: each pass sets the device generation of every page
    /// it touches to this pool's current one first.
    pub(crate) host: &'w KvPool,
    /// Zero a sequence's own pages before its first pass writes them (the device side of
    /// `zero_on_release`: a page's unused tail never carries an earlier tenant's K/V).
    pub(crate) zero_new_pages: bool,
    /// Quantized matmuls see activations through the CPU's Q8 rounding (off:
    /// [`super::FLOAT_ACTS_ENV`]).
    pub(crate) exact_acts: bool,
}

impl Backend for Gpu<'_> {
    type Buf = DeviceBuf;
    type Error = GpuError;
    type Step = GpuStep;

    fn len(x: &DeviceBuf) -> usize {
        x.len
    }

    fn zeros(&self, len: usize) -> Result<DeviceBuf, GpuError> {
        Ok(DeviceBuf {
            data: self.cuda.zeros(len.max(1))?,
            len,
        })
    }

    fn begin(&self, seqs: &[SeqWork<'_>]) -> Result<GpuStep, GpuError> {
        self.sync_pages(seqs)?;
        let mut tables = Vec::with_capacity(seqs.len());
        let mut queries = Vec::new();
        let (mut seq, mut page, mut slot, mut gen) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, s) in seqs.iter().enumerate() {
            let mut table: Vec<(u32, u64)> = Vec::new();
            if s.ok() {
                let own = s.pages.table().iter();
                let prefix = s.prefix.map(|p| p.table().iter()).into_iter().flatten();
                table.extend(prefix.chain(own).map(|&(p, g)| (p.0, g.0)));
            }
            let ps = s.pages.layout().page_size;
            for t in 0..s.tokens.len() {
                let pos = s.start + t;
                queries.push((i as u32, pos as u32));
                // One entry per row of the pass (the kernel's row is the K/V buffers' row); a
                // refused sequence's rows name no page, which the kernel skips.
                let (p, g) = table.get(pos / ps).copied().unwrap_or((u32::MAX, 0));
                seq.push(i as u32);
                page.push(p);
                slot.push((pos % ps) as u32);
                gen.push(g);
            }
            tables.push(table);
        }
        let kv_rows = seq.len();
        // Empty uploads still need a valid pointer.
        let up32 = |v: &Vec<u32>| self.cuda.upload(if v.is_empty() { &[0][..] } else { v });
        Ok(GpuStep {
            flags: self.cuda.zeros(seqs.len().max(1))?,
            seq: up32(&seq)?,
            page: up32(&page)?,
            slot: up32(&slot)?,
            gen: self
                .cuda
                .upload(if gen.is_empty() { &[0][..] } else { &gen })?,
            kv_rows,
            tables,
            queries,
        })
    }

    fn embed(
        &self,
        table: &QMatrix<'_>,
        rows: &[(usize, u32)],
        scale: Option<f32>,
        out: &mut DeviceBuf,
    ) -> Result<(), GpuError> {
        // Every row of the pass gets a row; those of refused sequences (token 0) are not used.
        let n = out.len / table.cols;
        let mut ids = vec![0u32; n];
        for &(r, t) in rows {
            ids[r] = t;
        }
        self.cuda
            .get_rows(self.weights.find_matrix(table)?, &ids, &mut out.data)?;
        if let Some(s) = scale {
            self.cuda.scale(&mut out.data, s, out.len)?;
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &DeviceBuf,
        w: &[f32],
        eps: f32,
        out: &mut DeviceBuf,
    ) -> Result<(), GpuError> {
        let rows = x.len / w.len();
        let w = self.weights.find_vector(w)?;
        Ok(self.cuda.rms_norm(&x.data, w, eps, rows, &mut out.data)?)
    }

    fn matmul_many(
        &self,
        ws: &[QMatrix<'_>],
        x: &DeviceBuf,
        rows: usize,
        outs: &mut [&mut DeviceBuf],
    ) -> Result<(), GpuError> {
        if rows == 0 {
            // A pass whose rows all only fill the cache asks for no logits.
            return Ok(());
        }
        let dws = ws
            .iter()
            .map(|w| self.weights.find_matrix(w))
            .collect::<Result<Vec<_>, _>>()?;
        // The activations quantized once, as the CPU quantizes them, for every matrix whose
        // type has the CPU's 8-bit product on the device; the others take them as f32.
        let xq = match self.exact_acts && dws.iter().any(|d| d.takes_q8_acts()) {
            true => {
                let n = rows * ws[0].cols;
                let mut q = self.cuda.q8_acts(n)?;
                self.cuda.quantize_q8(&x.data, n, &mut q)?;
                Some(q)
            }
            false => None,
        };
        for (dw, out) in dws.iter().zip(outs.iter_mut()) {
            match &xq {
                Some(q) if dw.takes_q8_acts() => self.cuda.matmul_q8(dw, q, rows, &mut out.data)?,
                Some(_) | None => self.cuda.matmul(dw, &x.data, rows, &mut out.data)?,
            }
        }
        Ok(())
    }

    fn add_rows(&self, x: &mut DeviceBuf, bias: &[f32]) -> Result<(), GpuError> {
        let bias = self.weights.find_vector(bias)?;
        Ok(self.cuda.add_rows(&mut x.data, bias, x.len)?)
    }

    fn add(&self, x: &mut DeviceBuf, y: &DeviceBuf) -> Result<(), GpuError> {
        Ok(self.cuda.add(&mut x.data, &y.data, x.len)?)
    }

    fn scale(&self, x: &mut DeviceBuf, s: f32) -> Result<(), GpuError> {
        Ok(self.cuda.scale(&mut x.data, s, x.len)?)
    }

    fn softcap(&self, x: &mut DeviceBuf, cap: f32) -> Result<(), GpuError> {
        Ok(self.cuda.softcap(&mut x.data, cap, x.len)?)
    }

    fn rope(
        &self,
        rope: &Rope,
        table: &[Vec<(f32, f32)>],
        neox: bool,
        q: &mut DeviceBuf,
        k: &mut DeviceBuf,
    ) -> Result<(), GpuError> {
        let rows = table.len();
        if rows == 0 {
            return Ok(());
        }
        let cs: Vec<f32> = table.iter().flatten().flat_map(|&(c, s)| [c, s]).collect();
        let cs = self.cuda.upload(&cs)?;
        let hd = rope.head_dim;
        self.cuda
            .rope_rows(rope, &cs, rows, neox, &mut q.data, q.len / rows / hd)?;
        self.cuda
            .rope_rows(rope, &cs, rows, neox, &mut k.data, k.len / rows / hd)?;
        Ok(())
    }

    fn glu(&self, act: Glu, gate: &mut DeviceBuf, up: &DeviceBuf) -> Result<(), GpuError> {
        match act {
            Glu::Silu => self.cuda.swiglu(&mut gate.data, &up.data, gate.len)?,
            Glu::Gelu => self
                .cuda
                .geglu(&mut gate.data, &up.data, &self.weights.gelu, gate.len)?,
        }
        Ok(())
    }

    fn keep_rows(&self, x: &mut DeviceBuf, width: usize, rows: &[usize]) -> Result<(), GpuError> {
        let mut kept = self.zeros(rows.len() * width)?;
        for (i, &r) in rows.iter().enumerate() {
            let src = x.data.slice(r * width..(r + 1) * width);
            let mut dst = kept.data.slice_mut(i * width..(i + 1) * width);
            self.cuda
                .stream()
                .memcpy_dtod(&src, &mut dst)
                .map_err(driver("gathering rows"))?;
        }
        *x = kept;
        Ok(())
    }

    fn truncate(&self, x: &mut DeviceBuf, len: usize) -> Result<(), GpuError> {
        x.len = x.len.min(len);
        Ok(())
    }

    fn attention(
        &self,
        step: &mut GpuStep,
        layer: usize,
        geo: &AttnGeometry,
        _: &mut [SeqWork<'_>],
        p: &mut Pass<Self>,
    ) -> Result<(), GpuError> {
        let mut pool = self.pool.borrow_mut();
        let rows = KvRows {
            seq: &step.seq,
            page: &step.page,
            slot: &step.slot,
            gen: &step.gen,
            rows: step.kv_rows,
        };
        self.kv.store(
            self.cuda,
            &mut pool,
            layer,
            &p.k.data,
            &p.v.data,
            &rows,
            &mut step.flags,
        )?;
        let tables: Vec<&[(u32, u64)]> = step.tables.iter().map(Vec::as_slice).collect();
        let batch = AttentionBatch {
            heads: geo.heads,
            layer,
            tables: &tables,
            queries: &step.queries,
            window: geo.window,
            scale: geo.score_scale,
        };
        self.cuda
            .paged_attention(&pool, &batch, &p.q.data, &mut p.att.data, &mut step.flags)?;
        Ok(())
    }

    fn finish(&self, step: GpuStep, seqs: &mut [SeqWork<'_>]) -> Result<(), GpuError> {
        let faults = self.cuda.read_faults(&step.flags)?;
        for (s, f) in seqs.iter_mut().zip(faults) {
            if let (Some(f), true) = (f, s.ok()) {
                s.error = Some(ModelError::DevicePageFault(f.to_string()));
            }
        }
        Ok(())
    }

    fn to_host(&self, x: DeviceBuf) -> Result<Vec<f32>, GpuError> {
        let mut v = self.cuda.download(&x.data)?;
        v.truncate(x.len);
        Ok(v)
    }
}
