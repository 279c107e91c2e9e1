//! End to end over real listeners: reports over gRPC become open incidents, visible in the
//! JSON API and the HTML UI, and operators move them along.

use std::time::{Duration, Instant};

use pagewarden_auditor::client::AuditorClient as BufferedClient;
use pagewarden_auditor::Running;
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::auditor_client::AuditorClient;
use pagewarden_testkit::eventually;
use serde_json::{json, Value};
use tonic::transport::Channel;

use crate::auth::{self, Signed, OPERATOR, OPS_TOKEN};

pub async fn start() -> Running {
    pagewarden_auditor::start(&auth::config("sqlite::memory:"), None)
        .await
        .expect("auditor starts")
}

pub async fn grpc(r: &Running) -> AuditorClient<Channel> {
    AuditorClient::connect(format!("http://{}", r.grpc_addr))
        .await
        .expect("gRPC connects")
}

/// GETs a JSON API `url` with the operator token.
pub async fn get_json(url: String) -> Value {
    let resp = reqwest::Client::new()
        .get(&url)
        .bearer_auth(OPS_TOKEN)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "GET {url}: {}", resp.status());
    resp.json().await.unwrap()
}

/// GETs an open endpoint (`/health`, `/metrics`) as text.
pub async fn get_text(url: String) -> String {
    let resp = reqwest::get(&url).await.unwrap();
    assert!(resp.status().is_success(), "GET {url}: {}", resp.status());
    resp.text().await.unwrap()
}

/// GETs a page `url` (`http://host:port/path`) signed in as the operator.
pub async fn get_page(url: String) -> String {
    let rest = url.strip_prefix("http://").expect("an http:// url");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let resp = Signed::sign_in(&format!("http://{host}"), OPERATOR)
        .await
        .get(path)
        .await;
    assert!(resp.status().is_success(), "GET {url}: {}", resp.status());
    resp.text().await.unwrap()
}

/// Polls the JSON API until an open incident of `kind` shows up; panics after 5 s.
pub async fn wait_open_incident(r: &Running, kind: &str) -> (Value, Duration) {
    let started = Instant::now();
    let url = format!(
        "http://{}/api/incidents?status=open&kind={kind}",
        r.http_addr
    );
    let what = format!("an open {kind} incident");
    let first = eventually(Duration::from_secs(5), &what, || async {
        let list = get_json(url.clone()).await;
        list.as_array().and_then(|a| a.first()).cloned()
    })
    .await;
    (first, started.elapsed())
}

