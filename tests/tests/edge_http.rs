//! Edge hardening of the real router binary: every refusal is a clean OpenAI-shaped
//! error with the right status and headers (401, 413, 400, 404, 429 and 503 with `Retry-After`),
//! no refused request reserves a page, good requests keep succeeding around the bad ones, and
//! SIGTERM drains an in-flight request before the router exits 0.
//!
//! Holding a request in flight deterministically: the prefill worker is paused with SIGSTOP, so
//! a request admitted by the router waits in its `Prefill` RPC until SIGCONT.

use std::time::Duration;

use pagewarden_system_tests::{
    api_key, start_decode, start_prefill, start_router, start_router_with, ModelArg, Service,
};
use pagewarden_testkit::{eventually, poll_until};
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use serde_json::{json, Value};

const TINY: ModelArg = ModelArg::Tiny(11);
const IN_FLIGHT: &str = "pagewarden_router_in_flight";
const COMMITTED: &str = "pagewarden_requests_total{role=\"decode\",outcome=\"committed\"}";

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

fn completions(router: &Service) -> String {
    format!("{}/v1/completions", router.http_url())
}

fn good_body() -> Value {
    json!({"model": "m", "prompt": "hello there", "max_tokens": 4, "temperature": 0})
}

/// A good request: 200 with a non-empty completion and the tokenizer's prompt count.
async fn assert_good(router: &Service, tenant: usize) {
    let r = client()
        .post(completions(router))
        .bearer_auth(api_key(tenant))
        .json(&good_body())
        .send()
        .await
        .expect("good request");
    let status = r.status().as_u16();
    let v: Value = r.json().await.expect("json body");
    assert_eq!(status, 200, "a good request failed: {v}");
    assert!(v["choices"][0]["text"].is_string(), "{v}");
    assert!(v["usage"]["prompt_tokens"].as_u64() > Some(0), "{v}");
}

/// Checks one refusal: status, JSON content type, the OpenAI error shape, the code and param,
/// and `Retry-After` exactly on 429/503. Returns the error object.
async fn assert_error(
    r: reqwest::Response,
    status: u16,
    code: &str,
    param: Option<&str>,
    what: &str,
) -> Value {
    let got = r.status().as_u16();
    let ctype = r
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let retry = r
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = r.text().await.expect("error body");
    assert_eq!(got, status, "{what}: status (body {text})");
    assert!(
        ctype.starts_with("application/json"),
        "{what}: content-type {ctype:?}"
    );
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{what}: body not JSON ({e}): {text}"));
    let obj = v.as_object().expect("error body is an object");
    assert_eq!(obj.len(), 1, "{what}: only `error` at the top level: {v}");
    let e = &v["error"];
    let msg = e["message"].as_str().unwrap_or("");
    assert!(!msg.is_empty(), "{what}: error.message: {v}");
    assert!(
        e["type"].as_str().is_some_and(|t| !t.is_empty()),
        "{what}: error.type: {v}"
    );
    assert_eq!(e["code"].as_str(), Some(code), "{what}: error.code: {v}");
    assert!(
        e.as_object().unwrap().contains_key("param"),
        "{what}: error.param present (null allowed): {v}"
    );
    if let Some(p) = param {
        assert_eq!(e["param"].as_str(), Some(p), "{what}: error.param: {v}");
        assert!(msg.contains(p), "{what}: the message names `{p}`: {msg}");
    }
    match status {
        429 | 503 => {
            let secs: u64 = retry
                .as_deref()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{what}: Retry-After in whole seconds: {retry:?}"));
            assert!(secs >= 1, "{what}: Retry-After {secs}");
        }
        _ => assert_eq!(retry, None, "{what}: Retry-After only on 429/503"),
    }
    e.clone()
}

/// Sends a good request for `tenant` that the paused prefill holds, and returns once the
/// router counts it in flight; the task yields its status and body when it finishes.
async fn hold_one_request(
    router: &Service,
    tenant: usize,
) -> tokio::task::JoinHandle<(u16, String)> {
    let url = completions(router);
    let held = tokio::spawn(async move {
        let r = client()
            .post(url)
            .bearer_auth(api_key(tenant))
            .json(&good_body())
            .send()
            .await
            .expect("held request");
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_default())
    });
    eventually(
        Duration::from_secs(10),
        "the held request in flight",
        || async { router.http_metric(IN_FLIGHT).await == 1.0 },
    )
    .await;
    held
}

