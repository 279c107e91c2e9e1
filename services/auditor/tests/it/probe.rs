//! The canary prober against the fake router: a clean run passes and opens nothing; a leaked
//! marker, an accepted over-length prompt, a miscounted prompt and an unreachable router each
//! become incidents.

use std::sync::Arc;
use std::time::Duration;

use pagewarden_auditor::domain::{ProbeOutcome, ProbeRunStatus};
use pagewarden_auditor::probe::plan::LatencyBounds;
use pagewarden_auditor::probe::{ProbeSettings, ProbeTenant, Prober};
use pagewarden_auditor::tokens::WordCounter;
use pagewarden_auditor::Running;
use pagewarden_common::TenantId;

use crate::fake_router;
use crate::ingest::{get_json, get_page, start};

fn settings(router: String) -> ProbeSettings {
    ProbeSettings {
        router_url: router,
        tenants: vec![
            ProbeTenant {
                tenant: "probe-a".into(),
                api_key: "key-a".into(),
            },
            ProbeTenant {
                tenant: "probe-b".into(),
                api_key: "key-b".into(),
            },
        ],
        max_tokens: 4,
        page_size: 16,
        latency: LatencyBounds {
            max_ttft_ms: 10_000,
            min_prefill_us_per_token: 0,
        },
        request_timeout: Duration::from_secs(10),
        tokens: Some(Arc::new(WordCounter)),
    }
}

async fn setup() -> (Running, Prober, fake_router::Fake) {
    let r = start().await;
    let (addr, fake) = fake_router::start(&[("key-a", "probe-a"), ("key-b", "probe-b")]).await;
    let prober = Prober::new(r.engine.clone(), settings(format!("http://{addr}"))).unwrap();
    (r, prober, fake)
}

