//! Model weights as views into the GGUF mapping: no quantized byte is copied (fused tensors,
//! Phi-3's `attn_qkv` and gate-up `ffn_up`, become row views of the one tensor). Only the
//! small norm and bias vectors are decoded to f32 at load.

use pagewarden_kernels::quant::dequantize_row;
use pagewarden_kernels::{QMatrix, WeightType};

use crate::arch::{Arch, Gemma3Norms, LayerExtra, Recipe};
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

/// Biases added after the Q, K and V projections (Qwen2; any file that has them).
#[derive(Debug)]
pub struct QkvBias {
    /// `q_width`.
    pub q: Vec<f32>,
    /// `kv_width`.
    pub k: Vec<f32>,
    /// `kv_width`.
    pub v: Vec<f32>,
}

/// Per-head RMSNorm weights of Q and K, applied before RoPE (Qwen3).
#[derive(Debug)]
pub struct QkNorm {
    /// `head_dim`.
    pub q: Vec<f32>,
    /// `head_dim`.
    pub k: Vec<f32>,
}

/// The weights of one transformer block.
#[derive(Debug)]
pub struct LayerWeights<'a> {
    /// How this layer attends.
    pub attn: LayerAttention,
    /// Weights only this architecture has.
    pub extra: LayerExtra,
    /// Q/K/V biases, when the file has them.
    pub qkv_bias: Option<QkvBias>,
    /// Q/K norms of the Llama-style block (its recipe's `qk_norm`).
    pub qk_norm: Option<QkNorm>,
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
        GgmlType::BF16 => Some(WeightType::BF16),
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

/// Rows `r0..r0 + n` of `m`, borrowing the same bytes.
fn row_view<'a>(m: &Matrix<'a>, r0: usize, n: usize) -> Matrix<'a> {
    let rb = m.row_bytes();
    QMatrix::new(m.ty, n, m.cols, &m.data[r0 * rb..(r0 + n) * rb]).expect("rows of a matrix")
}

/// Layer `l`'s Q, K and V projections (separate tensors, or row views of a fused
/// `attn_qkv`: Q rows, then K, then V) and their biases when the file has them, as
/// llama.cpp's shared loader takes them for every architecture.
#[allow(clippy::type_complexity)]
fn qkv<'a>(
    f: &'a GgufFile,
    l: usize,
    cfg: &LlamaConfig,
) -> Result<(Matrix<'a>, Matrix<'a>, Matrix<'a>, Option<QkvBias>), ModelError> {
    let (dim, qw, kv) = (cfg.dim, cfg.q_width(), cfg.kv_width());
    let t = |s: &str, kind: &str| format!("blk.{l}.{s}.{kind}");
    let fused = t("attn_qkv", "weight");
    let (wq, wk, wv) = if f.tensor(&fused).is_some() {
        let m = matrix(f, &fused, qw + 2 * kv, dim)?;
        (
            row_view(&m, 0, qw),
            row_view(&m, qw, kv),
            row_view(&m, qw + kv, kv),
        )
    } else {
        (
            matrix(f, &t("attn_q", "weight"), qw, dim)?,
            matrix(f, &t("attn_k", "weight"), kv, dim)?,
            matrix(f, &t("attn_v", "weight"), kv, dim)?,
        )
    };
    let fused_bias = t("attn_qkv", "bias");
    let has = |s: &str| f.tensor(&t(s, "bias")).is_some();
    let bias = if f.tensor(&fused_bias).is_some() {
        let b = vector(f, &fused_bias, qw + 2 * kv)?;
        Some(QkvBias {
            q: b[..qw].to_vec(),
            k: b[qw..qw + kv].to_vec(),
            v: b[qw + kv..].to_vec(),
        })
    } else if has("attn_q") || has("attn_k") || has("attn_v") {
        // A bias of zeros where one of the three is absent, as ggml adds none there.
        let or_zero = |s: &str, n: usize| match has(s) {
            true => vector(f, &t(s, "bias"), n),
            false => Ok(vec![0.0; n]),
        };
        Some(QkvBias {
            q: or_zero("attn_q", qw)?,
            k: or_zero("attn_k", kv)?,
            v: or_zero("attn_v", kv)?,
        })
    } else {
        None
    };
    Ok((wq, wk, wv, bias))
}

