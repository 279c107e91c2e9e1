//! `pagewarden-router`: parses flags, loads the config, prints one start line
//! (`pagewarden-router listening http=ADDR`) on stdout, and serves until SIGTERM or Ctrl-C.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use pagewarden_router::{serve, AppState, Args, NoSampling, RouterConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = RouterConfig::resolve(Args::parse()).context("configuration")?;
    let _telemetry =
        pagewarden_common::telemetry::init_telemetry("pagewarden-router", config.log_json)
            .context("telemetry")?;
    let state = AppState::from_config(&config, Arc::new(NoSampling)).context("start-up")?;
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("binding {}", config.http_addr))?;
    let addr = listener.local_addr()?;
    println!("pagewarden-router listening http={addr}");
    std::io::stdout().flush()?;
    tracing::info!(%addr, decode = ?config.decode, prefill = ?config.prefill, "router started");
    serve(listener, state, pagewarden_common::shutdown::signal())
        .await
        .context("serving")
}
