//! `ModelError`: why loading a model or running a forward pass failed.

use pagewarden_kvcache::{ReadError, ReserveError};
use thiserror::Error;

use crate::gguf::GgufError;

/// A failure of model loading or of one sequence's forward pass.
#[derive(Debug, Error)]
pub enum ModelError {
    /// The GGUF file could not be read or lacks a metadata key.
    #[error("gguf: {0}")]
    Gguf(#[from] GgufError),
    /// `general.architecture` is not one this engine runs.
    #[error("unsupported architecture {0:?} (supported: {supported})", supported = crate::arch::SUPPORTED)]
    UnsupportedArchitecture(String),
    /// The file asks for something this engine does not implement (a RoPE scaling kind, a
    /// bias, experts): refused rather than run without it.
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    /// The metadata describes an impossible shape.
    #[error("bad model config: {0}")]
    BadConfig(String),
    /// A required tensor is absent.
    #[error("tensor {0} is missing from the model file")]
    MissingTensor(String),
    /// A tensor's shape differs from what the config implies.
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Expected ggml dims.
        expected: Vec<u64>,
        /// Dims in the file.
        found: Vec<u64>,
    },
    /// A tensor is stored in a type the kernels cannot compute with.
    #[error("tensor {name} has unsupported type {ty}")]
    UnsupportedType {
        /// Tensor name.
        name: String,
        /// The ggml type.
        ty: String,
    },
    /// The tokenizer could not be built from the file.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A token id is outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The offending id.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The sequence would exceed the model's context length.
    #[error("{tokens} tokens exceed the context length of {context}")]
    ContextExceeded {
        /// Tokens the sequence would hold.
        tokens: usize,
        /// The model's context length.
        context: usize,
    },
    /// Nothing to run.
    #[error("empty input: at least one token is required")]
    EmptyInput,
    /// Reading KV failed (e.g. a page's generation changed): the sequence is failed, no data
    /// was used.
    #[error("kv read refused: {0}")]
    KvRead(#[from] ReadError),
    /// More KV pages could not be allocated.
    #[error("kv allocation failed: {0}")]
    KvReserve(#[from] ReserveError),
    /// The device running the pass failed (a GPU's driver error): every sequence of the pass
    /// failed with it, each length unchanged.
    #[error("device failed: {0}")]
    Device(String),
    /// The device refused the sequence's pages (a generation that is not the page's current
    /// one, a page outside the pool, a table too short): no data of them was used (I1).
    #[error("kv read refused on the device: {0}")]
    DevicePageFault(String),
}
