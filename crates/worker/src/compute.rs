//! `Compute`: the one engine both workers talk to, on the CPU (`Model` over the host pool's
//! pages) or on a GPU (`GpuWorker`: the same pages mirrored in device memory, the host pool
//! still owning them). Everything around it (admission, grants, transfer, manifests, commit
//! verification, release) is the same on both; only the forward pass and where page bytes are
//! read from differ.
//!
//! Prefill runs [`Compute::prefill`] and sends [`Compute::frames`]; decode runs
//! [`Compute::decode_step`], and [`Compute::prefill`] again to recompute a preempted sequence's
//! KV into its own pages.

use std::sync::Arc;

use bytes::Bytes;
use pagewarden_common::integrity::PageTag;
use pagewarden_kernels::Device;
use pagewarden_kvcache::{KvPool, ReadError, ReadablePages, SharedPages};
use pagewarden_model::{Model, ModelError, TokenLogprobs};

use crate::device::{open_device, GpuOptions, OpenError, Opened};
use crate::role::Role;

/// The forward pass and page reads, on the device chosen by `--device`.
#[derive(Clone)]
pub enum Compute {
    /// CPU kernels over the host pool's page bytes.
    Cpu(Arc<Model>),
    /// A GPU; the mutex serialises passes on the device.
    #[cfg(feature = "cuda")]
    Cuda(Arc<parking_lot::Mutex<pagewarden_model::cuda::GpuWorker>>),
}

/// Why a pass or a page read failed, worded for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ComputeError {
    /// A KV read was refused by the generation check (I1), on the host or on the device;
    /// with the page and the generation presented, when known.
    #[error("{0}")]
    KvRefused(String, Option<PageTag>),
    /// Anything else (pool exhausted, context exceeded, device failure, ...).
    #[error("{0}")]
    Failed(String),
}

impl From<ModelError> for ComputeError {
    fn from(e: ModelError) -> Self {
        let what = e.to_string();
        match e {
            ModelError::KvRead(r) => ComputeError::KvRefused(what, page_tag(&r)),
            ModelError::DevicePageFault(_) => ComputeError::KvRefused(what, None),
            _ => ComputeError::Failed(what),
        }
    }
}

#[cfg(feature = "cuda")]
impl From<pagewarden_model::cuda::GpuError> for ComputeError {
    fn from(e: pagewarden_model::cuda::GpuError) -> Self {
        use pagewarden_model::cuda::GpuError;
        match e {
            GpuError::Model(m) => ComputeError::from(m),
            GpuError::HostRead(r) => {
                ComputeError::KvRefused(format!("host KV page check: {r}"), page_tag(&r))
            }
            other => ComputeError::Failed(other.to_string()),
        }
    }
}

impl Compute {
    /// Opens the engine for `device` over `pool`. A CUDA build without a driver or GPU fails
    /// here with the driver's reason; a build without CUDA refuses `cuda:N`.
    pub fn open(
        device: Device,
        role: &Role,
        model: Arc<Model>,
        pool: &KvPool,
        gpu: &GpuOptions,
    ) -> Result<Compute, OpenError> {
        match open_device(device, role, &model, pool, gpu)? {
            Opened::Cpu => Ok(Compute::Cpu(model)),
            #[cfg(feature = "cuda")]
            Opened::Gpu(gpu) => Ok(Compute::Cuda(Arc::new(parking_lot::Mutex::new(gpu)))),
            #[cfg(not(feature = "cuda"))]
            Opened::Gpu(none) => match none {},
        }
    }

    /// The tokens of one prefill pass while another tenant's job waits, after which the turn
    /// ends for it. On the CPU a short prompt's pass costs in proportion to its tokens, so the
    /// waiting job waits for 64 tokens instead of a chunk (a long prompt's passes each re-read
    /// all its earlier keys, so they run whole while nobody waits); on a GPU a short pass costs
    /// nearly as much as a long one, so the chunk runs whole.
    pub fn yield_tokens(&self, chunk_tokens: usize) -> usize {
        match self {
            Compute::Cpu(_) => chunk_tokens.min(64),
            #[cfg(feature = "cuda")]
            Compute::Cuda(_) => chunk_tokens,
        }
    }

    /// Whether a short pass can overtake a long one on this engine ([`Compute::urgent`]): on
    /// the CPU, where passes share the kernel pool region by region. A GPU runs one pass at a
    /// time.
    pub fn overtakes(&self) -> bool {
        matches!(self, Compute::Cpu(_))
    }

