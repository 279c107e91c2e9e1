//! `pagewarden-prefill`: the prefill worker, as a library: [`run`] serves with the flags in
//! [`Cli`]; the binary (`main.rs`) only parses them.
//!
//! - `grant.rs`: parsing the request and decode's write grant.
//! - `gate.rs`: the bounded fair queue for a compute slot and the prompt's pages (I9).
//! - `job.rs`: one job: chunked forward pass taking turns with other jobs, first token.
//! - `grant_writer.rs`: `GrantWriter`, the one owner of a grant's end on this side: one job's
//!   pages streamed to decode as chunks complete them; drain and manifest, or cancel.
//! - `segments.rs`: the transfer backend and its open segments.
//! - `service.rs`: the `Prefill` gRPC service (admission, cancellation).
//! - `turns.rs`: the engine's turn, one chunk at a time, tenants in rotation.
//!
//! Start-up (model, preflight, pool), the listeners and the gRPC server are `pagewarden-worker`'s.
#![warn(missing_docs)]

mod gate;
mod grant;
mod grant_writer;
mod job;
mod segments;
mod service;
mod turns;

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use pagewarden_common::auditor_client::AuditorIntegritySink;
use pagewarden_common::config::layered;
use pagewarden_common::integrity::{IntegritySink, LogIntegritySink};
use pagewarden_common::metrics::WorkerMetrics;
use pagewarden_common::shutdown;
use pagewarden_common::worker_config::{WorkerConfig, WorkerDefaults, WorkerFlags};
use pagewarden_kernels::Device;
use pagewarden_model::Packing;
use pagewarden_proto::v1::prefill_server::PrefillServer;
use pagewarden_transfer::{EngineConfig, ListenOptions, TcpBackend};
use pagewarden_worker::{
    auditor_client, Compute, GpuOptions, Listeners, MetricsEndpoint, PoolOptions, PrefixCacheLog,
    Role,
};
use serde::{Deserialize, Serialize};

/// This worker, for messages, telemetry and the auditor.
const ROLE: Role = Role {
    name: "prefill",
    binary: "pagewarden-prefill",
    cuda_built: cfg!(feature = "cuda"),
};

/// The prefill worker: runs prompts and writes their KV into decode's granted pages.
///
/// Its settings are these flags, the keys of the `--config` file and the `PAGEWARDEN_PREFILL_*` variables,
/// merged by the suite's one configuration layer.
#[derive(Parser, Debug, Default, Serialize, Deserialize)]
#[command(name = "pagewarden-prefill", version)]
// Unknown keys are refused by `WorkerFlags`, which sees every key this struct does not take (a
// second check here would misread the keys `WorkerFlags` takes as unknown).
#[serde(default)]
pub struct Cli {
    /// The flags every worker takes.
    #[command(flatten)]
    #[serde(flatten)]
    pub flags: WorkerFlags,
    /// The auditor's gRPC URL: integrity events and the preflight report go there.
    #[arg(long, env = "PAGEWARDEN_AUDITOR")]
    pub auditor: Option<String>,
    /// Pages per transfer batch (default 16).
    #[arg(long)]
    pub batch_pages: Option<usize>,
    /// Where the model runs and the KV pages' data lives: `cpu` or `cuda:N` (GPU N; needs a
    /// build with `--features pagewarden-prefill/cuda` and the NVIDIA driver).
    /// Default `cpu`.
    #[arg(long, env = "PAGEWARDEN_DEVICE")]
    #[serde(with = "pagewarden_common::config::text")]
    pub device: Option<Device>,
}

