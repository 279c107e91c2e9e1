//! One store suite, run against SQLite and against a real PostgreSQL the test starts itself.

use pagewarden_auditor::domain::{
    CacheEventKind, IncidentKind, IncidentStatus, IntegrityKind, IsolationChannel, NodeRole,
    ProbeOutcome, ProbeRunId, ProbeRunStatus, RecomputeVerdict, SampleStatus, Severity, SweepKind,
    UnixMs,
};
use pagewarden_auditor::store::{
    Backend, CacheHeld, CacheTotals, ErasedWorker, IncidentFilter, MarkerRecord, NewCacheEvent,
    NewErasure, NewIncident, NewIntegrityEvent, NewIsolationAudit, NewPreflight, NewRecompute,
    NewSample, ProbeResult, ProbeRunEnd, Store, StoreError, Window,
};

use crate::pg::TempPostgres;

fn incident(kind: IncidentKind, tenant: &str, at: i64) -> NewIncident {
    NewIncident {
        kind,
        severity: kind.severity(),
        node: Some("decode-0".into()),
        request_id: Some("00ff".into()),
        tenant: Some(tenant.into()),
        other_tenant: Some("other".into()),
        page: None,
        generation: None,
        details: r#"{"why":"test"}"#.into(),
        at: UnixMs(at),
    }
}

