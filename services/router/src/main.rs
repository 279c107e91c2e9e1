//! `pagewarden-router`: parses flags, loads the config, prints one start line
//! (`pagewarden-router listening http=ADDR`) on stdout, and serves until SIGTERM or Ctrl-C.
//! On either signal it stops accepting connections, lets in-flight requests finish for at most
//! [`DRAIN_DEADLINE`], and exits 0. SIGHUP reloads the tenants file.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use pagewarden_common::auditor_client::AuditorClient;
use pagewarden_router::{
    serve_with, AppState, Args, AuditorSampleSink, NoSampling, RouterConfig, SampleSink,
};

/// Reports waiting for the auditor before new ones are dropped.
const AUDITOR_BUFFER: usize = 4096;

/// How long in-flight requests may run after SIGTERM/Ctrl-C before the router exits anyway:
/// inside the 30 s grace period orchestrators give before SIGKILL, so the exit stays clean.
const DRAIN_DEADLINE: Duration = Duration::from_secs(25);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = RouterConfig::resolve(Args::parse()).context("configuration")?;
    let _telemetry =
        pagewarden_common::telemetry::init_telemetry("pagewarden-router", config.log_json)
            .context("telemetry")?;
    #[cfg(feature = "unsafe-test-switches")]
    pagewarden_common::test_switches::TestSwitches::init("pagewarden-router")?;
    // Every internal client (workers, auditor) presents this identity.
    pagewarden_common::tls::install_client_tls(config.tls.clone());
    let sink: Arc<dyn SampleSink> = match &config.auditor {
        Some(url) => {
            let client = AuditorClient::spawn(url, AUDITOR_BUFFER).context("auditor client")?;
            tracing::info!(auditor = %url, "sending samples to the auditor");
            Arc::new(AuditorSampleSink::new(client))
        }
        None => Arc::new(NoSampling),
    };
    let state = AppState::from_config(&config, sink).context("start-up")?;
    pagewarden_router::tenants::reload_on_sighup(state.tenants.clone())
        .context("installing the SIGHUP handler (tenants file reload)")?;
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("binding {}", config.http_addr))?;
    let addr = listener.local_addr()?;
    println!("pagewarden-router listening http={addr}");
    std::io::stdout().flush()?;
    tracing::info!(%addr, decode = ?config.decode, prefill = ?config.prefill, "router started");
    let shutdown = pagewarden_common::shutdown::on_signal();
    let deadline = {
        let shutdown = shutdown.clone();
        async move {
            shutdown.cancelled().await;
            tokio::time::sleep(DRAIN_DEADLINE).await;
        }
    };
    tokio::select! {
        served = serve_with(listener, state, config.edge, shutdown.cancelled_owned()) => {
            served.context("serving")?;
            tracing::info!("drained: every in-flight request finished");
        }
        () = deadline => tracing::warn!(
            deadline = ?DRAIN_DEADLINE,
            "drain deadline passed: exiting with requests still in flight"
        ),
    }
    Ok(())
}
