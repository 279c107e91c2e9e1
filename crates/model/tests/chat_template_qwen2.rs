//! The real Qwen2 header's chat template (DeepSeek-R1-Distill-Qwen's: BOS, system prompt first,
//! `<｜User｜>` / `<｜Assistant｜>` turns, reasoning cut from earlier answers, tool outputs)
//! rendered as llama.cpp's server renders it (tests/data/reference/qwen2-chat-template.json,
//! from `qwen2_template_reference.py` beside it). Needs the header: PAGEWARDEN_QWEN2_HEADER or
//! `cargo run -p pagewarden -- fetch qwen2-7b-header`; fails, never skips, without it.

use std::path::PathBuf;

use pagewarden_model::{ChatMessage, ChatTemplate, GgufFile, Tokenizer};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn qwen2_template_renders_as_llama_cpp_does() {
    let p = std::env::var_os("PAGEWARDEN_QWEN2_HEADER")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models/qwen2-7b-q4_k_m.header.gguf"));
    assert!(
        p.is_file(),
        "{} is missing: run cargo run -p pagewarden -- fetch qwen2-7b-header or set \
         PAGEWARDEN_QWEN2_HEADER",
        p.display()
    );
    let f = GgufFile::open_metadata(&p).expect("the header opens");
    let t = ChatTemplate::from_gguf(&f)
        .expect("the template compiles")
        .expect("the header has a template");
    let tok = Tokenizer::from_gguf(&f).expect("tokenizer builds");
    let r: serde_json::Value = serde_json::from_slice(
        &std::fs::read(workspace().join("tests/data/reference/qwen2-chat-template.json"))
            .expect("reference file"),
    )
    .expect("reference is JSON");
    let convs = r["conversations"].as_array().expect("conversations");
    assert!(convs.len() >= 4);
    for (i, c) in convs.iter().enumerate() {
        let messages: Vec<ChatMessage> =
            serde_json::from_value(c["messages"].clone()).expect("messages");
        let add = c["add_generation_prompt"].as_bool().expect("flag");
        let want = c["prompt"].as_str().expect("prompt");
        let got = t.render(&messages, add).expect("renders");
        // The server hands back the prompt without the template's leading BOS text: it adds
        // BOS as a token when it tokenizes, as `encode_prompt` does.
        let bos = "<｜begin▁of▁sentence｜>";
        assert_eq!(got.strip_prefix(bos), Some(want), "conversation {i}");
        // Plain content: the guarded path yields the ids of the rendered text.
        assert_eq!(
            t.encode(&tok, &messages, add).unwrap(),
            tok.encode_prompt(want),
            "conversation {i} ids"
        );
    }
}
