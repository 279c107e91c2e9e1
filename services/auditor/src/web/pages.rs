//! Server-rendered pages. Each reads the same store calls as its JSON twin in `api`.

use std::fmt::Write;

use axum::extract::{Path, Query, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use serde::Deserialize;

use super::api::{load_runs, SeriesQuery};
use super::html::{csrf_input, esc, opt, page, same_site_path, severity_badge, status_badge, time};
use super::session::{sign_off_as, SessionUser};
use super::{chart, AppState, FilterQuery, WebError};
use crate::domain::{IncidentId, IncidentKind, IncidentStatus, UnixMs};
use crate::store::Incident;

/// `GET /`: the incident list.
pub async fn index() -> Redirect {
    Redirect::to("/incidents")
}

fn select(name: &str, current: Option<&str>, options: &[&str]) -> String {
    let mut s =
        format!("<select name=\"{name}\" id=\"filter-{name}\"><option value=\"\">any</option>");
    for o in options {
        let sel = if Some(*o) == current { " selected" } else { "" };
        let _ = write!(s, "<option value=\"{o}\"{sel}>{o}</option>");
    }
    s.push_str("</select>");
    s
}

/// The acknowledge/resolve forms of an incident; none for viewers.
fn actions(i: &Incident, back: &str, user: &SessionUser) -> String {
    if !user.who.role.may_sign_off() {
        return String::new();
    }
    let form = |action: &str, label: &str| {
        format!(
            "<form class=\"inline\" method=\"post\" action=\"/incidents/{id}/{action}\">{csrf}\
             <input type=\"hidden\" name=\"back\" value=\"{back}\">\
             <input name=\"note\" placeholder=\"note\" size=\"12\">\
             <button type=\"submit\" id=\"{action}-{id}\">{label}</button></form>",
            id = i.id,
            back = esc(back),
            csrf = csrf_input(user),
        )
    };
    match i.status {
        IncidentStatus::Open => format!(
            "{} {}",
            form("ack", "Acknowledge"),
            form("resolve", "Resolve")
        ),
        IncidentStatus::Acknowledged => form("resolve", "Resolve"),
        IncidentStatus::Resolved => String::new(),
    }
}

/// `GET /incidents?status=&kind=&tenant=`
pub async fn incidents(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Query(q): Query<FilterQuery>,
) -> Result<Html<String>, WebError> {
    let filter = q.parse()?;
    let list = st.engine.store().incidents(&filter).await?;
    let counts = st.engine.store().incident_counts().await?;
    let mut b = String::new();
    b.push_str("<p id=\"counts\">");
    for (s, n) in counts {
        let _ = write!(b, "{} <strong>{n}</strong> &nbsp; ", status_badge(s));
    }
    b.push_str("</p><form method=\"get\" action=\"/incidents\">status ");
    let statuses: Vec<&str> = IncidentStatus::ALL.iter().map(|s| s.as_str()).collect();
    let kinds: Vec<&str> = IncidentKind::ALL.iter().map(|k| k.as_str()).collect();
    b.push_str(&select(
        "status",
        filter.status.map(|s| s.as_str()),
        &statuses,
    ));
    b.push_str(" kind ");
    b.push_str(&select("kind", filter.kind.map(|k| k.as_str()), &kinds));
    let _ = write!(
        b,
        " tenant <input name=\"tenant\" value=\"{}\" size=\"12\"> <button>Filter</button> \
         <a href=\"/incidents\">clear</a></form>",
        esc(filter.tenant.as_deref().unwrap_or(""))
    );
    let back = format!(
        "/incidents?status={}&kind={}&tenant={}",
        filter.status.map(|s| s.as_str()).unwrap_or(""),
        filter.kind.map(|k| k.as_str()).unwrap_or(""),
        filter.tenant.as_deref().unwrap_or("")
    );
    b.push_str(
        "<table id=\"incidents\"><tr><th>#</th><th>detected (UTC)</th><th>kind</th>\
         <th>severity</th><th>status</th><th>tenant</th><th>other tenant</th><th>node</th>\
         <th>actions</th></tr>",
    );
    for i in &list {
        let _ = write!(
            b,
            "<tr id=\"incident-{id}\" data-status=\"{status}\"><td><a href=\"/incidents/{id}\">{id}</a></td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td></tr>",
            time(i.created_at),
            i.kind,
            severity_badge(i.severity),
            status_badge(i.status),
            opt(&i.tenant),
            opt(&i.other_tenant),
            opt(&i.node),
            actions(i, &back, &user),
            id = i.id,
            status = i.status,
        );
    }
    b.push_str("</table>");
    if list.is_empty() {
        b.push_str("<p id=\"no-incidents\">No incidents match.</p>");
    }
    Ok(page("Incidents", "/incidents", Some(&user), &b))
}

/// `GET /incidents/{id}`
pub async fn incident(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Path(id): Path<i64>,
) -> Result<Html<String>, WebError> {
    let i = st
        .engine
        .store()
        .incident(IncidentId(id))
        .await?
        .ok_or_else(|| WebError::NotFound(format!("incident {id} not found")))?;
    let details = serde_json::from_str::<serde_json::Value>(&i.details)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| i.details.clone());
    let signoff = |s: &Option<crate::store::Signoff>| match s {
        Some(s) => format!("{} by {} — {}", time(s.at), esc(&s.by), esc(&s.note)),
        None => "—".into(),
    };
    let mut b = String::new();
    let _ = write!(
        b,
        "<table id=\"incident\"><tr><th>kind</th><td>{}</td></tr>\
         <tr><th>severity</th><td>{}</td></tr><tr><th>status</th><td id=\"status\">{}</td></tr>\
         <tr><th>detected</th><td>{}</td></tr><tr><th>tenant</th><td>{}</td></tr>\
         <tr><th>other tenant</th><td>{}</td></tr><tr><th>node</th><td>{}</td></tr>\
         <tr><th>request</th><td>{}</td></tr><tr><th>acknowledged</th><td>{}</td></tr>\
         <tr><th>resolved</th><td>{}</td></tr></table><h2>Details</h2><pre>{}</pre>{}",
        i.kind,
        severity_badge(i.severity),
        status_badge(i.status),
        time(i.created_at),
        opt(&i.tenant),
        opt(&i.other_tenant),
        opt(&i.node),
        opt(&i.request_id),
        signoff(&i.acknowledged),
        signoff(&i.resolved),
        esc(&details),
        actions(&i, &format!("/incidents/{}", i.id), &user),
    );
    Ok(page(
        &format!("Incident {}", i.id),
        "/incidents",
        Some(&user),
        &b,
    ))
}

