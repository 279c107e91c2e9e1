//! A small stand-in for the router: `/v1/models` and a streamed `/v1/completions` that counts
//! whitespace words (+1 for BOS) as tokens and rejects over-length prompts the way the real
//! router must. Switches make it misbehave.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pagewarden_common::receipt::ReceiptKey;
use parking_lot::Mutex;
use serde_json::{json, Value};

pub const LIMIT: u32 = 256;

#[derive(Default)]
pub struct Faults {
    /// Append this marker to every completion.
    pub leak: Option<String>,
    /// Answer over-length prompts with a 200 instead of a 400.
    pub accept_overlength: bool,
    /// Report one token fewer than the prompt has.
    pub miscount: bool,
    /// Answer `/ready` with 503 (as a router without live workers does).
    pub not_ready: bool,
    /// One prefix cache for every tenant, instead of one per tenant.
    pub shared_prefix_cache: bool,
    /// Prefill's pace: the first token comes this many µs per prompt token after the request.
    pub us_per_token: u64,
    /// A stall: a prompt of at least this many tokens takes ten times its time (once).
    pub stall_at: Option<u32>,
    /// A prompt found in the cache gets its first token ten times sooner (the timing a real
    /// prefix cache shows).
    pub cache_speedup: bool,
    /// Sign a receipt naming this prefill worker when a request asks for one (a request that
    /// asks without it is refused with `receipts_not_configured`, as the router does).
    pub receipts: Option<(Arc<ReceiptKey>, String)>,
}

#[derive(Clone)]
pub struct Fake {
    pub faults: Arc<Mutex<Faults>>,
    /// The advertised `max_model_len` ([`LIMIT`] unless started with another).
    limit: u32,
    keys: Arc<HashMap<String, String>>,
    pub seen: Arc<Mutex<Vec<(String, usize)>>>,
    /// `/ready` asks answered 503.
    pub refused_ready: Arc<AtomicUsize>,
    /// Prompts answered, by the tenant whose cache holds them: a repeat reports every prompt
    /// token but the last as cached (`usage.prompt_tokens_details.cached_tokens`).
    cached: Arc<Mutex<std::collections::HashSet<(String, String)>>>,
}

async fn models(State(f): State<Fake>) -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": "smollm2", "object": "model", "max_model_len": f.limit}]}),
    )
}

async fn ready(State(f): State<Fake>) -> StatusCode {
    if f.faults.lock().not_ready {
        f.refused_ready.fetch_add(1, Ordering::SeqCst);
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

/// The router's `/health` body: one live worker of each half, the decode one a quarter full,
/// and a second decode draining.
async fn health(State(f): State<Fake>) -> Json<Value> {
    let live = |role: &str, free: u64| {
        json!({"role": role, "node_id": format!("{role}-0"), "state": "live",
               "context_length": f.limit, "total_pages": 64, "free_pages": free,
               "active_requests": 1, "queue_depth": 0, "arithmetic": "cpu:avx512",
               "version": "0.1.0"})
    };
    Json(json!({
        "status": "ok", "live_prefill": 1, "live_decode": 1, "effective_context": f.limit,
        "workers": [
            live("decode", 48),
            {"role": "decode", "node_id": "decode-1", "state": "down",
             "error": "Info failed: status: Unavailable, message: \"decode is draining\""},
            live("prefill", 64),
        ]
    }))
}

fn error(status: StatusCode, code: &str) -> Response {
    (
        status,
        Json(json!({"error": {"message": code, "type": "invalid_request_error", "code": code}})),
    )
        .into_response()
}

async fn completions(
    State(f): State<Fake>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let key = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let Some(tenant) = f.keys.get(key).cloned() else {
        return error(StatusCode::UNAUTHORIZED, "invalid_api_key");
    };
    let prompt = body["prompt"].as_str().unwrap_or_default();
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(16) as u32;
    let mut prompt_tokens = prompt.split_whitespace().count() as u32 + 1;
    f.seen.lock().push((tenant.clone(), prompt_tokens as usize));
    let wants_receipt = headers
        .get("x-pagewarden-receipt")
        .is_some_and(|v| v.as_bytes() == b"1");
    let (wait, cached_tokens, receipt) = {
        let mut faults = f.faults.lock();
        if wants_receipt && faults.receipts.is_none() {
            return error(StatusCode::BAD_REQUEST, "receipts_not_configured");
        }
        let space = if faults.shared_prefix_cache {
            String::new()
        } else {
            tenant
        };
        let cached_tokens = if f.cached.lock().insert((space, prompt.to_string())) {
            0
        } else {
            prompt_tokens - 1
        };
        let stalled = faults.stall_at.is_some_and(|at| prompt_tokens >= at);
        if stalled {
            faults.stall_at = None;
        }
        let mut us = faults.us_per_token * u64::from(prompt_tokens);
        if stalled {
            us *= 10;
        }
        if faults.cache_speedup && cached_tokens > 0 {
            us /= 10;
        }
        let receipt = match (&faults.receipts, wants_receipt) {
            (Some((key, worker)), true) => Some(
                key.sign(json!({"choices": [{"index": 0, "prefill": {"worker": worker}}]}))
                    .unwrap(),
            ),
            _ => None,
        };
        (std::time::Duration::from_micros(us), cached_tokens, receipt)
    };
    tokio::time::sleep(wait).await;
    let faults = f.faults.lock();
    if prompt_tokens + max_tokens > f.limit && !faults.accept_overlength {
        return error(StatusCode::BAD_REQUEST, "context_length_exceeded");
    }
    if faults.miscount {
        prompt_tokens -= 1;
    }
    let mut text = " the answer".to_string();
    if let Some(m) = &faults.leak {
        text.push(' ');
        text.push_str(m);
    }
    let mut sse = String::new();
    for piece in [text.as_str(), " end"] {
        let chunk = json!({"object": "text_completion", "choices": [{"index": 0, "text": piece, "finish_reason": null}]});
        sse.push_str(&format!("data: {chunk}\n\n"));
    }
    let usage = json!({"object": "text_completion", "choices": [],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2, "total_tokens": prompt_tokens + 2,
                  "prompt_tokens_details": {"cached_tokens": cached_tokens}}});
    sse.push_str(&format!("data: {usage}\n\n"));
    if let Some(r) = receipt {
        let chunk = json!({"object": "text_completion", "choices": [], "pagewarden_receipt": r});
        sse.push_str(&format!("data: {chunk}\n\n"));
    }
    sse.push_str("data: [DONE]\n\n");
    ([("content-type", "text/event-stream")], sse).into_response()
}

/// Starts the fake on a loopback port; `keys` maps API key → tenant.
pub async fn start(keys: &[(&str, &str)]) -> (SocketAddr, Fake) {
    start_with_limit(keys, LIMIT).await
}

/// [`start`] advertising a context of `limit` tokens.
pub async fn start_with_limit(keys: &[(&str, &str)], limit: u32) -> (SocketAddr, Fake) {
    let fake = Fake {
        limit,
        faults: Arc::default(),
        keys: Arc::new(
            keys.iter()
                .map(|(k, t)| (k.to_string(), t.to_string()))
                .collect(),
        ),
        seen: Arc::default(),
        refused_ready: Arc::default(),
        cached: Arc::default(),
    };
    let app = Router::new()
        .route("/ready", get(ready))
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, fake)
}
