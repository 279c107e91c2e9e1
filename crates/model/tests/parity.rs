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
//! diverged at near-ties. The bars below are the (9 of 10 prompts, 8 tokens) with a
//! logit tolerance that only allows for the reference's rounding to 4 decimals.

use std::path::PathBuf;

use pagewarden_kvcache::{KvPool, Owner, PoolConfig, RequestId, TenantId};
use pagewarden_model::{LoadOptions, Model};

/// Largest allowed |ours - llama.cpp| on each of the reference top-5 logits (the reference
/// stores 4 decimals).
const LOGIT_TOL: f32 = 0.01;
/// Greedy tokens that must match on (almost) every prompt.
const MIN_PREFIX: usize = 8;
/// Prompts on which the first `MIN_PREFIX` greedy tokens must match.
const MIN_CASES: usize = 9;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model_path() -> PathBuf {
    std::env::var_os("PAGEWARDEN_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"))
}

fn reference_path() -> PathBuf {
    std::env::var_os("PAGEWARDEN_REFERENCE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("tests/data/reference/smollm2-135m-instruct-q4_1.json"))
}

fn argmax(x: &[f32]) -> u32 {
    // Ties go to the lowest id, like llama.cpp's greedy sampler.
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn smollm2_matches_llama_cpp_reference() {
    let mp = model_path();
    let rp = reference_path();
    assert!(
        mp.exists(),
        "model file {} is missing: set PAGEWARDEN_MODEL or run scripts/fetch-model.sh",
        mp.display()
    );
    assert!(
        rp.exists(),
        "reference {} is missing: set PAGEWARDEN_REFERENCE",
        rp.display()
    );
    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&rp).unwrap()).expect("reference is JSON");
    let cases = reference["cases"].as_array().expect("cases array");
    assert!(!cases.is_empty());
    let model = Model::load(&mp, &LoadOptions::default()).expect("model loads");
    let pool = KvPool::new(PoolConfig::with_pages(model.kv_layout(16), 256));

    let (mut prefix_ok, mut all_ok, mut worst) = (0, 0, 0f32);
    for (ci, case) in cases.iter().enumerate() {
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        let prompt = ids(&case["prompt_tokens"]);
        let text = case["prompt"].as_str().expect("prompt text");
        assert_eq!(
            model.tokenizer().encode(text, true),
            prompt,
            "case {ci}: token ids differ from llama.cpp's"
        );
        let greedy = ids(&case["greedy_tokens"]);
        let top5: Vec<(u32, f32)> = case["first_step_top5"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["token"].as_u64().unwrap() as u32,
                    e["logit"].as_f64().unwrap() as f32,
                )
            })
            .collect();
        let owner = Owner {
            request: RequestId::random(),
            tenant: TenantId::new("parity"),
        };
        let mut seq = pool.allocate(owner, prompt.len()).unwrap();
        let mut logits = model.prefill(&mut seq, &prompt).expect("prefill");
        assert_eq!(
            argmax(&logits),
            top5[0].0,
            "case {ci}: top-1 differs from llama.cpp"
        );
        for &(tok, want) in &top5 {
            let d = (logits[tok as usize] - want).abs();
            worst = worst.max(d);
            assert!(
                d <= LOGIT_TOL,
                "case {ci}: logit of token {tok} is {} vs llama.cpp {want}",
                logits[tok as usize]
            );
        }
        let mut ours = Vec::new();
        for _ in 0..greedy.len() {
            let t = argmax(&logits);
            if t != greedy[ours.len()] && ours == greedy[..ours.len()] {
                eprintln!(
                    "case {ci} diverges at step {}: ours {t} (logit {}) llama.cpp {} ({})",
                    ours.len(),
                    logits[t as usize],
                    greedy[ours.len()],
                    logits[greedy[ours.len()] as usize]
                );
            }
            ours.push(t);
            if ours.len() == greedy.len() {
                break;
            }
            logits = model
                .decode_step(&mut [(&mut seq, t)])
                .pop()
                .unwrap()
                .expect("decode");
        }
        let matched = ours.iter().zip(&greedy).take_while(|(a, b)| a == b).count();
        eprintln!("case {ci}: {matched}/{} greedy tokens match", greedy.len());
        prefix_ok += usize::from(matched >= MIN_PREFIX);
        all_ok += usize::from(matched == greedy.len());
    }
    eprintln!(
        "parity: {prefix_ok}/{n} prompts match >= {MIN_PREFIX} greedy tokens, {all_ok}/{n} match all; \
         worst top-5 logit difference {worst:.4} (tolerance {LOGIT_TOL})",
        n = cases.len()
    );
    assert!(
        prefix_ok >= MIN_CASES.min(cases.len()),
        "only {prefix_ok}/{} prompts match the first {MIN_PREFIX} greedy tokens (need {MIN_CASES})",
        cases.len()
    );
}
