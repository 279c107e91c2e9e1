//! Starting an auditor: store, engine, gRPC and HTTP listeners, and the probe loop, all
//! stopped by one cancellation token. Tests start it in-process; `main` starts it as a process.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use pagewarden_common::edge::{serve_edge, EdgeCounters, EdgeLimits};
use pagewarden_common::tls::{refuse_plaintext, PlaintextRefused, RequireRole};
use pagewarden_proto::v1::auditor_server::AuditorServer;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::Engine;
use crate::grpc::{caller_policy, AuditorService};
use crate::probe::plan::LatencyBounds;
use crate::probe::{ProbeSettings, Prober, Schedule};
use crate::recompute::Recomputer;
use crate::store::{Store, StoreError};
use crate::tokens::TokenCounter;
use crate::web::{self, AppState};

/// Starting failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The database could not be opened or migrated.
    #[error("opening the store: {0}")]
    Store(#[from] StoreError),
    /// A listener could not be bound, or a data directory created.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// The probe HTTP client could not be built.
    #[error("probe client: {0}")]
    Http(#[from] reqwest::Error),
    /// Plaintext gRPC on a non-loopback address without `--insecure-internal` (I11).
    #[error(transparent)]
    Plaintext(#[from] PlaintextRefused),
    /// The gRPC server's TLS configuration was refused.
    #[error("gRPC TLS: {0}")]
    Tls(#[from] tonic::transport::Error),
    /// The recompute audit's model could not be loaded or its thread started.
    #[error("recompute audit: {0}")]
    Recompute(String),
}

/// A started auditor.
pub struct Running {
    /// Where the web UI and JSON API listen.
    pub http_addr: SocketAddr,
    /// Where the gRPC ingestion service listens.
    pub grpc_addr: SocketAddr,
    /// The engine, for in-process inspection.
    pub engine: Arc<Engine>,
    shutdown: CancellationToken,
    tasks: JoinSet<()>,
}

impl Running {
    /// The line `main` prints once listening; scripts and tests parse it.
    pub fn listening_line(&self) -> String {
        format!(
            "pagewarden-auditor listening http={} grpc={}",
            self.http_addr, self.grpc_addr
        )
    }

    /// Stops every listener and task and waits for them.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        while self.tasks.join_next().await.is_some() {}
        self.engine.store().close().await;
    }

    /// Waits until `signal` resolves, then shuts down.
    pub async fn run_until(self, signal: impl std::future::Future<Output = ()>) {
        signal.await;
        self.shutdown().await;
    }
}

/// Creates the SQLite file's directory (0700) and the file itself (0600) before SQLite opens
/// it: it holds every canary marker, and SQLite gives its journal files the file's own mode.
/// An existing file is tightened to 0600.
fn private_sqlite(file: &Path) -> Result<(), StartError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let io = |what: &str, p: &Path| {
        let what = format!("{what} {}", p.display());
        move |e| StartError::Io(what, e)
    };
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io("restricting", dir))?;
        }
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(file)
        .map_err(io("creating", file))?;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))
        .map_err(io("restricting", file))
}

async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| StartError::Io(format!("binding {what} listener {addr}"), e))
}

