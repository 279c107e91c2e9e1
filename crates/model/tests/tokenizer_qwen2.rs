//! The real Qwen2 vocabulary (152,064 tokens, `tokenizer.ggml.pre = deepseek-r1-qwen`) from the
//! header of DeepSeek-R1-Distill-Qwen-7B Q4_K_M, against llama.cpp's ids in
//! tests/data/reference/qwen2-tokenizer.json (`qwen2_tokenizer_reference.py` beside it).
//! The header is a truncated GGUF (its tensors lie past its end): it opens for its metadata
//! only. Fails, never skips, without it: `cargo run -p pagewarden -- fetch qwen2-7b-header` or
//! PAGEWARDEN_QWEN2_HEADER.

use std::path::PathBuf;
use std::sync::OnceLock;

use pagewarden_model::gguf::Contents;
use pagewarden_model::{GgufError, GgufFile, LoadOptions, Model, ModelError, Tokenizer};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn header_path() -> PathBuf {
    let p = std::env::var_os("PAGEWARDEN_QWEN2_HEADER")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models/qwen2-7b-q4_k_m.header.gguf"));
    assert!(
        p.is_file(),
        "Qwen2 header {} is missing: run cargo run -p pagewarden -- fetch qwen2-7b-header or set \
         PAGEWARDEN_QWEN2_HEADER",
        p.display()
    );
    p
}

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let f = GgufFile::open_metadata(&header_path()).expect("the header opens");
        Tokenizer::from_gguf(&f).expect("tokenizer builds")
    })
}

struct Case {
    text: String,
    ids: Vec<u32>,
    ids_text: Vec<u32>,
}

fn cases(set: &str) -> Vec<Case> {
    let p = workspace().join("tests/data/reference/qwen2-tokenizer.json");
    let text = std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("reference file {} is missing ({e})", p.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("reference json parses");
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    v[set]
        .as_array()
        .expect("a set of cases")
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().expect("text").to_string(),
            ids: ids(&c["ids"]),
            ids_text: ids(&c["ids_text"]),
        })
        .collect()
}

/// Every case of `set` tokenized both ways; the mismatches, described.
fn mismatches(set: &str) -> (usize, Vec<String>) {
    let tok = tokenizer();
    let cases = cases(set);
    let mut bad = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        for (special, want) in [(true, &c.ids), (false, &c.ids_text)] {
            let got = tok.encode(&c.text, special);
            if &got != want {
                bad.push(format!(
                    "{set} {i} {:?} (special {special}):\n  want {want:?}\n  got  {got:?}",
                    c.text
                ));
            }
        }
    }
    (cases.len(), bad)
}

#[test]
fn header_opens_for_metadata_only() {
    let p = header_path();
    let f = GgufFile::open_metadata(&p).expect("the header opens");
    assert_eq!(f.contents(), Contents::MetadataOnly);
    assert_eq!(f.architecture().unwrap(), "qwen2");
    assert_eq!(f.tensors().len(), 339, "the tensor entries are listed");
    assert!(f.tensor("token_embd.weight").is_none(), "but hold no data");
    // The strict open names the truncation; loading it as a model is a clear error.
    let e = GgufFile::open(&p).unwrap_err();
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    assert!(e.to_string().contains("truncated"), "{e}");
    let e = Model::from_gguf(f, &LoadOptions::default()).unwrap_err();
    assert!(
        matches!(e, ModelError::Gguf(GgufError::MetadataOnly)),
        "{e}"
    );
}

#[test]
fn vocabulary_is_read_whole() {
    let tok = tokenizer();
    assert_eq!(tok.vocab_size(), 152_064);
    assert!(tok.add_bos(), "the file asks for BOS");
    assert_eq!(tok.bos_token(), Some(151_646));
    assert_eq!(tok.eos_token(), Some(151_643));
    assert_eq!(tok.token_id("<｜User｜>".as_bytes()), Some(151_644));
}

#[test]
fn dev_strings_tokenize_like_llama_cpp() {
    let (n, bad) = mismatches("dev");
    assert!(n >= 100, "{n} dev strings");
    assert!(
        bad.is_empty(),
        "{} of {n} dev strings differ:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn held_out_strings_tokenize_like_llama_cpp() {
    let (n, bad) = mismatches("heldout");
    assert!(n >= 100, "{n} held-out strings");
    eprintln!("qwen2 held-out: {} of {n} strings differ", bad.len());
    assert!(
        bad.is_empty(),
        "{} of {n} held-out strings differ:\n{}",
        bad.len(),
        bad.join("\n")
    );
}
