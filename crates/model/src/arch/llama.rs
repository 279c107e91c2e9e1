//! Llama (llama.cpp's `llama` graph): RMSNorm, attention with normal-style RoPE, RMSNorm,
//! SwiGLU FFN, each added back to the residual stream. Llama 3's RoPE frequency factors
//! (`rope_freqs.weight`) and linear RoPE scaling come with the config (`rope_scaling.rs`).
//!
//! Mistral 7B's files declare `llama`: they run as Llama. A `llama.attention.sliding_window`
//! key is ignored, as llama.cpp's `llama` graph ignores it (Mistral 7B v0.2 and later have
//! none; v0.1's 4096-token window matters only past 4096 tokens).
//!
//! The block below is every Llama-style architecture's (qwen2, qwen3, phi3): its
//! [`Recipe`] says how it ropes and whether Q and K are normed; biases and fused tensors are
//! in the layer's weights.

use super::{Recipe, RopeStyle};
use crate::backend::{Backend, Glu};
use crate::gguf::Metadata;
use crate::llama::forward::{Pass, SeqWork};
use crate::llama::{Model, ModelError};
use crate::weights::LayerWeights;

/// Llama's recipe: normal RoPE, Llama 3's frequency factors when the file has them.
pub(crate) const RECIPE: Recipe = Recipe {
    rope: RopeStyle::Normal,
    qk_norm: false,
    fused_gate_up: false,
    q_prescaled: false,
    rope_freq_factors: true,
};

/// Refuses Llama variants this block does not run (Mixtral's experts).
pub(crate) fn check_metadata(md: &Metadata) -> Result<(), ModelError> {
    if md.get("llama.expert_count").is_some() {
        let n = md.get_u32("llama.expert_count")?;
        if n > 0 {
            return Err(ModelError::Unsupported(format!(
                "llama.expert_count = {n}: mixture-of-experts models are not implemented"
            )));
        }
    }
    Ok(())
}

impl Model {
    /// One Llama-style block over the batch's rows, as `recipe` says.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn llama_block<B: Backend>(
        &self,
        b: &B,
        step: &mut B::Step,
        recipe: &Recipe,
        l: usize,
        lw: &LayerWeights<'_>,
        seqs: &mut [SeqWork<'_>],
        p: &mut Pass<B>,
    ) -> Result<(), B::Error> {
        let cfg = self.config();
        b.rms_norm(&p.x, &lw.attn_norm, cfg.rms_eps, &mut p.xn)?;
        self.project_qkv(b, lw, p)?;
        if let Some(n) = &lw.qk_norm {
            p.norm_heads(b, &n.q, &n.k, cfg.rms_eps)?;
        }
        p.rope(b, cfg, lw.attn.rope_base, recipe.rope == RopeStyle::Neox)?;
        if recipe.q_prescaled {
            // Both attention paths round Q to f16: round it scaled, as llama.cpp does.
            b.scale(&mut p.q, 1.0 / (cfg.head_dim as f32).sqrt())?;
        }
        self.attention(b, step, l, lw, seqs, p)?;
        b.add(&mut p.x, &p.proj)?;
        b.rms_norm(&p.x, &lw.ffn_norm, cfg.rms_eps, &mut p.xn)?;
        self.project_gate_up(b, lw, p)?;
        b.glu(Glu::Silu, &mut p.gate, &p.up)?;
        self.project_down(b, lw, p)?;
        b.add(&mut p.x, &p.proj)
    }
}
