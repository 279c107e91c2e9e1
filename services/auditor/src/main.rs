//! `pagewarden-auditor`: loads config, starts the auditor, prints the bound addresses as one
//! parseable line, and runs until Ctrl-C / SIGTERM.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use pagewarden_auditor::config::{Args, Config};
use pagewarden_auditor::tokens::{GgufTokenCounter, TokenCounter};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cfg = Config::load(Args::parse()).context("loading configuration")?;
    let _telemetry =
        pagewarden_common::telemetry::init_telemetry("pagewarden-auditor", cfg.log_json)
            .context("starting telemetry")?;
    let tokens: Option<Arc<dyn TokenCounter>> = match &cfg.model_path {
        Some(p) => Some(Arc::new(
            GgufTokenCounter::open(p).context("loading the tokenizer for probe token counts")?,
        )),
        None => {
            tracing::warn!("no model_path: probe token counts are not checked");
            None
        }
    };
    let running = pagewarden_auditor::start(&cfg, tokens)
        .await
        .context("starting the auditor")?;
    let mut out = std::io::stdout();
    writeln!(out, "{}", running.listening_line())?;
    out.flush()?;
    running
        .run_until(pagewarden_common::shutdown::signal())
        .await;
    Ok(())
}
