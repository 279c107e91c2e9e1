//! `GpuError`: why the GPU model could not load or why one sequence's step failed.

use pagewarden_kernels::cuda::cudarc::driver::DriverError;
use pagewarden_kernels::cuda::CudaError;
use pagewarden_kvcache::{ReadError, ReserveError};
use thiserror::Error;

use crate::llama::ModelError;

/// A failure of a [`super::GpuWorker`]: opening the GPU, a step of it, or one sequence's pass.
#[derive(Debug, Error)]
pub enum GpuError {
    /// A kernel wrapper of the CUDA backend failed (no GPU, no PTX, driver error, bad shape, a
    /// weight type with no CUDA kernel).
    #[error("cuda: {0}")]
    Cuda(#[from] CudaError),
    /// A driver call made by this module failed.
    #[error("CUDA driver error during {what}: {source}")]
    Driver {
        /// The operation.
        what: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// The KV-store kernel's PTX is missing, stale, or did not compile.
    #[error("model KV-store kernel: {0}")]
    Ptx(String),
    /// The sequence's forward pass failed (refused by the page checks on the host or the
    /// device, context or pool exhausted, or the device failed the pass).
    #[error("{0}")]
    Model(#[from] ModelError),
    /// The host pool refused a read of a sequence's page (its generation moved on, I1).
    #[error("host KV page check: {0}")]
    HostRead(#[from] ReadError),
    /// The host pool could not grow a sequence's pages.
    #[error("host KV pool: {0}")]
    HostPages(#[from] ReserveError),
    /// The host pool's page shape is not the model's.
    #[error("KV layout mismatch: {0}")]
    Layout(String),
    /// The device failed the whole step this sequence was part of.
    #[error("GPU step failed: {0}")]
    Step(String),
}

/// Adds the operation name to a driver error.
pub(crate) fn driver(what: &'static str) -> impl FnOnce(DriverError) -> GpuError {
    move |source| GpuError::Driver { what, source }
}
