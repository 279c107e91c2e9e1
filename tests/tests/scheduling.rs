//! Queue, don't refuse (I9): real worker processes on 127.0.0.1. A request that fits
//! the context but not the free pages waits, holding no pages, and is served when pages free
//! up; a full queue or a passed queue deadline answers a typed status; a cancelled waiter
//! leaves the queue at once; `max_tokens` is said once, at `Reserve`. The last test runs the
//! real model behind the router: two tenants' marked prompts up to 0.98 × the context, then
//! eight requests at once against pools sized for two contexts. Those run at a context of
//! 2,048 unless `PAGEWARDEN_TEST_CONTEXT` names another (the model's full 8,192, for one run by
//! hand: `PAGEWARDEN_TEST_CONTEXT=8192 cargo test --release --test scheduling real_model`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pagewarden_common::reject_reason::RejectReason;
use pagewarden_model::{GgufFile, Tokenizer};
use pagewarden_proto::convert::reject_reason;
use pagewarden_proto::v1 as pb;
use pagewarden_system_tests::driver::{fresh_ref, greedy, Driver};
use pagewarden_system_tests::prompts::marked_prompt;
use pagewarden_system_tests::{
    api_key, model_path, start_decode, start_prefill, start_router_with, ModelArg,
};
use pagewarden_testkit::{eventually, poll_until};
use serde_json::{json, Value};

const TINY: ModelArg = ModelArg::Tiny(7);
/// Bound on waiting for a state the test caused (not a timing assertion: a generous ceiling).
const SETTLE: Duration = Duration::from_secs(20);

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 20 + i % 200).collect()
}

/// Polls decode's `Info` until `ok` holds; returns that `Info`.
async fn wait_info(
    d: &mut Driver,
    what: &str,
    ok: impl Fn(&pb::WorkerInfo) -> bool,
) -> pb::WorkerInfo {
    let ok = &ok;
    eventually(SETTLE, what, || {
        let mut d = d.clone();
        async move {
            let info = d.decode_info().await;
            if ok(&info) {
                Ok(info)
            } else {
                Err(format!("decode Info {info:?}"))
            }
        }
    })
    .await
}

type ReserveCall = tokio::task::JoinHandle<Result<pb::WriteGrant, tonic::Status>>;

fn spawn_reserve(
    d: &Driver,
    req: &pb::RequestRef,
    prompt_tokens: u32,
    max_tokens: u32,
) -> ReserveCall {
    let (mut d, req) = (d.clone(), req.clone());
    let p = prompt(prompt_tokens as usize);
    tokio::spawn(async move { d.reserve(&req, "t", &p, max_tokens).await })
}

