//! The incident pages: the list (filters, page-tag columns, routine-event counters, paging,
//! auto-refresh), one incident with the others that share its page, and the
//! acknowledge/resolve form posts.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use maud::{html, Markup};
use serde::Deserialize;

use super::html::{
    csrf_input, dash_or, opt, page, same_site_path, severity_badge, status_badge, time,
};
use super::pager::pager;
use super::pages::run_href;
use super::query::{IncidentQuery, ListView};
use super::session::{sign_off_as, SessionUser};
use super::{incident_guide, refresh, AppState, SignoffAction, WebError};
use crate::domain::{IncidentId, IncidentKind, IncidentStatus, ProbeRunId};
use crate::store::{Incident, IncidentFilter, RoutineCount, Signoff, Window};

/// How many incidents sharing a page the detail page lists.
const SAME_PAGE_SHOWN: i64 = 50;

fn select(name: &str, current: Option<&str>, options: &[&str]) -> Markup {
    html! {
        select name=(name) id={ "filter-" (name) } {
            option value="" { "any" }
            @for o in options {
                option value=(o) selected[Some(*o) == current] { (o) }
            }
        }
    }
}

fn input(name: &str, value: &str, size: u32) -> Markup {
    html! { input name=(name) id={ "filter-" (name) } value=(value) size=(size); }
}

