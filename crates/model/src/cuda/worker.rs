//! `GpuWorker`: the GPU engine of a prefill or decode worker. It runs the model's one forward
//! pass (`llama/forward.rs`) on the device's [`Gpu`] backend. Page ownership, grants, commit
//! verification and generations stay in the host [`KvPool`], the authority exactly as on the
//! CPU path; the page *data* the model reads and writes lives in a device pool that mirrors the
//! host pool page for page (device page `i` is host `PageId(i)`).
//!
//! - Before every pass, the device generation of every page the pass touches is set to the
//!   host pool's current one (`Gpu::sync_pages`), so a page revoked or reallocated on the host
//!   fails its old owner's pass on the device (I1), as `ReadablePages::layer_block` does on
//!   the CPU.
//! - Prefill: [`GpuWorker::download_pages`] copies pages device → pinned host staging → owned
//!   buffers (the transfer frames, whose checksums the sender computes as on the CPU), a
//!   sequence's own pages or a cached prefix's. A cached prefix's pages are the pages a GPU
//!   pass wrote, at the same generation: resident, attended over where they are.
//! - Decode: frames land in the host pool and are verified there (I2: counts, checksums, guard
//!   words, generations); a committed page (a sequence's or a cached prefix's) is copied host →
//!   pinned staging → device the first time a step needs it. Residency is keyed by `(page,
//!   generation)`, so a reallocated page is never taken for resident.

use std::cell::RefCell;
use std::sync::Arc;

use half::f16;
use pagewarden_kernels::cuda::cudarc::driver::PinnedHostSlice;
use pagewarden_kernels::cuda::{CudaBackend, DeviceKvPool, PageShape};
use pagewarden_kvcache::{Generation, KvPool, PageId, ReadError, ReadablePages, SharedPages};

use crate::llama::Model;
use crate::logprobs::TokenLogprobs;

use super::backend::{DeviceWeights, Gpu};
use super::error::{driver, GpuError};
use super::kv_store::KvStore;

/// Set to `1` to feed quantized matmuls f32 activations instead of the CPU's Q8-rounded ones.
pub const FLOAT_ACTS_ENV: &str = "PAGEWARDEN_GPU_FLOAT_ACTS";

