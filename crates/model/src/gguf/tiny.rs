//! `tiny_llama_gguf`: a seeded, deterministic, tiny random Llama GGUF (byte-level BPE vocab,
//! ChatML specials and template, weights in a Q8_0/Q4_0/Q4_1/F16/F32 mix) for model-free tests.

use super::{quantize, GgmlType, GgufWriter};
use crate::tokenizer_bytes::bytes_to_token_text;

/// The ChatML template SmolLM2 ships (the tiny model uses the same one).
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Merges of the tiny vocabulary, highest priority first; each part is a byte or earlier merge.
const MERGES: &[&str] = &[
    "Ġ t",
    "h e",
    "i n",
    "Ġ a",
    "e r",
    "o n",
    "Ġt he",
    "r e",
    "a t",
    "e n",
    "Ġ s",
    "Ġ w",
    "o u",
    "i s",
    "o r",
    "i t",
    "Ġ o",
    "e s",
    "a n",
    "Ġ c",
    "l l",
    "Ġ b",
    "Ġ m",
    "Ġ f",
    "Ġ p",
    "in g",
    "Ġ h",
    "Ġ i",
    "Ġ d",
    "e d",
    "Ġa n",
    "Ġan d",
    "Ġ l",
    "Ġ n",
    "Ġ y",
    "o u",
    "Ġy ou",
    "Ġ T",
    "Ġ I",
    "1 2",
    "Ġ Ġ",
    "ĠĠ ĠĠ",
    "Ċ Ċ",
    "l o",
    "Ġ he",
    "Ġhe ll",
    "Ġhell o",
    "Ġ W",
    "Ġw or",
    "Ġwor l",
    "Ġworl d",
];

/// Special tokens of the tiny vocabulary (ids 0, 1, 2), all CONTROL.
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Shape of the tiny model. `Default` is 2 layers, dim 64, 4 heads, 2 KV heads, FFN 128.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyLlamaSpec {
    /// RNG seed for every weight.
    pub seed: u64,
    /// Number of transformer blocks.
    pub layers: usize,
    /// Embedding width (multiple of 32).
    pub dim: usize,
    /// Attention heads.
    pub heads: usize,
    /// KV heads (divides `heads`).
    pub kv_heads: usize,
    /// FFN hidden width (multiple of 32).
    pub ffn: usize,
    /// `llama.context_length`.
    pub context_length: u32,
    /// Omit `output.weight` so the head is tied to `token_embd.weight`.
    pub tied_output: bool,
}

impl Default for TinyLlamaSpec {
    fn default() -> Self {
        TinyLlamaSpec {
            seed: 0,
            layers: 2,
            dim: 64,
            heads: 4,
            kv_heads: 2,
            ffn: 128,
            context_length: 256,
            tied_output: false,
        }
    }
}

/// splitmix64: tiny, seedable, good enough for random weights.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub(crate) fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub(crate) fn vec(&mut self, n: usize, scale: f32, bias: f32) -> Vec<f32> {
        (0..n).map(|_| bias + scale * self.uniform()).collect()
    }
}

/// Writes the tiny vocabulary ([`tiny_vocab`]), its special token ids and the ChatML template
/// as `w`'s tokenizer metadata.
pub(crate) fn add_tiny_tokenizer(w: &mut GgufWriter) {
    add_tiny_tokenizer_padded(w, tiny_vocab().0.len());
}

/// [`add_tiny_tokenizer`] with the vocabulary padded to `len` tokens by plain tokens no text
/// encodes to (`<pad N>`): a tokenizer for a model whose embedding has a real vocabulary's
/// rows.
pub(crate) fn add_tiny_tokenizer_padded(w: &mut GgufWriter, len: usize) {
    let (mut tokens, mut types, merges) = tiny_vocab();
    for i in tokens.len()..len {
        tokens.push(format!("<pad {i}>"));
        types.push(1);
    }
    w.add_bool("tokenizer.ggml.add_space_prefix", false)
        .add_bool("tokenizer.ggml.add_bos_token", false)
        .add_str("tokenizer.ggml.model", "gpt2")
        .add_str("tokenizer.ggml.pre", "smollm")
        .add_str_array("tokenizer.ggml.tokens", &tokens)
        .add_i32_array("tokenizer.ggml.token_type", &types)
        .add_str_array("tokenizer.ggml.merges", &merges)
        .add_u32("tokenizer.ggml.bos_token_id", 1)
        .add_u32("tokenizer.ggml.eos_token_id", 2)
        .add_u32("tokenizer.ggml.unknown_token_id", 0)
        .add_u32("tokenizer.ggml.padding_token_id", 2)
        .add_str("tokenizer.chat_template", CHATML_TEMPLATE);
}

