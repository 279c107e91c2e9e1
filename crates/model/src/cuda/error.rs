//! `GpuError`: why the GPU model could not load or why one sequence's step failed.

use pagewarden_kernels::cuda::cudarc::driver::DriverError;
use pagewarden_kernels::cuda::{CudaError, PageFault};
use pagewarden_kvcache::{ReadError, ReserveError};
use thiserror::Error;

use super::pages::DevicePageId;

/// A failure of [`super::GpuModel`] or of one sequence in a step.
#[derive(Debug, Error)]
pub enum GpuError {
    /// The GPU forward pass runs only the Llama architecture so far.
    #[error("the CUDA backend runs only \"llama\" models; {0:?} runs on the CPU (--device cpu)")]
    Architecture(&'static str),
    /// A kernel wrapper of the CUDA backend failed (no GPU, no PTX, driver error, bad shape).
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
    /// The kernels refused the sequence's page table (invariant I1): its step produced no
    /// data, only this error.
    #[error("sequence refused by the GPU page check: {0}")]
    PageFault(PageFault),
    /// The device pool has too few free pages for the sequence to grow.
    #[error("device KV pool exhausted: {needed} more page(s) needed, {free} free")]
    PoolExhausted {
        /// Pages the sequence still needs.
        needed: usize,
        /// Free pages in the pool.
        free: usize,
    },
    /// A step was asked to run no tokens.
    #[error("no input tokens")]
    EmptyInput,
    /// A token id is not in the vocabulary.
    #[error("token {token} is outside the vocabulary ({vocab})")]
    TokenOutOfRange {
        /// The token.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The sequence would pass the model's context length.
    #[error("{tokens} tokens exceed the context length {context}")]
    ContextExceeded {
        /// Tokens the sequence would hold.
        tokens: usize,
        /// The model's context.
        context: usize,
    },
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
    /// A page id that the host bookkeeping does not know.
    #[error("page {0:?} is not in the device pool")]
    UnknownPage(DevicePageId),
}

/// Adds the operation name to a driver error.
pub(crate) fn driver(what: &'static str) -> impl FnOnce(DriverError) -> GpuError {
    move |source| GpuError::Driver { what, source }
}