/// Reports one integrity event of each of `kinds` from `node` over gRPC.
pub async fn report_kinds(r: &Running, node: &str, kinds: &[pb::IntegrityKind]) {
    let mut g = grpc(r).await;
    for kind in kinds {
        g.report_integrity(pb::IntegrityReport {
            kind: *kind as i32,
            node: node.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
}

/// The id of the first open incident of `kind` (waiting for it as [`wait_open_incident`]).
pub async fn open_incident_id(r: &Running, kind: &str) -> i64 {
    wait_open_incident(r, kind).await.0["id"].as_i64().unwrap()
}

fn req_ref(b: u8) -> Option<pb::RequestRef> {
    Some(pb::RequestRef {
        request_id: vec![b; 16],
        attempt: 1,
    })
}

#[tokio::test]
async fn cross_tenant_marker_in_a_sample_opens_an_incident() {
    let r = start().await;
    let mut g = grpc(&r).await;
    let alice = g
        .issue_marker(pb::IssueMarkerRequest {
            tenant: "alice".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(alice.marker.starts_with("PWCANARY-"));
    // Bob's response carries Alice's marker: her data conditioned his answer.
    let ack = g
        .report_sample(pb::SampleReport {
            tenant: "bob".into(),
            req: req_ref(0xab),
            prompt_tokens: 12,
            completion_tokens: 7,
            response_text: format!("sure, here it is: {} ...", alice.marker),
            ttft_ms: Some(40),
            status: pb::SampleStatus::Ok as i32,
            node: "decode-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.incidents_opened, 1);
    let (inc, took) = wait_open_incident(&r, "cross_tenant_marker").await;
    println!("cross-tenant incident visible after {took:?}");
    assert_eq!(inc["tenant"], "bob");
    assert_eq!(inc["other_tenant"], "alice");
    assert_eq!(inc["severity"], "critical");
    assert_eq!(inc["node"], "decode-1");
    assert_eq!(inc["request_id"], "ab".repeat(16));
    let id = inc["id"].as_i64().unwrap();

    let list_html = get_page(format!("http://{}/incidents?status=open", r.http_addr)).await;
    assert!(
        list_html.contains(&format!("id=\"incident-{id}\" data-status=\"open\"")),
        "{list_html}"
    );
    assert!(list_html.contains("cross_tenant_marker"));
    let detail = get_page(format!("http://{}/incidents/{id}", r.http_addr)).await;
    assert!(
        detail.contains(&alice.marker),
        "detail page shows the leaked marker"
    );
    // It explains itself and links to the node's, the tenant's and the kind's other incidents.
    assert!(detail.contains("<p id=\"meaning\">A response to one tenant contained a canary"));
    assert!(detail.contains("<p id=\"next-step\">Treat it as a data exposure"));
    assert!(detail.contains("id=\"node-incidents\" href=\"/incidents?node=decode-1\""));
    assert!(detail.contains("id=\"tenant-incidents\" href=\"/incidents?tenant=bob\""));
    assert!(detail.contains("id=\"kind-incidents\" href=\"/incidents?kind=cross_tenant_marker\""));
    assert!(
        !detail.contains("id=\"probe-run\""),
        "a sample's incident names no probe run"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn generation_mismatch_opens_an_incident_and_operators_resolve_it() {
    let r = start().await;
    // Sent through the buffered client router and workers use.
    let client = BufferedClient::spawn(&format!("http://{}", r.grpc_addr), 16).unwrap();
    assert!(client.report_integrity(pb::IntegrityReport {
        kind: pb::IntegrityKind::GenerationMismatch as i32,
        node: "decode-0".into(),
        req: req_ref(7),
        tenant: "carol".into(),
        page: Some(42),
        generation: Some(9),
        details: "presented generation 8, page is at 9".into(),
    }));
    let (inc, took) = wait_open_incident(&r, "generation_mismatch").await;
    println!("generation-mismatch incident visible after {took:?}");
    assert_eq!(client.stats().sent, 1);
    assert_eq!(inc["tenant"], "carol");
    assert_eq!(inc["node"], "decode-0");
    let id = inc["id"].as_i64().unwrap();
    let details: Value = serde_json::from_str(inc["details"].as_str().unwrap()).unwrap();
    assert_eq!(details["page"], 42);
    assert_eq!(details["generation"], 9);
    let html = get_page(format!(
        "http://{}/incidents?kind=generation_mismatch",
        r.http_addr
    ))
    .await;
    assert!(html.contains(&format!("id=\"incident-{id}\" data-status=\"open\"")));

    let http = reqwest::Client::new();
    let base = format!("http://{}/api/incidents/{id}", r.http_addr);
    let acked: Value = http
        .post(format!("{base}/ack"))
        .bearer_auth(OPS_TOKEN)
        .json(&json!({"note": "paging decode owner"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(acked["status"], "acknowledged");
    assert_eq!(acked["acknowledged"]["by"], "ops-token");
    assert_eq!(get_json(base.clone()).await["status"], "acknowledged");
    let html = get_page(format!("http://{}/incidents", r.http_addr)).await;
    assert!(html.contains(&format!(
        "id=\"incident-{id}\" data-status=\"acknowledged\""
    )));

    let resolved: Value = http
        .post(format!("{base}/resolve"))
        .bearer_auth(OPS_TOKEN)
        .json(&json!({"note": "stale read fenced; kernel fix deployed"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(resolved["status"], "resolved");
    assert_eq!(
        resolved["resolved"]["note"],
        "stale read fenced; kernel fix deployed"
    );
    let detail = get_page(format!("http://{}/incidents/{id}", r.http_addr)).await;
    assert!(detail.contains("status-resolved") && detail.contains("ops-token"));

    // Resolved is terminal.
    let again = http
        .post(format!("{base}/resolve"))
        .bearer_auth(OPS_TOKEN)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 409);
    let err: Value = again.json().await.unwrap();
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("resolved"));
    assert_eq!(
        http.get(format!("http://{}/api/incidents/424242", r.http_addr))
            .bearer_auth(OPS_TOKEN)
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    r.shutdown().await;
}

#[tokio::test]
async fn html_forms_acknowledge_and_resolve() {
    let r = start().await;
    report_kinds(&r, "decode-0", &[pb::IntegrityKind::ChecksumMismatch]).await;
    let id = open_incident_id(&r, "checksum_mismatch").await;
    let base = format!("http://{}", r.http_addr);
    let ops = Signed::sign_in(&base, OPERATOR).await;
    let csrf = ops.csrf.clone();
    let resp = ops
        .post(
            &format!("/incidents/{id}/ack"),
            &base,
            &[
                ("csrf", csrf.as_str()),
                ("note", "seen"),
                ("back", "/incidents?status=open"),
            ],
        )
        .await;
    assert_eq!(resp.status(), 303);
    assert_eq!(resp.headers()["location"], "/incidents?status=open");
    assert_eq!(
        get_json(format!("http://{}/api/incidents/{id}", r.http_addr)).await["status"],
        "acknowledged"
    );
    // An off-site `back` is ignored.
    let resp = ops
        .post(
            &format!("/incidents/{id}/resolve"),
            &base,
            &[("csrf", csrf.as_str()), ("back", "//evil.example/")],
        )
        .await;
    assert_eq!(
        resp.headers()["location"],
        format!("/incidents/{id}").as_str()
    );
    assert_eq!(
        get_json(format!("http://{}/api/incidents/{id}", r.http_addr)).await["status"],
        "resolved"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_clean_run_opens_no_incident() {
    let r = start().await;
    let mut g = grpc(&r).await;
    let mut own = Vec::new();
    for t in ["alice", "bob"] {
        let m = g
            .issue_marker(pb::IssueMarkerRequest { tenant: t.into() })
            .await
            .unwrap()
            .into_inner();
        own.push((t, m.marker));
    }
    for (i, (t, m)) in own.iter().enumerate() {
        for status in [pb::SampleStatus::Ok, pb::SampleStatus::Cancelled] {
            let ack = g
                .report_sample(pb::SampleReport {
                    tenant: t.to_string(),
                    req: req_ref(i as u8),
                    prompt_tokens: 30,
                    completion_tokens: 4,
                    // Own markers only, plus an unknown marker-shaped string.
                    response_text: format!("{m} echoed; PWCANARY-0000000000000000 is nobody's"),
                    ttft_ms: Some(15),
                    status: status as i32,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(ack.incidents_opened, 0);
        }
    }
    g.report_sample(pb::SampleReport {
        tenant: "bob".into(),
        response_digest: vec![1, 2, 3],
        status: pb::SampleStatus::Rejected as i32,
        ..Default::default()
    })
    .await
    .unwrap();
    g.report_preflight(pb::PreflightReport {
        node: "decode-0".into(),
        role: "decode".into(),
        pool_tokens: 65536,
        context_length: 8192,
        ok: true,
        message: "pool holds 8x context".into(),
    })
    .await
    .unwrap();
    let list = get_json(format!("http://{}/api/incidents", r.http_addr)).await;
    assert_eq!(list, json!([]), "a clean run must open nothing");
    let summary = get_json(format!("http://{}/api/summary", r.http_addr)).await;
    assert_eq!(summary["samples"]["samples"], 5);
    assert_eq!(summary["samples"]["scanned"], 4);
    assert_eq!(summary["samples"]["with_foreign_markers"], 0);
    let html = get_page(format!("http://{}/incidents", r.http_addr)).await;
    assert!(html.contains("id=\"no-incidents\""));
    // Every sample is a dot of the traffic chart; the refused one has no first token.
    let html = get_page(format!("http://{}/probes", r.http_addr)).await;
    assert!(html.contains("id=\"traffic-chart\""));
    assert_eq!(html.matches("class=\"sample status-").count(), 5);
    assert!(
        html.contains("bob: 0 prompt tokens, no first token, rejected"),
        "{html}"
    );
    let api = get_json(format!("http://{}/api/samples/recent", r.http_addr)).await;
    assert_eq!(api.as_array().unwrap().len(), 5);
    let metrics = get_text(format!("http://{}/metrics", r.http_addr)).await;
    assert!(
        metrics.contains("pagewarden_auditor_samples_total 5"),
        "{metrics}"
    );
    assert!(metrics.contains("pagewarden_auditor_incidents{status=\"open\"} 0"));
    r.shutdown().await;
}

#[tokio::test]
async fn preflight_failures_open_incidents_and_fill_the_node_table() {
    let r = start().await;
    let mut g = grpc(&r).await;
    let report = |node: &str, pool: u64, ok: bool| pb::PreflightReport {
        node: node.into(),
        role: "decode".into(),
        pool_tokens: pool,
        context_length: 8192,
        ok,
        message: String::new(),
    };
    let fine = g
        .report_preflight(report("decode-ok", 16384, true))
        .await
        .unwrap()
        .into_inner();
    let failed = g
        .report_preflight(report("decode-small", 4096, false))
        .await
        .unwrap()
        .into_inner();
    // Claims ok with a pool smaller than its context: I7 is broken whatever it says.
    let liar = g
        .report_preflight(report("decode-liar", 4096, true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            fine.incidents_opened,
            failed.incidents_opened,
            liar.incidents_opened
        ),
        (0, 1, 1)
    );
    let incidents = get_json(format!(
        "http://{}/api/incidents?kind=preflight_failed",
        r.http_addr
    ))
    .await;
    let mut nodes: Vec<&str> = incidents
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["node"].as_str().unwrap())
        .collect();
    nodes.sort();
    assert_eq!(nodes, vec!["decode-liar", "decode-small"]);
    let table = get_json(format!("http://{}/api/nodes", r.http_addr)).await;
    assert_eq!(table.as_array().unwrap().len(), 3);
    let html = get_page(format!("http://{}/nodes", r.http_addr)).await;
    assert!(html.contains("decode-small") && html.contains("FAILED"));

    let bad = g
        .report_preflight(pb::PreflightReport {
            node: "x".into(),
            role: "router".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    let bad = g
        .report_integrity(pb::IntegrityReport {
            node: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    r.shutdown().await;
}

/// Workers' prefix-cache events are kept per role and tenant (namespace tags only), counted in
/// the metrics by tenant name, and opened no incident; inconsistent ones are refused.
#[tokio::test]
async fn prefix_cache_events_are_kept_per_tenant() {
    let r = start().await;
    let mut g = grpc(&r).await;
    let event = |kind: pb::CacheEventKind, role: &str, tenant: &str, cached: u32, pages: u32| {
        pb::CacheReport {
            kind: kind as i32,
            node: format!("{role}-0"),
            role: role.into(),
            tenant: tenant.into(),
            namespace: if tenant == "bob" {
                "0badcafe"
            } else {
                "a1b2c3d4"
            }
            .into(),
            req: req_ref(3),
            prompt_tokens: if pages > 0 { 0 } else { 100 },
            cached_tokens: cached,
            pages,
        }
    };
    use pb::CacheEventKind::{Eviction, Held, Hit, Miss};
    for e in [
        event(Miss, "prefill", "alice", 0, 0),
        event(Hit, "prefill", "alice", 96, 0),
        event(Hit, "decode", "alice", 96, 0),
        event(Miss, "prefill", "bob", 0, 0),
        event(Eviction, "prefill", "alice", 0, 6),
        event(Eviction, "decode", "", 0, 2),
        // What alice's namespace holds on prefill-0: the last report counts.
        event(Held, "prefill", "alice", 0, 9),
        event(Held, "prefill", "alice", 0, 6),
    ] {
        let ack = g.report_cache(e).await.unwrap().into_inner();
        assert_eq!(ack.incidents_opened, 0);
    }
    let totals = get_json(format!("http://{}/api/cache", r.http_addr)).await;
    let row = |role: &str, tenant: &str| {
        totals
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["role"] == role && t["tenant"] == tenant)
            .unwrap_or_else(|| panic!("no {role}/{tenant} row in {totals}"))
            .clone()
    };
    let alice = row("prefill", "alice");
    assert_eq!(
        (&alice["hits"], &alice["misses"], &alice["evictions"]),
        (&json!(1), &json!(1), &json!(1))
    );
    assert_eq!(
        (&alice["cached_tokens"], &alice["evicted_pages"]),
        (&json!(96), &json!(6))
    );
    assert_eq!(alice["pages_held"], json!(6));
    assert_eq!(row("prefill", "bob")["hits"], json!(0));
    assert_eq!(row("decode", "")["evicted_pages"], json!(2));
    let m = get_text(format!("http://{}/metrics", r.http_addr)).await;
    for line in [
        "pagewarden_auditor_prefix_cache_events_total{role=\"prefill\",kind=\"hit\",tenant=\"alice\"} 1",
        "pagewarden_auditor_prefix_cache_events_total{role=\"prefill\",kind=\"miss\",tenant=\"bob\"} 1",
        "pagewarden_auditor_prefix_cache_hit_tokens_total{role=\"decode\",tenant=\"alice\"} 96",
    ] {
        assert!(m.contains(line), "{line} missing from\n{m}");
    }

    // A hit that reused nothing, a namespace key instead of its tag, an unknown kind.
    for bad in [
        event(Hit, "prefill", "alice", 0, 0),
        pb::CacheReport {
            namespace: "a1b2c3d4".repeat(8),
            ..event(Miss, "prefill", "alice", 0, 0)
        },
        pb::CacheReport {
            kind: 42,
            ..event(Miss, "prefill", "alice", 0, 0)
        },
        // A held report is a count of pages, not a lookup.
        event(Held, "prefill", "alice", 96, 0),
    ] {
        let err = g.report_cache(bad).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    }
    r.shutdown().await;
}

#[tokio::test]
async fn integrity_chart_and_series() {
    let r = start().await;
    use pb::IntegrityKind::{Quarantine, WriteRejected};
    report_kinds(&r, "decode-0", &[Quarantine, Quarantine, WriteRejected]).await;
    let series = get_json(format!(
        "http://{}/api/integrity/series?window_s=600&bucket_s=600",
        r.http_addr
    ))
    .await;
    let total: i64 = series
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["count"].as_i64().unwrap())
        .sum();
    assert_eq!(total, 3);
    let html = get_page(format!(
        "http://{}/integrity?window_s=3600&bucket_s=3600",
        r.http_addr
    ))
    .await;
    assert!(html.contains("<svg") && html.contains("id=\"integrity-chart\""));
    assert!(
        html.contains("quarantine: 2"),
        "chart has a bar for the two quarantines"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn health_answers_503_while_the_database_is_down() {
    let r = start().await;
    let url = format!("http://{}/health", r.http_addr);
    assert_eq!(get_text(url.clone()).await, "ok");
    // Closing the pool is what a lost database looks like to the handler: every query fails.
    r.engine.store().close().await;
    let resp = reqwest::get(&url).await.unwrap();
    assert_eq!(resp.status(), 503);
    let body = resp.text().await.unwrap();
    assert!(body.contains("database unavailable"), "{body}");
}

#[tokio::test]
async fn cache_erasures_are_logged_with_their_certificates() {
    let r = start().await;
    let mut g = grpc(&r).await;
    let part = |node: &str, role: &str, entries, zeroed, deferred| pb::ErasedWorker {
        node: node.into(),
        role: role.into(),
        entries,
        pages_zeroed: zeroed,
        pages_deferred: deferred,
        digest: "0f".repeat(32),
    };
    let report = pb::ErasureReport {
        tenant: "alice".into(),
        namespace: "a1b2c3d4".into(),
        workers: vec![
            part("p-0", "prefill", 4, 4, 0),
            part("d-0", "decode", 5, 3, 2),
        ],
        digest: "e5".repeat(32),
    };
    let ack = g.report_erasure(report.clone()).await.unwrap().into_inner();
    assert_eq!(ack.incidents_opened, 0);
    let logged = get_json(format!("http://{}/api/erasures", r.http_addr)).await;
    let rows = logged.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{logged}");
    let e = &rows[0];
    assert_eq!(
        (&e["tenant"], &e["namespace"], &e["digest"]),
        (&json!("alice"), &json!("a1b2c3d4"), &json!("e5".repeat(32)))
    );
    assert!(e["at"].as_i64().is_some_and(|at| at > 0), "{e}");
    assert_eq!(
        e["workers"],
        json!([
            {"node": "p-0", "role": "prefill", "entries": 4, "pages_zeroed": 4, "pages_deferred": 0, "digest": "0f".repeat(32)},
            {"node": "d-0", "role": "decode", "entries": 5, "pages_zeroed": 3, "pages_deferred": 2, "digest": "0f".repeat(32)},
        ])
    );

    // No tenant, a namespace key instead of its tag, no worker, counts that do not add up, an
    // unknown role, a short digest: each is refused and nothing is logged.
    for bad in [
        pb::ErasureReport {
            tenant: String::new(),
            ..report.clone()
        },
        pb::ErasureReport {
            namespace: "a1b2c3d4".repeat(8),
            ..report.clone()
        },
        pb::ErasureReport {
            workers: vec![],
            ..report.clone()
        },
        pb::ErasureReport {
            workers: vec![part("d-0", "decode", 5, 3, 1)],
            ..report.clone()
        },
        pb::ErasureReport {
            workers: vec![part("x-0", "router", 0, 0, 0)],
            ..report.clone()
        },
        pb::ErasureReport {
            digest: "e5".into(),
            ..report.clone()
        },
    ] {
        let err = g.report_erasure(bad).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    }
    let logged = get_json(format!("http://{}/api/erasures", r.http_addr)).await;
    assert_eq!(logged.as_array().map(Vec::len), Some(1), "{logged}");
    r.shutdown().await;
}
