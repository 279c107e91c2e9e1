//! Test harness: fake workers, the tiny test model in a temp file, and a router served in-process
//! on 127.0.0.1:0.
#![allow(dead_code)]

pub mod fakes;

use std::sync::Arc;
use std::time::Duration;

use fakes::{start_decode, start_prefill, Fake, FakeOpts};
use pagewarden_common::secret::SecretHash;
use pagewarden_common::tenants::{Rate, TenantEntry};
use pagewarden_router::config::{DEFAULT_MAX_BODY_BYTES, DEFAULT_RECOMPUTE_RATE};
use pagewarden_router::discovery::Resolve;
use pagewarden_router::dispatch::DispatchConfig;
use pagewarden_router::frontend::Frontend;
use pagewarden_router::sample::SampleSink;
use pagewarden_router::tenants::Tenants;
use pagewarden_router::workers::{Links, WorkerPool};
use pagewarden_router::{serve, AppState, NoSampling, Settings};
use serde_json::Value;

pub const KEY: &str = "sk-alpha-1";
pub const OTHER_KEY: &str = "sk-beta-1";
pub const MODEL: &str = "tiny";

pub struct Opts {
    pub decode: Vec<FakeOpts>,
    pub prefill: Vec<FakeOpts>,
    /// Extra decode URLs that point nowhere.
    pub dead_decode: Vec<String>,
    /// When set, decode is configured as `dns://decode.test:7201` only, resolved by this
    /// (the fakes in `decode` are started, but found only if it answers their addresses).
    pub decode_resolver: Option<Arc<dyn Resolve>>,
    pub max_body_bytes: usize,
    pub max_concurrency: usize,
    /// The router's default per-tenant limit (`--tenant-max-concurrency`).
    pub tenant_max_concurrency: Option<usize>,
    /// Tenant alpha's own `max_concurrent`.
    pub alpha_max_concurrent: Option<u32>,
    /// Tenant alpha's `tokens_per_minute`.
    pub alpha_tokens_per_minute: Option<u64>,
    /// The router's `--request-timeout` (a safety net here: a broken test fails, not hangs).
    pub request_timeout: Option<Duration>,
    /// The router's `--recompute-rate`.
    pub recompute_rate: Rate,
    /// The auditor's hook (none: `NoSampling`).
    pub sink: Option<Arc<dyn SampleSink>>,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            decode: vec![FakeOpts::default()],
            prefill: vec![FakeOpts::default()],
            dead_decode: vec![],
            decode_resolver: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_concurrency: 64,
            tenant_max_concurrency: None,
            alpha_max_concurrent: None,
            alpha_tokens_per_minute: None,
            request_timeout: Some(Duration::from_secs(20)),
            recompute_rate: DEFAULT_RECOMPUTE_RATE,
            sink: None,
        }
    }
}

pub struct Harness {
    pub base: String,
    pub decode: Vec<Fake>,
    pub prefill: Vec<Fake>,
    pub state: AppState,
    pub client: reqwest::Client,
    _dir: tempfile::TempDir,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

/// The tiny model's text side, loaded from a temp file as the router binary would.
pub fn tiny_frontend(dir: &std::path::Path) -> Frontend {
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, pagewarden_model::tiny_llama_gguf(7)).unwrap();
    Frontend::load(&path, Some(MODEL.into())).expect("tiny model loads")
}

