//! Router and workers report to the auditor (`--auditor`): a served completion shows up as a
//! sample with no incident; an injected generation-mismatch integrity event, sent through the
//! common `AuditorClient`, opens an incident within 5 s.

use std::time::Duration;

use pagewarden_common::auditor_client::{AuditorClient, AuditorIntegritySink};
use pagewarden_common::integrity::{IntegrityEvent, IntegrityKind, IntegritySink};
use pagewarden_common::{RequestId, TenantId};
use pagewarden_system_tests::{
    api_key, get_json, start_auditor, start_decode, start_prefill, start_router, ModelArg, Service,
};
use pagewarden_testkit::poll_until;
use serde_json::{json, Value};

const TINY: ModelArg = ModelArg::Tiny(11);

/// Polls `path` until `done` holds or `within` passes; returns the last answer.
async fn poll(
    auditor: &Service,
    path: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let answer = poll_until(within, || async {
        let v = get_json(auditor, path).await;
        done(&v).then_some(v)
    })
    .await;
    match answer {
        Some(v) => v,
        None => get_json(auditor, path).await,
    }
}

fn open_incidents(v: &Value) -> usize {
    v.as_array().expect("incident list").len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_and_integrity_events_reach_the_auditor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auditor = start_auditor(dir.path());
    let grpc = auditor.grpc_url();
    let decode = start_decode(&TINY, &["--auditor", &grpc]);
    let prefill = start_prefill(&TINY, &["--auditor", &grpc]);
    // The router takes the auditor from env PAGEWARDEN_AUDITOR (the shared helper has no extra
    // flags); this binary holds only this test, so the variable reaches only this router.
    std::env::set_var("PAGEWARDEN_AUDITOR", &grpc);
    let router = start_router(&TINY, &[&decode], &[&prefill]).await;
    std::env::remove_var("PAGEWARDEN_AUDITOR");

    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth(api_key(0))
        .json(&json!({"prompt": "hello there", "max_tokens": 4}))
        .send()
        .await
        .expect("router request");
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);

    let summary = poll(&auditor, "/api/summary", Duration::from_secs(10), |v| {
        v["samples"]["samples"].as_i64() >= Some(1)
    })
    .await;
    assert_eq!(summary["samples"]["samples"], 1, "summary: {summary}");
    assert_eq!(summary["samples"]["with_foreign_markers"], 0);
    let nodes = get_json(&auditor, "/api/nodes").await;
    let incidents = get_json(&auditor, "/api/incidents?status=open").await;
    assert_eq!(
        open_incidents(&incidents),
        0,
        "a clean completion opened incidents: {incidents}; nodes: {nodes}"
    );

    let client = AuditorClient::spawn(&grpc, 16).expect("auditor client");
    AuditorIntegritySink::new(client.clone()).report(IntegrityEvent {
        node_id: "decode-injected".into(),
        role: "decode",
        kind: IntegrityKind::GenerationMismatch,
        request: Some(RequestId([9; 16])),
        tenant: Some(TenantId::new("tenant-0")),
        page: None,
        detail: "injected by auditor_wiring".into(),
    });
    let incidents = poll(
        &auditor,
        "/api/incidents?status=open",
        Duration::from_secs(5),
        |v| open_incidents(v) > 0,
    )
    .await;
    assert_eq!(
        open_incidents(&incidents),
        1,
        "expected one open incident within 5 s (client stats {:?}): {incidents}",
        client.stats()
    );
    assert_eq!(incidents[0]["tenant"], "tenant-0", "{incidents}");
}