/// Runs the worker until SIGTERM or Ctrl-C, then drains and returns.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let defaults = WorkerDefaults::prefill();
    let cli: Cli = layered(&cli, cli.flags.config.as_deref(), defaults.env_prefix)?;
    let auditor_url = cli.auditor.as_deref();
    let device = cli.device.unwrap_or_default();
    let batch_pages = cli.batch_pages.unwrap_or(16);
    pagewarden_worker::check_device(device, &ROLE)?;
    let cfg = WorkerConfig::from_settings(cli.flags.clone(), defaults)?;
    let _telemetry = pagewarden_common::telemetry::init_telemetry(ROLE.binary, cfg.log_json)?;
    #[cfg(feature = "unsafe-test-switches")]
    pagewarden_common::test_switches::TestSwitches::init(ROLE.binary)?;
    // Every internal client of this process (the auditor's) presents this identity.
    pagewarden_common::tls::install_client_tls(cfg.tls.clone());
    let shutdown = shutdown::on_signal();
    let (loaded, compute) = {
        let job_cfg = cfg.clone();
        pagewarden_worker::start_up(&ROLE, auditor_url, &cfg.node_id, move || {
            let cfg = job_cfg;
            // On a GPU the host pool only owns the pages (their data lives on the device), so
            // it is not zeroed on release: the device pages are.
            let pool = PoolOptions {
                device,
                zero_on_release: cfg.zero_on_release && device == Device::Cpu,
                // Prefill allocates its pages locally: nothing is ever committed into them.
                commit_rehash: false,
                // Cached pages are attended over where they are: host memory, or a GPU's.
                prefix_cache: true,
            };
            // Prefill's products are compute-bound: weights packed for compute, at more bytes.
            let loaded = pagewarden_worker::load(&cfg, pool, Packing::Compute)?;
            let gpu = GpuOptions {
                staging_pages: batch_pages,
                zero_new_pages: cfg.zero_on_release,
            };
            let compute = Compute::open(device, &ROLE, loaded.model.clone(), &loaded.pool, &gpu)?;
            anyhow::Ok((loaded, compute))
        })
        .await?
    };
    let admission = loaded.admission();
    let metrics = Arc::new(WorkerMetrics::new(ROLE.name, &loaded.model_name));
    metrics.set_cache_config(loaded.cache_config);
    // The auditor hears prefill's preflight and its prefix-cache events.
    let auditor = auditor_client(auditor_url, &cfg.node_id, &ROLE, &loaded.preflight)
        .context("auditor client")?;
    let auditor_stats = auditor.clone();
    let auditor: Arc<dyn IntegritySink> = match auditor {
        Some(client) => Arc::new(AuditorIntegritySink::new(client)),
        None => Arc::new(LogIntegritySink),
    };
    // Prefill has no transfer listener (it only sends); `transfer=` in its listening line names
    // the sending bind address.
    let listeners = Listeners::bind(&cfg, cfg.transfer_addr).await?;

    // Under mutual TLS the KV stream is encrypted and decode checks this worker's role (I11).
    let backend = TcpBackend::with_security(
        EngineConfig::default(),
        cfg.transfer_addr,
        ListenOptions::default(),
        pagewarden_worker::sender_tls(&cfg)?,
    );
    let deps = Arc::new(job::JobDeps {
        compute,
        pool: loaded.pool.clone(),
        segments: segments::Segments::new(backend),
        gate: gate::Gate::new(
            loaded.pool.clone(),
            gate::GateConfig {
                max_running: cfg.max_concurrency,
                max_queue: cfg.max_queue,
                queue_timeout: cfg.queue_timeout,
            },
            metrics.clone(),
        ),
        metrics: metrics.clone(),
        prefix_log: PrefixCacheLog::new(
            &cfg.node_id,
            ROLE.name,
            loaded.pool.clone(),
            metrics.clone(),
            auditor,
        ),
        chunk_tokens: cfg.chunk_tokens,
        batch_pages,
        turns: turns::Turns::default(),
        model: loaded.model.clone(),
    });
    let service = service::PrefillService {
        deps,
        info: Arc::new(service::Static {
            node_id: cfg.node_id.clone(),
            model: loaded.model_name.clone(),
            admission,
            page_size: cfg.page_size,
            arithmetic: loaded.arithmetic.clone(),
        }),
        active: Arc::new(parking_lot::Mutex::new(HashMap::new())),
    };

    let pool = loaded.pool.clone();
    let metrics = MetricsEndpoint {
        metrics,
        refresh: Arc::new(move |m: &WorkerMetrics| {
            m.set_pool(pagewarden_worker::pool_gauges(&pool))
        }),
        auditor: auditor_stats,
    };
    pagewarden_worker::serve(
        &ROLE,
        listeners,
        metrics,
        PrefillServer::new(service),
        shutdown,
    )
    .await
    .context("gRPC server")?;
    tracing::info!("prefill worker stopped");
    Ok(())
}
