//! Phi-3 (llama.cpp's `phi3` graph): Q, K and V in one fused `blk.N.attn_qkv` (rows Q, then
//! K, then V), the FFN's gate and up in one `blk.N.ffn_up` of `2 * ffn` rows (gate first:
//! llama.cpp's `swiglu` activates the first half), NeoX RoPE, and Q scaled by
//! `1/sqrt(head_dim)` before attention. The fused tensors are split into zero-copy row views
//! at load (`weights.rs`), so the shared block runs them unchanged.
//!
//! Sliding window: llama.cpp disables Phi-3's (`phi3.attention.sliding_window` is read and
//! then ignored, with a warning: its converter's values are not trusted), so every layer
//! attends over the whole context here too. LongRoPE factors (`rope_factors_long/short`, the
//! 128k variants) are refused (`rope_scaling.rs`).

use super::{Recipe, RopeStyle};
use crate::gguf::Metadata;
use crate::llama::ModelError;

/// Phi-3's recipe: fused gate-up, NeoX RoPE, pre-scaled Q.
pub(crate) const RECIPE: Recipe = Recipe {
    rope: RopeStyle::Neox,
    qk_norm: false,
    fused_gate_up: true,
    q_prescaled: true,
    rope_freq_factors: false,
};

/// Refuses Phi-3 variants this block does not run (the MoE of Phi-3.5-MoE).
pub(crate) fn check_metadata(md: &Metadata) -> Result<(), ModelError> {
    if md.get("phi3.expert_count").is_some() {
        let n = md.get_u32("phi3.expert_count")?;
        if n > 0 {
            return Err(ModelError::Unsupported(format!(
                "phi3.expert_count = {n}: mixture-of-experts Phi-3 is not implemented"
            )));
        }
    }
    Ok(())
}
