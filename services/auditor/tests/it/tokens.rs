//! The probe's token counts with the real model tokenizer: they match llama.cpp's reference
//! ids, and every filler word of a probe prompt is exactly one token (the step plan relies on
//! it to know which prompts certainly fit and which certainly do not).

use std::path::PathBuf;

use pagewarden_auditor::probe::plan;
use pagewarden_auditor::tokens::{GgufTokenCounter, TokenCounter};

fn model_path() -> PathBuf {
    let p = std::env::var("PAGEWARDEN_MODEL").unwrap_or_else(|_| {
        panic!("PAGEWARDEN_MODEL is not set: point it at SmolLM2-135M-Instruct.Q4_1.gguf (scripts/test.sh does)")
    });
    let p = PathBuf::from(p);
    assert!(
        p.exists(),
        "PAGEWARDEN_MODEL={} does not exist",
        p.display()
    );
    p
}

fn reference() -> serde_json::Value {
    let path = std::env::var("PAGEWARDEN_REFERENCE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/data/reference/smollm2-135m-instruct-q4_1.json")
        });
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading reference {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

#[test]
fn counts_match_the_reference_and_filler_is_one_token_per_word() {
    let path = model_path();
    let counter = GgufTokenCounter::open(&path).unwrap();
    let file = pagewarden_model::gguf::GgufFile::open(&path).unwrap();
    let bos = usize::from(
        pagewarden_model::tokenizer::Tokenizer::from_gguf(&file)
            .unwrap()
            .add_bos(),
    );
    let cases = reference()["cases"].as_array().unwrap().clone();
    assert!(!cases.is_empty());
    for c in &cases {
        let prompt = c["prompt"].as_str().unwrap();
        let ids = c["prompt_tokens"].as_array().unwrap().len();
        assert_eq!(
            counter.count(prompt).unwrap() as usize,
            ids + bos,
            "prompt {prompt:?}"
        );
    }
    let (a, b) = ("PWCANARY-0123456789abcdef", "PWCANARY-fedcba9876543210");
    let base = counter.count(&plan::prompt(a, b, 0)).unwrap();
    for words in [16, 100, 1000] {
        let n = counter.count(&plan::prompt(a, b, words)).unwrap();
        assert_eq!(
            n - base,
            words,
            "{words} filler words must be {words} tokens"
        );
    }
    assert!(
        base < 48,
        "two markers + BOS fit the plan's allowance: {base}"
    );
}
