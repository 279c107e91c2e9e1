//! Server-rendered pages besides the incident pages (`incident_pages`): nodes, probes (with
//! the prompt-length chart and on-demand sweeps) and the charts over time. Each reads the same
//! store calls as its JSON twin in `api`.

use std::fmt::Write;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use serde::Deserialize;

use super::api::{start_sweep, SeriesQuery, PROBE_CHART_STEPS, PROBE_CHART_WINDOW_MS};
use super::html::{csrf_input, esc, page, time};
use super::pager::pager;
use super::query::number;
use super::session::SessionUser;
use super::{chart, isolation_chart, refresh, scatter, AppState, WebError};
use crate::domain::{ProbeRunId, ProbeRunStatus, SweepKind, UnixMs};
use crate::store::Window;

/// `GET /`: the overview.
pub async fn index() -> Redirect {
    Redirect::to("/overview")
}

/// `GET /nodes`
pub async fn nodes(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
) -> Result<Html<String>, WebError> {
    let nodes = st.engine.store().nodes().await?;
    let mut b = String::from(
        "<table id=\"nodes\"><tr><th>node</th><th>role</th><th>pool tokens</th>\
         <th>context</th><th>pool ≥ context</th><th>preflight</th><th>last report (UTC)</th>\
         <th>reports</th><th>message</th></tr>",
    );
    for n in &nodes {
        let p = &n.last;
        let fits = p.pool_tokens >= p.context_length;
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td>\
             <td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&p.node),
            p.role,
            p.pool_tokens,
            p.context_length,
            if fits { "ok" } else { "bad" },
            if fits { "yes" } else { "NO" },
            if p.ok { "ok" } else { "bad" },
            if p.ok { "ok" } else { "FAILED" },
            time(p.at),
            n.reports,
            esc(&p.message)
        );
    }
    b.push_str("</table>");
    if nodes.is_empty() {
        b.push_str("<p>No preflight reports yet.</p>");
    }
    Ok(page("Nodes", "/nodes", Some(&user), &b))
}

/// The on-demand sweep buttons (operators only), or why there are none.
fn sweep_forms(st: &AppState, user: &SessionUser) -> String {
    if st.prober.is_none() {
        return "<p id=\"probing-off\" class=\"muted\">Probing is off: the auditor has no \
                router_url or no probe tenants.</p>"
            .into();
    }
    if !user.who.role.may_sign_off() {
        return String::new();
    }
    let form = |sweep: SweepKind, label: &str| {
        format!(
            "<form class=\"inline\" method=\"post\" action=\"/probes/run\">{}\
             <input type=\"hidden\" name=\"sweep\" value=\"{sweep}\">\
             <button type=\"submit\" id=\"run-{sweep}\">{label}</button></form>",
            csrf_input(user)
        )
    };
    format!(
        "<p id=\"sweeps\">{} {} <span class=\"muted\">light: per probe tenant one short prompt \
         and one just past the context; full: lengths doubling up to the context, then past \
         it.</span></p>",
        form(SweepKind::Light, "Run a light sweep now"),
        form(SweepKind::Full, "Run a full sweep now")
    )
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
) -> Result<Html<String>, WebError> {
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
    let mut b = sweep_forms(&st, &user);
    b.push_str(&refresh::marker(refresh_s, "/probes?refresh=0", "/probes"));
    let _ = write!(
        b,
        "<h2>Outcome and first-token latency against prompt length</h2>\
         <p class=\"muted\">The last {} steps of the last 24 h, every run; steps with no first \
         token sit under the axis.</p>{}",
        recent.len(),
        scatter::probes(&recent, limit)
    );
    let _ = write!(
        b,
        "<h2>Side-channel audit: p-values per worker</h2>\
         <p class=\"muted\">The last {} verdicts of the last 24 h: whether another tenant's \
         first-token times (circles) or the order of its mixed batches (squares) depend on a \
         prompt one tenant cached. Low is bad: below the dashed threshold an incident opens; \
         red is a leak, hollow an audit whose control saw no cache hit.</p>{}",
        audits.len(),
        isolation_chart::isolation(&audits)
    );
    let _ = write!(
        b,
        "<h2>Sampled traffic: first-token latency against prompt length</h2>\
         <p class=\"muted\">The last {} requests of every tenant the router sampled in the last \
         24 h, by how they ended.</p>{}",
        traffic.len(),
        scatter::samples(&traffic, limit)
    );
    b.push_str(
        "<h2 id=\"runs\">Runs</h2><table id=\"probe-runs\"><tr><th>run</th>\
         <th>started (UTC)</th><th>sweep</th><th>status</th><th>limit</th><th>steps</th>\
         <th>failures</th><th>summary</th></tr>",
    );
    for r in &runs {
        let _ = write!(
            b,
            "<tr id=\"run-{id}\"><td><a href=\"{href}\">{id}</a></td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
            time(r.started_at),
            r.sweep,
            r.status,
            r.context_limit
                .map(|l| l.to_string())
                .unwrap_or_else(|| "—".into()),
            match r.status {
                ProbeRunStatus::Running => "running".to_string(),
                _ => r.steps.to_string(),
            },
            if r.failures == 0 { "ok" } else { "bad" },
            r.failures,
            esc(&r.message),
            id = r.id.0,
            href = run_href(r.id),
        );
    }
    b.push_str("</table>");
    if runs.is_empty() {
        b.push_str("<p id=\"no-runs\">No probe runs on this page.</p>");
    }
    b.push_str(&pager(runs_page, RUNS_PER_PAGE, total, "run", |n| {
        format!("/probes?runs_page={n}#runs")
    }));
    Ok(page("Probe history", "/probes", Some(&user), &b))
}

