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
//!
//! The router signs isolation receipts and the auditor holds its public key, so every audit
//! request learns from its verified receipt which prefill worker computed it: the p-values are
//! exported under that worker's name (not `all`), and `/api/isolation` lists one verdict per
//! worker and channel. Each run also checks the scheduling-order channel (PromptPeek): the
//! order in which the other tenant's mixed batch comes back must not favour the requests on
//! the owner's cached prompts. On the leaky build it does (a request whose prompt is cached
//! needs one short pass and comes back ahead of cold ones sent before it): the exact p-value
//! drops below the threshold and a second `side_channel` incident, channel `order`, opens.
//! Under isolation the order does not depend on the owner's cache.

use std::time::Duration;

use pagewarden_common::receipt::ReceiptKey;
use pagewarden_system_tests::{
    api_key, get_json, start_auditor_with, start_decode, start_prefill, start_router_with,
    start_switched_router, ModelArg, Service, AUDITOR_TOKEN,
};
use pagewarden_testkit::eventually;
use serde_json::{json, Value};

/// The audit's default threshold (`--side-channel-threshold`).
const THRESHOLD: f64 = 1e-3;

/// What one probe run showed.
struct Audit {
    /// The timing channel's step.
    step: Value,
    /// The scheduling-order channel's step.
    order_step: Value,
    /// The prefill worker the p-values were exported under.
    worker: String,
    /// Cross against cold.
    p: f64,
    /// The positive control.
    control: f64,
    /// The order's exact p-value.
    order_p: f64,
    /// `side_channel` incidents open afterwards.
    incidents: Vec<Value>,
    /// `/api/isolation` afterwards.
    verdicts: Vec<Value>,
}

/// One probe run of `auditor` (a light sweep and the audit) on the `build` named, printed; its
/// verdicts are checked against the metrics, and its positive control must have seen the
/// owner's cache hits.
async fn audit(build: &str, auditor: &Service) -> Audit {
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
    let step_of = |prefix: &str| {
        run["results"]
            .as_array()
            .and_then(|r| {
                r.iter()
                    .find(|s| s["detail"].as_str().is_some_and(|d| d.starts_with(prefix)))
            })
            .cloned()
            .unwrap_or_else(|| panic!("no {prefix:?} step in {run:#}"))
    };
    let step = step_of("side channel:");
    let order_step = step_of("side channel, scheduling order:");
    let metrics = http
        .get(format!("{}/metrics", auditor.http_url()))
        .send()
        .await
        .expect("/metrics")
        .text()
        .await
        .expect("metrics text");
    // Every series of a gauge: (worker, value).
    let gauge = |name: &str| -> Vec<(String, f64)> {
        metrics
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{name}{{worker=\"")))
            .filter_map(|l| {
                let (worker, v) = l.split_once("\"} ")?;
                Some((worker.to_string(), v.trim().parse::<f64>().ok()?))
            })
            .collect()
    };
    let (p, control, order) = (
        gauge("pagewarden_auditor_isolation_ks_p"),
        gauge("pagewarden_auditor_isolation_control_ks_p"),
        gauge("pagewarden_auditor_isolation_order_p"),
    );
    assert_eq!(
        p.len(),
        1,
        "one prefill worker, one series: {p:?}\n{metrics}"
    );
    let worker = p[0].0.clone();
    assert_ne!(worker, "all", "the receipts did not name the worker");
    assert_eq!(control.iter().map(|c| &c.0).collect::<Vec<_>>(), [&worker]);
    assert_eq!(order.iter().map(|c| &c.0).collect::<Vec<_>>(), [&worker]);
    let incidents = get_json(auditor, "/api/incidents").await;
    let side: Vec<Value> = incidents
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["kind"] == "side_channel")
        .cloned()
        .collect();
    let verdicts = get_json(auditor, "/api/isolation")
        .await
        .as_array()
        .cloned()
        .unwrap_or_default();
    let a = Audit {
        step,
        order_step,
        worker,
        p: p[0].1,
        control: control[0].1,
        order_p: order[0].1,
        incidents: side,
        verdicts,
    };
    eprintln!(
        "{build} build, worker {}: p = {:.2e}, control p = {:.2e}, order p = {:.2e}; {}; {}",
        a.worker, a.p, a.control, a.order_p, a.step["detail"], a.order_step["detail"]
    );
    check_verdicts(&a);
    assert!(
        a.control < 0.05,
        "the positive control saw no cache hit: {}",
        a.step
    );
    a
}

