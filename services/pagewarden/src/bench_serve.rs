//! `pagewarden bench serve`: TTFT, inter-token latency and completion tokens/s for N
//! concurrent streams through the disaggregated suite (router → prefill → decode, real
//! binaries on 127.0.0.1), beside the single-process `Engine` running the same workload in
//! the same run, with the ratio disaggregated / single-process.
//!
//! Both sides get the same token-id prompts (distinct per request), greedy decoding and the
//! same `max_tokens`. A "token arrival" is one SSE chunk with non-empty text (suite) or one
//! `on_text` callback (engine); TTFT is request start → first arrival, inter-token latency
//! the gaps between arrivals, tokens/s the completion tokens (usage / engine output) of all
//! requests of a level over that level's wall time.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use futures::StreamExt;
use pagewarden_kvcache::{KvPool, PoolConfig, DEFAULT_PAGE_SIZE};
use pagewarden_model::{Engine, LoadOptions, Model, SamplingParams};

use crate::children::{self, Group};
use crate::devconfig::Plan;
use crate::devsecrets::{KEY_PREFIX, TENANTS_HEADER};
use pagewarden_common::secret::{new_secret, SecretHash};
use pagewarden_common::tenants::TenantsFile;

const SERVICES: [&str; 3] = [
    "pagewarden-decode",
    "pagewarden-prefill",
    "pagewarden-router",
];

pub(crate) const TEXT: &str =
    "Disaggregated serving splits the prefill and decode phases of inference so \
that each runs on hardware sized for it. The key-value cache computed during prefill moves to \
the decode worker page by page, and every page carries a generation tag that attention checks. ";

/// Arguments of `pagewarden bench serve`.
#[derive(Debug, Args)]
pub struct BenchServeArgs {
    /// GGUF model file, or a known model's name (`smollm2`, `gemma3-270m`), fetched when missing.
    #[arg(long, env = "PAGEWARDEN_MODEL", default_value = "smollm2")]
    pub model: PathBuf,
    /// Concurrent stream counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    pub streams: Vec<usize>,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Most completion tokens per request.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Requests per stream count (default: twice the stream count).
    #[arg(long)]
    pub requests: Option<usize>,
    /// Kernel threads of the in-process engine (0 = every CPU, like the workers).
    #[arg(long, default_value_t = 0)]
    pub engine_threads: usize,
    /// Seconds to wait for each service's start line and for the router's /health.
    #[arg(long, default_value_t = 120)]
    pub start_timeout_s: u64,
}

/// What one request saw.
#[derive(Clone, Debug, Default)]
pub(crate) struct Sample {
    pub(crate) ttft: Option<Duration>,
    pub(crate) gaps: Vec<Duration>,
    pub(crate) tokens: usize,
    /// `usage.prompt_tokens_details.cached_tokens`: prompt tokens served from the prefix cache.
    pub(crate) cached_tokens: u64,
}

/// Summary of one stream count on one side.
#[derive(Clone, Copy, Debug)]
struct Level {
    ttft_mean: f64,
    ttft_p50: f64,
    ttft_p95: f64,
    itl_mean: f64,
    itl_p50: f64,
    itl_p95: f64,
    tok_s: f64,
}

pub(crate) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

fn summarize(samples: &[Sample], wall: Duration) -> Level {
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let mut ttft: Vec<f64> = samples
        .iter()
        .filter_map(|s| s.ttft.as_ref().map(ms))
        .collect();
    let mut itl: Vec<f64> = samples.iter().flat_map(|s| s.gaps.iter().map(ms)).collect();
    ttft.sort_by(f64::total_cmp);
    itl.sort_by(f64::total_cmp);
    let tokens: usize = samples.iter().map(|s| s.tokens).sum();
    Level {
        ttft_mean: mean(&ttft),
        ttft_p50: pct(&ttft, 0.5),
        ttft_p95: pct(&ttft, 0.95),
        itl_mean: mean(&itl),
        itl_p50: pct(&itl, 0.5),
        itl_p95: pct(&itl, 0.95),
        tok_s: tokens as f64 / wall.as_secs_f64(),
    }
}

