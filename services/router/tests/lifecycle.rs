//! A request's life through fake workers: streaming and full answers agree, usage counts, the
//! over-length sweep (I3: rejected requests reach no worker), cancellation of both halves (I6),
//! capacity errors with Retry-After, least-loaded picking, stale events (I5), the binary's start
//! line.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::fakes::{fake_text, FakeOpts};
use common::{expect_error, sse_data, Harness, Opts, KEY, OTHER_KEY};
use pagewarden_common::TenantId;
use pagewarden_router::discovery::Resolve;
use pagewarden_testkit::{eventually, poll_until};
use serde_json::{json, Value};

fn text_of(v: &Value) -> String {
    let c = &v["choices"][0];
    c["text"]
        .as_str()
        .or(c["message"]["content"].as_str())
        .or(c["delta"]["content"].as_str())
        .unwrap_or("")
        .to_string()
}

/// Reads a stream until its first token's text (the fake's `w0`) has arrived: the stream's
/// headers and opening chunk go out before any worker is called.
async fn read_until_first_token(r: &mut reqwest::Response) -> String {
    let mut seen = String::new();
    while !seen.contains("w0") {
        match r.chunk().await.expect("stream chunk") {
            Some(c) => seen.push_str(&String::from_utf8_lossy(&c)),
            None => panic!("stream ended before its first token: {seen}"),
        }
    }
    seen
}

async fn stream_body(h: &Harness, path: &str, body: &Value) -> (Vec<Value>, Vec<String>) {
    let r = h.post(path, body).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let data = sse_data(&r.text().await.unwrap());
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let chunks = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    (chunks, data)
}

#[tokio::test]
async fn streaming_and_full_agree_and_usage_is_the_tokenizer_count() {
    let h = Harness::start(Opts::default()).await;
    let prompt = "The capital of France is";
    let want_prompt = h.tokens(prompt).len() as u64;
    assert!(want_prompt > 0);
    let expected: String = (0..7).map(fake_text).collect();

    let full: Value = h
        .post(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 7}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(full["object"], "text_completion");
    assert_eq!(text_of(&full), expected);
    assert_eq!(full["choices"][0]["finish_reason"], "length");
    assert_eq!(full["usage"]["prompt_tokens"], want_prompt);
    assert_eq!(full["usage"]["completion_tokens"], 7);
    assert_eq!(full["usage"]["total_tokens"], want_prompt + 7);

    let (chunks, _) = stream_body(
        &h,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 7, "stream": true,
                "stream_options": {"include_usage": true}}),
    )
    .await;
    let streamed: String = chunks.iter().map(text_of).collect();
    assert_eq!(streamed, expected);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage, &full["usage"]);
    let finishes: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0].get("finish_reason"))
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, vec![&json!("length")]);

    // The router sent the tokenizer's count to decode and its ids, unchanged, to prefill.
    let d = h.decode[0].calls.lock();
    assert_eq!(d.reserve[0].prompt_tokens as u64, want_prompt);
    assert_eq!(
        h.prefill[0].calls.lock().prefill[0].prompt_tokens,
        h.tokens(prompt)
    );
}

#[tokio::test]
async fn chat_streaming_and_full_agree() {
    let h = Harness::start(Opts::default()).await;
    let messages = json!([{"role": "system", "content": "be brief"},
                          {"role": "user", "content": "hello there"}]);
    let full: Value = h
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 4}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(full["object"], "chat.completion");
    assert_eq!(full["choices"][0]["message"]["role"], "assistant");
    let (chunks, _) = stream_body(
        &h,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 4, "stream": true}),
    )
    .await;
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks.iter().map(text_of).collect();
    assert_eq!(streamed, text_of(&full));
    // The prompt is the chat template's rendering, tokenized with specials.
    let sent = h.decode[0].calls.lock().reserve[0].prompt_tokens;
    assert_eq!(full["usage"]["prompt_tokens"], sent);
    assert!(sent as usize > h.tokens("be brief hello there").len());
}

