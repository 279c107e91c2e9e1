//! `open_gpu` (feature `cuda`): a worker's model on GPU `cuda:N` over its host pool.

use pagewarden_kvcache::KvPool;
use pagewarden_model::cuda::{GpuError, GpuWorker, GpuWorkerOptions};

use std::sync::Arc;

use crate::GpuOptions;
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

/// Puts `model` on GPU `device`, mirroring `pool`'s pages in device memory (the host pool
/// still owns them), and logs which GPU it got.
pub(crate) fn open_gpu(
    model: &Arc<Model>,
    pool: &KvPool,
    device: usize,
    gpu: &GpuOptions,
) -> Result<GpuWorker, GpuOpenError> {
    let opts = GpuWorkerOptions {
        device,
        staging_pages: gpu.staging_pages,
        zero_new_pages: gpu.zero_new_pages,
    };
    let worker = GpuWorker::new(model.clone(), pool.clone(), &opts)
        .map_err(|source| GpuOpenError { device, source })?;
    tracing::info!(device = %format!("cuda:{device}"), gpu = %worker.describe(), "model on the GPU");
    Ok(worker)
}