/// Runs `pagewarden bench serve`.
pub fn run(a: BenchServeArgs) -> anyhow::Result<()> {
    // A file, or a known model's name fetched when missing (as `up` resolves it).
    let a = BenchServeArgs {
        model: crate::fetch::resolve(&a.model)?,
        ..a
    };
    if a.streams.contains(&0) {
        bail!("--streams: every stream count must be at least 1");
    }
    let model = Arc::new(
        Model::load(
            &a.model,
            &LoadOptions {
                threads: a.engine_threads,
                ..LoadOptions::default()
            },
        )
        .with_context(|| format!("loading model {}", a.model.display()))?,
    );
    let max_n = a.streams.iter().copied().max().unwrap_or(1);
    let most_requests = a.requests.unwrap_or(2 * max_n).max(1);
    let prompts = make_prompts(&model, a.prompt_tokens, most_requests.max(2 * max_n));
    println!(
        "model {}  prompt {} tokens  max_tokens {}  greedy",
        a.model.display(),
        a.prompt_tokens,
        a.max_tokens
    );

    let suite = SuiteRun {
        model: &a.model,
        tenants: ["bench"],
        start_timeout: Duration::from_secs(a.start_timeout_s),
    };
    let disagg = {
        let (a, prompts) = (&a, &prompts);
        on_suite(suite, |api, [key], _| async move {
            suite_levels(a, &api, &key, prompts).await
        })?
    };

    let mut single = Vec::new();
    for &n in &a.streams {
        let requests = a.requests.unwrap_or(2 * n).max(1);
        let level = engine_level(&model, &prompts[..requests], n, a.max_tokens)?;
        single.push(level);
    }
    print_table(&a.streams, &disagg, &single);
    Ok(())
}

/// The service binaries' dir: next to this executable.
pub(crate) fn service_binaries() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the pagewarden executable")?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent dir", exe.display()))?
        .to_path_buf();
    let gone: Vec<&str> = SERVICES
        .iter()
        .copied()
        .filter(|s| !dir.join(s).is_file())
        .collect();
    if !gone.is_empty() {
        bail!(
            "{} not found in {}: build them with `cargo build --release --workspace --bins` \
             (from the checkout) and run pagewarden from the same target dir",
            gone.join(", "),
            dir.display()
        );
    }
    Ok(dir)
}

/// `count` distinct prompts of exactly `len` token ids.
pub(crate) fn make_prompts(model: &Model, len: usize, count: usize) -> Vec<Vec<u32>> {
    let base = model.tokenizer().encode(TEXT, false);
    (0..count)
        .map(|i| {
            let mut p = model.tokenizer().encode(&format!("Request {i}. "), false);
            while p.len() < len {
                p.extend_from_slice(&base);
            }
            p.truncate(len.max(1));
            p
        })
        .collect()
}

async fn suite_levels(
    a: &BenchServeArgs,
    api: &str,
    key: &str,
    prompts: &[Vec<u32>],
) -> anyhow::Result<Vec<Level>> {
    let http = reqwest::Client::builder().build()?;
    // Warm-up: one short request so first-touch costs are not in the first level.
    stream_one(&http, api, key, &prompts[0], 4).await?;
    let mut out = Vec::new();
    for &n in &a.streams {
        let requests = a.requests.unwrap_or(2 * n).max(1);
        eprintln!("suite: {n} streams, {requests} requests");
        let next = AtomicUsize::new(0);
        let samples = Mutex::new(Vec::new());
        let (next, samples_ref, http) = (&next, &samples, &http);
        let t = Instant::now();
        let clients = (0..n).map(move |_| async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    return Ok::<(), anyhow::Error>(());
                }
                let s = stream_one(http, api, key, &prompts[i], a.max_tokens).await?;
                samples_ref
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(s);
            }
        });
        for r in futures::future::join_all(clients).await {
            r?;
        }
        let wall = t.elapsed();
        out.push(summarize(
            &samples.into_inner().unwrap_or_else(|e| e.into_inner()),
            wall,
        ));
    }
    Ok(out)
}

