//! `pagewarden-decode`: the decode worker, as a library: [`run`] serves with the flags in
//! [`Cli`]; the binary (`main.rs`) only parses them.
//!
//! - `state.rs`: the per-request state enum and its transitions.
//! - `scheduler/`: the single-owner scheduler task (queue, reserve, commit, continuous batching,
//!   pages as you go with recompute preemption).
//! - `rotation.rs`: the fair (FCFS, round-robin) order in which sequences are stepped.
//! - `events.rs`: `TokenEvent` construction.
//! - `service.rs`: the `Decode` gRPC service.
//! - `pool_metrics.rs`: pool figures mirrored into `/metrics`.
//!
//! Start-up (model, preflight, pool), the listeners and the gRPC server are `pagewarden-worker`'s.
#![warn(missing_docs)]

mod events;
mod pool_metrics;
mod rotation;
mod scheduler;
mod service;
mod state;

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
use pagewarden_model::{Packing, Tokenizer};
use pagewarden_proto::v1::decode_server::DecodeServer;
use pagewarden_transfer::{PageSink, ReceiverCounters, TcpReceiver};
use pagewarden_worker::{
    auditor_client, Compute, GpuOptions, Listeners, MetricsEndpoint, PoolOptions, PrefixCacheLog,
    Role,
};
use serde::{Deserialize, Serialize};

/// This worker, for messages, telemetry and the auditor.
const ROLE: Role = Role {
    name: "decode",
    binary: "pagewarden-decode",
    cuda_built: cfg!(feature = "cuda"),
};

/// The decode worker: verifies commits and generates tokens with continuous batching.
///
/// Its settings are these flags, the keys of the `--config` file and the `PAGEWARDEN_DECODE_*` variables,
/// merged by the suite's one configuration layer.
#[derive(Parser, Debug, Default, Serialize, Deserialize)]
#[command(name = "pagewarden-decode", version)]
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
    /// Where decode steps run and committed KV pages' data lives: `cpu` or `cuda:N` (GPU N;
    /// needs a build with `--features pagewarden-decode/cuda` and the NVIDIA driver). Pages are
    /// received and verified in host memory either way.
    /// Default `cpu`.
    #[arg(long, env = "PAGEWARDEN_DEVICE")]
    #[serde(with = "pagewarden_common::config::text")]
    pub device: Option<Device>,
}

/// Pages copied to the GPU per pinned staging round.
const STAGING_PAGES: usize = 16;