async fn incident_kinds(r: &Running) -> Vec<String> {
    let list = get_json(format!("http://{}/api/incidents", r.http_addr)).await;
    list.as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_clean_probe_run_passes_and_crosses_the_limit() {
    let (r, prober, fake) = setup().await;
    let run = prober.run_once().await.unwrap();
    let store = r.engine.store();
    let runs = store.probe_runs(5).await.unwrap();
    assert_eq!(runs[0].id, run);
    assert_eq!(
        runs[0].status,
        ProbeRunStatus::Passed,
        "{}",
        runs[0].message
    );
    assert_eq!(runs[0].context_limit, Some(i64::from(fake_router::LIMIT)));
    let results = store.probe_results(run).await.unwrap();
    assert_eq!(results.len(), 14, "7 steps for each of 2 tenants");
    let accepted = results
        .iter()
        .filter(|s| s.outcome == ProbeOutcome::Accepted)
        .count();
    let rejected = results
        .iter()
        .filter(|s| s.outcome == ProbeOutcome::RejectedClean)
        .count();
    assert_eq!((accepted, rejected), (10, 4));
    for s in results
        .iter()
        .filter(|s| s.outcome == ProbeOutcome::Accepted)
    {
        assert_eq!(
            s.prompt_tokens, s.expected_tokens,
            "usage matches the tokenizer count"
        );
    }
    assert!(results
        .iter()
        .filter(|s| s.outcome == ProbeOutcome::RejectedClean)
        .all(|s| s.detail == "context_length_exceeded"));
    // Lengths went from one page to past the limit, as both tenants.
    let seen = fake.seen.lock().clone();
    assert!(seen
        .iter()
        .any(|(t, n)| t == "probe-b" && *n > fake_router::LIMIT as usize));
    assert!(seen.iter().any(|(t, n)| t == "probe-a" && *n < 32));
    assert!(incident_kinds(&r).await.is_empty());
    let html = get_page(format!("http://{}/probes", r.http_addr)).await;
    assert!(html.contains("passed") && html.contains("rejected_clean"));
    let api = get_json(format!("http://{}/api/probes", r.http_addr)).await;
    assert_eq!(api[0]["results"].as_array().unwrap().len(), 14);
    r.shutdown().await;
}

#[tokio::test]
async fn a_leaked_marker_in_a_probe_answer_is_an_incident() {
    let (r, prober, fake) = setup().await;
    let victim = r
        .engine
        .issue_marker(&TenantId::new("victim"))
        .await
        .unwrap();
    fake.faults.lock().leak = Some(victim.marker.clone());
    let run = prober.run_once().await.unwrap();
    let runs = r.engine.store().probe_runs(1).await.unwrap();
    assert_eq!((runs[0].id, runs[0].status), (run, ProbeRunStatus::Failed));
    let leaks = get_json(format!(
        "http://{}/api/incidents?status=open&kind=cross_tenant_marker",
        r.http_addr
    ))
    .await;
    let leaks = leaks.as_array().unwrap();
    assert_eq!(leaks.len(), 10, "every answered step leaked");
    assert!(leaks.iter().all(|i| i["other_tenant"] == "victim"));
    assert!(
        leaks.iter().any(|i| i["tenant"] == "probe-a")
            && leaks.iter().any(|i| i["tenant"] == "probe-b")
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_probe_marker_leaking_between_probe_tenants_is_caught() {
    let (r, prober, fake) = setup().await;
    // probe-a's first run issues its markers; then the fake leaks one of them to everybody.
    prober.run_once().await.unwrap();
    let a_marker = r.engine.store().markers(Some("probe-a")).await.unwrap()[0]
        .marker
        .clone();
    fake.faults.lock().leak = Some(a_marker);
    prober.run_once().await.unwrap();
    let leaks = get_json(format!(
        "http://{}/api/incidents?kind=cross_tenant_marker",
        r.http_addr
    ))
    .await;
    let leaks = leaks.as_array().unwrap();
    assert_eq!(
        leaks.len(),
        5,
        "only probe-b's answered steps carry another tenant's marker"
    );
    assert!(leaks
        .iter()
        .all(|i| i["tenant"] == "probe-b" && i["other_tenant"] == "probe-a"));
    r.shutdown().await;
}

#[tokio::test]
async fn overlength_accepted_and_miscounted_prompts_are_incidents() {
    let (r, prober, fake) = setup().await;
    {
        let mut f = fake.faults.lock();
        f.accept_overlength = true;
        f.miscount = true;
    }
    prober.run_once().await.unwrap();
    let kinds = incident_kinds(&r).await;
    let count = |k: &str| kinds.iter().filter(|x| *x == k).count();
    assert_eq!(count("probe_overlength_accepted"), 4);
    assert_eq!(count("probe_token_count"), 10);
    r.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_router_is_an_incident() {
    let r = start().await;
    // Bind then drop: a loopback port where nothing listens.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let prober = Prober::new(
        r.engine.clone(),
        settings(format!("http://127.0.0.1:{port}")),
    )
    .unwrap();
    prober.run_once().await.unwrap();
    let runs = r.engine.store().probe_runs(1).await.unwrap();
    assert_eq!(runs[0].status, ProbeRunStatus::Error);
    assert_eq!(
        incident_kinds(&r).await,
        vec!["probe_unreachable".to_string()]
    );
    r.shutdown().await;
}

#[tokio::test]
async fn periodic_probing_waits_for_the_router_to_be_ready() {
    let (r, prober, fake) = setup().await;
    fake.faults.lock().not_ready = true;
    let stop = tokio_util::sync::CancellationToken::new();
    let task =
        tokio::spawn(prober.run_every(Duration::from_secs(3600), stop.clone().cancelled_owned()));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let store = r.engine.store();
    assert!(
        store.probe_runs(5).await.unwrap().is_empty(),
        "probed a router that is not ready"
    );
    assert!(fake.seen.lock().is_empty());
    fake.faults.lock().not_ready = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while store.probe_runs(5).await.unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no run once the router was ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.cancel();
    task.await.unwrap();
    assert!(incident_kinds(&r).await.is_empty());
    r.shutdown().await;
}
