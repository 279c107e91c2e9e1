//! `tiny_arch_gguf`: seeded tiny random models of each architecture (`arch/`), small enough
//! to regenerate in a test (well under a megabyte) and complete enough for llama.cpp to load
//! (the tiny byte-level BPE vocabulary, every tensor its loader requires and none it does not
//! use). Their llama.cpp reference lives beside the parity test (`tests/data/arch`).
//!
//! Weights are Q8_0, F16 and BF16 (norms, biases and frequency factors F32), types whose
//! llama.cpp products differ from ours at most by float rounding. The output rows of the
//! three special tokens are zero, so greedy decoding never ends early on an end token.

use super::tiny::{add_tiny_tokenizer, tiny_vocab, Rng};
use super::{quantize, GgmlType, GgufWriter};

/// The architecture of a tiny model, with what its file declares beyond the shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TinyArch {
    /// `llama` with Llama 3's `rope_freqs.weight` and linear RoPE scaling (factor 2).
    Llama3,
    /// `llama` as Mistral 7B's files declare it, with a sliding window llama.cpp ignores.
    Mistral,
    /// `qwen2`: Q/K/V biases.
    Qwen2,
    /// `qwen3`: per-head Q/K norms, `head_dim * heads != dim`.
    Qwen3,
    /// `phi3`: fused QKV and gate-up, a sliding window llama.cpp ignores.
    Phi3,
}

impl TinyArch {
    /// Every tiny architecture.
    pub const ALL: [TinyArch; 5] = [
        TinyArch::Llama3,
        TinyArch::Mistral,
        TinyArch::Qwen2,
        TinyArch::Qwen3,
        TinyArch::Phi3,
    ];

    /// A short name (file names, reference keys).
    pub fn name(self) -> &'static str {
        match self {
            TinyArch::Llama3 => "llama3",
            TinyArch::Mistral => "mistral",
            TinyArch::Qwen2 => "qwen2",
            TinyArch::Qwen3 => "qwen3",
            TinyArch::Phi3 => "phi3",
        }
    }

    /// `general.architecture`.
    pub fn gguf_arch(self) -> &'static str {
        match self {
            TinyArch::Llama3 | TinyArch::Mistral => "llama",
            TinyArch::Qwen2 => "qwen2",
            TinyArch::Qwen3 => "qwen3",
            TinyArch::Phi3 => "phi3",
        }
    }
}

/// Shape and seed of a tiny model.
#[derive(Clone, Debug, PartialEq)]
pub struct ArchSpec {
    /// Architecture.
    pub arch: TinyArch,
    /// RNG seed for every weight.
    pub seed: u64,
    /// Transformer blocks.
    pub layers: usize,
    /// Embedding width (multiple of 32).
    pub dim: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads (divides `heads`).
    pub kv_heads: usize,
    /// Elements per head (`dim / heads` except where the architecture allows otherwise).
    pub head_dim: usize,
    /// FFN hidden width (multiple of 32).
    pub ffn: usize,
    /// `<arch>.context_length`.
    pub context_length: u32,
}

impl ArchSpec {
    /// The parity model of `arch`: GQA everywhere, a head wider than `dim / heads` for
    /// Qwen3, eight heads of 8 for Mistral, and a power-of-4 head for Phi-3 (its pre-scaled
    /// Q then has the bits of a scaled score).
    pub fn parity(arch: TinyArch) -> ArchSpec {
        let base = ArchSpec {
            arch,
            seed: 0x5eed_0000 + arch as u64,
            layers: 2,
            dim: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            ffn: 128,
            context_length: 256,
        };
        match arch {
            TinyArch::Llama3 | TinyArch::Qwen2 | TinyArch::Phi3 => base,
            TinyArch::Mistral => ArchSpec {
                heads: 8,
                head_dim: 8,
                ..base
            },
            TinyArch::Qwen3 => ArchSpec {
                head_dim: 32,
                ..base
            },
        }
    }

