//! The operators' web UI and the JSON API behind it, plus `/metrics` and `/health`.
//! Pages need a signed-in session, the API a bearer token; `/login`, `/metrics` and `/health`
//! are open (see `session` for every check). Every error is JSON (plain-text rejections of
//! axum's extractors are turned into the same shape) or, on the browser's pages, HTML.
//!
//! - `api`: JSON endpoints (`/api/...`).
//! - `incident_pages`: the incident list and detail pages, and their form posts.
//! - `incident_guide`: what each incident kind means and the operator's next step.
//! - `overview`: the home page, the suite at a glance over a chosen range.
//! - `pages`: the other server-rendered pages (nodes, probes, charts over time).
//! - `query`: the incident list's query string (filters, page tags, paging).
//! - `refresh`: pages that reload themselves, and the script that does it.
//! - `login`: signing in and out (a `next` only of this site).
//! - `throttle`: sign-in back-off per client address and per account name.
//! - `session`: sessions, CSRF, same-origin posts, bearer tokens, roles.
//! - `html`: layout and small rendering helpers, as `maud` markup (which escapes every value).
//! - `axis`: round ticks and labels of the charts' value axes.
//! - `chart`: counts over time as stacked-bar SVG (incidents, integrity events).
//! - `scatter`: first-token latency against prompt length as SVG (probe steps, sampled traffic).
//! - `isolation_chart`: the side-channel audit's p-values over time as SVG, per worker.
//! - `tenants_page`: isolation per tenant (cache, recomputes, erasures) and per worker.

mod api;
mod axis;
mod chart;
mod html;
mod incident_guide;
mod incident_pages;
mod isolation_chart;
mod login;
mod overview;
mod pager;
mod pages;
mod query;
mod refresh;
mod scatter;
pub mod session;
mod tenants_page;
pub mod throttle;

use std::sync::Arc;

use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pagewarden_common::edge::EdgeCounters;
use pagewarden_common::receipt::PublicKey;
use serde_json::json;

use crate::domain::{IncidentId, UnixMs};
use crate::engine::Engine;
use crate::probe::Prober;
use crate::store::{Incident, StoreError};

pub use session::Auth;

/// State shared by every handler.
#[derive(Clone)]
pub struct AppState {
    /// The engine behind the pages.
    pub engine: Arc<Engine>,
    /// Accounts and sessions.
    pub auth: Arc<Auth>,
    /// The prober, for runs on demand; `None` when probing is not configured.
    pub prober: Option<Arc<Prober>>,
    /// The HTTP edge's counts of refused and closed connections.
    pub edge: EdgeCounters,
    /// The routers' receipt verification key, served to anyone.
    pub receipt_key: Option<PublicKey>,
}

/// The one error type of the HTTP layer, mapped once to a status and an OpenAI-shaped body.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    /// The thing asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// Nobody is signed in, or the token is missing or unknown.
    #[error("{0}")]
    Unauthorized(String),
    /// The caller may not do this (role, CSRF token, cross-origin post).
    #[error("{0}")]
    Forbidden(String),
    /// The request conflicts with the current state (e.g. resolving a resolved incident).
    #[error("{0}")]
    Conflict(String),
    /// The store failed.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StoreError> for WebError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(_) => WebError::NotFound(e.to_string()),
            StoreError::InvalidTransition { .. } | StoreError::Conflict(_) => {
                WebError::Conflict(e.to_string())
            }
            StoreError::UnsupportedUrl(_)
            | StoreError::Sqlx(_)
            | StoreError::Migrate(_)
            | StoreError::Corrupt(_) => WebError::Internal(e.to_string()),
        }
    }
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let (status, code) = match &self {
            WebError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            WebError::BadRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            WebError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            WebError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            WebError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            WebError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        };
        let body = json!({"error": {"message": self.to_string(), "type": code, "code": code}});
        (status, Json(body)).into_response()
    }
}

/// Turns a plain-text error (an extractor's rejection: a bad form, query or path) into the
/// JSON error shape every other error has; HTML pages and JSON bodies pass as they are.
async fn errors_as_json(r: Response) -> Response {
    let status = r.status();
    let plain = r
        .headers()
        .get(header::CONTENT_TYPE)
        .is_none_or(|v| v.as_bytes().starts_with(b"text/plain"));
    if !(status.is_client_error() || status.is_server_error()) || !plain {
        return r;
    }
    let (mut parts, body) = r.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .unwrap_or_default();
    let code = match status {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::TOO_MANY_REQUESTS => "rate_limited",
        s if s.is_server_error() => "internal_error",
        _ => "invalid_request",
    };
    let message = String::from_utf8_lossy(&text).trim().to_string();
    let body = json!({"error": {"message": message, "type": code, "code": code}});
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, axum::body::Body::from(body.to_string()))
}

/// What an operator does to an incident, named by the last path segment (`ack`, `resolve`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignoffAction {
    /// `open → acknowledged`.
    Acknowledge,
    /// `open | acknowledged → resolved`.
    Resolve,
}

impl std::str::FromStr for SignoffAction {
    type Err = WebError;

    fn from_str(s: &str) -> Result<Self, WebError> {
        match s {
            "ack" => Ok(Self::Acknowledge),
            "resolve" => Ok(Self::Resolve),
            other => Err(WebError::NotFound(format!("no incident action {other:?}"))),
        }
    }
}