/// Runs the worker until SIGTERM or Ctrl-C, then drains and returns.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let defaults = WorkerDefaults::decode();
    let cli: Cli = layered(&cli, cli.flags.config.as_deref(), defaults.env_prefix)?;
    let auditor_url = cli.auditor.as_deref();
    let device = cli.device.unwrap_or_default();
    pagewarden_worker::check_device(device, &ROLE)?;
    let cfg = WorkerConfig::from_settings(cli.flags.clone(), defaults)?;
    let _telemetry = pagewarden_common::telemetry::init_telemetry(ROLE.binary, cfg.log_json)?;
    #[cfg(feature = "unsafe-test-switches")]
    pagewarden_common::test_switches::TestSwitches::init(ROLE.binary)?;
    // Every internal client of this process (the auditor's) presents this identity.
    pagewarden_common::tls::install_client_tls(cfg.tls.clone());
    // SIGTERM starts a drain (the scheduler finishes what it holds, takes nothing new); the
    // servers stop once it has (`stop`).
    let shutdown = shutdown::on_signal();
    let stop = shutdown::Shutdown::new();
    let (loaded, tokenizer, compute) = {
        let job_cfg = cfg.clone();
        pagewarden_worker::start_up(&ROLE, auditor_url, &cfg.node_id, move || {
            let cfg = job_cfg;
            let pool = PoolOptions {
                device,
                zero_on_release: cfg.zero_on_release,
                commit_rehash: cfg.commit_rehash,
                // Finished prompts' full pages stay cached (as on prefill), so a later prompt
                // of the namespace is granted, and sent, only after them.
                prefix_cache: true,
            };
            // A decode step reads every weight once a token: the fewest bytes.
            let loaded = pagewarden_worker::load(&cfg, pool, Packing::Bandwidth)?;
            let tokenizer = Tokenizer::from_gguf(loaded.model.gguf()).context("tokenizer")?;
            let gpu = GpuOptions {
                staging_pages: STAGING_PAGES,
                // Decode never prefills a prompt: committed pages arrive whole from the host
                // pool (a recompute writes only rows it computes).
                zero_new_pages: false,
            };
            let compute = Compute::open(device, &ROLE, loaded.model.clone(), &loaded.pool, &gpu)?;
            anyhow::Ok((loaded, Arc::new(tokenizer), compute))
        })
        .await?
    };
    let admission = loaded.admission();
    let metrics = Arc::new(WorkerMetrics::new(ROLE.name, &loaded.model_name));
    metrics.set_cache_config(loaded.cache_config);
    let auditor = auditor_client(auditor_url, &cfg.node_id, &ROLE, &loaded.preflight)
        .context("auditor client")?;
    let auditor_stats = auditor.clone();
    let integrity: Arc<dyn IntegritySink> = match auditor {
        Some(client) => Arc::new(AuditorIntegritySink::new(client)),
        None => Arc::new(LogIntegritySink),
    };

    // The pool checks every write; the drains and lost peers the receiver reports are kept in
    // each grant's record, which the grant's end reads.
    let sink: Arc<dyn PageSink> = Arc::new(loaded.pool.clone());
    let counters = Arc::new(ReceiverCounters::default());
    // Under mutual TLS only prefill certificates may write; refusals reach the auditor (I11).
    let security = pagewarden_worker::receiver_options(&cfg, integrity.clone(), ROLE.name)?;
    let seal = security.seal.clone();
    let receiver = TcpReceiver::bind_with(cfg.transfer_addr, sink, counters.clone(), security)
        .await
        .with_context(|| format!("binding transfer listener {}", cfg.transfer_addr))?;
    let transfer_addr = receiver.local_addr();
    let listeners = Listeners::bind(&cfg, transfer_addr).await?;

    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    let sched = tokio::spawn(scheduler::run(
        scheduler::SchedulerDeps {
            compute,
            tokenizer,
            pool: loaded.pool.clone(),
            admission,
            metrics: metrics.clone(),
            prefix_log: PrefixCacheLog::new(
                &cfg.node_id,
                ROLE.name,
                loaded.pool.clone(),
                metrics.clone(),
                integrity.clone(),
            ),
            integrity,
            node_id: cfg.node_id.clone(),
            max_batch: cfg.max_concurrency,
            max_queue: cfg.max_queue,
            queue_timeout: cfg.queue_timeout,
            recompute_chunk: cfg.chunk_tokens,
        },
        rx,
        shutdown.clone(),
        stop.clone(),
    ));
    let service = service::DecodeService {
        tx,
        pool: loaded.pool.clone(),
        info: Arc::new(service::Static {
            node_id: cfg.node_id.clone(),
            model: loaded.model_name.clone(),
            admission,
            page_size: cfg.page_size,
            arithmetic: loaded.arithmetic.clone(),
            transfer_addr: transfer_addr.to_string(),
        }),
        seal,
    };
    let metrics = MetricsEndpoint {
        metrics,
        refresh: pool_metrics::hook(loaded.pool.clone(), counters),
        auditor: auditor_stats,
    };
    pagewarden_worker::serve(&ROLE, listeners, metrics, DecodeServer::new(service), stop)
        .await
        .context("gRPC server")?;
    let _ = sched.await;
    drop(receiver);
    tracing::info!("decode worker stopped");
    Ok(())
}
