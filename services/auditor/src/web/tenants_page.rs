//! `GET /tenants`: isolation per tenant at a glance. Each tenant's prefix-cache lookups (hits,
//! misses, tokens reused) and evictions per role, its recompute verdicts and its cache erasures;
//! then the side-channel audit's newest verdict per prefill worker and channel, linked to the
//! probe run it came from.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Extension;
use maud::{html, Markup};

use super::api::PROBE_CHART_WINDOW_MS;
use super::html::{ok_class, page, time};
use super::pages::run_href;
use super::session::SessionUser;
use super::{AppState, WebError};
use crate::domain::{IsolationChannel, UnixMs};
use crate::store::{CacheTotals, ErasureRecord, IsolationAudit, RecomputeTotals};

/// How far back the side-channel verdicts are read: a week of runs.
const VERDICT_WINDOW_MS: i64 = 7 * PROBE_CHART_WINDOW_MS;

/// `GET /tenants`
pub async fn tenants(
    State(st): State<AppState>,
    Extension(user): Extension<SessionUser>,
) -> Result<Markup, WebError> {
    let store = st.engine.store();
    let cache = store.cache_totals().await?;
    let recomputes = store.recompute_totals().await?;
    let erasures = store.erasures(500).await?;
    let since = UnixMs(UnixMs::now().0 - VERDICT_WINDOW_MS);
    let verdicts = store.isolation_audits(since, 2000).await?;
    let body = render(&cache, &recomputes, &erasures, &verdicts);
    Ok(page("Tenants and isolation", "/tenants", Some(&user), body))
}

/// The page's body (pure: what the handler read, rendered).
pub fn render(
    cache: &[CacheTotals],
    recomputes: &[RecomputeTotals],
    erasures: &[ErasureRecord],
    verdicts: &[IsolationAudit],
) -> Markup {
    // Erasures per tenant: how many, cached pages erased (zeroed) in all, the newest.
    let mut erased: BTreeMap<&str, (usize, i64, UnixMs)> = BTreeMap::new();
    for e in erasures {
        let t = erased.entry(e.tenant.as_str()).or_insert((0, 0, e.at));
        t.0 += 1;
        t.1 += e.workers.iter().map(|w| w.entries).sum::<i64>();
        t.2 = t.2.max(e.at);
    }
    let newest = newest_verdicts(verdicts);
    html! {
        h2 { "Prefix cache per tenant" }
        p class="muted" {
            "Lookups and evictions the workers reported, per tenant and role, and the cached \
             pages its namespaces hold now (each worker's last word). A tenant's hits come only \
             from its own namespace (I10); evictions with no known last user are under —."
        }
        table id="tenant-cache" {
            tr {
                th { "tenant" } th { "role" } th { "hits" } th { "misses" } th { "hit rate" }
                th { "prompt tokens" } th { "from cache" } th { "evictions" }
                th { "pages evicted" } th { "pages held" } th { "namespaces" }
            }
            @for c in cache {
                @let lookups = c.hits + c.misses;
                tr {
                    td { (tenant_cell(&c.tenant)) }
                    td { (c.role) }
                    td { (c.hits) }
                    td { (c.misses) }
                    td {
                        @if lookups > 0 {
                            (format!("{:.0}%", 100.0 * c.hits as f64 / lookups as f64))
                        } @else {
                            "—"
                        }
                    }
                    td { (c.prompt_tokens) }
                    td { (c.cached_tokens) }
                    td { (c.evictions) }
                    td { (c.evicted_pages) }
                    td class="held" { (c.pages_held) }
                    td { (c.namespaces) }
                }
            }
        }
        @if cache.is_empty() {
            p class="muted" id="no-cache-events" { "No prefix-cache events yet." }
        }

        h2 { "Recompute audit per tenant" }
        p class="muted" {
            "Served answers scored again on a clean pass: a mismatch is an answer computed over \
             something other than its own prompt (an incident)."
        }
        table id="tenant-recomputes" {
            tr { th { "tenant" } th { "match" } th { "mismatch" } th { "failed" } th { "newest" } }
            @for r in recomputes {
                tr {
                    td { (tenant_cell(&r.tenant)) }
                    td { (r.matches) }
                    td class=(ok_class(r.mismatches == 0)) { (r.mismatches) }
                    td { (r.failed) }
                    td { (time(r.last_at)) }
                }
            }
        }

        h2 { "Cache erasures per tenant" }
        table id="tenant-erasures" {
            tr { th { "tenant" } th { "erasures" } th { "pages erased" } th { "newest" } }
            @for (tenant, (n, pages, at)) in &erased {
                tr {
                    td { (tenant_cell(tenant)) }
                    td { (n) }
                    td { (pages) }
                    td { (time(*at)) }
                }
            }
        }

        h2 { "Side-channel audit per worker" }
        p class="muted" {
            "The newest verdict of each prefill worker and channel over the last 7 days: \
             whether another tenant can tell, by first-token times (timing) or by the order its \
             requests come back in (order), that a prompt was cached by someone else. History: \
             the chart on "
            a href="/probes" { "Probes" } "."
        }
        table id="worker-isolation" {
            tr {
                th { "worker" } th { "channel" } th { "p" } th { "threshold" } th { "verdict" }
                th { "rounds" } th { "when" } th { "run" }
            }
            @for ((worker, channel), v) in &newest {
                @let a = &v.audit;
                @let (class, verdict) = match (a.leak, a.conclusive) {
                    (true, _) => ("bad", "leak"),
                    (false, true) => ("ok", "isolated"),
                    (false, false) => ("muted", "inconclusive"),
                };
                tr {
                    td { (worker) }
                    td { (channel) }
                    td { (format!("{:.2e}", a.p)) }
                    td { (format!("{:.0e}", a.threshold)) }
                    td class=(class) { (verdict) }
                    td { (a.rounds) }
                    td { (time(a.at)) }
                    td { a href=(run_href(a.run_id)) { (a.run_id.0) } }
                }
            }
        }
        @if newest.is_empty() {
            p class="muted" id="no-isolation-verdicts" {
                "No side-channel audit yet (it needs two probe tenants)."
            }
        }
    }
}

