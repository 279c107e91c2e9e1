//! `GET /overview`, the auditor's home: the suite at a glance over a chosen time range (15
//! minutes to 7 days): the router and each worker (liveness, device, build, KV pool use, load,
//! preflight), sampled traffic and its first-token latency, open incidents by kind, the last
//! probe run, and isolation (the side-channel audit's newest verdicts, the recompute audit's
//! totals).

use std::collections::BTreeMap;

use axum::extract::{Query, State};
use axum::Extension;
use maud::{html, Markup};
use pagewarden_types::worker_status::{WorkerState, WorkerStatus};
use serde::Deserialize;

use super::html::{dash_or, ok_class, page, time};
use super::pages::run_href;
use super::session::SessionUser;
use super::tenants_page::newest_verdicts;
use super::{AppState, WebError};
use crate::domain::{IncidentKind, IncidentStatus, SampleStatus, UnixMs};
use crate::store::{IncidentFilter, NodeStatus, SamplePoint, Window};

/// What the router's `/health` said, if anything.
pub enum RouterView {
    /// No `--router-url`.
    NotConfigured,
    /// Its `/health` body (200 or 503).
    Answered(serde_json::Value),
    /// It did not answer: why.
    Silent(String),
}

/// The ranges offered, by name, in milliseconds.
pub const RANGES: [(&str, i64); 5] = [
    ("15m", 15 * 60_000),
    ("1h", 3_600_000),
    ("6h", 6 * 3_600_000),
    ("24h", 24 * 3_600_000),
    ("7d", 7 * 24 * 3_600_000),
];

/// The most samples the traffic summary reads.
const SAMPLES_READ: i64 = 20_000;

/// `?range=` (default `1h`).
#[derive(Deserialize)]
pub struct RangeQuery {
    range: Option<String>,
}

/// `GET /overview?range=`
pub async fn overview(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
    Query(q): Query<RangeQuery>,
) -> Result<Markup, WebError> {
    let name = q.range.as_deref().unwrap_or("1h");
    let &(name, range_ms) = RANGES.iter().find(|(n, _)| *n == name).ok_or_else(|| {
        WebError::BadRequest(format!(
            "range must be one of {}, got {name:?}",
            RANGES.map(|(n, _)| n).join(", ")
        ))
    })?;
    let store = st.engine.store();
    let since = UnixMs(UnixMs::now().0 - range_ms);
    // The suite and its workers, as the router sees them, beside their preflight reports.
    let router = match &st.prober {
        None => RouterView::NotConfigured,
        Some(p) => match p.router_health().await {
            Ok(h) => RouterView::Answered(h),
            Err(e) => RouterView::Silent(e),
        },
    };
    let nodes = store.nodes().await?;
    let samples = store.recent_samples(since, SAMPLES_READ).await?;
    let open = store
        .incidents(
            &IncidentFilter {
                status: Some(IncidentStatus::Open),
                ..IncidentFilter::default()
            },
            Window {
                limit: 10_000,
                offset: 0,
            },
        )
        .await?;
    let mut by_kind: BTreeMap<IncidentKind, i64> = BTreeMap::new();
    for i in &open {
        *by_kind.entry(i.kind).or_default() += 1;
    }
    let last_run = store.probe_runs(1).await?.into_iter().next();
    let verdicts = store.isolation_audits(since, 2000).await?;
    let newest = newest_verdicts(&verdicts);
    let leaks = newest.values().filter(|v| v.audit.leak).count();
    let recomputes = store.recompute_totals().await?;
    let (matches, mismatches) = recomputes
        .iter()
        .fold((0, 0), |(m, x), r| (m + r.matches, x + r.mismatches));
    let body = html! {
        p id="ranges" {
            "Range: "
            @for (n, _) in RANGES {
                @if n == name { strong { (n) } } @else { a href={ "/overview?range=" (n) } { (n) } }
                " "
            }
        }
        (suite(&router, &nodes))
        (traffic(&samples, name))
        h2 { "Open incidents" }
        @if by_kind.is_empty() {
            p id="open-incidents" class="ok" { "None open." }
        } @else {
            table id="open-incidents" {
                tr { th { "kind" } th { "open" } }
                @for (kind, n) in &by_kind {
                    tr {
                        td { a href={ "/incidents?status=open&kind=" (kind) } { (kind) } }
                        td class="bad" { (n) }
                    }
                }
            }
        }
        h2 { "Probes and isolation" }
        @match &last_run {
            Some(r) => p id="last-probe" {
                "Last probe run " a href=(run_href(r.id)) { (r.id.0) }
                " (" (r.sweep) " sweep, started " (time(r.started_at)) "): "
                span class=(ok_class(r.failures == 0)) { (r.status) } ", " (r.message)
            },
            None => p id="last-probe" class="muted" { "No probe run yet." },
        }
        p id="isolation" {
            "Side-channel audit in the range: " (newest.len()) " worker/channel verdicts, "
            span class=(ok_class(leaks == 0)) { (leaks) " leaking" }
            " (" a href="/tenants" { "per worker" } ")."
            " Recompute audit: " (matches) " matched, "
            span class=(ok_class(mismatches == 0)) { (mismatches) " mismatched" } " (all time)."
        }
    };
    Ok(page("Overview", "/overview", Some(&user), body))
}