/// Tiny model: context 256; decode's default pool holds two contexts (32 pages of 16). A
/// reservation holds its prompt's pages (15 for 240 tokens) and is owed the page its first
/// generated token needs: two of them speak for all 32 pages.
const PROMPT: u32 = 240;
const MAX: u32 = 16;
/// Pages two reservations hold.
const HELD: u64 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_that_does_not_fit_now_waits_holding_nothing_and_is_served_later() {
    let decode = start_decode(&TINY, &[]);
    let prefill = start_prefill(&TINY, &[]);
    let mut d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let total = d.decode_info().await.total_pages;
    let (r1, r2, r3) = (fresh_ref(), fresh_ref(), fresh_ref());
    let p = prompt(PROMPT as usize);
    let g1 = d.reserve(&r1, "t", &p, MAX).await.expect("first fits");
    let g2 = d.reserve(&r2, "t", &p, MAX).await.expect("second fits");
    let call3 = spawn_reserve(&d, &r3, PROMPT, MAX);
    let info = wait_info(&mut d, "third request queued", |i| i.queue_depth == 1).await;
    assert_eq!(
        info.free_pages,
        total - HELD,
        "the waiting request holds no pages"
    );
    assert!(!call3.is_finished(), "queued, not refused");

    // The first one runs to its end; its pages free, and the waiting one gets its grant.
    let reply = d
        .prefill(&r1, "t", &p, g1, greedy(MAX))
        .await
        .expect("prefill 1");
    d.generate(&r1, reply).await.expect("generate 1");
    let g3 = call3
        .await
        .unwrap()
        .expect("the waiting request is granted");
    assert_eq!(d.decode_info().await.queue_depth, 0);
    for (r, g) in [(r2, g2), (r3, g3)] {
        let reply = d
            .prefill(&r, "t", &p, g, greedy(MAX))
            .await
            .expect("prefill");
        d.generate(&r, reply).await.expect("generate");
    }
    let info = wait_info(&mut d, "pool all free", |i| i.free_pages == total).await;
    assert_eq!((info.queue_depth, info.active_requests), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_and_a_passed_queue_deadline_answer_typed_statuses() {
    let decode = start_decode(&TINY, &["--max-queue", "1", "--queue-timeout", "3s"]);
    let prefill = start_prefill(&TINY, &[]);
    let mut d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let total = d.decode_info().await.total_pages;
    let (r1, r2) = (fresh_ref(), fresh_ref());
    let p = prompt(PROMPT as usize);
    d.reserve(&r1, "t", &p, MAX).await.expect("first fits");
    d.reserve(&r2, "t", &p, MAX).await.expect("second fits");
    let call3 = spawn_reserve(&d, &fresh_ref(), PROMPT, MAX);
    wait_info(&mut d, "third request queued", |i| i.queue_depth == 1).await;
    let full = d
        .reserve(&fresh_ref(), "t", &p, MAX)
        .await
        .expect_err("the queue holds one");
    assert_eq!(full.code(), tonic::Code::ResourceExhausted, "{full:?}");
    assert_eq!(reject_reason(&full), Some(RejectReason::QueueFull));
    let late = call3.await.unwrap().expect_err("its queue deadline passes");
    assert_eq!(late.code(), tonic::Code::ResourceExhausted, "{late:?}");
    assert_eq!(reject_reason(&late), Some(RejectReason::QueueTimeout));
    let info = d.decode_info().await;
    assert_eq!((info.queue_depth, info.free_pages), (0, total - HELD));
    // Admission (I3) still comes first: an over-context request is rejected, never queued.
    let over = d
        .reserve(&fresh_ref(), "t", &prompt(200), 57)
        .await
        .expect_err("over the context");
    assert_eq!(
        reject_reason(&over),
        Some(RejectReason::ContextLengthExceeded)
    );
    assert!(d.abort_decode(&r1).await && d.abort_decode(&r2).await);
    wait_info(&mut d, "pool all free", |i| i.free_pages == total).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiting_request_leaves_the_queue_at_once() {
    let decode = start_decode(&TINY, &[]);
    let prefill = start_prefill(&TINY, &[]);
    let mut d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let total = d.decode_info().await.total_pages;
    let (r1, r2) = (fresh_ref(), fresh_ref());
    let p = prompt(PROMPT as usize);
    d.reserve(&r1, "t", &p, MAX).await.expect("first fits");
    d.reserve(&r2, "t", &p, MAX).await.expect("second fits");

    // The caller goes away (the router gave up): the request leaves the queue.
    let gone = spawn_reserve(&d, &fresh_ref(), PROMPT, MAX);
    wait_info(&mut d, "queued", |i| i.queue_depth == 1).await;
    gone.abort();
    wait_info(&mut d, "a dropped call leaves the queue", |i| {
        i.queue_depth == 0
    })
    .await;

    // An Abort for a waiting request takes it out and ends its call.
    let r4 = fresh_ref();
    let call4 = spawn_reserve(&d, &r4, PROMPT, MAX);
    wait_info(&mut d, "queued", |i| i.queue_depth == 1).await;
    assert!(d.abort_decode(&r4).await, "the waiting request is found");
    let err = call4.await.unwrap().expect_err("aborted while waiting");
    assert_eq!(err.code(), tonic::Code::Cancelled, "{err:?}");
    assert_eq!(d.decode_info().await.queue_depth, 0);

    // Neither got pages when the others ended.
    assert!(d.abort_decode(&r1).await && d.abort_decode(&r2).await);
    let info = wait_info(&mut d, "pool all free", |i| i.free_pages == total).await;
    assert_eq!(info.active_requests, 0);
}

/// I9 at prefill: its pool (one context) holds one 200-token prompt's pages at a time; six
/// at once all complete (they wait their turn) instead of "prefill KV pool busy".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_queues_prompts_its_pool_cannot_hold_at_once() {
    let decode = start_decode(&TINY, &["--pool-tokens", "4096"]);
    let prefill = start_prefill(&TINY, &["--pool-tokens", "256"]);
    let mut d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let mut d = d.clone();
            tokio::spawn(async move {
                let p: Vec<u32> = (0..200).map(|j| 20 + (i * 7 + j) % 200).collect();
                d.complete(&format!("tenant-{}", i % 2), &p, greedy(4))
                    .await
            })
        })
        .collect();
    for (i, c) in calls.into_iter().enumerate() {
        let done = c.await.unwrap();
        assert!(done.is_ok(), "request {i}: {done:?}");
    }
    let pi = d.prefill_info().await;
    assert_eq!((pi.free_pages, pi.queue_depth), (pi.total_pages, 0));
    wait_info(&mut d, "decode pool all free", |i| {
        i.free_pages == i.total_pages
    })
    .await;
}

