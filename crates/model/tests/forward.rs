//! Forward-pass properties on the tiny random Llama (no real model needed):
//! prefill(N) + decode == prefill(N+1); batched decode == one-by-one decode; chunked prefill
//! == one-shot prefill; a changed page generation fails only that sequence, with an error.
//! The bodies that every device runs are `device_test!`s (`tests/device/`): on the CPU here,
//! on `cuda:0` too on a GPU host.

mod device;

use device::OnDevice;
use pagewarden_kernels::Device;
use pagewarden_kvcache::{
    Generation, KvPool, Owner, PoolConfig, ReadablePages, RequestId, TenantId,
};
use pagewarden_model::gguf::{tiny_llama_gguf_with, TinyLlamaSpec};
use pagewarden_model::{GgufFile, LoadOptions, Model, ModelError};

fn model(threads: usize, chunk: usize, tied: bool) -> Model {
    let bytes = tiny_llama_gguf_with(&TinyLlamaSpec {
        seed: 3,
        tied_output: tied,
        ..TinyLlamaSpec::default()
    });
    let opts = LoadOptions {
        threads,
        prefill_chunk: chunk,
        ..LoadOptions::default()
    };
    Model::from_gguf(GgufFile::from_bytes(bytes).unwrap(), &opts).unwrap()
}

fn pool(m: &Model, page_size: usize) -> KvPool {
    KvPool::new(PoolConfig::with_pages(m.kv_layout(page_size), 64))
}

fn seq(pool: &KvPool, n: u64) -> ReadablePages {
    let owner = Owner {
        request: RequestId::random(),
        tenant: TenantId::new(format!("t{n}")),
    };
    pool.allocate(owner, 1).unwrap()
}

fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + salt * 11 + 5) % 250 + 3)
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

device_test!(
    prefill_then_decode_equals_longer_prefill,
    decode_continues_prefill
);
fn decode_continues_prefill(dev: Device) {
    for (threads, page_size, tied) in [(1, 4, false), (2, 16, true), (1, 1, true)] {
        let m = model(threads, 256, tied);
        let p = pool(&m, page_size);
        let mut m = OnDevice::open(dev, m, &p);
        let toks = prompt(21, 1);
        let mut a = seq(&p, 1);
        m.prefill(&mut a, &toks[..20]).unwrap();
        let step = m.decode(&mut a, toks[20]).unwrap();
        assert_eq!(a.len(), 21);
        let mut b = seq(&p, 2);
        let full = m.prefill(&mut b, &toks).unwrap();
        assert_eq!(step.len(), m.model().config().vocab);
        let d = max_diff(&step, &full);
        assert!(
            d < 1e-4,
            "threads {threads} page {page_size}: decode vs prefill differ by {d}"
        );
    }
}

device_test!(chunked_prefill_equals_one_shot, chunked_prefill);
fn chunked_prefill(dev: Device) {
    let toks = prompt(45, 2);
    let one = model(1, 1000, false);
    let p = pool(&one, 8);
    let mut one = OnDevice::open(dev, one, &p);
    let mut a = seq(&p, 1);
    let want = one.prefill(&mut a, &toks).unwrap();
    let mut chunked = OnDevice::open(dev, model(2, 7, false), &p);
    let mut b = seq(&p, 2);
    let got = chunked.prefill(&mut b, &toks).unwrap();
    assert!(max_diff(&got, &want) < 1e-4);
    // Two separate prefill calls continue the same sequence.
    let mut c = seq(&p, 3);
    one.prefill(&mut c, &toks[..30]).unwrap();
    let got = one.prefill(&mut c, &toks[30..]).unwrap();
    assert!(max_diff(&got, &want) < 1e-4);
}

device_test!(batched_decode_equals_one_by_one, batched_decode);
fn batched_decode(dev: Device) {
    let m = model(2, 256, false);
    let p = pool(&m, 4);
    let mut m = OnDevice::open(dev, m, &p);
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(5 + 6 * i, i as u32)).collect();
    let next = [7u32, 100, 42];
    let mut batch_seqs: Vec<ReadablePages> = Vec::new();
    let mut single = Vec::new();
    for (i, pr) in prompts.iter().enumerate() {
        let mut s = seq(&p, 10 + i as u64);
        m.prefill(&mut s, pr).unwrap();
        batch_seqs.push(s);
        let mut s = seq(&p, 20 + i as u64);
        m.prefill(&mut s, pr).unwrap();
        single.push(m.decode(&mut s, next[i]).unwrap());
    }
    let mut refs: Vec<(&mut ReadablePages, u32)> = batch_seqs.iter_mut().zip(next).collect();
    let out = m.decode_step(&mut refs);
    for (i, r) in out.into_iter().enumerate() {
        let d = max_diff(&r.unwrap(), &single[i]);
        assert!(d < 1e-4, "sequence {i}: batched vs single differ by {d}");
    }
    // The sequences really differ (the comparison above is not vacuous).
    assert!(max_diff(&single[0], &single[1]) > 1e-3);
}

