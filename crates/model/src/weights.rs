//! Model weights as views into the GGUF mapping: no quantized byte is copied. Only the small
//! norm vectors are decoded to f32 at load.

use pagewarden_kernels::quant::dequantize_row;
use pagewarden_kernels::{QMatrix, WeightType};

use crate::arch::{Arch, Gemma3Norms, LayerExtra};
use crate::config::LlamaConfig;
use crate::gguf::{GgmlType, GgufFile};
use crate::llama::ModelError;

/// One weight matrix: `rows` outputs of `cols` inputs, borrowed from the GGUF file.
pub type Matrix<'a> = QMatrix<'a>;

/// How one layer attends: its RoPE base and sliding window (resolved at load from the
/// architecture's layer pattern).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerAttention {
    /// RoPE frequency base.
    pub rope_base: f32,
    /// Keys a query sees (itself included); `None` for full causal attention.
    pub window: Option<usize>,
}

/// The weights of one transformer block.
#[derive(Debug)]
pub struct LayerWeights<'a> {
    /// How this layer attends.
    pub attn: LayerAttention,
    /// Weights only this architecture has.
    pub extra: LayerExtra,
    /// RMSNorm before attention.
    pub attn_norm: Vec<f32>,
    /// Query projection, `q_width x dim`.
    pub wq: Matrix<'a>,
    /// Key projection, `kv_width x dim`.
    pub wk: Matrix<'a>,
    /// Value projection, `kv_width x dim`.
    pub wv: Matrix<'a>,
    /// Attention output projection, `dim x q_width`.
    pub wo: Matrix<'a>,
    /// RMSNorm before the FFN.
    pub ffn_norm: Vec<f32>,
    /// FFN gate, `ffn x dim`.
    pub gate: Matrix<'a>,
    /// FFN up, `ffn x dim`.
    pub up: Matrix<'a>,
    /// FFN down, `dim x ffn`.
    pub down: Matrix<'a>,
}

/// All weights of a model.
#[derive(Debug)]
pub struct LlamaWeights<'a> {
    /// Token embeddings, `vocab x dim`.
    pub token_embd: Matrix<'a>,
    /// Transformer blocks.
    pub layers: Vec<LayerWeights<'a>>,
    /// Final RMSNorm.
    pub output_norm: Vec<f32>,
    /// Output head, `vocab x dim` (`token_embd` when the file ties them).
    pub output: Matrix<'a>,
}

/// Maps a GGUF type to a kernel weight type (`None` if the kernels cannot compute with it).
pub fn weight_type(t: GgmlType) -> Option<WeightType> {
    match t {
        GgmlType::F32 => Some(WeightType::F32),
        GgmlType::F16 => Some(WeightType::F16),
        GgmlType::Q4_0 => Some(WeightType::Q4_0),
        GgmlType::Q4_1 => Some(WeightType::Q4_1),
        GgmlType::Q5_0 => Some(WeightType::Q5_0),
        GgmlType::Q8_0 => Some(WeightType::Q8_0),
        GgmlType::Q4_K => Some(WeightType::Q4_K),
        GgmlType::Q5_K => Some(WeightType::Q5_K),
        GgmlType::Q6_K => Some(WeightType::Q6_K),
        _ => None,
    }
}

fn matrix<'a>(
    f: &'a GgufFile,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Matrix<'a>, ModelError> {
    let t = f
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
    let dims = &t.info.dims;
    if dims.len() != 2 || dims[0] != cols as u64 || dims[1] != rows as u64 {
        return Err(ModelError::TensorShape {
            name: name.to_string(),
            expected: vec![cols as u64, rows as u64],
            found: dims.clone(),
        });
    }
    let ty = weight_type(t.info.ggml_type).ok_or_else(|| ModelError::UnsupportedType {
        name: name.to_string(),
        ty: format!("{:?}", t.info.ggml_type),
    })?;
    QMatrix::new(ty, rows, cols, t.data).ok_or_else(|| ModelError::TensorShape {
        name: name.to_string(),
        expected: vec![cols as u64, rows as u64],
        found: dims.clone(),
    })
}

/// A small tensor of `n` elements decoded to f32 (norm weights).
pub(crate) fn vector(f: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    let t = f
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
    let shape_err = || ModelError::TensorShape {
        name: name.to_string(),
        expected: vec![n as u64],
        found: t.info.dims.clone(),
    };
    if t.info.n_elements() != n as u64 {
        return Err(shape_err());
    }
    let ty = weight_type(t.info.ggml_type).ok_or_else(|| ModelError::UnsupportedType {
        name: name.to_string(),
        ty: format!("{:?}", t.info.ggml_type),
    })?;
    if ty.row_bytes(n) != Some(t.data.len()) {
        return Err(shape_err());
    }
    let mut out = vec![0f32; n];
    dequantize_row(ty, t.data, &mut out);
    Ok(out)
}

impl<'a> LlamaWeights<'a> {
    /// Resolves every tensor of `cfg`'s shape in `f`, checking names, shapes and types.
    pub fn from_gguf(f: &'a GgufFile, cfg: &LlamaConfig) -> Result<LlamaWeights<'a>, ModelError> {
        let (dim, kv, ffn, qw) = (cfg.dim, cfg.kv_width(), cfg.ffn, cfg.q_width());
        let token_embd = matrix(f, "token_embd.weight", cfg.vocab, dim)?;
        let layers = (0..cfg.layers)
            .map(|l| {
                let n = |s: &str| format!("blk.{l}.{s}.weight");
                let (attn, extra) = match &cfg.arch {
                    Arch::Llama => (
                        LayerAttention {
                            rope_base: cfg.rope_theta,
                            window: None,
                        },
                        LayerExtra::Llama,
                    ),
                    Arch::Gemma3(g) => (
                        g.layer_attention(l, cfg.rope_theta),
                        LayerExtra::Gemma3(Gemma3Norms::load(f, l, dim, cfg.head_dim)?),
                    ),
                };
                Ok(LayerWeights {
                    attn,
                    extra,
                    attn_norm: vector(f, &n("attn_norm"), dim)?,
                    wq: matrix(f, &n("attn_q"), qw, dim)?,
                    wk: matrix(f, &n("attn_k"), kv, dim)?,
                    wv: matrix(f, &n("attn_v"), kv, dim)?,
                    wo: matrix(f, &n("attn_output"), dim, qw)?,
                    ffn_norm: vector(f, &n("ffn_norm"), dim)?,
                    gate: matrix(f, &n("ffn_gate"), ffn, dim)?,
                    up: matrix(f, &n("ffn_up"), ffn, dim)?,
                    down: matrix(f, &n("ffn_down"), dim, ffn)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let output = match f.tensor("output.weight") {
            Some(_) => matrix(f, "output.weight", cfg.vocab, dim)?,
            // SmolLM2, Gemma and other small models tie the head to the embeddings.
            None => token_embd,
        };
        Ok(LlamaWeights {
            token_embd,
            layers,
            output_norm: vector(f, "output_norm.weight", dim)?,
            output,
        })
    }

    /// The matrices that run as matrix products, each once (the embeddings only when the head
    /// is tied to them, as the head): what `PackedRows` may accelerate.
    pub(crate) fn products_mut(&mut self) -> impl Iterator<Item = &mut Matrix<'a>> {
        self.layers
            .iter_mut()
            .flat_map(|l| {
                [
                    &mut l.wq,
                    &mut l.wk,
                    &mut l.wv,
                    &mut l.wo,
                    &mut l.gate,
                    &mut l.up,
                    &mut l.down,
                ]
            })
            .chain(std::iter::once(&mut self.output))
    }
}
