//! The auditor's side-channel audit on the real services (real model, real binaries): each probe
//! run ends with rounds of one probe tenant's prompt warm, the other probe tenant on that
//! prompt, and the other on a fresh prompt, and compares first-token times (Kolmogorov–Smirnov).
//!
//! - A leaky router (the test-only build with `namespace_isolation` switched off: one prefix-
//!   cache namespace for every tenant) lets the other tenant's request hit the owner's cached
//!   prompt: `pagewarden_auditor_isolation_ks_p` drops below the threshold and a `side_channel`
//!   incident opens.
//! - The normal router on the same workers: the p-value stays above the threshold and no
//!   `side_channel` incident opens, while the positive control (the owner's own warm repeat)
//!   still shows the audit can see a cache hit.

use std::time::Duration;

use pagewarden_system_tests::{
    api_key, get_json, start_auditor_with, start_decode, start_prefill, start_router,
    start_switched_router, ModelArg, Service, AUDITOR_TOKEN,
};
use pagewarden_testkit::eventually;
use serde_json::{json, Value};

/// The audit's default threshold (`--side-channel-threshold`).
const THRESHOLD: f64 = 1e-3;

/// One probe run of `auditor` (a light sweep and the audit): its side-channel step, the
/// exported p-values (cross, control) and the `side_channel` incidents open afterwards.
async fn audit(auditor: &Service) -> (Value, f64, f64, Vec<Value>) {
    let http = reqwest::Client::new();
    let before = get_json(auditor, "/api/probes").await;
    let runs_before = before.as_array().map_or(0, Vec::len);
    let r = http
        .post(format!("{}/api/probes/run", auditor.http_url()))
        .bearer_auth(AUDITOR_TOKEN)
        .json(&json!({"sweep": "light"}))
        .send()
        .await
        .expect("POST /api/probes/run");
    assert_eq!(r.status(), 202);
    let run = eventually(
        Duration::from_secs(600),
        "the probe run to finish",
        || async {
            let runs = get_json(auditor, "/api/probes").await;
            let runs = runs.as_array().cloned().unwrap_or_default();
            let newest = runs.first().cloned()?;
            (runs.len() > runs_before && newest["status"] != "running").then_some(newest)
        },
    )
    .await;
    let step = run["results"]
        .as_array()
        .and_then(|r| {
            r.iter().find(|s| {
                s["detail"]
                    .as_str()
                    .is_some_and(|d| d.starts_with("side channel"))
            })
        })
        .cloned()
        .unwrap_or_else(|| panic!("no side-channel step in {run:#}"));
    let metrics = http
        .get(format!("{}/metrics", auditor.http_url()))
        .send()
        .await
        .expect("/metrics")
        .text()
        .await
        .expect("metrics text");
    let gauge = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{worker=\"all\"}} ")))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
    };
    let incidents = get_json(auditor, "/api/incidents").await;
    let side: Vec<Value> = incidents
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["kind"] == "side_channel")
        .cloned()
        .collect();
    (
        step,
        gauge("pagewarden_auditor_isolation_ks_p"),
        gauge("pagewarden_auditor_isolation_control_ks_p"),
        side,
    )
}

fn start_auditing(dir: &std::path::Path, router: &Service) -> Service {
    // Pages of 8 filler words: the audit's prompts are 256 words, which a cache hit on this
    // machine still answers many times faster than a cold prefill, in half the test's time.
    let mut flags: Vec<String> = vec![
        "--router-url".into(),
        router.http_url(),
        "--probe-page-size".into(),
        "8".into(),
    ];
    for t in [2, 3] {
        flags.push("--probe-key".into());
        flags.push(format!("tenant-{t}={}", api_key(t)));
    }
    start_auditor_with(dir, &flags)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_side_channel_audit_catches_a_shared_namespace_and_passes_isolation() {
    let decode = start_decode(&ModelArg::Real, &[]);
    let prefill = start_prefill(&ModelArg::Real, &[]);

    // Leaky: one namespace for every tenant.
    let leaky = start_switched_router(
        &ModelArg::Real,
        &[&decode],
        &[&prefill],
        &[],
        &[("PAGEWARDEN_UNSAFE_TEST_SWITCHES", "namespace_isolation")],
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let auditor = start_auditing(&dir.path().join("leaky"), &leaky);
    let (step, p, control, incidents) = audit(&auditor).await;
    eprintln!(
        "leaky build: p = {p:.2e}, control p = {control:.2e}; {}",
        step["detail"]
    );
    assert!(
        control < 0.05,
        "the positive control saw no cache hit: {step}"
    );
    assert!(p < THRESHOLD, "a shared namespace passed the audit: {step}");
    assert_eq!(step["outcome"], "leak", "{step}");
    assert_eq!(incidents.len(), 1, "{incidents:?}");
    assert_eq!(incidents[0]["tenant"], "tenant-3", "{incidents:?}");
    assert_eq!(incidents[0]["other_tenant"], "tenant-2", "{incidents:?}");
    drop(auditor);
    drop(leaky);

    // The normal router on the same workers.
    let router = start_router(&ModelArg::Real, &[&decode], &[&prefill]).await;
    let auditor = start_auditing(&dir.path().join("normal"), &router);
    let (step, p, control, incidents) = audit(&auditor).await;
    eprintln!(
        "normal build: p = {p:.2e}, control p = {control:.2e}; {}",
        step["detail"]
    );
    assert!(
        control < 0.05,
        "the positive control saw no cache hit: {step}"
    );
    assert!(p >= THRESHOLD, "isolation failed the audit: {step}");
    assert_eq!(step["outcome"], "accepted", "{step}");
    assert!(incidents.is_empty(), "{incidents:?}");
}