async fn suite(store: Store) {
    // Every kind the Rust enum names is one the CHECK constraint accepts.
    for (i, k) in IncidentKind::ALL.iter().enumerate() {
        store
            .insert_incident(&incident(*k, "t-all", i as i64))
            .await
            .unwrap();
    }
    let all = store
        .incidents(
            &IncidentFilter {
                tenant: Some("t-all".into()),
                ..Default::default()
            },
            Window::default(),
        )
        .await
        .unwrap();
    assert_eq!(all.len(), IncidentKind::ALL.len());
    assert!(all.iter().all(|i| i.status == IncidentStatus::Open));
    assert!(all.windows(2).all(|w| w[0].id > w[1].id), "newest first");

    // ...and one it does not name is refused by the database itself.
    let bad = store.execute_raw(
        "INSERT INTO incidents (kind, severity, status, details, created_at) \
         VALUES ('made_up', 'critical', 'open', '', 0)",
    );
    assert!(bad.await.is_err(), "CHECK must refuse an unknown kind");
    let bad = store.execute_raw(
        "INSERT INTO incidents (kind, severity, status, details, created_at) \
         VALUES ('quarantine', 'critical', 'closed', '', 0)",
    );
    assert!(bad.await.is_err(), "CHECK must refuse an unknown status");

    // Filters.
    let a = store
        .insert_incident(&incident(IncidentKind::CrossTenantMarker, "alice", 100))
        .await
        .unwrap();
    let b = store
        .insert_incident(&incident(
            IncidentKind::Integrity(IntegrityKind::GenerationMismatch),
            "bob",
            101,
        ))
        .await
        .unwrap();
    let by_kind = store
        .incidents(
            &IncidentFilter {
                kind: Some(IncidentKind::Integrity(IntegrityKind::GenerationMismatch)),
                ..Default::default()
            },
            Window::default(),
        )
        .await
        .unwrap();
    assert_eq!(by_kind.len(), 2);
    assert_eq!(by_kind[0].id, b);
    let by_tenant = store
        .incidents(
            &IncidentFilter {
                tenant: Some("alice".into()),
                ..Default::default()
            },
            Window::default(),
        )
        .await
        .unwrap();
    assert_eq!(by_tenant.iter().map(|i| i.id).collect::<Vec<_>>(), vec![a]);
    assert_eq!(by_tenant[0].other_tenant.as_deref(), Some("other"));

    // open → acknowledged → resolved, with who/when/note; resolved is terminal.
    let acked = store
        .acknowledge(a, "ops-1", "looking", UnixMs(200))
        .await
        .unwrap();
    assert_eq!(acked.status, IncidentStatus::Acknowledged);
    let ack = acked.acknowledged.clone().unwrap();
    assert_eq!(
        (ack.by.as_str(), ack.at, ack.note.as_str()),
        ("ops-1", UnixMs(200), "looking")
    );
    assert!(matches!(
        store.acknowledge(a, "ops-2", "", UnixMs(201)).await,
        Err(StoreError::InvalidTransition {
            from: IncidentStatus::Acknowledged,
            to: IncidentStatus::Acknowledged,
            ..
        })
    ));
    let resolved = store
        .resolve(a, "ops-2", "fixed", UnixMs(300))
        .await
        .unwrap();
    assert_eq!(resolved.status, IncidentStatus::Resolved);
    assert_eq!(resolved.resolved.unwrap().by, "ops-2");
    assert_eq!(resolved.acknowledged.unwrap().by, "ops-1");
    assert!(matches!(
        store.resolve(a, "ops-2", "", UnixMs(301)).await,
        Err(StoreError::InvalidTransition { .. })
    ));
    // open → resolved directly.
    assert_eq!(
        store
            .resolve(b, "ops", "", UnixMs(302))
            .await
            .unwrap()
            .status,
        IncidentStatus::Resolved
    );
    let missing = pagewarden_auditor::domain::IncidentId(999_999);
    assert!(matches!(
        store.acknowledge(missing, "x", "", UnixMs(1)).await,
        Err(StoreError::NotFound(_))
    ));
    let open_only = store
        .incidents(
            &IncidentFilter {
                status: Some(IncidentStatus::Open),
                ..Default::default()
            },
            Window::default(),
        )
        .await
        .unwrap();
    assert_eq!(open_only.len(), IncidentKind::ALL.len());
    let counts = store.incident_counts().await.unwrap();
    assert_eq!(
        counts,
        vec![
            (IncidentStatus::Open, IncidentKind::ALL.len() as i64),
            (IncidentStatus::Acknowledged, 0),
            (IncidentStatus::Resolved, 2),
        ]
    );

    // Samples.
    for (i, scanned) in [true, true, false].into_iter().enumerate() {
        store
            .insert_sample(&NewSample {
                tenant: "alice".into(),
                request_id: None,
                node: None,
                prompt_tokens: 10,
                completion_tokens: 5,
                response_digest: format!("d{i}"),
                scanned,
                foreign_markers: i64::from(i == 1),
                ttft_ms: Some(12),
                status: SampleStatus::Ok,
                at: UnixMs(1000),
            })
            .await
            .unwrap();
    }
    let t = store.sample_totals().await.unwrap();
    assert_eq!((t.samples, t.scanned, t.with_foreign_markers), (3, 2, 1));

    // Integrity events and the series.
    for (kind, at) in [
        (IntegrityKind::GenerationMismatch, 60_000),
        (IntegrityKind::GenerationMismatch, 60_500),
        (IntegrityKind::Quarantine, 61_000),
        (IntegrityKind::GenerationMismatch, 120_100),
        (IntegrityKind::ChecksumMismatch, 10),
    ] {
        store
            .insert_integrity(&NewIntegrityEvent {
                kind,
                node: "decode-0".into(),
                request_id: None,
                tenant: Some("alice".into()),
                page: Some(7),
                generation: Some(3),
                details: String::new(),
                routine: false,
                at: UnixMs(at),
            })
            .await
            .unwrap();
    }
    let series = store
        .integrity_series(UnixMs(60_000), 60_000)
        .await
        .unwrap();
    let got: Vec<(i64, IntegrityKind, i64)> = series
        .iter()
        .map(|p| (p.bucket.0, p.kind, p.count))
        .collect();
    let mut want = vec![
        (60_000, IntegrityKind::GenerationMismatch, 2),
        (60_000, IntegrityKind::Quarantine, 1),
        (120_000, IntegrityKind::GenerationMismatch, 1),
    ];
    want.sort_by(|x, y| (x.0, x.1.as_str()).cmp(&(y.0, y.1.as_str())));
    assert_eq!(got, want);

    // Preflight: the node table shows each node's latest report.
    for (node, ok, pool, at) in [
        ("decode-0", false, 100, 1),
        ("decode-0", true, 9000, 2),
        ("prefill-0", true, 5000, 3),
    ] {
        store
            .insert_preflight(&NewPreflight {
                node: node.into(),
                role: if node.starts_with("decode") {
                    NodeRole::Decode
                } else {
                    NodeRole::Prefill
                },
                pool_tokens: pool,
                context_length: 2048,
                ok,
                message: String::new(),
                at: UnixMs(at),
            })
            .await
            .unwrap();
    }
    let nodes = store.nodes().await.unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(
        (
            nodes[0].last.node.as_str(),
            nodes[0].last.ok,
            nodes[0].reports
        ),
        ("decode-0", true, 2)
    );
    assert_eq!(nodes[0].last.pool_tokens, 9000);
    assert_eq!(nodes[1].last.role, NodeRole::Prefill);

    // Markers.
    for (m, t) in [
        ("PWCANARY-1", "alice"),
        ("PWCANARY-2", "bob"),
        ("PWCANARY-3", "alice"),
    ] {
        store
            .insert_marker(&MarkerRecord {
                marker: m.into(),
                tenant: t.into(),
                issued_at: UnixMs(5),
            })
            .await
            .unwrap();
    }
    assert_eq!(store.markers(Some("alice")).await.unwrap().len(), 2);
    assert_eq!(store.markers(None).await.unwrap().len(), 3);
    assert!(
        store
            .insert_marker(&MarkerRecord {
                marker: "PWCANARY-1".into(),
                tenant: "bob".into(),
                issued_at: UnixMs(6)
            })
            .await
            .is_err(),
        "a marker belongs to one tenant only"
    );

    // Probe runs and results.
    let run = store
        .start_probe_run(UnixMs(10), SweepKind::Light)
        .await
        .unwrap();
    for (step, outcome) in [
        (0, ProbeOutcome::Accepted),
        (1, ProbeOutcome::RejectedClean),
    ] {
        store
            .insert_probe_result(
                run,
                &ProbeResult {
                    tenant: "probe-a".into(),
                    step,
                    prompt_words: 16 << step,
                    expected_tokens: Some(40),
                    outcome,
                    http_status: Some(if step == 0 { 200 } else { 400 }),
                    prompt_tokens: (step == 0).then_some(40),
                    ttft_ms: (step == 0).then_some(3),
                    detail: String::new(),
                    at: UnixMs(11),
                },
            )
            .await
            .unwrap();
    }
    let runs = store.probe_runs(10).await.unwrap();
    assert_eq!(runs[0].status, ProbeRunStatus::Running);
    store
        .finish_probe_run(
            run,
            &ProbeRunEnd {
                status: ProbeRunStatus::Passed,
                context_limit: Some(256),
                steps: 2,
                failures: 0,
                message: "ok".into(),
                at: UnixMs(12),
            },
        )
        .await
        .unwrap();
    let runs = store.probe_runs(10).await.unwrap();
    assert_eq!(
        (runs[0].status, runs[0].context_limit, runs[0].finished_at),
        (ProbeRunStatus::Passed, Some(256), Some(UnixMs(12)))
    );
    assert_eq!(runs[0].sweep, SweepKind::Light);
    // Paged, newest first; one run by id; the count.
    let second = store
        .start_probe_run(UnixMs(20), SweepKind::Full)
        .await
        .unwrap();
    assert_eq!(store.probe_run_count().await.unwrap(), 2);
    let page = |offset| Window { limit: 1, offset };
    let newest = store.probe_runs_in(page(0)).await.unwrap();
    let older = store.probe_runs_in(page(1)).await.unwrap();
    assert_eq!((newest.len(), newest[0].id), (1, second));
    assert_eq!((older.len(), older[0].id), (1, run));
    assert!(store.probe_runs_in(page(2)).await.unwrap().is_empty());
    let one = store.probe_run(run).await.unwrap().expect("run by id");
    assert_eq!((one.steps, one.message.as_str()), (2, "ok"));
    assert!(store
        .probe_run(ProbeRunId(second.0 + 1000))
        .await
        .unwrap()
        .is_none());
    let recent = store.recent_probe_results(UnixMs(11), 1).await.unwrap();
    assert_eq!(recent.len(), 1, "at most `limit` steps");
    assert_eq!(recent[0].step, 1, "newest first");
    assert!(store
        .recent_probe_results(UnixMs(12), 10)
        .await
        .unwrap()
        .is_empty());
    let results = store.probe_results(run).await.unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[1].outcome, ProbeOutcome::RejectedClean);
    assert_eq!(results[1].prompt_tokens, None);

    issue_19(&store).await;
    cache_events(&store).await;
    erasures(&store).await;
    recomputes(&store).await;
    isolation_audits(&store, run).await;
    store.close().await;
}

