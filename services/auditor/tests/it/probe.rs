//! The canary prober against the fake router: a clean run passes and opens nothing; a leaked
//! marker, an accepted over-length prompt, a miscounted prompt and an unreachable router each
//! become incidents. A light sweep sends one short and one over-length step per tenant, on
//! schedule (as under `pagewarden up`) or when an operator asks. The side-channel audit, per
//! worker and on both channels, against a fake whose cache hits are faster.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use pagewarden_auditor::domain::{ProbeOutcome, ProbeRunStatus, SweepKind};
use pagewarden_auditor::probe::plan::LatencyBounds;
use pagewarden_auditor::probe::side_channel::SideChannelSettings;
use pagewarden_auditor::probe::{ProbeSettings, ProbeTenant, Prober, Schedule};
use pagewarden_auditor::tokens::WordCounter;
use pagewarden_auditor::Running;
use pagewarden_common::receipt::{PublicKey, ReceiptKey};
use pagewarden_common::TenantId;
use pagewarden_testkit::eventually;

use crate::auth::{api_post, Signed, OPERATOR, OPS_TOKEN, VIEWER, VIEWER_TOKEN};
use crate::fake_router;
use crate::ingest::{get_json, get_page, get_text, start};

pub fn settings(router: String) -> ProbeSettings {
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
            floor_ttft_ms: 10_000,
            pace_tokens_per_s: None,
            min_prefill_us_per_token: 0,
        },
        request_timeout: Duration::from_secs(10),
        tokens: Some(Arc::new(WordCounter)),
        // The fake router has no cache to time: the audit's logic is tested on its own.
        side_channel: SideChannelSettings {
            rounds: 0,
            order_rounds: 0,
            ..SideChannelSettings::default()
        },
        receipt_key: None,
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
    assert_eq!(
        results.len(),
        15,
        "7 steps for each of 2 tenants, and the prefix-isolation check"
    );
    let accepted = results
        .iter()
        .filter(|s| s.outcome == ProbeOutcome::Accepted)
        .count();
    let rejected = results
        .iter()
        .filter(|s| s.outcome == ProbeOutcome::RejectedClean)
        .count();
    assert_eq!((accepted, rejected), (11, 4));
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
    assert_eq!(api[0]["results"].as_array().unwrap().len(), 15);
    r.shutdown().await;
}

