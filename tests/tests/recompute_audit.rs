//! The recompute audit raises no false alarm. The real services on the real model, the router
//! sending every served choice to the auditor (`--recompute-rate 1`), which scores each one
//! again on a clean pass of its own (`--recompute-model`): two tenants' requests, 8 at a time,
//! over a shared long prefix (prefix-cache hits on prefill), prefill in chunks of 32 tokens, a
//! decode pool too small for all of them and no prefix cache on decode to share their pages
//! (preemption and recompute on decode), `n` = 1 and 2, temperature 0 and 0.9. Every choice
//! must be recomputed and every one must match within the default tolerance, many of them bit
//! for bit; the test fails if the load did not preempt, hit the cache or run `n` > 1, so it
//! cannot pass on a load that exercises none of them.

use std::time::Duration;

use pagewarden_system_tests::{
    api_key, get_json, model_path, start_auditor_with, start_decode, start_prefill,
    start_router_with, ModelArg, Service,
};
use pagewarden_testkit::poll_until;
use serde_json::{json, Value};

const REAL: ModelArg = ModelArg::Real;
/// Requests sent (each `n` = 1 or 2: half again as many choices).
const REQUESTS: usize = 136;
/// Requests in flight at once.
const AT_ONCE: usize = 8;

/// The shared opening of every prompt (about 110 tokens), then a request's own question.
fn prompt(i: usize) -> String {
    let opening = "A field guide to the birds of the northern coast. The guide describes each \
        species by its size, its plumage in summer and in winter, its call, the places it \
        nests, what it eats, and the months in which it can be seen along the shore, on the \
        cliffs and in the marshes behind the dunes. Observers are asked to note the weather, \
        the tide and the time of day with every sighting, and to send their notes to the \
        society at the end of each season.";
    let topics = ["gulls", "terns", "herons", "plovers", "ducks", "owls"];
    format!(
        "{opening} Question {i}: what does the guide say about {}?",
        topics[i % topics.len()]
    )
}

async fn complete(router: &Service, i: usize) -> Value {
    let body = json!({
        "prompt": prompt(i),
        "max_tokens": 24,
        "ignore_eos": true,
        "temperature": if i.is_multiple_of(2) { 0.0 } else { 0.9 },
        "n": 1 + (i / 2) % 2,
    });
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth(api_key(i % 2))
        .json(&body)
        .send()
        .await
        .expect("POST /v1/completions");
    let status = r.status();
    let v: Value = r.json().await.expect("json body");
    assert_eq!(status, 200, "request {i}: {v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_choices_recompute_equal_under_preemption_caching_and_chunking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = model_path().display().to_string();
    let auditor = start_auditor_with(dir.path(), &["--recompute-model".into(), model]);
    let grpc = auditor.grpc_url();
    let decode = start_decode(
        &REAL,
        &[
            "--context-length",
            "512",
            "--pool-tokens",
            "512",
            "--prefix-cache-tokens",
            "0",
            "--auditor",
            &grpc,
        ],
    );
    let prefill = start_prefill(
        &REAL,
        &[
            "--context-length",
            "512",
            "--chunk-tokens",
            "32",
            "--auditor",
            &grpc,
        ],
    );
    let router = start_router_with(
        &REAL,
        &[&decode],
        &[&prefill],
        &["--auditor", &grpc, "--recompute-rate", "1"],
    )
    .await;

    let mut choices = 0;
    for batch in (0..REQUESTS).collect::<Vec<_>>().chunks(AT_ONCE) {
        let calls: Vec<_> = batch
            .iter()
            .map(|&i| {
                let router = &router;
                async move { complete(router, i).await }
            })
            .collect();
        for v in futures::future::join_all(calls).await {
            choices += v["choices"].as_array().expect("choices").len();
        }
    }

    // Every choice recomputed (the auditor's thread works through its queue).
    let rows = poll_until(Duration::from_secs(300), || async {
        let rows = get_json(&auditor, &format!("/api/recomputes?limit={}", 500)).await;
        let rows = rows.as_array().expect("recompute list").clone();
        (rows.len() >= choices).then_some(rows)
    })
    .await;
    let Some(rows) = rows else {
        let metrics = reqwest::get(format!("{}/metrics", auditor.http_url()))
            .await
            .expect("auditor /metrics")
            .text()
            .await
            .unwrap_or_default();
        let recompute: Vec<&str> = metrics
            .lines()
            .filter(|l| l.contains("recompute"))
            .collect();
        panic!("the auditor did not recompute all {choices} choices in 300 s: {recompute:#?}");
    };
    let verdict = |v: &str| rows.iter().filter(|r| r["verdict"] == v).count();
    let worst = rows
        .iter()
        .map(|r| r["max_diff_micro"].as_i64().expect("max_diff_micro"))
        .max();
    eprintln!(
        "{choices} choices: {} match, {} mismatch, {} failed; largest difference {worst:?} µnat",
        verdict("match"),
        verdict("mismatch"),
        verdict("failed")
    );
    assert_eq!(rows.len(), choices, "a choice recomputed twice?");
    assert_eq!(verdict("match"), choices, "{rows:#?}");
    // How many came out bit for bit (those whose passes and steps the recompute followed
    // exactly); the rest differ a little (see `recompute.rs`).
    let exact = rows.iter().filter(|r| r["max_diff_micro"] == 0).count();
    eprintln!("bit-equal: {exact} of {choices}");
    assert!(exact > 0, "no choice recomputed bit-equal: {rows:#?}");
    let incidents = get_json(&auditor, "/api/incidents?limit=1000").await;
    assert!(
        !incidents.to_string().contains("recompute_mismatch"),
        "{incidents}"
    );

    // The load exercised what it claims to.
    assert!(choices > REQUESTS, "no request ran with n > 1");
    let preempted = decode
        .metric("pagewarden_preemptions_total{role=\"decode\"}")
        .await;
    assert!(preempted > 0.0, "decode preempted nothing");
    let cached = get_json(&auditor, "/api/cache").await;
    let hits: i64 = cached
        .as_array()
        .expect("cache totals")
        .iter()
        .filter(|t| t["role"] == "prefill")
        .map(|t| t["hits"].as_i64().unwrap_or(0))
        .sum();
    assert!(hits > 0, "no prefill prefix-cache hit: {cached}");
    eprintln!("preemptions on decode: {preempted}; prefill cache hits: {hits}");
}
