//! Architectures: which transformer block a model runs, chosen from `general.architecture`.
//! One file per architecture holds what is particular to it (extra metadata, extra tensors,
//! the layer recipe); the shared machinery (embedding, attention over paged KV, logits) is
//! in `llama/forward.rs`.
//!
//! - `llama.rs`: Llama (SmolLM2 & co.): RMSNorm, SwiGLU, normal RoPE.
//! - `gemma3.rs`: Gemma 3: pre/post norms, q/k norms, GeGLU, NeoX RoPE, sliding-window local
//!   layers with their own RoPE base, embeddings scaled by `sqrt(dim)`.

pub(crate) mod gemma3;
pub(crate) mod llama;

use crate::gguf::Metadata;
use crate::llama::ModelError;

pub use gemma3::{Gemma3Norms, Gemma3Params};

/// The architecture of a loaded model, with the hyper-parameters only it has.
#[derive(Clone, Debug, PartialEq)]
pub enum Arch {
    /// `llama`.
    Llama,
    /// `gemma3`.
    Gemma3(Gemma3Params),
}

impl Arch {
    /// The architecture named `name` (`general.architecture`), reading its own metadata.
    pub fn from_metadata(name: &str, md: &Metadata) -> Result<Arch, ModelError> {
        match name {
            "llama" => Ok(Arch::Llama),
            "gemma3" => Ok(Arch::Gemma3(Gemma3Params::from_metadata(md)?)),
            other => Err(ModelError::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// The GGUF name, which is also the prefix of its metadata keys.
    pub fn name(&self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3(_) => "gemma3",
        }
    }
}

/// Per-layer weights only some architectures have.
#[derive(Debug)]
pub enum LayerExtra {
    /// Llama has none.
    Llama,
    /// Gemma 3's extra norms.
    Gemma3(Gemma3Norms),
}
