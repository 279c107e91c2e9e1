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
}