/// I3: context−1/context/context+1, 1..16 pages over, and over the pool but under the context.
#[tokio::test]
async fn over_length_sweep_rejects_before_any_worker_call() {
    const CTX: usize = 128;
    let h = Harness::start(Opts {
        decode: vec![FakeOpts {
            context_length: CTX as u32,
            pool_tokens: 4096,
            ..FakeOpts::default()
        }],
        ..Opts::default()
    })
    .await;
    let prompt = |n: usize| json!((0..n).map(|i| 1 + (i % 50) as u32).collect::<Vec<_>>());
    let mut cases: Vec<(Value, bool)> = vec![
        (json!({"prompt": prompt(CTX - 1)}), true),
        (json!({"prompt": prompt(CTX - 1), "max_tokens": 1}), true),
        (json!({"prompt": prompt(CTX - 1), "max_tokens": 2}), false),
        (json!({"prompt": prompt(CTX - 8), "max_tokens": 8}), true),
        (json!({"prompt": prompt(CTX)}), false),
        (json!({"prompt": prompt(CTX), "max_tokens": 1}), false),
        (json!({"prompt": prompt(CTX + 1)}), false),
        (json!({"prompt": prompt(1), "max_tokens": CTX}), false),
    ];
    for pages in 1..=16 {
        cases.push((json!({"prompt": prompt(CTX + 16 * pages)}), false));
    }
    for (i, (body, fits)) in cases.iter().enumerate() {
        for stream in [false, true] {
            let mut body = body.clone();
            body["stream"] = json!(stream);
            let before = (h.total_reserves(), h.total_prefills());
            let r = h.post("/v1/completions", &body).await;
            if *fits {
                assert_eq!(r.status(), 200, "case {i}");
                let _ = r.text().await;
                assert_eq!(h.total_reserves(), before.0 + 1);
            } else {
                let err = expect_error(r, 400).await;
                assert_eq!(err["code"], "context_length_exceeded", "case {i}");
                assert!(err["message"].as_str().unwrap().contains("128"));
                assert_eq!((h.total_reserves(), h.total_prefills()), before, "case {i}");
            }
        }
    }
    // Default max_tokens = min(256, room): context−1 gets exactly one token.
    let v: Value = h
        .post("/v1/completions", &json!({"prompt": prompt(CTX - 1)}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 1);
    assert_eq!(
        h.decode[0]
            .calls
            .lock()
            .reserve
            .last()
            .unwrap()
            .sampling
            .as_ref()
            .map(|s| s.max_tokens),
        Some(1)
    );
}

#[tokio::test]
async fn pool_smaller_than_context_bounds_the_effective_context() {
    let h = Harness::start(Opts {
        decode: vec![FakeOpts {
            context_length: 256,
            pool_tokens: 64,
            ..FakeOpts::default()
        }],
        prefill: vec![FakeOpts {
            context_length: 200,
            pool_tokens: 4096,
            ..FakeOpts::default()
        }],
        ..Opts::default()
    })
    .await;
    let models: Value = h.get("/v1/models").await.json().await.unwrap();
    assert_eq!(models["data"][0]["max_model_len"], 64);
    let over_pool = json!({"prompt": vec![3u32; 100], "max_tokens": 1});
    let err = expect_error(h.post("/v1/completions", &over_pool).await, 400).await;
    assert_eq!(err["code"], "context_length_exceeded");
    let text = "word ".repeat(200);
    assert!(h.tokens(&text).len() > 64);
    let err = expect_error(
        h.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": text}]}),
        )
        .await,
        400,
    )
    .await;
    assert_eq!(err["param"], "messages");
    assert_eq!(h.total_reserves() + h.total_prefills(), 0);
    let fits = json!({"prompt": vec![3u32; 60], "max_tokens": 4});
    assert_eq!(h.post("/v1/completions", &fits).await.status(), 200);
}