/// The side-channel audit's verdicts: stored per worker and channel and read back oldest
/// first, p-values to three decimals of their log (an order verdict has no control).
async fn isolation_audits(store: &Store, run: ProbeRunId) {
    let verdict = |worker: &str, channel, p, control_p, at| NewIsolationAudit {
        run_id: run,
        worker: worker.into(),
        channel,
        rounds: 8,
        p,
        control_p,
        threshold: 1e-3,
        conclusive: true,
        leak: p < 1e-3,
        at: UnixMs(at),
    };
    let timing = verdict(
        "prefill-0",
        IsolationChannel::Timing,
        2.1e-5,
        Some(3e-4),
        30_000,
    );
    let order = verdict("prefill-1", IsolationChannel::Order, 0.42, None, 31_000);
    store.insert_isolation_audit(&timing).await.unwrap();
    store.insert_isolation_audit(&order).await.unwrap();
    let got = store.isolation_audits(UnixMs(29_000), 10).await.unwrap();
    assert_eq!(got.len(), 2);
    let close = |a: f64, b: f64| (a / b - 1.0).abs() < 0.0012;
    for (g, want) in got.iter().zip([&timing, &order]) {
        let g = &g.audit;
        assert_eq!(
            (
                &g.worker,
                g.channel,
                g.rounds,
                g.leak,
                g.conclusive,
                g.run_id,
                g.at
            ),
            (
                &want.worker,
                want.channel,
                want.rounds,
                want.leak,
                want.conclusive,
                want.run_id,
                want.at
            )
        );
        assert!(
            close(g.p, want.p) && close(g.threshold, want.threshold),
            "{g:?}"
        );
        assert_eq!(g.control_p.is_some(), want.control_p.is_some(), "{g:?}");
    }
    assert!(close(got[0].audit.control_p.unwrap(), 3e-4));
    assert!(!got[1].audit.leak && got[0].audit.leak);
    // Only what was recorded since.
    assert_eq!(
        store
            .isolation_audits(UnixMs(30_500), 10)
            .await
            .unwrap()
            .len(),
        1
    );
}

