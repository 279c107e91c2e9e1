//! Gemma 3 (llama.cpp's `gemma3` graph): embeddings scaled by `sqrt(dim)`; in each block an
//! RMSNorm before and after attention and before and after the FFN; per-head RMSNorm of Q
//! and K; NeoX RoPE; GeGLU (tanh GELU) FFN. Five of every six layers are local: sliding-window
//! attention with RoPE base 10000; every sixth is global with the file's RoPE base. The norm
//! weights are used as stored: the GGUF converter already folded Gemma's `1 + w` into them.

use super::{Recipe, RopeStyle};

use crate::backend::{Backend, Glu};
use crate::gguf::{GgufFile, Metadata};
use crate::llama::forward::{Pass, SeqWork};
use crate::llama::{Model, ModelError};
use crate::weights::{vector, LayerAttention, LayerWeights};

/// llama.cpp's fixed Gemma 3 layer pattern: layer `l` is global when `l % 6 == 5`.
const SWA_PERIOD: usize = 6;
/// llama.cpp's fixed RoPE base of the local (sliding-window) layers.
const LOCAL_ROPE_BASE: f32 = 10_000.0;
/// Gemma 3 27B's block count: the one size whose queries llama.cpp scales by
/// `1/sqrt(dim / heads)` instead of `1/sqrt(head_dim)`.
const LAYERS_27B: usize = 62;

/// Gemma 3's block is its own (`Model::gemma3_block`); this says how it ropes.
pub(crate) const RECIPE: Recipe = Recipe {
    rope: RopeStyle::Neox,
    qk_norm: true,
    fused_gate_up: false,
    q_prescaled: true,
    rope_freq_factors: false,
};

/// Hyper-parameters only Gemma 3 has.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3Params {
    /// Keys a local layer's query sees (`gemma3.attention.sliding_window`).
    pub sliding_window: usize,
    /// Final logit soft-capping (`gemma3.final_logit_softcapping`), when the file has it.
    pub final_softcap: Option<f32>,
}

impl Gemma3Params {
    pub(crate) fn from_metadata(md: &Metadata) -> Result<Gemma3Params, ModelError> {
        let sliding_window = md.get_u32("gemma3.attention.sliding_window")? as usize;
        if sliding_window == 0 {
            return Err(ModelError::BadConfig(
                "gemma3.attention.sliding_window must be non-zero".into(),
            ));
        }
        let final_softcap = match md.get("gemma3.final_logit_softcapping") {
            Some(_) => Some(md.get_f32("gemma3.final_logit_softcapping")?),
            None => None,
        };
        Ok(Gemma3Params {
            sliding_window,
            final_softcap,
        })
    }

    /// Layer `l`'s RoPE base and window.
    pub(crate) fn layer_attention(&self, l: usize, global_rope_base: f32) -> LayerAttention {
        if l % SWA_PERIOD == SWA_PERIOD - 1 {
            LayerAttention {
                rope_base: global_rope_base,
                window: None,
            }
        } else {
            LayerAttention {
                rope_base: LOCAL_ROPE_BASE,
                window: Some(self.sliding_window),
            }
        }
    }
}

/// The norms Gemma 3 adds to each block.
#[derive(Debug)]
pub struct Gemma3Norms {
    /// Per-head RMSNorm of Q, `head_dim`.
    pub q_norm: Vec<f32>,
    /// Per-head RMSNorm of K, `head_dim`.
    pub k_norm: Vec<f32>,
    /// RMSNorm of the attention output, `dim`.
    pub post_attn: Vec<f32>,
    /// RMSNorm of the FFN output, `dim`.
    pub post_ffn: Vec<f32>,
}

impl Gemma3Norms {
    pub(crate) fn load(
        f: &GgufFile,
        l: usize,
        dim: usize,
        head_dim: usize,
    ) -> Result<Gemma3Norms, ModelError> {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        Ok(Gemma3Norms {
            q_norm: vector(f, &n("attn_q_norm"), head_dim)?,
            k_norm: vector(f, &n("attn_k_norm"), head_dim)?,
            post_attn: vector(f, &n("post_attention_norm"), dim)?,
            post_ffn: vector(f, &n("post_ffw_norm"), dim)?,
        })
    }
}

impl Model {
    /// One Gemma 3 block over the batch's rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemma3_block<B: Backend>(
        &self,
        b: &B,
        step: &mut B::Step,
        norms: &Gemma3Norms,
        l: usize,
        lw: &LayerWeights<'_>,
        seqs: &mut [SeqWork<'_>],
        p: &mut Pass<B>,
    ) -> Result<(), B::Error> {
        let cfg = self.config();
        let eps = cfg.rms_eps;
        b.rms_norm(&p.x, &lw.attn_norm, eps, &mut p.xn)?;
        self.project_qkv(b, lw, p)?;
        p.norm_heads(b, &norms.q_norm, &norms.k_norm, eps)?;
        p.rope(b, cfg, lw.attn.rope_base, true)?;
        // llama.cpp scales Q before attention (its `kq_scale` is then 1: `Recipe::q_prescaled`),
        // and both attention paths round Q to f16 after that scale, as llama.cpp does.
        let scale = if cfg.layers == LAYERS_27B {
            1.0 / ((cfg.dim / cfg.heads) as f32).sqrt()
        } else {
            1.0 / (cfg.head_dim as f32).sqrt()
        };
        b.scale(&mut p.q, scale)?;
        self.attention(b, step, l, lw, seqs, p)?;
        b.rms_norm(&p.proj, &norms.post_attn, eps, &mut p.xn)?;
        b.add(&mut p.x, &p.xn)?;
        b.rms_norm(&p.x, &lw.ffn_norm, eps, &mut p.xn)?;
        self.project_gate_up(b, lw, p)?;
        b.glu(Glu::Gelu, &mut p.gate, &p.up)?;
        self.project_down(b, lw, p)?;
        b.rms_norm(&p.proj, &norms.post_ffn, eps, &mut p.xn)?;
        b.add(&mut p.x, &p.xn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sixth_layer_is_global_the_others_slide() {
        let g = Gemma3Params {
            sliding_window: 512,
            final_softcap: None,
        };
        for l in 0..18 {
            let a = g.layer_attention(l, 1e6);
            if matches!(l, 5 | 11 | 17) {
                assert_eq!((a.rope_base, a.window), (1e6, None), "layer {l}");
            } else {
                assert_eq!((a.rope_base, a.window), (1e4, Some(512)), "layer {l}");
            }
        }
    }
}
