//! The auditor's PostgreSQL goes down and comes back: what router and workers report meanwhile,
//! through the buffered client they use, is kept (not stored, not lost) and stored, once each
//! and in order, when the database is back; `/ready` says the database is down while it is, and
//! a probe run that cannot be stored meanwhile is logged, not fatal.

use std::time::{Duration, Instant};

use pagewarden_auditor::client::{AuditorClient, ClientStats};
use pagewarden_auditor::domain::{ProbeRunStatus, UnixMs};
use pagewarden_auditor::probe::ProbeTenant;
use pagewarden_auditor::store::{IncidentFilter, Window};
use pagewarden_proto::v1 as pb;
use pagewarden_testkit::eventually;
use serde_json::json;

use crate::auth::{self, api_post, OPS_TOKEN};
use crate::pg::TempPostgres;

/// Reports of each kind sent during the outage.
const N: u8 = 5;
const NODE: &str = "decode-outage";

fn sample(i: u8) -> pb::SampleReport {
    pb::SampleReport {
        tenant: format!("tenant-{i}"),
        req: Some(pb::RequestRef {
            request_id: vec![i + 1; 16],
            attempt: 1,
        }),
        node: NODE.into(),
        status: pb::SampleStatus::Ok as i32,
        response_text: format!("answer {i}"),
        ..Default::default()
    }
}

fn integrity(i: u8) -> pb::IntegrityReport {
    pb::IntegrityReport {
        kind: pb::IntegrityKind::GenerationMismatch as i32,
        node: NODE.into(),
        req: Some(pb::RequestRef {
            request_id: vec![i + 1; 16],
            attempt: 1,
        }),
        tenant: format!("tenant-{i}"),
        page: Some(u32::from(i)),
        generation: Some(1),
        details: format!("event {i}"),
    }
}

/// The client's stats once `done` holds of them; panics after `within`.
async fn stats_once(
    client: &AuditorClient,
    within: Duration,
    done: impl Fn(&ClientStats) -> bool,
) -> ClientStats {
    let started = Instant::now();
    let s = eventually(within, "the client's stats", || async {
        let s = client.stats();
        if done(&s) {
            Ok(s)
        } else {
            Err(format!("still {s:?}"))
        }
    })
    .await;
    println!("client {s:?} after {:?}", started.elapsed());
    s
}