/// Recompute verdicts: stored with digests only and read back newest first, a NULL first
/// divergence and request id included; a digest of another length, or a negative difference,
/// is refused by the schema; a `recompute_mismatch` incident is a kind the schema takes.
async fn recomputes(store: &Store) {
    let rec = |verdict, first: Option<i64>, at| NewRecompute {
        request_id: first.map(|_| "0f".repeat(16)),
        tenant: "t".into(),
        decode_node: Some("decode-0".into()),
        prompt_tokens: 200,
        output_tokens: 24,
        prompt_sha256: "ab".repeat(32),
        output_sha256: "cd".repeat(32),
        verdict,
        max_diff_micro: first.map_or(0, |_| 2_662_694),
        tolerance_micro: 1_000_000,
        first_divergence: first,
        recompute_ms: 312,
        at: UnixMs(at),
    };
    // Read back field for field: a request id and a first divergence, then neither (NULLs).
    let mismatch = rec(RecomputeVerdict::Mismatch, Some(0), 20_000);
    let matched = rec(RecomputeVerdict::Match, None, 21_000);
    let m = store.insert_recompute(&mismatch).await.unwrap();
    store.insert_recompute(&matched).await.unwrap();
    let mut short = rec(RecomputeVerdict::Match, None, 22_000);
    short.prompt_sha256 = "ab".into();
    assert!(store.insert_recompute(&short).await.is_err());
    let mut negative = rec(RecomputeVerdict::Failed, None, 22_000);
    negative.max_diff_micro = -1;
    assert!(store.insert_recompute(&negative).await.is_err());
    let got = store.recomputes(10).await.unwrap();
    assert_eq!(got.len(), 2);
    let totals = store.recompute_totals().await.unwrap();
    assert_eq!(totals.len(), 1, "{totals:?}");
    assert_eq!(
        (totals[0].matches, totals[0].mismatches, totals[0].failed),
        (1, 1, 0)
    );
    assert_eq!(
        (totals[0].tenant.as_str(), totals[0].last_at),
        ("t", UnixMs(21_000))
    );
    assert_eq!((got[1].id, &got[1].recompute), (m, &mismatch));
    assert_eq!(got[0].recompute, matched);
    let kind = IncidentKind::RecomputeMismatch;
    store
        .insert_incident(&incident(kind, "t", 20_001))
        .await
        .unwrap();
}

