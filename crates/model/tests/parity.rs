//! Parity with llama.cpp on the real SmolLM2-135M-Instruct Q4_1 model: for every case of the
//! reference JSON, prompt token ids equal to llama.cpp's, the same top-1 first token, the
//! reference top-5 logits within `LOGIT_TOL`, and greedy continuations equal to llama.cpp's
//! for at least the first `MIN_PREFIX` tokens on at least `MIN_CASES` prompts. Needs the model
//! (env PAGEWARDEN_MODEL) and reference (env PAGEWARDEN_REFERENCE); fails, never skips, when
//! either is missing.
//!
//! Measured: our logits are bit-identical to llama.cpp's (CPU, AVX-512 build, flash attention
//! off, f16 KV): worst top-5 difference 0.0000 against the reference's 4 decimals, and all 10
//! prompts match every greedy token. That takes ggml's rounding everywhere, not just its
//! quantization: the vectorized `exp` in SiLU and softmax, fused multiply-adds in RoPE and
//! the f16 attention sums in ggml's lane order (see `pagewarden_kernels::expf`). Before that,
//! one-ulp differences flipped an 8-bit activation rounding every few layers and two prompts
//! diverged at near-ties. The bars below are the project's parity bar (9 of 10 prompts, 8 tokens) with a
//! logit tolerance that only allows for the reference's rounding to 4 decimals.

mod reference;

use std::path::PathBuf;

use reference::{argmax, Tally, MIN_CASES};

/// Largest allowed |ours - llama.cpp| on each of the reference top-5 logits (the reference
/// stores 4 decimals).
const LOGIT_TOL: f32 = 0.01;

fn reference_path() -> PathBuf {
    std::env::var_os("PAGEWARDEN_REFERENCE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            reference::workspace().join("tests/data/reference/smollm2-135m-instruct-q4_1.json")
        })
}

#[test]
fn smollm2_matches_llama_cpp_reference() {
    let mp = reference::model_path("PAGEWARDEN_MODEL", "SmolLM2-135M-Instruct.Q4_1.gguf");
    let cases = reference::cases(&reference_path(), "logit");
    let model = reference::load(&mp);
    let pool = reference::pool(&model, 256);

    let (mut tally, mut worst) = (Tally::default(), 0f32);
    for (ci, case) in cases.iter().enumerate() {
        assert_eq!(
            model.tokenizer().encode(&case.prompt, true),
            case.prompt_tokens,
            "case {ci}: token ids differ from llama.cpp's"
        );
        let (logits, ours) =
            reference::greedy(&model, &pool, ci, &case.prompt_tokens, &case.greedy);
        assert_eq!(
            argmax(&logits),
            case.top5[0].0,
            "case {ci}: top-1 differs from llama.cpp"
        );
        for &(tok, want) in &case.top5 {
            let d = (logits[tok as usize] - want).abs();
            worst = worst.max(d);
            assert!(
                d <= LOGIT_TOL,
                "case {ci}: logit of token {tok} is {} vs llama.cpp {want}",
                logits[tok as usize]
            );
        }
        tally.add(ci, &ours, &case.greedy);
    }
    eprintln!(
        "parity: {}; worst top-5 logit difference {worst:.4} (tolerance {LOGIT_TOL})",
        tally.summary()
    );
    tally.assert_at_least(MIN_CASES);
}