    /// The sliding window the file declares (ignored by llama.cpp for these architectures).
    pub fn declared_window(&self) -> Option<u32> {
        match self.arch {
            TinyArch::Mistral | TinyArch::Phi3 => Some(8),
            TinyArch::Llama3 | TinyArch::Qwen2 | TinyArch::Qwen3 => None,
        }
    }
}

/// Llama 3-like frequency factors, one per rotated pair: 1 for the fast pairs, up to 8.
fn llama3_factors(pairs: usize) -> Vec<f32> {
    (0..pairs)
        .map(|i| 1.0 + 7.0 * (i as f32 / (pairs - 1).max(1) as f32).powi(2))
        .collect()
}

/// Writes the tiny model `spec` describes.
pub fn tiny_arch_gguf(spec: &ArchSpec) -> Vec<u8> {
    tiny_arch_writer(spec).to_bytes()
}

/// The writer of [`tiny_arch_gguf`], before serialising: tests add keys or tensors to it.
pub fn tiny_arch_writer(spec: &ArchSpec) -> GgufWriter {
    let vocab = tiny_vocab().0.len();
    let a = spec.arch.gguf_arch();
    let key = |k: &str| format!("{a}.{k}");
    let (hd, dim, ffn) = (spec.head_dim, spec.dim, spec.ffn);
    let (qw, kv) = (spec.heads * hd, spec.kv_heads * hd);
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", a)
        // Not the architecture's name: llama.cpp keys vocabulary fix-ups on "phi3" in it.
        .add_str("general.name", "tiny-random")
        .add_u32("general.file_type", 7)
        .add_u32("general.quantization_version", 2)
        .add_u32(&key("block_count"), spec.layers as u32)
        .add_u32(&key("context_length"), spec.context_length)
        .add_u32(&key("embedding_length"), dim as u32)
        .add_u32(&key("feed_forward_length"), ffn as u32)
        .add_u32(&key("attention.head_count"), spec.heads as u32)
        .add_u32(&key("attention.head_count_kv"), spec.kv_heads as u32)
        .add_u32(&key("attention.key_length"), hd as u32)
        .add_u32(&key("attention.value_length"), hd as u32)
        .add_u32(&key("rope.dimension_count"), hd as u32)
        .add_f32(&key("attention.layer_norm_rms_epsilon"), 1e-6)
        .add_u32(&key("vocab_size"), vocab as u32);
    let theta = match spec.arch {
        TinyArch::Llama3 => 500_000.0,
        TinyArch::Mistral | TinyArch::Qwen2 | TinyArch::Qwen3 => 1_000_000.0,
        TinyArch::Phi3 => 10_000.0,
    };
    w.add_f32(&key("rope.freq_base"), theta);
    if spec.arch == TinyArch::Llama3 {
        w.add_str(&key("rope.scaling.type"), "linear")
            .add_f32(&key("rope.scaling.factor"), 2.0);
    }
    if let Some(win) = spec.declared_window() {
        w.add_u32(&key("attention.sliding_window"), win);
    }
    add_tiny_tokenizer(&mut w);

    let mut rng = Rng(spec.seed);
    let f32s = |w: &mut GgufWriter, name: &str, x: &[f32]| {
        w.add_tensor(
            name,
            &[x.len() as u64],
            GgmlType::F32,
            quantize(GgmlType::F32, x),
        );
    };
    // `rows x cols` with entries of scale `1/sqrt(cols)`; `zero_rows` leading rows are zero.
    let mat = |w: &mut GgufWriter,
               name: &str,
               rows: usize,
               cols: usize,
               ty: GgmlType,
               scale: f32,
               zero_rows: usize,
               rng: &mut Rng| {
        let mut x = rng.vec(rows * cols, scale / (cols as f32).sqrt(), 0.0);
        x[..zero_rows * cols].fill(0.0);
        w.add_tensor(name, &[cols as u64, rows as u64], ty, quantize(ty, &x));
    };
    let tied = matches!(spec.arch, TinyArch::Qwen2 | TinyArch::Qwen3);
    let specials = if tied { 3 } else { 0 };
    mat(
        &mut w,
        "token_embd.weight",
        vocab,
        dim,
        GgmlType::Q8_0,
        // Tied: the head's scale (logits of a few units); else of scale 1.
        if tied { 3.0 } else { (dim as f32).sqrt() },
        specials,
        &mut rng,
    );
    if spec.arch == TinyArch::Llama3 {
        f32s(&mut w, "rope_freqs.weight", &llama3_factors(hd / 2));
    }
    let mix = [GgmlType::Q8_0, GgmlType::F16, GgmlType::BF16];
    for l in 0..spec.layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let ty = |r: usize| mix[(l * 7 + r) % mix.len()];
        let norm = |rng: &mut Rng, n: usize| rng.vec(n, 0.2, 1.0);
        let x = norm(&mut rng, dim);
        f32s(&mut w, &n("attn_norm"), &x);
        if spec.arch == TinyArch::Phi3 {
            mat(
                &mut w,
                &n("attn_qkv"),
                qw + 2 * kv,
                dim,
                ty(0),
                1.0,
                0,
                &mut rng,
            );
        } else {
            mat(&mut w, &n("attn_q"), qw, dim, ty(0), 1.0, 0, &mut rng);
            mat(&mut w, &n("attn_k"), kv, dim, ty(1), 1.0, 0, &mut rng);
            mat(&mut w, &n("attn_v"), kv, dim, ty(2), 1.0, 0, &mut rng);
        }
        if spec.arch == TinyArch::Qwen2 {
            for (s, len) in [("attn_q", qw), ("attn_k", kv), ("attn_v", kv)] {
                let b = rng.vec(len, 0.5, 0.0);
                f32s(&mut w, &format!("blk.{l}.{s}.bias"), &b);
            }
        }
        if spec.arch == TinyArch::Qwen3 {
            let (q, k) = (rng.vec(hd, 0.5, 1.0), rng.vec(hd, 0.5, 1.0));
            f32s(&mut w, &n("attn_q_norm"), &q);
            f32s(&mut w, &n("attn_k_norm"), &k);
        }
        mat(&mut w, &n("attn_output"), dim, qw, ty(3), 1.0, 0, &mut rng);
        let x = norm(&mut rng, dim);
        f32s(&mut w, &n("ffn_norm"), &x);
        if spec.arch == TinyArch::Phi3 {
            mat(&mut w, &n("ffn_up"), 2 * ffn, dim, ty(4), 1.0, 0, &mut rng);
        } else {
            mat(&mut w, &n("ffn_gate"), ffn, dim, ty(4), 1.0, 0, &mut rng);
            mat(&mut w, &n("ffn_up"), ffn, dim, ty(5), 1.0, 0, &mut rng);
        }
        mat(&mut w, &n("ffn_down"), dim, ffn, ty(6), 1.0, 0, &mut rng);
    }
    let x = rng.vec(dim, 0.2, 1.0);
    f32s(&mut w, "output_norm.weight", &x);
    if !tied {
        // Logits of a few units, so greedy choices are not near ties.
        mat(
            &mut w,
            "output.weight",
            vocab,
            dim,
            GgmlType::Q8_0,
            3.0,
            3,
            &mut rng,
        );
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;

    #[test]
    fn every_tiny_arch_is_small_and_deterministic() {
        for arch in TinyArch::ALL {
            let spec = ArchSpec::parity(arch);
            let a = tiny_arch_gguf(&spec);
            assert_eq!(a, tiny_arch_gguf(&spec), "{arch:?}");
            assert!(a.len() < 1 << 20, "{arch:?}: {} bytes", a.len());
            let f = GgufFile::from_bytes(a).expect("parses");
            assert_eq!(f.architecture().unwrap(), arch.gguf_arch());
        }
    }
}
