//! `pagewarden-prefill`: the prefill worker.
//!
//! - `startup.rs`: model loading, pool sizing, preflight (I7).
//! - `compute.rs`: `Compute`, the forward pass and page reads on the CPU or a GPU (`--device`).
//! - `grant.rs`: parsing the request and decode's write grant.
//! - `job.rs`: one job: chunked forward pass, first token, KV transfer, manifest.
//! - `segments.rs`: the transfer backend and its open segments.
//! - `service.rs`: the `Prefill` gRPC service (admission, cancellation).

mod compute;
mod grant;
mod job;
mod segments;
mod service;
mod startup;

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use pagewarden_common::admission::Admission;
use pagewarden_common::auditor_client::{preflight_report, report_startup_failure, AuditorClient};
use pagewarden_common::config::{WorkerConfig, WorkerDefaults, WorkerFlags};
use pagewarden_common::metrics::{serve_metrics, PoolGauges, WorkerMetrics};
use pagewarden_common::shutdown;
use pagewarden_kernels::Device;
use pagewarden_proto::v1::prefill_server::PrefillServer;
use pagewarden_transfer::{EngineConfig, TcpBackend};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

/// Reports waiting for the auditor before new ones are dropped.
const AUDITOR_BUFFER: usize = 1024;

/// The prefill worker: runs prompts and writes their KV into decode's granted pages.
#[derive(Parser, Debug)]
#[command(name = "pagewarden-prefill", version)]
struct Cli {
    #[command(flatten)]
    flags: WorkerFlags,
    /// The auditor's gRPC URL: integrity events and the preflight report go there.
    #[arg(long, env = "PAGEWARDEN_AUDITOR")]
    auditor: Option<String>,
    /// Pages per transfer batch.
    #[arg(long, default_value_t = 16)]
    batch_pages: usize,
    /// Where the model runs and the KV pages' data lives: `cpu` or `cuda:N` (GPU N; needs a
    /// build with `--features pagewarden-prefill/cuda` and the NVIDIA driver).
    #[arg(long, env = "PAGEWARDEN_DEVICE", default_value = "cpu")]
    device: Device,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let auditor_url = cli.auditor.clone();
    compute::check_device(cli.device)?;
    let cfg = WorkerConfig::resolve(cli.flags, WorkerDefaults::prefill())?;
    let _telemetry =
        pagewarden_common::telemetry::init_telemetry("pagewarden-prefill", cfg.log_json)?;
    let shutdown = shutdown::on_signal();
    let started = {
        let cfg = cfg.clone();
        let (device, batch_pages) = (cli.device, cli.batch_pages);
        tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let loaded = startup::load(&cfg, device)?;
            let compute = compute::Compute::open(
                device,
                loaded.model.clone(),
                &loaded.pool,
                cfg.chunk_tokens,
                batch_pages,
                cfg.zero_on_release,
            )?;
            Ok((loaded, compute))
        })
        .await?
    };
    let (loaded, compute) = match started {
        Ok(done) => done,
        Err(e) => {
            // A worker that refuses to start says so to the auditor before exiting (I7, I8).
            let why = format!("{e:#}");
            report_startup_failure(auditor_url.as_deref(), &cfg.node_id, "prefill", &why).await;
            return Err(e);
        }
    };
    let admission = Admission::new(
        loaded.preflight.advertised_context,
        loaded.preflight.pool_tokens,
    );
    let metrics = Arc::new(WorkerMetrics::new("prefill"));
    // Prefill has no integrity hook yet; the client only carries its preflight report.
    let _auditor = match &auditor_url {
        Some(url) => {
            let client = AuditorClient::spawn(url, AUDITOR_BUFFER).context("auditor client")?;
            client.report_preflight(preflight_report(&cfg.node_id, "prefill", &loaded.preflight));
            Some(client)
        }
        None => None,
    };
    let grpc = TcpListener::bind(cfg.grpc_addr)
        .await
        .with_context(|| format!("binding gRPC {}", cfg.grpc_addr))?;
    let grpc_addr = grpc.local_addr()?;
    let metrics_listener = TcpListener::bind(cfg.metrics_addr)
        .await
        .with_context(|| format!("binding metrics {}", cfg.metrics_addr))?;
    let metrics_addr = metrics_listener.local_addr()?;

    let backend = TcpBackend::new(EngineConfig::default(), cfg.transfer_addr);
    let deps = Arc::new(job::JobDeps {
        compute,
        pool: loaded.pool.clone(),
        segments: segments::Segments::new(backend),
        permits: Arc::new(tokio::sync::Semaphore::new(cfg.max_concurrency)),
        metrics: metrics.clone(),
        chunk_tokens: cfg.chunk_tokens,
        batch_pages: cli.batch_pages,
    });
    let service = service::PrefillService {
        deps,
        info: Arc::new(service::Static {
            node_id: cfg.node_id.clone(),
            model: loaded.model_name.clone(),
            admission,
            page_size: cfg.page_size,
        }),
        active: Arc::new(parking_lot::Mutex::new(HashMap::new())),
    };
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<PrefillServer<service::PrefillService>>()
        .await;

    let pool = loaded.pool.clone();
    let refresh = Arc::new(move |m: &WorkerMetrics| {
        let s = pool.stats();
        m.set_pool(PoolGauges {
            free: s.free as u64,
            used: (s.reserved + s.readable) as u64,
            draining: s.draining as u64,
            quarantined: s.quarantined as u64,
        });
    });
    let m = tokio::spawn(serve_metrics(
        metrics_listener,
        metrics.clone(),
        refresh,
        shutdown.clone().cancelled_owned(),
    ));
    // The one parseable line tests and the launcher look for. Prefill has no transfer listener
    // (it only sends); `transfer=` names the sending bind address.
    println!(
        "pagewarden-prefill listening grpc={grpc_addr} metrics={metrics_addr} transfer={}",
        cfg.transfer_addr
    );
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(PrefillServer::new(service))
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(grpc),
            shutdown.clone().cancelled_owned(),
        )
        .await
        .context("gRPC server")?;
    shutdown.cancel();
    let _ = m.await;
    tracing::info!("prefill worker stopped");
    Ok(())
}
