//! Server-rendered pages besides the incident pages (`incident_pages`): nodes, probes (with
//! the prompt-length chart, on-demand sweeps and the run history a page at a time), one probe
//! run, and the charts over time. Each reads the same store calls as its JSON twin in `api`.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use maud::{html, Markup};
use serde::Deserialize;

use super::api::{start_sweep, SeriesQuery, PROBE_CHART_STEPS, PROBE_CHART_WINDOW_MS};
use super::html::{csrf_input, dash_or, ok_class, page, time};
use super::pager::pager;
use super::query::number;
use super::session::SessionUser;
use super::{chart, isolation_chart, refresh, scatter, AppState, WebError};
use crate::domain::{ProbeRunId, ProbeRunStatus, SweepKind, UnixMs};
use crate::store::{ProbeResult, Window};

/// `GET /`: the overview.
pub async fn index() -> Redirect {
    Redirect::to("/overview")
}

/// `GET /nodes`
pub async fn nodes(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
) -> Result<Markup, WebError> {
    let nodes = st.engine.store().nodes().await?;
    let body = html! {
        table id="nodes" {
            tr {
                th { "node" } th { "role" } th { "pool tokens" } th { "context" }
                th { "pool ≥ context" } th { "preflight" } th { "last report (UTC)" }
                th { "reports" } th { "message" }
            }
            @for n in &nodes {
                @let p = &n.last;
                @let fits = p.pool_tokens >= p.context_length;
                tr {
                    td { (p.node) } td { (p.role) } td { (p.pool_tokens) } td { (p.context_length) }
                    td class=(ok_class(fits)) { @if fits { "yes" } @else { "NO" } }
                    td class=(ok_class(p.ok)) { @if p.ok { "ok" } @else { "FAILED" } }
                    td { (time(p.at)) } td { (n.reports) } td { (p.message) }
                }
            }
        }
        @if nodes.is_empty() { p { "No preflight reports yet." } }
    };
    Ok(page("Nodes", "/nodes", Some(&user), body))
}

/// The on-demand sweep buttons (operators only), or why there are none.
fn sweep_forms(st: &AppState, user: &SessionUser) -> Markup {
    let form = |sweep: SweepKind, label: &str| {
        html! {
            form class="inline" method="post" action="/probes/run" {
                (csrf_input(user))
                input type="hidden" name="sweep" value=(sweep);
                button type="submit" id={ "run-" (sweep) } { (label) }
            }
        }
    };
    html! {
        @if st.prober.is_none() {
            p id="probing-off" class="muted" {
                "Probing is off: the auditor has no router_url or no probe tenants."
            }
        } @else if user.who.role.may_sign_off() {
            p id="sweeps" {
                (form(SweepKind::Light, "Run a light sweep now")) " "
                (form(SweepKind::Full, "Run a full sweep now")) " "
                span class="muted" {
                    "light: per probe tenant one short prompt and one just past the context; \
                     full: lengths doubling up to the context, then past it."
                }
            }
        }
    }
}

/// Runs listed per page of the run history.
pub const RUNS_PER_PAGE: i64 = 20;

/// The page of one probe run.
pub fn run_href(id: ProbeRunId) -> String {
    format!("/probes/runs/{}", id.0)
}

/// `?refresh=&runs_page=` of the probe page.
#[derive(Debug, Default, Deserialize)]
pub struct ProbesQuery {
    #[serde(flatten)]
    refresh: refresh::RefreshQuery,
    runs_page: Option<String>,
}