/// How to open a [`GpuWorker`].
#[derive(Clone, Debug)]
pub struct GpuWorkerOptions {
    /// GPU ordinal (`cuda:N`).
    pub device: usize,
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
    fn new(cuda: &CudaBackend, elems: usize) -> Staging {
        // SAFETY: the buffer is only read back after a copy into it has filled that region.
        let pinned = unsafe { cuda.context().alloc_pinned_with_flags::<f16>(elems, 0) };
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
    model: Arc<Model>,
    cuda: Arc<CudaBackend>,
    weights: DeviceWeights,
    kv: KvStore,
    /// The page data, page for page the host pool's.
    device_pool: DeviceKvPool,
    /// Quantized matmuls see activations through the CPU's Q8 rounding (off with
    /// `PAGEWARDEN_GPU_FLOAT_ACTS=1`, to measure what that rounding is worth).
    exact_acts: bool,
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
            .field("cuda", &self.cuda)
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
        model: Arc<Model>,
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
        let cuda = Arc::new(CudaBackend::new(opts.device)?);
        let kv = KvStore::load(&cuda)?;
        cuda.load_all()?;
        let weights = DeviceWeights::upload(&cuda, model.weights())?;
        let pages = pool.capacity_pages();
        let shape = PageShape {
            layers: layout.layers,
            kv_heads: layout.kv_heads,
            head_dim: layout.head_dim,
            page_size: layout.page_size,
        };
        let device_pool = cuda.kv_pool(shape, pages)?;
        cuda.synchronize()?;
        let staging_pages = opts.staging_pages.max(1);
        let staging = Staging::new(&cuda, staging_pages * shape.page_elems());
        Ok(GpuWorker {
            model,
            cuda,
            weights,
            kv,
            device_pool,
            exact_acts: std::env::var_os(FLOAT_ACTS_ENV).is_none_or(|v| v != "1"),
            pool,
            staging,
            staging_pages,
            resident: vec![0; pages],
            zero_new_pages: opts.zero_new_pages,
        })
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// GPU name and architecture, for the start-up log.
    pub fn describe(&self) -> String {
        let b = &self.cuda;
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

    /// Runs `tokens` after a cached prefix's pages (`prefix`, read-only) and the `pages.len()`
    /// tokens already in `pages`, writing their K/V into the device mirror of `pages`; returns
    /// the logits of the last position. On success `pages.len()` grows by `tokens.len()`.
    pub fn prefill(
        &mut self,
        prefix: Option<&SharedPages>,
        pages: &mut ReadablePages,
        tokens: &[u32],
    ) -> Result<Vec<f32>, GpuError> {
        self.run_prefill(prefix, pages, tokens, None, None)
            .map(|(logits, _)| logits)
    }

    /// As [`GpuWorker::prefill`] for a part of a prompt whose positions end at `prompt_end`
    /// (`Model::prefill_part`): the logits only when the part reaches that end, else empty.
    pub fn prefill_part(
        &mut self,
        prefix: Option<&SharedPages>,
        pages: &mut ReadablePages,
        tokens: &[u32],
        prompt_end: usize,
    ) -> Result<Vec<f32>, GpuError> {
        self.run_prefill(prefix, pages, tokens, Some(prompt_end), None)
            .map(|(logits, _)| logits)
    }

    /// As [`GpuWorker::prefill`], scoring the prompt as it runs (`Model::prefill_scored`).
    pub fn prefill_scored(
        &mut self,
        prefix: Option<&SharedPages>,
        pages: &mut ReadablePages,
        tokens: &[u32],
        next: Option<u32>,
        top: usize,
    ) -> Result<(Vec<f32>, Vec<TokenLogprobs>), GpuError> {
        self.run_prefill(prefix, pages, tokens, None, Some((next, top)))
    }

    /// The model's prefill on this GPU, after making the prefix's pages resident.
    fn run_prefill(
        &mut self,
        prefix: Option<&SharedPages>,
        pages: &mut ReadablePages,
        tokens: &[u32],
        prompt_end: Option<usize>,
        score: Option<(Option<u32>, usize)>,
    ) -> Result<(Vec<f32>, Vec<TokenLogprobs>), GpuError> {
        self.bind()?;
        if let Some(p) = prefix {
            self.make_resident(p.table(), p.len(), &|i| p.page_bytes(i))?;
        }
        let model = self.model.clone();
        let out = model.run_prefill(&self.backend(), prefix, pages, tokens, prompt_end, score)?;
        // The device holds these pages' K/V at their generations now: a decode step reads them
        // as they are (decode recomputing a preempted sequence; the host copy was never written).
        let ps = self.pool.layout().page_size;
        for &(p, g) in &pages.table()[..pages.len().div_ceil(ps)] {
            self.resident[p.index()] = g.0;
        }
        Ok(out)
    }

    /// One batched decode step: each sequence, after its cached prefix's pages when it has
    /// one, gets one token at position `prefix.len() + pages.len()`. A refused page table
    /// (host or device check) fails only that sequence; a device failure fails every sequence
    /// of the step.
    pub fn decode_step(
        &mut self,
        batch: &mut [(Option<&SharedPages>, &mut ReadablePages, u32)],
    ) -> Vec<Result<Vec<f32>, GpuError>> {
        let mut out: Vec<Option<Result<Vec<f32>, GpuError>>> = batch.iter().map(|_| None).collect();
        if let Err(e) = self.bind() {
            return batch
                .iter()
                .map(|_| Err(GpuError::Step(e.to_string())))
                .collect();
        }
        let mut live = Vec::new();
        for (i, (prefix, pages, _)) in batch.iter_mut().enumerate() {
            let ready = match prefix {
                Some(p) => self.make_resident(p.table(), p.len(), &|i| p.page_bytes(i)),
                None => Ok(()),
            }
            .and_then(|()| {
                let own = &**pages;
                self.make_resident(own.table(), own.len(), &|i| own.page_bytes(i))
            });
            match ready {
                Ok(()) => live.push(i),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let model = self.model.clone();
        let gpu = self.backend();
        let mut work: Vec<(Option<&SharedPages>, &mut ReadablePages, u32)> = batch
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| out[*i].is_none())
            .map(|(_, (prefix, pages, t))| (*prefix, &mut **pages, *t))
            .collect();
        let results = model.decode_step_after_on(&gpu, &mut work);
        for ((r, (_, pages, _)), &i) in results.into_iter().zip(&work).zip(&live) {
            if r.is_ok() {
                for &(p, g) in pages.table() {
                    self.resident[p.index()] = g.0;
                }
            }
            out[i] = Some(r.map_err(GpuError::from));
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Err(GpuError::Step("not run".into()))))
            .collect()
    }

    /// Copies pages `indices` of `table` (a sequence's or a cached prefix's) from the device
    /// through the pinned staging buffer into owned buffers (`page_bytes` each, the host
    /// layout). Each page's generation is checked against the host pool first, as
    /// `ReadablePages::page_bytes` does on the CPU, and the device must hold that page at that
    /// generation.
    pub fn download_pages(
        &mut self,
        table: &[(PageId, Generation)],
        indices: &[usize],
    ) -> Result<Vec<Vec<u8>>, GpuError> {
        self.bind()?;
        let pe = self.device_pool.shape.page_elems();
        let mut ids = Vec::with_capacity(indices.len());
        for &i in indices {
            let &(page, expected) = table.get(i).ok_or(ReadError::OutOfRange)?;
            self.check_current(page, expected)?;
            if self.resident[page.index()] != expected.0 {
                return Err(GpuError::Step(format!(
                    "page {} is not on the device at generation {}",
                    page.0, expected.0
                )));
            }
            ids.push(page.0 as usize);
        }
        let mut frames = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(self.staging_pages) {
            let buf = self.staging.as_mut_slice()?;
            for (j, &id) in chunk.iter().enumerate() {
                let src = self.device_pool.data.slice(id * pe..(id + 1) * pe);
                self.cuda
                    .stream()
                    .memcpy_dtoh(&src, &mut buf[j * pe..(j + 1) * pe])
                    .map_err(driver("copying a page to pinned memory"))?;
            }
            self.cuda.synchronize()?;
            for j in 0..chunk.len() {
                frames.push(bytes_of(&buf[j * pe..(j + 1) * pe]).to_vec());
            }
        }
        Ok(frames)
    }

    /// The forward pass's backend on this GPU.
    fn backend(&mut self) -> Gpu<'_> {
        Gpu {
            cuda: &self.cuda,
            weights: &self.weights,
            kv: &self.kv,
            pool: RefCell::new(&mut self.device_pool),
            host: &self.pool,
            zero_new_pages: self.zero_new_pages,
            exact_acts: self.exact_acts,
        }
    }

    /// cudarc binds the context on most calls; bind once more for the calling thread (steps
    /// run on whichever blocking thread the runtime picks).
    fn bind(&self) -> Result<(), GpuError> {
        self.cuda
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

    /// Copies the host's committed pages of a table (those holding its first `len` tokens;
    /// `bytes(i)` reads page `i` of it, generation-checked) to the device unless they are
    /// resident at this generation already.
    fn make_resident<'a>(
        &mut self,
        table: &[(PageId, Generation)],
        len: usize,
        bytes: &dyn Fn(usize) -> Result<&'a [u8], ReadError>,
    ) -> Result<(), GpuError> {
        let ps = self.pool.layout().page_size;
        let filled = len.div_ceil(ps).min(table.len());
        let missing: Vec<usize> = (0..filled)
            .filter(|&i| {
                let (p, g) = table[i];
                self.resident[p.index()] != g.0
            })
            .collect();
        let pe = self.device_pool.shape.page_elems();
        for chunk in missing.chunks(self.staging_pages) {
            let buf = self.staging.as_mut_slice()?;
            for (j, &i) in chunk.iter().enumerate() {
                // Generation-checked host read of the verified page (I1 on the host side).
                bytes_of_mut(&mut buf[j * pe..(j + 1) * pe]).copy_from_slice(bytes(i)?);
            }
            for (j, &i) in chunk.iter().enumerate() {
                let id = table[i].0.index();
                let mut dst = self.device_pool.data.slice_mut(id * pe..(id + 1) * pe);
                self.cuda
                    .stream()
                    .memcpy_htod(&buf[j * pe..(j + 1) * pe], &mut dst)
                    .map_err(driver("copying a page to the device"))?;
            }
            self.cuda.synchronize()?;
            for &i in chunk {
                let (p, g) = table[i];
                self.resident[p.index()] = g.0;
            }
        }
        Ok(())
    }
}
