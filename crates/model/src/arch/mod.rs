//! Architectures: which transformer block a model runs, chosen from `general.architecture`.
//! One file per architecture holds what is particular to it (extra metadata, extra tensors,
//! the layer recipe); the shared machinery (embedding, attention over paged KV, logits) is
//! in `llama/forward.rs`. The Llama-style architectures differ only in data (a [`Recipe`]:
//! RoPE pairing, Q/K norms, fused tensors), read by the one block in `llama.rs`; what the
//! loader accepts beyond that (optional Q/K/V biases, a fused `attn_qkv`, RoPE scaling) is
//! what llama.cpp's shared loader accepts for every architecture (`weights.rs`,
//! `rope_scaling.rs`).
//!
//! - `llama.rs`: Llama (SmolLM2, Llama 3 with `rope_freqs`, Mistral): RMSNorm, SwiGLU, normal
//!   RoPE; the shared Llama-style block.
//! - `qwen2.rs`: Qwen2 / Qwen2.5: the Llama block with Q/K/V biases and NeoX RoPE.
//! - `qwen3.rs`: Qwen3: per-head RMSNorm of Q and K before NeoX RoPE, no biases.
//! - `phi3.rs`: Phi-3: fused `attn_qkv` and gate-up `ffn_up`, NeoX RoPE, Q scaled before
//!   attention; its sliding window ignored, as llama.cpp ignores it.
//! - `gemma3.rs`: Gemma 3: pre/post norms, q/k norms, GeGLU, NeoX RoPE, sliding-window local
//!   layers with their own RoPE base, embeddings scaled by `sqrt(dim)`.

pub(crate) mod gemma3;
pub(crate) mod llama;
pub(crate) mod phi3;
pub(crate) mod qwen2;
pub(crate) mod qwen3;

use crate::gguf::Metadata;
use crate::llama::ModelError;

pub use gemma3::{Gemma3Norms, Gemma3Params};

/// The architectures this engine runs (`general.architecture`), as the error names them.
pub const SUPPORTED: &str = "\"llama\", \"qwen2\", \"qwen3\", \"phi3\", \"gemma3\"";

/// The architecture of a loaded model, with the hyper-parameters only it has.
#[derive(Clone, Debug, PartialEq)]
pub enum Arch {
    /// `llama` (also Mistral 7B's files, which declare `llama`).
    Llama,
    /// `qwen2`.
    Qwen2,
    /// `qwen3`.
    Qwen3,
    /// `phi3`.
    Phi3,
    /// `gemma3`.
    Gemma3(Gemma3Params),
}

/// How dimension pairs are chosen for RoPE (llama.cpp's `rope_type` of the architecture).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// `LLAMA_ROPE_TYPE_NORM`: adjacent pairs `(x[2i], x[2i+1])`.
    Normal,
    /// `LLAMA_ROPE_TYPE_NEOX`: pairs `(x[i], x[i + n_dims/2])`.
    Neox,
}

/// What the shared Llama-style block does differently per architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recipe {
    /// RoPE pairing.
    pub rope: RopeStyle,
    /// Per-head RMSNorm of Q and K before RoPE (`blk.N.attn_q_norm`, `blk.N.attn_k_norm`).
    pub qk_norm: bool,
    /// FFN gate and up stored as one `blk.N.ffn_up` of `2 * ffn` rows, gate rows first.
    pub fused_gate_up: bool,
    /// llama.cpp scales Q by `1/sqrt(head_dim)` before attention and attends with scale 1
    /// (the same bits as scaling scores when `head_dim` is a power of 4; flash attention
    /// gets Q pre-scaled either way, as llama.cpp's does).
    pub q_prescaled: bool,
    /// llama.cpp's graph for this architecture applies `rope_freqs.weight`.
    pub rope_freq_factors: bool,
}

impl Arch {
    /// The architecture named `name` (`general.architecture`), reading its own metadata.
    pub fn from_metadata(name: &str, md: &Metadata) -> Result<Arch, ModelError> {
        match name {
            "llama" => {
                llama::check_metadata(md)?;
                Ok(Arch::Llama)
            }
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "phi3" => {
                phi3::check_metadata(md)?;
                Ok(Arch::Phi3)
            }
            "gemma3" => Ok(Arch::Gemma3(Gemma3Params::from_metadata(md)?)),
            other => Err(ModelError::UnsupportedArchitecture(other.to_string())),
        }
    }

    /// The GGUF name, which is also the prefix of its metadata keys.
    pub fn name(&self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Phi3 => "phi3",
            Arch::Gemma3(_) => "gemma3",
        }
    }

    /// The architecture's recipe (Gemma 3's block is its own; its entry says how it ropes).
    pub fn recipe(&self) -> Recipe {
        match self {
            Arch::Llama => llama::RECIPE,
            Arch::Qwen2 => qwen2::RECIPE,
            Arch::Qwen3 => qwen3::RECIPE,
            Arch::Phi3 => phi3::RECIPE,
            Arch::Gemma3(_) => gemma3::RECIPE,
        }
    }
}

/// Per-layer weights only some architectures have.
#[derive(Debug)]
pub enum LayerExtra {
    /// The Llama-style block (llama, qwen2, qwen3, phi3) keeps its options in `LayerWeights`.
    Llama,
    /// Gemma 3's extra norms.
    Gemma3(Gemma3Norms),
}
