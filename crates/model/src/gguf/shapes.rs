//! Published models' shapes with random weights: the header (metadata and tensor entries) of a
//! model as its Q4_K_M file lays it out, for [`super::write_random`] to fill. A benchmark then
//! measures a real model's work (its matrices, their quantization, its vocabulary's width)
//! without its weights. The text such a model writes is noise.

use super::tiny::add_tiny_tokenizer_padded;
use super::{GgmlType, GgufWriter};

/// One tensor's entry: name, ggml dims (`dims[0]` the row length), type.
pub type TensorEntry = (String, Vec<u64>, GgmlType);

/// `LLAMA_FTYPE_MOSTLY_Q4_K_M`, `general.file_type` of a Q4_K_M file.
const FILE_TYPE_Q4_K_M: u32 = 15;

/// Whether llama.cpp's Q4_K_M gives layer `i` of `n` its larger type (Q6_K) for `attn_v` and
/// `ffn_down`: the first and last eighth and every third layer between (`use_more_bits` in
/// llama.cpp's `src/llama-quant.cpp`).
fn more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// Llama 3.2 1B (Instruct) in Q4_K_M: 16 blocks of width 2,048, 32 query and 8 KV heads of
/// 64, an FFN of 8,192, a vocabulary of 128,256 tied to the embedding (Q6_K, as llama.cpp
/// quantizes a tied head), Llama 3's RoPE base and frequency factors. The vocabulary is the
/// tiny byte-level one padded to that width (its tokens are not Llama 3's).
pub fn llama_3_2_1b_q4_k_m() -> (GgufWriter, Vec<TensorEntry>) {
    let (layers, dim, heads, kv_heads, head_dim, ffn, vocab) =
        (16usize, 2048u64, 32u64, 8u64, 64u64, 8192u64, 128_256u64);
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama")
        .add_str("general.name", "random Llama-3.2-1B shapes")
        .add_u32("general.file_type", FILE_TYPE_Q4_K_M)
        .add_u32("general.quantization_version", 2)
        .add_u32("llama.block_count", layers as u32)
        .add_u32("llama.context_length", 131_072)
        .add_u32("llama.embedding_length", dim as u32)
        .add_u32("llama.feed_forward_length", ffn as u32)
        .add_u32("llama.attention.head_count", heads as u32)
        .add_u32("llama.attention.head_count_kv", kv_heads as u32)
        .add_u32("llama.attention.key_length", head_dim as u32)
        .add_u32("llama.attention.value_length", head_dim as u32)
        .add_u32("llama.rope.dimension_count", head_dim as u32)
        .add_f32("llama.rope.freq_base", 500_000.0)
        .add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .add_u32("llama.vocab_size", vocab as u32);
    add_tiny_tokenizer_padded(&mut w, vocab as usize);

    let mut t: Vec<TensorEntry> = Vec::new();
    let mut add = |name: String, dims: &[u64], ty: GgmlType| t.push((name, dims.to_vec(), ty));
    add("token_embd.weight".into(), &[dim, vocab], GgmlType::Q6_K);
    add("rope_freqs.weight".into(), &[head_dim / 2], GgmlType::F32);
    for l in 0..layers {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let more = if more_bits(l, layers) {
            GgmlType::Q6_K
        } else {
            GgmlType::Q4_K
        };
        add(n("attn_norm"), &[dim], GgmlType::F32);
        add(n("attn_q"), &[dim, heads * head_dim], GgmlType::Q4_K);
        add(n("attn_k"), &[dim, kv_heads * head_dim], GgmlType::Q4_K);
        add(n("attn_v"), &[dim, kv_heads * head_dim], more);
        add(n("attn_output"), &[heads * head_dim, dim], GgmlType::Q4_K);
        add(n("ffn_norm"), &[dim], GgmlType::F32);
        add(n("ffn_gate"), &[dim, ffn], GgmlType::Q4_K);
        add(n("ffn_up"), &[dim, ffn], GgmlType::Q4_K);
        add(n("ffn_down"), &[ffn, dim], more);
    }
    add("output_norm.weight".into(), &[dim], GgmlType::F32);
    (w, t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_gives_llama_cpp_s_layers_the_larger_type() {
        // llama.cpp's Q4_K_M of a 16-block model: Q6_K for attn_v and ffn_down in these.
        let more: Vec<usize> = (0..16).filter(|&i| more_bits(i, 16)).collect();
        assert_eq!(more, [0, 1, 4, 7, 10, 13, 14, 15]);
    }

    #[test]
    fn llama_3_2_1b_has_its_parameter_count() {
        let (_, t) = llama_3_2_1b_q4_k_m();
        let params: u64 = t.iter().map(|(_, d, _)| d.iter().product::<u64>()).sum();
        // Llama 3.2 1B: 1.24 B parameters with the tied embedding counted once.
        assert!((1_230_000_000..1_240_000_000).contains(&params), "{params}");
    }
}
