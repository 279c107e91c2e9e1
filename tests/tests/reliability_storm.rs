//! Abort storm under load against the real binaries: 8 tenants with unique markers at
//! the start and end of every prompt, seeded random client disconnects, a prefill process killed
//! and restarted (on the same gRPC port, so the router's configured address stays valid and its
//! `Info` polling brings it back), and a decode worker killed. Asserted: no response ever
//! contains another tenant's marker; every completed 200 reports `usage.prompt_tokens` equal to
//! the tokenizer count; every request ends within its deadline; afterwards the surviving pools
//! are all free (or their remaining pages quarantined and counted) and the router is healthy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pagewarden_model::{GgufFile, Tokenizer};
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::decode_client::DecodeClient;
use pagewarden_proto::v1::prefill_client::PrefillClient;
use pagewarden_system_tests::{start_decode, start_prefill, worker_args, ModelArg, Service};
use pagewarden_testkit::eventually;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const SEED: u64 = 23;
const TINY: ModelArg = ModelArg::Tiny(SEED);
const TENANTS: usize = 8;
const PER_TENANT: usize = 12;
/// Per-request deadline: a request still open after this is a hang.
const DEADLINE: Duration = Duration::from_secs(20);
/// Bound for pools to settle and the router to report healthy after the storm.
const SETTLE: Duration = Duration::from_secs(10);

fn key(n: usize) -> String {
    pagewarden_system_tests::api_key(n)
}

fn marker(tenant: usize, n: usize, end: char) -> String {
    format!("PWMARK-{tenant}-{n}-{end}")
}

/// A router over the given worker URLs with tenants `tenant-0..7` (one key each).
async fn start_router8(decodes: &[String], prefills: &[String]) -> Service {
    let dir = tempfile::tempdir().expect("tempdir");
    let tenants = dir.path().join("tenants.toml");
    pagewarden_system_tests::write_tenants(&tenants, TENANTS);
    let mut args: Vec<String> = vec![
        "--http-addr".into(),
        "127.0.0.1:0".into(),
        "--tenants".into(),
        tenants.display().to_string(),
        "--info-interval".into(),
        "200ms".into(),
        "--served-model-name".into(),
        "m".into(),
        "--tiny-test-model".into(),
        SEED.to_string(),
    ];
    for d in decodes {
        args.extend(["--decode".into(), d.clone()]);
    }
    for p in prefills {
        args.extend(["--prefill".into(), p.clone()]);
    }
    let mut router = Service::start("pagewarden-router", &args);
    router.files = Some(dir);
    router
}

/// `/health` status and body.
async fn health(router: &Service) -> (u16, Value) {
    match reqwest::get(format!("{}/health", router.http_url())).await {
        Ok(r) => {
            let s = r.status().as_u16();
            (s, r.json().await.unwrap_or(Value::Null))
        }
        Err(e) => (0, json!(e.to_string())),
    }
}

/// Polls `/health` until `ok(body)` holds with status 200, failing after `bound`.
async fn wait_health(router: &Service, bound: Duration, what: &str, ok: impl Fn(&Value) -> bool) {
    eventually(bound, what, || async {
        let (s, v) = health(router).await;
        if s == 200 && ok(&v) {
            Ok(())
        } else {
            Err(format!("last /health {s} {v}"))
        }
    })
    .await
}

/// How one request ended.
#[derive(Debug, Default)]
struct Outcome {
    /// Completed with 200 (and, for streams, a finish or `[DONE]`).
    ok: bool,
    /// Our own deliberate disconnect.
    dropped: bool,
    /// A clean 4xx/5xx status, or an error reported in the stream / transport after a kill.
    failed: Option<String>,
}

struct Req {
    tenant: usize,
    n: usize,
    prompt: String,
    want_prompt_tokens: u64,
    stream: bool,
    temperature: f64,
    disconnect_after: Option<usize>,
}

/// Fails the test when `text` holds a marker of any tenant other than `own`.
fn check_markers(own: usize, text: &str, ctx: &str) {
    for t in (0..TENANTS).filter(|&t| t != own) {
        let foreign = format!("PWMARK-{t}-");
        assert!(
            !text.contains(&foreign),
            "{ctx}: response of tenant-{own} contains tenant-{t}'s marker: {text:?}"
        );
    }
}

