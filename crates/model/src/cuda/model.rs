//! `GpuModel`: weights and the KV pool in device memory, sequences with generation-checked page
//! tables, prefill and batched decode.

use std::sync::Arc;

use pagewarden_kernels::cuda::{CudaBackend, DeviceKvPool, DeviceRopeTable, PageShape};
use pagewarden_kernels::rope::Rope;

use crate::arch::Arch;
use crate::config::LlamaConfig;
use crate::llama::Model;

use super::error::GpuError;
use super::kv_store::KvStore;
use super::pages::{DevicePageId, GpuSequence, PageBook, PageGeneration};
use super::weights::GpuWeights;

/// Set to `1` to feed quantized matmuls f32 activations instead of the CPU's Q8-rounded ones.
pub const FLOAT_ACTS_ENV: &str = "PAGEWARDEN_GPU_FLOAT_ACTS";

/// Sizes of the device pool and of prefill passes.
#[derive(Clone, Debug)]
pub struct GpuOptions {
    /// Pages in the device KV pool.
    pub pages: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Largest number of prompt tokens run through one forward pass during prefill.
    pub prefill_chunk: usize,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            pages: 1024,
            page_size: 16,
            prefill_chunk: 512,
        }
    }
}

/// A Llama model on one GPU: weights (quantized as in the file), a device KV pool laid out like
/// kvcache's `KvLayout` (one page = every layer's K and V, f16), and the host bookkeeping of
/// its pages. Every page (re)allocation bumps the page's generation and is copied to the
/// device before the next step, so the kernels' generation check is live (I1).
pub struct GpuModel {
    pub(crate) backend: Arc<CudaBackend>,
    pub(crate) cfg: LlamaConfig,
    pub(crate) weights: GpuWeights,
    pub(crate) pool: DeviceKvPool,
    pub(crate) book: PageBook,
    pub(crate) kv: KvStore,
    /// RoPE's cosines and sines for every position of the context, the CPU's bits.
    pub(crate) rope: DeviceRopeTable,
    pub(crate) opts: GpuOptions,
    /// Quantized matmuls see activations through the CPU's Q8 rounding (off with
    /// `PAGEWARDEN_GPU_FLOAT_ACTS=1`, to measure what that rounding is worth).
    pub(crate) exact_acts: bool,
}

impl std::fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuModel")
            .field("backend", &self.backend)
            .field("config", &self.cfg)
            .field("opts", &self.opts)
            .finish()
    }
}

impl GpuModel {
    /// Uploads `model`'s weights to `backend`'s GPU and allocates the device pool.
    pub fn new(
        model: &Model,
        backend: Arc<CudaBackend>,
        opts: &GpuOptions,
    ) -> Result<GpuModel, GpuError> {
        let cfg = model.config().clone();
        match cfg.arch {
            Arch::Llama => {}
            Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 | Arch::Gemma3(_) => {
                return Err(GpuError::Architecture(cfg.arch.name()))
            }
        }
        // The GPU block is plain Llama's: no RoPE scaling, no Q/K/V biases.
        if !cfg.rope_scaling.is_none()
            || model.weights().layers.iter().any(|l| l.qkv_bias.is_some())
        {
            return Err(GpuError::Architecture(
                "llama with RoPE scaling or Q/K/V biases",
            ));
        }
        let mut opts = opts.clone();
        opts.page_size = opts.page_size.max(1);
        opts.prefill_chunk = opts.prefill_chunk.max(1);
        let shape = PageShape {
            layers: cfg.layers,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            page_size: opts.page_size,
        };
        let kv = KvStore::load(&backend)?;
        backend.load_all()?;
        let weights = GpuWeights::upload(&backend, model.weights())?;
        let pool = backend.kv_pool(shape, opts.pages)?;
        let rope = Rope {
            base: cfg.rope_theta,
            n_dims: cfg.rope_dims,
            head_dim: cfg.head_dim,
        };
        let rope = backend.rope_table(&rope, cfg.context_length)?;
        backend.synchronize()?;
        Ok(GpuModel {
            backend,
            cfg,
            weights,
            pool,
            book: PageBook::new(opts.pages),
            kv,
            rope,
            opts,
            exact_acts: std::env::var_os(FLOAT_ACTS_ENV).is_none_or(|v| v != "1"),
        })
    }

