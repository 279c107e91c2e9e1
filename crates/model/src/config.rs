//! `LlamaConfig`: the model's shape, read from GGUF `<arch>.*` metadata (every `arch/`).

use crate::arch::Arch;
use crate::gguf::GgufFile;
use crate::llama::ModelError;
use crate::rope_scaling::RopeScaling;

/// Shape and hyper-parameters of a decoder-only transformer of the Llama family.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// The architecture and what only it has.
    pub arch: Arch,
    /// Vocabulary size (rows of the embedding table).
    pub vocab: usize,
    /// Embedding width (`<arch>.embedding_length`).
    pub dim: usize,
    /// Transformer blocks (`<arch>.block_count`).
    pub layers: usize,
    /// Query heads (`<arch>.attention.head_count`).
    pub heads: usize,
    /// Key/value heads (`<arch>.attention.head_count_kv`, defaults to `heads`).
    pub kv_heads: usize,
    /// Elements per head (`<arch>.attention.key_length`, defaults to `dim / heads`).
    pub head_dim: usize,
    /// FFN hidden width (`<arch>.feed_forward_length`).
    pub ffn: usize,
    /// RoPE frequency base (`<arch>.rope.freq_base`, default 10000).
    pub rope_theta: f32,
    /// Rotated dimensions per head (`<arch>.rope.dimension_count`, default `head_dim`).
    pub rope_dims: usize,
    /// RoPE scaling and frequency factors (`<arch>.rope.scaling.*`, `rope_freqs.weight`).
    pub rope_scaling: RopeScaling,
    /// RMSNorm epsilon (`<arch>.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// Trained context length (`<arch>.context_length`).
    pub context_length: usize,
}

impl LlamaConfig {
    /// Reads the config from `f`'s metadata; `vocab` falls back to the token list length.
    pub fn from_gguf(f: &GgufFile) -> Result<LlamaConfig, ModelError> {
        let md = f.metadata();
        let arch = Arch::from_metadata(f.architecture()?, md)?;
        let key = |k: &str| format!("{}.{k}", arch.name());
        let u = |k: &str| md.get_u32(&key(k)).map(|v| v as usize);
        let u_or = |k: &str, default: usize| match md.get(&key(k)) {
            Some(_) => u(k),
            None => Ok(default),
        };
        let dim = u("embedding_length")?;
        let heads = u("attention.head_count")?;
        let kv_heads = u_or("attention.head_count_kv", heads)?;
        let vocab = match md.get(&key("vocab_size")) {
            Some(_) => u("vocab_size")?,
            None => md.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        let rope_theta = match md.get(&key("rope.freq_base")) {
            Some(_) => md.get_f32(&key("rope.freq_base"))?,
            None => 10000.0,
        };
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(ModelError::BadConfig(format!(
                "heads {heads}, kv heads {kv_heads}: kv heads must divide heads"
            )));
        }
        let head_dim = match md.get(&key("attention.key_length")) {
            Some(_) => u("attention.key_length")?,
            None if dim.is_multiple_of(heads) => dim / heads,
            None => {
                return Err(ModelError::BadConfig(format!(
                    "dim {dim} is not a multiple of heads {heads} and no key_length is given"
                )))
            }
        };
        let value_length = u_or("attention.value_length", head_dim)?;
        if value_length != head_dim || head_dim == 0 {
            return Err(ModelError::BadConfig(format!(
                "key length {head_dim} and value length {value_length} must be equal, non-zero"
            )));
        }
        let rope_dims = u_or("rope.dimension_count", head_dim)?;
        if rope_dims > head_dim || !rope_dims.is_multiple_of(2) {
            return Err(ModelError::BadConfig(format!(
                "rope.dimension_count {rope_dims} must be even and <= head_dim {head_dim}"
            )));
        }
        let rope_scaling =
            RopeScaling::from_gguf(f, arch.name(), rope_dims, arch.recipe().rope_freq_factors)?;
        if matches!(arch, Arch::Gemma3(_)) && !rope_scaling.is_none() {
            // llama.cpp scales only Gemma 3's global layers; not implemented here.
            return Err(ModelError::Unsupported(
                "RoPE scaling in a gemma3 model is not implemented".into(),
            ));
        }
        let cfg = LlamaConfig {
            rope_scaling,
            vocab,
            dim,
            layers: u("block_count")?,
            heads,
            kv_heads,
            head_dim,
            ffn: u("feed_forward_length")?,
            rope_theta,
            rope_dims,
            rms_eps: md.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            context_length: u("context_length")?,
            arch,
        };
        if !cfg.dim.is_multiple_of(32)
            || !cfg.ffn.is_multiple_of(32)
            || !cfg.q_width().is_multiple_of(32)
            || cfg.layers == 0
            || cfg.vocab == 0
        {
            return Err(ModelError::BadConfig(format!(
                "dim {}, ffn {} and heads x head_dim {} must be multiples of 32, layers and \
                 vocab non-zero",
                cfg.dim,
                cfg.ffn,
                cfg.q_width()
            )));
        }
        Ok(cfg)
    }

    /// Width of K (or V) per token: `kv_heads * head_dim`.
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Width of Q (and of the attention output) per token: `heads * head_dim` (`dim` for
    /// Llama; Gemma 3's heads are wider).
    pub fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }
}