/// I6: a client that drops a stream mid-way gets both halves aborted.
#[tokio::test]
async fn client_disconnect_mid_stream_aborts_both_halves() {
    let h = Harness::start(Opts {
        decode: vec![FakeOpts {
            hang_after: Some(2),
            ..FakeOpts::default()
        }],
        ..Opts::default()
    })
    .await;
    let mut r = h
        .post(
            "/v1/completions",
            &json!({"prompt": "tell me a story", "max_tokens": 50, "stream": true}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let first = read_until_first_token(&mut r).await;
    assert!(first.contains("data:"));
    assert!(
        h.decode[0].aborts().is_empty(),
        "no abort before the disconnect"
    );
    drop(r);
    let d = h.decode[0].wait_abort().await.expect("decode got Abort");
    let p = h.prefill[0].wait_abort().await.expect("prefill got Abort");
    let sent = h.decode[0].calls.lock().reserve[0].req.clone();
    assert_eq!(d.req, sent);
    assert_eq!(p.req, sent);
    assert_eq!(d.reason, "client_disconnected");
    eventually(
        Duration::from_secs(5),
        "the request counted cancelled and out of flight",
        || async {
            let m = h.metrics().await;
            let done = m.contains("outcome=\"Cancelled\"} 1")
                && m.contains("pagewarden_router_in_flight 0");
            done.then_some(()).ok_or(m)
        },
    )
    .await;
}

/// I6 again, for a non-streaming request whose client gives up.
#[tokio::test]
async fn client_disconnect_while_waiting_aborts_both_halves() {
    let h = Harness::start(Opts {
        decode: vec![FakeOpts {
            hang_after: Some(1),
            ..FakeOpts::default()
        }],
        ..Opts::default()
    })
    .await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let r = client
        .post(h.url("/v1/completions"))
        .bearer_auth(KEY)
        .json(&json!({"prompt": "hi", "max_tokens": 10}))
        .send()
        .await;
    assert!(
        r.is_err(),
        "the request should hang until the client gives up"
    );
    assert!(h.decode[0].wait_abort().await.is_some());
    assert!(h.prefill[0].wait_abort().await.is_some());
}

#[tokio::test]
async fn failing_prefill_aborts_decode_and_answers_cleanly() {
    let h = Harness::start(Opts {
        prefill: vec![FakeOpts {
            fail: Some(tonic::Code::Internal),
            ..FakeOpts::default()
        }],
        ..Opts::default()
    })
    .await;
    let r = h
        .post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 3}))
        .await;
    let err = expect_error(r, 502).await;
    assert_eq!(err["code"], "worker_failed");
    assert!(err["message"].as_str().unwrap().contains("prefill"));
    // A stream has started before any worker was called: the failure is its error event.
    let (chunks, data) = stream_body(
        &h,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 3, "stream": true}),
    )
    .await;
    let err = &chunks.last().expect("an error event")["error"];
    assert_eq!(err["code"], "worker_failed", "{data:?}");
    assert!(err["message"].as_str().unwrap().contains("prefill"));
    let a = h.decode[0].wait_abort().await.expect("decode got Abort");
    assert_eq!(a.reason, "prefill_failed");
    assert!(h.decode[0].calls.lock().generate.is_empty());
}

#[tokio::test]
async fn deadline_aborts_both_halves_and_answers_504() {
    let h = Harness::start(Opts {
        prefill: vec![FakeOpts {
            hang_prefill: true,
            ..FakeOpts::default()
        }],
        request_timeout: Some(Duration::from_millis(300)),
        ..Opts::default()
    })
    .await;
    let r = h
        .post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 3}))
        .await;
    let err = expect_error(r, 504).await;
    assert_eq!(err["code"], "timeout");
    assert_eq!(h.decode[0].wait_abort().await.unwrap().reason, "deadline");
    assert!(h.prefill[0].wait_abort().await.is_some());
}

/// Whether alpha's `body` is served (200) within a second, trying again while a freed slot
/// comes back.
async fn served_again(h: &Harness, body: &Value) -> bool {
    poll_until(Duration::from_secs(1), || async {
        h.post("/v1/completions", body).await.status() == 200
    })
    .await
    .is_some()
}

