//! `Engine::generate` on the tiny random Llama: greedy is deterministic and equals a manual
//! prefill + decode loop, limits and stop sequences end generation, pages are returned.

use std::sync::Arc;

use pagewarden_kvcache::{KvPool, PoolConfig};
use pagewarden_model::{
    argmax, tiny_llama_gguf, Engine, FinishReason, GgufFile, LoadOptions, Model, ModelError,
    SamplingParams,
};

fn engine(pages: usize) -> Engine {
    let file = GgufFile::from_bytes(tiny_llama_gguf(9)).unwrap();
    let model = Arc::new(
        Model::from_gguf(
            file,
            &LoadOptions {
                threads: 1,
                prefill_chunk: 8,
                ..LoadOptions::default()
            },
        )
        .unwrap(),
    );
    let pool = KvPool::new(PoolConfig::with_pages(model.kv_layout(4), pages));
    Engine::new(model, pool)
}

#[test]
fn greedy_generation_is_deterministic_and_matches_the_model() {
    let e = engine(64);
    let prompt = e.model().tokenizer().encode("hello world", false);
    assert!(!prompt.is_empty());
    let params = SamplingParams {
        max_tokens: 12,
        ..SamplingParams::greedy(12)
    };
    let a = e.generate(&prompt, &params).unwrap();
    let b = e.generate(&prompt, &params).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.prompt_tokens, prompt);
    // Manual loop over the same model and pool geometry.
    let pool = KvPool::new(PoolConfig::with_pages(e.model().kv_layout(4), 64));
    let owner = pagewarden_kvcache::Owner {
        request: pagewarden_kvcache::RequestId::random(),
        tenant: pagewarden_kvcache::TenantId::new("manual"),
    };
    let mut seq = pool.allocate(owner, 1).unwrap();
    let mut logits = e.model().prefill(&mut seq, &prompt).unwrap();
    let mut manual = Vec::new();
    for _ in 0..a.tokens.len() {
        let t = argmax(&logits);
        manual.push(t);
        logits = e
            .model()
            .decode_step(&mut [(&mut seq, t)])
            .pop()
            .unwrap()
            .unwrap();
    }
    assert_eq!(a.tokens, manual);
    if a.finish_reason == FinishReason::Length {
        assert_eq!(a.tokens.len(), 12);
    }
    assert_eq!(
        a.text,
        e.model()
            .tokenizer()
            .decode(&a.tokens)
            .split_at(a.text.len())
            .0
    );
}

#[test]
fn pages_are_returned_and_limits_hold() {
    let e = engine(16);
    let prompt = vec![10u32, 20, 30];
    let out = e.generate(&prompt, &SamplingParams::greedy(0)).unwrap();
    assert!(out.tokens.is_empty());
    assert_eq!(out.finish_reason, FinishReason::Length);
    for _ in 0..5 {
        e.generate(&prompt, &SamplingParams::greedy(20)).unwrap();
    }
    // 16 pages of 4 tokens: a request needing 23 tokens fits only if earlier pages came back.
    let too_long = vec![5u32; e.model().context_length()];
    assert!(matches!(
        e.generate(&too_long, &SamplingParams::greedy(1)),
        Err(ModelError::ContextExceeded { .. })
    ));
    assert!(matches!(
        e.generate(&[], &SamplingParams::greedy(1)),
        Err(ModelError::EmptyInput)
    ));
}

#[test]
fn stop_sequence_cuts_text() {
    let e = engine(64);
    let prompt = vec![40u32, 41, 42];
    let free = e.generate(&prompt, &SamplingParams::greedy(16)).unwrap();
    if free.text.chars().count() < 3 {
        return assert!(free.tokens.len() <= 16);
    }
    // Stop on a piece of the text greedy decoding produces anyway.
    let cut: String = free.text.chars().skip(1).take(2).collect();
    let params = SamplingParams {
        stop: vec![cut.clone()],
        ..SamplingParams::greedy(16)
    };
    let out = e.generate(&prompt, &params).unwrap();
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert!(!out.text.contains(&cut), "{:?} contains {cut:?}", out.text);
    assert!(free.text.starts_with(&out.text));
}