/// `GET /probes?refresh=&runs_page=`: the charts, then the run history a page at a time (each
/// run's steps on its own page, `/probes/runs/{id}`).
pub async fn probes(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Query(q): Query<ProbesQuery>,
) -> Result<Markup, WebError> {
    let refresh_s = q.refresh.seconds()?;
    let runs_page = number("runs_page", &q.runs_page, 1, i64::MAX / RUNS_PER_PAGE)?.unwrap_or(1);
    let store = st.engine.store();
    let total = store.probe_run_count().await?;
    let runs = store
        .probe_runs_in(Window {
            limit: RUNS_PER_PAGE,
            offset: (runs_page - 1) * RUNS_PER_PAGE,
        })
        .await?;
    let since = UnixMs(UnixMs::now().0 - PROBE_CHART_WINDOW_MS);
    let recent = store.recent_probe_results(since, PROBE_CHART_STEPS).await?;
    let traffic = store.recent_samples(since, PROBE_CHART_STEPS).await?;
    let audits = store.isolation_audits(since, PROBE_CHART_STEPS).await?;
    let limit = match runs.iter().find_map(|r| r.context_limit) {
        Some(l) => Some(l),
        None => store
            .probe_runs(RUNS_PER_PAGE)
            .await?
            .iter()
            .find_map(|r| r.context_limit),
    };
    let body = html! {
        (sweep_forms(&st, &user))
        (refresh::marker(refresh_s, "/probes?refresh=0", "/probes"))
        h2 { "Outcome and first-token latency against prompt length" }
        p class="muted" {
            "The last " (recent.len()) " steps of the last 24 h, every run; steps with no first \
             token sit under the axis."
        }
        (scatter::probes(&recent, limit))
        h2 { "Side-channel audit: p-values per worker" }
        p class="muted" {
            "The last " (audits.len()) " verdicts of the last 24 h: whether another tenant's \
             first-token times (circles) or the order of its mixed batches (squares) depend on a \
             prompt one tenant cached. Low is bad: below the dashed threshold an incident opens; \
             red is a leak, hollow an audit whose control saw no cache hit."
        }
        (isolation_chart::isolation(&audits))
        h2 { "Sampled traffic: first-token latency against prompt length" }
        p class="muted" {
            "The last " (traffic.len()) " requests of every tenant the router sampled in the last \
             24 h, by how they ended."
        }
        (scatter::samples(&traffic, limit))
        h2 id="runs" { "Runs" }
        table id="probe-runs" {
            tr {
                th { "run" } th { "started (UTC)" } th { "sweep" } th { "status" } th { "limit" }
                th { "steps" } th { "failures" } th { "summary" }
            }
            @for r in &runs {
                tr id={ "run-" (r.id.0) } {
                    td { a href=(run_href(r.id)) { (r.id.0) } }
                    td { (time(r.started_at)) } td { (r.sweep) } td { (r.status) }
                    td { (dash_or(r.context_limit)) }
                    td {
                        @if r.status == ProbeRunStatus::Running { "running" } @else { (r.steps) }
                    }
                    td class=(ok_class(r.failures == 0)) { (r.failures) }
                    td { (r.message) }
                }
            }
        }
        @if runs.is_empty() { p id="no-runs" { "No probe runs on this page." } }
        (pager(runs_page, RUNS_PER_PAGE, total, "run", |n| {
            format!("/probes?runs_page={n}#runs")
        }))
    };
    Ok(page("Probe history", "/probes", Some(&user), body))
}