/// A form post from the incident pages. The acting operator is the session's, not a field.
#[derive(Deserialize)]
pub struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    note: String,
    #[serde(default)]
    back: String,
}

/// `POST /incidents/{id}/ack` and `/resolve` (form): CSRF token, then role, then the store.
pub async fn sign_off(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Path((id, action)): Path<(i64, String)>,
    Form(f): Form<ActionForm>,
) -> Result<Response, WebError> {
    user.check_csrf(&f.csrf)?;
    let by = sign_off_as(&user.who)?;
    let action: super::SignoffAction = action.parse()?;
    action.apply(&st, IncidentId(id), by, &f.note).await?;
    // Only same-site paths: never redirect to a URL a form field supplied.
    let back = same_site_path(&f.back)
        .map(str::to_string)
        .unwrap_or_else(|| format!("/incidents/{id}"));
    Ok(Redirect::to(&back).into_response())
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

/// `GET /probes`
pub async fn probes(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
) -> Result<Html<String>, WebError> {
    let runs = load_runs(&st, 20).await?;
    let mut b = String::from(
        "<table id=\"probe-runs\"><tr><th>run</th><th>started (UTC)</th><th>status</th>\
         <th>limit</th><th>steps</th><th>failures</th><th>summary</th></tr>",
    );
    for r in &runs {
        let _ = write!(
            b,
            "<tr><td><a href=\"#run-{id}\">{id}</a></td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
            time(r.run.started_at),
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
    for r in runs.iter().take(5) {
        let _ = write!(
            b,
            "<h2 id=\"run-{}\">Run {}</h2><table><tr><th>tenant</th><th>step</th><th>words</th>\
             <th>expected tokens</th><th>HTTP</th><th>prompt tokens</th><th>TTFT ms</th>\
             <th>outcome</th><th>detail</th></tr>",
            r.run.id.0, r.run.id.0
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
    Ok(page("Probe history", "/probes", Some(&user), &b))
}

/// `GET /integrity?window_s=&bucket_s=`
pub async fn integrity(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Query(q): Query<SeriesQuery>,
) -> Result<Html<String>, WebError> {
    let (since, bucket) = q.resolve();
    let points = st.engine.store().integrity_series(since, bucket).await?;
    let total: i64 = points.iter().map(|p| p.count).sum();
    let mut b = format!(
        "<p>Integrity events per {} s, stacked by kind; {total} in the window. \
         <a href=\"/integrity?window_s=3600&bucket_s=60\">1 h</a> · \
         <a href=\"/integrity?window_s=86400&bucket_s=1800\">24 h</a> · \
         <a href=\"/integrity?window_s=604800&bucket_s=14400\">7 d</a></p>",
        bucket / 1000
    );
    b.push_str(&chart::render(&points, since, UnixMs::now(), bucket));
    Ok(page("Integrity counters", "/integrity", Some(&user), &b))
}
