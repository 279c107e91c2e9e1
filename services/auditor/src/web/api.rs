//! JSON API: one endpoint behind every page.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

use super::query::IncidentQuery;
use super::session::{operator_as, sign_off_as};
use super::{AppState, SignoffAction, WebError};
use crate::accounts::Principal;
use crate::domain::{IncidentId, ProbeRunId, SweepKind, UnixMs};
use crate::store::{
    CacheTotals, ErasureRecord, Incident, IncidentPoint, IsolationAudit, NodeStatus, ProbeResult,
    ProbeRun, RecomputeRecord, RoutineCount, SamplePoint, SampleTotals, SeriesPoint,
};

/// How far back the prompt-length charts (probe steps, sampled traffic) look.
pub const PROBE_CHART_WINDOW_MS: i64 = 24 * 3600 * 1000;
/// The most dots a prompt-length chart draws.
pub const PROBE_CHART_STEPS: i64 = 2000;

/// `GET /api/incidents?status=&kind=&tenant=&node=&page=&generation=&page_no=&limit=`: one
/// page of the list, newest first; `x-total-count` says how many match in all.
pub async fn incidents(
    State(st): State<AppState>,
    Query(q): Query<IncidentQuery>,
) -> Result<Response, WebError> {
    let view = q.parse()?;
    let store = st.engine.store();
    let list = store.incidents(&view.filter, view.window()).await?;
    let total = store.incident_total(&view.filter).await?;
    let mut resp = Json(list).into_response();
    resp.headers_mut().insert(
        HeaderName::from_static("x-total-count"),
        HeaderValue::from(total),
    );
    Ok(resp)
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

/// Prefix-cache events per role and tenant (the workers' hits, misses and evictions).
pub async fn cache(State(st): State<AppState>) -> Result<Json<Vec<CacheTotals>>, WebError> {
    Ok(Json(st.engine.store().cache_totals().await?))
}

/// `GET /api/erasures?limit=`: the newest tenants' prefix-cache erasures (default 50, at most
/// 500), each with its certificate: per-worker counts and digests.
pub async fn erasures(
    State(st): State<AppState>,
    Query(q): Query<LimitQuery>,
) -> Result<Json<Vec<ErasureRecord>>, WebError> {
    let limit = q.limit.unwrap_or(50).clamp(1, 500);
    Ok(Json(st.engine.store().erasures(limit).await?))
}

/// `GET /api/recomputes?limit=`: the newest recompute audits (default 50, at most 500): the
/// request, digests of its tokens, the verdict and the largest logprob difference.
pub async fn recomputes(
    State(st): State<AppState>,
    Query(q): Query<LimitQuery>,
) -> Result<Json<Vec<RecomputeRecord>>, WebError> {
    let limit = q.limit.unwrap_or(50).clamp(1, 500);
    Ok(Json(st.engine.store().recomputes(limit).await?))
}

/// `GET /api/isolation?limit=`: the side-channel audit's newest verdicts of the last 24 h
/// (default 200, at most 2000), oldest first: per worker and channel, the p-value, its
/// threshold, whether it was conclusive and whether it found a leak.
pub async fn isolation(
    State(st): State<AppState>,
    Query(q): Query<LimitQuery>,
) -> Result<Json<Vec<IsolationAudit>>, WebError> {
    let limit = q.limit.unwrap_or(200).clamp(1, 2000);
    let since = UnixMs(UnixMs::now().0 - PROBE_CHART_WINDOW_MS);
    Ok(Json(
        st.engine.store().isolation_audits(since, limit).await?,
    ))
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

/// `GET /api/probes/runs/{id}`: one run with its steps.
pub async fn probe_run(
    State(st): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<RunWithResults>, WebError> {
    let id = ProbeRunId(id);
    let run = st
        .engine
        .store()
        .probe_run(id)
        .await?
        .ok_or_else(|| WebError::NotFound(format!("no probe run {}", id.0)))?;
    let results = st.engine.store().probe_results(id).await?;
    Ok(Json(RunWithResults { run, results }))
}

/// `?window_s=&bucket_s=` for the series, as text so a bad value is a 400 naming it.
#[derive(Deserialize)]
pub struct SeriesQuery {
    /// How far back, seconds (default 3600, 60 to 30 days).
    pub window_s: Option<String>,
    /// Bucket width, seconds (default 60, 1 to a day).
    pub bucket_s: Option<String>,
}

/// The most buckets one chart may have.
const MAX_BUCKETS: i64 = 10_000;

fn seconds(
    name: &str,
    v: &Option<String>,
    default: i64,
    lo: i64,
    hi: i64,
) -> Result<i64, WebError> {
    let Some(s) = v.as_deref().map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(default);
    };
    match s.parse::<i64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(WebError::BadRequest(format!(
            "{name} must be a whole number of seconds from {lo} to {hi}, not {s:?}"
        ))),
    }
}

impl SeriesQuery {
    /// (since, bucket_ms), or a 400 for a value out of range or too many buckets.
    pub fn resolve(&self) -> Result<(UnixMs, i64), WebError> {
        let window = seconds("window_s", &self.window_s, 3600, 60, 30 * 86400)?;
        let bucket = seconds("bucket_s", &self.bucket_s, 60, 1, 86400)?;
        if window / bucket > MAX_BUCKETS {
            return Err(WebError::BadRequest(format!(
                "window_s / bucket_s is {} buckets; at most {MAX_BUCKETS}",
                window / bucket
            )));
        }
        Ok((UnixMs(UnixMs::now().0 - window * 1000), bucket * 1000))
    }
}

/// `GET /api/integrity/series?window_s=&bucket_s=`
pub async fn series(
    State(st): State<AppState>,
    Query(q): Query<SeriesQuery>,
) -> Result<Json<Vec<SeriesPoint>>, WebError> {
    let (since, bucket) = q.resolve()?;
    Ok(Json(
        st.engine.store().integrity_series(since, bucket).await?,
    ))
}

/// `GET /api/incidents/series?window_s=&bucket_s=`: incidents opened, per severity.
pub async fn incident_series(
    State(st): State<AppState>,
    Query(q): Query<SeriesQuery>,
) -> Result<Json<Vec<IncidentPoint>>, WebError> {
    let (since, bucket) = q.resolve()?;
    Ok(Json(
        st.engine.store().incident_series(since, bucket).await?,
    ))
}

/// `GET /api/probes/recent`: the steps the prompt-length chart draws, newest first.
pub async fn recent_probe_steps(
    State(st): State<AppState>,
) -> Result<Json<Vec<ProbeResult>>, WebError> {
    let since = UnixMs(UnixMs::now().0 - PROBE_CHART_WINDOW_MS);
    Ok(Json(
        st.engine
            .store()
            .recent_probe_results(since, PROBE_CHART_STEPS)
            .await?,
    ))
}

/// `GET /api/samples/recent`: the sampled requests the traffic chart draws, newest first.
pub async fn recent_samples(
    State(st): State<AppState>,
) -> Result<Json<Vec<SamplePoint>>, WebError> {
    let since = UnixMs(UnixMs::now().0 - PROBE_CHART_WINDOW_MS);
    Ok(Json(
        st.engine
            .store()
            .recent_samples(since, PROBE_CHART_STEPS)
            .await?,
    ))
}

/// Starts a probe run of `sweep` in the background for `by`: 409 when probing is off or a run
/// is under way.
pub fn start_sweep(st: &AppState, sweep: SweepKind, by: &str) -> Result<(), WebError> {
    let prober = st.prober.as_ref().ok_or_else(|| {
        WebError::Conflict("probing is off: the auditor has no router_url or probe tenants".into())
    })?;
    prober
        .start(sweep)
        .map_err(|e| WebError::Conflict(e.to_string()))?;
    tracing::info!(%sweep, by, "probe run started on demand");
    Ok(())
}

/// The body of an on-demand run.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepRequest {
    /// `light` or `full`.
    pub sweep: SweepKind,
}

/// `POST /api/probes/run` with `{"sweep": "light" | "full"}` (operator tokens only): 202 once
/// the run has started in the background; its steps appear under `/api/probes`.
pub async fn run_probe(
    State(st): State<AppState>,
    Extension(who): Extension<Principal>,
    Json(r): Json<SweepRequest>,
) -> Result<Response, WebError> {
    let by = operator_as(&who, "start probe runs")?;
    start_sweep(&st, r.sweep, by)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "started": r.sweep })),
    )
        .into_response())
}

/// Totals for the dashboard header.
#[derive(Serialize)]
pub struct Summary {
    /// Incidents per status.
    pub incidents: Vec<(String, i64)>,
    /// Sample totals.
    pub samples: SampleTotals,
    /// Routine integrity events counted (no incident), per kind.
    pub routine: Vec<RoutineCount>,
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
        routine: store.routine_counts().await?,
    }))
}