/// The newest verdict of each (worker, channel) of `verdicts` (oldest first).
pub fn newest_verdicts(
    verdicts: &[IsolationAudit],
) -> BTreeMap<(&str, IsolationChannel), &IsolationAudit> {
    let mut newest = BTreeMap::new();
    for v in verdicts {
        newest.insert((v.audit.worker.as_str(), v.audit.channel), v);
    }
    newest
}

/// A tenant's name; an unknown one as —.
fn tenant_cell(tenant: &str) -> &str {
    if tenant.is_empty() {
        "—"
    } else {
        tenant
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{NodeRole, ProbeRunId};
    use crate::store::{ErasedWorker, NewIsolationAudit};

    #[test]
    fn each_tenant_and_each_worker_channel_gets_a_row_escaped() {
        let cache = [CacheTotals {
            role: NodeRole::Prefill,
            tenant: "alice<b>".into(),
            hits: 3,
            misses: 1,
            evictions: 0,
            prompt_tokens: 400,
            cached_tokens: 300,
            evicted_pages: 0,
            namespaces: 1,
            pages_held: 6,
        }];
        let recomputes = [RecomputeTotals {
            tenant: "bob".into(),
            matches: 12,
            mismatches: 1,
            failed: 0,
            last_at: UnixMs(0),
        }];
        let erasures = [ErasureRecord {
            id: 1,
            tenant: "bob".into(),
            namespace: "ns".into(),
            digest: "00".into(),
            at: UnixMs(0),
            workers: vec![ErasedWorker {
                node: "prefill-0".into(),
                role: NodeRole::Prefill,
                entries: 7,
                pages_zeroed: 7,
                pages_deferred: 0,
                digest: "ab".repeat(32),
            }],
        }];
        let verdict = |channel, p: f64, at, run| IsolationAudit {
            id: at,
            audit: NewIsolationAudit {
                run_id: ProbeRunId(run),
                worker: "prefill-0".into(),
                channel,
                rounds: 8,
                p,
                control_p: None,
                threshold: 1e-3,
                conclusive: true,
                leak: p < 1e-3,
                at: UnixMs(at),
            },
        };
        let verdicts = [
            verdict(IsolationChannel::Timing, 2e-5, 1, 4),
            verdict(IsolationChannel::Timing, 0.6, 2, 5),
            verdict(IsolationChannel::Order, 2e-5, 2, 5),
        ];
        let html = render(&cache, &recomputes, &erasures, &verdicts).into_string();
        assert!(html
            .contains("<td>alice&lt;b&gt;</td><td>prefill</td><td>3</td><td>1</td><td>75%</td>"));
        assert!(
            html.contains("<td class=\"held\">6</td><td>1</td></tr>"),
            "{html}"
        );
        assert!(html.contains("<td>bob</td><td>12</td><td class=\"bad\">1</td>"));
        assert!(html.contains("<td>bob</td><td>1</td><td>7</td>"));
        // The newest timing verdict (run 5, isolated) replaced the older leak; order leaks.
        assert!(html.contains(
            "<td>timing</td><td>6.00e-1</td><td>1e-3</td><td class=\"ok\">isolated</td>"
        ));
        assert!(
            html.contains("<td>order</td><td>2.00e-5</td><td>1e-3</td><td class=\"bad\">leak</td>")
        );
        assert!(html.contains("<a href=\"/probes/runs/5\">5</a>"));
        assert!(!html.contains("run-4"));
        let empty = render(&[], &[], &[], &[]).into_string();
        assert!(
            empty.contains("id=\"no-cache-events\"")
                && empty.contains("id=\"no-isolation-verdicts\"")
        );
    }

    #[test]
    fn tenant_and_worker_names_cannot_inject_markup() {
        let script = "<script>alert(1)</script>";
        let quoted = "\"quoted\" & 'x'";
        let cache = [CacheTotals {
            role: NodeRole::Decode,
            tenant: script.into(),
            hits: 0,
            misses: 0,
            evictions: 1,
            prompt_tokens: 0,
            cached_tokens: 0,
            evicted_pages: 2,
            namespaces: 1,
            pages_held: 0,
        }];
        let recomputes = [RecomputeTotals {
            tenant: quoted.into(),
            matches: 1,
            mismatches: 0,
            failed: 0,
            last_at: UnixMs(0),
        }];
        let erasures = [ErasureRecord {
            id: 1,
            tenant: script.into(),
            namespace: "ns".into(),
            digest: "00".into(),
            at: UnixMs(0),
            workers: vec![],
        }];
        let verdicts = [IsolationAudit {
            id: 1,
            audit: NewIsolationAudit {
                run_id: ProbeRunId(9),
                worker: "</td><b>w".into(),
                channel: IsolationChannel::Order,
                rounds: 8,
                p: 0.5,
                control_p: None,
                threshold: 1e-3,
                conclusive: false,
                leak: false,
                at: UnixMs(0),
            },
        }];
        let html = render(&cache, &recomputes, &erasures, &verdicts).into_string();
        for raw in [script, quoted, "</td><b>"] {
            assert!(!html.contains(raw), "{raw} unescaped in {html}");
        }
        let escaped = "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>";
        assert!(html.contains(&format!(
            "{escaped}<td>decode</td><td>0</td><td>0</td><td>—</td>"
        )));
        assert!(
            html.contains(&format!("{escaped}<td>1</td><td>0</td>")),
            "{html}"
        );
        assert!(
            html.contains("<td>&quot;quoted&quot; &amp; 'x'</td><td>1</td><td class=\"ok\">0</td>")
        );
        assert!(html.contains("<td>&lt;/td&gt;&lt;b&gt;w</td><td>order</td>"));
        assert!(html.contains("<td class=\"muted\">inconclusive</td>"));
    }
}