/// Cache erasures: stored with their workers' parts and read back newest first; a part whose
/// counts do not add up, or a digest of another length, is refused by the schema, and
/// nothing of that erasure is stored.
async fn erasures(store: &Store) {
    let part = |node: &str, role, entries, zeroed, deferred| ErasedWorker {
        node: node.into(),
        role,
        entries,
        pages_zeroed: zeroed,
        pages_deferred: deferred,
        digest: "ab".repeat(32),
    };
    let erasure = |tenant: &str, at, workers| NewErasure {
        tenant: tenant.into(),
        namespace: "a1b2c3d4".into(),
        digest: "cd".repeat(32),
        workers,
        at: UnixMs(at),
    };
    let first = erasure(
        "t",
        10_000,
        vec![
            part("p-0", NodeRole::Prefill, 5, 5, 0),
            part("d-0", NodeRole::Decode, 6, 4, 2),
        ],
    );
    let id = store.insert_erasure(&first).await.unwrap();
    let second = erasure("u", 11_000, vec![part("d-0", NodeRole::Decode, 0, 0, 0)]);
    store.insert_erasure(&second).await.unwrap();
    let bad = erasure("v", 12_000, vec![part("d-0", NodeRole::Decode, 3, 1, 1)]);
    assert!(store.insert_erasure(&bad).await.is_err());
    let mut short = erasure("w", 12_000, vec![]);
    short.digest = "cd".into();
    assert!(store.insert_erasure(&short).await.is_err());

    let got = store.erasures(10).await.unwrap();
    let tenants: Vec<&str> = got.iter().map(|e| e.tenant.as_str()).collect();
    assert_eq!(tenants, ["u", "t"]);
    let t = &got[1];
    assert_eq!(
        (t.id, t.at, t.digest.as_str()),
        (id, UnixMs(10_000), first.digest.as_str())
    );
    assert_eq!(t.namespace, "a1b2c3d4");
    assert_eq!(t.workers, first.workers);
    assert_eq!(store.erasures(1).await.unwrap().len(), 1);
}

/// Prefix-cache events: every kind the CHECK accepts, totals per role and tenant (sums as
/// integers on both backends), ordered by role, then tenant.
async fn cache_events(store: &Store) {
    let event = |kind, role, tenant: Option<&str>, cached, pages| NewCacheEvent {
        kind,
        node: "w-0".into(),
        role,
        tenant: tenant.map(str::to_string),
        namespace: "a1b2c3d4".into(),
        request_id: None,
        prompt_tokens: 100,
        cached_tokens: cached,
        pages,
        at: UnixMs(9_000),
    };
    for e in [
        event(CacheEventKind::Miss, NodeRole::Prefill, Some("t"), 0, 0),
        event(CacheEventKind::Hit, NodeRole::Prefill, Some("t"), 96, 0),
        event(CacheEventKind::Hit, NodeRole::Prefill, Some("t"), 80, 0),
        event(CacheEventKind::Eviction, NodeRole::Decode, None, 0, 3),
    ] {
        store.insert_cache_event(&e).await.unwrap();
    }
    // What each worker last said its namespaces hold: the latest per worker and namespace
    // counts, a report naming no tenant keeps the one named before, and a tenant that only
    // holds pages (no events) still gets its row.
    let held = |node: &str, namespace: &str, tenant: Option<&str>, pages, at| CacheHeld {
        node: node.into(),
        role: NodeRole::Prefill,
        namespace: namespace.into(),
        tenant: tenant.map(str::to_string),
        pages,
        at: UnixMs(at),
    };
    for h in [
        held("w-0", "a1b2c3d4", Some("t"), 4, 1),
        held("w-0", "a1b2c3d4", None, 3, 2),
        held("w-1", "a1b2c3d4", Some("t"), 2, 3),
        held("w-1", "0badcafe", Some("u"), 5, 4),
        held("w-1", "0badcafe", Some("u"), 0, 5),
        held("w-1", "0badcafe", Some("v"), 7, 6),
    ] {
        store.set_cache_held(&h).await.unwrap();
    }
    let totals = store.cache_totals().await.unwrap();
    assert_eq!(
        totals,
        vec![
            CacheTotals {
                role: NodeRole::Decode,
                tenant: String::new(),
                hits: 0,
                misses: 0,
                evictions: 1,
                prompt_tokens: 100,
                cached_tokens: 0,
                evicted_pages: 3,
                namespaces: 1,
                pages_held: 0,
            },
            CacheTotals {
                role: NodeRole::Prefill,
                tenant: "t".into(),
                hits: 2,
                misses: 1,
                evictions: 0,
                prompt_tokens: 300,
                cached_tokens: 176,
                evicted_pages: 0,
                namespaces: 1,
                pages_held: 5,
            },
            CacheTotals {
                role: NodeRole::Prefill,
                tenant: "v".into(),
                hits: 0,
                misses: 0,
                evictions: 0,
                prompt_tokens: 0,
                cached_tokens: 0,
                evicted_pages: 0,
                namespaces: 0,
                pages_held: 7,
            },
        ]
    );
}