async fn get(url: &str) -> (u16, String) {
    let resp = reqwest::get(url).await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

// Multi-threaded: the test body blocks on `pg_ctl` while the auditor and the client's sender run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_sent_while_postgres_is_down_are_stored_once_it_is_back() {
    let pg = TempPostgres::start();
    let mut cfg = auth::config(&pg.url);
    // A router nobody answers for: a probe run stores a run and an incident, and nothing else.
    cfg.router_url = Some("http://127.0.0.1:9".into());
    cfg.probe_tenants = vec![ProbeTenant {
        tenant: "probe-a".into(),
        api_key: "key-a".into(),
    }];
    let r = pagewarden_auditor::start(&cfg, None)
        .await
        .expect("auditor starts");
    let run_probe = format!("http://{}/api/probes/run", r.http_addr);
    let ready = format!("http://{}/ready", r.http_addr);
    assert_eq!(get(&ready).await.0, 200);
    let client = AuditorClient::spawn(&format!("http://{}", r.grpc_addr), 64).unwrap();

    pg.stop();
    let (code, why) = get(&ready).await;
    assert_eq!(code, 503, "/ready while the database is down: {why}");
    // The pool gives up on the database (and says why) before `/ready` stops waiting for it.
    assert!(
        why.contains("database unavailable: database error"),
        "{why}"
    );
    assert_eq!(get(&format!("http://{}/live", r.http_addr)).await.0, 200);
    let probe = api_post(
        run_probe.clone(),
        Some(OPS_TOKEN),
        json!({"sweep": "light"}),
    )
    .await;
    assert_eq!(probe.status(), 202);

    for i in 0..N {
        assert!(client.report_sample(sample(i)));
        assert!(client.report_integrity(integrity(i)));
    }
    // The auditor answered UNAVAILABLE (at least) twice; nothing was taken, refused or dropped.
    let s = stats_once(&client, Duration::from_secs(30), |s| s.retried >= 2).await;
    assert_eq!((s.sent, s.failed, s.dropped), (0, 0, 0));
    assert_eq!(s.waiting(), 2 * u64::from(N));

    pg.start_again();
    let all = 2 * u64::from(N);
    let s = stats_once(&client, Duration::from_secs(30), |s| s.sent == all).await;
    assert_eq!((s.failed, s.dropped, s.waiting()), (0, 0, 0));
    assert_eq!(get(&ready).await.0, 200);

    // Every report is stored, once, in the order it was sent.
    let store = r.engine.store();
    assert_eq!(store.sample_totals().await.unwrap().samples, i64::from(N));
    let samples = store.recent_samples(UnixMs(0), 100).await.unwrap();
    let tenants: Vec<String> = samples.iter().rev().map(|s| s.tenant.clone()).collect();
    let expected: Vec<String> = (0..N).map(|i| format!("tenant-{i}")).collect();
    assert_eq!(tenants, expected);
    let incidents = store
        .incidents(
            &IncidentFilter {
                node: Some(NODE.into()),
                ..Default::default()
            },
            Window::default(),
        )
        .await
        .unwrap();
    let pages: Vec<Option<i64>> = incidents.iter().rev().map(|i| i.page).collect();
    let expected: Vec<Option<i64>> = (0..N).map(|i| Some(i64::from(i))).collect();
    assert_eq!(
        pages, expected,
        "one generation-mismatch incident per event"
    );

    // The probe run started during the outage left nothing behind and did not stop probing.
    assert!(store.probe_runs(10).await.unwrap().is_empty());
    let stuck = Instant::now() + Duration::from_secs(10);
    eventually(
        Duration::from_secs(10),
        "probing to accept a run",
        || async {
            let r = api_post(
                run_probe.clone(),
                Some(OPS_TOKEN),
                json!({"sweep": "light"}),
            )
            .await;
            r.status() == 202
        },
    )
    .await;
    let left = stuck.saturating_duration_since(Instant::now());
    let run = eventually(left, "the probe run to end", || async {
        let runs = store.probe_runs(10).await.unwrap();
        match runs.as_slice() {
            [run] if run.status != ProbeRunStatus::Running => Ok(run.clone()),
            _ => Err(format!("{runs:?}")),
        }
    })
    .await;
    assert_eq!(run.status, ProbeRunStatus::Error, "{}", run.message);
    r.shutdown().await;
}

/// A recompute whose verdict falls in a database outage is stored, with its incident, once the
/// database is back (the recompute thread waits for the store): a mismatch is never lost.
#[tokio::test]
async fn a_recompute_mismatch_during_an_outage_is_stored_once_it_is_back() {
    let pg = TempPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::recompute::with_model(auth::config(&pg.url), dir.path());
    let r = pagewarden_auditor::start(&cfg, None)
        .await
        .expect("auditor starts");
    let mut g = crate::ingest::grpc(&r).await;
    let prompt: Vec<u32> = (0..16).map(|i| 12 + (i * 5) % 40).collect();
    let (output, mut lp) = crate::recompute::served(&prompt);
    lp[1] -= 2.0;
    pg.stop();
    g.report_recompute(crate::recompute::report(&prompt, &output, &lp, 4))
        .await
        .unwrap();
    // The recompute is done (in well under this) while the database is down.
    tokio::time::sleep(Duration::from_secs(3)).await;
    pg.start_again();
    let store = r.engine.store();
    eventually(Duration::from_secs(60), "the recompute stored", || async {
        let rows = store.recomputes(10).await.map_err(|e| e.to_string())?;
        let incidents = store
            .incidents(&IncidentFilter::default(), Window::default())
            .await
            .map_err(|e| e.to_string())?;
        match (rows.len(), incidents.len()) {
            (1, 1) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let rows = store.recomputes(10).await.unwrap();
    assert_eq!(rows[0].recompute.first_divergence, Some(1));
    // Stored once, whatever the retries.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(store.recomputes(10).await.unwrap().len(), 1);
    r.shutdown().await;
}
