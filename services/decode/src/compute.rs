//! `Compute`: the one engine the decode scheduler talks to, on the CPU (`Model` over the host
//! pool's pages) or on a GPU (`GpuWorker`: committed pages are copied from the host pool, where
//! they were received and verified, into device memory; steps run there). Reservation, commit
//! verification (I2), grants and release stay in the host pool on both.

use std::sync::Arc;

use pagewarden_kernels::Device;
use pagewarden_kvcache::{KvPool, ReadablePages};
use pagewarden_model::{Model, ModelError};
use pagewarden_worker::{GpuOptions, Opened};

/// Decode steps on the device chosen by `--device`.
#[derive(Clone)]
pub enum Compute {
    /// CPU reference kernels over the host pool's page bytes.
    Cpu(Arc<Model>),
    /// A GPU (one step at a time: the scheduler runs one step at a time anyway).
    #[cfg(feature = "cuda")]
    Cuda(Arc<std::sync::Mutex<pagewarden_model::cuda::GpuWorker>>),
}

/// Why one sequence's step failed.
#[derive(Debug)]
pub enum StepError {
    /// A KV read was refused by the generation check (I1), on the host or on the device.
    KvRefused(String),
    /// Anything else (pool exhausted, device failure, ...).
    Failed(String),
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepError::KvRefused(m) | StepError::Failed(m) => f.write_str(m),
        }
    }
}

impl From<ModelError> for StepError {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::KvRead(_) => StepError::KvRefused(e.to_string()),
            other => StepError::Failed(other.to_string()),
        }
    }
}

#[cfg(feature = "cuda")]
impl From<pagewarden_model::cuda::GpuError> for StepError {
    fn from(e: pagewarden_model::cuda::GpuError) -> Self {
        use pagewarden_model::cuda::GpuError;
        match e {
            GpuError::PageFault(_) | GpuError::HostRead(_) => StepError::KvRefused(e.to_string()),
            other => StepError::Failed(other.to_string()),
        }
    }
}

impl Compute {
    /// Opens the engine for `device` over `pool`. A CUDA build without a driver or GPU fails
    /// here with the driver's reason.
    pub fn open(
        device: Device,
        model: Arc<Model>,
        pool: &KvPool,
        staging_pages: usize,
    ) -> anyhow::Result<Compute> {
        let gpu = GpuOptions {
            prefill_chunk: 512,
            staging_pages,
            // Decode never prefills: committed pages arrive whole from the host pool.
            zero_new_pages: false,
        };
        match pagewarden_worker::open_device(device, &crate::ROLE, &model, pool, &gpu)? {
            Opened::Cpu => Ok(Compute::Cpu(model)),
            #[cfg(feature = "cuda")]
            Opened::Gpu(gpu) => Ok(Compute::Cuda(Arc::new(std::sync::Mutex::new(gpu)))),
            #[cfg(not(feature = "cuda"))]
            Opened::Gpu(_) => anyhow::bail!("{device} is unavailable in this build"),
        }
    }

    /// One batched decode step: per sequence, the logits of its next token or why it failed
    /// (only that sequence fails).
    pub fn decode_step(
        &self,
        batch: &mut [(&mut ReadablePages, u32)],
    ) -> Vec<Result<Vec<f32>, StepError>> {
        match self {
            Compute::Cpu(m) => m
                .decode_step(batch)
                .into_iter()
                .map(|r| r.map_err(StepError::from))
                .collect(),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => g
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .decode_step(batch)
                .into_iter()
                .map(|r| r.map_err(StepError::from))
                .collect(),
        }
    }

    /// Recomputes a preempted sequence's KV: runs `tokens` after the `pages.len()` tokens
    /// already in `pages` through the prefill pass, writing their K/V into `pages` (decode's own
    /// pages, under their own generations). The logits are not needed: the sequence's next
    /// token was sampled before it was preempted.
    pub fn recompute(&self, pages: &mut ReadablePages, tokens: &[u32]) -> Result<(), StepError> {
        match self {
            Compute::Cpu(m) => m.prefill(pages, tokens).map(drop).map_err(StepError::from),
            #[cfg(feature = "cuda")]
            Compute::Cuda(g) => g
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .prefill(pages, tokens)
                .map(drop)
                .map_err(StepError::from),
        }
    }
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
        let mut logits = model.prefill(&mut run, &prompt).unwrap();
        model.prefill(&mut other, &prompt[..8]).unwrap();
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
            compute.recompute(&mut again, chunk).unwrap();
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
