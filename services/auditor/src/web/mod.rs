//! The operators' web UI and the JSON API behind it, plus `/metrics` and `/health`.
//!
//! - `api`: JSON endpoints (`/api/...`).
//! - `pages`: server-rendered HTML pages.
//! - `html`: layout, escaping and small rendering helpers.
//! - `chart`: the integrity-counters SVG chart.

mod api;
mod chart;
mod html;
mod pages;

use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::domain::{IncidentKind, IncidentStatus};
use crate::engine::Engine;
use crate::store::{IncidentFilter, StoreError};

/// State shared by every handler.
#[derive(Clone)]
pub struct AppState {
    /// The engine behind the pages.
    pub engine: Arc<Engine>,
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
            WebError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            WebError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        };
        let body = json!({"error": {"message": self.to_string(), "type": code, "code": code}});
        (status, Json(body)).into_response()
    }
}

/// Incident list filters as they arrive in a query string; empty means "any".
#[derive(Debug, Default, Deserialize)]
pub struct FilterQuery {
    status: Option<String>,
    kind: Option<String>,
    tenant: Option<String>,
    limit: Option<i64>,
}

impl FilterQuery {
    fn parse(&self) -> Result<IncidentFilter, WebError> {
        fn some(v: &Option<String>) -> Option<&str> {
            v.as_deref().map(str::trim).filter(|s| !s.is_empty())
        }
        Ok(IncidentFilter {
            status: some(&self.status)
                .map(|s| s.parse::<IncidentStatus>())
                .transpose()
                .map_err(|e| WebError::BadRequest(e.to_string()))?,
            kind: some(&self.kind)
                .map(|s| s.parse::<IncidentKind>())
                .transpose()
                .map_err(|e| WebError::BadRequest(e.to_string()))?,
            tenant: some(&self.tenant).map(str::to_string),
            limit: self.limit.map(|l| l.clamp(1, 1000)),
        })
    }
}

/// Who acknowledges or resolves, and why (JSON body or form).
#[derive(Debug, Deserialize)]
pub struct SignoffForm {
    /// Operator name.
    pub by: String,
    /// Free-form note.
    #[serde(default)]
    pub note: String,
}

impl SignoffForm {
    fn by(&self) -> Result<&str, WebError> {
        let by = self.by.trim();
        if by.is_empty() {
            return Err(WebError::BadRequest(
                "`by` (operator name) is required".into(),
            ));
        }
        Ok(by)
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

/// Every route of the auditor's HTTP listener.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(pages::index))
        .route("/incidents", get(pages::incidents))
        .route("/incidents/{id}", get(pages::incident))
        .route("/incidents/{id}/ack", post(pages::ack))
        .route("/incidents/{id}/resolve", post(pages::resolve))
        .route("/nodes", get(pages::nodes))
        .route("/probes", get(pages::probes))
        .route("/integrity", get(pages::integrity))
        .route("/api/incidents", get(api::incidents))
        .route("/api/incidents/{id}", get(api::incident))
        .route("/api/incidents/{id}/ack", post(api::ack))
        .route("/api/incidents/{id}/resolve", post(api::resolve))
        .route("/api/nodes", get(api::nodes))
        .route("/api/probes", get(api::probes))
        .route("/api/integrity/series", get(api::series))
        .route("/api/summary", get(api::summary))
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/ready", get(health))
        .route("/live", get(live))
        .with_state(state)
}
