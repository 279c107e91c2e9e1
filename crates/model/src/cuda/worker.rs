//! `GpuWorker`: the GPU engine of a prefill or decode worker. Page ownership, grants, commit
//! verification and generations stay in the host [`KvPool`], the authority exactly as on the
//! CPU path; the page *data* the model reads and writes lives in a device pool that mirrors the
//! host pool page for page (device page `i` is host `PageId(i)`).
//!
//! - Before every step, the device generation of every page the step touches is set to the
//!   host pool's current one, so a page revoked or reallocated on the host fails its old
//!   owner's step on the device (I1), as `ReadablePages::layer_block` does on the CPU.
//! - Prefill: [`GpuWorker::download_pages`] copies pages device → pinned host staging → owned
//!   buffers (the transfer frames, whose checksums the sender computes as on the CPU).
//! - Decode: frames land in the host pool and are verified there (I2: counts, checksums, guard
//!   words, generations); a committed page is copied host → pinned staging → device the first
//!   time a step needs it. Residency is keyed by `(page, generation)`, so a reallocated page is
//!   never taken for resident.

use half::f16;
use pagewarden_kernels::cuda::cudarc::driver::PinnedHostSlice;
use pagewarden_kernels::cuda::CudaBackend;
use pagewarden_kvcache::{Generation, KvPool, PageId, ReadError, ReadablePages};
use std::sync::Arc;

use crate::llama::Model;

use super::error::{driver, GpuError};
use super::model::{GpuModel, GpuOptions};
use super::pages::{DevicePageId, GpuSequence, PageGeneration};

/// How to open a [`GpuWorker`].
#[derive(Clone, Debug)]
pub struct GpuWorkerOptions {
    /// GPU ordinal (`cuda:N`).
    pub device: usize,
    /// Largest number of prompt tokens run through one forward pass.
    pub prefill_chunk: usize,
    /// Pages the pinned staging buffer holds (one transfer batch).
    pub staging_pages: usize,
    /// Zero a sequence's device pages before its prefill writes them (the device side of
    /// `zero_on_release`: a page's unused tail never carries an earlier tenant's K/V).
    pub zero_new_pages: bool,
}

/// Host memory between the device pool and the host's frames: pinned (page-locked, so copies
/// are DMA) unless the driver refused it, then ordinary memory (correct, slower).
enum Staging {
    Pinned(PinnedHostSlice<f16>),
    /// Ordinary memory, and why pinned memory was refused.
    Pageable(Vec<f16>, String),
}

impl Staging {
    fn new(model: &GpuModel, elems: usize) -> Staging {
        // SAFETY: the buffer is only read back after a copy into it has filled that region.
        let pinned = unsafe {
            model
                .backend
                .context()
                .alloc_pinned_with_flags::<f16>(elems, 0)
        };
        match pinned {
            Ok(p) => Staging::Pinned(p),
            Err(e) => Staging::Pageable(vec![f16::ZERO; elems], e.to_string()),
        }
    }

    fn as_mut_slice(&mut self) -> Result<&mut [f16], GpuError> {
        match self {
            Staging::Pinned(p) => p
                .as_mut_slice()
                .map_err(driver("waiting for the staging buffer")),
            Staging::Pageable(v, _) => Ok(v),
        }
    }
}

/// A model on one GPU over a device mirror of a host [`KvPool`].
pub struct GpuWorker {
    model: GpuModel,
    pool: KvPool,
    staging: Staging,
    staging_pages: usize,
    /// Per page, the generation whose data is on the device (0: none; 0 is never owned).
    resident: Vec<u64>,
    zero_new_pages: bool,
}

impl std::fmt::Debug for GpuWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuWorker")
            .field("model", &self.model)
            .field("staging_pages", &self.staging_pages)
            .finish()
    }
}