async fn run_one(client: &reqwest::Client, url: &str, r: &Req) -> Outcome {
    let ctx = format!("tenant-{} request {}", r.tenant, r.n);
    let mut body = json!({
        "model": "m",
        "prompt": r.prompt,
        "max_tokens": 16,
        "temperature": r.temperature,
        "seed": (r.tenant * 100 + r.n) as u64,
    });
    if r.stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let resp = match client
        .post(format!("{url}/v1/completions"))
        .bearer_auth(key(r.tenant))
        .json(&body)
        .send()
        .await
    {
        Ok(resp) => resp,
        Err(e) => {
            return Outcome {
                failed: Some(format!("transport: {e}")),
                ..Outcome::default()
            }
        }
    };
    let status = resp.status().as_u16();
    if status != 200 {
        assert!(
            (400..600).contains(&status),
            "{ctx}: unexpected status {status}"
        );
        let text = resp.text().await.unwrap_or_default();
        check_markers(r.tenant, &text, &ctx);
        return Outcome {
            failed: Some(format!("status {status}")),
            ..Outcome::default()
        };
    }
    if !r.stream {
        let v: Value = match resp.json().await {
            Ok(v) => v,
            Err(e) => {
                return Outcome {
                    failed: Some(format!("body: {e}")),
                    ..Outcome::default()
                }
            }
        };
        let text = v["choices"][0]["text"].as_str().unwrap_or("");
        check_markers(r.tenant, text, &ctx);
        assert_eq!(
            v["usage"]["prompt_tokens"].as_u64(),
            Some(r.want_prompt_tokens),
            "{ctx}: usage.prompt_tokens vs tokenizer count: {v}"
        );
        return Outcome {
            ok: true,
            ..Outcome::default()
        };
    }
    // Streaming: read chunks, parse complete SSE lines as they arrive.
    let mut resp = resp;
    let (mut buf, mut text, mut chunks) = (String::new(), String::new(), 0usize);
    let mut usage = Value::Null;
    let mut done = false;
    loop {
        if r.disconnect_after.is_some_and(|k| chunks >= k) {
            drop(resp);
            check_markers(r.tenant, &text, &ctx);
            return Outcome {
                dropped: true,
                ..Outcome::default()
            };
        }
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => {
                check_markers(r.tenant, &text, &ctx);
                return Outcome {
                    failed: Some(format!("stream transport: {e}")),
                    ..Outcome::default()
                };
            }
        };
        chunks += 1;
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(i) = buf.find('\n') {
            let line: String = buf.drain(..=i).collect();
            let Some(data) = line.trim_end().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_str(data)
                .unwrap_or_else(|e| panic!("{ctx}: bad SSE json {data:?}: {e}"));
            if v.get("error").is_some() {
                check_markers(r.tenant, &text, &ctx);
                check_markers(r.tenant, data, &ctx);
                return Outcome {
                    failed: Some(format!("stream error: {v}")),
                    ..Outcome::default()
                };
            }
            if let Some(c) = v["choices"].get(0) {
                text.push_str(c["text"].as_str().unwrap_or(""));
            }
            if !v["usage"].is_null() {
                usage = v["usage"].clone();
            }
        }
    }
    check_markers(r.tenant, &text, &ctx);
    if !done {
        return Outcome {
            failed: Some("stream ended without [DONE]".into()),
            ..Outcome::default()
        };
    }
    assert_eq!(
        usage["prompt_tokens"].as_u64(),
        Some(r.want_prompt_tokens),
        "{ctx}: streamed usage.prompt_tokens vs tokenizer count: {usage}"
    );
    Outcome {
        ok: true,
        ..Outcome::default()
    }
}

/// Waits until `decode`'s pool holds nothing used or draining and every page is free or
/// quarantined (and counted).
async fn wait_decode_settled(decode: &Service) {
    let client = DecodeClient::connect(decode.grpc_url())
        .await
        .expect("connect surviving decode");
    let q = eventually(SETTLE, "a settled decode pool", || {
        let mut client = client.clone();
        async move {
            let info = client
                .info(pb::InfoRequest {})
                .await
                .expect("decode info")
                .into_inner();
            let q = decode
                .metric("pagewarden_pool_pages{role=\"decode\",state=\"quarantined\"}")
                .await as u64;
            if info.free_pages + q == info.total_pages {
                Ok(q)
            } else {
                Err(format!(
                    "free {} + quarantined {q} of {}",
                    info.free_pages, info.total_pages
                ))
            }
        }
    })
    .await;
    if q > 0 {
        let counted = decode
            .metric("pagewarden_deferred_releases_total{role=\"decode\",outcome=\"quarantined\"}")
            .await as u64;
        assert_eq!(counted, q, "quarantined pages are counted");
    }
}