    /// Runs `f` (passes over this engine) as urgent work: other threads' passes wait before
    /// each of their parallel regions until it returns. Only `f`'s own thread is urgent.
    pub fn urgent<R>(&self, f: impl FnOnce() -> R) -> R {
        match self {
            Compute::Cpu(m) => m.urgent(f),
            #[cfg(feature = "cuda")]
            Compute::Cuda(_) => f(),
        }
    }

    /// Runs `tokens` after the `pages.len()` tokens already in `pages`, writing their K/V into
    /// `pages`; the logits of the last position.
    pub fn prefill(
        &self,
        pages: &mut ReadablePages,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ComputeError> {
        self.prefill_after(None, pages, tokens)
    }

    /// As [`Compute::prefill`] after a cached prefix's pinned pages.
    pub fn prefill_after(
        &self,
        prefix: Option<&SharedPages>,
        pages: &mut ReadablePages,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ComputeError> {
        match self {
            Compute::Cpu(m) => Ok(m.prefill_after(prefix, pages, tokens)?),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => Ok(g.lock().prefill(prefix, pages, tokens)?),
        }
    }

    /// As [`Compute::prefill_after`] for a part of a prompt whose positions end at
    /// `prompt_end` ([`Model::prefill_part`]): the logits are the last position's when the part
    /// reaches that end, else empty.
    pub fn prefill_part(
        &self,
        prefix: Option<&SharedPages>,
        pages: &mut ReadablePages,
        tokens: &[u32],
        prompt_end: usize,
    ) -> Result<Vec<f32>, ComputeError> {
        match self {
            Compute::Cpu(m) => Ok(m.prefill_part(prefix, pages, tokens, prompt_end)?),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => Ok(g.lock().prefill_part(prefix, pages, tokens, prompt_end)?),
        }
    }

    /// As [`Compute::prefill_after`], also scoring `tokens`: the logprob (and `top` top
    /// logprobs) of each after the first and of `next` after the last
    /// ([`Model::prefill_scored`]).
    pub fn prefill_scored(
        &self,
        prefix: Option<&SharedPages>,
        pages: &mut ReadablePages,
        tokens: &[u32],
        next: Option<u32>,
        top: usize,
    ) -> Result<(Vec<f32>, Vec<TokenLogprobs>), ComputeError> {
        match self {
            Compute::Cpu(m) => Ok(m.prefill_scored(prefix, pages, tokens, next, top)?),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => Ok(g.lock().prefill_scored(prefix, pages, tokens, next, top)?),
        }
    }

    /// The bytes of pinned prefix pages `indices` (full pages, generation-checked), one frame
    /// each, for the transfer to decode: the host pool's bytes, or on a GPU the device's (the
    /// pages a GPU pass wrote hold no data on the host).
    pub fn prefix_frames(
        &self,
        prefix: &SharedPages,
        indices: &[usize],
    ) -> Result<Vec<Bytes>, ComputeError> {
        match self {
            Compute::Cpu(_) => indices
                .iter()
                .map(|&i| {
                    prefix
                        .page_bytes(i)
                        .map(Bytes::copy_from_slice)
                        .map_err(|e| refused(format!("reading cached KV page {i}: {e}"), e))
                })
                .collect(),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => {
                tokio::task::block_in_place(|| g.lock().download_pages(prefix.table(), indices))
                    .map(|v| v.into_iter().map(Bytes::from).collect())
                    .map_err(|e| {
                        ComputeError::Failed(format!("reading cached device KV pages: {e}"))
                    })
            }
        }
    }

    /// One batched decode step: per sequence, the logits of its next token or why it failed
    /// (only that sequence fails).
    pub fn decode_step(
        &self,
        batch: &mut [(&mut ReadablePages, u32)],
    ) -> Vec<Result<Vec<f32>, ComputeError>> {
        match self {
            Compute::Cpu(m) => m
                .decode_step(batch)
                .into_iter()
                .map(|r| r.map_err(ComputeError::from))
                .collect(),
            #[cfg(feature = "cuda")]
            Compute::Cuda(_) => {
                let mut with: Vec<(Option<&SharedPages>, &mut ReadablePages, u32)> = batch
                    .iter_mut()
                    .map(|(pages, t)| (None, &mut **pages, *t))
                    .collect();
                self.decode_step_after(&mut with)
            }
        }
    }

    /// As [`Compute::decode_step`] for sequences after a cached prefix's pinned pages.
    pub fn decode_step_after(
        &self,
        batch: &mut [(Option<&SharedPages>, &mut ReadablePages, u32)],
    ) -> Vec<Result<Vec<f32>, ComputeError>> {
        match self {
            Compute::Cpu(m) => m
                .decode_step_after(batch)
                .into_iter()
                .map(|r| r.map_err(ComputeError::from))
                .collect(),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => g
                .lock()
                .decode_step(batch)
                .into_iter()
                .map(|r| r.map_err(ComputeError::from))
                .collect(),
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
                        .map_err(|e| refused(format!("reading local KV page {i}: {e}"), e))
                })
                .collect(),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => {
                tokio::task::block_in_place(|| g.lock().download_pages(pages.table(), indices))
                    .map(|v| {
                        v.into_iter()
                            .zip(indices)
                            .map(|(b, &i)| written_rows_only(pages, i, b))
                            .collect()
                    })
                    .map_err(|e| ComputeError::Failed(format!("reading device KV pages: {e}")))
            }
        }
    }
}

