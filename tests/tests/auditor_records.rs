//! The auditor records an incident for every violation the tests inject, and none for
//! clean runs. The real auditor (SQLite in a temp dir), decode, prefill and router run with
//! `--auditor`. A clean batch through the router (every tenant's prompts carrying its own
//! canary marker, plus refused requests) opens nothing. Then each violation is injected once and
//! must open exactly one incident of its kind:
//!
//! - through the real decode worker, by a client that forges what prefill sends (wrong grant key,
//!   wrong token count, a tampered page checksum): decode's commit check refuses it and reports
//!   it; a replayed reservation is a stale message naming its request, refused and reported too,
//!   and the auditor counts it as routine instead of opening an incident;
//! - through the auditor's gRPC ingestion, as the router and workers report: a sample carrying
//!   other tenants' markers (one incident per foreign marker), integrity events of the kinds the
//!   binaries cannot be driven into without test-only switches, and preflight reports.

use std::collections::BTreeMap;
use std::time::Duration;

use pagewarden_proto::convert::reject_reason;
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::auditor_client::AuditorClient;
use pagewarden_system_tests::driver::{fresh_ref, greedy, Driver};
use pagewarden_system_tests::{
    api_key, get_json, start_auditor, start_decode, start_prefill, start_router_with, ModelArg,
    Service,
};
use pagewarden_testkit::{eventually, poll_until};
use serde_json::{json, Value};
use tonic::transport::Channel;

const TINY: ModelArg = ModelArg::Tiny(11);
const DECODE_NODE: &str = "decode-audited";
/// A prompt of 20 tiny-model token ids: two pages of 16.
const PROMPT: [u32; 20] = [
    30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49,
];

/// Every incident, any status.
async fn incidents(auditor: &Service) -> Vec<Value> {
    get_json(auditor, "/api/incidents?limit=1000")
        .await
        .as_array()
        .expect("incident list")
        .clone()
}

/// Incident count by kind.
fn by_kind(list: &[Value]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for i in list {
        *m.entry(i["kind"].as_str().expect("kind").to_string())
            .or_default() += 1;
    }
    m
}

/// Waits until the auditor holds `want` incidents in all, then a settle period to catch any
/// extra one; returns the list.
async fn expect_total(auditor: &Service, want: usize, what: &str) -> Vec<Value> {
    eventually(
        Duration::from_secs(10),
        &format!("{what}: {want} incidents"),
        || async {
            let list = incidents(auditor).await;
            if list.len() >= want {
                Ok(())
            } else {
                Err(format!("found {:?}", by_kind(&list)))
            }
        },
    )
    .await;
    expect_no_more(auditor, want, Duration::from_millis(400), what).await
}

/// Watches for `within` (real time: what must not come has to be given the time to) that no
/// incident beyond `want` arrives; returns the list.
async fn expect_no_more(
    auditor: &Service,
    want: usize,
    within: Duration,
    what: &str,
) -> Vec<Value> {
    let more = poll_until(within, || async {
        let list = incidents(auditor).await;
        (list.len() > want).then_some(list)
    })
    .await;
    let list = match more {
        Some(list) => list,
        None => incidents(auditor).await,
    };
    assert_eq!(
        list.len(),
        want,
        "{what}: expected {want} incidents in all, found {:?}: {list:#?}",
        by_kind(&list)
    );
    list
}

/// The newest incident (the list is newest first), checked to be of `kind`.
fn newest<'a>(list: &'a [Value], kind: &str) -> &'a Value {
    let i = list
        .iter()
        .max_by_key(|i| i["id"].as_i64())
        .expect("an incident");
    assert_eq!(i["kind"], kind, "{i:#}");
    i
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reserves and prefills [`PROMPT`] for `tenant`: the request, its grant and prefill's reply.
async fn reserve_and_prefill(
    d: &mut Driver,
    tenant: &str,
) -> (pb::RequestRef, pb::WriteGrant, pb::PrefillReply) {
    let req = fresh_ref();
    let grant = d.reserve(&req, tenant, &PROMPT, 4).await.expect("reserve");
    let reply = d
        .prefill(&req, tenant, &PROMPT, grant.clone(), greedy(4))
        .await
        .expect("prefill");
    (req, grant, reply)
}

