//! Parity with llama.cpp on the real Gemma 3 270M (Q4_K_M: Q4_K, Q5_0, Q6_K and Q8_0 weights,
//! SentencePiece vocabulary, sliding-window layers), against
//! tests/data/reference/gemma3-270m-q4_k_m.json. Needs the model (PAGEWARDEN_GEMMA_MODEL, or
//! scripts/fetch-model.sh gemma3-270m); fails, never skips, without it.
//!
//! Asserted: prompt ids (BOS added as the GGUF asks) equal to llama.cpp's on every prompt, the
//! same first greedy token on every prompt, and the first `MIN_PREFIX` greedy tokens equal on
//! at least `MEASURED_CASES` prompts: the bar of `MIN_CASES` (9/10).
//!
//! The model runs with llama.cpp's flash-attention arithmetic (`LoadOptions::flash_attention`):
//! llama-server's `-fa auto` default resolves to flash attention on a CPU model (f16 value
//! accumulation; llama-context.cpp probes whether the op runs on the layer's device). The
//! reference records no flags, so that is inferred, and the measured match below supports it. Its Q4_K matrices (attn_output, half the ffn_down) take llama.cpp's
//! repacked order (`kernels/src/matmul/q4k_repacked.rs`: on AVX2 machines ggml repacks Q4_K
//! into 8-row blocks, gemm for prompt rows in groups of four, gemv for the rest and decode).
//! Measured: 9/10 prompts match 8 tokens (4/10 all 24); each change alone left 5 or 6 of 10
//! (repack without flash attention 6/10, flash attention without repack 5/10, neither 5/10).
//! Still not llama.cpp's bits everywhere: case 7 differs at its second token (logits 0.12
//! apart), and the first step's top-5 log-probabilities are up to 0.6 from the reference's.
//! Gemma amplifies the last bit (outlier channels set the 8-bit activation scales, so one
//! flipped rounding moves a whole block).

mod reference;

use pagewarden_model::{LoadOptions, Model};
use reference::{argmax, logprob, Tally, MIN_CASES};

/// Prompts on which the first `MIN_PREFIX` greedy tokens match today (see the module doc).
const MEASURED_CASES: usize = 9;

#[test]
fn gemma3_matches_llama_cpp_reference() {
    let mp = reference::model_path("PAGEWARDEN_GEMMA_MODEL", "gemma-3-270m-q4_k_m.gguf");
    let cases = reference::cases(
        &reference::workspace().join("tests/data/reference/gemma3-270m-q4_k_m.json"),
        "logprob",
    );
    // llama-server's default (`-fa auto`) runs flash attention on the CPU.
    let opts = LoadOptions {
        flash_attention: true,
        ..LoadOptions::default()
    };
    let model = Model::load(&mp, &opts).expect("model loads");
    assert_eq!(model.config().arch.name(), "gemma3");
    let pool = reference::pool(&model, 64);

    let (mut ids_ok, mut tally, mut worst) = (0, Tally::default(), 0f32);
    for (ci, case) in cases.iter().enumerate() {
        let ids = model.tokenizer().encode_prompt(&case.prompt);
        ids_ok += usize::from(ids == case.prompt_tokens);
        let (logits, ours) =
            reference::greedy(&model, &pool, ci, &case.prompt_tokens, &case.greedy);
        assert_eq!(
            argmax(&logits),
            case.top5[0].0,
            "case {ci}: first token differs from llama.cpp"
        );
        let mut line = format!("case {ci} top-5 log-probabilities (ours / llama.cpp):");
        for &(tok, want) in &case.top5 {
            let got = logprob(&logits, tok);
            worst = worst.max((got - want).abs());
            line += &format!(" {tok}: {got:.4}/{want:.4}");
        }
        eprintln!("{line}");
        tally.add(ci, &ours, &case.greedy);
    }
    let n = cases.len();
    eprintln!(
        "gemma3 parity: prompt ids {ids_ok}/{n}; {} (issue's bar: {MIN_CASES}); worst top-5 \
         log-probability difference {worst:.4}",
        tally.summary()
    );
    assert_eq!(ids_ok, n, "prompt token ids differ from llama.cpp's");
    tally.assert_at_least(MEASURED_CASES);
}