device_test!(
    generation_mismatch_fails_only_that_sequence_with_an_error,
    generation_mismatch
);
fn generation_mismatch(dev: Device) {
    let m = model(1, 256, false);
    let p = pool(&m, 4);
    let mut m = OnDevice::open(dev, m, &p);
    let mut good = seq(&p, 1);
    let mut bad = seq(&p, 2);
    m.prefill(&mut good, &prompt(9, 1)).unwrap();
    m.prefill(&mut bad, &prompt(9, 1)).unwrap();
    let before = p.metrics().snapshot().generation_mismatches;
    // The table now presents a generation the page no longer has (as after a reallocation).
    let (page, g) = bad.table()[1];
    bad.test_set_table_generation(1, Generation(g.0 + 1));
    let len_before = bad.len();
    let mut batch = [(&mut good, 5u32), (&mut bad, 5u32)];
    let out = m.decode_step(&mut batch);
    assert!(out[0].is_ok(), "the healthy sequence must still decode");
    match &out[1] {
        Err(e) if e.is_kv_refusal() => {}
        other => panic!("expected a generation mismatch error for page {page}, got {other:?}"),
    }
    assert_eq!(
        bad.len(),
        len_before,
        "a failed sequence's length is unchanged"
    );
    // The host pool refused the read (on a GPU: before copying the page to the device).
    assert!(p.metrics().snapshot().generation_mismatches > before);
    // Prefill on the tampered sequence fails too and returns no logits.
    let refused = m.prefill(&mut bad, &[3, 4]).unwrap_err();
    assert!(refused.is_kv_refusal(), "{refused:?}");
}

device_test!(bad_inputs_are_errors, bad_inputs);
fn bad_inputs(dev: Device) {
    let m = model(1, 256, false);
    let p = pool(&m, 4);
    let mut m = OnDevice::open(dev, m, &p);
    let mut s = seq(&p, 1);
    let err = |r: Result<Vec<f32>, device::RunError>| r.unwrap_err();
    assert!(matches!(
        err(m.prefill(&mut s, &[])).model(),
        Some(ModelError::EmptyInput)
    ));
    let vocab = m.model().config().vocab as u32;
    assert!(matches!(
        err(m.prefill(&mut s, &[1, vocab])).model(),
        Some(ModelError::TokenOutOfRange { .. })
    ));
    let long = prompt(m.model().context_length() + 1, 0);
    assert!(matches!(
        err(m.prefill(&mut s, &long)).model(),
        Some(ModelError::ContextExceeded { .. })
    ));
    assert_eq!(s.len(), 0);
}

#[test]
fn a_scored_prefill_gives_each_prompt_token_the_logprob_a_prefill_of_its_prefix_gives() {
    use pagewarden_model::TokenLogprobs;
    let toks = prompt(23, 4);
    // Chunks of 7 (the scoring crosses chunk boundaries), then the continuation's first token.
    let m = model(2, 7, false);
    let p = pool(&m, 4);
    let mut a = seq(&p, 1);
    let next = 9;
    let (last, scored) = m
        .prefill_scored(None, &mut a, &toks, Some(next), 3)
        .unwrap();
    assert_eq!(scored.len(), toks.len(), "tokens 1.. and the next one");
    assert_eq!(a.len(), toks.len());
    let mut b = seq(&p, 2);
    assert!(max_diff(&last, &m.prefill(&mut b, &toks).unwrap()) < 1e-4);
    for i in 1..=toks.len() {
        let mut s = seq(&p, 10 + i as u64);
        let logits = m.prefill(&mut s, &toks[..i]).unwrap();
        let following = toks.get(i).copied().unwrap_or(next);
        let want = TokenLogprobs::compute(&logits, following, 3);
        let got = &scored[i - 1];
        assert_eq!(got.chosen.token, following);
        assert!(
            (got.chosen.logprob - want.chosen.logprob).abs() < 1e-4,
            "position {i}: {} vs {}",
            got.chosen.logprob,
            want.chosen.logprob
        );
        assert_eq!(
            got.top.iter().map(|l| l.token).collect::<Vec<_>>(),
            want.top.iter().map(|l| l.token).collect::<Vec<_>>()
        );
    }
    // Without a next token the last position scores nothing.
    let mut c = seq(&p, 99);
    let (_, scored) = m.prefill_scored(None, &mut c, &toks, None, 0).unwrap();
    assert_eq!(scored.len(), toks.len() - 1);
}

#[test]
fn a_long_scored_prefill_scores_as_a_short_chunked_one() {
    // 150 tokens: past the rows one scored pass holds, with a chunk size that would hold all.
    let toks = prompt(150, 6);
    let big = model(2, 1000, false);
    let small = model(1, 7, false);
    let p = pool(&big, 16);
    let (mut a, mut b) = (seq(&p, 1), seq(&p, 2));
    let (la, sa) = big.prefill_scored(None, &mut a, &toks, None, 2).unwrap();
    let (lb, sb) = small.prefill_scored(None, &mut b, &toks, None, 2).unwrap();
    assert_eq!(sa.len(), toks.len() - 1);
    assert!(max_diff(&la, &lb) < 1e-4);
    for (x, y) in sa.iter().zip(&sb) {
        assert_eq!(x.chosen.token, y.chosen.token);
        assert!((x.chosen.logprob - y.chosen.logprob).abs() < 1e-4);
    }
}