impl SignoffAction {
    /// Records the action on incident `id` as done by `by` now.
    async fn apply(
        self,
        st: &AppState,
        id: IncidentId,
        by: &str,
        note: &str,
    ) -> Result<Incident, WebError> {
        let store = st.engine.store();
        let now = UnixMs::now();
        let done = match self {
            Self::Acknowledge => store.acknowledge(id, by, note, now).await?,
            Self::Resolve => store.resolve(id, by, note, now).await?,
        };
        tracing::info!(incident = id.0, by, action = ?self, "incident signed off");
        Ok(done)
    }
}

async fn metrics(axum::extract::State(st): axum::extract::State<AppState>) -> Response {
    let mut out = String::new();
    st.engine.metrics().render(&mut out);
    if let Ok(counts) = st.engine.store().incident_counts().await {
        let name = "pagewarden_auditor_incidents";
        out.push_str(&format!(
            "# HELP {name} Incidents by status\n# TYPE {name} gauge\n"
        ));
        for (s, n) in counts {
            out.push_str(&format!("{name}{{status=\"{s}\"}} {n}\n"));
        }
    }
    out.push_str(&st.edge.render_text("pagewarden_auditor_http"));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// Liveness and readiness in one: 200 `ok` while the database answers within a few seconds,
/// else 503 naming the failure (an auditor that cannot store incidents is not healthy).
async fn health(axum::extract::State(st): axum::extract::State<AppState>) -> Response {
    let ping = tokio::time::timeout(std::time::Duration::from_secs(3), st.engine.store().ping());
    match ping.await {
        Ok(Ok(())) => (StatusCode::OK, "ok").into_response(),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("database unavailable: {e}"),
        )
            .into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "database unavailable: no answer within 3 s",
        )
            .into_response(),
    }
}

/// Liveness: the process serves HTTP (its database may be down; `/ready` says).
async fn live() -> &'static str {
    "ok"
}

/// The routers' receipt verification key, unauthenticated (a public key): `{alg, key_id,
/// public_key}`; 404 when this deployment signs no receipts.
async fn receipt_key(axum::extract::State(st): axum::extract::State<AppState>) -> Response {
    match st.receipt_key {
        Some(k) => Json(json!({
            "alg": "ed25519",
            "key_id": k.key_id(),
            "public_key": k.to_string(),
        }))
        .into_response(),
        None => WebError::NotFound(
            "this deployment signs no isolation receipts (no receipt_public_key)".into(),
        )
        .into_response(),
    }
}

/// Every route of the auditor's HTTP listener.
pub fn router(state: AppState) -> Router {
    let pages = Router::new()
        .route("/", get(pages::index))
        .route("/incidents", get(incident_pages::incidents))
        .route("/incidents/{id}", get(incident_pages::incident))
        .route("/incidents/{id}/{action}", post(incident_pages::sign_off))
        .route("/overview", get(overview::overview))
        .route("/nodes", get(pages::nodes))
        .route("/probes", get(pages::probes))
        .route("/probes/run", post(pages::run_probe))
        .route("/probes/runs/{id}", get(pages::probe_run))
        .route("/tenants", get(tenants_page::tenants))
        .route("/integrity", get(pages::integrity))
        .route("/logout", post(login::logout))
        .route_layer(from_fn_with_state(state.clone(), session::require_session));
    let api = Router::new()
        .route("/api/incidents", get(api::incidents))
        .route("/api/incidents/series", get(api::incident_series))
        .route("/api/incidents/{id}", get(api::incident))
        .route("/api/incidents/{id}/{action}", post(api::sign_off))
        .route("/api/nodes", get(api::nodes))
        .route("/api/cache", get(api::cache))
        .route("/api/erasures", get(api::erasures))
        .route("/api/recomputes", get(api::recomputes))
        .route("/api/isolation", get(api::isolation))
        .route("/api/probes", get(api::probes))
        .route("/api/probes/recent", get(api::recent_probe_steps))
        .route("/api/probes/run", post(api::run_probe))
        .route("/api/probes/runs/{id}", get(api::probe_run))
        .route("/api/samples/recent", get(api::recent_samples))
        .route("/api/integrity/series", get(api::series))
        .route("/api/summary", get(api::summary))
        .route_layer(from_fn_with_state(state.clone(), session::require_bearer));
    Router::new()
        .merge(pages)
        .merge(api)
        .route("/login", get(login::login_page).post(login::login))
        .route(refresh::SCRIPT_PATH, get(refresh::script))
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/ready", get(health))
        .route("/live", get(live))
        .route("/api/receipt-key", get(receipt_key))
        .layer(from_fn(session::same_origin_posts))
        .layer(axum::middleware::map_response(errors_as_json))
        // No page of the auditor may be framed by another site (clickjacking), and no script
        // runs but the auditor's own files (the pages have no inline script).
        .layer(axum::middleware::map_response(
            |mut r: Response| async move {
                let h = r.headers_mut();
                h.insert("x-frame-options", HeaderValue::from_static("DENY"));
                h.insert(
                    "content-security-policy",
                    HeaderValue::from_static("frame-ancestors 'none'; script-src 'self'"),
                );
                r
            },
        ))
        .with_state(state)
}
