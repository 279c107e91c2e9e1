//! `pagewarden bench fairness`: what one tenant's flood does to another, and whether any
//! stream waits for another to finish, through the real suite on 127.0.0.1.
//!
//! 1. Tenant B's time to first token, p50 and p90 over `--short-requests` short requests sent
//!    one after another, on an idle suite and again while tenant A keeps `--flood` long
//!    requests in flight (each A client sends its next request as soon as one ends).
//! 2. `--streams` streams of exactly `--stream-tokens` tokens at once (end-of-generation
//!    ignored) against decode's default batch: every stream's time to first token and largest
//!    gap between tokens, and whether a stream's first token came only after another stream
//!    had finished (it must not: sequences take turns, none waits for another's end).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use pagewarden_model::{LoadOptions, Model};

use crate::bench_serve::{make_prompts, on_suite, pct, stream_with, Sample, SuiteRun};

/// Arguments of `pagewarden bench fairness`.
#[derive(Debug, Args)]
pub struct BenchFairArgs {
    /// GGUF model file, or a known model's name (`smollm2`, `gemma3-270m`), fetched when missing.
    #[arg(long, env = "PAGEWARDEN_MODEL", default_value = "smollm2")]
    pub model: PathBuf,
    /// Tenant A's requests kept in flight.
    #[arg(long, default_value_t = 16)]
    pub flood: usize,
    /// Prompt tokens of each of A's requests.
    #[arg(long, default_value_t = 1024)]
    pub flood_prompt_tokens: usize,
    /// Completion tokens of each of A's requests.
    #[arg(long, default_value_t = 64)]
    pub flood_max_tokens: usize,
    /// Tenant B's requests, one after another.
    #[arg(long, default_value_t = 10)]
    pub short_requests: usize,
    /// Prompt tokens of each of B's requests.
    #[arg(long, default_value_t = 32)]
    pub short_prompt_tokens: usize,
    /// Completion tokens of each of B's requests.
    #[arg(long, default_value_t = 8)]
    pub short_max_tokens: usize,
    /// Streams at once in the starvation check.
    #[arg(long, default_value_t = 16)]
    pub streams: usize,
    /// Tokens each of those streams generates.
    #[arg(long, default_value_t = 200)]
    pub stream_tokens: usize,
    /// Seconds to wait for each service's start line and for the router's /health.
    #[arg(long, default_value_t = 120)]
    pub start_timeout_s: u64,
}

/// Runs `pagewarden bench fairness`.
pub fn run(a: BenchFairArgs) -> anyhow::Result<()> {
    // A file, or a known model's name fetched when missing (as `up` resolves it).
    let a = BenchFairArgs {
        model: crate::fetch::resolve(&a.model)?,
        ..a
    };
    if a.flood == 0 || a.short_requests == 0 || a.streams == 0 {
        anyhow::bail!("--flood, --short-requests and --streams must be at least 1");
    }
    let model = Model::load(&a.model, &LoadOptions::default())
        .with_context(|| format!("loading model {}", a.model.display()))?;
    let prompts = Prompts {
        long: make_prompts(&model, a.flood_prompt_tokens, a.flood),
        short: make_prompts(&model, a.short_prompt_tokens, a.short_requests),
        streams: make_prompts(&model, a.short_prompt_tokens, a.streams),
    };
    drop(model);
    let suite = SuiteRun {
        model: &a.model,
        tenants: ["tenant-a", "tenant-b"],
        start_timeout: Duration::from_secs(a.start_timeout_s),
    };
    let (a, prompts) = (&a, &prompts);
    on_suite(suite, |api, keys, _| async move {
        measure(a, &api, &keys, prompts).await
    })
}

struct Prompts {
    long: Vec<Vec<u32>>,
    short: Vec<Vec<u32>>,
    streams: Vec<Vec<u32>>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn measure(
    a: &BenchFairArgs,
    api: &str,
    [key_a, key_b]: &[String; 2],
    p: &Prompts,
) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    stream_with(&http, api, key_b, &p.short[0], 4, false).await?;

