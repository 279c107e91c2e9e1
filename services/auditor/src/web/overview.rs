//! `GET /overview`, the auditor's home: the suite at a glance over a chosen time range (15
//! minutes to 7 days): the router's live workers and context, the workers' preflight reports,
//! sampled traffic and its first-token latency, open incidents by kind, the last probe run, and
//! isolation (the side-channel audit's newest verdicts, the recompute audit's totals).

use std::collections::BTreeMap;
use std::fmt::Write;

use axum::extract::{Query, State};
use axum::response::Html;
use axum::Extension;
use pagewarden_types::worker_status::{WorkerState, WorkerStatus};
use serde::Deserialize;

use super::html::{esc, page, time};
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
) -> Result<Html<String>, WebError> {
    let name = q.range.as_deref().unwrap_or("1h");
    let &(name, range_ms) = RANGES.iter().find(|(n, _)| *n == name).ok_or_else(|| {
        WebError::BadRequest(format!(
            "range must be one of {}, got {name:?}",
            RANGES.map(|(n, _)| n).join(", ")
        ))
    })?;
    let store = st.engine.store();
    let now = UnixMs::now();
    let since = UnixMs(now.0 - range_ms);
    let mut b = String::from("<p id=\"ranges\">Range: ");
    for (n, _) in RANGES {
        if n == name {
            let _ = write!(b, "<strong>{n}</strong> ");
        } else {
            let _ = write!(b, "<a href=\"/overview?range={n}\">{n}</a> ");
        }
    }
    b.push_str("</p>");

    // The suite and its workers, as the router sees them, beside their preflight reports.
    let router = match &st.prober {
        None => RouterView::NotConfigured,
        Some(p) => match p.router_health().await {
            Ok(h) => RouterView::Answered(h),
            Err(e) => RouterView::Silent(e),
        },
    };
    let nodes = store.nodes().await?;
    b.push_str(&suite(&router, &nodes));

    // Sampled traffic over the range.
    let samples = store.recent_samples(since, SAMPLES_READ).await?;
    b.push_str(&traffic(&samples, name));

    // Open incidents by kind.
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
    b.push_str("<h2>Open incidents</h2>");
    if by_kind.is_empty() {
        b.push_str("<p id=\"open-incidents\" class=\"ok\">None open.</p>");
    } else {
        b.push_str("<table id=\"open-incidents\"><tr><th>kind</th><th>open</th></tr>");
        for (kind, n) in &by_kind {
            let _ = write!(
                b,
                "<tr><td><a href=\"/incidents?status=open&amp;kind={kind}\">{kind}</a></td>\
                 <td class=\"bad\">{n}</td></tr>"
            );
        }
        b.push_str("</table>");
    }

    // The last probe run and isolation.
    b.push_str("<h2>Probes and isolation</h2>");
    match store.probe_runs(1).await?.first() {
        Some(r) => {
            let _ = write!(
                b,
                "<p id=\"last-probe\">Last probe run <a href=\"{href}\">{id}</a> \
                 ({} sweep, started {}): <span class=\"{}\">{}</span>, {}</p>",
                r.sweep,
                time(r.started_at),
                if r.failures == 0 { "ok" } else { "bad" },
                r.status,
                esc(&r.message),
                id = r.id.0,
                href = run_href(r.id),
            );
        }
        None => b.push_str("<p id=\"last-probe\" class=\"muted\">No probe run yet.</p>"),
    }
    let verdicts = store.isolation_audits(since, 2000).await?;
    let newest = newest_verdicts(&verdicts);
    let leaks = newest.values().filter(|v| v.audit.leak).count();
    let _ = write!(
        b,
        "<p id=\"isolation\">Side-channel audit in the range: {} worker/channel verdicts, \
         <span class=\"{}\">{leaks} leaking</span> (<a href=\"/tenants\">per worker</a>).",
        newest.len(),
        if leaks == 0 { "ok" } else { "bad" },
    );
    let recomputes = store.recompute_totals().await?;
    let (matches, mismatches) = recomputes
        .iter()
        .fold((0, 0), |(m, x), r| (m + r.matches, x + r.mismatches));
    let _ = write!(
        b,
        " Recompute audit: {matches} matched, <span class=\"{}\">{mismatches} mismatched</span> \
         (all time).</p>",
        if mismatches == 0 { "ok" } else { "bad" },
    );
    Ok(page("Overview", "/overview", Some(&user), &b))
}

