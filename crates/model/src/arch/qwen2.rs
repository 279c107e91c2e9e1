//! Qwen2 / Qwen2.5 (llama.cpp's `qwen2` graph): the Llama block with biases added after the
//! Q, K and V projections (`blk.N.attn_{q,k,v}.bias`, loaded wherever a file has them) and
//! NeoX RoPE (`LLAMA_ROPE_TYPE_NEOX`).

use super::{Recipe, RopeStyle};

/// Qwen2's recipe: NeoX RoPE; nothing else differs from Llama's block.
pub(crate) const RECIPE: Recipe = Recipe {
    rope: RopeStyle::Neox,
    qk_norm: false,
    fused_gate_up: false,
    q_prescaled: false,
    rope_freq_factors: false,
};
