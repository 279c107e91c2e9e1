//! `pagewarden probe --router URL --key KEY [--key KEY2]`: one canary sweep against a running
//! router, with the auditor's own prober (`pagewarden_auditor::probe`) over a throw-away
//! in-memory store: markers at the start and end of prompts that lengthen past the router's
//! `max_model_len`; every answer must be a clean 4xx `context_length_exceeded` or a 200 without
//! another probe tenant's marker. Prints every step; exits non-zero when any step failed.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use pagewarden_auditor::domain::ProbeRunStatus;
use pagewarden_auditor::probe::plan::LatencyBounds;
use pagewarden_auditor::probe::side_channel::SideChannelSettings;
use pagewarden_auditor::probe::{ProbeSettings, ProbeTenant, Prober};
use pagewarden_auditor::store::Store;
use pagewarden_auditor::tokens::TokenCounter;
use pagewarden_auditor::Engine;
use pagewarden_common::receipt::PublicKey;
use pagewarden_model::{GgufFile, Tokenizer};

/// `pagewarden probe` flags.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// Router base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub router: String,
    /// An API key to probe as (repeat it: with two keys, each tenant's answers are also
    /// scanned for the other's markers). `tenant=key` names the tenant.
    #[arg(long = "key", required = true)]
    pub keys: Vec<String>,
    /// `max_tokens` of every probe request.
    #[arg(long, default_value_t = 4)]
    pub max_tokens: u32,
    /// First step length in filler words (one KV page).
    #[arg(long, default_value_t = 16)]
    pub page_size: u32,
    /// The least first-token limit of a step (ms); a longer prompt gets more when the sweep's
    /// own earlier steps show the suite needs it (4× its time at their pace).
    #[arg(long, default_value_t = 120_000)]
    pub max_ttft_ms: u64,
    /// Per-request timeout (seconds).
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
    /// Rounds of the side-channel audit after the sweep, with two keys or more (0: none).
    #[arg(long, default_value_t = SideChannelSettings::default().rounds)]
    pub side_channel_rounds: u32,
    /// Rounds of the side-channel audit's scheduling-order check (0: none).
    #[arg(long, default_value_t = SideChannelSettings::default().order_rounds)]
    pub side_channel_order_rounds: u32,
    /// GGUF model whose tokenizer checks `usage.prompt_tokens` (the router's model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The routers' receipt public key (64 hex digits, as the auditor serves it at
    /// `/api/receipt-key`): the side-channel audit then asks for receipts and reports per
    /// prefill worker.
    #[arg(long, value_name = "HEX")]
    pub receipt_public_key: Option<PublicKey>,
}

/// Counts prompt tokens the way the router does for `/v1/completions` text.
struct GgufCounter(Tokenizer);

impl TokenCounter for GgufCounter {
    fn count(&self, prompt: &str) -> Result<u32, String> {
        u32::try_from(self.0.encode(prompt, true).len()).map_err(|e| e.to_string())
    }
}

fn tenants(keys: &[String]) -> Vec<ProbeTenant> {
    keys.iter()
        .enumerate()
        .map(|(i, k)| match k.split_once('=') {
            Some((t, key)) if !t.is_empty() && !key.is_empty() => ProbeTenant {
                tenant: t.to_string(),
                api_key: key.to_string(),
            },
            _ => ProbeTenant {
                tenant: format!("probe-{}", i + 1),
                api_key: k.clone(),
            },
        })
        .collect()
}

/// Runs `pagewarden probe`.
pub fn run(args: ProbeArgs) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(sweep(args))
}

