//! Gemma 3's SentencePiece tokenizer (`tokenizer.ggml.model = llama`, vocabulary of 262,144,
//! byte fallback) against llama.cpp's ids. Fails (does not skip) when the model is missing:
//! `cargo run -p pagewarden -- fetch gemma3-270m` or PAGEWARDEN_GEMMA_MODEL.

use std::path::PathBuf;

use pagewarden_model::{GgufFile, Tokenizer};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tokenizer() -> Tokenizer {
    let p = std::env::var_os("PAGEWARDEN_GEMMA_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models/gemma-3-270m-q4_k_m.gguf"));
    assert!(
        p.is_file(),
        "model file {} is missing: run cargo run -p pagewarden -- fetch gemma3-270m or set \
         PAGEWARDEN_GEMMA_MODEL",
        p.display()
    );
    let f = GgufFile::open(&p).expect("model opens");
    assert_eq!(
        f.metadata().get_str("tokenizer.ggml.model").unwrap(),
        "llama"
    );
    Tokenizer::from_gguf(&f).expect("tokenizer builds")
}

fn reference() -> serde_json::Value {
    let p = workspace().join("tests/data/reference/gemma3-270m-q4_k_m.json");
    let text = std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("reference file {} is missing ({e})", p.display()));
    serde_json::from_str(&text).expect("reference json parses")
}

#[test]
fn prompts_tokenize_exactly_like_llama_cpp() {
    let tok = tokenizer();
    assert_eq!(tok.vocab_size(), 262_144);
    assert!(tok.add_bos(), "Gemma's GGUF asks for BOS");
    let bos = tok.bos_token().expect("a BOS token");
    let r = reference();
    let cases = r["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 10);
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let prompt = c["prompt"].as_str().expect("prompt");
        let want: Vec<u32> = c["prompt_tokens"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect();
        let mut got = vec![bos];
        got.extend(tok.encode(prompt, true));
        if got != want {
            failures.push(format!(
                "case {i} {prompt:?}:\n  want {want:?}\n  got  {got:?}"
            ));
        }
        assert_eq!(tok.decode(&got[1..]), prompt, "case {i} round-trips");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn characters_without_a_token_fall_back_to_bytes() {
    let tok = tokenizer();
    // The first character of CJK Extension B that the vocabulary does not spell: its UTF-8
    // bytes come out as one byte token each, and decode back to the character.
    let c = (0x20000..0x2A6DF)
        .filter_map(char::from_u32)
        .find(|c| tok.token_id(c.to_string().as_bytes()).is_none())
        .expect("some Extension B character has no token");
    let text = c.to_string();
    let ids = tok.encode(&text, false);
    assert_eq!(ids.len(), text.len(), "{c:?} -> {ids:?}");
    for (id, b) in ids.iter().zip(text.bytes()) {
        assert_eq!(tok.token_bytes(*id), [b], "byte token of {b:#04x}");
    }
    assert_eq!(tok.decode(&ids), text);
}

#[test]
fn encode_prompt_adds_bos_once_as_the_gguf_asks() {
    let tok = tokenizer();
    let bos = tok.bos_token().expect("a BOS token");
    let mut want = vec![bos];
    want.extend(tok.encode("Hello", true));
    assert_eq!(tok.encode_prompt("Hello"), want);
    // A prompt that already starts with BOS (a rendered chat template) does not get another.
    assert_eq!(tok.encode_prompt("<bos>Hello"), want);
}