/// Layer `l`'s FFN gate and up: separate tensors, or the two halves of Phi-3's fused
/// `ffn_up` (`2 * ffn` rows, gate first).
fn gate_up<'a>(
    f: &'a GgufFile,
    l: usize,
    cfg: &LlamaConfig,
    recipe: &Recipe,
) -> Result<(Matrix<'a>, Matrix<'a>), ModelError> {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    if recipe.fused_gate_up {
        let m = matrix(f, &n("ffn_up"), 2 * cfg.ffn, cfg.dim)?;
        return Ok((row_view(&m, 0, cfg.ffn), row_view(&m, cfg.ffn, cfg.ffn)));
    }
    Ok((
        matrix(f, &n("ffn_gate"), cfg.ffn, cfg.dim)?,
        matrix(f, &n("ffn_up"), cfg.ffn, cfg.dim)?,
    ))
}

/// Refuses a file with a bias this engine would not add (attention output, FFN, output
/// head): running without it would give plausible but wrong text.
fn refuse_unused_biases(f: &GgufFile) -> Result<(), ModelError> {
    const USED: [&str; 4] = [
        ".attn_q.bias",
        ".attn_k.bias",
        ".attn_v.bias",
        ".attn_qkv.bias",
    ];
    let unused = f.tensors().iter().map(|t| t.name.as_str()).find(|name| {
        name.ends_with(".bias")
            && !(name.starts_with("blk.") && USED.iter().any(|u| name.ends_with(u)))
    });
    match unused {
        Some(name) => Err(ModelError::Unsupported(format!(
            "tensor {name}: this bias is not implemented"
        ))),
        None => Ok(()),
    }
}

impl<'a> LlamaWeights<'a> {
    /// Resolves every tensor of `cfg`'s shape in `f`, checking names, shapes and types.
    pub fn from_gguf(f: &'a GgufFile, cfg: &LlamaConfig) -> Result<LlamaWeights<'a>, ModelError> {
        refuse_unused_biases(f)?;
        let (dim, ffn, qw) = (cfg.dim, cfg.ffn, cfg.q_width());
        let recipe = cfg.arch.recipe();
        let token_embd = matrix(f, "token_embd.weight", cfg.vocab, dim)?;
        let layers = (0..cfg.layers)
            .map(|l| {
                let n = |s: &str| format!("blk.{l}.{s}.weight");
                let (attn, extra, qk_norm) = match &cfg.arch {
                    Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 => (
                        LayerAttention {
                            rope_base: cfg.rope_theta,
                            window: None,
                        },
                        LayerExtra::Llama,
                        match recipe.qk_norm {
                            true => Some(QkNorm {
                                q: vector(f, &n("attn_q_norm"), cfg.head_dim)?,
                                k: vector(f, &n("attn_k_norm"), cfg.head_dim)?,
                            }),
                            false => None,
                        },
                    ),
                    Arch::Gemma3(g) => (
                        g.layer_attention(l, cfg.rope_theta),
                        LayerExtra::Gemma3(Gemma3Norms::load(f, l, dim, cfg.head_dim)?),
                        None,
                    ),
                };
                let (wq, wk, wv, qkv_bias) = qkv(f, l, cfg)?;
                let (gate, up) = gate_up(f, l, cfg, &recipe)?;
                Ok(LayerWeights {
                    attn,
                    extra,
                    qkv_bias,
                    qk_norm,
                    attn_norm: vector(f, &n("attn_norm"), dim)?,
                    wq,
                    wk,
                    wv,
                    wo: matrix(f, &n("attn_output"), dim, qw)?,
                    ffn_norm: vector(f, &n("ffn_norm"), dim)?,
                    gate,
                    up,
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