/// `body` sent as `key`, streamed: the response once its first token has arrived (the stream
/// stays open while it is held).
async fn first_token_stream(h: &Harness, key: &str, body: &Value) -> reqwest::Response {
    let mut r = h
        .client
        .post(h.url("/v1/completions"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    read_until_first_token(&mut r).await;
    r
}

/// A stream of `key`'s held open after its first token (the fake decode hangs after one).
async fn held_stream(h: &Harness, key: &str) -> reqwest::Response {
    let body = json!({"prompt": "a", "max_tokens": 9, "stream": true});
    first_token_stream(h, key, &body).await
}

#[tokio::test]
async fn a_tenant_at_its_own_limit_gets_429_and_the_others_are_served() {
    let h = Harness::start(Opts {
        decode: vec![FakeOpts {
            hang_after: Some(1),
            ..FakeOpts::default()
        }],
        // Alpha's entry allows two; every other tenant gets the router's default of one.
        alpha_max_concurrent: Some(2),
        tenant_max_concurrency: Some(1),
        ..Opts::default()
    })
    .await;
    let a1 = held_stream(&h, KEY).await;
    let _a2 = held_stream(&h, KEY).await;
    let r = h
        .post("/v1/completions", &json!({"prompt": "b", "max_tokens": 2}))
        .await;
    assert_eq!(r.headers()["retry-after"], "1");
    let err = expect_error(r, 429).await;
    assert_eq!(err["code"], "tenant_limit_exceeded");
    assert!(err["message"].as_str().unwrap().contains("alpha"), "{err}");
    // Beta is not held back by alpha's flood, and is held to the default of one.
    let _b1 = held_stream(&h, OTHER_KEY).await;
    let r = h
        .client
        .post(h.url("/v1/completions"))
        .bearer_auth(OTHER_KEY)
        .json(&json!({"prompt": "b", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(expect_error(r, 429).await["code"], "tenant_limit_exceeded");
    assert!(h
        .metrics()
        .await
        .contains("reason=\"tenant_limit_exceeded\""));
    // Alpha's place comes back when one of its streams ends.
    drop(a1);
    h.decode[0].wait_abort().await.unwrap();
    assert!(
        served_again(&h, &json!({"prompt": "c", "max_tokens": 9, "stream": true})).await,
        "alpha's place was not given back"
    );
}

#[tokio::test]
async fn a_tenant_over_its_tokens_per_minute_gets_429_with_retry_after_and_weights_reach_the_workers(
) {
    // Alpha may use 60 tokens a minute (one a second); beta has no limit.
    let h = Harness::start(Opts {
        alpha_tokens_per_minute: Some(60),
        ..Opts::default()
    })
    .await;
    // Its prompt and its 56 completion tokens use the minute up.
    let r = h
        .post(
            "/v1/completions",
            &json!({"prompt": [5, 6, 7, 8], "max_tokens": 56}),
        )
        .await;
    assert_eq!(r.status().as_u16(), 200);
    let r = h
        .post(
            "/v1/completions",
            &json!({"prompt": [5, 6, 7, 8], "max_tokens": 2}),
        )
        .await;
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=4).contains(&wait),
        "Retry-After {wait}: 4 tokens at 1 a second"
    );
    let err = expect_error(r, 429).await;
    assert_eq!(err["code"], "tokens_per_minute_exceeded");
    assert_eq!(err["type"], "rate_limit_error");
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("alpha") && message.contains("60"), "{err}");
    assert!(h
        .metrics()
        .await
        .contains("reason=\"tokens_per_minute_exceeded\""));
    // Beta is not held back.
    let r = h
        .client
        .post(h.url("/v1/completions"))
        .bearer_auth(OTHER_KEY)
        .json(&json!({"prompt": [5, 6, 7, 8], "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // Each tenant's weight (alpha's entry says 2, beta has none) reaches both workers' queues.
    let reserves: Vec<(String, u32)> = h.decode[0]
        .calls
        .lock()
        .reserve
        .iter()
        .map(|r| (r.tenant.clone(), r.tenant_weight))
        .collect();
    let prefills: Vec<(String, u32)> = h.prefill[0]
        .calls
        .lock()
        .prefill
        .iter()
        .map(|p| (p.tenant.clone(), p.tenant_weight))
        .collect();
    let expected = [("alpha".to_string(), 2), ("beta".to_string(), 1)];
    assert_eq!(
        (reserves.as_slice(), prefills.as_slice()),
        (&expected[..], &expected[..])
    );
}

#[tokio::test]
async fn over_capacity_is_429_with_retry_after() {
    let h = Harness::start(Opts {
        decode: vec![FakeOpts {
            hang_after: Some(1),
            ..FakeOpts::default()
        }],
        max_concurrency: 1,
        ..Opts::default()
    })
    .await;
    let held = held_stream(&h, KEY).await;
    let r = h
        .post("/v1/completions", &json!({"prompt": "b", "max_tokens": 2}))
        .await;
    assert_eq!(r.headers()["retry-after"], "1");
    let err = expect_error(r, 429).await;
    assert_eq!(err["code"], "rate_limit_exceeded");
    drop(held);
    // The slot comes back once the held stream is gone.
    h.decode[0].wait_abort().await.unwrap();
    h.decode[0].opts.lock().hang_after = None;
    assert!(
        served_again(&h, &json!({"prompt": "c", "max_tokens": 2})).await,
        "slot was not released"
    );
}

#[tokio::test]
async fn no_live_worker_or_exhausted_pool_is_503_with_retry_after() {
    let h = Harness::start(Opts {
        decode: vec![FakeOpts {
            info_fails: true,
            ..FakeOpts::default()
        }],
        ..Opts::default()
    })
    .await;
    let body = json!({"prompt": "hi", "max_tokens": 2});
    let r = h.post("/v1/completions", &body).await;
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(expect_error(r, 503).await["code"], "no_live_workers");
    assert_eq!(h.total_reserves(), 0);
    let health = h.client.get(h.url("/health")).send().await.unwrap();
    assert_eq!(health.status(), 503);
    // The refusing worker is listed down, with the reason, and no load.
    let health: Value = health.json().await.unwrap();
    let decode = &health["workers"][0];
    assert_eq!(decode["role"], "decode", "{health}");
    assert_eq!(decode["state"], "down", "{health}");
    assert!(
        decode["error"].as_str().unwrap().contains("info disabled"),
        "{health}"
    );
    assert!(decode["free_pages"].is_null(), "{health}");
    assert_eq!(health["workers"][1]["state"], "live", "{health}");
    let models: Value = h.get("/v1/models").await.json().await.unwrap();
    assert!(models["data"][0]["max_model_len"].is_null());

    // The worker comes back (next poll), then its pool is exhausted.
    {
        let mut o = h.decode[0].opts.lock();
        o.info_fails = false;
        o.fail = Some(tonic::Code::ResourceExhausted);
    }
    eventually(
        Duration::from_secs(5),
        "the decode worker live again",
        || async {
            let health = h.client.get(h.url("/health")).send().await.unwrap();
            health.status() == 200
        },
    )
    .await;
    let r = h.post("/v1/completions", &body).await;
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(expect_error(r, 503).await["code"], "kv_pool_exhausted");
    assert_eq!(h.total_prefills(), 0);
    assert!(h.decode[0].wait_abort().await.is_some());
}

#[tokio::test]
async fn a_tenants_workers_are_picked_and_dead_ones_skipped() {
    let busy = FakeOpts {
        active_requests: 5,
        hang_after: Some(1),
        ..FakeOpts::default()
    };
    let idle = FakeOpts {
        hang_after: Some(1),
        ..FakeOpts::default()
    };
    let h = Harness::start(Opts {
        decode: vec![busy, idle.clone()],
        prefill: vec![idle.clone(), idle],
        dead_decode: vec!["http://127.0.0.1:1".into()],
        ..Opts::default()
    })
    .await;
    let mut streams = Vec::new();
    for _ in 0..2 {
        let body = json!({"prompt": "x", "max_tokens": 5, "stream": true});
        streams.push(first_token_stream(&h, KEY, &body).await);
    }
    // Both requests go to the tenant's own decode and prefill workers (where its cached
    // prefixes are: one request in flight there is within the slack), never to the dead one.
    let mut reserves = [h.decode[0].reserves(), h.decode[1].reserves()];
    reserves.sort_unstable();
    assert_eq!(reserves, [0, 2]);
    let mut prefills = [h.prefill[0].prefills(), h.prefill[1].prefills()];
    prefills.sort_unstable();
    assert_eq!(prefills, [0, 2]);
    let m = h.metrics().await;
    assert!(
        m.contains("pagewarden_router_live_workers{role=\"decode\"} 2"),
        "{m}"
    );
    drop(streams);
}

/// A name's answer in the tests: what `dns://decode.test:7201` resolves to right now, and how
/// many times the router asked since the answer was set.
struct Names(parking_lot::Mutex<(std::io::Result<Vec<std::net::SocketAddr>>, usize)>);

impl Names {
    fn answer(&self, addrs: std::io::Result<Vec<std::net::SocketAddr>>) {
        *self.0.lock() = (addrs, 0);
    }

    /// Waits until the router asked twice for the current answer: its refreshes run one after
    /// the other, so the first of them has been acted on.
    async fn taken(&self) {
        eventually(
            Duration::from_secs(5),
            "the router to look the name up",
            || async { self.0.lock().1 >= 2 },
        )
        .await
    }
}

impl Resolve for Names {
    fn resolve(
        &self,
        _name: &str,
        _port: u16,
    ) -> futures::future::BoxFuture<'static, std::io::Result<Vec<std::net::SocketAddr>>> {
        let mut current = self.0.lock();
        current.1 += 1;
        let answer = match &current.0 {
            Ok(a) => Ok(a.clone()),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        };
        Box::pin(async move { answer })
    }
}

/// Decode workers found by a DNS name (a compose service, a headless Kubernetes service): the
/// one the name answers is used; one that joins the name is picked up at the next poll; one that
/// leaves it gets nothing more; a failed lookup keeps the last answer.
#[tokio::test]
async fn decode_workers_are_found_by_name_and_leave_with_it() {
    let names = Arc::new(Names(parking_lot::Mutex::new((Ok(vec![]), 0))));
    let h = Harness::start(Opts {
        decode: vec![FakeOpts::default(), FakeOpts::default()],
        decode_resolver: Some(names.clone()),
        ..Opts::default()
    })
    .await;
    let addr = |i: usize| -> std::net::SocketAddr {
        h.decode[i]
            .url()
            .trim_start_matches("http://")
            .parse()
            .unwrap()
    };
    let body = json!({"prompt": "x", "max_tokens": 2});
    let live = |m: &str, n: usize| {
        m.contains(&format!(
            "pagewarden_router_live_workers{{role=\"decode\"}} {n}"
        ))
    };
    // The name answers nothing yet: no decode, the router is not ready.
    assert_eq!(
        h.client.get(h.url("/ready")).send().await.unwrap().status(),
        503
    );

    names.answer(Ok(vec![addr(0)]));
    let live_now = |n: usize| {
        let h = &h;
        async move {
            let what = format!("{n} live decode workers");
            eventually(Duration::from_secs(5), &what, || async {
                let m = h.metrics().await;
                live(&m, n).then_some(()).ok_or(m)
            })
            .await
        }
    };
    live_now(1).await;
    for _ in 0..3 {
        assert_eq!(h.post("/v1/completions", &body).await.status(), 200);
    }
    assert_eq!((h.decode[0].reserves(), h.decode[1].reserves()), (3, 0));

    names.answer(Ok(vec![addr(0), addr(1)]));
    live_now(2).await;

    names.answer(Ok(vec![addr(1)]));
    live_now(1).await;
    for _ in 0..3 {
        assert_eq!(h.post("/v1/completions", &body).await.status(), 200);
    }
    assert_eq!(
        (h.decode[0].reserves(), h.decode[1].reserves()),
        (3, 3),
        "a worker that left the name got requests"
    );

    names.answer(Err(std::io::Error::other("no DNS server")));
    names.taken().await;
    assert!(
        live(&h.metrics().await, 1),
        "a failed lookup dropped the workers"
    );
    assert_eq!(h.post("/v1/completions", &body).await.status(), 200);
    assert_eq!(h.decode[1].reserves(), 4);
}

/// I5: a token event naming another request is dropped and counted, never relayed.
#[tokio::test]
async fn stale_token_events_are_dropped_and_counted() {
    let h = Harness::start(Opts {
        decode: vec![FakeOpts {
            stale_event: true,
            ..FakeOpts::default()
        }],
        ..Opts::default()
    })
    .await;
    let v: Value = h
        .post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 3}))
        .await
        .json()
        .await
        .unwrap();
    assert!(!text_of(&v).contains("STALE"));
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert!(h
        .metrics()
        .await
        .contains("pagewarden_router_stale_messages_total 1"));
}

/// A marker-only end-of-generation event finishes with `stop` and is not counted.
#[tokio::test]
async fn end_of_generation_marker_is_stop_and_not_counted() {
    let h = Harness::start(Opts {
        decode: vec![FakeOpts {
            eog_after: Some(3),
            ..FakeOpts::default()
        }],
        ..Opts::default()
    })
    .await;
    let body = json!({"prompt": "hi", "max_tokens": 10});
    let v: Value = h.post("/v1/completions", &body).await.json().await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(text_of(&v), (0..3).map(fake_text).collect::<String>());
    let mut body = body;
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (chunks, _) = stream_body(&h, "/v1/completions", &body).await;
    assert_eq!(chunks.last().unwrap()["usage"], v["usage"]);
    assert_eq!(chunks.iter().map(text_of).collect::<String>(), text_of(&v));
    // A clean finish sends no abort: watched for 200 ms of real time.
    let abort = poll_until(Duration::from_millis(200), || async {
        h.decode[0].aborts().into_iter().next()
    })
    .await;
    assert!(abort.is_none(), "{abort:?}");
}

/// The binary prints one parseable start line and serves.
#[tokio::test]
async fn binary_prints_its_start_line() {
    use tokio::io::AsyncBufReadExt;
    let d = common::fakes::start_decode(FakeOpts::default()).await;
    let p = common::fakes::start_prefill(FakeOpts::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    std::fs::write(&model, pagewarden_model::tiny_llama_gguf(3)).unwrap();
    let tenants = dir.path().join("tenants.toml");
    let k1 = pagewarden_common::secret::SecretHash::of("k1");
    std::fs::write(
        &tenants,
        format!("[[tenants]]\nname = \"a\"\nkey_sha256 = [\"{k1}\"]\n"),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pagewarden-router"))
        .args(["--http-addr", "127.0.0.1:0", "--model"])
        .arg(&model)
        .arg("--tenants")
        .arg(&tenants)
        .args(["--decode", &d.url(), "--prefill", &p.url()])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("start line in time")
        .unwrap()
        .unwrap();
    let addr = line
        .strip_prefix("pagewarden-router listening http=")
        .unwrap_or_else(|| panic!("bad start line: {line}"));
    let r = reqwest::Client::new()
        .post(format!("http://{addr}/v1/completions"))
        .bearer_auth("k1")
        .json(&json!({"prompt": "hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    child.kill().await.unwrap();
}

/// A tenant's requests go to its own prefill worker (its prefix-cache namespace's, by
/// rendezvous hashing) until that worker has more than `AFFINITY_SLACK` more requests than the
/// least-loaded one; then to the least-loaded.
#[tokio::test]
async fn a_tenants_prompts_stay_on_its_prefill_worker_until_it_is_much_busier() {
    let idle = FakeOpts {
        hang_after: Some(1),
        ..FakeOpts::default()
    };
    let h = Harness::start(Opts {
        decode: vec![idle.clone(), idle.clone(), idle.clone(), idle.clone()],
        prefill: vec![idle.clone(), idle],
        ..Opts::default()
    })
    .await;
    let mut streams = Vec::new();
    for _ in 0..4 {
        let body = json!({"prompt": "x", "max_tokens": 5, "stream": true});
        streams.push(first_token_stream(&h, KEY, &body).await);
    }
    let mut prefills = [h.prefill[0].prefills(), h.prefill[1].prefills()];
    prefills.sort_unstable();
    assert_eq!(
        prefills,
        [1, 3],
        "three on the tenant's own worker (0, 1 and 2 in flight there: within the slack), the \
         fourth elsewhere"
    );
    drop(streams);
}

/// A worker whose last `Info` shows requests waiting in its queue is not picked while another
/// has none, even one with more requests active and more in flight from this router.
#[tokio::test]
async fn a_worker_with_a_queue_is_avoided() {
    let queued = FakeOpts {
        queue_depth: 3,
        hang_after: Some(1),
        ..FakeOpts::default()
    };
    let busy_but_no_queue = FakeOpts {
        active_requests: 7,
        hang_after: Some(1),
        ..FakeOpts::default()
    };
    let h = Harness::start(Opts {
        decode: vec![queued, busy_but_no_queue],
        ..Opts::default()
    })
    .await;
    let mut streams = Vec::new();
    for _ in 0..2 {
        let body = json!({"prompt": "x", "max_tokens": 5, "stream": true});
        streams.push(first_token_stream(&h, KEY, &body).await);
    }
    assert_eq!(
        h.decode[0].reserves(),
        0,
        "the worker with a queue was picked"
    );
    assert_eq!(h.decode[1].reserves(), 2);
    drop(streams);
}

/// The client sees progress: a stream's headers and its opening chunk (the assistant role)
/// arrive while the prompt is still in prefill, which here never ends.
#[tokio::test]
async fn a_stream_opens_before_prefill_ends() {
    let h = Harness::start(Opts {
        prefill: vec![FakeOpts {
            hang_prefill: true,
            ..FakeOpts::default()
        }],
        ..Opts::default()
    })
    .await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                      "stream": true});
    let opened = tokio::time::timeout(Duration::from_secs(30), async {
        let mut r = h.post("/v1/chat/completions", &body).await;
        assert_eq!(r.status(), 200);
        let chunk = r.chunk().await.expect("chunk").expect("an opening chunk");
        (r, String::from_utf8_lossy(&chunk).to_string())
    })
    .await;
    let (r, chunk) = opened.expect("the stream did not open while prefill runs");
    assert!(chunk.contains("\"role\":\"assistant\""), "{chunk}");
    assert_eq!(h.decode[0].calls.lock().generate.len(), 0, "no token yet");
    drop(r);
    assert!(h.prefill[0].wait_abort().await.is_some());
}

async fn delete_cache(h: &Harness, key: Option<&str>) -> reqwest::Response {
    let mut req = h.client.delete(h.url("/v1/cache"));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn erasing_the_cache_asks_every_worker_for_the_callers_own_namespace() {
    let h = Harness::start(Opts {
        prefill: vec![FakeOpts::default(), FakeOpts::default()],
        ..Opts::default()
    })
    .await;
    let r = delete_cache(&h, Some(KEY)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "cache.erasure");
    assert_eq!(v["tenant"], "alpha");
    let alpha = h.state.tenants.namespace(&TenantId::new("alpha"));
    assert_eq!(v["namespace"], alpha.tag());
    let workers = v["workers"].as_array().unwrap();
    let roles: Vec<&str> = workers
        .iter()
        .map(|w| w["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["prefill", "prefill", "decode"]);
    for w in workers {
        assert_eq!(w["worker"], format!("fake-{}", w["role"].as_str().unwrap()));
        assert_eq!(
            (&w["entries"], &w["pages_zeroed"], &w["pages_deferred"]),
            (&json!(3), &json!(2), &json!(1))
        );
        assert_eq!(w["digest"].as_str().unwrap().len(), 64);
    }
    assert_eq!(v["digest"].as_str().unwrap().len(), 64);
    for fake in h.prefill.iter().chain(&h.decode) {
        let asked = fake.erasures();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].tenant, "alpha");
        assert_eq!(asked[0].namespace, alpha.as_bytes().to_vec());
    }

    // Beta erases its own namespace, never alpha's.
    let r = delete_cache(&h, Some(OTHER_KEY)).await;
    assert_eq!(r.status(), 200);
    let beta = h.state.tenants.namespace(&TenantId::new("beta"));
    assert_ne!(alpha, beta);
    let asked = h.decode[0].erasures();
    assert_eq!(asked[1].tenant, "beta");
    assert_eq!(asked[1].namespace, beta.as_bytes().to_vec());
}

#[tokio::test]
async fn erasing_the_cache_needs_a_key_and_the_delete_method() {
    let h = Harness::start(Opts::default()).await;
    let err = expect_error(delete_cache(&h, None).await, 401).await;
    assert_eq!(err["code"], "invalid_api_key");
    let err = expect_error(delete_cache(&h, Some("sk-nobody")).await, 401).await;
    assert_eq!(err["code"], "invalid_api_key");
    let err = expect_error(h.get("/v1/cache").await, 405).await;
    assert_eq!(err["code"], "method_not_allowed");
    assert!(h.decode[0].erasures().is_empty() && h.prefill[0].erasures().is_empty());
}

#[tokio::test]
async fn a_worker_that_does_not_confirm_fails_the_erasure_and_is_named() {
    // A decode worker nobody listens on.
    let dead = "http://127.0.0.1:9".to_string();
    let h = Harness::start(Opts {
        dead_decode: vec![dead.clone()],
        ..Opts::default()
    })
    .await;
    let err = expect_error(delete_cache(&h, Some(KEY)).await, 503).await;
    assert_eq!(err["code"], "erasure_incomplete");
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("the decode worker {dead}")),
        "{message}"
    );
    // The live ones were asked (and erased) all the same.
    assert_eq!(h.decode[0].erasures().len(), 1);

    // A worker that answers with an error is named by its node id.
    let h = Harness::start(Opts {
        prefill: vec![FakeOpts {
            fail_erase: Some(tonic::Code::Internal),
            ..FakeOpts::default()
        }],
        ..Opts::default()
    })
    .await;
    let err = expect_error(delete_cache(&h, Some(KEY)).await, 503).await;
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("prefill worker fake-prefill"), "{message}");
    assert!(message.contains("fake erase fails"), "{message}");
}

/// Keeps what the router hands the auditor's recompute audit.
#[derive(Default)]
struct RecomputeRecorder(parking_lot::Mutex<Vec<pagewarden_router::sample::RecomputeSample>>);

impl pagewarden_router::sample::SampleSink for RecomputeRecorder {
    fn takes_recomputes(&self) -> bool {
        true
    }

    fn recompute(&self, sample: pagewarden_router::sample::RecomputeSample) {
        self.0.lock().push(sample);
    }
}

/// A choice picked for the recompute audit (rate 1) asks decode for every token's logprob and
/// hands the auditor its prompt, output and served logprobs, while the client, which asked for
/// none, sees none; at rate 0 nothing is picked and decode is asked for none.
#[tokio::test]
async fn a_choice_picked_for_the_recompute_audit_carries_its_served_logprobs() {
    use pagewarden_common::tenants::Rate;
    for (rate, picked) in [(Rate::new(1.0).unwrap(), true), (Rate::ZERO, false)] {
        let sink = Arc::new(RecomputeRecorder::default());
        let h = Harness::start(Opts {
            recompute_rate: rate,
            sink: Some(sink.clone()),
            ..Opts::default()
        })
        .await;
        let prompt = "the audit scores this again";
        let body: Value = h
            .post(
                "/v1/completions",
                &json!({"prompt": prompt, "max_tokens": 3, "temperature": 0.7}),
            )
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(body["choices"][0]["logprobs"], Value::Null, "{body}");
        let asked = h.decode[0].calls.lock().reserve[0]
            .sampling
            .as_ref()
            .and_then(|s| s.logprobs);
        let samples = sink.0.lock().clone();
        if !picked {
            assert_eq!(asked, None);
            assert!(samples.is_empty(), "{samples:?}");
            continue;
        }
        assert_eq!(asked, Some(0));
        let [s] = samples.as_slice() else {
            panic!("one sample expected: {samples:?}");
        };
        assert_eq!(s.tenant, TenantId::new("alpha"));
        assert_eq!(s.prompt, h.tokens(prompt));
        assert_eq!(s.output.len(), 3);
        let want: Vec<f32> = (0..3).map(common::fakes::fake_logprob).collect();
        assert_eq!(s.served_logprobs, want);
        assert_eq!(s.temperature, 0.7);
    }
}
