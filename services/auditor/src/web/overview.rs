//! `GET /overview`, the auditor's home: the suite at a glance over a chosen time range (15
//! minutes to 7 days): the router's live workers and context, the workers' preflight reports,
//! sampled traffic and its first-token latency, open incidents by kind, the last probe run, and
//! isolation (the side-channel audit's newest verdicts, the recompute audit's totals).

use std::collections::BTreeMap;
use std::fmt::Write;

use axum::extract::{Query, State};
use axum::response::Html;
use axum::Extension;
use serde::Deserialize;

use super::html::{esc, page, time};
use super::session::SessionUser;
use super::tenants_page::newest_verdicts;
use super::{AppState, WebError};
use crate::domain::{IncidentKind, IncidentStatus, SampleStatus, UnixMs};
use crate::store::{IncidentFilter, SamplePoint, Window};

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

    // The suite, as the router sees it.
    b.push_str("<h2>Suite</h2>");
    match &st.prober {
        None => b.push_str(
            "<p id=\"suite\" class=\"muted\">No router configured (--router-url): the auditor \
             only sees what the services report.</p>",
        ),
        Some(p) => match p.router_health().await {
            Ok(h) => {
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
            }
            Err(e) => {
                let _ = write!(
                    b,
                    "<p id=\"suite\" class=\"bad\">The router did not answer: {}</p>",
                    esc(&e)
                );
            }
        },
    }

    // Workers, from their preflight reports.
    let nodes = store.nodes().await?;
    b.push_str(
        "<h2>Workers</h2><table id=\"workers\"><tr><th>node</th><th>role</th><th>context</th>\
         <th>pool tokens</th><th>preflight</th><th>reported (UTC)</th></tr>",
    );
    for n in &nodes {
        let p = &n.last;
        let _ = write!(
            b,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td>\
             <td>{}</td></tr>",
            esc(&p.node),
            p.role,
            p.context_length,
            p.pool_tokens,
            if p.ok { "ok" } else { "bad" },
            if p.ok { "ok" } else { "FAILED" },
            time(p.at),
        );
    }
    b.push_str("</table>");
    if nodes.is_empty() {
        b.push_str("<p class=\"muted\">No worker has reported yet.</p>");
    }

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
                "<p id=\"last-probe\">Last probe run <a href=\"/probes#run-{id}\">{id}</a> \
                 ({} sweep, started {}): <span class=\"{}\">{}</span>, {}</p>",
                r.sweep,
                time(r.started_at),
                if r.failures == 0 { "ok" } else { "bad" },
                r.status,
                esc(&r.message),
                id = r.id.0,
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
    Ok(Html(
        page("Overview", "/overview", Some(&user), maud::PreEscaped(b)).into_string(),
    ))
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
}
