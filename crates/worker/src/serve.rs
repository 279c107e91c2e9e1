//! Serving: the gRPC and metrics listeners, then `/metrics`, the listening line and the gRPC
//! server with its health service until shutdown. Under mutual TLS every RPC's caller role is
//! checked by a tower layer before the service sees it (I11): decode and prefill take calls
//! from routers only. Without TLS the gRPC listener must be on loopback unless
//! `--insecure-internal`. The `/metrics` listener serves a non-loopback address only behind a
//! metrics token (`--metrics-token`), which every scrape must present.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use pagewarden_common::auditor_client::AuditorClient;
use pagewarden_common::metrics::{serve_metrics, PoolGauges, RefreshHook, WorkerMetrics};
use pagewarden_common::secret::SecretHash;
use pagewarden_common::shutdown::Shutdown;
use pagewarden_common::tls::{
    refuse_plaintext, InternalTls, PlaintextRefused, RequireRole, SuiteRole,
};
use pagewarden_common::worker_config::WorkerConfig;
use pagewarden_kvcache::KvPool;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::Service;
use tonic::server::NamedService;

use crate::Role;

/// A listener that could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// Plaintext gRPC on a non-loopback address without `--insecure-internal`.
    #[error(transparent)]
    Plaintext(#[from] PlaintextRefused),
    /// The gRPC listener.
    #[error("binding gRPC {addr}")]
    Grpc {
        /// The configured address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `/metrics` on a non-loopback address without a metrics token.
    #[error(
        "refusing to serve /metrics on {addr} without a metrics token: a non-loopback address is \
         reachable from other hosts. Set --metrics-token (or PAGEWARDEN_{role}_METRICS_TOKEN) \
         to a random string of at least 16 characters, which every scrape must then present as \
         `Authorization: Bearer TOKEN` (Prometheus: `authorization: {{credentials_file: …}}`), \
         or bind the metrics address to loopback"
    )]
    MetricsUnprotected {
        /// The configured address.
        addr: SocketAddr,
        /// The worker's role in capitals, as its environment variables spell it.
        role: String,
    },
    /// The metrics listener.
    #[error("binding metrics {addr}")]
    Metrics {
        /// The configured address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The gRPC and metrics listeners, bound, with the addresses they got (port 0 resolved), and
/// the transfer address the listening line announces.
pub struct Listeners {
    /// The gRPC listener.
    pub grpc: TcpListener,
    /// Its bound address.
    pub grpc_addr: SocketAddr,
    /// The `/metrics` listener.
    pub metrics: TcpListener,
    /// Its bound address.
    pub metrics_addr: SocketAddr,
    /// The transfer address: decode's bound receiver, or the address prefill sends from.
    pub transfer_addr: SocketAddr,
    /// How the gRPC listener is secured.
    pub tls: InternalTls,
    /// The token `/metrics` requires, if any.
    pub metrics_token: Option<SecretHash>,
}

impl Listeners {
    /// Binds `cfg.grpc_addr` and `cfg.metrics_addr`; `transfer_addr` is only announced.
    /// Refuses plaintext gRPC off loopback unless `cfg.insecure_internal`.
    pub async fn bind(
        cfg: &WorkerConfig,
        transfer_addr: SocketAddr,
    ) -> Result<Listeners, BindError> {
        refuse_plaintext("gRPC", cfg.grpc_addr, &cfg.tls, cfg.insecure_internal)?;
        if !cfg.metrics_addr.ip().is_loopback() && cfg.metrics_token.is_none() {
            return Err(BindError::MetricsUnprotected {
                addr: cfg.metrics_addr,
                role: cfg.role.to_uppercase(),
            });
        }
        let (grpc, grpc_addr) = bind(cfg.grpc_addr)
            .await
            .map_err(|source| BindError::Grpc {
                addr: cfg.grpc_addr,
                source,
            })?;
        let (metrics, metrics_addr) =
            bind(cfg.metrics_addr)
                .await
                .map_err(|source| BindError::Metrics {
                    addr: cfg.metrics_addr,
                    source,
                })?;
        Ok(Listeners {
            grpc,
            grpc_addr,
            metrics,
            metrics_addr,
            transfer_addr,
            tls: cfg.tls.clone(),
            metrics_token: cfg.metrics_token,
        })
    }
}

/// Who may call a worker's RPCs: decode's Reserve/Generate/Abort/Info and prefill's
/// Prefill/Abort/Info are the router's alone.
fn worker_policy(_path: &str) -> &'static [SuiteRole] {
    &[SuiteRole::Router]
}

async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr).await?;
    let local = l.local_addr()?;
    Ok((l, local))
}

/// The pool's occupancy for the `/metrics` gauges.
pub fn pool_gauges(pool: &KvPool) -> PoolGauges {
    let s = pool.stats();
    PoolGauges {
        free: s.free as u64,
        used: (s.reserved + s.readable) as u64,
        draining: s.draining as u64,
        quarantined: s.quarantined as u64,
    }
}

/// What `/metrics` serves: the registry, refreshed by `refresh` at each scrape.
pub struct MetricsEndpoint {
    /// The worker's registry.
    pub metrics: Arc<WorkerMetrics>,
    /// Copies live figures (pool, transfer counters) into it.
    pub refresh: RefreshHook,
    /// The auditor client, whose sent/dropped/failed/retried counts are exported too.
    pub auditor: Option<AuditorClient>,
}

/// Serves `/metrics` and gRPC (`service` beside the health service, which reports it serving)
/// on `listeners` until `shutdown` is cancelled, after printing the one parseable line tests
/// and the launcher look for: `<binary> listening grpc=ADDR metrics=ADDR transfer=ADDR`
/// (plus ` tls=mutual` under TLS).
/// Cancels `shutdown` on the way out, so the worker's other tasks stop too, and waits for
/// `/metrics` to close.
pub async fn serve<S>(
    role: &Role,
    listeners: Listeners,
    metrics: MetricsEndpoint,
    service: S,
    shutdown: Shutdown,
) -> Result<(), tonic::transport::Error>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = listeners.tls.server_config() {
        server = server.tls_config(tls)?;
    }
    let refresh = match metrics.auditor {
        Some(client) => {
            let inner = metrics.refresh;
            Arc::new(move |m: &WorkerMetrics| {
                inner(m);
                m.mirror_auditor_client(client.stats());
            }) as RefreshHook
        }
        None => metrics.refresh,
    };
    let m = tokio::spawn(serve_metrics(
        listeners.metrics,
        metrics.metrics,
        refresh,
        listeners.metrics_token,
        shutdown.clone().cancelled_owned(),
    ));
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<S>().await;
    let tls = if listeners.tls.is_mutual() {
        " tls=mutual"
    } else {
        ""
    };
    println!(
        "{} listening grpc={} metrics={} transfer={}{tls}",
        role.binary, listeners.grpc_addr, listeners.metrics_addr, listeners.transfer_addr
    );
    let served = server
        .layer(RequireRole::new(worker_policy, listeners.tls.is_mutual()))
        .add_service(health_service)
        .add_service(service)
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(listeners.grpc),
            shutdown.clone().cancelled_owned(),
        )
        .await;
    shutdown.cancel();
    let _ = m.await;
    served
}
