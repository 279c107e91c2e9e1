//! `pagewarden-decode`: the decode worker.
//!
//! - `startup.rs`: model loading, pool sizing, preflight (I7).
//! - `compute.rs`: `Compute`, decode steps on the CPU or a GPU (`--device`).
//! - `state.rs`: the per-request state enum and its transitions.
//! - `scheduler.rs`: the single-owner scheduler task (reserve, commit, continuous batching).
//! - `output.rs`: tokens → stream events (EOG, max_tokens, stop sequences, UTF-8).
//! - `events.rs`: `TokenEvent` construction.
//! - `convert.rs`: proto ↔ domain conversions.
//! - `service.rs`: the `Decode` gRPC service.
//! - `pool_metrics.rs`: pool figures mirrored into `/metrics`.
//! - `sink.rs`: the transfer sink (the pool) remembering drains of live grants.

mod compute;
mod convert;
mod events;
mod output;
mod pool_metrics;
mod scheduler;
mod service;
mod sink;
mod startup;
mod state;

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use pagewarden_common::admission::Admission;
use pagewarden_common::auditor_client::{
    preflight_report, report_startup_failure, AuditorClient, AuditorIntegritySink,
};
use pagewarden_common::config::{WorkerConfig, WorkerDefaults, WorkerFlags};
use pagewarden_common::integrity::{IntegritySink, LogIntegritySink};
use pagewarden_common::metrics::{serve_metrics, WorkerMetrics};
use pagewarden_common::shutdown;
use pagewarden_kernels::Device;
use pagewarden_proto::v1::decode_server::DecodeServer;
use pagewarden_transfer::{PageSink, ReceiverCounters, TcpReceiver};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

/// Reports waiting for the auditor before new ones are dropped.
const AUDITOR_BUFFER: usize = 1024;

/// The decode worker: verifies commits and generates tokens with continuous batching.
#[derive(Parser, Debug)]
#[command(name = "pagewarden-decode", version)]
struct Cli {
    #[command(flatten)]
    flags: WorkerFlags,
    /// The auditor's gRPC URL: integrity events and the preflight report go there.
    #[arg(long, env = "PAGEWARDEN_AUDITOR")]
    auditor: Option<String>,
    /// Where decode steps run and committed KV pages' data lives: `cpu` or `cuda:N` (GPU N;
    /// needs a build with `--features pagewarden-decode/cuda` and the NVIDIA driver). Pages are
    /// received and verified in host memory either way.
    #[arg(long, env = "PAGEWARDEN_DEVICE", default_value = "cpu")]
    device: Device,
}

/// Pages copied to the GPU per pinned staging round.
const STAGING_PAGES: usize = 16;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let auditor_url = cli.auditor.clone();
    compute::check_device(cli.device)?;
    let cfg = WorkerConfig::resolve(cli.flags, WorkerDefaults::decode())?;
    let _telemetry =
        pagewarden_common::telemetry::init_telemetry("pagewarden-decode", cfg.log_json)?;
    let shutdown = shutdown::on_signal();
    let started = {
        let cfg = cfg.clone();
        let device = cli.device;
        tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let loaded = startup::load(&cfg)?;
            let compute =
                compute::Compute::open(device, loaded.model.clone(), &loaded.pool, STAGING_PAGES)?;
            Ok((loaded, compute))
        })
        .await?
    };
    let (loaded, compute) = match started {
        Ok(done) => done,
        Err(e) => {
            // A worker that refuses to start says so to the auditor before exiting (I7, I8).
            let why = format!("{e:#}");
            report_startup_failure(auditor_url.as_deref(), &cfg.node_id, "decode", &why).await;
            return Err(e);
        }
    };
    let admission = Admission::new(
        loaded.preflight.advertised_context,
        loaded.preflight.pool_tokens,
    );
    let metrics = Arc::new(WorkerMetrics::new("decode"));
    let auditor = match &auditor_url {
        Some(url) => {
            let client = AuditorClient::spawn(url, AUDITOR_BUFFER).context("auditor client")?;
            client.report_preflight(preflight_report(&cfg.node_id, "decode", &loaded.preflight));
            Some(client)
        }
        None => None,
    };
    let integrity: Arc<dyn IntegritySink> = match auditor {
        Some(client) => Arc::new(AuditorIntegritySink::new(client)),
        None => Arc::new(LogIntegritySink),
    };

    let decode_sink = sink::DecodeSink::new(loaded.pool.clone());
    let sink: Arc<dyn PageSink> = Arc::new(decode_sink.clone());
    let counters = Arc::new(ReceiverCounters::default());
    let receiver = TcpReceiver::bind(cfg.transfer_addr, sink, counters.clone())
        .await
        .with_context(|| format!("binding transfer listener {}", cfg.transfer_addr))?;
    let transfer_addr = receiver.local_addr();
    let grpc = TcpListener::bind(cfg.grpc_addr)
        .await
        .with_context(|| format!("binding gRPC {}", cfg.grpc_addr))?;
    let grpc_addr = grpc.local_addr()?;
    let metrics_listener = TcpListener::bind(cfg.metrics_addr)
        .await
        .with_context(|| format!("binding metrics {}", cfg.metrics_addr))?;
    let metrics_addr = metrics_listener.local_addr()?;

    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    let sched = tokio::spawn(scheduler::run(
        scheduler::SchedulerDeps {
            compute,
            tokenizer: loaded.tokenizer.clone(),
            pool: loaded.pool.clone(),
            sink: decode_sink,
            admission,
            metrics: metrics.clone(),
            integrity,
            node_id: cfg.node_id.clone(),
            max_batch: cfg.max_concurrency,
        },
        rx,
        shutdown.clone(),
    ));
    let service = service::DecodeService {
        tx,
        pool: loaded.pool.clone(),
        info: Arc::new(service::Static {
            node_id: cfg.node_id.clone(),
            model: loaded.model_name.clone(),
            admission,
            page_size: cfg.page_size,
            transfer_addr: transfer_addr.to_string(),
        }),
    };
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<DecodeServer<service::DecodeService>>()
        .await;

    let m = tokio::spawn(serve_metrics(
        metrics_listener,
        metrics.clone(),
        pool_metrics::hook(loaded.pool.clone(), counters),
        shutdown.clone().cancelled_owned(),
    ));
    // The one parseable line tests and the launcher look for.
    println!("pagewarden-decode listening grpc={grpc_addr} metrics={metrics_addr} transfer={transfer_addr}");
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(DecodeServer::new(service))
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(grpc),
            shutdown.clone().cancelled_owned(),
        )
        .await
        .context("gRPC server")?;
    shutdown.cancel();
    let _ = sched.await;
    let _ = m.await;
    drop(receiver);
    tracing::info!("decode worker stopped");
    Ok(())
}