impl Harness {
    pub async fn start(opts: Opts) -> Harness {
        let mut decode = Vec::new();
        for o in opts.decode {
            decode.push(start_decode(o).await);
        }
        let mut prefill = Vec::new();
        for o in opts.prefill {
            prefill.push(start_prefill(o).await);
        }
        let dir = tempfile::tempdir().unwrap();
        let frontend = tiny_frontend(dir.path());
        let tenants = Tenants::new(&[
            TenantEntry {
                name: "alpha".into(),
                key_sha256: vec![SecretHash::of(KEY)],
                max_concurrent: opts.alpha_max_concurrent,
                weight: Some(2),
                tokens_per_minute: opts.alpha_tokens_per_minute,
                shared_namespace: None,
                receipts: false,
                recompute_rate: None,
            },
            TenantEntry {
                name: "beta".into(),
                key_sha256: vec![SecretHash::of(OTHER_KEY)],
                max_concurrent: None,
                weight: None,
                tokens_per_minute: None,
                shared_namespace: None,
                receipts: false,
                recompute_rate: None,
            },
        ])
        .unwrap();
        let mut decode_urls: Vec<String> = decode.iter().map(Fake::url).collect();
        decode_urls.extend(opts.dead_decode);
        let prefill_urls: Vec<String> = prefill.iter().map(Fake::url).collect();
        if opts.decode_resolver.is_some() {
            decode_urls = vec!["dns://decode.test:7201".into()];
        }
        let mut pool = WorkerPool::new(
            &decode_urls,
            &prefill_urls,
            Links {
                connect_timeout: Duration::from_millis(300),
                keepalive: Duration::from_secs(10),
            },
            Duration::from_millis(300),
        )
        .unwrap();
        if let Some(resolver) = opts.decode_resolver {
            pool = pool.with_resolver(resolver);
        }
        let settings = Settings {
            max_body_bytes: opts.max_body_bytes,
            max_concurrency: opts.max_concurrency,
            tenant_max_concurrency: opts.tenant_max_concurrency,
            dispatch: DispatchConfig {
                request_timeout: opts.request_timeout,
                abort_timeout: Duration::from_secs(1),
                decode_unresponsive: Duration::from_secs(20),
            },
            info_interval: Duration::from_millis(100),
            recompute_rate: opts.recompute_rate,
        };
        let sink = opts.sink.clone().unwrap_or_else(|| Arc::new(NoSampling));
        let state = AppState::new(settings, tenants, frontend, pool, sink);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let served = state.clone();
        tokio::spawn(async move {
            serve(listener, served, async {
                let _ = rx.await;
            })
            .await
            .unwrap()
        });
        let h = Harness {
            base: format!("http://{addr}"),
            decode,
            prefill,
            state,
            client: reqwest::Client::new(),
            _dir: dir,
            _shutdown: tx,
        };
        h.wait_ready().await;
        h
    }

    /// Waits until the server answers (the first Info poll happens before it accepts).
    async fn wait_ready(&self) {
        pagewarden_testkit::eventually(Duration::from_secs(2), "the router to answer", || async {
            self.client.get(self.url("/health")).send().await.is_ok()
        })
        .await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .bearer_auth(KEY)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn post_raw(
        &self,
        path: &str,
        body: Vec<u8>,
        key: Option<&str>,
    ) -> reqwest::Response {
        let mut req = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        req.send().await.unwrap()
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap()
    }

    pub async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub fn tokens(&self, text: &str) -> Vec<u32> {
        self.state.frontend.tokenizer().encode(text, true)
    }

    pub fn total_reserves(&self) -> usize {
        self.decode.iter().map(Fake::reserves).sum()
    }

    pub fn total_prefills(&self) -> usize {
        self.prefill.iter().map(Fake::prefills).sum()
    }
}

/// Asserts an OpenAI error body with `status` and returns the `error` object.
pub async fn expect_error(resp: reqwest::Response, status: u16) -> Value {
    let got = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    assert_eq!(got, status, "unexpected status, body: {text}");
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {text}"));
    let err = v["error"].clone();
    assert!(err["message"].is_string(), "no error.message in {text}");
    assert!(err["type"].is_string(), "no error.type in {text}");
    assert!(err.get("param").is_some(), "no error.param in {text}");
    assert!(err.get("code").is_some(), "no error.code in {text}");
    err
}

impl Harness {
    /// The sampling parameters of every `Reserve` the decode fakes received, in order.
    pub fn reserved_sampling(&self) -> Vec<pagewarden_proto::v1::SamplingParams> {
        self.decode
            .iter()
            .flat_map(|d| d.calls.lock().reserve.clone())
            .map(|r| r.sampling.expect("Reserve carries sampling"))
            .collect()
    }

    /// A streamed response's chunks, parsed (`[DONE]`, which must end it, left out), and the
    /// raw body for messages.
    pub async fn stream_chunks(&self, path: &str, body: &Value) -> (Vec<Value>, String) {
        let text = self.post(path, body).await.text().await.unwrap();
        let data = sse_data(&text);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{text}");
        let chunks = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        (chunks, text)
    }
}

/// Parses an SSE body into its `data:` payloads.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim_start().to_string())
        .collect()
}
