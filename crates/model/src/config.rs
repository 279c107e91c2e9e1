//! `LlamaConfig`: the model's shape, read from GGUF `llama.*` metadata.

use crate::gguf::GgufFile;
use crate::llama::ModelError;

/// Shape and hyper-parameters of a Llama-architecture model.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size (rows of the embedding table).
    pub vocab: usize,
    /// Embedding width (`llama.embedding_length`).
    pub dim: usize,
    /// Transformer blocks (`llama.block_count`).
    pub layers: usize,
    /// Query heads (`llama.attention.head_count`).
    pub heads: usize,
    /// Key/value heads (`llama.attention.head_count_kv`, defaults to `heads`).
    pub kv_heads: usize,
    /// Elements per head (`dim / heads`).
    pub head_dim: usize,
    /// FFN hidden width (`llama.feed_forward_length`).
    pub ffn: usize,
    /// RoPE frequency base (`llama.rope.freq_base`, default 10000).
    pub rope_theta: f32,
    /// Rotated dimensions per head (`llama.rope.dimension_count`, default `head_dim`).
    pub rope_dims: usize,
    /// RMSNorm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// Trained context length (`llama.context_length`).
    pub context_length: usize,
}

impl LlamaConfig {
    /// Reads the config from `f`'s metadata; `vocab` falls back to the token list length.
    pub fn from_gguf(f: &GgufFile) -> Result<LlamaConfig, ModelError> {
        let arch = f.architecture()?;
        if arch != "llama" {
            return Err(ModelError::UnsupportedArchitecture(arch.to_string()));
        }
        let md = f.metadata();
        let u = |k: &str| md.get_u32(&format!("llama.{k}")).map(|v| v as usize);
        let dim = u("embedding_length")?;
        let heads = u("attention.head_count")?;
        let kv_heads = match md.get("llama.attention.head_count_kv") {
            Some(_) => u("attention.head_count_kv")?,
            None => heads,
        };
        let vocab = match md.get("llama.vocab_size") {
            Some(_) => u("vocab_size")?,
            None => md.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        let rope_theta = match md.get("llama.rope.freq_base") {
            Some(_) => md.get_f32("llama.rope.freq_base")?,
            None => 10000.0,
        };
        if heads == 0
            || kv_heads == 0
            || !dim.is_multiple_of(heads)
            || !heads.is_multiple_of(kv_heads)
        {
            return Err(ModelError::BadConfig(format!(
                "dim {dim}, heads {heads}, kv heads {kv_heads}: heads must divide dim and kv \
                 heads must divide heads"
            )));
        }
        let head_dim = dim / heads;
        let rope_dims = match md.get("llama.rope.dimension_count") {
            Some(_) => u("rope.dimension_count")?,
            None => head_dim,
        };
        if rope_dims > head_dim || !rope_dims.is_multiple_of(2) {
            return Err(ModelError::BadConfig(format!(
                "rope.dimension_count {rope_dims} must be even and <= head_dim {head_dim}"
            )));
        }
        let cfg = LlamaConfig {
            vocab,
            dim,
            layers: u("block_count")?,
            heads,
            kv_heads,
            head_dim,
            ffn: u("feed_forward_length")?,
            rope_theta,
            rope_dims,
            rms_eps: md.get_f32("llama.attention.layer_norm_rms_epsilon")?,
            context_length: u("context_length")?,
        };
        if !cfg.dim.is_multiple_of(32)
            || !cfg.ffn.is_multiple_of(32)
            || cfg.layers == 0
            || cfg.vocab == 0
        {
            return Err(ModelError::BadConfig(format!(
                "dim {} and ffn {} must be multiples of 32, layers and vocab non-zero",
                cfg.dim, cfg.ffn
            )));
        }
        Ok(cfg)
    }

    /// Width of K (or V) per token: `kv_heads * head_dim`.
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}
