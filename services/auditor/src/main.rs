//! `pagewarden-auditor`: loads config, starts the auditor, prints the bound addresses as one
//! parseable line, and runs until Ctrl-C / SIGTERM.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use pagewarden_auditor::config::{Args, Config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = pagewarden_common::telemetry::init_telemetry("pagewarden-auditor", false)
        .context("starting telemetry")?;
    let cfg = Config::load(Args::parse()).context("loading configuration")?;
    if cfg.model_path.is_some() {
        tracing::warn!(
            "model_path is set, but this build has no tokenizer: probe token counts are not checked"
        );
    }
    let running = pagewarden_auditor::start(&cfg, None)
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