/// A clear key for each tenant in `names`, their hashes in `dir/tenants.toml`.
pub(crate) fn tenant_keys<const N: usize>(
    dir: &Path,
    names: [&str; N],
) -> anyhow::Result<[String; N]> {
    let mut tenants = TenantsFile::default();
    let keys = names.map(|name| {
        let key = new_secret(KEY_PREFIX, &mut rand::rng());
        tenants.entry_mut(name).key_sha256 = vec![SecretHash::of(&key)];
        key
    });
    tenants.save(&dir.join("tenants.toml"), TENANTS_HEADER)?;
    Ok(keys)
}

/// The suite's plan in `dir` (its tenants file written by [`tenant_keys`]), no auditor.
pub(crate) fn bench_plan(bin_dir: &Path, dir: &Path, model: &Path) -> anyhow::Result<Plan> {
    Ok(Plan {
        bin_dir: bin_dir.to_path_buf(),
        dir: dir.to_path_buf(),
        model: model.to_path_buf(),
        tenants: dir.join("tenants.toml"),
        auditor_config: dir.join("auditor.toml"),
        router_addr: "127.0.0.1:0".parse()?,
        auditor_addr: "127.0.0.1:0".parse()?,
        probe_interval: Duration::ZERO,
        grant_ttl: Duration::from_secs(300),
        pool_tokens: None,
        context_length: None,
        flash_attention: false,
        auditor_grpc: None,
    })
}

/// A bench's suite: the service binaries next to this executable, one tenant per name in
/// `tenants` (its clear key), and the runtime they run under. [`on_suite`] starts it.
pub(crate) struct SuiteRun<'a, const N: usize> {
    /// The model every service loads.
    pub model: &'a Path,
    /// The tenants' names.
    pub tenants: [&'a str; N],
    /// How long each service may take to start.
    pub start_timeout: Duration,
}

/// Starts decode, prefill and the router on a current-thread runtime (children are spawned
/// from its one thread, which PR_SET_PDEATHSIG ties their life to), runs `body` with the
/// router's base URL, the tenants' keys and a scratch directory, and stops the suite whatever
/// `body` returned.
pub(crate) fn on_suite<const N: usize, F, Fut, T>(
    run: SuiteRun<'_, N>,
    body: F,
) -> anyhow::Result<T>
where
    F: FnOnce(String, [String; N], PathBuf) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let bin_dir = service_binaries()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let dir = tempfile::tempdir().context("creating a temp dir")?;
        let keys = tenant_keys(dir.path(), run.tenants)?;
        let plan = bench_plan(&bin_dir, dir.path(), run.model)?;
        let mut group = Group::default();
        let res = async {
            let api = start_suite(&plan, &mut group, run.start_timeout).await?;
            body(api, keys, dir.path().to_path_buf()).await
        }
        .await;
        for (name, status) in group.stop_all(|_| Duration::from_secs(10)).await {
            if let Some(s) = status.filter(|s| !s.success() && s.code().is_some()) {
                eprintln!("{name} stopped with {s}");
            }
        }
        res
    })
}

/// Starts decode, prefill and the router of `plan` into `group`; the router's base URL once
/// it is healthy.
pub(crate) async fn start_suite(
    plan: &Plan,
    group: &mut Group,
    timeout: Duration,
) -> anyhow::Result<String> {
    let logs = plan.dir.join("logs");
    for role in ["decode", "prefill"] {
        eprintln!("starting {role} (loading the model)");
        group.push(children::start(&plan.worker(role), &logs, timeout).await?);
    }
    let router = plan.router(
        &addr(group, "decode", "grpc")?,
        &addr(group, "prefill", "grpc")?,
    );
    group.push(children::start(&router, &logs, timeout).await?);
    let api = format!("http://{}", addr(group, "router", "http")?);
    wait_healthy(&api, timeout).await?;
    Ok(api)
}