    /// Like [`GpuModel::new`], for a device pool whose pages are owned by a host pool (see
    /// [`super::GpuWorker`]): the model's own page book is empty, so a sequence whose host
    /// table is too short fails with `PoolExhausted` instead of taking a page nobody granted.
    pub fn new_mirrored(
        model: &Model,
        backend: Arc<CudaBackend>,
        opts: &GpuOptions,
    ) -> Result<GpuModel, GpuError> {
        let mut m = GpuModel::new(model, backend, opts)?;
        m.book = PageBook::new(0);
        Ok(m)
    }

    /// The backend (for synchronizing or reading pages).
    pub fn backend(&self) -> &Arc<CudaBackend> {
        &self.backend
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The device pool.
    pub fn pool(&self) -> &DeviceKvPool {
        &self.pool
    }

    /// Free pages in the device pool.
    pub fn free_pages(&self) -> usize {
        self.book.free_pages()
    }

    /// A new, empty sequence (pages are allocated as it grows).
    pub fn new_sequence(&self) -> GpuSequence {
        GpuSequence::default()
    }

    /// Returns `seq`'s pages to the pool (each at a new generation).
    pub fn release(&mut self, seq: GpuSequence) {
        self.book.release(&seq.table);
    }

    /// Takes `page` from its owner behind the owner's back (a reassignment or quarantine):
    /// bumps its generation, so the owner's next step is refused by the GPU check.
    pub fn revoke_page(&mut self, page: DevicePageId) -> Result<PageGeneration, GpuError> {
        self.book.revoke(page).ok_or(GpuError::UnknownPage(page))
    }

    /// Runs `tokens` at positions `[seq.len(), seq.len() + tokens.len())` in chunks, writing
    /// their K/V into `seq`'s device pages. Returns the logits of the last position. The outer
    /// error is a device failure; the inner one is this sequence's.
    pub fn prefill(
        &mut self,
        seq: &mut GpuSequence,
        tokens: &[u32],
    ) -> Result<Result<Vec<f32>, GpuError>, GpuError> {
        if tokens.is_empty() {
            return Ok(Err(GpuError::EmptyInput));
        }
        let end = seq.len + tokens.len();
        if end > self.cfg.context_length {
            return Ok(Err(GpuError::ContextExceeded {
                tokens: end,
                context: self.cfg.context_length,
            }));
        }
        // All pages up front: no partial prefill for lack of pages.
        if let Err((needed, free)) = seq.grow(&mut self.book, end, self.opts.page_size) {
            return Ok(Err(GpuError::PoolExhausted { needed, free }));
        }
        let mut last = Ok(Vec::new());
        for chunk in tokens.chunks(self.opts.prefill_chunk) {
            last = self
                .forward(&mut [(&mut *seq, chunk)])?
                .pop()
                .expect("one result per sequence");
            if last.is_err() {
                break;
            }
        }
        Ok(last)
    }

    /// One batched decode step: each sequence gets one token at position `seq.len()`. Returns
    /// per sequence its logits or its error (a refused page table fails only that sequence);
    /// the outer error is a device failure of the whole step.
    pub fn decode_step(
        &mut self,
        batch: &mut [(&mut GpuSequence, u32)],
    ) -> Result<Vec<Result<Vec<f32>, GpuError>>, GpuError> {
        let mut work: Vec<(&mut GpuSequence, &[u32])> = batch
            .iter_mut()
            .map(|(s, t)| (&mut **s, std::slice::from_ref(&*t)))
            .collect();
        self.forward(&mut work)
    }
}
