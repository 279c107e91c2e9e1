//! Server-rendered pages besides the incident pages (`incident_pages`): nodes, probes (with
//! the prompt-length chart and on-demand sweeps) and the charts over time. Each reads the same
//! store calls as its JSON twin in `api`.

use std::fmt::Write;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use serde::Deserialize;

use super::api::{load_runs, start_sweep, SeriesQuery, PROBE_CHART_STEPS, PROBE_CHART_WINDOW_MS};
use super::html::{csrf_input, esc, page, time};
use super::session::SessionUser;
use super::{chart, isolation_chart, refresh, scatter, AppState, WebError};
use crate::domain::{SweepKind, UnixMs};

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
    Ok(Html(
        page("Nodes", "/nodes", Some(&user), maud::PreEscaped(b)).into_string(),
    ))
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
            csrf_input(user).into_string()
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

/// `GET /probes?refresh=`
pub async fn probes(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Query(q): Query<refresh::RefreshQuery>,
) -> Result<Html<String>, WebError> {
    let refresh_s = q.seconds()?;
    let runs = load_runs(&st, 20).await?;
    let since = UnixMs(UnixMs::now().0 - PROBE_CHART_WINDOW_MS);
    let recent = st
        .engine
        .store()
        .recent_probe_results(since, PROBE_CHART_STEPS)
        .await?;
    let traffic = st
        .engine
        .store()
        .recent_samples(since, PROBE_CHART_STEPS)
        .await?;
    let audits = st
        .engine
        .store()
        .isolation_audits(since, PROBE_CHART_STEPS)
        .await?;
    let limit = runs.iter().find_map(|r| r.run.context_limit);
    let mut b = sweep_forms(&st, &user);
    b.push_str(&refresh::marker(refresh_s, "/probes?refresh=0", "/probes").into_string());
    let _ = write!(
        b,
        "<h2>Outcome and first-token latency against prompt length</h2>\
         <p class=\"muted\">The last {} steps of the last 24 h, every run; steps with no first \
         token sit under the axis.</p>{}",
        recent.len(),
        scatter::probes(&recent, limit).into_string()
    );
    let _ = write!(
        b,
        "<h2>Side-channel audit: p-values per worker</h2>\
         <p class=\"muted\">The last {} verdicts of the last 24 h: whether another tenant's \
         first-token times (circles) or the order of its mixed batches (squares) depend on a \
         prompt one tenant cached. Low is bad: below the dashed threshold an incident opens; \
         red is a leak, hollow an audit whose control saw no cache hit.</p>{}",
        audits.len(),
        isolation_chart::isolation(&audits).into_string()
    );
    let _ = write!(
        b,
        "<h2>Sampled traffic: first-token latency against prompt length</h2>\
         <p class=\"muted\">The last {} requests of every tenant the router sampled in the last \
         24 h, by how they ended.</p>{}",
        traffic.len(),
        scatter::samples(&traffic, limit).into_string()
    );
    b.push_str(
        "<h2>Runs</h2><table id=\"probe-runs\"><tr><th>run</th><th>started (UTC)</th>\
         <th>sweep</th><th>status</th><th>limit</th><th>steps</th><th>failures</th>\
         <th>summary</th></tr>",
    );
    for r in &runs {
        let _ = write!(
            b,
            "<tr><td><a href=\"#run-{id}\">{id}</a></td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
            time(r.run.started_at),
            r.run.sweep,
            r.run.status,
            r.run
                .context_limit
                .map(|l| l.to_string())
                .unwrap_or_else(|| "—".into()),
            r.run.steps,
            if r.run.failures == 0 { "ok" } else { "bad" },
            r.run.failures,
            esc(&r.run.message),
            id = r.run.id.0,
        );
    }
    b.push_str("</table>");
    if runs.is_empty() {
        b.push_str("<p id=\"no-runs\">No probe runs yet.</p>");
    }
    for r in runs.iter().take(5) {
        let _ = write!(
            b,
            "<h2 id=\"run-{}\">Run {} ({} sweep)</h2><table><tr><th>tenant</th><th>step</th>\
             <th>words</th><th>expected tokens</th><th>HTTP</th><th>prompt tokens</th>\
             <th>TTFT ms</th><th>outcome</th><th>detail</th></tr>",
            r.run.id.0, r.run.id.0, r.run.sweep
        );
        for s in &r.results {
            let num = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_else(|| "—".into());
            let _ = write!(
                b,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
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
        b.push_str("</table>");
    }
    Ok(Html(
        page("Probe history", "/probes", Some(&user), maud::PreEscaped(b)).into_string(),
    ))
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
            let html = page(
                "Probe history",
                "/probes",
                Some(&user),
                maud::PreEscaped(body),
            );
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
        chart::incidents(&incidents, since, now, bucket).into_string()
    );
    let _ = write!(
        b,
        "<h2>Integrity events, by kind</h2><p class=\"muted\">{total} in the window, routine \
         ones (counted, no incident) included.</p>{}",
        chart::integrity(&events, since, now, bucket).into_string()
    );
    b.push_str(
        "<p class=\"muted\">KV pool pages over time are not charted here: workers report pool \
         usage on their own <code>/metrics</code> (<code>pagewarden_pool_pages</code>), not to \
         the auditor.</p>",
    );
    Ok(Html(
        page("Over time", "/integrity", Some(&user), maud::PreEscaped(b)).into_string(),
    ))
}