fn addr(group: &Group, name: &str, k: &str) -> anyhow::Result<String> {
    group
        .get(name)
        .ok_or_else(|| anyhow!("{name} is not running"))?
        .addr(k)
        .map(str::to_string)
}

async fn wait_healthy(api: &str, timeout: Duration) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let deadline = Instant::now() + timeout;
    loop {
        let last = match http.get(format!("{api}/health")).send().await {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) => format!("{}", r.status()),
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            bail!(
                "router did not become healthy in {}s; last answer: {last}",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One streaming greedy completion; returns its arrivals and usage.completion_tokens.
async fn stream_one(
    http: &reqwest::Client,
    api: &str,
    key: &str,
    prompt: &[u32],
    max_tokens: usize,
) -> anyhow::Result<Sample> {
    stream_with(http, api, key, prompt, max_tokens, false).await
}

/// One streaming greedy completion (`ignore_eos`: exactly `max_tokens` tokens); returns its
/// arrivals and usage.completion_tokens.
pub(crate) async fn stream_with(
    http: &reqwest::Client,
    api: &str,
    key: &str,
    prompt: &[u32],
    max_tokens: usize,
    ignore_eos: bool,
) -> anyhow::Result<Sample> {
    let body = serde_json::json!({
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": ignore_eos,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    stream_body(http, api, key, &body).await
}

/// One streamed `/v1/completions` request of `body` (which must ask for `stream`); returns
/// its arrivals and usage.completion_tokens.
pub(crate) async fn stream_body(
    http: &reqwest::Client,
    api: &str,
    key: &str,
    body: &serde_json::Value,
) -> anyhow::Result<Sample> {
    let start = Instant::now();
    let resp = http
        .post(format!("{api}/v1/completions"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .context("POST /v1/completions")?;
    if !resp.status().is_success() {
        let status = resp.status();
        bail!("/v1/completions: {status} {}", resp.text().await?);
    }
    let mut s = Sample::default();
    let mut last: Option<Instant> = None;
    for_each_event(resp, |v| {
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            s.tokens = n as usize;
        }
        if let Some(n) = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() {
            s.cached_tokens = n;
        }
        let text = v["choices"][0]["text"].as_str().unwrap_or_default();
        if !text.is_empty() {
            let now = Instant::now();
            match last {
                None => s.ttft = Some(now - start),
                Some(prev) => s.gaps.push(now - prev),
            }
            last = Some(now);
        }
    })
    .await?;
    Ok(s)
}

/// Calls `on_event` with each JSON event of an OpenAI server-sent-event stream, up to its
/// `[DONE]`; an error event, or a stream that ends without `[DONE]`, is an error.
pub(crate) async fn for_each_event(
    resp: reqwest::Response,
    mut on_event: impl FnMut(&serde_json::Value),
) -> anyhow::Result<()> {
    let mut buf = Vec::<u8>::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk.context("reading the SSE stream")?);
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                return Ok(());
            }
            let v: serde_json::Value =
                serde_json::from_str(data).with_context(|| format!("SSE event {data}"))?;
            if let Some(e) = v.get("error") {
                bail!("mid-stream error: {e}");
            }
            on_event(&v);
        }
    }
    bail!("the SSE stream ended without [DONE]")
}

/// The same workload on the in-process engine: `n` OS threads, each taking the next request
/// and running `Engine::generate_streaming` (one sequence per call, calls run concurrently).
fn engine_level(
    model: &Arc<Model>,
    prompts: &[Vec<u32>],
    n: usize,
    max_tokens: usize,
) -> anyhow::Result<Level> {
    eprintln!("engine: {n} threads, {} requests", prompts.len());
    let layout = model.kv_layout(DEFAULT_PAGE_SIZE);
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + max_tokens + 1;
    let pool = KvPool::new(PoolConfig::with_pages(
        layout,
        layout.pages_for(longest) * (n + 1),
    ));
    let engine = Engine::new(model.clone(), pool);
    // Warm-up, like the suite's.
    engine.generate(&prompts[0], &SamplingParams::greedy(4))?;
    let next = AtomicUsize::new(0);
    let samples = Mutex::new(Vec::new());
    let params = SamplingParams::greedy(max_tokens);
    let (next_ref, samples_ref, engine, params) = (&next, &samples, &engine, &params);
    let t = Instant::now();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..n)
            .map(move |_| {
                scope.spawn(move || -> anyhow::Result<()> {
                    loop {
                        let i = next_ref.fetch_add(1, Ordering::Relaxed);
                        let Some(prompt) = prompts.get(i) else {
                            return Ok(());
                        };
                        let start = Instant::now();
                        let mut s = Sample::default();
                        let mut last: Option<Instant> = None;
                        let out = engine.generate_streaming(prompt, params, |_| {
                            let now = Instant::now();
                            match last {
                                None => s.ttft = Some(now - start),
                                Some(prev) => s.gaps.push(now - prev),
                            }
                            last = Some(now);
                        })?;
                        s.tokens = out.tokens.len();
                        samples_ref
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(s);
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().map_err(|_| anyhow!("engine thread panicked"))?)
            .collect::<anyhow::Result<Vec<()>>>()
    })?;
    let wall = t.elapsed();
    Ok(summarize(
        &samples.into_inner().unwrap_or_else(|e| e.into_inner()),
        wall,
    ))
}

fn print_table(streams: &[usize], disagg: &[Level], single: &[Level]) {
    println!(
        "{:>7}  {:<16} {:>12} {:>12} {:>12}",
        "streams", "metric", "disagg", "single", "disagg/single"
    );
    for ((n, d), s) in streams.iter().zip(disagg).zip(single) {
        let rows: [(&str, f64, f64); 7] = [
            ("TTFT mean ms", d.ttft_mean, s.ttft_mean),
            ("TTFT p50 ms", d.ttft_p50, s.ttft_p50),
            ("TTFT p95 ms", d.ttft_p95, s.ttft_p95),
            ("ITL mean ms", d.itl_mean, s.itl_mean),
            ("ITL p50 ms", d.itl_p50, s.itl_p50),
            ("ITL p95 ms", d.itl_p95, s.itl_p95),
            ("tokens/s", d.tok_s, s.tok_s),
        ];
        for (name, dv, sv) in rows {
            println!(
                "{:>7}  {:<16} {:>12.2} {:>12.2} {:>12.2}x",
                n,
                name,
                dv,
                sv,
                dv / sv
            );
        }
    }
    println!(
        "(suite: N concurrent streaming HTTP clients through router → prefill → decode; single: \
         N threads each calling Engine::generate_streaming, one sequence per call; ITL = gaps \
         between text chunks; tokens/s = completion tokens of all requests / wall time)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_summary() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(pct(&v, 0.5), 3.0);
        assert_eq!(pct(&v, 0.95), 5.0);
        let s = Sample {
            ttft: Some(Duration::from_millis(10)),
            gaps: vec![Duration::from_millis(2), Duration::from_millis(4)],
            tokens: 3,
            cached_tokens: 0,
        };
        let l = summarize(&[s], Duration::from_secs(1));
        assert!((l.ttft_mean - 10.0).abs() < 1e-9);
        assert!((l.itl_mean - 3.0).abs() < 1e-9);
        assert!((l.tok_s - 3.0).abs() < 1e-9);
    }
}