/// The router's summary, then one row per worker: the router's view of it (liveness, device,
/// build, KV pool use, load) joined by node id with its newest preflight report. A worker the
/// router lists but that never reported, or one that reported but the router does not list,
/// still gets its row.
pub fn suite(router: &RouterView, nodes: &[NodeStatus]) -> String {
    let mut b = String::from("<h2>Suite</h2>");
    let mut listed: Vec<WorkerStatus> = Vec::new();
    match router {
        RouterView::NotConfigured => b.push_str(
            "<p id=\"suite\" class=\"muted\">No router configured (--router-url): the auditor \
             only sees what the services report.</p>",
        ),
        RouterView::Answered(h) => {
            let ok = h["status"] == "ok";
            let _ = write!(
                b,
                "<table id=\"suite\"><tr><th>router</th><th>live prefill workers</th>\
                 <th>live decode workers</th><th>context (tokens)</th></tr><tr>\
                 <td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr></table>",
                if ok { "ok" } else { "bad" },
                if ok { "serving" } else { "unavailable" },
                h["live_prefill"],
                h["live_decode"],
                h["effective_context"]
                    .as_u64()
                    .map_or_else(|| "—".to_string(), |c| c.to_string()),
            );
            listed = serde_json::from_value(h["workers"].clone()).unwrap_or_default();
        }
        RouterView::Silent(e) => {
            let _ = write!(
                b,
                "<p id=\"suite\" class=\"bad\">The router did not answer: {}</p>",
                esc(e)
            );
        }
    }

    b.push_str(
        "<h2>Workers</h2><table id=\"workers\"><tr><th>node</th><th>role</th><th>state</th>\
         <th>device</th><th>build</th><th>context</th><th>KV pool in use</th><th>active</th>\
         <th>queued</th><th>preflight</th><th>reported (UTC)</th></tr>",
    );
    let dash = || "—".to_string();
    let num = |v: Option<u32>| v.map_or_else(dash, |v| v.to_string());
    let mut rows = 0;
    for w in &listed {
        let report = w
            .node_id
            .as_deref()
            .and_then(|id| nodes.iter().find(|n| n.last.node == id));
        let (state_class, state) = match w.state {
            WorkerState::Live => ("ok", "live".to_string()),
            WorkerState::Unknown => ("muted", "not polled yet".to_string()),
            WorkerState::Down => (
                "bad",
                format!("down: {}", esc(w.error.as_deref().unwrap_or("no answer"))),
            ),
        };
        let kv = match (w.kv_usage(), w.total_pages, w.free_pages) {
            (Some(u), Some(total), Some(free)) => format!(
                "{:.0}% ({} of {total} pages)",
                100.0 * u,
                total.saturating_sub(free)
            ),
            _ => dash(),
        };
        let _ = write!(
            b,
            "<tr class=\"worker\" data-state=\"{}\"><td>{}</td><td>{}</td>\
             <td class=\"{state_class}\">{state}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=\"kv\">{kv}</td><td>{}</td><td>{}</td>{}</tr>",
            match w.state {
                WorkerState::Live => "live",
                WorkerState::Down => "down",
                WorkerState::Unknown => "unknown",
            },
            w.node_id.as_deref().map_or_else(dash, esc),
            esc(&w.role),
            w.arithmetic.as_deref().map_or_else(dash, esc),
            w.version.as_deref().map_or_else(dash, esc),
            num(w.context_length),
            num(w.active_requests),
            num(w.queue_depth),
            preflight_cells(report),
        );
        rows += 1;
    }
    // Workers that reported a preflight but that the router does not list.
    for n in nodes {
        if listed
            .iter()
            .any(|w| w.node_id.as_deref() == Some(&n.last.node))
        {
            continue;
        }
        let _ = write!(
            b,
            "<tr class=\"worker\" data-state=\"unlisted\"><td>{}</td><td>{}</td>\
             <td class=\"muted\">not listed by the router</td><td>—</td><td>—</td><td>{}</td>\
             <td>—</td><td>—</td><td>—</td>{}</tr>",
            esc(&n.last.node),
            n.last.role,
            n.last.context_length,
            preflight_cells(Some(n)),
        );
        rows += 1;
    }
    b.push_str("</table>");
    if rows == 0 {
        b.push_str("<p class=\"muted\">No worker has reported yet.</p>");
    }
    b
}

/// A worker's preflight verdict and when it was reported, or dashes.
fn preflight_cells(report: Option<&NodeStatus>) -> String {
    match report {
        Some(n) => format!(
            "<td class=\"{}\">{}</td><td>{}</td>",
            if n.last.ok { "ok" } else { "bad" },
            if n.last.ok { "ok" } else { "FAILED" },
            time(n.last.at),
        ),
        None => "<td class=\"muted\">none</td><td>—</td>".to_string(),
    }
}

/// Sampled requests of the range by how they ended, and their first-token latency.
fn traffic(samples: &[SamplePoint], range: &str) -> String {
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
    format!(
        "<h2>Traffic (sampled, last {range})</h2><table id=\"traffic\"><tr><th>requests</th>\
         <th>ok</th><th>rejected</th><th>error</th><th>cancelled</th><th>error rate</th>\
         <th>TTFT p50</th><th>TTFT p95</th></tr><tr><td>{}</td><td>{}</td><td>{}</td>\
         <td class=\"{}\">{errors}</td><td>{}</td><td>{error_rate}</td><td>{}</td><td>{}</td>\
         </tr></table>",
        samples.len(),
        count(SampleStatus::Ok),
        count(SampleStatus::Rejected),
        if errors == 0 { "ok" } else { "bad" },
        count(SampleStatus::Cancelled),
        pct(0.5),
        pct(0.95),
    )
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
        let html = traffic(&samples, "1h");
        assert!(html.contains("<td>20</td><td>19</td><td>0</td><td class=\"bad\">1</td><td>0</td><td>5.0%</td><td>100 ms</td><td>180 ms</td>"), "{html}");
        let empty = traffic(&[], "15m");
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
        let html = suite(&RouterView::Answered(health), &nodes);
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
        let silent = suite(&RouterView::Silent("refused".into()), &nodes);
        assert!(silent.contains("did not answer: refused"), "{silent}");
        assert_eq!(silent.matches("data-state=\"unlisted\"").count(), 2);
    }
}