/// A refused KV read, tagged with the page and the generation it presented.
fn refused(what: String, e: ReadError) -> ComputeError {
    ComputeError::KvRefused(what, page_tag(&e))
}

/// The page and the generation a refused read presented, when it named one.
fn page_tag(e: &ReadError) -> Option<PageTag> {
    match *e {
        ReadError::GenerationMismatch { page, expected, .. } => Some(PageTag {
            page: page.0,
            generation: expected.0,
        }),
        ReadError::OutOfRange => None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use pagewarden_kvcache::{Owner, PoolConfig, RequestId, TenantId};
    use pagewarden_model::{argmax, GgufFile, LoadOptions};

    /// Recompute preemption rests on this: a preempted sequence's KV, rebuilt from its token
    /// ids in prefill chunks, is byte for byte what the prefill and decode steps wrote, so the
    /// next step's logits (and the greedy text) are the same.
    #[test]
    fn a_recompute_rebuilds_the_kv_the_steps_wrote() {
        let file = GgufFile::from_bytes(pagewarden_model::tiny_llama_gguf(7)).unwrap();
        let model = Arc::new(Model::from_gguf(file, &LoadOptions::default()).unwrap());
        let pool = KvPool::new(PoolConfig::with_pages(model.kv_layout(16), 32));
        let compute = Compute::Cpu(model.clone());
        let owner = Owner {
            request: RequestId::random(),
            tenant: TenantId::new("t"),
        };
        let prompt: Vec<u32> = (0..40).map(|i| 20 + (i * 11) % 200).collect();

        // Undisturbed: the prompt's prefill, then decode steps (beside another sequence, as in
        // a batch), each writing one token's KV.
        let mut run = pool.allocate(owner.clone(), prompt.len()).unwrap();
        let mut other = pool.allocate(owner.clone(), 8).unwrap();
        let mut logits = compute.prefill(&mut run, &prompt).unwrap();
        compute.prefill(&mut other, &prompt[..8]).unwrap();
        let mut tokens = prompt.clone();
        for _ in 0..30 {
            let next = argmax(&logits);
            tokens.push(next);
            let mut batch = [(&mut run, next), (&mut other, 7)];
            logits = compute.decode_step(&mut batch).remove(0).unwrap();
        }
        let next = argmax(&logits);

        // Preempted and recomputed: the same tokens, in chunks that do not follow the original
        // boundaries.
        let mut again = pool.allocate(owner, tokens.len() + 1).unwrap();
        for chunk in tokens.chunks(13) {
            compute.prefill(&mut again, chunk).unwrap();
        }
        assert_eq!(again.len(), run.len());
        for page in 0..run.table().len() {
            assert!(
                run.page_bytes(page).unwrap() == again.page_bytes(page).unwrap(),
                "page {page} differs"
            );
        }
        let a = compute
            .decode_step(&mut [(&mut run, next)])
            .remove(0)
            .unwrap();
        let b = compute
            .decode_step(&mut [(&mut again, next)])
            .remove(0)
            .unwrap();
        assert_eq!(a, b, "the next step's logits differ");
    }
}
