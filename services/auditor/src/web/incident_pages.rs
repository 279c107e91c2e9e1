//! The incident pages: the list (filters, page-tag columns, routine-event counters, paging,
//! auto-refresh), one incident with the others that share its page, and the
//! acknowledge/resolve form posts.

use std::fmt::Write;

use axum::extract::{Path, Query, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use serde::Deserialize;

use super::html::{csrf_input, esc, opt, page, same_site_path, severity_badge, status_badge, time};
use super::query::{IncidentQuery, ListView};
use super::session::{sign_off_as, SessionUser};
use super::{incident_guide, refresh, AppState, SignoffAction, WebError};
use crate::domain::{IncidentId, IncidentKind, IncidentStatus};
use crate::store::{Incident, IncidentFilter, RoutineCount, Signoff, Window};

/// How many incidents sharing a page the detail page lists.
const SAME_PAGE_SHOWN: i64 = 50;

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

fn input(name: &str, value: &str, size: u32) -> String {
    format!(
        "<input name=\"{name}\" id=\"filter-{name}\" value=\"{}\" size=\"{size}\">",
        esc(value)
    )
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

/// The filter naming `i`'s page on its node: the incidents that share the page.
fn same_page(i: &Incident) -> Option<IncidentFilter> {
    i.page.map(|p| IncidentFilter {
        node: i.node.clone(),
        page: Some(p),
        ..IncidentFilter::default()
    })
}

/// The page and generation cells: each links to the incidents sharing it on `i`'s node.
fn page_cells(i: &Incident, view: &ListView) -> (String, String) {
    let Some(on_page) = same_page(i) else {
        return ("—".into(), opt(&i.generation.map(|g| g.to_string())));
    };
    let page = format!(
        "<a class=\"page-tag\" href=\"{}\" title=\"incidents on this page of {}\">{}</a>",
        esc(&view.href_of(&on_page, 1)),
        opt(&i.node),
        i.page.unwrap_or_default()
    );
    let generation = match i.generation {
        Some(g) => {
            let tag = IncidentFilter {
                generation: Some(g),
                ..on_page
            };
            format!(
                "<a class=\"page-tag\" href=\"{}\">{g}</a>",
                esc(&view.href_of(&tag, 1))
            )
        }
        None => "—".into(),
    };
    (page, generation)
}

fn routine_line(counts: &[RoutineCount]) -> String {
    let mut b =
        String::from("<p id=\"routine\">Routine events, counted rather than opened as incidents: ");
    if counts.is_empty() {
        b.push_str("none yet");
    }
    let items: Vec<String> = counts
        .iter()
        .map(|c| {
            format!(
                "<span id=\"routine-{k}\">{k} <strong>{n}</strong> \
                 <span class=\"muted\">(latest {t})</span></span>",
                k = c.kind,
                n = c.count,
                t = time(c.last_at)
            )
        })
        .collect();
    b.push_str(&items.join(" · "));
    b.push_str(" · <a href=\"/integrity\">over time</a></p>");
    b
}

fn filter_form(view: &ListView) -> String {
    let f = &view.filter;
    let statuses: Vec<&str> = IncidentStatus::ALL.iter().map(|s| s.as_str()).collect();
    let kinds: Vec<&str> = IncidentKind::ALL.iter().map(|k| k.as_str()).collect();
    let num = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_default();
    format!(
        "<form method=\"get\" action=\"/incidents\" id=\"filters\">status {} kind {} \
         tenant {} node {} page {} generation {} per page {} <button id=\"filter\">Filter\
         </button> <a href=\"/incidents\">clear</a></form>",
        select("status", f.status.map(|s| s.as_str()), &statuses),
        select("kind", f.kind.map(|k| k.as_str()), &kinds),
        input("tenant", f.tenant.as_deref().unwrap_or(""), 10),
        input("node", f.node.as_deref().unwrap_or(""), 10),
        input("page", &num(f.page), 5),
        input("generation", &num(f.generation), 5),
        input("limit", &view.limit.to_string(), 4),
    )
}

fn pager(view: &ListView, total: i64) -> String {
    let pages = view.pages(total);
    let mut b = String::from("<nav class=\"pager\" id=\"pager\">");
    if view.page_no > 1 {
        let to = (view.page_no - 1).min(pages);
        let _ = write!(
            b,
            "<a id=\"newer\" href=\"{}\">« newer</a>",
            esc(&view.href(to))
        );
    }
    let _ = write!(
        b,
        "<span id=\"page-of\">page {} of {pages} · {total} incident{}</span>",
        view.page_no,
        if total == 1 { "" } else { "s" }
    );
    if view.page_no < pages {
        let _ = write!(
            b,
            "<a id=\"older\" href=\"{}\">older »</a>",
            esc(&view.href(view.page_no + 1))
        );
    }
    b.push_str("</nav>");
    b
}

/// `GET /incidents?status=&kind=&tenant=&node=&page=&generation=&page_no=&limit=&refresh=`
pub async fn incidents(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Query(q): Query<IncidentQuery>,
) -> Result<Html<String>, WebError> {
    let view = q.parse()?;
    let store = st.engine.store();
    let list = store.incidents(&view.filter, view.window()).await?;
    let total = store.incident_total(&view.filter).await?;
    let counts = store.incident_counts().await?;
    let routine = store.routine_counts().await?;
    let mut b = String::new();
    b.push_str("<p id=\"counts\">");
    for (s, n) in counts {
        let _ = write!(b, "{} <strong>{n}</strong> &nbsp; ", status_badge(s));
    }
    b.push_str("</p>");
    b.push_str(&routine_line(&routine));
    b.push_str(&filter_form(&view));
    let here = view.href(view.page_no);
    let toggled = |refresh_s| {
        ListView {
            refresh_s,
            ..view.clone()
        }
        .href(view.page_no)
    };
    b.push_str(&refresh::marker(
        view.refresh_s,
        &toggled(0),
        &toggled(refresh::DEFAULT_S),
    ));
    b.push_str(&pager(&view, total));
    b.push_str(
        "<table id=\"incidents\"><tr><th>#</th><th>detected (UTC)</th><th>kind</th>\
         <th>severity</th><th>status</th><th>tenant</th><th>other tenant</th><th>node</th>\
         <th>page</th><th>generation</th><th>actions</th></tr>",
    );
    for i in &list {
        let (page_cell, generation_cell) = page_cells(i, &view);
        let _ = write!(
            b,
            "<tr id=\"incident-{id}\" data-status=\"{status}\"><td><a href=\"/incidents/{id}\">{id}</a></td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{page_cell}</td><td>{generation_cell}</td><td>{}</td></tr>",
            time(i.created_at),
            i.kind,
            severity_badge(i.severity),
            status_badge(i.status),
            opt(&i.tenant),
            opt(&i.other_tenant),
            opt(&i.node),
            actions(i, &here, &user),
            id = i.id,
            status = i.status,
        );
    }
    b.push_str("</table>");
    if list.is_empty() {
        if total > 0 {
            let _ = write!(
                b,
                "<p id=\"no-incidents\">No incidents on this page; \
                 <a href=\"{}\">back to the first</a>.</p>",
                esc(&view.href(1))
            );
        } else {
            b.push_str("<p id=\"no-incidents\">No incidents match.</p>");
        }
    } else {
        b.push_str(&pager(&view, total));
    }
    Ok(page("Incidents", "/incidents", Some(&user), &b))
}

/// `GET /incidents/{id}`
pub async fn incident(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Path(id): Path<i64>,
) -> Result<Html<String>, WebError> {
    let store = st.engine.store();
    let i = store
        .incident(IncidentId(id))
        .await?
        .ok_or_else(|| WebError::NotFound(format!("incident {id} not found")))?;
    let details = serde_json::from_str::<serde_json::Value>(&i.details)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| i.details.clone());
    let signoff = |s: &Option<Signoff>| match s {
        Some(s) => format!("{} by {} — {}", time(s.at), esc(&s.by), esc(&s.note)),
        None => "—".into(),
    };
    let num = |v: Option<i64>| opt(&v.map(|v| v.to_string()));
    let mut b = String::new();
    let _ = write!(
        b,
        "<table id=\"incident\"><tr><th>kind</th><td>{}</td></tr>\
         <tr><th>severity</th><td>{}</td></tr><tr><th>status</th><td id=\"status\">{}</td></tr>\
         <tr><th>detected</th><td>{}</td></tr><tr><th>tenant</th><td>{}</td></tr>\
         <tr><th>other tenant</th><td>{}</td></tr><tr><th>node</th><td>{}</td></tr>\
         <tr><th>page</th><td>{}</td></tr><tr><th>generation</th><td>{}</td></tr>\
         <tr><th>request</th><td>{}</td></tr><tr><th>acknowledged</th><td>{}</td></tr>\
         <tr><th>resolved</th><td>{}</td></tr></table>{}<h2>Details</h2><pre>{}</pre>{}",
        i.kind,
        severity_badge(i.severity),
        status_badge(i.status),
        time(i.created_at),
        opt(&i.tenant),
        opt(&i.other_tenant),
        opt(&i.node),
        num(i.page),
        num(i.generation),
        opt(&i.request_id),
        signoff(&i.acknowledged),
        signoff(&i.resolved),
        explained(&i),
        esc(&details),
        actions(&i, &format!("/incidents/{}", i.id), &user),
    );
    if let Some(f) = same_page(&i) {
        let window = Window {
            limit: SAME_PAGE_SHOWN + 1,
            offset: 0,
        };
        let others: Vec<Incident> = store
            .incidents(&f, window)
            .await?
            .into_iter()
            .filter(|o| o.id != i.id)
            .take(SAME_PAGE_SHOWN as usize)
            .collect();
        let all = ListView {
            filter: f.clone(),
            page_no: 1,
            limit: super::query::DEFAULT_LIMIT,
            refresh_s: refresh::DEFAULT_S,
        };
        let _ = write!(
            b,
            "<h2>Other incidents on page {} of {}</h2>",
            f.page.unwrap_or_default(),
            opt(&i.node)
        );
        if others.is_empty() {
            b.push_str("<p id=\"same-page-none\">None.</p>");
        } else {
            b.push_str(
                "<table id=\"same-page\"><tr><th>#</th><th>detected (UTC)</th><th>kind</th>\
                 <th>generation</th><th>status</th></tr>",
            );
            for o in &others {
                let _ = write!(
                    b,
                    "<tr><td><a href=\"/incidents/{id}\">{id}</a></td><td>{}</td><td>{}</td>\
                     <td>{}</td><td>{}</td></tr>",
                    time(o.created_at),
                    o.kind,
                    num(o.generation),
                    status_badge(o.status),
                    id = o.id,
                );
            }
            b.push_str("</table>");
        }
        let _ = write!(
            b,
            "<p><a id=\"all-on-page\" href=\"{}\">all incidents on this page</a></p>",
            esc(&all.href(1))
        );
    }
    Ok(page(
        &format!("Incident {}", i.id),
        "/incidents",
        Some(&user),
        &b,
    ))
}

/// What the incident means, the operator's next step, and links to what it came from and to
/// its node's, tenant's and kind's other incidents.
fn explained(i: &Incident) -> String {
    let g = incident_guide::guide(i.kind);
    let mut b = format!(
        "<h2>What it means</h2><p id=\"meaning\">{}</p><h2>What to do</h2>\
         <p id=\"next-step\">{}</p><h2>Related</h2><ul id=\"related\">",
        esc(g.meaning),
        esc(g.next)
    );
    let details: serde_json::Value = serde_json::from_str(&i.details).unwrap_or_default();
    if let Some(run) = details["run_id"].as_i64() {
        let _ = write!(
            b,
            "<li><a id=\"probe-run\" href=\"/probes/runs/{run}\">probe run {run}</a></li>"
        );
    }
    if let Some(trace) = details["trace_id"].as_str() {
        let _ = write!(b, "<li>trace id <code>{}</code></li>", esc(trace));
    }
    let list = ListView {
        filter: IncidentFilter::default(),
        page_no: 1,
        limit: super::query::DEFAULT_LIMIT,
        refresh_s: refresh::DEFAULT_S,
    };
    let mut link = |id: &str, what: String, filter: IncidentFilter| {
        let _ = write!(
            b,
            "<li><a id=\"{id}\" href=\"{}\">{}</a></li>",
            esc(&list.href_of(&filter, 1)),
            esc(&what)
        );
    };
    if let Some(node) = &i.node {
        let filter = IncidentFilter {
            node: Some(node.clone()),
            ..IncidentFilter::default()
        };
        link(
            "node-incidents",
            format!("every incident on {node}"),
            filter,
        );
    }
    if let Some(tenant) = &i.tenant {
        let filter = IncidentFilter {
            tenant: Some(tenant.clone()),
            ..IncidentFilter::default()
        };
        link(
            "tenant-incidents",
            format!("every incident of tenant {tenant}"),
            filter,
        );
    }
    let filter = IncidentFilter {
        kind: Some(i.kind),
        ..IncidentFilter::default()
    };
    link(
        "kind-incidents",
        format!("every {} incident", i.kind),
        filter,
    );
    b.push_str("</ul>");
    b
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
    let action: SignoffAction = action.parse()?;
    action.apply(&st, IncidentId(id), by, &f.note).await?;
    // Only same-site paths: never redirect to a URL a form field supplied.
    let back = same_site_path(&f.back)
        .map(str::to_string)
        .unwrap_or_else(|| format!("/incidents/{id}"));
    Ok(Redirect::to(&back).into_response())
}
