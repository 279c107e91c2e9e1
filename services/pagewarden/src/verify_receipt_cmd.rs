//! `pagewarden verify-receipt`: checks a signed isolation receipt against the deployment's
//! public key (given, or fetched from the auditor's `/api/receipt-key`) and prints what it
//! says. Exit status 0 only when the signature verifies.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use pagewarden_common::receipt::PublicKey;
use serde_json::Value;

/// Arguments of `pagewarden verify-receipt`.
#[derive(Debug, Args)]
pub struct VerifyReceiptArgs {
    /// The receipt: a JSON file holding `{"receipt", "signature"}`, or a whole response (or
    /// stream chunk) holding it as `pagewarden_receipt`; `-` reads stdin.
    pub file: PathBuf,
    /// The public key to check against (64 hex digits).
    #[arg(long, conflicts_with = "auditor")]
    pub public_key: Option<String>,
    /// The auditor's HTTP address (`http://127.0.0.1:8090`): the key it serves at
    /// `/api/receipt-key`.
    #[arg(long)]
    pub auditor: Option<String>,
}

/// Runs the command.
pub fn run(a: VerifyReceiptArgs) -> anyhow::Result<()> {
    let text = if a.file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(&a.file)
            .with_context(|| format!("cannot read {}", a.file.display()))?
    };
    let doc: Value = serde_json::from_str(&text).context("the receipt is not JSON")?;
    let signed = doc.get("pagewarden_receipt").unwrap_or(&doc);
    let key = match (a.public_key, a.auditor) {
        (Some(hex), None) => hex.parse::<PublicKey>()?,
        (None, Some(url)) => fetch_key(&url)?,
        _ => bail!("give the key to check against: --public-key HEX or --auditor URL"),
    };
    let receipt = key
        .verify(signed)
        .map_err(|e| anyhow!("receipt NOT verified: {e}"))?;
    println!("receipt verified: signed by key {}", key.key_id());
    print_summary(receipt);
    Ok(())
}

/// The key the auditor at `url` serves.
fn fetch_key(url: &str) -> anyhow::Result<PublicKey> {
    let url = format!("{}/api/receipt-key", url.trim_end_matches('/'));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let body: Value = rt.block_on(async {
        let r = reqwest::Client::new()
            .get(&url)
            .timeout(std::time::Duration::from_secs(10))
            .send()
            .await
            .with_context(|| format!("cannot reach {url}"))?;
        let status = r.status();
        let body: Value = r.json().await.with_context(|| format!("{url}: not JSON"))?;
        if !status.is_success() {
            bail!("{url} answered {status}: {body}");
        }
        Ok::<_, anyhow::Error>(body)
    })?;
    let hex = body["public_key"]
        .as_str()
        .ok_or_else(|| anyhow!("{url} named no public_key"))?;
    Ok(hex.parse()?)
}

/// One line per choice: what it was computed over.
fn print_summary(r: &Value) {
    println!(
        "  response {} · model {} · tenant {} · namespace {} · router build {}",
        r["response_id"].as_str().unwrap_or("?"),
        r["model"].as_str().unwrap_or("?"),
        r["tenant"].as_str().unwrap_or("?"),
        r["namespace"].as_str().unwrap_or("?"),
        r["build"]["router_sha256"]
            .as_str()
            .map_or("?", |b| &b[..b.len().min(16)]),
    );
    for c in r["choices"].as_array().into_iter().flatten() {
        let reused = |half: &str| {
            c[half]["reused"]
                .as_array()
                .map(|runs| {
                    runs.iter()
                        .map(|run| {
                            format!(
                                "{} tokens of {} by {}",
                                run["tokens"], run["namespace"], run["producer_request_id"]
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "none".into())
        };
        println!(
            "  choice {}: request {} · prompt {} tokens · output {} tokens ({})",
            c["index"],
            c["request_id"].as_str().unwrap_or("?"),
            c["prompt"]["tokens"],
            c["output"]["tokens"],
            c["output"]["finish_reason"].as_str().unwrap_or("?"),
        );
        println!(
            "    prefill {}: reused {}",
            c["prefill"]["worker"].as_str().unwrap_or("?"),
            reused("prefill")
        );
        println!(
            "    transfer: {} ({} granted pages)",
            c["transfer"]["verdict"].as_str().unwrap_or("?"),
            c["transfer"]["granted_pages"]
                .as_array()
                .map_or(0, Vec::len),
        );
        println!(
            "    decode {}: {} pages, reused {}, {} preemptions",
            c["decode"]["worker"].as_str().unwrap_or("?"),
            c["decode"]["pages"].as_array().map_or(0, Vec::len),
            reused("decode"),
            c["decode"]["preemptions"],
        );
    }
}