/// The acknowledge/resolve forms of an incident; none for viewers.
fn actions(i: &Incident, back: &str, user: &SessionUser) -> Markup {
    if !user.who.role.may_sign_off() {
        return html! {};
    }
    let form = |action: &str, label: &str| {
        html! {
            form class="inline" method="post" action={ "/incidents/" (i.id) "/" (action) } {
                (csrf_input(user))
                input type="hidden" name="back" value=(back);
                input name="note" placeholder="note" size="12";
                button type="submit" id={ (action) "-" (i.id) } { (label) }
            }
        }
    };
    match i.status {
        IncidentStatus::Open => {
            html! { (form("ack", "Acknowledge")) " " (form("resolve", "Resolve")) }
        }
        IncidentStatus::Acknowledged => form("resolve", "Resolve"),
        IncidentStatus::Resolved => html! {},
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
fn page_cells(i: &Incident, view: &ListView) -> (Markup, Markup) {
    let Some(on_page) = same_page(i) else {
        let generation = i.generation.map(|g| g.to_string());
        return (html! { "—" }, html! { (opt(&generation)) });
    };
    let page = html! {
        a class="page-tag" href=(view.href_of(&on_page, 1))
            title={ "incidents on this page of " (opt(&i.node)) } {
            (i.page.unwrap_or_default())
        }
    };
    let generation = match i.generation {
        Some(g) => {
            let tag = IncidentFilter {
                generation: Some(g),
                ..on_page
            };
            html! { a class="page-tag" href=(view.href_of(&tag, 1)) { (g) } }
        }
        None => html! { "—" },
    };
    (page, generation)
}

fn routine_line(counts: &[RoutineCount]) -> Markup {
    html! {
        p id="routine" {
            "Routine events, counted rather than opened as incidents: "
            @if counts.is_empty() { "none yet" }
            @for (n, c) in counts.iter().enumerate() {
                @if n > 0 { " · " }
                span id={ "routine-" (c.kind) } {
                    (c.kind) " " strong { (c.count) } " "
                    span class="muted" { "(latest " (time(c.last_at)) ")" }
                }
            }
            " · " a href="/integrity" { "over time" }
        }
    }
}

fn filter_form(view: &ListView) -> Markup {
    let f = &view.filter;
    let statuses: Vec<&str> = IncidentStatus::ALL.iter().map(|s| s.as_str()).collect();
    let kinds: Vec<&str> = IncidentKind::ALL.iter().map(|k| k.as_str()).collect();
    let num = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_default();
    html! {
        form method="get" action="/incidents" id="filters" {
            "status " (select("status", f.status.map(|s| s.as_str()), &statuses))
            " kind " (select("kind", f.kind.map(|k| k.as_str()), &kinds))
            " tenant " (input("tenant", f.tenant.as_deref().unwrap_or(""), 10))
            " node " (input("node", f.node.as_deref().unwrap_or(""), 10))
            " page " (input("page", &num(f.page), 5))
            " generation " (input("generation", &num(f.generation), 5))
            " per page " (input("limit", &view.limit.to_string(), 4))
            " " button id="filter" { "Filter" }
            " " a href="/incidents" { "clear" }
        }
    }
}

/// `GET /incidents?status=&kind=&tenant=&node=&page=&generation=&page_no=&limit=&refresh=`
pub async fn incidents(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Query(q): Query<IncidentQuery>,
) -> Result<Markup, WebError> {
    let view = q.parse()?;
    let store = st.engine.store();
    let list = store.incidents(&view.filter, view.window()).await?;
    let total = store.incident_total(&view.filter).await?;
    let counts = store.incident_counts().await?;
    let routine = store.routine_counts().await?;
    let here = view.href(view.page_no);
    let toggled = |refresh_s| {
        ListView {
            refresh_s,
            ..view.clone()
        }
        .href(view.page_no)
    };
    let body = html! {
        p id="counts" {
            @for (s, n) in counts {
                (status_badge(s)) " " strong { (n) } " \u{a0} "
            }
        }
        (routine_line(&routine))
        (filter_form(&view))
        (refresh::marker(view.refresh_s, &toggled(0), &toggled(refresh::DEFAULT_S)))
        (pager(view.page_no, view.limit, total, "incident", |n| view.href(n)))
        table id="incidents" {
            tr {
                th { "#" } th { "detected (UTC)" } th { "kind" } th { "severity" }
                th { "status" } th { "tenant" } th { "other tenant" } th { "node" }
                th { "page" } th { "generation" } th { "actions" }
            }
            @for i in &list {
                @let (page_cell, generation_cell) = page_cells(i, &view);
                tr id={ "incident-" (i.id) } data-status=(i.status) {
                    td { a href={ "/incidents/" (i.id) } { (i.id) } }
                    td { (time(i.created_at)) }
                    td { (i.kind) }
                    td { (severity_badge(i.severity)) }
                    td { (status_badge(i.status)) }
                    td { (opt(&i.tenant)) }
                    td { (opt(&i.other_tenant)) }
                    td { (opt(&i.node)) }
                    td { (page_cell) }
                    td { (generation_cell) }
                    td { (actions(i, &here, &user)) }
                }
            }
        }
        @if !list.is_empty() {
            (pager(view.page_no, view.limit, total, "incident", |n| view.href(n)))
        } @else if total > 0 {
            p id="no-incidents" {
                "No incidents on this page; "
                a href=(view.href(1)) { "back to the first" } "."
            }
        } @else {
            p id="no-incidents" { "No incidents match." }
        }
    };
    Ok(page("Incidents", "/incidents", Some(&user), body))
}

/// `GET /incidents/{id}`
pub async fn incident(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Path(id): Path<i64>,
) -> Result<Markup, WebError> {
    let store = st.engine.store();
    let i = store
        .incident(IncidentId(id))
        .await?
        .ok_or_else(|| WebError::NotFound(format!("incident {id} not found")))?;
    let same = match same_page(&i) {
        Some(f) => {
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
            Some((f, others))
        }
        None => None,
    };
    let body = detail(&i, same.as_ref(), &user);
    Ok(page(
        &format!("Incident {}", i.id),
        "/incidents",
        Some(&user),
        body,
    ))
}

/// The detail page's body: `i`, what it means, its sign-off forms and, when it names a page,
/// `same` (that page's filter and the other incidents on it).
fn detail(
    i: &Incident,
    same: Option<&(IncidentFilter, Vec<Incident>)>,
    user: &SessionUser,
) -> Markup {
    let details = serde_json::from_str::<serde_json::Value>(&i.details)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| i.details.clone());
    let signoff = |s: &Option<Signoff>| match s {
        Some(s) => html! { (time(s.at)) " by " (s.by) " — " (s.note) },
        None => html! { "—" },
    };
    html! {
        table id="incident" {
            tr { th { "kind" } td { (i.kind) } }
            tr { th { "severity" } td { (severity_badge(i.severity)) } }
            tr { th { "status" } td id="status" { (status_badge(i.status)) } }
            tr { th { "detected" } td { (time(i.created_at)) } }
            tr { th { "tenant" } td { (opt(&i.tenant)) } }
            tr { th { "other tenant" } td { (opt(&i.other_tenant)) } }
            tr { th { "node" } td { (opt(&i.node)) } }
            tr { th { "page" } td { (dash_or(i.page)) } }
            tr { th { "generation" } td { (dash_or(i.generation)) } }
            tr { th { "request" } td { (opt(&i.request_id)) } }
            tr { th { "acknowledged" } td { (signoff(&i.acknowledged)) } }
            tr { th { "resolved" } td { (signoff(&i.resolved)) } }
        }
        (explained(i))
        h2 { "Details" }
        pre { (details) }
        (actions(i, &format!("/incidents/{}", i.id), user))
        @if let Some((f, others)) = same {
            h2 { "Other incidents on page " (f.page.unwrap_or_default()) " of " (opt(&i.node)) }
            @if others.is_empty() {
                p id="same-page-none" { "None." }
            } @else {
                table id="same-page" {
                    tr {
                        th { "#" } th { "detected (UTC)" } th { "kind" } th { "generation" }
                        th { "status" }
                    }
                    @for o in others {
                        tr {
                            td { a href={ "/incidents/" (o.id) } { (o.id) } }
                            td { (time(o.created_at)) }
                            td { (o.kind) }
                            td { (dash_or(o.generation)) }
                            td { (status_badge(o.status)) }
                        }
                    }
                }
            }
            @let all = ListView {
                filter: f.clone(),
                page_no: 1,
                limit: super::query::DEFAULT_LIMIT,
                refresh_s: refresh::DEFAULT_S,
            };
            p { a id="all-on-page" href=(all.href(1)) { "all incidents on this page" } }
        }
    }
}

/// What the incident means, the operator's next step, and links to what it came from and to
/// its node's, tenant's and kind's other incidents.
fn explained(i: &Incident) -> Markup {
    let g = incident_guide::guide(i.kind);
    let details: serde_json::Value = serde_json::from_str(&i.details).unwrap_or_default();
    let list = ListView {
        filter: IncidentFilter::default(),
        page_no: 1,
        limit: super::query::DEFAULT_LIMIT,
        refresh_s: refresh::DEFAULT_S,
    };
    let link = |id: &str, what: String, filter: IncidentFilter| {
        html! { li { a id=(id) href=(list.href_of(&filter, 1)) { (what) } } }
    };
    html! {
        h2 { "What it means" }
        p id="meaning" { (g.meaning) }
        h2 { "What to do" }
        p id="next-step" { (g.next) }
        h2 { "Related" }
        ul id="related" {
            @if let Some(run) = details["run_id"].as_i64() {
                li { a id="probe-run" href=(run_href(ProbeRunId(run))) { "probe run " (run) } }
            }
            @if let Some(trace) = details["trace_id"].as_str() {
                li { "trace id " code { (trace) } }
            }
            @if let Some(node) = &i.node {
                (link("node-incidents", format!("every incident on {node}"), IncidentFilter {
                    node: Some(node.clone()),
                    ..IncidentFilter::default()
                }))
            }
            @if let Some(tenant) = &i.tenant {
                (link("tenant-incidents", format!("every incident of tenant {tenant}"), IncidentFilter {
                    tenant: Some(tenant.clone()),
                    ..IncidentFilter::default()
                }))
            }
            (link("kind-incidents", format!("every {} incident", i.kind), IncidentFilter {
                kind: Some(i.kind),
                ..IncidentFilter::default()
            }))
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounts::{Principal, Role};
    use crate::domain::{IncidentKind, Severity, UnixMs};

    fn operator() -> SessionUser {
        SessionUser {
            who: Principal {
                name: "ops".into(),
                role: Role::Operator,
            },
            csrf: "tok\"><script>".into(),
        }
    }

    fn incident(id: i64) -> Incident {
        Incident {
            id: IncidentId(id),
            kind: IncidentKind::CrossTenantMarker,
            severity: Severity::Critical,
            status: IncidentStatus::Acknowledged,
            node: Some("decode</td><b>1".into()),
            request_id: Some("<script>alert(1)</script>".into()),
            tenant: Some("\"bob\" & 'x'".into()),
            other_tenant: None,
            page: Some(7),
            generation: Some(3),
            details: r#"{"message":"</td><b>bold</b>","trace_id":"<i>t"}"#.into(),
            created_at: UnixMs(0),
            acknowledged: Some(Signoff {
                by: "ops</td>".into(),
                at: UnixMs(0),
                note: "</td><b>seen".into(),
            }),
            resolved: None,
        }
    }

    #[test]
    fn the_detail_page_escapes_every_field_it_shows() {
        let i = incident(1);
        let same = (same_page(&i).unwrap(), vec![incident(2)]);
        let html = detail(&i, Some(&same), &operator()).into_string();
        for raw in ["</td><b>", "<b>bold", "<i>t", "<script>", "ops</td>"] {
            assert!(!html.contains(raw), "{raw} unescaped in {html}");
        }
        assert!(
            html.contains("<td>decode&lt;/td&gt;&lt;b&gt;1</td>"),
            "{html}"
        );
        assert!(
            html.contains("<td>&quot;bob&quot; &amp; 'x'</td>"),
            "{html}"
        );
        assert!(html.contains("<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>"));
        assert!(html.contains("by ops&lt;/td&gt; — &lt;/td&gt;&lt;b&gt;seen</td>"));
        assert!(
            html.contains("&quot;message&quot;: &quot;&lt;/td&gt;&lt;b&gt;bold&lt;/b&gt;&quot;")
        );
        assert!(html.contains("trace id <code>&lt;i&gt;t</code>"));
        assert!(html.contains(">every incident on decode&lt;/td&gt;&lt;b&gt;1</a>"));
        assert!(html.contains("<h2>Other incidents on page 7 of decode&lt;/td&gt;&lt;b&gt;1</h2>"));
        // The acknowledged incident can still be resolved, with the session's token.
        assert!(html.contains(
            "<input type=\"hidden\" name=\"csrf\" value=\"tok&quot;&gt;&lt;script&gt;\">"
        ));
        assert!(html.contains("id=\"resolve-1\"") && !html.contains("id=\"ack-1\""));
        assert!(html.contains("<a href=\"/incidents/2\">2</a>"));
    }

    #[test]
    fn list_cells_and_forms_escape_what_they_link() {
        let i = incident(5);
        let view = ListView {
            filter: IncidentFilter::default(),
            page_no: 1,
            limit: super::super::query::DEFAULT_LIMIT,
            refresh_s: 0,
        };
        let (page_cell, _) = page_cells(&i, &view);
        let page_cell = page_cell.into_string();
        assert!(
            page_cell.contains("title=\"incidents on this page of decode&lt;/td&gt;&lt;b&gt;1\""),
            "{page_cell}"
        );
        let forms = actions(&i, "/incidents?node=\"><b>", &operator()).into_string();
        assert!(!forms.contains("\"><b>"), "{forms}");
        assert!(forms.contains("name=\"back\" value=\"/incidents?node=&quot;&gt;&lt;b&gt;\""));
        let none = actions(
            &i,
            "/",
            &SessionUser {
                who: Principal {
                    name: "v".into(),
                    role: Role::Viewer,
                },
                csrf: String::new(),
            },
        );
        assert!(none.into_string().is_empty());
    }
}
