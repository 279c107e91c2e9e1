//! Parity with llama.cpp for every architecture, without downloading weights: each tiny
//! random model (`gguf::tiny_arch`) is regenerated from its seed, checked to be the very file
//! llama.cpp was queried with (sha256 in `tests/data/arch/reference.json`, written by
//! `make_reference.sh` beside it), and run through `Model::prefill` / `decode_step`: the greedy
//! tokens must equal llama.cpp's and the first step's top log-probabilities must be within
//! `LOGPROB_TOL`. Each architecture runs once per instruction set this CPU has (a child
//! process per ISA: the kernels pick theirs once per process, `PAGEWARDEN_ISA`).
//!
//! What each file exercises: `llama3` Llama 3's `rope_freqs` and linear RoPE scaling;
//! `mistral` (declared `llama`) a sliding window llama.cpp ignores, with prompts longer than
//! it; `qwen2` Q/K/V biases and NeoX RoPE; `qwen3` per-head Q/K norms and a head wider than
//! `dim / heads`; `phi3` fused QKV and gate-up and its ignored window. All use GQA and Q8_0,
//! F16 and BF16 weights.

mod reference;

use std::path::PathBuf;
use std::process::Command;

use pagewarden_kernels::Isa;
use pagewarden_model::gguf::{tiny_arch_gguf, ArchSpec, TinyArch};
use pagewarden_model::{LoadOptions, Model};
use sha2::{Digest, Sha256};

/// Largest allowed |ours - llama.cpp| on a first-step top log-probability. Measured worst
/// differences (the same on portable, AVX2 and AVX-512): llama3 0.0088, mistral 0.0055, phi3
/// 0.0039, qwen2 0.0215, qwen3 0.0215. Rounding explains the first three (llama.cpp rounds
/// activations to f16 before an F16 product; float sums run in another order); the two
/// models with a tied head differ about 2.5x more and the cause is not yet found. The bar is
/// about twice the worst, below what one switched-off architecture detail moves.
const LOGPROB_TOL: f32 = 0.05;

/// Set in a child: the ISA it must run on.
const CHILD_ISA: &str = "PAGEWARDEN_PARITY_ARCH_ISA";

fn reference() -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/arch/reference.json");
    serde_json::from_slice(&std::fs::read(&p).expect("tests/data/arch/reference.json"))
        .expect("reference is JSON")
}

/// Runs `test` (this file's test named so) in a child per ISA, or, in a child, checks `arch`.
fn on_every_isa(test: &str, arch: TinyArch) {
    if let Ok(isa) = std::env::var(CHILD_ISA) {
        assert_eq!(
            Isa::detect().name(),
            isa,
            "the child runs on the ISA it was given"
        );
        check(arch);
        return;
    }
    for isa in Isa::available() {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ISA, isa.name())
            .env("PAGEWARDEN_ISA", isa.name())
            .env_remove("PAGEWARDEN_FORCE_PORTABLE")
            .output()
            .expect("the test binary runs");
        let text = String::from_utf8_lossy(&out.stderr);
        eprintln!("--- {} on {isa} ---\n{text}", arch.name());
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "{} differs from llama.cpp on {isa}",
            arch.name()
        );
    }
}

fn check(arch: TinyArch) {
    let r = reference();
    let m = r["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == arch.name())
        .unwrap_or_else(|| panic!("no reference for {}", arch.name()));
    let bytes = tiny_arch_gguf(&ArchSpec::parity(arch));
    assert_eq!(
        format!("{:x}", Sha256::digest(&bytes)),
        m["sha256"].as_str().unwrap(),
        "{}: the generator no longer writes the file the reference was made from \
         (rerun tests/data/arch/make_reference.sh)",
        arch.name()
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{}.gguf", arch.name()));
    std::fs::write(&path, &bytes).unwrap();
    let model = Model::load(&path, &LoadOptions::default()).expect("loads");
    let pool = reference::pool(&model, 64);
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let mut worst = 0f32;
    for (ci, case) in m["cases"].as_array().unwrap().iter().enumerate() {
        let (prompt, greedy) = (ids(&case["prompt_tokens"]), ids(&case["greedy_tokens"]));
        assert!(!greedy.is_empty());
        let (logits, ours) = reference::greedy(&model, &pool, ci, &prompt, &greedy);
        for e in case["first_step_top"].as_array().unwrap() {
            let (tok, want) = (
                e["token"].as_u64().unwrap() as u32,
                e["logprob"].as_f64().unwrap() as f32,
            );
            let got = reference::logprob(&logits, tok);
            worst = worst.max((got - want).abs());
            assert!(
                (got - want).abs() <= LOGPROB_TOL,
                "{} case {ci}: logprob of token {tok} is {got}, llama.cpp's {want}",
                arch.name()
            );
        }
        assert_eq!(
            ours,
            greedy,
            "{} case {ci}: greedy tokens differ from llama.cpp's",
            arch.name()
        );
    }
    eprintln!(
        "{} on {}: greedy tokens equal; worst first-step logprob difference {worst:.5} \
         (tolerance {LOGPROB_TOL})",
        arch.name(),
        Isa::detect()
    );
}

#[test]
fn llama3_rope_freqs_and_linear_scaling_match_llama_cpp() {
    on_every_isa(
        "llama3_rope_freqs_and_linear_scaling_match_llama_cpp",
        TinyArch::Llama3,
    );
}

#[test]
fn mistral_as_llama_ignores_its_window_like_llama_cpp() {
    on_every_isa(
        "mistral_as_llama_ignores_its_window_like_llama_cpp",
        TinyArch::Mistral,
    );
}

#[test]
fn qwen2_biases_and_neox_rope_match_llama_cpp() {
    on_every_isa(
        "qwen2_biases_and_neox_rope_match_llama_cpp",
        TinyArch::Qwen2,
    );
}

#[test]
fn qwen3_qk_norms_match_llama_cpp() {
    on_every_isa("qwen3_qk_norms_match_llama_cpp", TinyArch::Qwen3);
}

#[test]
fn phi3_fused_tensors_match_llama_cpp() {
    on_every_isa("phi3_fused_tensors_match_llama_cpp", TinyArch::Phi3);
}