/// Opens the store, binds both listeners and starts serving (and probing, when configured:
/// on schedule when `probe_interval` is set, on demand whenever a router and probe tenants
/// are).
pub async fn start(
    cfg: &Config,
    tokens: Option<Arc<dyn TokenCounter>>,
) -> Result<Running, StartError> {
    if let Some(file) = cfg.sqlite_file() {
        private_sqlite(&file)?;
    }
    refuse_plaintext("gRPC", cfg.grpc_addr, &cfg.tls, cfg.insecure_internal)?;
    let store = Store::connect(&cfg.database_url).await?;
    let engine = Arc::new(Engine::new(store).await?);
    let recomputer = match &cfg.recompute {
        Some(settings) => Some(
            Recomputer::start(
                settings.clone(),
                engine.clone(),
                tokio::runtime::Handle::current(),
            )
            .map_err(|e| StartError::Recompute(format!("{e:#}")))?,
        ),
        None => None,
    };
    let shutdown = CancellationToken::new();
    let mut tasks = JoinSet::new();

    let grpc_listener = bind(cfg.grpc_addr, "gRPC").await?;
    let http_listener = bind(cfg.http_addr, "HTTP").await?;
    let grpc_addr = grpc_listener
        .local_addr()
        .map_err(|e| StartError::Io("gRPC local address".into(), e))?;
    let http_addr = http_listener
        .local_addr()
        .map_err(|e| StartError::Io("HTTP local address".into(), e))?;

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<AuditorServer<AuditorService>>().await;
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = cfg.tls.server_config() {
        server = server.tls_config(tls)?;
    }
    let grpc = server
        .layer(RequireRole::new(caller_policy, cfg.tls.is_mutual()))
        .add_service(health_service)
        .add_service(AuditorServer::new(
            AuditorService::new(engine.clone()).with_recompute(recomputer),
        ))
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(grpc_listener),
            shutdown.clone().cancelled_owned(),
        );
    tasks.spawn(async move {
        if let Err(e) = grpc.await {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    });

    let prober = match &cfg.router_url {
        Some(_) if cfg.probe_tenants.is_empty() => {
            tracing::warn!("router_url set but no probe tenants: probing is off");
            None
        }
        Some(router_url) => Some(Arc::new(Prober::new(
            engine.clone(),
            ProbeSettings {
                router_url: router_url.clone(),
                tenants: cfg.probe_tenants.clone(),
                max_tokens: cfg.probe_max_tokens,
                page_size: cfg.probe_page_size,
                latency: LatencyBounds {
                    pace_tokens_per_s: None,
                    floor_ttft_ms: cfg
                        .probe_max_ttft
                        .as_millis()
                        .try_into()
                        .unwrap_or(u64::MAX),
                    min_prefill_us_per_token: cfg.probe_min_prefill_us_per_token,
                },
                request_timeout: cfg.probe_request_timeout,
                tokens,
                side_channel: cfg.side_channel,
                receipt_key: cfg.receipt_public_key,
            },
        )?)),
        None => None,
    };
    if let (Some(prober), Some(every)) = (&prober, cfg.probe_interval) {
        let schedule = Schedule {
            every,
            sweep: cfg.probe_sweep,
        };
        tasks.spawn(
            prober
                .clone()
                .run_every(schedule, shutdown.clone().cancelled_owned()),
        );
    }

    if cfg.accounts.is_empty() {
        tracing::warn!(
            "no [[operators]] or [[api_tokens]] configured: nobody can use the web UI or the \
             JSON API"
        );
    }
    let edge = EdgeCounters::default();
    let app = web::router(AppState {
        engine: engine.clone(),
        auth: Arc::new(web::Auth::with_throttle(
            cfg.accounts.clone(),
            cfg.secure_cookies,
            cfg.sign_in,
        )),
        prober,
        edge: edge.clone(),
        receipt_key: cfg.receipt_public_key,
    });
    let stop = shutdown.clone();
    tasks.spawn(async move {
        let served = serve_edge(
            http_listener,
            app,
            EdgeLimits::default(),
            edge,
            stop.cancelled_owned(),
        )
        .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "HTTP server stopped");
        }
    });

    Ok(Running {
        http_addr,
        grpc_addr,
        engine,
        shutdown,
        tasks,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_sqlite_file_and_its_new_dir_are_private() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("data").join("auditor.sqlite");
        private_sqlite(&file).unwrap();
        assert_eq!(mode(file.parent().unwrap()), 0o700);
        assert_eq!(mode(&file), 0o600);
        // A file left world-readable by an older version is tightened.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        private_sqlite(&file).unwrap();
        assert_eq!(mode(&file), 0o600);
    }
}