/// The tiny vocabulary: (tokens, token types, merges).
pub fn tiny_vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    let mut types = vec![3; SPECIALS.len()];
    for b in 0..=255u8 {
        tokens.push(bytes_to_token_text(&[b]));
        types.push(1);
    }
    let mut merges = Vec::new();
    for m in MERGES {
        let merged = m.replace(' ', "");
        if !tokens.contains(&merged) {
            tokens.push(merged);
            types.push(1);
            merges.push(m.to_string());
        }
    }
    (tokens, types, merges)
}

/// The default tiny Llama with weights drawn from `seed`.
pub fn tiny_llama_gguf(seed: u64) -> Vec<u8> {
    tiny_llama_gguf_with(&TinyLlamaSpec {
        seed,
        ..TinyLlamaSpec::default()
    })
}

/// A tiny Llama of the given shape. Weight types rotate through Q8_0, Q4_0, Q4_1, F16 and F32
/// across roles and layers, so every supported type is exercised; norms are F32.
pub fn tiny_llama_gguf_with(spec: &TinyLlamaSpec) -> Vec<u8> {
    let vocab = tiny_vocab().0.len();
    let head_dim = spec.dim / spec.heads;
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama")
        .add_str("general.name", "tiny-llama")
        .add_u32("general.file_type", 7)
        .add_u32("general.quantization_version", 2)
        .add_u32("llama.block_count", spec.layers as u32)
        .add_u32("llama.context_length", spec.context_length)
        .add_u32("llama.embedding_length", spec.dim as u32)
        .add_u32("llama.feed_forward_length", spec.ffn as u32)
        .add_u32("llama.attention.head_count", spec.heads as u32)
        .add_u32("llama.attention.head_count_kv", spec.kv_heads as u32)
        .add_f32("llama.rope.freq_base", 10000.0)
        .add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .add_u32("llama.vocab_size", vocab as u32)
        .add_u32("llama.rope.dimension_count", head_dim as u32);
    add_tiny_tokenizer(&mut w);

    let mut rng = Rng(spec.seed);
    let mix = [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::F16,
        GgmlType::F32,
    ];
    let add = |w: &mut GgufWriter, name: &str, dims: [usize; 2], ty: GgmlType, rng: &mut Rng| {
        let scale = 1.0 / (dims[0] as f32).sqrt();
        let x = rng.vec(dims[0] * dims[1], scale, 0.0);
        w.add_tensor(
            name,
            &[dims[0] as u64, dims[1] as u64],
            ty,
            quantize(ty, &x),
        );
    };
    let embd = rng.vec(spec.dim * vocab, 1.0, 0.0);
    w.add_tensor(
        "token_embd.weight",
        &[spec.dim as u64, vocab as u64],
        GgmlType::Q8_0,
        quantize(GgmlType::Q8_0, &embd),
    );
    let kv = spec.kv_heads * head_dim;
    for l in 0..spec.layers {
        let norm = |w: &mut GgufWriter, name: String, rng: &mut Rng| {
            let x = rng.vec(spec.dim, 0.1, 1.0);
            w.add_tensor(
                &name,
                &[spec.dim as u64],
                GgmlType::F32,
                quantize(GgmlType::F32, &x),
            );
        };
        norm(&mut w, format!("blk.{l}.attn_norm.weight"), &mut rng);
        let roles: [(&str, [usize; 2]); 7] = [
            ("attn_q", [spec.dim, spec.dim]),
            ("attn_k", [spec.dim, kv]),
            ("attn_v", [spec.dim, kv]),
            ("attn_output", [spec.dim, spec.dim]),
            ("ffn_gate", [spec.dim, spec.ffn]),
            ("ffn_up", [spec.dim, spec.ffn]),
            ("ffn_down", [spec.ffn, spec.dim]),
        ];
        for (r, (role, dims)) in roles.iter().enumerate() {
            if *role == "ffn_gate" {
                norm(&mut w, format!("blk.{l}.ffn_norm.weight"), &mut rng);
            }
            let ty = mix[(l * roles.len() + r) % mix.len()];
            add(
                &mut w,
                &format!("blk.{l}.{role}.weight"),
                *dims,
                ty,
                &mut rng,
            );
        }
    }
    let x = rng.vec(spec.dim, 0.1, 1.0);
    w.add_tensor(
        "output_norm.weight",
        &[spec.dim as u64],
        GgmlType::F32,
        quantize(GgmlType::F32, &x),
    );
    if !spec.tied_output {
        add(
            &mut w,
            "output.weight",
            [spec.dim, vocab],
            GgmlType::Q4_1,
            &mut rng,
        );
    }
    w.to_bytes()
}