/// A suite slower than the latency floor passes at its own pace; a step that stalls for ten
/// times its time at that pace fails, and the stall does not loosen the steps after it.
#[tokio::test]
async fn a_slow_suite_is_judged_at_its_pace_and_a_stall_still_fails() {
    let r = start().await;
    let (addr, fake) = fake_router::start_with_limit(&[("key-a", "probe-a")], 4096).await;
    // 0.5 ms a token: the 3,276-word step takes 1.6 s, the floor is 0.3 s.
    fake.faults.lock().us_per_token = 500;
    let mut s = settings(format!("http://{addr}"));
    s.tenants.truncate(1);
    s.latency.floor_ttft_ms = 300;
    let prober = Prober::new(r.engine.clone(), s).unwrap();
    let store = r.engine.store();

    let run = prober.run_once().await.unwrap();
    let runs = store.probe_runs(1).await.unwrap();
    assert_eq!(
        runs[0].status,
        ProbeRunStatus::Passed,
        "{}",
        runs[0].message
    );
    let results = store.probe_results(run).await.unwrap();
    let slowest = results.iter().filter_map(|x| x.ttft_ms).max().unwrap();
    assert!(
        slowest > 1000,
        "the long steps must outlast the floor for this test to show the pace ({slowest} ms)"
    );
    assert!(incident_kinds(&r).await.is_empty());

    // The next run's 512-word step stalls; the pace is known from the last run.
    fake.faults.lock().stall_at = Some(512);
    let run = prober.run_once().await.unwrap();
    let results = store.probe_results(run).await.unwrap();
    let late: Vec<_> = results
        .iter()
        .filter(|x| x.outcome == ProbeOutcome::LatencyImplausible)
        .collect();
    assert_eq!(late.len(), 1, "{results:#?}");
    assert!(late[0].prompt_words >= 511, "{:?}", late[0]);
    assert!(late[0].detail.contains("pace"), "{}", late[0].detail);
    assert_eq!(incident_kinds(&r).await, ["probe_latency"]);
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

/// The prefix cache must stay within a tenant: probe-a's prompt, sent twice, is a hit the
/// second time; the same prompt from probe-b must not be. A router whose cache crosses tenants
/// is a leak incident naming both.
#[tokio::test]
async fn a_prefix_cache_hit_across_probe_tenants_is_a_leak() {
    let (r, prober, fake) = setup().await;
    let run = prober.run(SweepKind::Light).await.unwrap();
    let isolation = |results: &[pagewarden_auditor::store::ProbeResult]| {
        results
            .iter()
            .find(|s| s.detail.starts_with("prefix isolation"))
            .cloned()
            .expect("an isolation step")
    };
    let clean = isolation(&r.engine.store().probe_results(run).await.unwrap());
    assert_eq!(clean.outcome, ProbeOutcome::Accepted, "{}", clean.detail);
    assert!(
        clean.detail.contains("probe-b reused none"),
        "{}",
        clean.detail
    );
    assert!(incident_kinds(&r).await.is_empty());

    fake.faults.lock().shared_prefix_cache = true;
    let run = prober.run(SweepKind::Light).await.unwrap();
    let crossed = isolation(&r.engine.store().probe_results(run).await.unwrap());
    assert_eq!(crossed.outcome, ProbeOutcome::Leak, "{}", crossed.detail);
    let leaks = get_json(format!(
        "http://{}/api/incidents?kind=cross_tenant_marker",
        r.http_addr
    ))
    .await;
    let leaks = leaks.as_array().unwrap();
    assert_eq!(leaks.len(), 1, "{leaks:?}");
    assert_eq!(
        (&leaks[0]["tenant"], &leaks[0]["other_tenant"]),
        (&serde_json::json!("probe-b"), &serde_json::json!("probe-a"))
    );
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
async fn a_light_sweep_is_one_short_and_one_overlength_step_per_tenant() {
    let (r, prober, fake) = setup().await;
    let run = prober.run(SweepKind::Light).await.unwrap();
    let runs = r.engine.store().probe_runs(1).await.unwrap();
    assert_eq!(runs[0].id, run);
    assert_eq!(
        (runs[0].sweep, runs[0].status),
        (SweepKind::Light, ProbeRunStatus::Passed),
        "{}",
        runs[0].message
    );
    let results = r.engine.store().probe_results(run).await.unwrap();
    let mut steps: Vec<(&str, i64, ProbeOutcome)> = results
        .iter()
        .map(|s| (s.tenant.as_str(), s.prompt_words, s.outcome))
        .collect();
    steps.sort_by_key(|(t, words, _)| (t.to_string(), *words));
    let over = i64::from(fake_router::LIMIT) + 16;
    assert_eq!(
        steps,
        vec![
            ("probe-a", 16, ProbeOutcome::Accepted),
            ("probe-a", over, ProbeOutcome::RejectedClean),
            ("probe-b", 16, ProbeOutcome::Accepted),
            // The prefix-isolation check, recorded under the tenant that must not hit.
            ("probe-b", 128, ProbeOutcome::Accepted),
            ("probe-b", over, ProbeOutcome::RejectedClean),
        ]
    );
    assert_eq!(
        fake.seen.lock().len(),
        7,
        "nothing else was sent (the isolation check: probe-a twice, then probe-b)"
    );
    assert!(incident_kinds(&r).await.is_empty());
    r.shutdown().await;
}

/// An auditor whose prober points at `router`, with `interval` and `sweep` scheduled.
async fn start_probing(router: String, interval: Option<Duration>, sweep: SweepKind) -> Running {
    let mut c = crate::auth::config("sqlite::memory:");
    let s = settings(router.clone());
    c.router_url = Some(router);
    c.probe_tenants = s.tenants;
    c.probe_interval = interval;
    c.probe_sweep = sweep;
    c.probe_request_timeout = Duration::from_secs(10);
    pagewarden_auditor::start(&c, None).await.unwrap()
}

/// Polls until a finished run of `sweep` is stored; panics after 10 s.
async fn wait_finished_run(r: &Running, sweep: SweepKind) {
    let what = format!("a finished {sweep} run");
    let run = eventually(Duration::from_secs(10), &what, || async {
        let runs = r.engine.store().probe_runs(10).await.unwrap();
        runs.iter()
            .find(|x| x.sweep == sweep && x.status != ProbeRunStatus::Running)
            .cloned()
            .ok_or(format!("{runs:?}"))
    })
    .await;
    assert_eq!(run.status, ProbeRunStatus::Passed, "{}", run.message);
}

#[tokio::test]
async fn scheduled_light_sweeps_start_once_the_router_answers() {
    let (addr, fake) = fake_router::start(&[("key-a", "probe-a"), ("key-b", "probe-b")]).await;
    let r = start_probing(
        format!("http://{addr}"),
        Some(Duration::from_millis(300)),
        SweepKind::Light,
    )
    .await;
    wait_finished_run(&r, SweepKind::Light).await;
    let runs = r.engine.store().probe_runs(10).await.unwrap();
    assert!(runs.iter().all(|x| x.sweep == SweepKind::Light));
    assert!(fake.seen.lock().len() >= 4);
    assert!(incident_kinds(&r).await.is_empty());
    r.shutdown().await;
}

#[tokio::test]
async fn operators_start_a_sweep_on_demand() {
    let (addr, _fake) = fake_router::start(&[("key-a", "probe-a"), ("key-b", "probe-b")]).await;
    let r = start_probing(format!("http://{addr}"), None, SweepKind::Light).await;
    let url = format!("http://{}/api/probes/run", r.http_addr);
    let body = serde_json::json!({"sweep": "full"});
    let viewer = api_post(url.clone(), Some(VIEWER_TOKEN), body.clone()).await;
    assert_eq!(viewer.status(), 403);
    let bad = api_post(
        url.clone(),
        Some(OPS_TOKEN),
        serde_json::json!({"sweep": "huge"}),
    )
    .await;
    assert!(bad.status().is_client_error(), "{}", bad.status());
    let ok = api_post(url.clone(), Some(OPS_TOKEN), body).await;
    assert_eq!(ok.status(), 202);
    wait_finished_run(&r, SweepKind::Full).await;
    let api = get_json(format!("http://{}/api/probes", r.http_addr)).await;
    assert_eq!(api[0]["sweep"], "full");
    // Every step of both tenants, the prefix-isolation check and the side-channel audit's two
    // channels (timing, scheduling order).
    assert_eq!(api[0]["results"].as_array().unwrap().len(), 17);
    let html = get_page(format!("http://{}/probes", r.http_addr)).await;
    assert!(html.contains("id=\"probe-chart\"") && html.contains("id=\"run-light\""));
    // The overview asks the router for its health: one live worker of each half, its context.
    let overview = get_page(format!("http://{}/overview", r.http_addr)).await;
    assert!(
        overview.contains("<td class=\"ok\">serving</td><td>1</td><td>1</td><td>256</td>"),
        "{overview}"
    );
    assert_eq!(html.matches("class=\"step outcome-").count(), 17);

    // The Probes page's buttons: a form post with the session's CSRF token, operators only.
    let base = format!("http://{}", r.http_addr);
    let viewer = Signed::sign_in(&base, VIEWER).await;
    let csrf = viewer.csrf.clone();
    let form = [("csrf", csrf.as_str()), ("sweep", "light")];
    assert_eq!(viewer.post("/probes/run", &base, &form).await.status(), 403);
    let ops = Signed::sign_in(&base, OPERATOR).await;
    let csrf = ops.csrf.clone();
    let bad = [("csrf", csrf.as_str()), ("sweep", "huge")];
    assert_eq!(ops.post("/probes/run", &base, &bad).await.status(), 400);
    let form = [("csrf", csrf.as_str()), ("sweep", "light")];
    let resp = ops.post("/probes/run", &base, &form).await;
    assert_eq!(resp.status(), 303);
    assert_eq!(resp.headers()["location"], "/probes");
    wait_finished_run(&r, SweepKind::Light).await;
    r.shutdown().await;

    // Without a router to probe there is nothing to start.
    let r = start().await;
    let url = format!("http://{}/api/probes/run", r.http_addr);
    let off = api_post(url, Some(OPS_TOKEN), serde_json::json!({"sweep": "light"})).await;
    assert_eq!(off.status(), 409);
    r.shutdown().await;
}

#[tokio::test]
async fn periodic_probing_waits_for_the_router_to_be_ready() {
    let (r, prober, fake) = setup().await;
    fake.faults.lock().not_ready = true;
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(Arc::new(prober).run_every(
        Schedule {
            every: Duration::from_secs(3600),
            sweep: SweepKind::Full,
        },
        stop.clone().cancelled_owned(),
    ));
    // The prober asks `/ready` at once, then every 2 s: refused twice, it is still waiting.
    eventually(
        Duration::from_secs(10),
        "two refused /ready asks",
        || async { fake.refused_ready.load(Ordering::SeqCst) >= 2 },
    )
    .await;
    let store = r.engine.store();
    assert!(
        store.probe_runs(5).await.unwrap().is_empty(),
        "probed a router that is not ready"
    );
    assert!(fake.seen.lock().is_empty());
    fake.faults.lock().not_ready = false;
    eventually(
        Duration::from_secs(20),
        "a run once the router was ready",
        || async { !store.probe_runs(5).await.unwrap().is_empty() },
    )
    .await;
    stop.cancel();
    task.await.unwrap();
    assert!(incident_kinds(&r).await.is_empty());
    r.shutdown().await;
}

/// The fake as a suite whose prefix cache answers a hit ten times sooner and whose receipts
/// (signed by `key`) name one prefill worker, `prefill-7`; a prober running both side-channel
/// channels against it (8 timing rounds, 6 order rounds) and holding `expected` as the key.
async fn side_channel_setup(
    shared: bool,
    key: &Arc<ReceiptKey>,
    expected: PublicKey,
    rounds: (u32, u32),
) -> (Running, Prober) {
    let r = start().await;
    let (addr, fake) = fake_router::start(&[("key-a", "probe-a"), ("key-b", "probe-b")]).await;
    {
        let mut f = fake.faults.lock();
        // 1 ms a token: the audit's 128-word prompts take 129 ms cold, 13 ms from the cache.
        f.us_per_token = 1000;
        f.cache_speedup = true;
        f.shared_prefix_cache = shared;
        f.receipts = Some((key.clone(), "prefill-7".into()));
    }
    let mut s = settings(format!("http://{addr}"));
    s.side_channel = SideChannelSettings {
        rounds: rounds.0,
        order_rounds: rounds.1,
        ..SideChannelSettings::default()
    };
    s.receipt_key = Some(expected);
    let prober = Prober::new(r.engine.clone(), s).unwrap();
    (r, prober)
}

fn new_key() -> Arc<ReceiptKey> {
    Arc::new(ReceiptKey::from_pem(&ReceiptKey::generate_pem().unwrap()).unwrap())
}

/// A gauge's value for `worker` in the auditor's `/metrics`.
async fn isolation_gauge(r: &Running, name: &str, worker: &str) -> Option<f64> {
    let metrics = get_text(format!("http://{}/metrics", r.http_addr)).await;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}{{worker=\"{worker}\"}} ")))
        .map(|v| v.trim().parse().unwrap())
}

