//! Chat templates: SmolLM2's real template reproduces the reference's rendered chat prompt;
//! HF-style features (raise_exception, loop vars, namespace, tojson, string methods) work.

use std::path::PathBuf;

use pagewarden_model::chat::strftime_utc;
use pagewarden_model::{tiny_llama_gguf, ChatMessage, ChatTemplate, GgufFile, Tokenizer};

fn model_path() -> PathBuf {
    let p = std::env::var_os("PAGEWARDEN_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        p.is_file(),
        "model file {} is missing: run `cargo run -p pagewarden -- fetch smollm2` or set PAGEWARDEN_MODEL",
        p.display()
    );
    p
}

fn reference_prompt(i: usize) -> (String, Vec<u32>) {
    let p = std::env::var_os("PAGEWARDEN_REFERENCE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/data/reference/smollm2-135m-instruct-q4_1.json")
        });
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "reference file {} is missing ({e}): set PAGEWARDEN_REFERENCE",
            p.display()
        )
    });
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let c = &v["cases"][i];
    let ids = c["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    (c["prompt"].as_str().unwrap().to_string(), ids)
}

#[test]
fn smollm2_template_renders_the_reference_chat_prompt() {
    let f = GgufFile::open(&model_path()).unwrap();
    let t = ChatTemplate::from_gguf(&f)
        .unwrap()
        .expect("SmolLM2 ships a template");
    let msgs = [
        ChatMessage::new(
            "system",
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
        ),
        ChatMessage::new("user", "What is the boiling point of water in Celsius?"),
    ];
    let rendered = t.render(&msgs, true).unwrap();
    let (prompt, ids) = reference_prompt(1);
    assert_eq!(rendered, prompt);
    let tok = Tokenizer::from_gguf(&f).unwrap();
    assert_eq!(tok.encode(&rendered, true), ids);
    // Without a system message the template inserts SmolLM's default one.
    let user_only = t.render(&msgs[1..], false).unwrap();
    assert_eq!(
        user_only,
        prompt.trim_end_matches("<|im_start|>assistant\n")
    );
}

#[test]
fn tiny_model_has_the_chatml_template() {
    let f = GgufFile::from_bytes(tiny_llama_gguf(0)).unwrap();
    let t = ChatTemplate::from_gguf(&f).unwrap().unwrap();
    let out = t.render(&[ChatMessage::new("user", "hi")], true).unwrap();
    assert!(
        out.ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
        "{out}"
    );
}

#[test]
fn hf_template_features() {
    let src = r#"{{ bos_token }}{% set ns = namespace(n=0) %}
{%- for m in messages %}
  {%- if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role: ' + m.role) }}{% endif %}
  {%- set ns.n = ns.n + 1 %}
[{{ loop.index0 }}/{{ loop.length }}{% if loop.last %} last{% endif %}] {{ m.content | trim }} {{ m.content.strip().upper() }} {{ m.role | tojson }}
{% endfor %}
{{- ns.n }}{% if add_generation_prompt %}>{% endif %}{{ eos_token }}"#;
    let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
    let out = t
        .render(
            &[
                ChatMessage::new("user", " a "),
                ChatMessage::new("assistant", "b"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(
        out,
        "<s>[0/2] a A \"user\"\n[1/2 last] b B \"assistant\"\n2></s>"
    );
    let err = t
        .render(&[ChatMessage::new("system", "x")], false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad role: system"), "{err}");
    assert!(ChatTemplate::new("{% for %}", "", "").is_err());
}

#[test]
fn strftime_covers_template_dates() {
    // 2024-02-29 13:05:09 UTC
    assert_eq!(
        strftime_utc("%d %b %Y %H:%M:%S %B %m %y %%", 1_709_211_909),
        "29 Feb 2024 13:05:09 February 02 24 %"
    );
    assert_eq!(strftime_utc("%d-%m-%Y", 0), "01-01-1970");
    let t = ChatTemplate::new("{{ strftime_now('%Y') | length }}", "", "").unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "4");
}
