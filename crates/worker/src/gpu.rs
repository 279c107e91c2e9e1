//! `open_gpu` (feature `cuda`): a worker's model on GPU `cuda:N` over its host pool.

use pagewarden_kvcache::KvPool;
use pagewarden_model::cuda::{GpuError, GpuWorker, GpuWorkerOptions};
use pagewarden_model::Model;

/// The GPU could not take the model (no driver, no such device, out of memory, ...).
#[derive(Debug, thiserror::Error)]
#[error("cannot run on cuda:{device}")]
pub struct GpuOpenError {
    /// The GPU ordinal asked for.
    pub device: usize,
    /// The driver's or the model's reason.
    #[source]
    pub source: GpuError,
}

/// Puts `model` on the GPU `opts.device`, mirroring `pool`'s pages in device memory (the host
/// pool still owns them), and logs which GPU it got.
pub fn open_gpu(
    model: &Model,
    pool: &KvPool,
    opts: &GpuWorkerOptions,
) -> Result<GpuWorker, GpuOpenError> {
    let gpu = GpuWorker::new(model, pool.clone(), opts).map_err(|source| GpuOpenError {
        device: opts.device,
        source,
    })?;
    tracing::info!(device = %format!("cuda:{}", opts.device), gpu = %gpu.describe(), "model on the GPU");
    Ok(gpu)
}