/// A cache shared by every tenant leaks on both channels: the other tenant's cross requests
/// come back sooner than its cold ones (timing) and ahead of them in its mixed batches (order).
/// Each is found under the worker the verified receipts name, in the metrics, in
/// `/api/isolation`, on the probes page's chart and as a `side_channel` incident naming it. A
/// cache per tenant passes both, while the positive control still sees the owner's hits.
#[tokio::test]
async fn the_side_channel_audit_names_the_worker_and_catches_a_shared_cache_on_both_channels() {
    let key = new_key();
    for shared in [true, false] {
        let (r, prober) = side_channel_setup(shared, &key, key.public(), (8, 6)).await;
        prober.run_once().await.unwrap();
        let ks = isolation_gauge(&r, "pagewarden_auditor_isolation_ks_p", "prefill-7").await;
        let order = isolation_gauge(&r, "pagewarden_auditor_isolation_order_p", "prefill-7").await;
        let control =
            isolation_gauge(&r, "pagewarden_auditor_isolation_control_ks_p", "prefill-7").await;
        let (ks, order, control) = (ks.unwrap(), order.unwrap(), control.unwrap());
        assert!(control < 0.05, "the control saw no cache hit: {control}");
        let verdicts = get_json(format!("http://{}/api/isolation", r.http_addr)).await;
        let verdicts = verdicts.as_array().unwrap();
        assert_eq!(verdicts.len(), 2, "{verdicts:#?}");
        assert!(
            verdicts.iter().all(|v| v["worker"] == "prefill-7"),
            "{verdicts:#?}"
        );
        let incidents = get_json(format!("http://{}/api/incidents", r.http_addr)).await;
        if let Some(i) = incidents
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["kind"] == "side_channel")
        {
            // The incident page links back to the probe run that found it.
            let id = i["id"].as_i64().unwrap();
            let detail = get_page(format!("http://{}/incidents/{id}", r.http_addr)).await;
            assert!(
                detail.contains("id=\"probe-run\" href=\"/probes/runs/"),
                "{detail}"
            );
            assert!(detail.contains("<p id=\"meaning\">The side-channel audit found"));
        }
        let channels: Vec<String> = incidents
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["kind"] == "side_channel")
            .map(|i| {
                let d: serde_json::Value =
                    serde_json::from_str(i["details"].as_str().unwrap()).unwrap();
                assert_eq!(d["workers"][0]["worker"], "prefill-7", "{d}");
                d["channel"].as_str().unwrap().to_string()
            })
            .collect();
        let page = get_page(format!("http://{}/probes", r.http_addr)).await;
        assert!(page.contains("id=\"isolation-chart\""));
        // The overview: the open side-channel incidents, the last run and the isolation
        // verdicts at a glance (this auditor has no router of its own to ask for its health).
        let overview = get_page(format!("http://{}/overview?range=15m", r.http_addr)).await;
        assert!(overview.contains("<p id=\"suite\" class=\"muted\">No router configured"));
        assert!(
            overview.contains("id=\"last-probe\">Last probe run <a href=\"/probes/runs/"),
            "{overview}"
        );
        let leaking = if shared { "2 leaking" } else { "0 leaking" };
        assert!(
            overview.contains(&format!(
                "2 worker/channel verdicts, <span class=\"{}\">{leaking}",
                if shared { "bad" } else { "ok" }
            )),
            "{overview}"
        );
        assert_eq!(
            overview.contains("href=\"/incidents?status=open&amp;kind=side_channel\""),
            shared,
            "{overview}"
        );
        let ops = Signed::sign_in(&format!("http://{}", r.http_addr), OPERATOR).await;
        assert_eq!(ops.get("/overview?range=1y").await.status(), 400);
        assert_eq!(ops.get("/").await.headers()["location"], "/overview");
        // The tenants page: the newest verdict of each channel, under the worker.
        let tenants = get_page(format!("http://{}/tenants", r.http_addr)).await;
        let verdict = if shared { "leak" } else { "isolated" };
        for channel in ["timing", "order"] {
            let row = format!("<tr><td>prefill-7</td><td>{channel}</td>");
            let at = tenants
                .find(&row)
                .unwrap_or_else(|| panic!("no {row} in {tenants}"));
            let row_end = at + tenants[at..].find("</tr>").unwrap();
            assert!(
                tenants[at..row_end].contains(&format!(">{verdict}</td>")),
                "{tenants}"
            );
        }
        if shared {
            assert!(ks < 1e-3, "timing: {ks}");
            assert!(order < 1e-3, "order: {order}");
            assert!(verdicts.iter().all(|v| v["leak"] == true), "{verdicts:#?}");
            let mut channels = channels;
            channels.sort();
            assert_eq!(channels, ["order", "timing"]);
            assert!(page.contains("class=\"audit timing leak\""));
            assert!(page.contains("class=\"audit order leak\""));
        } else {
            assert!(ks >= 1e-3, "timing: {ks}");
            assert!(order >= 1e-3, "order: {order}");
            assert!(verdicts.iter().all(|v| v["leak"] == false), "{verdicts:#?}");
            assert!(channels.is_empty(), "{channels:?}");
            assert!(page.contains("class=\"audit timing ok\""));
        }
        r.shutdown().await;
    }
}

