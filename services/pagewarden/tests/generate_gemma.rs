//! `pagewarden generate` on the real Gemma 3 270M, as a user runs it: for each prompt of
//! tests/data/reference/gemma3-270m-q4_k_m.json, the binary's prompt token ids (BOS added
//! as the GGUF asks) equal llama.cpp's and its first 8 greedy tokens equal llama.cpp's on every
//! prompt (the reference is llama-server `-fa off`, whose arithmetic the default path follows;
//! see crates/model/tests/parity_gemma.rs). Needs PAGEWARDEN_GEMMA_MODEL (scripts/test.sh
//! exports it); fails, never skips, without it.

use std::path::PathBuf;
use std::process::Command;

const TOKENS: usize = 8;

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id"))
        .collect()
}

#[test]
fn generate_matches_llama_cpp_on_gemma3() {
    let model = std::env::var_os("PAGEWARDEN_GEMMA_MODEL")
        .map(PathBuf::from)
        .expect(
            "PAGEWARDEN_GEMMA_MODEL is not set: run scripts/test.sh, or `cargo run -p pagewarden -- \
             fetch gemma3-270m` and export PAGEWARDEN_GEMMA_MODEL=<its output>",
        );
    let reference = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/reference/gemma3-270m-q4_k_m.json");
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&reference).expect("reference file"))
            .expect("reference is JSON");
    let cases = r["cases"].as_array().expect("cases");
    let mut ok = 0;
    for (i, c) in cases.iter().enumerate() {
        let out = Command::new(env!("CARGO_BIN_EXE_pagewarden"))
            .args(["generate", "--json"])
            .args(["--max-tokens", &TOKENS.to_string()])
            .arg("--model")
            .arg(&model)
            .arg("--prompt")
            .arg(c["prompt"].as_str().expect("prompt"))
            .output()
            .expect("running pagewarden generate");
        assert!(
            out.status.success(),
            "case {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert_eq!(
            ids(&v["prompt_tokens"]),
            ids(&c["prompt_tokens"]),
            "case {i}: prompt token ids"
        );
        let got = ids(&v["tokens"]);
        let want = &ids(&c["greedy_tokens"])[..TOKENS];
        assert_eq!(got.first(), want.first(), "case {i}: first token");
        eprintln!("case {i}: {:?} -> {:?}", v["text"], got == want);
        ok += usize::from(got == want);
    }
    eprintln!(
        "pagewarden generate: {ok}/{} prompts match {TOKENS} greedy tokens",
        cases.len()
    );
    assert_eq!(ok, cases.len(), "only {ok}/{} prompts match", cases.len());
}
