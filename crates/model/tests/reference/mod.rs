//! Shared by the llama.cpp parity tests: the reference JSON (tests/data/reference), the model
//! path from the environment (failing, never skipping, when it is missing), and a greedy run
//! through `Model::prefill` / `Model::decode_step` over a local KV pool.

#![allow(dead_code)]

use std::path::PathBuf;

use pagewarden_kvcache::{KvPool, Owner, PoolConfig, RequestId, TenantId};
use pagewarden_model::{LoadOptions, Model};

/// Greedy tokens that must match on (almost) every prompt.
pub const MIN_PREFIX: usize = 8;
/// Prompts on which the first `MIN_PREFIX` greedy tokens must match.
pub const MIN_CASES: usize = 9;

pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The model at `$env`, else `models/<default>`; panics with how to get it when missing.
pub fn model_path(env: &str, default: &str) -> PathBuf {
    let p = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models").join(default));
    assert!(
        p.exists(),
        "model file {} is missing: set {env} or run `cargo run -p pagewarden -- fetch NAME`",
        p.display()
    );
    p
}

/// One reference prompt.
pub struct Case {
    pub prompt: String,
    pub prompt_tokens: Vec<u32>,
    pub greedy: Vec<u32>,
    /// (token, value) of the first step's top 5: logits or log-probabilities (`key`).
    pub top5: Vec<(u32, f32)>,
}

/// The cases of a reference file; `key` names the top-5 value (`logit` or `logprob`).
pub fn cases(path: &std::path::Path, key: &str) -> Vec<Case> {
    assert!(path.exists(), "reference {} is missing", path.display());
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).unwrap()).expect("reference is JSON");
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let cases = r["cases"].as_array().expect("cases array");
    assert!(!cases.is_empty());
    cases
        .iter()
        .map(|c| Case {
            prompt: c["prompt"].as_str().expect("prompt text").to_string(),
            prompt_tokens: ids(&c["prompt_tokens"]),
            greedy: ids(&c["greedy_tokens"]),
            top5: c["first_step_top5"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    let v = e[key].as_f64().unwrap() as f32;
                    (e["token"].as_u64().unwrap() as u32, v)
                })
                .collect(),
        })
        .collect()
}

/// Loads the model with default options.
pub fn load(path: &std::path::Path) -> Model {
    Model::load(path, &LoadOptions::default()).expect("model loads")
}

pub fn argmax(x: &[f32]) -> u32 {
    // Ties go to the lowest id, like llama.cpp's greedy sampler.
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Log-softmax of `logits` at `tok` (f64 sums).
pub fn logprob(logits: &[f32], tok: u32) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    (logits[tok as usize] as f64 - max - z.ln()) as f32
}

/// Runs `prompt` and then `steps` greedy tokens; returns the logits after the prompt and the
/// greedy tokens, printing where they leave `expected`.
pub fn greedy(
    model: &Model,
    pool: &KvPool,
    ci: usize,
    prompt: &[u32],
    expected: &[u32],
) -> (Vec<f32>, Vec<u32>) {
    let owner = Owner {
        request: RequestId::random(),
        tenant: TenantId::new("parity"),
    };
    let mut seq = pool.allocate(owner, prompt.len()).unwrap();
    let first = model.prefill(&mut seq, prompt).expect("prefill");
    let mut logits = first.clone();
    let mut ours = Vec::new();
    loop {
        let t = argmax(&logits);
        if ours.len() < expected.len()
            && t != expected[ours.len()]
            && ours == expected[..ours.len()]
        {
            eprintln!(
                "case {ci} diverges at step {}: ours {t} (logit {}) llama.cpp {} ({})",
                ours.len(),
                logits[t as usize],
                expected[ours.len()],
                logits[expected[ours.len()] as usize]
            );
        }
        ours.push(t);
        if ours.len() == expected.len() {
            break;
        }
        logits = model
            .decode_step(&mut [(&mut seq, t)])
            .pop()
            .unwrap()
            .expect("decode");
    }
    (first, ours)
}

/// A KV pool of `pages` 16-token pages for `model`.
pub fn pool(model: &Model, pages: usize) -> KvPool {
    KvPool::new(PoolConfig::with_pages(model.kv_layout(16), pages))
}

/// How many prompts' greedy continuations match llama.cpp's.
#[derive(Default)]
pub struct Tally {
    /// Prompts matching at least `MIN_PREFIX` tokens.
    pub prefix_ok: usize,
    /// Prompts matching every reference token.
    pub all_ok: usize,
    /// Prompts counted.
    pub n: usize,
}

impl Tally {
    /// Counts case `ci`, printing how far it matches.
    pub fn add(&mut self, ci: usize, ours: &[u32], greedy: &[u32]) {
        let matched = ours.iter().zip(greedy).take_while(|(a, b)| a == b).count();
        eprintln!("case {ci}: {matched}/{} greedy tokens match", greedy.len());
        self.prefix_ok += usize::from(matched >= MIN_PREFIX);
        self.all_ok += usize::from(matched == greedy.len());
        self.n += 1;
    }

    /// `a/n prompts match >= 8 greedy tokens, b/n match all`.
    pub fn summary(&self) -> String {
        let n = self.n;
        format!(
            "{}/{n} prompts match >= {MIN_PREFIX} greedy tokens, {}/{n} match all",
            self.prefix_ok, self.all_ok
        )
    }

    /// Fails unless at least `min` prompts (or all) match `MIN_PREFIX` tokens.
    pub fn assert_at_least(&self, min: usize) {
        assert!(
            self.prefix_ok >= min.min(self.n),
            "only {}/{} prompts match the first {MIN_PREFIX} greedy tokens (need {min})",
            self.prefix_ok,
            self.n
        );
    }
}