    // 1. B alone, then B beside A's flood.
    let alone = short_ttfts(a, &http, api, key_b, p).await?;
    let flood = {
        let http = Arc::new(http.clone());
        let a_done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let clients = (0..a.flood).map(|i| {
            let (http, done, api, key) = (http.clone(), a_done.clone(), api.to_string(), key_a);
            let prompt = p.long[i].clone();
            async move {
                loop {
                    // A refusal of A's (a queue bound) is part of the flood, not the end of it.
                    match stream_with(&http, &api, key, &prompt, a.flood_max_tokens, false).await {
                        Ok(_) => done.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                        Err(e) => {
                            eprintln!("tenant A: {e:#}");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            0
                        }
                    };
                }
                #[allow(unreachable_code)]
                Ok::<(), anyhow::Error>(())
            }
        });
        let flood = futures::future::try_join_all(clients);
        let b = async {
            // Let A's requests take their places first.
            tokio::time::sleep(Duration::from_secs(2)).await;
            short_ttfts(a, &http, api, key_b, p).await
        };
        // B's run ends the flood: dropping A's requests disconnects them (both halves abort).
        let ttfts = tokio::select! {
            r = b => r?,
            r = flood => {
                r?;
                anyhow::bail!("the flood ended by itself")
            }
        };
        eprintln!(
            "tenant A finished {} requests meanwhile",
            a_done.load(std::sync::atomic::Ordering::Relaxed)
        );
        ttfts
    };
    let p90 = |v: &[f64]| pct(v, 0.9);
    println!(
        "tenant B TTFT ({} requests of {} prompt tokens, {} completion tokens, one at a time):",
        a.short_requests, a.short_prompt_tokens, a.short_max_tokens
    );
    println!(
        "  alone:                        p50 {:8.1} ms  p90 {:8.1} ms",
        pct(&alone, 0.5),
        p90(&alone)
    );
    println!(
        "  beside A's {:2} x {:5}-token:  p50 {:8.1} ms  p90 {:8.1} ms  ({:.2}x alone at p90)",
        a.flood,
        a.flood_prompt_tokens,
        pct(&flood, 0.5),
        p90(&flood),
        p90(&flood) / p90(&alone)
    );

    // 2. Streams at once: none waits for another to finish.
    let samples = futures::future::try_join_all(
        p.streams
            .iter()
            .map(|prompt| stream_with(&http, api, key_b, prompt, a.stream_tokens, true)),
    )
    .await?;
    print_streams(a, &samples);
    Ok(())
}

/// B's short requests one after another; their TTFTs in ms, sorted.
async fn short_ttfts(
    a: &BenchFairArgs,
    http: &reqwest::Client,
    api: &str,
    key: &str,
    p: &Prompts,
) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::new();
    for prompt in &p.short {
        let s = stream_with(http, api, key, prompt, a.short_max_tokens, false).await?;
        out.push(ms(s.ttft.context("a short request streamed no token")?));
    }
    out.sort_by(f64::total_cmp);
    Ok(out)
}

fn print_streams(a: &BenchFairArgs, samples: &[Sample]) {
    // Every stream started at once: its first token and its end, from that start.
    let spans: Vec<(f64, f64)> = samples
        .iter()
        .map(|s| {
            let first = s.ttft.map_or(f64::NAN, ms);
            (first, first + s.gaps.iter().copied().map(ms).sum::<f64>())
        })
        .collect();
    println!(
        "{} streams x {} tokens at once (decode's default batch):",
        a.streams, a.stream_tokens
    );
    println!(
        "  stream  tokens  TTFT ms  largest gap ms  mean gap ms  first token after another ended"
    );
    let mut waited = 0;
    for (i, (s, &(first, _))) in samples.iter().zip(&spans).enumerate() {
        let gaps: Vec<f64> = s.gaps.iter().copied().map(ms).collect();
        let largest = gaps.iter().copied().fold(0.0, f64::max);
        let mean = gaps.iter().sum::<f64>() / gaps.len().max(1) as f64;
        let other_end = spans
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, &(_, end))| end)
            .fold(f64::INFINITY, f64::min);
        let after = first > other_end;
        waited += usize::from(after);
        println!(
            "  {i:6}  {:6}  {first:7.1}  {largest:14.1}  {mean:11.1}  {}",
            s.tokens,
            if after { "YES" } else { "no" }
        );
    }
    println!("  streams that waited for another to finish: {waited}");
}