/// The router's summary, then one row per worker: the router's view of it (liveness, device,
/// build, KV pool use, load) joined by node id with its newest preflight report. A worker the
/// router lists but that never reported, or one that reported but the router does not list,
/// still gets its row.
pub fn suite(router: &RouterView, nodes: &[NodeStatus]) -> Markup {
    let listed: Vec<WorkerStatus> = match router {
        RouterView::Answered(h) => serde_json::from_value(h["workers"].clone()).unwrap_or_default(),
        RouterView::NotConfigured | RouterView::Silent(_) => Vec::new(),
    };
    let unlisted: Vec<&NodeStatus> = nodes
        .iter()
        .filter(|n| {
            !listed
                .iter()
                .any(|w| w.node_id.as_deref() == Some(&n.last.node))
        })
        .collect();
    html! {
        h2 { "Suite" }
        @match router {
            RouterView::NotConfigured => p id="suite" class="muted" {
                "No router configured (--router-url): the auditor only sees what the services \
                 report."
            },
            RouterView::Answered(h) => {
                @let ok = h["status"] == "ok";
                table id="suite" {
                    tr {
                        th { "router" } th { "live prefill workers" } th { "live decode workers" }
                        th { "context (tokens)" }
                    }
                    tr {
                        td class=(ok_class(ok)) { @if ok { "serving" } @else { "unavailable" } }
                        td { (h["live_prefill"]) } td { (h["live_decode"]) }
                        td { (dash_or(h["effective_context"].as_u64())) }
                    }
                }
            },
            RouterView::Silent(e) => p id="suite" class="bad" { "The router did not answer: " (e) },
        }
        h2 { "Workers" }
        table id="workers" {
            tr {
                th { "node" } th { "role" } th { "state" } th { "device" } th { "build" }
                th { "context" } th { "KV pool in use" } th { "active" } th { "queued" }
                th { "preflight" } th { "reported (UTC)" }
            }
            @for w in &listed {
                @let report = w.node_id.as_deref().and_then(|id| nodes.iter().find(|n| n.last.node == id));
                tr class="worker" data-state=(state_name(w.state)) {
                    td { (dash_or(w.node_id.as_ref())) }
                    td { (w.role) }
                    @match w.state {
                        WorkerState::Live => td class="ok" { "live" },
                        WorkerState::Unknown => td class="muted" { "not polled yet" },
                        WorkerState::Down => td class="bad" {
                            "down: " (w.error.as_deref().unwrap_or("no answer"))
                        },
                    }
                    td { (dash_or(w.arithmetic.as_ref())) }
                    td { (dash_or(w.version.as_ref())) }
                    td { (dash_or(w.context_length)) }
                    td class="kv" { (kv_use(w)) }
                    td { (dash_or(w.active_requests)) }
                    td { (dash_or(w.queue_depth)) }
                    (preflight_cells(report))
                }
            }
            // Workers that reported a preflight but that the router does not list.
            @for n in &unlisted {
                tr class="worker" data-state="unlisted" {
                    td { (n.last.node) } td { (n.last.role) }
                    td class="muted" { "not listed by the router" }
                    td { "—" } td { "—" } td { (n.last.context_length) }
                    td { "—" } td { "—" } td { "—" }
                    (preflight_cells(Some(n)))
                }
            }
        }
        @if listed.is_empty() && unlisted.is_empty() {
            p class="muted" { "No worker has reported yet." }
        }
    }
}

/// A worker state's name, as `data-state` carries it.
fn state_name(s: WorkerState) -> &'static str {
    match s {
        WorkerState::Live => "live",
        WorkerState::Down => "down",
        WorkerState::Unknown => "unknown",
    }
}

/// A live worker's KV pool use: `25% (16 of 64 pages)`, or a dash.
fn kv_use(w: &WorkerStatus) -> String {
    match (w.kv_usage(), w.total_pages, w.free_pages) {
        (Some(u), Some(total), Some(free)) => format!(
            "{:.0}% ({} of {total} pages)",
            100.0 * u,
            total.saturating_sub(free)
        ),
        _ => "—".to_string(),
    }
}

/// A worker's preflight verdict and when it was reported, or `none`.
fn preflight_cells(report: Option<&NodeStatus>) -> Markup {
    html! {
        @match report {
            Some(n) => {
                td class=(ok_class(n.last.ok)) { @if n.last.ok { "ok" } @else { "FAILED" } }
                td { (time(n.last.at)) }
            },
            None => { td class="muted" { "none" } td { "—" } },
        }
    }
}

