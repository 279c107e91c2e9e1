//! Qwen3 (llama.cpp's `qwen3` graph): the Llama block with a per-head RMSNorm of Q and of K
//! (`blk.N.attn_q_norm`, `blk.N.attn_k_norm`, `head_dim` each) before NeoX RoPE; no biases;
//! `head_dim` from `qwen3.attention.key_length` (128 where `dim / heads` is not).

use super::{Recipe, RopeStyle};

/// Qwen3's recipe: Q/K norms, NeoX RoPE.
pub(crate) const RECIPE: Recipe = Recipe {
    rope: RopeStyle::Neox,
    qk_norm: true,
    fused_gate_up: false,
    q_prescaled: false,
    rope_freq_factors: false,
};
