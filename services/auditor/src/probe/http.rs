//! The prober's HTTP side: the router's advertised context limit, and one completion request
//! read as a stream so first-token latency is measured where the client would see it; when the
//! deployment signs isolation receipts, a request may ask for one and learn, from the verified
//! receipt, which prefill worker computed its prompt.

use std::time::{Duration, Instant};

use futures::StreamExt;
use pagewarden_common::receipt::PublicKey;
use serde_json::{json, Value};

use super::plan::Answer;

/// Talking to the router failed before an HTTP answer came back.
#[derive(Debug, thiserror::Error)]
pub enum ProbeHttpError {
    /// Connect, send or read failed.
    #[error("router request failed: {0}")]
    Transport(#[from] reqwest::Error),
    /// `/v1/models` did not say how long a context may be.
    #[error("router's /v1/models has no max_model_len: {0}")]
    NoLimit(String),
}

/// The smallest `max_model_len` over the models `/v1/models` lists, and the first model id.
pub async fn context_limit(
    http: &reqwest::Client,
    router: &str,
    api_key: &str,
) -> Result<(u32, String), ProbeHttpError> {
    let body: Value = http
        .get(format!("{router}/v1/models"))
        .bearer_auth(api_key)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let models = body["data"].as_array().cloned().unwrap_or_default();
    let limit = models
        .iter()
        .filter_map(|m| m["max_model_len"].as_u64())
        .min()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| ProbeHttpError::NoLimit(body.to_string()))?;
    let id = models
        .first()
        .and_then(|m| m["id"].as_str())
        .unwrap_or_default()
        .to_string();
    Ok((limit, id))
}

/// Sends one streamed completion and collects what came back.
pub async fn complete(
    http: &reqwest::Client,
    router: &str,
    api_key: &str,
    model: &str,
    prompt: &str,
    max_tokens: u32,
    timeout: Duration,
) -> Result<Answer, ProbeHttpError> {
    let r = Request {
        router,
        api_key,
        model,
        prompt,
        max_tokens,
        timeout,
    };
    send(http, &r, None).await.map(|(answer, _)| answer)
}

/// One completion request of the prober.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// Router base URL.
    pub router: &'a str,
    /// The probe tenant's key.
    pub api_key: &'a str,
    /// Model id.
    pub model: &'a str,
    /// The prompt.
    pub prompt: &'a str,
    /// `max_tokens`.
    pub max_tokens: u32,
    /// Whole-request timeout.
    pub timeout: Duration,
}

/// Which prefill worker computed a request's prompt, as its receipt said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attribution {
    /// No receipt was asked for, or none came back (a refusal, a transport error).
    Unknown,
    /// The receipt verified against the deployment's key and names this worker.
    Worker(String),
    /// A receipt came back that does not verify (or names no worker): why.
    Unverified(String),
}

/// Like [`complete`], asking for a signed isolation receipt when `receipt_key` is given: the
/// answer and which prefill worker computed the prompt.
pub async fn complete_attributed(
    http: &reqwest::Client,
    r: &Request<'_>,
    receipt_key: Option<&PublicKey>,
) -> Result<(Answer, Attribution), ProbeHttpError> {
    send(http, r, receipt_key).await
}

/// The worker a signed receipt names for its first choice's prefill, once it verifies.
fn attribute(signed: &Value, key: &PublicKey) -> Attribution {
    match key.verify(signed) {
        Ok(receipt) => match receipt["choices"][0]["prefill"]["worker"].as_str() {
            Some(w) if !w.is_empty() => Attribution::Worker(w.to_string()),
            _ => Attribution::Unverified("the receipt names no prefill worker".to_string()),
        },
        Err(e) => Attribution::Unverified(e.to_string()),
    }
}

async fn send(
    http: &reqwest::Client,
    r: &Request<'_>,
    receipt_key: Option<&PublicKey>,
) -> Result<(Answer, Attribution), ProbeHttpError> {
    let started = Instant::now();
    let mut req = http
        .post(format!("{}/v1/completions", r.router))
        .timeout(r.timeout)
        .bearer_auth(r.api_key);
    if receipt_key.is_some() {
        req = req.header("x-pagewarden-receipt", "1");
    }
    let resp = req
        .json(&json!({
            "model": r.model,
            "prompt": r.prompt,
            "max_tokens": r.max_tokens,
            "temperature": 0.0,
            "stream": true,
            "stream_options": {"include_usage": true},
        }))
        .send()
        .await?;
    let status = resp.status().as_u16();
    if status != 200 {
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        let code = body["error"]["code"]
            .as_str()
            .or_else(|| body["error"]["type"].as_str())
            .map(str::to_string);
        return Ok((Answer::Refused { status, code }, Attribution::Unknown));
    }
    let is_sse = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let attributed = |v: &Value| match (receipt_key, v.get("pagewarden_receipt")) {
        (Some(key), Some(signed)) => Some(attribute(signed, key)),
        _ => None,
    };
    if !is_sse {
        let body: Value = resp.json().await?;
        let answer = Answer::Completed {
            text: body["choices"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            prompt_tokens: prompt_tokens_of(&body),
            ttft_ms: started.elapsed().as_millis() as u64,
            cached_tokens: cached_tokens_of(&body),
        };
        return Ok((answer, attributed(&body).unwrap_or(Attribution::Unknown)));
    }
    let mut attribution = Attribution::Unknown;
    let mut text = String::new();
    let mut prompt_tokens = None;
    let mut cached_tokens = None;
    let mut ttft_ms = None;
    let mut buf = String::new();
    let mut stream = resp.bytes_stream();
    'read: while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(nl) = buf.find('\n') {
            let line: String = buf.drain(..=nl).collect();
            let Some(data) = line.trim_end().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim_start();
            if data == "[DONE]" {
                break 'read;
            }
            let Ok(ev) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if let Some(t) = ev["choices"][0]["text"].as_str() {
                if !t.is_empty() && ttft_ms.is_none() {
                    ttft_ms = Some(started.elapsed().as_millis() as u64);
                }
                text.push_str(t);
            }
            if let Some(pt) = prompt_tokens_of(&ev) {
                prompt_tokens = Some(pt);
            }
            if let Some(c) = cached_tokens_of(&ev) {
                cached_tokens = Some(c);
            }
            if let Some(a) = attributed(&ev) {
                attribution = a;
            }
        }
    }
    let answer = Answer::Completed {
        text,
        prompt_tokens,
        ttft_ms: ttft_ms.unwrap_or_else(|| started.elapsed().as_millis() as u64),
        cached_tokens,
    };
    Ok((answer, attribution))
}

fn cached_tokens_of(v: &Value) -> Option<u32> {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
}

fn prompt_tokens_of(v: &Value) -> Option<u32> {
    v["usage"]["prompt_tokens"]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
}
