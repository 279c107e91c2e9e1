//! `pagewarden chaos --router URL --keys FILE [--requests N] [--seed S]`: a bounded abort
//! storm against a staging deployment. Every tenant of the clear keys file (`[[keys]] tenant,
//! key`, as `pagewarden up` keeps in `.pw/keys.toml`) sends prompts with its own fresh marker at the start and
//! the end; a seeded share of the streams is dropped mid-SSE. Every byte of every answer is
//! scanned for the other tenants' markers. Prints a summary; exits non-zero on any leak.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use futures::StreamExt;
use pagewarden_common::tenants::ClientKeys;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `pagewarden chaos` flags.
#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    /// Router base URL (staging only: this command aborts requests on purpose).
    #[arg(long)]
    pub router: String,
    /// A clear keys file (`[[keys]] tenant = "..", key = ".."`, like `.pw/keys.toml`); the
    /// first key of every tenant is used.
    #[arg(long)]
    pub keys: PathBuf,
    /// Requests in all.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Seed of every random choice (tenant, prompt length, abort point).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Share of streams dropped mid-SSE.
    #[arg(long, default_value_t = 0.4)]
    pub abort_share: f64,
    /// Per-request deadline (seconds); a request still open then counts as hung.
    #[arg(long, default_value_t = 60)]
    pub deadline_s: u64,
}

/// One tenant as the storm sees it.
#[derive(Clone, Debug)]
struct Tenant {
    name: String,
    key: String,
    marker: String,
}

/// How one request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Ok,
    Rejected,
    Aborted,
    Failed,
    Hung,
}

/// Counts of one storm.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Requests sent.
    pub requests: usize,
    /// Streams read to the end with status 200.
    pub ok: usize,
    /// Non-2xx answers (4xx, 429, 503).
    pub rejected: usize,
    /// Streams dropped on purpose.
    pub aborted: usize,
    /// Transport errors.
    pub failed: usize,
    /// Requests still open at their deadline.
    pub hung: usize,
    /// Answers holding another tenant's marker.
    pub leaks: usize,
}

fn load_tenants(path: &Path, rng: &mut StdRng) -> anyhow::Result<Vec<Tenant>> {
    let file = ClientKeys::load(path)?;
    let mut tenants: Vec<Tenant> = Vec::new();
    for k in file.keys {
        // The first key of every tenant.
        if k.key.is_empty() || tenants.iter().any(|t| t.name == k.tenant) {
            continue;
        }
        let marker = format!("ZQ{}X{:08x}", k.tenant.len(), rng.random::<u32>());
        tenants.push(Tenant {
            name: k.tenant,
            key: k.key,
            marker,
        });
    }
    if tenants.len() < 2 {
        bail!(
            "chaos needs at least two tenants with a key in {}",
            path.display()
        );
    }
    Ok(tenants)
}

async fn one(
    client: &reqwest::Client,
    router: &str,
    t: &Tenant,
    words: usize,
    abort_after: Option<usize>,
) -> (End, Vec<u8>) {
    let filler = vec!["the"; words].join(" ");
    let body = serde_json::json!({
        "model": "pagewarden",
        "prompt": format!("{} {} {}", t.marker, filler, t.marker),
        "max_tokens": 8,
        "temperature": 0,
        "stream": true,
    });
    let resp = client
        .post(format!("{}/v1/completions", router.trim_end_matches('/')))
        .bearer_auth(&t.key)
        .json(&body)
        .send()
        .await;
    let resp = match resp {
        Ok(r) => r,
        Err(_) => return (End::Failed, Vec::new()),
    };
    let ok = resp.status().is_success();
    let mut seen = Vec::new();
    let mut chunks = 0;
    let mut stream = resp.bytes_stream();
    while let Some(c) = stream.next().await {
        match c {
            Ok(b) => seen.extend_from_slice(&b),
            Err(_) => return (End::Failed, seen),
        }
        chunks += 1;
        if ok && abort_after.is_some_and(|n| chunks >= n) {
            return (End::Aborted, seen);
        }
    }
    (if ok { End::Ok } else { End::Rejected }, seen)
}

/// Runs the storm and returns its counts.
pub async fn storm(args: &ChaosArgs) -> anyhow::Result<Summary> {
    let mut rng = StdRng::seed_from_u64(args.seed);
    let tenants = load_tenants(&args.keys, &mut rng)?;
    let client = reqwest::Client::builder().build().context("http client")?;
    let plan: Vec<(usize, usize, Option<usize>)> = (0..args.requests)
        .map(|_| {
            let t = rng.random_range(0..tenants.len());
            let words = rng.random_range(1..=64);
            let abort = rng
                .random_bool(args.abort_share.clamp(0.0, 1.0))
                .then(|| rng.random_range(1..=3));
            (t, words, abort)
        })
        .collect();
    let deadline = Duration::from_secs(args.deadline_s);
    let results: Vec<(usize, End, Vec<u8>)> = futures::stream::iter(plan)
        .map(|(t, words, abort)| {
            let client = &client;
            let tenants = &tenants;
            async move {
                let fut = one(client, &args.router, &tenants[t], words, abort);
                match tokio::time::timeout(deadline, fut).await {
                    Ok((end, seen)) => (t, end, seen),
                    Err(_) => (t, End::Hung, Vec::new()),
                }
            }
        })
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    let mut s = Summary {
        requests: results.len(),
        ..Summary::default()
    };
    for (t, end, seen) in &results {
        match end {
            End::Ok => s.ok += 1,
            End::Rejected => s.rejected += 1,
            End::Aborted => s.aborted += 1,
            End::Failed => s.failed += 1,
            End::Hung => s.hung += 1,
        }
        let foreign = tenants.iter().enumerate().find(|(i, o)| {
            *i != *t
                && seen
                    .windows(o.marker.len())
                    .any(|w| w == o.marker.as_bytes())
        });
        if let Some((_, o)) = foreign {
            s.leaks += 1;
            eprintln!(
                "LEAK: an answer to tenant {} holds tenant {}'s marker",
                tenants[*t].name, o.name
            );
        }
    }
    Ok(s)
}

/// `pagewarden chaos`.
pub fn run(args: ChaosArgs) -> anyhow::Result<()> {
    let s = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(storm(&args))?;
    println!(
        "chaos: requests={} ok={} rejected={} aborted={} failed={} hung={} leaks={}",
        s.requests, s.ok, s.rejected, s.aborted, s.failed, s.hung, s.leaks
    );
    if s.leaks > 0 {
        bail!("{} answers held another tenant's marker", s.leaks);
    }
    if s.hung > 0 {
        bail!("{} requests were still open at their deadline", s.hung);
    }
    Ok(())
}