async fn wait_prefill_free(prefill: &Service) {
    let client = PrefillClient::connect(prefill.grpc_url())
        .await
        .expect("connect prefill");
    eventually(SETTLE, "a free prefill pool", || {
        let mut client = client.clone();
        async move {
            let info = client
                .info(pb::InfoRequest {})
                .await
                .expect("prefill info")
                .into_inner();
            if info.free_pages == info.total_pages {
                Ok(())
            } else {
                Err(format!("{} of {}", info.free_pages, info.total_pages))
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn abort_storm_with_killed_workers_leaks_nothing_and_never_hangs() {
    let tokenizer = Tokenizer::from_gguf(
        &GgufFile::from_bytes(pagewarden_model::tiny_llama_gguf(SEED)).expect("tiny gguf"),
    )
    .expect("tiny tokenizer");
    let decode_args = ["--drain-timeout", "500ms", "--grant-ttl", "2s"];
    let decode0 = start_decode(&TINY, &decode_args);
    let mut decode1 = start_decode(&TINY, &decode_args);
    let mut prefill0 = start_prefill(&TINY, &[]);
    let prefill1 = start_prefill(&TINY, &[]);
    let router = Arc::new(
        start_router8(
            &[decode0.grpc_url(), decode1.grpc_url()],
            &[prefill0.grpc_url(), prefill1.grpc_url()],
        )
        .await,
    );
    wait_health(&router, SETTLE, "router never saw 2+2 live workers", |v| {
        v["live_decode"] == 2 && v["live_prefill"] == 2
    })
    .await;

    // Build every request up front from one seeded RNG.
    let mut rng = StdRng::seed_from_u64(0x5707);
    let mut plans: Vec<Vec<Req>> = Vec::new();
    for tenant in 0..TENANTS {
        let mut v = Vec::new();
        for n in 0..PER_TENANT {
            let filler: String = (0..rng.random_range(10..60))
                .map(|_| char::from(rng.random_range(b'a'..=b'z')))
                .collect();
            let prompt = format!(
                "{} tenant {tenant} says {filler} {}",
                marker(tenant, n, 'S'),
                marker(tenant, n, 'E')
            );
            let stream = rng.random_bool(0.5);
            let temperature = if rng.random_bool(0.5) { 0.0 } else { 0.8 };
            let disconnect_after =
                (stream && rng.random_bool(0.3)).then(|| rng.random_range(1..=3usize));
            v.push(Req {
                tenant,
                n,
                want_prompt_tokens: tokenizer.encode(&prompt, true).len() as u64,
                prompt,
                stream,
                temperature,
                disconnect_after,
            });
        }
        plans.push(v);
    }

    let finished = Arc::new(AtomicUsize::new(0));
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for plan in plans {
        let (router, finished, client) = (router.clone(), finished.clone(), client.clone());
        tasks.push(tokio::spawn(async move {
            let url = router.http_url();
            let mut outcomes = Vec::new();
            for r in &plan {
                let out = tokio::time::timeout(DEADLINE, run_one(&client, &url, r))
                    .await
                    .unwrap_or_else(|_| {
                        panic!(
                            "tenant-{} request {} hung past its {DEADLINE:?} deadline",
                            r.tenant, r.n
                        )
                    });
                finished.fetch_add(1, Ordering::SeqCst);
                outcomes.push(out);
            }
            outcomes
        }));
    }

    // Midway: kill one prefill and restart it on the same gRPC port, then kill one decode.
    let total = TENANTS * PER_TENANT;
    let stall = Instant::now() + Duration::from_secs(40);
    eventually(Duration::from_secs(40), "a third of the storm", || async {
        finished.load(Ordering::SeqCst) >= total / 3
    })
    .await;
    let prefill_grpc = prefill0.addrs["grpc"].clone();
    prefill0.kill();
    let mut args = worker_args(&TINY, &[]);
    let i = args
        .iter()
        .position(|a| a == "--grpc-addr")
        .expect("grpc flag")
        + 1;
    args[i] = prefill_grpc;
    let prefill0 = Service::start("pagewarden-prefill", &args);
    let left = stall.saturating_duration_since(Instant::now());
    eventually(left, "half of the storm", || async {
        finished.load(Ordering::SeqCst) >= total / 2
    })
    .await;
    decode1.kill();

    let (mut ok, mut dropped, mut failed) = (0, 0, Vec::new());
    for t in tasks {
        for o in t.await.expect("tenant task") {
            ok += usize::from(o.ok);
            dropped += usize::from(o.dropped);
            failed.extend(o.failed);
        }
    }
    eprintln!(
        "storm: {total} requests, {ok} ok, {dropped} dropped by the client, {} failed: {failed:?}",
        failed.len()
    );
    assert_eq!(ok + dropped + failed.len(), total);
    // Requests routed to a killed worker fail fast (502/503); some must still succeed.
    assert!(ok > 0, "no request succeeded during the storm");

    // Afterwards: the router sees the restarted prefill and the surviving decode, pools settle.
    wait_health(
        &router,
        SETTLE,
        "router not healthy with 1 decode + 2 prefill",
        |v| v["live_decode"] == 1 && v["live_prefill"] == 2,
    )
    .await;
    wait_decode_settled(&decode0).await;
    wait_prefill_free(&prefill0).await;
    wait_prefill_free(&prefill1).await;
    // And the suite still serves every tenant.
    for tenant in 0..TENANTS {
        let r = Req {
            tenant,
            n: PER_TENANT,
            prompt: format!(
                "{} after {}",
                marker(tenant, 99, 'S'),
                marker(tenant, 99, 'E')
            ),
            want_prompt_tokens: 0,
            stream: false,
            temperature: 0.0,
            disconnect_after: None,
        };
        let r = Req {
            want_prompt_tokens: tokenizer.encode(&r.prompt, true).len() as u64,
            ..r
        };
        let out = tokio::time::timeout(DEADLINE, run_one(&client, &router.http_url(), &r))
            .await
            .expect("post-storm request hung");
        assert!(out.ok, "tenant-{tenant} after the storm: {out:?}");
    }
    wait_decode_settled(&decode0).await;
}