async fn health_status(router: &Service) -> u16 {
    reqwest::get(format!("{}/health", router.http_url()))
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// Decode holds no page in use, draining or quarantined.
async fn assert_pool_clean(decode: &Service) {
    eventually(Duration::from_secs(5), "decode pool all free", || async {
        let mut busy = 0.0;
        for state in ["used", "draining"] {
            busy += decode
                .metric(&format!(
                    "pagewarden_pool_pages{{role=\"decode\",state=\"{state}\"}}"
                ))
                .await;
        }
        busy == 0.0
    })
    .await;
    let q = decode
        .metric("pagewarden_pool_pages{role=\"decode\",state=\"quarantined\"}")
        .await;
    assert_eq!(q, 0.0, "quarantined pages after clean refusals");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_openai_errors_and_good_requests_still_succeed() {
    let decode = start_decode(&TINY, &[]);
    let prefill = start_prefill(&TINY, &[]);
    let router = start_router_with(
        &TINY,
        &[&decode],
        &[&prefill],
        &["--max-body-bytes", "4096"],
    )
    .await;
    let url = completions(&router);
    assert_good(&router, 0).await;
    let committed_before = decode.metric(COMMITTED).await;

    // Good requests from other tenants run while the bad ones arrive.
    let background: Vec<_> = (1..4)
        .map(|t| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut ok = 0;
                for _ in 0..3 {
                    let r = client()
                        .post(&url)
                        .bearer_auth(api_key(t))
                        .json(&good_body())
                        .send()
                        .await
                        .expect("background request");
                    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
                    ok += 1;
                }
                ok
            })
        })
        .collect();

    // 401: no key, an unknown key, another scheme, an empty bearer.
    let r = client().post(&url).json(&good_body()).send().await.unwrap();
    assert_error(r, 401, "invalid_api_key", None, "no key").await;
    let r = client()
        .post(&url)
        .bearer_auth("not-a-key")
        .json(&good_body())
        .send()
        .await
        .unwrap();
    let e = assert_error(r, 401, "invalid_api_key", None, "bad key").await;
    assert_eq!(e["type"], "authentication_error");
    let r = client()
        .post(&url)
        .header("authorization", format!("Basic {}", api_key(0)))
        .json(&good_body())
        .send()
        .await
        .unwrap();
    assert_error(r, 401, "invalid_api_key", None, "basic scheme").await;
    let r = client()
        .post(&url)
        .header("authorization", "Bearer ")
        .json(&good_body())
        .send()
        .await
        .unwrap();
    assert_error(r, 401, "invalid_api_key", None, "empty bearer").await;
    let r = client()
        .get(format!("{}/v1/models", router.http_url()))
        .send()
        .await
        .unwrap();
    assert_error(r, 401, "invalid_api_key", None, "models without a key").await;

    // 413: over --max-body-bytes, with a Content-Length and chunked (no length up front).
    let big = json!({"prompt": "a".repeat(5000), "max_tokens": 1}).to_string();
    let r = client()
        .post(&url)
        .bearer_auth(api_key(0))
        .header(CONTENT_TYPE, "application/json")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_error(r, 413, "payload_too_large", None, "413 with length").await;
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
        .as_bytes()
        .chunks(1000)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let r = client()
        .post(&url)
        .bearer_auth(api_key(0))
        .header(CONTENT_TYPE, "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_error(r, 413, "payload_too_large", None, "413 chunked").await;

    // 400: bodies that are not JSON objects.
    let raw: [(&[u8], &str); 5] = [
        (
            b"{\"prompt\": \"caf\xc3\x28\", \"max_tokens\": 2}",
            "invalid_utf8",
        ),
        (b"\xff\xfe{}", "invalid_utf8"),
        (b"{\"prompt\": ", "invalid_json"),
        (b"[1, 2, 3]", "invalid_json"),
        (b"", "invalid_json"),
    ];
    for (body, code) in raw {
        let r = client()
            .post(&url)
            .bearer_auth(api_key(0))
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        assert_error(r, 400, code, None, &format!("raw body {body:?}")).await;
    }

    // 400: parameters out of range or of the wrong type, each naming its field.
    let bad: Vec<(Value, &str, &str)> = vec![
        (
            json!({"prompt": "x", "temperature": 2.5}),
            "invalid_value",
            "temperature",
        ),
        (
            json!({"prompt": "x", "temperature": -1}),
            "invalid_value",
            "temperature",
        ),
        (
            json!({"prompt": "x", "temperature": "hot"}),
            "invalid_value",
            "temperature",
        ),
        (json!({"prompt": "x", "top_p": 0}), "invalid_value", "top_p"),
        (
            json!({"prompt": "x", "top_p": 1.5}),
            "invalid_value",
            "top_p",
        ),
        (
            json!({"prompt": "x", "max_tokens": 0}),
            "invalid_value",
            "max_tokens",
        ),
        (
            json!({"prompt": "x", "max_tokens": -3}),
            "invalid_value",
            "max_tokens",
        ),
        (
            json!({"prompt": "x", "max_tokens": 1.5}),
            "invalid_value",
            "max_tokens",
        ),
        (
            json!({"prompt": "x", "max_tokens": 1u64 << 40}),
            "invalid_value",
            "max_tokens",
        ),
        (
            json!({"prompt": "x", "max_tokens": 4_000_000_000u64}),
            "context_length_exceeded",
            "max_tokens",
        ),
        (json!({"prompt": "x", "n": 17}), "invalid_value", "n"),
        (
            json!({"prompt": "x", "stream": "yes"}),
            "invalid_value",
            "stream",
        ),
        (json!({"prompt": "x", "stop": ""}), "invalid_value", "stop"),
        (
            json!({"prompt": "x", "logprobs": 21}),
            "invalid_value",
            "logprobs",
        ),
        (json!({"max_tokens": 2}), "invalid_value", "prompt"),
        (json!({"prompt": []}), "invalid_value", "prompt"),
        (json!({"prompt": [1, -2]}), "invalid_value", "prompt[1]"),
        (json!({"prompt": vec!["a"; 65]}), "invalid_value", "prompt"),
    ];
    for (body, code, param) in bad {
        let r = client()
            .post(&url)
            .bearer_auth(api_key(0))
            .json(&body)
            .send()
            .await
            .unwrap();
        let what = format!("{body}");
        let e = assert_error(r, 400, code, None, &what).await;
        let p = e["param"].as_str().unwrap_or("");
        assert!(p == param, "{what}: param {p:?}, want {param:?}");
    }
    let chat = format!("{}/v1/chat/completions", router.http_url());
    for (body, param) in [
        (json!({"messages": []}), "messages"),
        (
            json!({"messages": [{"role": "robot", "content": "hi"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}),
            "tools[0].function",
        ),
    ] {
        let r = client()
            .post(&chat)
            .bearer_auth(api_key(0))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_error(
            r,
            400,
            "invalid_value",
            Some(param),
            &format!("chat {body}"),
        )
        .await;
    }

    // 404: a model this router does not serve, and an unknown route, in the same shape.
    let r = client()
        .post(&url)
        .bearer_auth(api_key(0))
        .json(&json!({"model": "gpt-9", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_error(r, 404, "model_not_found", Some("model"), "unknown model").await;
    let r = client()
        .get(format!("{}/v1/engines", router.http_url()))
        .bearer_auth(api_key(0))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    // Nothing was lost: the background requests and a fresh one succeed, no refusal reached a
    // worker, and decode's pool is all free again.
    for h in background {
        assert_eq!(h.await.expect("background task"), 3);
    }
    assert_good(&router, 0).await;
    assert_eq!(
        decode.metric(COMMITTED).await - committed_before,
        10.0,
        "decode committed exactly the 10 good requests"
    );
    assert_eq!(
        decode
            .metric("pagewarden_requests_total{role=\"decode\",outcome=\"rejected\"}")
            .await,
        0.0,
        "no refused request reached decode"
    );
    assert_pool_clean(&decode).await;
    assert_eq!(router.http_metric(IN_FLIGHT).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_capacity_gets_429_and_no_workers_gets_503_with_retry_after() {
    let decode = start_decode(&TINY, &[]);
    let prefill = start_prefill(&TINY, &[]);
    // One router with a single slot and a slow Info poll (so the paused prefill still counts as
    // live and the held request stays in flight), one polling fast to see workers go away.
    let narrow = start_router_with(
        &TINY,
        &[&decode],
        &[&prefill],
        &["--max-concurrency", "1", "--info-interval", "60s"],
    )
    .await;
    let watchful = start_router(&TINY, &[&decode], &[&prefill]).await;
    assert_good(&narrow, 0).await;

    // 429: the one slot is held by a request waiting on the paused prefill.
    prefill.signal("STOP");
    let held = hold_one_request(&narrow, 0).await;
    for tenant in [0, 1] {
        let r = client()
            .post(completions(&narrow))
            .bearer_auth(api_key(tenant))
            .json(&good_body())
            .send()
            .await
            .unwrap();
        let e = assert_error(r, 429, "rate_limit_exceeded", None, "over concurrency").await;
        assert_eq!(e["type"], "rate_limit_error");
    }

    // 503: the fast-polling router sees the paused prefill stop answering.
    eventually(
        Duration::from_secs(10),
        "watchful router unhealthy",
        || async { health_status(&watchful).await == 503 },
    )
    .await;
    let r = reqwest::get(format!("{}/health", watchful.http_url()))
        .await
        .unwrap();
    assert!(
        r.headers().get(RETRY_AFTER).is_some(),
        "health 503 has Retry-After"
    );
    let r = client()
        .post(completions(&watchful))
        .bearer_auth(api_key(2))
        .json(&good_body())
        .send()
        .await
        .unwrap();
    let e = assert_error(r, 503, "no_live_workers", None, "no live prefill").await;
    assert!(e["message"].as_str().unwrap().contains("prefill"), "{e}");

    // Resume: the held request finishes, both routers recover, nothing was lost.
    prefill.signal("CONT");
    let (status, body) = held.await.expect("held task");
    assert_eq!(status, 200, "the held request: {body}");
    assert_eq!(narrow.http_metric(IN_FLIGHT).await, 0.0);
    eventually(
        Duration::from_secs(10),
        "watchful router healthy",
        || async { health_status(&watchful).await == 200 },
    )
    .await;
    assert_good(&narrow, 1).await;
    assert_good(&watchful, 2).await;

    // 503 again with decode gone for good.
    let mut decode = decode;
    decode.kill();
    eventually(
        Duration::from_secs(10),
        "router notices decode gone",
        || async { health_status(&watchful).await == 503 },
    )
    .await;
    let r = client()
        .post(completions(&watchful))
        .bearer_auth(api_key(3))
        .json(&good_body())
        .send()
        .await
        .unwrap();
    let e = assert_error(r, 503, "no_live_workers", None, "no live decode").await;
    assert!(e["message"].as_str().unwrap().contains("decode"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_in_flight_request_and_exits_zero() {
    let decode = start_decode(&TINY, &[]);
    let prefill = start_prefill(&TINY, &[]);
    let mut router =
        start_router_with(&TINY, &[&decode], &[&prefill], &["--info-interval", "60s"]).await;
    assert_good(&router, 0).await;

    prefill.signal("STOP");
    let held = hold_one_request(&router, 1).await;

    router.signal("TERM");
    // Draining: no new request is served (refused, or never answered), while the process
    // waits for the held request.
    let http = router.http_url();
    let probe = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .expect("client");
    eventually(Duration::from_secs(5), "new requests refused", || async {
        probe.get(format!("{http}/health")).send().await.is_err()
    })
    .await;
    // The router must not exit while the request is held: watched for 300 ms of real time.
    let exited = poll_until(Duration::from_millis(300), || {
        let exited = router.exited();
        async move { exited }
    })
    .await;
    assert!(
        exited.is_none(),
        "the router exited with a request in flight"
    );

    prefill.signal("CONT");
    let (status, body) = held.await.expect("held task");
    assert_eq!(status, 200, "the in-flight request finishes: {body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    assert!(v["choices"][0]["text"].is_string(), "{v}");
    let exit = tokio::task::block_in_place(|| router.wait_exit(Duration::from_secs(10)))
        .expect("router still running 10 s after its last request finished");
    assert!(exit.success(), "router exit status {exit:?}");
    assert_pool_clean(&decode).await;
}
