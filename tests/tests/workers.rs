//! Decode and prefill workers started as real processes on 127.0.0.1, driven over gRPC the way
//! the router drives them. Stated bound for clean-up after an abort or a killed prefill:
//! decode's pool is all free, or its remaining pages quarantined and counted, within
//! `CLEANUP_BOUND` (drain timeout 500 ms + grant/sweep ticks + slack).

use std::time::Duration;

use pagewarden_common::reject_reason::RejectReason;
use pagewarden_proto::convert::reject_reason;
use pagewarden_proto::v1 as pb;
use pagewarden_system_tests::driver::{fresh_ref, greedy, Driver};
use pagewarden_system_tests::{reference, start_decode, start_prefill, ModelArg, Service};
use pagewarden_testkit::{eventually, poll_until, Polling};

const CLEANUP_BOUND: Duration = Duration::from_secs(5);
const TINY: ModelArg = ModelArg::Tiny(7);

fn series(name: &str, role: &str, label: &str, value: &str) -> String {
    format!("pagewarden_{name}{{role=\"{role}\",{label}=\"{value}\"}}")
}

async fn pool_pages(s: &Service, role: &str, state: &str) -> f64 {
    s.metric(&series("pool_pages", role, "state", state)).await
}

/// Waits until decode holds no pages in use or draining; returns (free, quarantined).
async fn wait_pool_settled(decode: &Service, total: f64) -> (f64, f64) {
    let (free, quarantined) = eventually(CLEANUP_BOUND, "a settled decode pool", || async {
        let used = pool_pages(decode, "decode", "used").await;
        let draining = pool_pages(decode, "decode", "draining").await;
        let free = pool_pages(decode, "decode", "free").await;
        let quarantined = pool_pages(decode, "decode", "quarantined").await;
        if used == 0.0 && draining == 0.0 {
            Ok((free, quarantined))
        } else {
            Err(format!("used {used}, draining {draining}"))
        }
    })
    .await;
    assert_eq!(
        free + quarantined,
        total,
        "pages lost: free {free} + quarantined {quarantined} != {total}"
    );
    (free, quarantined)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_prompts_match_the_single_process_engine() {
    let model = ModelArg::Real;
    let decode = start_decode(&model, &["--pool-tokens", "16384"]);
    let prefill = start_prefill(&model, &["--pool-tokens", "16384"]);
    let mut d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(pagewarden_system_tests::reference_path()).unwrap(),
    )
    .unwrap();
    let engine = reference::engine(reference::load(&model));
    let cases = reference["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    for case in cases {
        let prompt: Vec<u32> = case["prompt_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let want = reference::greedy(&engine, &prompt, 24);
        let got = d
            .complete("tenant-a", &prompt, greedy(24))
            .await
            .expect("completion");
        assert_eq!(got.tokens, want.tokens, "prompt {:?}", case["prompt"]);
        assert_eq!(got.text, want.text, "prompt {:?}", case["prompt"]);
        assert_eq!(got.finish, pb::FinishReason::from(Some(want.finish_reason)));
    }
    let info = d.decode_info().await;
    assert_eq!(
        info.free_pages, info.total_pages,
        "every page back on decode's free list"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_length_requests_are_rejected_before_any_allocation() {
    let decode = start_decode(&TINY, &[]);
    let prefill = start_prefill(&TINY, &[]);
    let mut d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let info = d.decode_info().await;
    let context = info.context_length;
    assert_eq!(context, 256, "tiny model context");
    let page = info.page_size;
    let mut lengths = vec![context - 1, context, context + 1];
    lengths.extend((1..=16).map(|k| context + k * page));
    let mut rejected = 0.0;
    for prompt_len in lengths {
        let prompt: Vec<u32> = (0..prompt_len).map(|i| 20 + i % 200).collect();
        let max_tokens = 1;
        let fits = prompt_len + max_tokens <= context;
        let req = fresh_ref();
        let grant = d.reserve(&req, "tenant-a", &prompt, max_tokens).await;
        if fits {
            let grant = grant.expect("a request that fits is reserved");
            let reply = d
                .prefill(&req, "tenant-a", &prompt, grant, greedy(max_tokens))
                .await
                .expect("prefill");
            let out = d.generate(&req, reply).await.expect("generate");
            assert!(out.tokens.len() <= 1);
            continue;
        }
        let err = grant.expect_err("over-length reserve must be rejected");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            reject_reason(&err),
            Some(RejectReason::ContextLengthExceeded)
        );
        // Prefill re-checks admission even with a (bogus) grant: rejected before any allocation.
        let bogus = pb::WriteGrant {
            key: vec![0; 16],
            tenant: "tenant-a".into(),
            pages: vec![],
            tokens: prompt_len,
            page_size: page,
            expires_unix_ms: 0,
            transfer_addr: decode.addrs["transfer"].clone(),
            ..Default::default()
        };
        let err = d
            .prefill(&req, "tenant-a", &prompt, bogus, greedy(max_tokens))
            .await
            .expect_err("prefill rejects");
        assert_eq!(
            reject_reason(&err),
            Some(RejectReason::ContextLengthExceeded)
        );
        rejected += 1.0;
        let di = d.decode_info().await;
        let pi = d.prefill_info().await;
        assert_eq!(
            di.free_pages, di.total_pages,
            "decode reserved pages for a rejected request"
        );
        assert_eq!(
            pi.free_pages, pi.total_pages,
            "prefill allocated pages for a rejected request"
        );
    }
    assert!(rejected >= 17.0);
    let key = series(
        "rejections_total",
        "decode",
        "reason",
        "context_length_exceeded",
    );
    assert_eq!(decode.metric(&key).await, rejected);
    let key = series(
        "rejections_total",
        "prefill",
        "reason",
        "context_length_exceeded",
    );
    assert_eq!(prefill.metric(&key).await, rejected);
    // No page bytes moved for the rejected ones: only the one fitting request (context - 1
    // tokens) transferred its pages.
    let bytes = decode
        .metric("pagewarden_transfer_bytes_total{role=\"decode\"}")
        .await;
    let layout = reference::load(&TINY).kv_layout(page as usize);
    let fitting_pages = (context - 1).div_ceil(page) as usize;
    assert_eq!(bytes, (fitting_pages * layout.page_bytes()) as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_smaller_than_the_context_refuses_to_start_or_lowers_the_context() {
    let args = pagewarden_system_tests::worker_args(&TINY, &["--pool-tokens", "128"]);
    let err = Service::try_start("pagewarden-decode", &args)
        .err()
        .expect("preflight must refuse");
    assert!(
        err.contains("128") && err.contains("256"),
        "message names both numbers: {err}"
    );
    let decode = start_decode(&TINY, &["--pool-tokens", "128", "--lower-context-to-fit"]);
    let prefill = start_prefill(&TINY, &[]);
    let mut d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let info = d.decode_info().await;
    assert_eq!((info.context_length, info.pool_tokens), (128, 128));
    // Under the model's context (256) but over the pool: rejected, nothing reserved.
    let err = d
        .reserve(&fresh_ref(), "t", &[30; 100], 40)
        .await
        .expect_err("over the pool");
    assert_eq!(
        reject_reason(&err),
        Some(RejectReason::ContextLengthExceeded)
    );
    assert_eq!(d.decode_info().await.free_pages, info.total_pages);
    assert!(d.complete("t", &[30, 31, 32], greedy(8)).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_mid_transfer_and_client_disconnect_free_every_page() {
    let decode = start_decode(&TINY, &["--drain-timeout", "500ms"]);
    let prefill = start_prefill(&TINY, &["--batch-pages", "1"]);
    let mut d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let total = d.decode_info().await.total_pages as f64;
    let prompt: Vec<u32> = (0..250).map(|i| 20 + i % 200).collect();

    // Abort decode's reservation while prefill is running: late writes are fenced, prefill
    // cancels and drains, and the pages come back to the free list (not quarantine).
    for delay_ms in [0u64, 1, 3, 10] {
        let req = fresh_ref();
        let grant = d.reserve(&req, "t", &prompt, 4).await.expect("reserve");
        let mut p = d.clone();
        let (r2, pr) = (req.clone(), prompt.clone());
        let call = tokio::spawn(async move { p.prefill(&r2, "t", &pr, grant, greedy(4)).await });
        // Real time on purpose: each delay aborts the prefill at a different point of its run.
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        assert!(d.abort_decode(&req).await, "reservation found");
        assert!(!d.abort_decode(&req).await, "abort is idempotent");
        let result = call.await.unwrap();
        if let Ok(reply) = result {
            // Prefill finished before the abort: decode must refuse the commit now.
            assert!(d.generate(&req, reply).await.is_err());
        }
        let (_free, quarantined) = wait_pool_settled(&decode, total).await;
        assert_eq!(
            quarantined, 0.0,
            "prefill drained, so nothing is quarantined"
        );
    }

    // A client that drops its token stream mid-generation: decode aborts that request.
    let req = fresh_ref();
    let prompt5 = [40, 41, 42, 43, 44];
    let grant = d.reserve(&req, "t", &prompt5, 200).await.expect("reserve");
    let reply = d
        .prefill(&req, "t", &prompt5, grant, greedy(200))
        .await
        .expect("prefill");
    let mut stream = d
        .decode
        .generate(pb::GenerateRequest {
            req: Some(req.clone()),
            manifest: reply.manifest,
            first_token: reply.first_token,
            first_logprobs: None,
        })
        .await
        .expect("generate")
        .into_inner();
    let first = stream
        .message()
        .await
        .expect("stream")
        .expect("first event");
    assert_eq!(first.token, reply.first_token);
    drop(stream);
    let (free, _) = wait_pool_settled(&decode, total).await;
    assert_eq!(free, total);
    // The suite is still healthy afterwards.
    assert!(d.complete("t", &prompt5, greedy(4)).await.is_ok());
}

type PrefillCall = tokio::task::JoinHandle<Result<pb::PrefillReply, tonic::Status>>;

/// Job B queued behind a stuck job A on a prefill with one permit: A's grant (from a second
/// decode, so the first one's pool only ever holds B) points at a listener that accepts the
/// connection but never acknowledges a drain, so A holds the permit in its transfer and B has
/// not connected to decode.
struct QueuedBehindStuckJob {
    decode: Service,
    prefill: Service,
    d: Driver,
    total: f64,
    req_b: pb::RequestRef,
    call_a: PrefillCall,
    call_b: PrefillCall,
    _other_decode: Service,
    _black_hole: std::net::TcpListener,
    _stuck: std::net::TcpStream,
}

async fn queue_behind_stuck_job() -> QueuedBehindStuckJob {
    let decode = start_decode(&TINY, &["--drain-timeout", "500ms"]);
    let prefill = start_prefill(&TINY, &["--max-concurrency", "1"]);
    let mut d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let total = d.decode_info().await.total_pages as f64;
    let prompt: Vec<u32> = (0..40).map(|i| 20 + i).collect();
    let other_decode = start_decode(&TINY, &[]);
    let mut d2 = Driver::connect(&other_decode.grpc_url(), &prefill.grpc_url()).await;
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let req_a = fresh_ref();
    let mut grant_a = d2
        .reserve(&req_a, "t", &prompt, 4)
        .await
        .expect("reserve A");
    grant_a.transfer_addr = black_hole.local_addr().unwrap().to_string();
    let (mut pa, pra) = (d2.clone(), prompt.clone());
    let call_a =
        tokio::spawn(async move { pa.prefill(&req_a, "t", &pra, grant_a, greedy(4)).await });
    // A connects to the black hole in its transfer, holding the permit; the connection is kept
    // open and never answered.
    black_hole.set_nonblocking(true).expect("nonblocking");
    let stuck = eventually(Duration::from_secs(10), "A's transfer connection", || {
        let accepted = black_hole.accept().ok().map(|(conn, _)| conn);
        async move { accepted }
    })
    .await;
    let req_b = fresh_ref();
    let grant_b = d.reserve(&req_b, "t", &prompt, 4).await.expect("reserve B");
    let (mut pb_, rb) = (d.clone(), req_b.clone());
    let call_b =
        tokio::spawn(async move { pb_.prefill(&rb, "t", &prompt, grant_b, greedy(4)).await });
    eventually(Duration::from_secs(10), "B in prefill's queue", || {
        let mut d = d.clone();
        async move { d.prefill_info().await.queue_depth == 1 }
    })
    .await;
    assert!(
        !call_b.is_finished(),
        "B must still be waiting for the permit"
    );
    QueuedBehindStuckJob {
        decode,
        prefill,
        d,
        total,
        req_b,
        call_a,
        call_b,
        _other_decode: other_decode,
        _black_hole: black_hole,
        _stuck: stuck,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_cancelled_before_its_transfer_frees_decode_pages_without_quarantine() {
    let mut q = queue_behind_stuck_job().await;
    // The router gives up on B before it sent anything: decode revokes B's grant and
    // prefill's call is dropped. Prefill must still end the grant (cancel + drain), so decode
    // frees B's pages instead of quarantining them.
    assert!(q.d.abort_decode(&q.req_b).await, "B's reservation found");
    q.call_b.abort();
    q.call_a.abort();

    let (free, quarantined) = wait_pool_settled(&q.decode, q.total).await;
    assert_eq!(
        (free, quarantined),
        (q.total, 0.0),
        "a grant never written to must be drained, not left to time out into quarantine"
    );
    // Both jobs end although their calls were dropped: B at once, A once its unacknowledged
    // cancel times out and its connection is dropped. Each is counted, and none stays active.
    let active = "pagewarden_active_requests{role=\"prefill\"}";
    let aborted = series("requests_total", "prefill", "outcome", "aborted");
    eventually(
        Duration::from_secs(15),
        "both prefill jobs to end",
        || async {
            let (n_active, n_aborted) = (
                q.prefill.metric(active).await,
                q.prefill.metric(&aborted).await,
            );
            if n_active == 0.0 && n_aborted == 2.0 {
                Ok(())
            } else {
                Err(format!("active {n_active}, aborted {n_aborted}"))
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_killed_before_it_connects_leaves_no_quarantine_behind() {
    let mut q = queue_behind_stuck_job().await;
    // Prefill dies with B never having connected; the router gives up on B at decode. No peer
    // connection exists to be torn down, so only the fence itself can free B's pages.
    q.prefill.kill();
    assert!(q.call_b.await.unwrap().is_err(), "B's prefill died");
    assert!(q.d.abort_decode(&q.req_b).await, "B's reservation found");
    let _ = q.call_a.await;
    // A grant left to time out would show as draining until its drain timeout quarantines it:
    // waiting for the pool to settle waits that out.
    let (free, quarantined) = wait_pool_settled(&q.decode, q.total).await;
    assert_eq!(
        (free, quarantined),
        (q.total, 0.0),
        "a revoked grant that no peer ever wrote to is free, not quarantined for good"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_killed_mid_transfer_leaves_decode_clean() {
    let decode = start_decode(&TINY, &["--drain-timeout", "500ms", "--grant-ttl", "2s"]);
    let mut prefill = start_prefill(&TINY, &["--batch-pages", "1"]);
    let mut d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let total = d.decode_info().await.total_pages as f64;
    let prompt: Vec<u32> = (0..250).map(|i| 20 + i % 200).collect();
    let req = fresh_ref();
    let grant = d.reserve(&req, "t", &prompt, 4).await.expect("reserve");
    let mut p = d.clone();
    let (r2, pr) = (req.clone(), prompt.clone());
    let call = tokio::spawn(async move { p.prefill(&r2, "t", &pr, grant, greedy(4)).await });
    // Kill as soon as decode has received page bytes (or right away if the call is done).
    let pace = Polling::within(Duration::from_secs(10)).every(Duration::from_millis(1));
    poll_until(pace, || async {
        call.is_finished()
            || decode
                .metric("pagewarden_transfer_bytes_total{role=\"decode\"}")
                .await
                > 0.0
    })
    .await;
    prefill.kill();
    let _ = call.await.unwrap();
    // The router cancels the other half (I6); without that, the grant expiry does it.
    let _ = d.abort_decode(&req).await;
    let (free, quarantined) = wait_pool_settled(&decode, total).await;
    if quarantined > 0.0 {
        let counted = decode
            .metric(&series(
                "deferred_releases_total",
                "decode",
                "outcome",
                "quarantined",
            ))
            .await;
        assert_eq!(counted, quarantined, "quarantined pages are counted");
    }
    assert_eq!(free + quarantined, total);
    // A fresh prefill worker serves the same decode worker.
    let prefill2 = start_prefill(&TINY, &[]);
    let mut d2 = Driver::connect(&decode.grpc_url(), &prefill2.grpc_url()).await;
    assert!(d2.complete("t", &[50, 51, 52], greedy(4)).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_prefill_and_two_decode_workers_serve_concurrent_clients() {
    let decodes = [start_decode(&TINY, &[]), start_decode(&TINY, &[])];
    let prefills = [start_prefill(&TINY, &[]), start_prefill(&TINY, &[])];
    let engine = reference::engine(reference::load(&TINY));
    let mut tasks = Vec::new();
    for i in 0..8usize {
        let mut d = Driver::connect(
            &decodes[i % 2].grpc_url(),
            &prefills[(i / 2) % 2].grpc_url(),
        )
        .await;
        let prompt: Vec<u32> = (0..(10 + 7 * i as u32))
            .map(|j| 20 + (j * 13 + i as u32) % 200)
            .collect();
        let want = reference::greedy(&engine, &prompt, 16);
        tasks.push(tokio::spawn(async move {
            let got = d
                .complete(&format!("tenant-{i}"), &prompt, greedy(16))
                .await
                .expect("completion");
            assert_eq!(got.tokens, want.tokens, "client {i}");
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    for dec in &decodes {
        let total = dec
            .metric(&series("pool_pages", "decode", "state", "free"))
            .await
            + pool_pages(dec, "decode", "used").await;
        let (free, q) = wait_pool_settled(dec, total).await;
        assert_eq!((free, q), (total, 0.0));
    }
}