/// Sends a forged commit; decode must refuse it (an error, never tokens).
async fn refused_commit(d: &mut Driver, req: &pb::RequestRef, reply: pb::PrefillReply) {
    match d.generate(req, reply).await {
        Ok(c) => panic!("decode accepted a forged manifest and generated {c:?}"),
        Err(s) => eprintln!(
            "refused as expected: {:?} {:?}",
            s.code(),
            reject_reason(&s)
        ),
    }
}

async fn integrity(a: &mut AuditorClient<Channel>, kind: pb::IntegrityKind, tenant: &str) -> u32 {
    a.report_integrity(pb::IntegrityReport {
        kind: kind as i32,
        node: "decode-reporter".into(),
        req: Some(fresh_ref()),
        tenant: tenant.into(),
        page: Some(3),
        generation: Some(7),
        details: "injected by auditor_records".into(),
    })
    .await
    .expect("report integrity")
    .into_inner()
    .incidents_opened
}

async fn preflight(a: &mut AuditorClient<Channel>, node: &str, pool: u64, ok: bool) -> u32 {
    a.report_preflight(pb::PreflightReport {
        node: node.into(),
        role: "decode".into(),
        pool_tokens: pool,
        context_length: 2048,
        ok,
        message: "injected by auditor_records".into(),
    })
    .await
    .expect("report preflight")
    .into_inner()
    .incidents_opened
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_incident_per_injected_violation_and_none_for_clean_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auditor = start_auditor(dir.path());
    let grpc = auditor.grpc_url();
    // A short drain timeout, so a page whose drain went unconfirmed would be quarantined (and
    // reported) well inside the final settle period.
    let decode = start_decode(
        &TINY,
        &[
            "--auditor",
            &grpc,
            "--node-id",
            DECODE_NODE,
            "--drain-timeout",
            "500ms",
        ],
    );
    let prefill = start_prefill(&TINY, &["--auditor", &grpc]);
    let router = start_router_with(&TINY, &[&decode], &[&prefill], &["--auditor", &grpc]).await;
    let mut audit = AuditorClient::connect(grpc.clone())
        .await
        .expect("auditor gRPC");

    // Every tenant gets its own canary marker.
    let mut markers = Vec::new();
    for t in 0..4 {
        let m = audit
            .issue_marker(pb::IssueMarkerRequest {
                tenant: format!("tenant-{t}"),
            })
            .await
            .expect("issue marker")
            .into_inner();
        markers.push(m.marker);
    }

    // Clean batch: 8 served completions, each prompt with the tenant's own marker at the start
    // and the end, streaming and not, plus refusals that must not count as violations.
    let http = reqwest::Client::new();
    let url = format!("{}/v1/completions", router.http_url());
    for i in 0..8 {
        let t = i % 4;
        let prompt = format!("{} please summarise item {i} {}", markers[t], markers[t]);
        let r = http
            .post(&url)
            .bearer_auth(api_key(t))
            .json(&json!({"prompt": prompt, "max_tokens": 6, "stream": i % 2 == 1}))
            .send()
            .await
            .expect("clean request");
        assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
        let _ = r.text().await;
    }
    for body in [
        json!({"prompt": "x", "max_tokens": 0}),
        json!({"prompt": "x", "max_tokens": 4_000_000_000u64}),
    ] {
        let r = http
            .post(&url)
            .bearer_auth(api_key(0))
            .json(&body)
            .send()
            .await
            .expect("refused request");
        assert_eq!(r.status().as_u16(), 400);
    }
    let samples = |s: &Value| s["samples"]["samples"].as_i64() >= Some(8);
    let summary = poll_until(Duration::from_secs(10), || async {
        Some(get_json(&auditor, "/api/summary").await).filter(samples)
    })
    .await;
    let summary = match summary {
        Some(s) => s,
        None => get_json(&auditor, "/api/summary").await,
    };
    assert!(
        summary["samples"]["samples"].as_i64() >= Some(8),
        "the router's samples reached the auditor: {summary}"
    );
    assert_eq!(summary["samples"]["with_foreign_markers"], 0, "{summary}");
    let nodes = get_json(&auditor, "/api/nodes").await;
    assert!(
        nodes.to_string().contains(DECODE_NODE),
        "decode's preflight reached the auditor: {nodes}"
    );
    expect_total(&auditor, 0, "clean batch").await;

    // Violations forged against the real decode worker.
    let mut d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let mut total = 0;

    let (req, _grant, mut reply) = reserve_and_prefill(&mut d, "tenant-1").await;
    reply.manifest.as_mut().expect("manifest").grant_key = vec![0xAB; 16];
    refused_commit(&mut d, &req, reply).await;
    total += 1;
    let list = expect_total(&auditor, total, "wrong grant key").await;
    let i = newest(&list, "manifest_mismatch");
    assert_eq!(i["node"], DECODE_NODE);
    assert_eq!(i["tenant"], "tenant-1");
    assert_eq!(
        i["request_id"].as_str(),
        Some(hex(&req.request_id).as_str())
    );

    let (req, _grant, mut reply) = reserve_and_prefill(&mut d, "tenant-2").await;
    reply.manifest.as_mut().expect("manifest").tokens_written += 1;
    refused_commit(&mut d, &req, reply).await;
    total += 1;
    let list = expect_total(&auditor, total, "wrong token count").await;
    assert_eq!(newest(&list, "count_mismatch")["tenant"], "tenant-2");

    let (req, grant, mut reply) = reserve_and_prefill(&mut d, "tenant-3").await;
    {
        let m = reply.manifest.as_mut().expect("manifest");
        m.page_checksums[1] ^= 1;
        m.digest =
            pagewarden_kvcache::manifest_digest(&m.page_checksums, m.tokens_written as usize);
    }
    refused_commit(&mut d, &req, reply).await;
    total += 1;
    let list = expect_total(&auditor, total, "tampered checksum").await;
    let i = newest(&list, "checksum_mismatch");
    assert_eq!(i["tenant"], "tenant-3");
    // Filed under the page the refusal names, at the generation it was granted at (incidents
    // that share a page link to each other).
    let tampered = &grant.pages[1];
    assert_eq!(i["page"], tampered.page, "{i}");
    assert_eq!(i["generation"], tampered.generation, "{i}");

    // A replayed Reserve (same request, same attempt) is a stale message, dropped; the original
    // reservation is unharmed and completes. The auditor counts it as routine: no incident.
    let req = fresh_ref();
    let grant = d
        .reserve(&req, "tenant-0", &PROMPT, 4)
        .await
        .expect("first reserve");
    let replay = d.reserve(&req, "tenant-0", &PROMPT, 4).await;
    assert_eq!(
        replay.as_ref().err().map(tonic::Status::code),
        Some(tonic::Code::Aborted),
        "a replayed reserve: {replay:?}"
    );
    let reply = d
        .prefill(&req, "tenant-0", &PROMPT, grant, greedy(4))
        .await
        .expect("prefill of the original");
    d.generate(&req, reply)
        .await
        .expect("the original request completes");
    eventually(
        Duration::from_secs(10),
        "the replayed reserve counted as a routine stale message",
        || async {
            let s = get_json(&auditor, "/api/summary").await;
            let counted = s["routine"]
                .as_array()
                .expect("routine counts")
                .iter()
                .any(|c| c["kind"] == "stale_message" && c["count"] == 1);
            if counted {
                Ok(())
            } else {
                Err(s)
            }
        },
    )
    .await;
    expect_total(&auditor, total, "replayed reserve (routine: no incident)").await;

    // Reports as the router and workers send them.
    let sample = |tenant: &str, text: String| pb::SampleReport {
        tenant: tenant.into(),
        req: Some(fresh_ref()),
        prompt_tokens: 5,
        completion_tokens: 7,
        response_text: text,
        response_digest: vec![],
        ttft_ms: Some(12),
        status: pb::SampleStatus::Ok as i32,
        node: DECODE_NODE.into(),
    };
    let own = sample("tenant-1", format!("fine {} text", markers[1]));
    let ack = audit.report_sample(own).await.expect("sample").into_inner();
    assert_eq!(
        ack.incidents_opened, 0,
        "a tenant's own marker is no violation"
    );
    let leak = sample(
        "tenant-1",
        format!("leaked {} and {} here", markers[0], markers[2]),
    );
    let ack = audit
        .report_sample(leak)
        .await
        .expect("sample")
        .into_inner();
    assert_eq!(ack.incidents_opened, 2, "one incident per foreign marker");
    total += 2;
    let list = expect_total(&auditor, total, "foreign markers").await;
    let mut others: Vec<&str> = list
        .iter()
        .filter(|i| i["kind"] == "cross_tenant_marker")
        .map(|i| {
            assert_eq!(i["tenant"], "tenant-1");
            i["other_tenant"].as_str().expect("other_tenant")
        })
        .collect();
    others.sort();
    assert_eq!(others, ["tenant-0", "tenant-2"]);

    let reported = [
        (pb::IntegrityKind::GenerationMismatch, "generation_mismatch"),
        (pb::IntegrityKind::GuardWordCorrupt, "guard_word_corrupt"),
        (pb::IntegrityKind::WriteRejected, "write_rejected"),
        (pb::IntegrityKind::Quarantine, "quarantine"),
        (
            pb::IntegrityKind::DeferredReleaseTimedOut,
            "deferred_release_timed_out",
        ),
        (pb::IntegrityKind::PageNotWritten, "page_not_written"),
    ];
    for (kind, name) in reported {
        assert_eq!(integrity(&mut audit, kind, "tenant-2").await, 1, "{name}");
        total += 1;
        let list = expect_total(&auditor, total, name).await;
        let i = newest(&list, name);
        assert_eq!(i["node"], "decode-reporter");
        assert_eq!(i["tenant"], "tenant-2");
    }

    assert_eq!(preflight(&mut audit, "decode-fits", 4096, true).await, 0);
    assert_eq!(preflight(&mut audit, "decode-failed", 1024, false).await, 1);
    assert_eq!(preflight(&mut audit, "decode-lies", 1024, true).await, 1);
    total += 2;
    let list = expect_total(&auditor, total, "preflight").await;

    let want: BTreeMap<String, usize> = [
        ("manifest_mismatch", 1),
        ("count_mismatch", 1),
        ("checksum_mismatch", 1),
        ("cross_tenant_marker", 2),
        ("generation_mismatch", 1),
        ("guard_word_corrupt", 1),
        ("write_rejected", 1),
        ("quarantine", 1),
        ("deferred_release_timed_out", 1),
        ("page_not_written", 1),
        ("preflight_failed", 2),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_string(), n))
    .collect();
    assert_eq!(by_kind(&list), want);
    // Decode refused every forgery cleanly: no page stayed reserved or was quarantined.
    eventually(Duration::from_secs(5), "a free decode pool", || async {
        let used = decode
            .metric("pagewarden_pool_pages{role=\"decode\",state=\"used\"}")
            .await;
        let draining = decode
            .metric("pagewarden_pool_pages{role=\"decode\",state=\"draining\"}")
            .await;
        if used + draining == 0.0 {
            Ok(())
        } else {
            Err(format!("used {used}, draining {draining}"))
        }
    })
    .await;
    assert_eq!(
        decode
            .metric("pagewarden_pool_pages{role=\"decode\",state=\"quarantined\"}")
            .await,
        0.0
    );
    // ...and nothing more arrives once the pools settled (past the drain timeout).
    expect_no_more(
        &auditor,
        total,
        Duration::from_millis(1500),
        "after settling",
    )
    .await;
}

/// A decode worker whose pool cannot hold its advertised context refuses to start (I7); I8 asks
/// that the auditor hear of it: the worker reports its failed start-up, and waits for the
/// auditor to take it, before exiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_fails_preflight_is_recorded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auditor = start_auditor(dir.path());
    let grpc = auditor.grpc_url();
    let started = Service::try_start(
        "pagewarden-decode",
        &pagewarden_system_tests::worker_args(
            &TINY,
            &[
                "--auditor",
                &grpc,
                "--pool-tokens",
                "16",
                "--node-id",
                "decode-small",
            ],
        ),
    );
    assert!(started.is_err(), "an undersized decode started");
    let list = expect_total(&auditor, 1, "failed preflight").await;
    let i = newest(&list, "preflight_failed");
    assert_eq!(i["node"], "decode-small");
}
