//! `Compute`: the one engine the prefill service talks to, on the CPU (`Model` over the host
//! pool's pages) or on a GPU (`GpuWorker`: the same pages mirrored in device memory, with the
//! host pool still owning them). Service logic (admission, grants, transfer, manifest) is the
//! same for both; only the forward pass and where page bytes are read from differ.

use std::sync::Arc;

use bytes::Bytes;
use pagewarden_kernels::Device;
use pagewarden_kvcache::{KvPool, ReadablePages};
use pagewarden_model::Model;
use pagewarden_worker::{GpuOptions, Opened};

/// The forward pass and page reads, on the device chosen by `--device`.
#[derive(Clone)]
pub enum Compute {
    /// CPU reference kernels over the host pool's page bytes.
    Cpu(Arc<Model>),
    /// A GPU; the mutex serialises jobs' chunks on the device.
    #[cfg(feature = "cuda")]
    Cuda(Arc<parking_lot::Mutex<pagewarden_model::cuda::GpuWorker>>),
}

/// A failed forward pass or page read, already worded for the caller.
#[derive(Debug)]
pub struct ComputeError(pub String);

impl Compute {
    /// Opens the engine for `device` over `pool`. A CUDA build without a driver or GPU fails
    /// here with the driver's reason.
    pub fn open(
        device: Device,
        model: Arc<Model>,
        pool: &KvPool,
        gpu: &GpuOptions,
    ) -> anyhow::Result<Compute> {
        match pagewarden_worker::open_device(device, &crate::ROLE, &model, pool, gpu)? {
            Opened::Cpu => Ok(Compute::Cpu(model)),
            #[cfg(feature = "cuda")]
            Opened::Gpu(gpu) => Ok(Compute::Cuda(Arc::new(parking_lot::Mutex::new(gpu)))),
            #[cfg(not(feature = "cuda"))]
            Opened::Gpu(_) => anyhow::bail!("{device} is unavailable in this build"),
        }
    }

    /// The tokens of one forward pass while another tenant's job waits, after which the turn
    /// ends for it (`job.rs`). On the CPU a short prompt's pass costs in proportion to its
    /// tokens, so the waiting job waits for 64 tokens instead of a chunk (a long prompt's
    /// passes each re-read all its earlier keys, so they run whole while nobody waits); on a
    /// GPU a short pass costs nearly as much as a long one, so the chunk runs whole.
    pub fn yield_tokens(&self, chunk_tokens: usize) -> usize {
        match self {
            Compute::Cpu(_) => chunk_tokens.min(64),
            #[cfg(feature = "cuda")]
            Compute::Cuda(_) => chunk_tokens,
        }
    }

    /// Runs `tokens` after those already in `pages`; logits of the last position.
    pub fn prefill(
        &self,
        pages: &mut ReadablePages,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ComputeError> {
        match self {
            Compute::Cpu(m) => m
                .prefill(pages, tokens)
                .map_err(|e| ComputeError(e.to_string())),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => g
                .lock()
                .prefill(pages, tokens)
                .map_err(|e| ComputeError(e.to_string())),
        }
    }

    /// The bytes of pages `indices` of `pages` (generation-checked), one frame each, holding
    /// only rows written for this request: a partial last page's unused rows are zeroed (I12).
    pub fn frames(
        &self,
        pages: &ReadablePages,
        indices: &[usize],
    ) -> Result<Vec<Bytes>, ComputeError> {
        match self {
            Compute::Cpu(_) => indices
                .iter()
                .map(|&i| {
                    pages
                        .page_bytes(i)
                        .map(|b| written_rows_only(pages, i, b.to_vec()))
                        .map_err(|e| ComputeError(format!("reading local KV page {i}: {e}")))
                })
                .collect(),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => {
                tokio::task::block_in_place(|| g.lock().download_pages(pages, indices))
                    .map(|v| {
                        v.into_iter()
                            .zip(indices)
                            .map(|(b, &i)| written_rows_only(pages, i, b))
                            .collect()
                    })
                    .map_err(|e| ComputeError(format!("reading device KV pages: {e}")))
            }
        }
    }
}

/// Page `index` of `pages` as it may leave the pool (I12): the rows past the tokens written
/// for this request, which still hold whatever the page's earlier owner left, are zeroed. Only
/// a prompt's last page is ever partial, so full pages cost nothing more than the copy.
fn written_rows_only(pages: &ReadablePages, index: usize, mut bytes: Vec<u8>) -> Bytes {
    pages
        .layout()
        .zero_unwritten_rows(&mut bytes, pages.page_tokens(index));
    Bytes::from(bytes)
}
