//! `pagewarden bench prefix`: what the prefix cache gives a tenant, and whether another tenant
//! can tell it is there, through the real suite on 127.0.0.1.
//!
//! Each round uses prefixes nobody sent before, so every request below is its tenant's first
//! sight of its prefix unless the text says otherwise:
//! 1. tenant A sends prefix P (cold; this fills A's cache),
//! 2. tenant A sends P again with another suffix: **warm**, served from A's cache,
//! 3. tenant B sends P: **B on A's prefix**, the probe of an attacker who guessed A's prompt,
//! 4. tenant B sends a fresh prefix Q of the same length: **cold**.
//!
//! Reported: the time to first token of each kind, the same-tenant speed-up (cold / warm, by
//! median), and a two-sample Kolmogorov–Smirnov test of "B on A's prefix" against "cold": a
//! p-value well above 0.01 means B's timings do not tell whether A sent the prompt.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use pagewarden_auditor::ks::ks_two_sample;
use pagewarden_model::{LoadOptions, Model};

use crate::bench_serve::{on_suite, pct, stream_with, SuiteRun, TEXT};

/// Arguments of `pagewarden bench prefix`.
#[derive(Debug, Args)]
pub struct BenchPrefixArgs {
    /// GGUF model file, or a known model's name (`smollm2`, `gemma3-270m`), fetched when missing.
    #[arg(long, env = "PAGEWARDEN_MODEL", default_value = "smollm2")]
    pub model: PathBuf,
    /// Tokens of each shared prefix.
    #[arg(long, default_value_t = 2000)]
    pub prefix_tokens: usize,
    /// Rounds (each gives one sample of every kind).
    #[arg(long, default_value_t = 30)]
    pub samples: usize,
    /// Completion tokens of each request (the time to the first one is what is measured).
    #[arg(long, default_value_t = 2)]
    pub max_tokens: usize,
    /// Seconds to wait for each service's start line and for the router's /health.
    #[arg(long, default_value_t = 120)]
    pub start_timeout_s: u64,
}

/// Runs `pagewarden bench prefix`.
pub fn run(a: BenchPrefixArgs) -> anyhow::Result<()> {
    // A file, or a known model's name fetched when missing (as `up` resolves it).
    let a = BenchPrefixArgs {
        model: crate::fetch::resolve(&a.model)?,
        ..a
    };
    if a.samples < 2 || a.prefix_tokens < 32 {
        anyhow::bail!("--samples must be at least 2 and --prefix-tokens at least 32");
    }
    let model = Model::load(&a.model, &LoadOptions::default())
        .with_context(|| format!("loading model {}", a.model.display()))?;
    let tok = model.tokenizer();
    let prefix = |label: &str| {
        let mut p = tok.encode(&format!("{label}. "), false);
        let text = tok.encode(TEXT, false);
        while p.len() < a.prefix_tokens {
            p.extend_from_slice(&text);
        }
        p.truncate(a.prefix_tokens);
        p
    };
    let rounds: Vec<Round> = (0..a.samples)
        .map(|i| Round {
            shared: prefix(&format!("Document {i} of tenant A")),
            fresh: prefix(&format!("Document {i} of tenant B")),
            question: tok.encode(" Summarize it in one line.", false),
            other_question: tok.encode(" Name its topic.", false),
        })
        .collect();
    drop(model);
    let suite = SuiteRun {
        model: &a.model,
        tenants: ["tenant-a", "tenant-b"],
        start_timeout: Duration::from_secs(a.start_timeout_s),
    };
    let (a, rounds) = (&a, &rounds);
    on_suite(suite, |api, keys, _| async move {
        measure(a, &api, &keys, rounds).await
    })
}

/// One round's prompts.
struct Round {
    /// A's prefix, which B also sends.
    shared: Vec<u32>,
    /// B's own fresh prefix.
    fresh: Vec<u32>,
    question: Vec<u32>,
    other_question: Vec<u32>,
}

/// Time to first token in ms and the prompt tokens served from the cache.
type Timed = (f64, u64);

async fn measure(
    a: &BenchPrefixArgs,
    api: &str,
    [key_a, key_b]: &[String; 2],
    rounds: &[Round],
) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let send = |key: &str, prefix: &[u32], suffix: &[u32]| {
        let prompt: Vec<u32> = prefix.iter().chain(suffix).copied().collect();
        let (http, key) = (http.clone(), key.to_string());
        async move {
            let s = stream_with(&http, api, &key, &prompt, a.max_tokens, false).await?;
            let ttft = s.ttft.context("no token streamed")?;
            anyhow::Ok((ttft.as_secs_f64() * 1e3, s.cached_tokens))
        }
    };
    let (mut warm, mut probe, mut cold) = (Vec::new(), Vec::new(), Vec::new());
    for (i, r) in rounds.iter().enumerate() {
        send(key_a, &r.shared, &r.question).await?;
        let w: Timed = send(key_a, &r.shared, &r.other_question).await?;
        let p: Timed = send(key_b, &r.shared, &r.question).await?;
        let c: Timed = send(key_b, &r.fresh, &r.question).await?;
        eprintln!(
            "round {i:2}: warm {:7.1} ms ({} cached)  B on A's {:7.1} ms ({} cached)  cold {:7.1} ms ({} cached)",
            w.0, w.1, p.0, p.1, c.0, c.1
        );
        warm.push(w);
        probe.push(p);
        cold.push(c);
    }
    let ms = |v: &[Timed]| {
        let mut t: Vec<f64> = v.iter().map(|x| x.0).collect();
        t.sort_by(f64::total_cmp);
        t
    };
    let (warm_ms, probe_ms, cold_ms) = (ms(&warm), ms(&probe), ms(&cold));
    let hits = |v: &[Timed]| v.iter().filter(|x| x.1 > 0).count();
    let (d, p) = ks_two_sample(&probe_ms, &cold_ms);
    println!(
        "prefix cache, {} rounds of a {}-token prefix (TTFT in ms):",
        a.samples, a.prefix_tokens
    );
    println!("  kind              p10      p50      p90   requests with a cache hit");
    for (name, v, n) in [
        ("A warm (repeat)", &warm_ms, hits(&warm)),
        ("B on A's prefix", &probe_ms, hits(&probe)),
        ("cold", &cold_ms, hits(&cold)),
    ] {
        println!(
            "  {name:16} {:8.1} {:8.1} {:8.1}   {n}/{}",
            pct(v, 0.1),
            pct(v, 0.5),
            pct(v, 0.9),
            v.len()
        );
    }
    println!(
        "  same-tenant speed-up (cold p50 / warm p50): {:.2}x",
        pct(&cold_ms, 0.5) / pct(&warm_ms, 0.5)
    );
    println!("  B on A's prefix vs cold: two-sample Kolmogorov-Smirnov D = {d:.3}, p = {p:.3}");
    Ok(())
}
