//! The app: one typed [`AppState`], the route table, the `Info` poller, and `serve` with an
//! injected shutdown future.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{any, delete, get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use pagewarden_common::edge::{serve_edge, EdgeLimits};
use pagewarden_common::receipt::ReceiptKeyError;

use crate::access;
use crate::config::{ModelSource, RouterConfig};
use crate::disagg::{Disagg, GrpcDisagg};
use crate::dispatch::DispatchConfig;
use crate::erasure;
use crate::error::{Half, RouterError};
use crate::frontend::{Frontend, FrontendError};
use crate::handlers;
use crate::metrics::{Metrics, RoleLabels};
use crate::receipt::Receipts;
use crate::record::TenantSlots;
use crate::sample::SampleSink;
use crate::tenants::{require_tenant, Tenants, TenantsError};
use crate::token_rate::TokenRates;
use crate::tokenize;
use crate::workers::{Links, PoolError, WorkerPool};
use pagewarden_common::tenants::Rate;

/// Runtime settings the handlers read.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Largest accepted body (413 above).
    pub max_body_bytes: usize,
    /// Concurrent generation requests (429 above).
    pub max_concurrency: usize,
    /// One tenant's concurrent generation requests when its entry sets none (429 above).
    pub tenant_max_concurrency: Option<usize>,
    /// Deadlines for dispatch.
    pub dispatch: DispatchConfig,
    /// How often every worker's `Info` is polled.
    pub info_interval: Duration,
    /// The share of requests sent to the recompute audit, for tenants that set none.
    pub recompute_rate: Rate,
}

/// Everything a handler needs, cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Settings.
    pub settings: Settings,
    /// API keys → tenants.
    pub tenants: Arc<Tenants>,
    /// Tokenizer and chat template.
    pub frontend: Arc<Frontend>,
    /// Workers (their liveness, for health and metrics).
    pub pool: Arc<WorkerPool>,
    /// Where requests are served: the workers over gRPC, or a test's own.
    pub disagg: Arc<dyn Disagg>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The concurrency limit.
    pub limiter: Arc<Semaphore>,
    /// Each tenant's requests in flight (its own limit).
    pub tenant_slots: Arc<TenantSlots>,
    /// Each tenant's tokens per minute.
    pub token_rates: Arc<TokenRates>,
    /// The auditor's sampling hook.
    pub sink: Arc<dyn SampleSink>,
    /// The receipt signing key, when the operator gave one.
    pub receipts: Option<Arc<Receipts>>,
}

/// Why the router could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Tenants file.
    #[error(transparent)]
    Tenants(#[from] TenantsError),
    /// Model file.
    #[error(transparent)]
    Frontend(#[from] FrontendError),
    /// Worker URLs.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The receipt signing key.
    #[error(transparent)]
    ReceiptKey(#[from] ReceiptKeyError),
}

impl AppState {
    /// Builds the state from parts (tests pass their own frontend).
    pub fn new(
        settings: Settings,
        tenants: Tenants,
        frontend: Frontend,
        pool: WorkerPool,
        sink: Arc<dyn SampleSink>,
    ) -> Self {
        let metrics = Arc::new(Metrics::new(frontend.model_name()));
        let pool = Arc::new(pool);
        let disagg = Arc::new(GrpcDisagg::new(
            pool.clone(),
            settings.dispatch,
            metrics.clone(),
        ));
        Self {
            settings,
            tenants: Arc::new(tenants),
            frontend: Arc::new(frontend),
            pool,
            disagg,
            metrics,
            limiter: Arc::new(Semaphore::new(settings.max_concurrency)),
            tenant_slots: Arc::default(),
            token_rates: Arc::default(),
            sink,
            receipts: None,
        }
    }

    /// The same state signing isolation receipts with `receipts`.
    pub fn with_receipts(self, receipts: Receipts) -> Self {
        Self {
            receipts: Some(Arc::new(receipts)),
            ..self
        }
    }

    /// The same state serving requests through `disagg` instead of the workers.
    pub fn with_disagg(self, disagg: Arc<dyn Disagg>) -> Self {
        Self { disagg, ..self }
    }

    /// Loads tenants, the model's text side and the worker list from a resolved config.
    pub fn from_config(cfg: &RouterConfig, sink: Arc<dyn SampleSink>) -> Result<Self, StartError> {
        let tenants = Tenants::load(cfg.tenants.clone())?;
        let frontend = match &cfg.model {
            ModelSource::File(path) => Frontend::load(path, cfg.served_model_name.clone())?,
            ModelSource::TinyTest(seed) => Frontend::tiny(
                *seed,
                cfg.served_model_name
                    .clone()
                    .unwrap_or_else(|| "tiny".into()),
            )?,
        };
        let pool = WorkerPool::new(
            &cfg.decode,
            &cfg.prefill,
            Links {
                connect_timeout: cfg.connect_timeout,
                keepalive: cfg.worker_keepalive,
            },
            cfg.info_timeout,
        )?;
        let state = Self::new(cfg.settings(), tenants, frontend, pool, sink);
        Ok(match &cfg.receipt_key {
            Some(path) => state.with_receipts(Receipts::load(path)?),
            None => state,
        })
    }

    /// Polls every worker once and updates the worker gauges.
    pub async fn refresh_workers(&self) {
        self.pool.refresh().await;
        for half in [Half::Decode, Half::Prefill] {
            self.metrics
                .live_workers
                .get_or_create(&RoleLabels {
                    role: half.as_str(),
                })
                .set(self.pool.live_count(half) as i64);
        }
        self.metrics
            .effective_context
            .set(self.pool.effective_context().map_or(0, i64::from));
    }
}

/// The route table.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/models", get(handlers::models))
        .route("/v1/cache", delete(erasure::erase_cache))
        .route("/v1/models/{*id}", get(handlers::model))
        .route("/v1/embeddings", any(handlers::embeddings))
        .route("/v1/responses", any(handlers::responses))
        .route("/v1/responses/{*rest}", any(handlers::responses))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/tokenizer_info", get(tokenize::tokenizer_info))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_tenant,
        ));
    Router::new()
        .merge(v1)
        .route("/health", get(handlers::health))
        .route("/ready", get(handlers::health))
        .route("/live", get(handlers::live))
        .route("/version", get(tokenize::version))
        .route("/metrics", get(handlers::metrics))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            RouterError::MethodNotAllowed(method.to_string())
        })
        .layer(DefaultBodyLimit::max(state.settings.max_body_bytes))
        .layer(axum::middleware::from_fn(access::access))
        .with_state(state)
}

/// Serves until `shutdown` resolves, under the default [`EdgeLimits`].
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, state, EdgeLimits::default(), shutdown).await
}

/// Serves until `shutdown` resolves, under the edge's deadlines and connection caps. Polls
/// workers once before accepting requests, then every `info_interval` in the background.
pub async fn serve_with(
    listener: TcpListener,
    state: AppState,
    limits: EdgeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    state.refresh_workers().await;
    let poller = {
        let state = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(state.settings.info_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                state.refresh_workers().await;
            }
        })
    };
    let counters = state.metrics.edge.clone();
    let result = serve_edge(listener, router(state), limits, counters, shutdown).await;
    poller.abort();
    result
}