/// Sampled requests of the range by how they ended, and their first-token latency.
fn traffic(samples: &[SamplePoint], range: &str) -> Markup {
    let count = |s: SampleStatus| samples.iter().filter(|p| p.status == s).count();
    let mut ttft: Vec<i64> = samples.iter().filter_map(|p| p.ttft_ms).collect();
    ttft.sort_unstable();
    let pct = |q: f64| -> String {
        if ttft.is_empty() {
            return "—".to_string();
        }
        let i = ((ttft.len() - 1) as f64 * q).round() as usize;
        format!("{} ms", ttft[i])
    };
    let errors = count(SampleStatus::Error);
    let error_rate = if samples.is_empty() {
        "—".to_string()
    } else {
        format!("{:.1}%", 100.0 * errors as f64 / samples.len() as f64)
    };
    html! {
        h2 { "Traffic (sampled, last " (range) ")" }
        table id="traffic" {
            tr {
                th { "requests" } th { "ok" } th { "rejected" } th { "error" } th { "cancelled" }
                th { "error rate" } th { "TTFT p50" } th { "TTFT p95" }
            }
            tr {
                td { (samples.len()) } td { (count(SampleStatus::Ok)) }
                td { (count(SampleStatus::Rejected)) }
                td class=(ok_class(errors == 0)) { (errors) }
                td { (count(SampleStatus::Cancelled)) } td { (error_rate) }
                td { (pct(0.5)) } td { (pct(0.95)) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_counts_each_ending_and_reads_latency_percentiles() {
        let p = |ttft: Option<i64>, status| SamplePoint {
            tenant: "t".into(),
            prompt_tokens: 10,
            ttft_ms: ttft,
            status,
            at: UnixMs(0),
        };
        let mut samples: Vec<SamplePoint> = (1..=19)
            .map(|i| p(Some(i * 10), SampleStatus::Ok))
            .collect();
        samples.push(p(None, SampleStatus::Error));
        let html = traffic(&samples, "1h").into_string();
        assert!(html.contains("<td>20</td><td>19</td><td>0</td><td class=\"bad\">1</td><td>0</td><td>5.0%</td><td>100 ms</td><td>180 ms</td>"), "{html}");
        let empty = traffic(&[], "15m").into_string();
        assert!(empty.contains("last 15m") && empty.contains("<td>—</td><td>—</td><td>—</td>"));
    }

    #[test]
    fn suite_joins_the_routers_workers_with_their_preflight() {
        use crate::domain::NodeRole;
        use crate::store::NewPreflight;
        let report = |node: &str, role, ok| NodeStatus {
            last: NewPreflight {
                node: node.into(),
                role,
                pool_tokens: 4096,
                context_length: 2048,
                ok,
                message: String::new(),
                at: UnixMs(0),
            },
            reports: 1,
        };
        let health = serde_json::json!({
            "status": "ok", "live_prefill": 0, "live_decode": 1, "effective_context": null,
            "workers": [
                {"role": "decode", "node_id": "decode-0", "state": "live", "context_length": 2048,
                 "total_pages": 64, "free_pages": 48, "active_requests": 2, "queue_depth": 1,
                 "arithmetic": "cpu:avx512", "version": "0.1.0"},
                {"role": "prefill", "node_id": "<b>p</b>", "state": "down",
                 "error": "decode is <draining>"},
                {"role": "prefill", "node_id": null, "state": "unknown"},
            ]
        });
        let nodes = [
            report("decode-0", NodeRole::Decode, true),
            report("prefill-9", NodeRole::Prefill, false),
        ];
        let html = suite(&RouterView::Answered(health), &nodes).into_string();
        assert!(
            html.contains(
                "<tr class=\"worker\" data-state=\"live\"><td>decode-0</td><td>decode</td>\
                 <td class=\"ok\">live</td><td>cpu:avx512</td><td>0.1.0</td><td>2048</td>\
                 <td class=\"kv\">25% (16 of 64 pages)</td><td>2</td><td>1</td>\
                 <td class=\"ok\">ok</td>"
            ),
            "{html}"
        );
        assert!(html.contains("<td>&lt;b&gt;p&lt;/b&gt;</td>"), "{html}");
        assert!(html.contains("down: decode is &lt;draining&gt;"), "{html}");
        assert!(
            !html.contains("<draining>") && !html.contains("<b>p"),
            "{html}"
        );
        assert!(html.contains("not polled yet"), "{html}");
        assert!(
            html.contains("data-state=\"unlisted\"><td>prefill-9</td>"),
            "{html}"
        );
        assert_eq!(html.matches("<tr class=\"worker\"").count(), 4, "{html}");
        let silent = suite(&RouterView::Silent("refused".into()), &nodes).into_string();
        assert!(silent.contains("did not answer: refused"), "{silent}");
        assert_eq!(silent.matches("data-state=\"unlisted\"").count(), 2);
    }
}