/// `GET /probes/runs/{id}`: one run, every step it has recorded (a run still going shows the
/// steps so far, counted, beside the total it will record at its end).
pub async fn probe_run(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Path(id): Path<i64>,
) -> Result<Markup, WebError> {
    let id = ProbeRunId(id);
    let store = st.engine.store();
    let run = store
        .probe_run(id)
        .await?
        .ok_or_else(|| WebError::NotFound(format!("no probe run {}", id.0)))?;
    let results = store.probe_results(id).await?;
    let failed = |s: &ProbeResult| s.outcome.incident_kind().is_some();
    let failures = results.iter().filter(|s| failed(s)).count();
    let body = html! {
        table id="run" {
            tr {
                th { "sweep" } th { "status" } th { "started (UTC)" } th { "finished (UTC)" }
                th { "limit" } th { "steps recorded" } th { "failed steps" } th { "summary" }
            }
            tr {
                td { (run.sweep) } td { (run.status) } td { (time(run.started_at)) }
                td { (dash_or(run.finished_at.map(time))) }
                td { (dash_or(run.context_limit)) }
                td id="steps-recorded" { (results.len()) }
                td class=(ok_class(failures == 0)) { (failures) }
                td { (run.message) }
            }
        }
        table id="run-steps" {
            tr {
                th { "tenant" } th { "step" } th { "words" } th { "expected tokens" } th { "HTTP" }
                th { "prompt tokens" } th { "TTFT ms" } th { "outcome" } th { "detail" }
            }
            @for s in &results {
                tr class="step" {
                    td { (s.tenant) } td { (s.step) } td { (s.prompt_words) }
                    td { (dash_or(s.expected_tokens)) } td { (dash_or(s.http_status)) }
                    td { (dash_or(s.prompt_tokens)) } td { (dash_or(s.ttft_ms)) }
                    td class=(ok_class(!failed(s))) { (s.outcome) }
                    td { (s.detail) }
                }
            }
        }
        p { a href="/probes#runs" { "All runs" } }
    };
    let title = format!("Probe run {} ({} sweep)", id.0, run.sweep);
    Ok(page(&title, "/probes", Some(&user), body))
}

/// The on-demand sweep form.
#[derive(Deserialize)]
pub struct SweepForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    sweep: String,
}

/// `POST /probes/run` (form): CSRF token, then role, then a run in the background.
pub async fn run_probe(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Form(f): Form<SweepForm>,
) -> Result<Response, WebError> {
    user.check_csrf(&f.csrf)?;
    let by = super::session::operator_as(&user.who, "start probe runs")?;
    let sweep = f
        .sweep
        .parse::<SweepKind>()
        .map_err(|e| WebError::BadRequest(e.to_string()))?;
    match start_sweep(&st, sweep, by) {
        Ok(()) => Ok(Redirect::to("/probes").into_response()),
        // A person clicked: answer with a page, not the API's JSON.
        Err(WebError::Conflict(why)) => {
            let body = html! {
                p class="bad" id="sweep-refused" { (why) }
                p { a href="/probes" { "back to the probe history" } }
            };
            let html = page("Probe history", "/probes", Some(&user), body);
            Ok((StatusCode::CONFLICT, html).into_response())
        }
        Err(e) => Err(e),
    }
}

/// `GET /integrity?window_s=&bucket_s=`: incidents opened and integrity events over time.
pub async fn integrity(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Query(q): Query<SeriesQuery>,
) -> Result<Markup, WebError> {
    let (since, bucket) = q.resolve()?;
    let now = UnixMs::now();
    let store = st.engine.store();
    let incidents = store.incident_series(since, bucket).await?;
    let events = store.integrity_series(since, bucket).await?;
    let opened: i64 = incidents.iter().map(|p| p.count).sum();
    let total: i64 = events.iter().map(|p| p.count).sum();
    let body = html! {
        p {
            "Per " (bucket / 1000) " s. "
            a href="/integrity?window_s=3600&bucket_s=60" { "1 h" } " · "
            a href="/integrity?window_s=86400&bucket_s=1800" { "24 h" } " · "
            a href="/integrity?window_s=604800&bucket_s=14400" { "7 d" }
        }
        h2 { "Incidents opened, by severity" }
        p class="muted" { (opened) " in the window." }
        (chart::incidents(&incidents, since, now, bucket))
        h2 { "Integrity events, by kind" }
        p class="muted" {
            (total) " in the window, routine ones (counted, no incident) included."
        }
        (chart::integrity(&events, since, now, bucket))
        p class="muted" {
            "KV pool pages over time are not charted here: workers report pool usage on their \
             own " code { "/metrics" } " (" code { "pagewarden_pool_pages" } "), not to the \
             auditor."
        }
    };
    Ok(page("Over time", "/integrity", Some(&user), body))
}