/// The verdicts of `/api/isolation` are one per channel, under the exported worker, with the
/// exported p-values (to the three decimals of their log the store keeps).
fn check_verdicts(a: &Audit) {
    let of = |channel: &str| {
        let v: Vec<&Value> = a
            .verdicts
            .iter()
            .filter(|v| v["channel"] == channel)
            .collect();
        assert_eq!(v.len(), 1, "{channel}: {:#?}", a.verdicts);
        assert_eq!(v[0]["worker"], a.worker.as_str(), "{:#?}", v[0]);
        v[0]["p"].as_f64().expect("p")
    };
    let close = |stored: f64, exported: f64| (stored / exported.max(1e-300) - 1.0).abs() < 0.003;
    assert!(close(of("timing"), a.p), "{:#?} vs {}", a.verdicts, a.p);
    assert!(
        close(of("order"), a.order_p),
        "{:#?} vs {}",
        a.verdicts,
        a.order_p
    );
}

fn start_auditing(dir: &std::path::Path, router: &Service, key: &ReceiptKey) -> Service {
    // Pages of 8 filler words: the audit's prompts are 256 words, which a cache hit on this
    // machine still answers many times faster than a cold prefill, in half the test's time.
    let mut flags: Vec<String> = vec![
        "--router-url".into(),
        router.http_url(),
        "--probe-page-size".into(),
        "8".into(),
        "--receipt-public-key".into(),
        key.public().to_string(),
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
    let dir = tempfile::tempdir().expect("tempdir");
    let pem = ReceiptKey::generate_pem().expect("a receipt key");
    let key = ReceiptKey::from_pem(&pem).expect("the receipt key");
    let key_file = dir.path().join("receipt-key.pem");
    std::fs::write(&key_file, pem).expect("write the receipt key");
    let key_arg = key_file.display().to_string();
    let signing = ["--receipt-key", key_arg.as_str()];

    // Leaky: one namespace for every tenant.
    let leaky = start_switched_router(
        &ModelArg::Real,
        &[&decode],
        &[&prefill],
        &signing,
        &[("PAGEWARDEN_UNSAFE_TEST_SWITCHES", "namespace_isolation")],
    )
    .await;
    let auditor = start_auditing(&dir.path().join("leaky"), &leaky, &key);
    let a = audit("leaky", &auditor).await;
    let (step, incidents) = (&a.step, &a.incidents);
    assert!(
        a.p < THRESHOLD,
        "a shared namespace passed the audit: {step}"
    );
    assert_eq!(step["outcome"], "leak", "{step}");
    // An incident's details are JSON text.
    let details = |i: &Value| -> Value {
        serde_json::from_str(i["details"].as_str().unwrap_or_default()).unwrap_or_default()
    };
    let timing: Vec<&Value> = incidents
        .iter()
        .filter(|i| details(i)["channel"] == "timing")
        .collect();
    assert_eq!(timing.len(), 1, "{incidents:?}");
    assert_eq!(timing[0]["tenant"], "tenant-3", "{incidents:?}");
    assert_eq!(timing[0]["other_tenant"], "tenant-2", "{incidents:?}");
    assert_eq!(
        details(timing[0])["workers"][0]["worker"],
        a.worker.as_str(),
        "the incident names the worker: {incidents:?}"
    );
    assert!(
        a.order_p < THRESHOLD,
        "a shared namespace passed the order audit: {}",
        a.order_step
    );
    assert_eq!(a.order_step["outcome"], "leak", "{}", a.order_step);
    let order: Vec<&Value> = incidents
        .iter()
        .filter(|i| details(i)["channel"] == "order")
        .collect();
    assert_eq!(order.len(), 1, "{incidents:?}");
    assert_eq!(incidents.len(), 2, "{incidents:?}");
    drop(auditor);
    drop(leaky);

    // The normal router on the same workers.
    let router = start_router_with(&ModelArg::Real, &[&decode], &[&prefill], &signing).await;
    let auditor = start_auditing(&dir.path().join("normal"), &router, &key);
    let a = audit("normal", &auditor).await;
    let (step, incidents) = (&a.step, &a.incidents);
    assert!(a.p >= THRESHOLD, "isolation failed the audit: {step}");
    assert_eq!(step["outcome"], "accepted", "{step}");
    assert!(
        a.order_p >= THRESHOLD,
        "isolation failed the order audit: {}",
        a.order_step
    );
    assert_eq!(a.order_step["outcome"], "accepted", "{}", a.order_step);
    assert!(incidents.is_empty(), "{incidents:?}");
}
