//! The whole suite, router → prefill → decode, as real processes on 127.0.0.1, through the
//! router's OpenAI-compatible HTTP API.

use std::time::{Duration, Instant};

use pagewarden_system_tests::{
    api_key, post_json, post_sse, reference, start_decode, start_prefill, start_router,
    start_router_with, ModelArg, Service,
};
use pagewarden_testkit::eventually;
use serde_json::{json, Value};

const TINY: ModelArg = ModelArg::Tiny(11);

async fn post(router: &Service, path: &str, body: Value) -> (u16, Value) {
    post_json(router, path, 0, &body).await
}

/// Streams a completion; returns (text, finish_reason, usage).
async fn post_stream(router: &Service, body: Value) -> (String, String, Value) {
    let (mut text, mut finish, mut usage) = (String::new(), String::new(), Value::Null);
    for v in post_sse(router, "/v1/completions", 1, &body).await {
        if let Some(c) = v["choices"].get(0) {
            text.push_str(c["text"].as_str().unwrap_or(""));
            if let Some(f) = c["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
    }
    (text, finish, usage)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_prompts_through_the_router_match_the_engine() {
    // llama-cpp-python's default attention; every prompt's first 8 greedy tokens are
    // llama.cpp's.
    let reference = pagewarden_system_tests::reference_path();
    reference_prompts_match(ModelArg::Real, reference, 10).await;
}

/// Gemma 3 through the whole suite: the router adds BOS as the GGUF asks, the workers run
/// K-quants and sliding-window layers, and the pools hold less than Gemma's 32K context (the
/// workers lower the context they advertise to fit). The reference is llama-server `-fa off`,
/// whose arithmetic the default path follows: the first 8 greedy tokens are llama.cpp's on
/// every prompt (crates/model/tests/parity_gemma.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma3_reference_prompts_through_the_router_match_the_engine() {
    let reference = pagewarden_system_tests::workspace_root()
        .join("tests/data/reference/gemma3-270m-q4_k_m.json");
    reference_prompts_match(ModelArg::Gemma, reference, 10).await;
}

/// Greedy tokens compared with llama.cpp's reference.
const REFERENCE_TOKENS: usize = 8;

/// Every reference prompt through router, prefill and decode gives the engine's greedy text,
/// finish reason and token counts (streamed too, for the first three), and that output's
/// first [`REFERENCE_TOKENS`] tokens are llama.cpp's on at least `min_matching` prompts.
async fn reference_prompts_match(
    model: ModelArg,
    reference: std::path::PathBuf,
    min_matching: usize,
) {
    let flags = ["--pool-tokens", "16384", "--lower-context-to-fit"];
    let decode = start_decode(&model, &flags);
    let prefill = start_prefill(&model, &flags);
    let router = start_router(&model, &[&decode], &[&prefill]).await;
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(reference).unwrap()).unwrap();
    let engine = reference::engine(reference::load(&model));
    let mut matching = 0;
    for (i, case) in reference["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .enumerate()
    {
        let prompt: Vec<u32> = case["prompt_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let want = reference::greedy(&engine, &prompt, 24);
        let llama_cpp: Vec<u32> = case["greedy_tokens"]
            .as_array()
            .expect("greedy_tokens")
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        matching +=
            usize::from(want.tokens.get(..REFERENCE_TOKENS) == llama_cpp.get(..REFERENCE_TOKENS));
        let body =
            json!({"model": "m", "prompt": case["prompt"], "max_tokens": 24, "temperature": 0});
        let (status, v) = post(&router, "/v1/completions", body.clone()).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(
            v["choices"][0]["text"].as_str(),
            Some(want.text.as_str()),
            "prompt {}",
            case["prompt"]
        );
        assert_eq!(
            v["choices"][0]["finish_reason"].as_str(),
            Some(want.finish_reason.as_str())
        );
        assert_eq!(
            v["usage"]["prompt_tokens"].as_u64(),
            Some(prompt.len() as u64),
            "tokenizer count"
        );
        assert_eq!(
            v["usage"]["completion_tokens"].as_u64(),
            Some(want.tokens.len() as u64)
        );
        if i < 3 {
            let mut sbody = body.clone();
            sbody["stream"] = json!(true);
            sbody["stream_options"] = json!({"include_usage": true});
            let (text, finish, usage) = post_stream(&router, sbody).await;
            assert_eq!(text, want.text, "streaming and non-streaming agree");
            assert_eq!(finish, want.finish_reason.as_str());
            assert_eq!(
                usage["completion_tokens"].as_u64(),
                Some(want.tokens.len() as u64)
            );
        }
    }
    assert!(
        matching >= min_matching,
        "the suite's first {REFERENCE_TOKENS} greedy tokens are llama.cpp's on {matching} \
         prompts, fewer than {min_matching}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_length_sweep_through_the_router_touches_no_worker_pages() {
    let decode = start_decode(&TINY, &[]);
    let prefill = start_prefill(&TINY, &[]);
    let router = start_router(&TINY, &[&decode], &[&prefill]).await;
    let context = 256usize;
    let mut lengths = vec![context - 1, context, context + 1];
    lengths.extend((1..=16).map(|k| context + 16 * k));
    for n in lengths {
        let prompt: Vec<u32> = (0..n as u32).map(|i| 20 + i % 200).collect();
        let (status, v) = post(
            &router,
            "/v1/completions",
            json!({"model": "m", "prompt": prompt, "max_tokens": 1, "temperature": 0}),
        )
        .await;
        if n < context {
            assert_eq!(status, 200, "{v}");
        } else {
            assert_eq!(status, 400, "{v}");
            assert_eq!(
                v["error"]["code"].as_str(),
                Some("context_length_exceeded"),
                "{v}"
            );
        }
    }
    // Only the one fitting request moved pages; nothing was reserved for the rejected ones.
    let fitting_pages = (context - 1).div_ceil(16);
    let page_bytes = reference::load(&TINY).kv_layout(16).page_bytes();
    let bytes = decode
        .metric("pagewarden_transfer_bytes_total{role=\"decode\"}")
        .await;
    assert_eq!(bytes, (fitting_pages * page_bytes) as f64);
    assert_eq!(
        decode
            .metric(
                "pagewarden_rejections_total{role=\"decode\",reason=\"context_length_exceeded\"}"
            )
            .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_by_two_workers_serve_concurrent_clients_and_survive_a_disconnect() {
    let decodes = [start_decode(&TINY, &[]), start_decode(&TINY, &[])];
    let prefills = [start_prefill(&TINY, &[]), start_prefill(&TINY, &[])];
    let router = start_router(
        &TINY,
        &[&decodes[0], &decodes[1]],
        &[&prefills[0], &prefills[1]],
    )
    .await;
    let engine = reference::engine(reference::load(&TINY));
    let router = std::sync::Arc::new(router);
    let mut tasks = Vec::new();
    for i in 0..8u32 {
        let prompt: Vec<u32> = (0..(8 + 5 * i)).map(|j| 20 + (j * 7 + i) % 200).collect();
        let want = reference::greedy(&engine, &prompt, 12);
        let router = router.clone();
        tasks.push(tokio::spawn(async move {
            let (status, v) = post(
                &router,
                "/v1/completions",
                json!({"model": "m", "prompt": prompt, "max_tokens": 12, "temperature": 0}),
            )
            .await;
            assert_eq!(status, 200, "{v}");
            assert_eq!(
                v["choices"][0]["text"].as_str(),
                Some(want.text.as_str()),
                "client {i}"
            );
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    // A streaming client that disconnects after the first chunk: both halves are cancelled and
    // every decode pool returns to all-free.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth(api_key(2))
        .json(&json!({"model": "m", "prompt": [30, 31, 32], "max_tokens": 200, "temperature": 0, "stream": true}))
        .send()
        .await
        .expect("stream request");
    let mut r = r;
    let _first = r.chunk().await.expect("first chunk");
    drop(r);
    eventually(
        Duration::from_secs(5),
        "free decode pools after the disconnect",
        || async {
            let mut settled = true;
            for d in &decodes {
                let used = d
                    .metric("pagewarden_pool_pages{role=\"decode\",state=\"used\"}")
                    .await;
                let draining = d
                    .metric("pagewarden_pool_pages{role=\"decode\",state=\"draining\"}")
                    .await;
                settled &= used == 0.0 && draining == 0.0;
            }
            settled
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_decode_ends_its_streams_with_an_error_within_the_keepalive_instead_of_hanging() {
    // No whole-request deadline is set (the default): only the channel's keep-alive and the
    // failing polls can tell that a decode froze mid-request (SIGSTOP: its kernel still holds
    // the connections open). The freeze may catch the request in its prefill, whose KV writes
    // then wait on the frozen decode, or in its token stream: it fails either way.
    let decode = start_decode(&ModelArg::Real, &[]);
    let prefill = start_prefill(&ModelArg::Real, &[]);
    let router = start_router_with(
        &ModelArg::Real,
        &[&decode],
        &[&prefill],
        &["--worker-keepalive", "1s"],
    )
    .await;
    let mut r = reqwest::Client::new()
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth(api_key(1))
        .json(
            &json!({"model": "m", "prompt": "Once upon a time", "max_tokens": 400,
            "ignore_eos": true, "temperature": 0, "stream": true}),
        )
        .send()
        .await
        .expect("stream request");
    assert_eq!(r.status(), 200);
    let _first = r.chunk().await.expect("first chunk");
    decode.signal("STOP");
    let frozen = Instant::now();
    let mut body = String::new();
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(chunk)) = r.chunk().await {
            body.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    decode.signal("CONT");
    assert!(
        ended.is_ok(),
        "the stream was still open 20 s after its decode froze: {body}"
    );
    assert!(
        body.contains("\"error\"") && body.trim_end().ends_with("data: [DONE]"),
        "the stream ends with an error event and [DONE]: {body}"
    );
    eprintln!("stream ended {:?} after the freeze", frozen.elapsed());
}
