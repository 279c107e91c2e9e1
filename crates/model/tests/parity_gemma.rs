//! Parity with llama.cpp on the real Gemma 3 270M (Q4_K_M: Q4_K, Q5_0, Q6_K and Q8_0 weights,
//! SentencePiece vocabulary, sliding-window layers), against two reference files made by
//! `gemma3_reference.py` (llama-server, `-fa off`): tests/data/reference/gemma3-270m-q4_k_m.json
//! (the prompts used while fixing the differences) and gemma3-270m-q4_k_m-heldout.json (ten
//! prompts written after the fixes, never used to tune anything). Needs the model
//! (PAGEWARDEN_GEMMA_MODEL, or cargo run -p pagewarden -- fetch gemma3-270m); fails, never skips, without
//! it.
//!
//! The default path (no flash attention) computes llama.cpp's bits: its prompt ids, every
//! greedy token, and first-step log-probabilities equal up to llama-server's own rounding of
//! them (it reports f32 log-probabilities of the same logits; measured at most 0.0006 apart).
//! Asserted: prompt ids equal on every prompt, all `GREEDY` tokens equal on every prompt, and
//! every first-step top-5 log-probability within `TOP5_TOLERANCE`. Three arithmetic details
//! make it exact (each alone, undone, breaks some prompts):
//! - llama-server ends a batch 4 and 516 tokens before a prompt's end for a sliding-window
//!   model (`llama::prefill_chunks`), and a product's row count picks llama.cpp's kernel;
//! - from 8 rows on, llama.cpp's Q6_K (and unrepacked Q4_K/Q5_K) products take its tiled
//!   kernel's float order (`kernels/src/cpu/matmul/kquant_tiled.rs`), and the last layer's FFN
//!   runs on the output rows only;
//! - queries are scaled before their f16 rounding, not the scores after (`score_scale`).
//!
//! Each file runs under both packings of the weights (`Packing`: a decode worker's, and a
//! prefill worker's, whose Q5_0 is widened for the 512-bit kernels): the same bits either way.

mod reference;

use pagewarden_model::{LoadOptions, Model, Packing};
use reference::{argmax, logprob, Tally};

/// Greedy tokens per prompt in the reference files: every one must match.
const GREEDY: usize = 24;

/// Largest first-step top-5 log-probability difference allowed: the project's parity bar is
/// 0.02, and with bit-equal logits the only difference left is llama-server's f32 rounding of
/// the log-probabilities it reports (well under a thousandth), so a tenth of the bar leaves
/// room for that and still fails on a real difference in the graph (one f16 rounding of one
/// attention weight moves a log-probability by several hundredths).
const TOP5_TOLERANCE: f32 = 0.002;

#[test]
fn gemma3_matches_llama_cpp_on_the_development_prompts() {
    check("gemma3-270m-q4_k_m.json");
}

#[test]
fn gemma3_matches_llama_cpp_on_held_out_prompts() {
    check("gemma3-270m-q4_k_m-heldout.json");
}

fn check(file: &str) {
    for packing in [Packing::Bandwidth, Packing::Compute] {
        check_packed(file, packing);
    }
}

fn check_packed(file: &str, packing: Packing) {
    let mp = reference::model_path("PAGEWARDEN_GEMMA_MODEL", "gemma-3-270m-q4_k_m.gguf");
    let cases = reference::cases(
        &reference::workspace()
            .join("tests/data/reference")
            .join(file),
        "logprob",
    );
    let opts = LoadOptions {
        packing,
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
        "gemma3 parity ({file}, {packing:?}): prompt ids {ids_ok}/{n}; {}; worst top-5 \
         log-probability difference {worst:.4}",
        tally.summary()
    );
    assert_eq!(ids_ok, n, "prompt token ids differ from llama.cpp's");
    assert!(
        worst <= TOP5_TOLERANCE,
        "{file}: first-step top-5 log-probabilities {worst} apart (tolerance {TOP5_TOLERANCE})"
    );
    assert!(
        cases.iter().all(|c| c.greedy.len() == GREEDY),
        "{file}: {GREEDY} greedy tokens per prompt"
    );
    assert_eq!(
        tally.all_ok, tally.n,
        "{file}: every greedy token of every prompt equal to llama.cpp's"
    );
}