/// The generation's parameters are given once, at `Reserve`: a `Generate` carries only what
/// prefill produced, so it cannot ask for another `max_tokens` (which used to revoke the grant
/// and leave its pages quarantined for good). The reservation's budget rules the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_is_said_once_at_reserve_and_nothing_is_left_behind() {
    let decode = start_decode(&TINY, &["--drain-timeout", "300ms"]);
    let prefill = start_prefill(&TINY, &[]);
    let mut d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let total = d.decode_info().await.total_pages;
    let p = prompt(40);
    let req = fresh_ref();
    let mut sampling = greedy(3);
    sampling.stop = vec![];
    let grant = d
        .reserve_with(&req, "t", &p, sampling.clone())
        .await
        .expect("reserve");
    // Prefill's own copy of the sampling parameters is for its admission re-check and first
    // token only; decode generates with what it was given at Reserve.
    let reply = d
        .prefill(&req, "t", &p, grant, greedy(3))
        .await
        .expect("prefill");
    let done = d.generate(&req, reply).await.expect("generate");
    assert!(done.tokens.len() <= 3, "{done:?}");
    // Nothing may be quarantined: pages left to the drain timeout would never all be free.
    let info = wait_info(&mut d, "pool all free", |i| i.free_pages == total).await;
    assert_eq!(info.free_pages, total);
    // Reserve without sampling parameters is malformed.
    let err = d
        .decode
        .reserve(pb::ReserveRequest {
            req: Some(fresh_ref()),
            tenant: "t".into(),
            prompt_tokens: 4,
            sampling: None,
            prompt_token_ids: vec![30, 31, 32, 33],
            tenant_weight: 1,
            namespace: Vec::new(),
        })
        .await
        .expect_err("sampling is required");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    // So is every prompt id: decode recomputes a preempted sequence from them.
    let err = d
        .decode
        .reserve(pb::ReserveRequest {
            req: Some(fresh_ref()),
            tenant: "t".into(),
            prompt_tokens: 4,
            sampling: Some(greedy(3)),
            prompt_token_ids: vec![30, 31, 32],
            tenant_weight: 1,
            namespace: Vec::new(),
        })
        .await
        .expect_err("prompt ids are required");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

// ---- The real model behind the router ----

/// The workers' advertised context: 2,048 (CI), or `PAGEWARDEN_TEST_CONTEXT`.
fn context() -> usize {
    match std::env::var("PAGEWARDEN_TEST_CONTEXT") {
        Ok(v) => v.parse().expect("PAGEWARDEN_TEST_CONTEXT: a token count"),
        Err(_) => 2048,
    }
}

async fn complete(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    prompt: &str,
    max: u32,
    stop: &[&str],
) -> (u16, Value) {
    let r = client
        .post(format!("{url}/v1/completions"))
        .bearer_auth(key)
        .json(&json!({"prompt": prompt, "max_tokens": max, "temperature": 0, "stop": stop}))
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json body"))
}

/// Workers (context [`context`], each pool two contexts) and a router, real model.
struct RealSuite {
    _services: Vec<pagewarden_system_tests::Service>,
    d: Driver,
    tok: Arc<Tokenizer>,
    client: reqwest::Client,
    url: String,
}

/// A decode and a prefill worker on the real model with `worker` flags, and a router over them
/// with `router` flags.
async fn real_services(worker: &[&str], router: &[&str]) -> [pagewarden_system_tests::Service; 3] {
    let decode = start_decode(&ModelArg::Real, worker);
    let prefill = start_prefill(&ModelArg::Real, worker);
    let router = start_router_with(&ModelArg::Real, &[&decode], &[&prefill], router).await;
    [decode, prefill, router]
}

