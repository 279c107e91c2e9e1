//! JSON API: one endpoint behind every page.

use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

use super::session::sign_off_as;
use super::{AppState, FilterQuery, SignoffAction, WebError};
use crate::accounts::Principal;
use crate::domain::{IncidentId, UnixMs};
use crate::store::{Incident, NodeStatus, ProbeResult, ProbeRun, SampleTotals, SeriesPoint};

/// `GET /api/incidents?status=&kind=&tenant=&limit=`
pub async fn incidents(
    State(st): State<AppState>,
    Query(q): Query<FilterQuery>,
) -> Result<Json<Vec<Incident>>, WebError> {
    Ok(Json(st.engine.store().incidents(&q.parse()?).await?))
}

/// `GET /api/incidents/{id}`
pub async fn incident(
    State(st): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<Incident>, WebError> {
    st.engine
        .store()
        .incident(IncidentId(id))
        .await?
        .map(Json)
        .ok_or_else(|| WebError::NotFound(format!("incident {id} not found")))
}

/// The body of an acknowledgement or resolution; who acts is the bearer token's name.
#[derive(Debug, Default, Deserialize)]
pub struct SignoffNote {
    /// Free-form note.
    #[serde(default)]
    pub note: String,
}

/// `POST /api/incidents/{id}/ack` and `/resolve` with `{"note": ...}` (operator tokens only).
pub async fn sign_off(
    State(st): State<AppState>,
    Extension(who): Extension<Principal>,
    Path((id, action)): Path<(i64, String)>,
    Json(f): Json<SignoffNote>,
) -> Result<Json<Incident>, WebError> {
    let by = sign_off_as(&who)?;
    let action: SignoffAction = action.parse()?;
    Ok(Json(action.apply(&st, IncidentId(id), by, &f.note).await?))
}

/// `GET /api/nodes`
pub async fn nodes(State(st): State<AppState>) -> Result<Json<Vec<NodeStatus>>, WebError> {
    Ok(Json(st.engine.store().nodes().await?))
}

/// A run with its steps.
#[derive(Serialize)]
pub struct RunWithResults {
    /// The run.
    #[serde(flatten)]
    pub run: ProbeRun,
    /// Its steps.
    pub results: Vec<ProbeResult>,
}

/// `?limit=` for list endpoints.
#[derive(Deserialize)]
pub struct LimitQuery {
    limit: Option<i64>,
}

/// The newest runs with their steps.
pub async fn load_runs(st: &AppState, limit: i64) -> Result<Vec<RunWithResults>, WebError> {
    let mut out = Vec::new();
    for run in st.engine.store().probe_runs(limit).await? {
        let results = st.engine.store().probe_results(run.id).await?;
        out.push(RunWithResults { run, results });
    }
    Ok(out)
}

/// `GET /api/probes?limit=`
pub async fn probes(
    State(st): State<AppState>,
    Query(q): Query<LimitQuery>,
) -> Result<Json<Vec<RunWithResults>>, WebError> {
    Ok(Json(
        load_runs(&st, q.limit.unwrap_or(20).clamp(1, 200)).await?,
    ))
}

/// `?window_s=&bucket_s=` for the series.
#[derive(Deserialize)]
pub struct SeriesQuery {
    /// How far back, seconds (default 3600).
    pub window_s: Option<i64>,
    /// Bucket width, seconds (default 60).
    pub bucket_s: Option<i64>,
}

impl SeriesQuery {
    /// (since, bucket_ms) with defaults and bounds applied.
    pub fn resolve(&self) -> (UnixMs, i64) {
        let window = self.window_s.unwrap_or(3600).clamp(60, 30 * 86400);
        let bucket = self.bucket_s.unwrap_or(60).clamp(1, 86400);
        (UnixMs(UnixMs::now().0 - window * 1000), bucket * 1000)
    }
}

/// `GET /api/integrity/series?window_s=&bucket_s=`
pub async fn series(
    State(st): State<AppState>,
    Query(q): Query<SeriesQuery>,
) -> Result<Json<Vec<SeriesPoint>>, WebError> {
    let (since, bucket) = q.resolve();
    Ok(Json(
        st.engine.store().integrity_series(since, bucket).await?,
    ))
}

/// Totals for the dashboard header.
#[derive(Serialize)]
pub struct Summary {
    /// Incidents per status.
    pub incidents: Vec<(String, i64)>,
    /// Sample totals.
    pub samples: SampleTotals,
}

/// `GET /api/summary`
pub async fn summary(State(st): State<AppState>) -> Result<Json<Summary>, WebError> {
    let store = st.engine.store();
    Ok(Json(Summary {
        incidents: store
            .incident_counts()
            .await?
            .into_iter()
            .map(|(s, n)| (s.to_string(), n))
            .collect(),
        samples: store.sample_totals().await?,
    }))
}