fn bytes_of(s: &[f16]) -> &[u8] {
    // SAFETY: f16 is two plain bytes (repr(transparent) over u16), alignment 2 >= 1.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

fn bytes_of_mut(s: &mut [f16]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`; every byte pattern is a valid f16.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

impl GpuWorker {
    /// Opens GPU `opts.device`, uploads `model`'s weights and allocates a device pool of
    /// `pool.capacity_pages()` pages shaped like `pool.layout()`. Fails with a clear error (no
    /// panic) when there is no driver, no such GPU, or the kernels cannot be loaded.
    pub fn new(
        model: &Model,
        pool: KvPool,
        opts: &GpuWorkerOptions,
    ) -> Result<GpuWorker, GpuError> {
        let layout = pool.layout();
        let want = model.kv_layout(layout.page_size);
        if want != layout {
            return Err(GpuError::Layout(format!(
                "host pool pages are {layout:?}, the model needs {want:?}"
            )));
        }
        let backend = Arc::new(CudaBackend::new(opts.device)?);
        let pages = pool.capacity_pages();
        let gpu_opts = GpuOptions {
            pages,
            page_size: layout.page_size,
            prefill_chunk: opts.prefill_chunk,
        };
        let model = GpuModel::new_mirrored(model, backend, &gpu_opts)?;
        let staging_pages = opts.staging_pages.max(1);
        let elems = staging_pages * model.pool.shape.page_elems();
        let staging = Staging::new(&model, elems);
        Ok(GpuWorker {
            model,
            pool,
            staging,
            staging_pages,
            resident: vec![0; pages],
            zero_new_pages: opts.zero_new_pages,
        })
    }

    /// The GPU model.
    pub fn model(&self) -> &GpuModel {
        &self.model
    }

    /// GPU name and architecture, for the start-up log.
    pub fn describe(&self) -> String {
        let b = &self.model.backend;
        let staging = match &self.staging {
            Staging::Pinned(_) => "pinned staging".to_string(),
            Staging::Pageable(_, why) => format!("pageable staging (pinned refused: {why})"),
        };
        format!(
            "{} ({}, PTX {:?}, {staging})",
            b.name().unwrap_or_else(|e| format!("unnamed GPU: {e}")),
            b.arch(),
            b.ptx_source()
        )
    }

    /// Runs `tokens` after the `pages.len()` tokens already in `pages`, writing their K/V into
    /// the device mirror of `pages`; returns the logits of the last position. On success
    /// `pages.len()` grows by `tokens.len()`.
    pub fn prefill(
        &mut self,
        pages: &mut ReadablePages,
        tokens: &[u32],
    ) -> Result<Vec<f32>, GpuError> {
        self.bind()?;
        let end = pages.len() + tokens.len();
        pages.grow(end)?;
        if self.zero_new_pages && pages.is_empty() {
            let ids: Vec<u32> = pages.table().iter().map(|(p, _)| p.0).collect();
            self.model.backend.zero_pages(&mut self.model.pool, &ids)?;
        }
        self.sync_generations(std::slice::from_ref(&&*pages))?;
        let mut seq = sequence(pages);
        let logits = self.model.prefill(&mut seq, tokens)??;
        pages.set_len(seq.len());
        // The device holds these pages' K/V at their generations now: a decode step reads them
        // as they are (decode recomputing a preempted sequence; the host copy was never written).
        let ps = self.pool.layout().page_size;
        for &(p, g) in &pages.table()[..pages.len().div_ceil(ps)] {
            self.resident[p.index()] = g.0;
        }
        Ok(logits)
    }

    /// One batched decode step: each sequence gets one token at position `pages.len()`. A
    /// refused page table (host or device check) fails only that sequence; a device failure
    /// fails every sequence of the step.
    pub fn decode_step(
        &mut self,
        batch: &mut [(&mut ReadablePages, u32)],
    ) -> Vec<Result<Vec<f32>, GpuError>> {
        let mut out: Vec<Option<Result<Vec<f32>, GpuError>>> = batch.iter().map(|_| None).collect();
        if let Err(e) = self.bind() {
            return batch
                .iter()
                .map(|_| Err(GpuError::Step(e.to_string())))
                .collect();
        }
        let mut live = Vec::new();
        for (i, (pages, _)) in batch.iter_mut().enumerate() {
            let ready = pages
                .grow(pages.len() + 1)
                .map_err(GpuError::from)
                .and_then(|()| self.make_resident(pages));
            match ready {
                Ok(()) => live.push(i),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let views: Vec<&ReadablePages> = live.iter().map(|&i| &*batch[i].0).collect();
        if let Err(e) = self.sync_generations(&views) {
            return batch
                .iter()
                .map(|_| Err(GpuError::Step(e.to_string())))
                .collect();
        }
        let mut seqs: Vec<GpuSequence> = live.iter().map(|&i| sequence(batch[i].0)).collect();
        let mut work: Vec<(&mut GpuSequence, u32)> = seqs
            .iter_mut()
            .zip(&live)
            .map(|(s, &i)| (s, batch[i].1))
            .collect();
        match self.model.decode_step(&mut work) {
            Ok(results) => {
                for ((r, seq), &i) in results.into_iter().zip(&seqs).zip(&live) {
                    if r.is_ok() {
                        let pages = &mut *batch[i].0;
                        pages.set_len(seq.len());
                        for &(p, g) in pages.table() {
                            self.resident[p.index()] = g.0;
                        }
                    }
                    out[i] = Some(r);
                }
            }
            Err(e) => {
                let msg = e.to_string();
                for &i in &live {
                    out[i] = Some(Err(GpuError::Step(msg.clone())));
                }
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Err(GpuError::EmptyInput)))
            .collect()
    }

    /// Copies pages `indices` of `pages` from the device through the pinned staging buffer into
    /// owned buffers (`page_bytes` each, the host layout). Each page's generation is checked
    /// against the host pool first, as `ReadablePages::page_bytes` does on the CPU.
    pub fn download_pages(
        &mut self,
        pages: &ReadablePages,
        indices: &[usize],
    ) -> Result<Vec<Vec<u8>>, GpuError> {
        self.bind()?;
        let pe = self.model.pool.shape.page_elems();
        let mut ids = Vec::with_capacity(indices.len());
        for &i in indices {
            let &(page, expected) = pages.table().get(i).ok_or(ReadError::OutOfRange)?;
            self.check_current(page, expected)?;
            ids.push(page.0 as usize);
        }
        let mut frames = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(self.staging_pages) {
            let buf = self.staging.as_mut_slice()?;
            for (j, &id) in chunk.iter().enumerate() {
                let src = self.model.pool.data.slice(id * pe..(id + 1) * pe);
                self.model
                    .backend
                    .stream()
                    .memcpy_dtoh(&src, &mut buf[j * pe..(j + 1) * pe])
                    .map_err(driver("copying a page to pinned memory"))?;
            }
            self.model.backend.synchronize()?;
            for j in 0..chunk.len() {
                frames.push(bytes_of(&buf[j * pe..(j + 1) * pe]).to_vec());
            }
        }
        Ok(frames)
    }

    /// cudarc binds the context on most calls; bind once more for the calling thread (steps
    /// run on whichever blocking thread the runtime picks).
    fn bind(&self) -> Result<(), GpuError> {
        self.model
            .backend
            .context()
            .bind_to_thread()
            .map_err(driver("binding the CUDA context"))
    }

    fn check_current(&self, page: PageId, expected: Generation) -> Result<(), GpuError> {
        match self.pool.generation(page) {
            Some(current) if current == expected => Ok(()),
            Some(current) => Err(GpuError::HostRead(ReadError::GenerationMismatch {
                page,
                expected,
                current,
            })),
            None => Err(GpuError::HostRead(ReadError::OutOfRange)),
        }
    }

    /// Copies the host's committed pages of a sequence (those holding its first `len` tokens)
    /// to the device unless they are resident at this generation already.
    fn make_resident(&mut self, pages: &ReadablePages) -> Result<(), GpuError> {
        let ps = self.pool.layout().page_size;
        let filled = pages.len().div_ceil(ps);
        let missing: Vec<usize> = (0..filled)
            .filter(|&i| {
                let (p, g) = pages.table()[i];
                self.resident[p.index()] != g.0
            })
            .collect();
        let pe = self.model.pool.shape.page_elems();
        for chunk in missing.chunks(self.staging_pages) {
            let buf = self.staging.as_mut_slice()?;
            for (j, &i) in chunk.iter().enumerate() {
                // Generation-checked host read of the verified page (I1 on the host side).
                let src = pages.page_bytes(i)?;
                bytes_of_mut(&mut buf[j * pe..(j + 1) * pe]).copy_from_slice(src);
            }
            for (j, &i) in chunk.iter().enumerate() {
                let id = pages.table()[i].0.index();
                let mut dst = self.model.pool.data.slice_mut(id * pe..(id + 1) * pe);
                self.model
                    .backend
                    .stream()
                    .memcpy_htod(&buf[j * pe..(j + 1) * pe], &mut dst)
                    .map_err(driver("copying a page to the device"))?;
            }
            self.model.backend.synchronize()?;
            for &i in chunk {
                let (p, g) = pages.table()[i];
                self.resident[p.index()] = g.0;
            }
        }
        Ok(())
    }

    /// Sets the device generation of every page of `seqs` to the host pool's current one.
    fn sync_generations(&mut self, seqs: &[&ReadablePages]) -> Result<(), GpuError> {
        let mut ids = Vec::new();
        let mut gens = Vec::new();
        for s in seqs {
            for &(p, _) in s.table() {
                if let Some(g) = self.pool.generation(p) {
                    ids.push(p.0);
                    gens.push(g.0);
                }
            }
        }
        self.model
            .backend
            .set_generations(&mut self.model.pool, &ids, &gens)?;
        Ok(())
    }
}

/// The device view of a host sequence: the same page ids and generations.
fn sequence(pages: &ReadablePages) -> GpuSequence {
    GpuSequence {
        table: pages
            .table()
            .iter()
            .map(|&(p, g)| (DevicePageId(p.0), PageGeneration(g.0)))
            .collect(),
        len: pages.len(),
    }
}