/// `router`: flags of the router (its default deadline unless one is given).
async fn real_suite(router: &[&str]) -> RealSuite {
    let ctx = context().to_string();
    let pool = (2 * context()).to_string();
    let worker = [
        "--context-length",
        ctx.as_str(),
        "--pool-tokens",
        pool.as_str(),
        // Prefill may queue behind another prompt: the grant must outlive that wait.
        "--grant-ttl",
        "15m",
        // A slow CI machine: requests may wait longer than the default.
        "--queue-timeout",
        "15m",
    ];
    let [decode, prefill, router] = real_services(&worker, router).await;
    let d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let tok = Arc::new(
        Tokenizer::from_gguf(&GgufFile::open(&model_path()).expect("model")).expect("tokenizer"),
    );
    let url = router.http_url();
    RealSuite {
        _services: vec![decode, prefill, router],
        d,
        tok,
        client: reqwest::Client::new(),
        url,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_model_two_tenants_interleave_prompts_up_to_the_context() {
    let RealSuite {
        _services,
        d: _,
        tok,
        client,
        url,
    } = real_suite(&[]).await;
    let codes = ["QX7A", "ZV9B"];
    let max_tokens = 6u32;

    // Two tenants interleave marked prompts of growing length, up to 0.98 × the context.
    let top = context() * 98 / 100 - max_tokens as usize;
    let started = Instant::now();
    for len in [200, context() * 44 / 100, context() * 73 / 100, top] {
        let calls: Vec<_> = (0..2)
            .map(|t| {
                let (client, url, tok) = (client.clone(), url.clone(), tok.clone());
                let text = marked_prompt(&tok, codes[t], len);
                tokio::spawn(async move {
                    complete(&client, &url, &api_key(t), &text, max_tokens, &[]).await
                })
            })
            .collect();
        for (t, c) in calls.into_iter().enumerate() {
            let (status, v) = c.await.unwrap();
            assert_eq!(status, 200, "tenant {t}, ~{len} tokens: {v}");
            let text = v["choices"][0]["text"].as_str().unwrap_or_default();
            eprintln!(
                "tenant {t}: {} prompt tokens -> {text:?} ({:.1?} since start)",
                v["usage"]["prompt_tokens"],
                started.elapsed()
            );
            assert!(
                text.contains(codes[t]),
                "tenant {t}, ~{len} tokens: own marker missing: {v}"
            );
            assert!(
                !text.contains(codes[1 - t]),
                "tenant {t} got the other's marker: {v}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_model_eight_at_once_wait_their_turn_and_leave_the_pools_free() {
    let RealSuite {
        _services,
        mut d,
        tok,
        client,
        url,
    } = real_suite(&[]).await;
    // Eight requests at once. Each reserves its prompt's pages, half a context (its completion
    // may take the other half; a stop sequence ends it after the code), so decode's pool (two
    // contexts) holds three prompts at a time: the rest wait their turn, none is refused.
    let started = Instant::now();
    // Watches decode's queue until one of the eight waits in it.
    let queued = {
        let d = d.clone();
        tokio::spawn(async move {
            poll_until(Duration::from_secs(600), || {
                let mut d = d.clone();
                async move {
                    let q = d.decode_info().await.queue_depth;
                    (q > 0).then_some(q)
                }
            })
            .await
        })
    };
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let (client, url, tok) = (client.clone(), url.clone(), tok.clone());
            let code = format!("K{i}W{i}");
            tokio::spawn(async move {
                let text = marked_prompt(&tok, &code, context() / 2);
                let max = (context() / 2 - 16) as u32;
                let got = complete(&client, &url, &api_key(i % 2), &text, max, &["\n"]).await;
                (code, got)
            })
        })
        .collect();
    for c in calls {
        let (code, (status, v)) = c.await.unwrap();
        assert_eq!(status, 200, "{code}: {v}");
        let text = v["choices"][0]["text"].as_str().unwrap_or_default();
        assert!(text.contains(&code), "{code}: own marker missing: {v}");
    }
    let queued = if queued.is_finished() {
        queued.await.expect("queue watcher")
    } else {
        queued.abort();
        None
    };
    eprintln!(
        "eight at once: all 200 in {:.1?}; decode queue seen: {queued:?}",
        started.elapsed()
    );
    assert!(
        queued.is_some(),
        "the eight never had to wait: the test does not load the pool"
    );
    wait_info(&mut d, "decode pool all free", |i| {
        i.free_pages == i.total_pages && i.queue_depth == 0
    })
    .await;
    let pi = d.prefill_info().await;
    assert_eq!((pi.free_pages, pi.queue_depth), (pi.total_pages, 0));
}

/// Polls until `ok` holds over `service`'s metrics text (`/metrics` on its metrics listener,
/// or the router's HTTP one); returns that text.
async fn wait_metrics(
    url: &str,
    what: &str,
    within: Duration,
    ok: impl Fn(&str) -> bool,
) -> String {
    eventually(within, what, || async {
        let text = reqwest::get(url)
            .await
            .expect("scrape")
            .text()
            .await
            .expect("metrics text");
        if ok(&text) {
            Ok(text)
        } else {
            Err(format!("\n{text}"))
        }
    })
    .await
}

fn sample(text: &str, series: &str) -> f64 {
    pagewarden_common::metrics::sample_value(text, series).unwrap_or(0.0)
}

/// Every page of a worker's pool is free (none used, draining or quarantined).
fn pool_idle(text: &str, role: &str) -> bool {
    let s = |state: &str| {
        sample(
            text,
            &format!("pagewarden_pool_pages{{role=\"{role}\",state=\"{state}\"}}"),
        )
    };
    s("free") > 0.0 && s("used") == 0.0 && s("draining") == 0.0 && s("quarantined") == 0.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_model_prefill_streams_pages_while_computing_and_a_cancel_stops_it_within_a_chunk() {
    // Context 4,096 in chunks of 128: a prompt of about 4,000 tokens is 31 chunks.
    let worker = [
        "--context-length",
        "4096",
        "--pool-tokens",
        "8192",
        "--chunk-tokens",
        "128",
    ];
    let [decode, prefill, router] = real_services(&worker, &[]).await;
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model_path()).expect("model")).expect("tok");
    let text = marked_prompt(&tok, "LONG1", 4000);
    let chunks = tok.encode(&text, true).len().div_ceil(128) as f64;
    let prefill_metrics = format!("http://{}/metrics", prefill.addrs["metrics"]);
    let decode_metrics = format!("http://{}/metrics", decode.addrs["metrics"]);
    let router_metrics = format!("{}/metrics", router.http_url());
    let computed = |t: &str| sample(t, "pagewarden_prefill_chunks_total{role=\"prefill\"}");

    let response = reqwest::Client::new()
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth(api_key(0))
        .json(&json!({"prompt": text, "max_tokens": 8, "stream": true}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 200);

    // Pipelined: decode holds pages of the prompt while prefill still computes it.
    let seen = eventually(Duration::from_secs(120), "KV at decode", || async {
        let landed = sample(
            &wait_metrics(&decode_metrics, "decode", SETTLE, |_| true).await,
            "pagewarden_transfer_bytes_total{role=\"decode\"}",
        );
        let done = computed(&wait_metrics(&prefill_metrics, "prefill", SETTLE, |_| true).await);
        (landed > 0.0).then_some(done)
    })
    .await;
    eprintln!("decode received KV after {seen} of {chunks} chunks");
    assert!(
        seen < chunks,
        "KV reached decode only after the whole forward pass ({seen} of {chunks} chunks)"
    );

    // The client leaves: the router aborts both halves, and prefill stops within one chunk.
    drop(response);
    let aborted = wait_metrics(
        &router_metrics,
        "router abort",
        Duration::from_secs(60),
        |t| {
            t.lines()
                .any(|l| l.starts_with("pagewarden_router_aborts_sent_total{half=\"prefill\""))
        },
    )
    .await;
    drop(aborted);
    let at_abort = computed(&wait_metrics(&prefill_metrics, "prefill", SETTLE, |_| true).await);
    let idle = wait_metrics(&prefill_metrics, "prefill pool idle", SETTLE, |t| {
        pool_idle(t, "prefill")
    })
    .await;
    let after = computed(&idle);
    wait_metrics(&decode_metrics, "decode pool idle", SETTLE, |t| {
        pool_idle(t, "decode")
    })
    .await;
    eprintln!("abort seen after {at_abort} chunks; prefill stopped after {after} of {chunks}");
    assert!(
        after <= at_abort + 1.0,
        "prefill went on for {} chunks after the abort",
        after - at_abort
    );
    assert!(after < chunks, "the prompt was computed to its end");
}