/// `GET /probes/runs/{id}`: one run, every step it has recorded (a run still going shows the
/// steps so far, counted, beside the total it will record at its end).
pub async fn probe_run(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Path(id): Path<i64>,
) -> Result<Html<String>, WebError> {
    let id = ProbeRunId(id);
    let store = st.engine.store();
    let run = store
        .probe_run(id)
        .await?
        .ok_or_else(|| WebError::NotFound(format!("no probe run {}", id.0)))?;
    let results = store.probe_results(id).await?;
    let failed = results
        .iter()
        .filter(|s| s.outcome.incident_kind().is_some())
        .count();
    let mut b = String::new();
    let _ = write!(
        b,
        "<table id=\"run\"><tr><th>sweep</th><th>status</th><th>started (UTC)</th>\
         <th>finished (UTC)</th><th>limit</th><th>steps recorded</th><th>failed steps</th>\
         <th>summary</th></tr><tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
         <td id=\"steps-recorded\">{}</td><td class=\"{}\">{failed}</td><td>{}</td></tr>\
         </table>",
        run.sweep,
        run.status,
        time(run.started_at),
        run.finished_at.map_or_else(|| "—".to_string(), time),
        run.context_limit
            .map_or_else(|| "—".to_string(), |l| l.to_string()),
        results.len(),
        if failed == 0 { "ok" } else { "bad" },
        esc(&run.message),
    );
    b.push_str(
        "<table id=\"run-steps\"><tr><th>tenant</th><th>step</th><th>words</th>\
         <th>expected tokens</th><th>HTTP</th><th>prompt tokens</th><th>TTFT ms</th>\
         <th>outcome</th><th>detail</th></tr>",
    );
    for s in &results {
        let num = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_else(|| "—".into());
        let _ = write!(
            b,
            "<tr class=\"step\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
            esc(&s.tenant),
            s.step,
            s.prompt_words,
            num(s.expected_tokens),
            num(s.http_status),
            num(s.prompt_tokens),
            num(s.ttft_ms),
            if s.outcome.incident_kind().is_none() {
                "ok"
            } else {
                "bad"
            },
            s.outcome,
            esc(&s.detail)
        );
    }
    b.push_str("</table><p><a href=\"/probes#runs\">All runs</a></p>");
    let title = format!("Probe run {} ({} sweep)", id.0, run.sweep);
    Ok(page(&title, "/probes", Some(&user), &b))
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
            let body = format!(
                "<p class=\"bad\" id=\"sweep-refused\">{}</p><p><a href=\"/probes\">back to \
                 the probe history</a></p>",
                esc(&why)
            );
            let html = page("Probe history", "/probes", Some(&user), &body);
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
) -> Result<Html<String>, WebError> {
    let (since, bucket) = q.resolve()?;
    let now = UnixMs::now();
    let store = st.engine.store();
    let incidents = store.incident_series(since, bucket).await?;
    let events = store.integrity_series(since, bucket).await?;
    let opened: i64 = incidents.iter().map(|p| p.count).sum();
    let total: i64 = events.iter().map(|p| p.count).sum();
    let mut b = format!(
        "<p>Per {} s. \
         <a href=\"/integrity?window_s=3600&bucket_s=60\">1 h</a> · \
         <a href=\"/integrity?window_s=86400&bucket_s=1800\">24 h</a> · \
         <a href=\"/integrity?window_s=604800&bucket_s=14400\">7 d</a></p>",
        bucket / 1000
    );
    let _ = write!(
        b,
        "<h2>Incidents opened, by severity</h2><p class=\"muted\">{opened} in the window.</p>{}",
        chart::incidents(&incidents, since, now, bucket)
    );
    let _ = write!(
        b,
        "<h2>Integrity events, by kind</h2><p class=\"muted\">{total} in the window, routine \
         ones (counted, no incident) included.</p>{}",
        chart::integrity(&events, since, now, bucket)
    );
    b.push_str(
        "<p class=\"muted\">KV pool pages over time are not charted here: workers report pool \
         usage on their own <code>/metrics</code> (<code>pagewarden_pool_pages</code>), not to \
         the auditor.</p>",
    );
    Ok(page("Over time", "/integrity", Some(&user), &b))
}