/// Routine counts, page-tag filters, paging and the incidents series.
async fn issue_19(store: &Store) {
    // Routine events are counted per kind, with the latest; others are not counted as routine.
    for (kind, routine, at) in [
        (IntegrityKind::StaleMessage, true, 5_000),
        (IntegrityKind::StaleMessage, true, 7_000),
        (IntegrityKind::DeferredReleaseDrained, true, 6_000),
        (IntegrityKind::StaleMessage, false, 9_000),
    ] {
        store
            .insert_integrity(&NewIntegrityEvent {
                kind,
                node: "decode-9".into(),
                request_id: None,
                tenant: None,
                page: None,
                generation: None,
                details: String::new(),
                routine,
                at: UnixMs(at),
            })
            .await
            .unwrap();
    }
    let routine: Vec<(IntegrityKind, i64, i64)> = store
        .routine_counts()
        .await
        .unwrap()
        .iter()
        .map(|c| (c.kind, c.count, c.last_at.0))
        .collect();
    assert_eq!(
        routine,
        vec![
            (IntegrityKind::DeferredReleaseDrained, 1, 6_000),
            (IntegrityKind::StaleMessage, 2, 7_000),
        ]
    );

    // Page tags: incidents on page 5 of decode-p, one of them at another generation, one on
    // page 5 of another node.
    let tagged = |node: &str, page: i64, generation: i64, at: i64| NewIncident {
        node: Some(node.into()),
        page: Some(page),
        generation: Some(generation),
        tenant: Some("t-page".into()),
        ..incident(
            IncidentKind::Integrity(IntegrityKind::GenerationMismatch),
            "t-page",
            at,
        )
    };
    let mut ids = Vec::new();
    for (node, page, generation, at) in [
        ("decode-p", 5, 1, 1_000_000),
        ("decode-p", 5, 2, 1_000_100),
        ("decode-p", 6, 1, 1_000_200),
        ("decode-q", 5, 1, 1_000_300),
        ("decode-p", 5, 2, 1_000_400),
    ] {
        ids.push(
            store
                .insert_incident(&tagged(node, page, generation, at))
                .await
                .unwrap(),
        );
    }
    let on = |node: Option<&str>, page: i64, generation: Option<i64>| IncidentFilter {
        node: node.map(str::to_string),
        page: Some(page),
        generation,
        ..Default::default()
    };
    let list = |f: IncidentFilter| async move {
        store
            .incidents(&f, Window::default())
            .await
            .unwrap()
            .iter()
            .map(|i| i.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        list(on(Some("decode-p"), 5, None)).await,
        vec![ids[4], ids[1], ids[0]]
    );
    assert_eq!(
        list(on(Some("decode-p"), 5, Some(2))).await,
        vec![ids[4], ids[1]]
    );
    assert_eq!(
        list(on(None, 5, None)).await.len(),
        4,
        "page 5 of every node"
    );
    let read = store.incident(ids[2]).await.unwrap().unwrap();
    assert_eq!((read.page, read.generation), (Some(6), Some(1)));

    // Paging: windows of 2 over the 5 tagged incidents, newest first, with the total.
    let f = IncidentFilter {
        tenant: Some("t-page".into()),
        ..Default::default()
    };
    assert_eq!(store.incident_total(&f).await.unwrap(), 5);
    let mut seen = Vec::new();
    for offset in [0, 2, 4, 6] {
        let w = Window { limit: 2, offset };
        let page = store.incidents(&f, w).await.unwrap();
        assert!(page.len() <= 2);
        seen.extend(page.iter().map(|i| i.id));
    }
    let mut want = ids.clone();
    want.reverse();
    assert_eq!(
        seen, want,
        "every incident once, newest first, then nothing"
    );

    // Incidents over time, per severity.
    let series = store
        .incident_series(UnixMs(1_000_000), 1_000)
        .await
        .unwrap();
    let got: Vec<(i64, Severity, i64)> = series
        .iter()
        .map(|p| (p.bucket.0, p.severity, p.count))
        .collect();
    assert_eq!(got, vec![(1_000_000, Severity::Critical, 5)]);
}

/// Migration 2 copies the page tag of incidents opened before it out of their details JSON
/// (SQLite reads the JSON, PostgreSQL matches a pattern: both are checked here).
async fn migration_2_backfills_page_tags(url: &str) {
    let old = Store::connect_through(url, 1).await.unwrap();
    old.execute_raw(
        r#"INSERT INTO incidents (kind, severity, status, details, created_at) VALUES
           ('generation_mismatch', 'critical', 'open',
            '{"details":"[decode] \"page\":7","event_id":3,"generation":9,"page":42,"source":"integrity_event"}', 5),
           ('quarantine', 'warning', 'open',
            '{"details":"","event_id":4,"generation":null,"page":null,"source":"integrity_event"}', 6),
           ('probe_latency', 'warning', 'open', '{"page":3,"source":"probe"}', 7),
           ('probe_latency', 'warning', 'open', 'not json "page":5,', 8)"#,
    )
    .await
    .unwrap();
    old.close().await;
    let new = Store::connect(url).await.unwrap();
    let all = new
        .incidents(&IncidentFilter::default(), Window::default())
        .await
        .unwrap();
    let tags: Vec<(i64, Option<i64>, Option<i64>)> = all
        .iter()
        .map(|i| (i.created_at.0, i.page, i.generation))
        .collect();
    assert_eq!(
        tags,
        vec![
            (8, None, None),
            (7, None, None),
            (6, None, None),
            (5, Some(42), Some(9))
        ]
    );
    new.close().await;
}

#[tokio::test]
async fn migration_2_backfills_page_tags_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    migration_2_backfills_page_tags(&format!(
        "sqlite://{}/m.sqlite?mode=rwc",
        dir.path().display()
    ))
    .await;
}

