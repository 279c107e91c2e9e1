//! `RopeScaling`: how an architecture's RoPE angles are stretched, read as llama.cpp reads it:
//! `<arch>.rope.scaling.type` (default `linear`), `<arch>.rope.scaling.factor` (or the older
//! `<arch>.rope.scale_linear`), and Llama 3's per-pair frequency factors (`rope_freqs.weight`).
//! Kinds that are not implemented (YaRN, LongRoPE, an attention factor) are refused at load:
//! running them without their scaling would give plausible but wrong text.

use crate::gguf::GgufFile;
use crate::llama::ModelError;
use crate::weights::vector;

/// The tensor holding Llama 3's frequency factors, one per rotated pair.
pub const ROPE_FREQS: &str = "rope_freqs.weight";
/// LongRoPE's factors (Phi-3 128k, `rope.scaling.type = longrope`): not implemented.
const LONGROPE_TENSORS: [&str; 2] = ["rope_factors_long.weight", "rope_factors_short.weight"];

/// RoPE scaling: pair `i` at position `p` turns by `freq_scale * (p * base^(-2i/n) / factors[i])`.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeScaling {
    /// `1 / rope.scaling.factor` for linear scaling, else 1.
    pub freq_scale: f32,
    /// Per-pair divisors of the angle (`rope_freqs.weight`), when the file has them.
    pub factors: Option<Vec<f32>>,
}

impl RopeScaling {
    /// No scaling.
    pub fn none() -> RopeScaling {
        RopeScaling {
            freq_scale: 1.0,
            factors: None,
        }
    }

    /// Reads `arch`'s scaling from `f`; `freq_factors` says whether the architecture's graph
    /// in llama.cpp applies `rope_freqs.weight` (only `llama` does: elsewhere the tensor is
    /// refused, as llama.cpp refuses a file with a tensor it does not use).
    pub(crate) fn from_gguf(
        f: &GgufFile,
        arch: &str,
        rope_dims: usize,
        freq_factors: bool,
    ) -> Result<RopeScaling, ModelError> {
        let md = f.metadata();
        let key = |k: &str| format!("{arch}.rope.{k}");
        let kind = match md.get(&key("scaling.type")) {
            Some(_) => md.get_str(&key("scaling.type"))?.to_string(),
            None => "linear".to_string(),
        };
        let factor = match (md.get(&key("scaling.factor")), md.get(&key("scale_linear"))) {
            (Some(_), _) => md.get_f32(&key("scaling.factor"))?,
            (None, Some(_)) => md.get_f32(&key("scale_linear"))?,
            (None, None) => 0.0,
        };
        let freq_scale = match kind.as_str() {
            "none" => 1.0,
            "linear" if factor == 0.0 => 1.0,
            "linear" if factor.is_finite() && factor > 0.0 => 1.0 / factor,
            "linear" => {
                return Err(ModelError::BadConfig(format!(
                    "{} must be a positive number, not {factor}",
                    key("scaling.factor")
                )))
            }
            other => {
                return Err(ModelError::Unsupported(format!(
                    "RoPE scaling type {other:?} ({}); only \"none\" and \"linear\" are \
                     implemented",
                    key("scaling.type")
                )))
            }
        };
        if md.get(&key("scaling.attn_factor")).is_some() {
            let a = md.get_f32(&key("scaling.attn_factor"))?;
            if a != 1.0 {
                return Err(ModelError::Unsupported(format!(
                    "{} = {a}: a RoPE attention factor is not implemented",
                    key("scaling.attn_factor")
                )));
            }
        }
        if let Some(t) = LONGROPE_TENSORS.iter().find(|t| f.tensor(t).is_some()) {
            return Err(ModelError::Unsupported(format!(
                "tensor {t}: LongRoPE frequency factors are not implemented"
            )));
        }
        let factors = match (f.tensor(ROPE_FREQS).is_some(), freq_factors) {
            (false, _) => None,
            (true, true) => Some(vector(f, ROPE_FREQS, rope_dims / 2)?),
            (true, false) => {
                return Err(ModelError::Unsupported(format!(
                    "tensor {ROPE_FREQS} in a {arch} model: llama.cpp's {arch} graph does not \
                     use it"
                )))
            }
        };
        if let Some(bad) = factors
            .iter()
            .flatten()
            .find(|v| !(v.is_finite() && **v > 0.0))
        {
            return Err(ModelError::BadConfig(format!(
                "{ROPE_FREQS} holds {bad}: frequency factors must be positive"
            )));
        }
        Ok(RopeScaling {
            freq_scale,
            factors,
        })
    }

    /// Whether angles are the plain ones (no factor, no scale).
    pub fn is_none(&self) -> bool {
        self.freq_scale == 1.0 && self.factors.is_none()
    }
}
