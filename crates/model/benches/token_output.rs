//! Per-token cost of turning sampled tokens into a completion's text ([`TokenOutput`]), over
//! completions of 100 and 4,000 tokens, beside decoding the whole completion at every token
//! (what an output stream that re-decodes would cost): the first should be flat in the
//! completion's length, the second grows with it. No model file: the tiny test tokenizer.
//! `cargo bench -p pagewarden-model --bench token_output`; env BENCH_RUNS (default 9). It
//! reports medians, it never asserts a speed.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use pagewarden_model::{tiny_llama_gguf, GgufFile, SamplingParams, TokenOutput, Tokenizer};

const TEXT: &str = "Pages of keys and values move from prefill to decode, caf\u{e9} \u{1f600} \
\u{4e2d}\u{6587}, and every page carries a generation tag that attention checks. ";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Nanoseconds per token of `f` over `ids`, median of `runs`.
fn per_token(runs: usize, ids: &[u32], mut f: impl FnMut(&[u32])) -> f64 {
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f(ids);
                t.elapsed().as_secs_f64() * 1e9 / ids.len() as f64
            })
            .collect(),
    )
}

fn main() {
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    let file = GgufFile::from_bytes(tiny_llama_gguf(3)).expect("the tiny model");
    let tok = Arc::new(Tokenizer::from_gguf(&file).expect("its tokenizer"));
    let mut all = Vec::new();
    while all.len() < 4000 {
        all.extend(tok.encode(TEXT, false));
    }
    println!("tokens  TokenOutput ns/token  whole decode per token ns/token");
    for n in [100, 4000] {
        let ids = &all[..n];
        let params = SamplingParams {
            stop: vec!["never appears".into()],
            ..SamplingParams::greedy(n)
        };
        let stream = per_token(runs, ids, |ids| {
            let mut out = TokenOutput::new(tok.clone(), &params);
            for &t in ids {
                black_box(out.push(t));
            }
        });
        let whole = per_token(runs, ids, |ids| {
            for end in 1..=ids.len() {
                black_box(tok.decode(&ids[..end]));
            }
        });
        println!("{n:6}  {stream:20.1}  {whole:31.1}");
    }
}