/// Receipts that do not verify against the auditor's key attribute no round to any worker:
/// nothing is recorded under a worker, and the step says why.
#[tokio::test]
async fn receipts_signed_by_another_key_attribute_no_round() {
    let (signer, expected) = (new_key(), new_key());
    let (r, prober) = side_channel_setup(true, &signer, expected.public(), (1, 1)).await;
    let run = prober.run_once().await.unwrap();
    let results = r.engine.store().probe_results(run).await.unwrap();
    let side: Vec<_> = results
        .iter()
        .filter(|s| s.detail.starts_with("side channel"))
        .collect();
    assert_eq!(side.len(), 2, "{results:#?}");
    for s in side {
        assert!(s.detail.contains("no round counted"), "{}", s.detail);
        assert!(
            s.detail.contains("1 not attributed to a worker"),
            "{}",
            s.detail
        );
        assert!(s.detail.contains("signed by key"), "{}", s.detail);
    }
    let verdicts = get_json(format!("http://{}/api/isolation", r.http_addr)).await;
    assert_eq!(verdicts.as_array().unwrap().len(), 0);
    assert!(
        isolation_gauge(&r, "pagewarden_auditor_isolation_ks_p", "prefill-7")
            .await
            .is_none()
    );
    r.shutdown().await;
}