async fn sweep(args: ProbeArgs) -> anyhow::Result<()> {
    let tokens: Option<Arc<dyn TokenCounter>> = match &args.model {
        Some(p) => {
            let f = GgufFile::open(p).with_context(|| format!("opening {}", p.display()))?;
            let t = Tokenizer::from_gguf(&f).context("reading the tokenizer")?;
            Some(Arc::new(GgufCounter(t)))
        }
        None => None,
    };
    let store = Store::connect("sqlite::memory:")
        .await
        .context("opening the in-memory probe store")?;
    let engine = Arc::new(Engine::new(store).await?);
    let router = args.router.trim_end_matches('/').to_string();
    let settings = ProbeSettings {
        router_url: router.clone(),
        tenants: tenants(&args.keys),
        max_tokens: args.max_tokens,
        page_size: args.page_size,
        latency: LatencyBounds {
            floor_ttft_ms: args.max_ttft_ms,
            min_prefill_us_per_token: 0,
            pace_tokens_per_s: None,
        },
        request_timeout: Duration::from_secs(args.timeout_s),
        tokens,
        side_channel: SideChannelSettings {
            rounds: args.side_channel_rounds,
            order_rounds: args.side_channel_order_rounds,
            ..SideChannelSettings::default()
        },
        receipt_key: args.receipt_public_key,
    };
    let prober = Prober::new(engine.clone(), settings)?;
    println!("probing {router}");
    println!(
        "{:<14} {:>4} {:>7} {:>6} {:>8} {:>8}  {:<20} detail",
        "tenant", "step", "words", "http", "prompt", "ttft_ms", "outcome"
    );
    // The prober records each step as it ends: print them from the store while it runs, so a
    // sweep of many minutes on CPU shows its progress step by step. The sweep is a task of its
    // own: the in-memory store has one connection, and a sweep polled only inside this loop
    // would hold it, unpolled, while the printer waits for it.
    let mut sweep = tokio::spawn(async move { prober.run_once().await });
    let mut printed = HashSet::new();
    let run = loop {
        let done = tokio::select! {
            r = &mut sweep => Some(r),
            _ = tokio::time::sleep(Duration::from_millis(300)) => None,
        };
        if let Some(r) = engine.store().probe_runs(1).await?.first() {
            print_new_steps(&engine, r.id, &mut printed).await?;
        }
        if let Some(r) = done {
            let run = r
                .context("the probe sweep's task")?
                .context("running the probe sweep")?;
            print_new_steps(&engine, run, &mut printed).await?;
            break run;
        }
    };
    let store = engine.store();
    let opt = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    let summary = store
        .probe_runs(1)
        .await?
        .into_iter()
        .find(|r| r.id == run)
        .context("the probe run was not recorded")?;
    println!(
        "probe run: {} ({}; context limit {})",
        summary.status,
        summary.message,
        opt(summary.context_limit)
    );
    match summary.status {
        ProbeRunStatus::Passed => Ok(()),
        s @ (ProbeRunStatus::Running | ProbeRunStatus::Failed | ProbeRunStatus::Error) => {
            bail!("probe run {s}: {}", summary.message)
        }
    }
}

/// Prints the steps of `run` not in `printed` (by tenant and step: the store lists a run's
/// steps by step number, so a second tenant's steps land between the first's) and adds them.
async fn print_new_steps(
    engine: &Engine,
    run: pagewarden_auditor::domain::ProbeRunId,
    printed: &mut HashSet<(String, i64)>,
) -> anyhow::Result<()> {
    let results = engine.store().probe_results(run).await?;
    let opt = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    for r in &results {
        if !printed.insert((r.tenant.clone(), r.step)) {
            continue;
        }
        println!(
            "{:<14} {:>4} {:>7} {:>6} {:>8} {:>8}  {:<20} {}",
            r.tenant,
            r.step,
            r.prompt_words,
            opt(r.http_status),
            opt(r.prompt_tokens),
            opt(r.ttft_ms),
            r.outcome.as_str(),
            r.detail
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_may_name_their_tenant() {
        let t = tenants(&["alice=k1".into(), "k2".into()]);
        assert_eq!(
            (t[0].tenant.as_str(), t[0].api_key.as_str()),
            ("alice", "k1")
        );
        assert_eq!(
            (t[1].tenant.as_str(), t[1].api_key.as_str()),
            ("probe-2", "k2")
        );
    }
}