#[tokio::test]
async fn store_suite_on_sqlite_memory() {
    let store = Store::connect("sqlite::memory:").await.unwrap();
    assert_eq!(store.backend(), Backend::Sqlite);
    suite(store).await;
}

#[tokio::test]
async fn store_suite_on_sqlite_file_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/a.sqlite?mode=rwc", dir.path().display());
    suite(Store::connect(&url).await.unwrap()).await;
    // Migrations are idempotent and data persists.
    let again = Store::connect(&url).await.unwrap();
    assert_eq!(again.markers(None).await.unwrap().len(), 3);
    again.close().await;
}

#[tokio::test]
async fn store_suite_on_postgres() {
    let pg = TempPostgres::start();
    let store = Store::connect(&pg.url).await.unwrap();
    assert_eq!(store.backend(), Backend::Postgres);
    store.execute_raw("CREATE DATABASE backfill").await.unwrap();
    let (server, _db) = pg.url.rsplit_once('/').expect("a database in the url");
    let backfill = format!("{server}/backfill");
    migration_2_backfills_page_tags(&backfill).await;
    suite(store).await;
    let again = Store::connect(&pg.url).await.unwrap();
    assert_eq!(again.markers(None).await.unwrap().len(), 3);
    again.close().await;
    drop(pg);
}
