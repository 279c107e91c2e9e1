//! End to end over TCP loopback into a real `KvPool`: write, commit, read; fenced frames
//! dropped without closing the connection; drain and peer-gone release; limits; failures.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{manifest_for, owner, page_data, pool, reqs_for, LAYOUT, WAIT};
use pagewarden_kvcache::{KvPool, WriteError};
use pagewarden_testkit::eventually;
use pagewarden_transfer::{
    BatchFailure, BatchStatus, EngineConfig, PageSink, TcpBackend, TransferBackend, TransferError,
};

fn backend() -> TcpBackend {
    TcpBackend::new(EngineConfig::default(), "127.0.0.1:0".parse().unwrap())
}

#[tokio::test]
async fn pages_land_in_a_reservation_and_commit() {
    let pool = pool(8);
    let decode = backend();
    let desc = decode
        .register_segment(Arc::new(pool.clone()) as Arc<dyn PageSink>)
        .await
        .unwrap();
    let prefill = backend();
    let seg = prefill.open_segment(&desc).await.unwrap();

    let res = pool.reserve(owner(1), 10).unwrap();
    let g = res.grant().clone();
    assert_eq!(g.pages.len(), 3);
    let reqs = reqs_for(&g, 1, LAYOUT.page_bytes());
    let manifest = manifest_for(&g, &reqs);
    // Two batches: the engine keeps their order on the connection.
    let h1 = prefill
        .submit_batch(seg, g.key, reqs[..2].to_vec())
        .unwrap();
    let h2 = prefill
        .submit_batch(seg, g.key, reqs[2..].to_vec())
        .unwrap();
    assert_eq!(h1.wait().await, BatchStatus::Completed { pages: 2 });
    let s2 = h2.wait().await;
    assert_eq!(s2, BatchStatus::Completed { pages: 1 });
    prefill.drain(seg, g.key).await.unwrap();

    let readable = res.commit(&manifest).expect("commit");
    for i in 0..3 {
        assert_eq!(
            readable.page_bytes(i).unwrap(),
            page_data(1, i, LAYOUT.page_bytes()).as_slice()
        );
    }
    let c = decode.receiver_counters().snapshot();
    assert_eq!(c.frames_ok, 3);
    assert_eq!(c.bytes_ok, 3 * LAYOUT.page_bytes() as u64);
    assert_eq!(c.dropped_total(), 0);
    assert_eq!(c.drains, 1);
}

#[tokio::test]
async fn revoked_and_unknown_grants_are_dropped_and_the_connection_survives() {
    let pool = pool(8);
    let decode = backend();
    let desc = decode
        .register_segment(Arc::new(pool.clone()) as Arc<dyn PageSink>)
        .await
        .unwrap();
    let prefill = backend();
    let seg = prefill.open_segment(&desc).await.unwrap();

    let a = pool.reserve(owner(1), 8).unwrap();
    let ga = a.grant().clone();
    a.abort();
    let st = prefill
        .submit_batch(seg, ga.key, reqs_for(&ga, 1, LAYOUT.page_bytes()))
        .unwrap()
        .wait()
        .await;
    assert_eq!(
        st,
        BatchStatus::Failed(BatchFailure::Rejected {
            written: 0,
            rejected: 2,
            first: Some(WriteError::RevokedGrant)
        })
    );
    let unknown = pagewarden_kvcache::GrantKey([9; 16]);
    let st = prefill
        .submit_batch(seg, unknown, reqs_for(&ga, 1, LAYOUT.page_bytes()))
        .unwrap()
        .wait()
        .await;
    assert!(matches!(
        st,
        BatchStatus::Failed(BatchFailure::Rejected {
            first: Some(WriteError::UnknownGrant),
            ..
        })
    ));

    // Same connection, a live grant: still works.
    let b = pool.reserve(owner(2), 4).unwrap();
    let gb = b.grant().clone();
    let reqs = reqs_for(&gb, 2, LAYOUT.page_bytes());
    let st = prefill
        .submit_batch(seg, gb.key, reqs.clone())
        .unwrap()
        .wait()
        .await;
    assert_eq!(st, BatchStatus::Completed { pages: 1 });
    b.commit(&manifest_for(&gb, &reqs))
        .expect("commit after dropped frames");

    let c = decode.receiver_counters().snapshot();
    assert_eq!(c.dropped_for(WriteError::RevokedGrant), 2);
    assert_eq!(c.dropped_for(WriteError::UnknownGrant), 2);
    assert_eq!(c.malformed_closes, 0);
}

#[tokio::test]
async fn cancel_drains_an_aborted_grant_back_to_the_free_list() {
    let pool = pool(4);
    let decode = backend();
    let desc = decode
        .register_segment(Arc::new(pool.clone()) as Arc<dyn PageSink>)
        .await
        .unwrap();
    let prefill = backend();
    let seg = prefill.open_segment(&desc).await.unwrap();
    let res = pool.reserve(owner(1), 16).unwrap();
    let g = res.grant().clone();
    let h = prefill
        .submit_batch(
            seg,
            g.key,
            reqs_for(&g, 1, LAYOUT.page_bytes())[..2].to_vec(),
        )
        .unwrap();
    res.abort();
    assert_eq!(pool.stats().draining, 4, "aborted pages wait for the drain");
    prefill.cancel(seg, g.key).await.unwrap();
    // The batch ended one way or the other, and the drain freed every page.
    assert!(h.wait().await.is_done());
    assert_eq!(pool.stats().free, 4);
    assert_eq!(pool.stats().draining, 0);
}

#[tokio::test]
async fn a_torn_down_connection_releases_what_it_never_drained() {
    let pool: KvPool = pool(4);
    let decode = backend();
    let desc = decode
        .register_segment(Arc::new(pool.clone()) as Arc<dyn PageSink>)
        .await
        .unwrap();
    let prefill = backend();
    let seg = prefill.open_segment(&desc).await.unwrap();
    let res = pool.reserve(owner(1), 8).unwrap();
    let g = res.grant().clone();
    let st = prefill
        .submit_batch(
            seg,
            g.key,
            reqs_for(&g, 1, LAYOUT.page_bytes())[..1].to_vec(),
        )
        .unwrap()
        .wait()
        .await;
    assert_eq!(st, BatchStatus::Completed { pages: 1 });
    res.abort();
    assert_eq!(pool.stats().draining, 2);
    prefill.close_segment(seg);
    eventually(WAIT, "peer-gone release after teardown", || async {
        pool.stats().free == 4
    })
    .await;
    assert_eq!(decode.receiver_counters().snapshot().peer_gone, 1);
}

#[tokio::test]
async fn batch_caps_are_enforced_at_submit() {
    let pool = pool(8);
    let decode = backend();
    let desc = decode
        .register_segment(Arc::new(pool.clone()) as Arc<dyn PageSink>)
        .await
        .unwrap();
    let cfg = EngineConfig {
        max_inflight_bytes: 2 * LAYOUT.page_bytes(),
        max_batch_pages: 3,
    };
    let prefill = TcpBackend::new(cfg, "127.0.0.1:0".parse().unwrap());
    let seg = prefill.open_segment(&desc).await.unwrap();
    let res = pool.reserve(owner(1), 32).unwrap();
    let g = res.grant().clone();
    let reqs = reqs_for(&g, 1, LAYOUT.page_bytes());
    assert!(matches!(
        prefill.submit_batch(seg, g.key, reqs.clone()),
        Err(TransferError::BatchTooLarge { pages: 8, max: 3 })
    ));
    assert!(matches!(
        prefill.submit_batch(seg, g.key, reqs[..3].to_vec()),
        Err(TransferError::InflightTooLarge { .. })
    ));
    assert!(matches!(
        prefill.submit_batch(seg, g.key, Vec::new()),
        Err(TransferError::EmptyBatch)
    ));
    // Many batches that each fit: the in-flight budget makes them wait, never fail.
    let handles: Vec<_> = reqs
        .chunks(2)
        .map(|c| prefill.submit_batch(seg, g.key, c.to_vec()).unwrap())
        .collect();
    for h in handles {
        assert_eq!(h.wait().await, BatchStatus::Completed { pages: 2 });
    }
    res.commit(&manifest_for(&g, &reqs)).expect("commit");
}

#[tokio::test]
async fn a_dead_receiver_fails_pending_work_and_is_broadcast() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        drop(s); // accept, then hang up
    });
    let prefill = backend();
    let mut failures = prefill.subscribe_failures();
    let seg = prefill
        .open_segment(&pagewarden_transfer::SegmentDesc {
            addr: addr.to_string(),
        })
        .await
        .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), failures.recv())
        .await
        .expect("failure broadcast")
        .unwrap();
    assert_eq!(ev.segment, seg);
    let g = pagewarden_kvcache::GrantKey([1; 16]);
    let req = pagewarden_transfer::PageWriteReq {
        dst_page: pagewarden_kvcache::PageId(0),
        dst_generation: pagewarden_kvcache::Generation(1),
        tokens: 1,
        src: bytes::Bytes::from(vec![0u8; 256]),
    };
    match prefill.submit_batch(seg, g, vec![req]) {
        Err(TransferError::ConnectionLost(_)) => {}
        Ok(h) => assert!(matches!(
            h.wait().await,
            BatchStatus::Failed(BatchFailure::ConnectionLost(_))
        )),
        Err(e) => panic!("unexpected {e}"),
    }
    assert!(prefill.drain(seg, g).await.is_err());
}

// current_thread runtime: the engine's tasks cannot run before `cancel` is first polled, so
// no page has been sent yet when the grant is cancelled.
#[tokio::test(flavor = "current_thread")]
async fn cancel_stops_pages_that_were_not_sent_yet() {
    let pool = pool(4);
    let decode = backend();
    let desc = decode
        .register_segment(Arc::new(pool.clone()) as Arc<dyn PageSink>)
        .await
        .unwrap();
    let prefill = backend();
    let seg = prefill.open_segment(&desc).await.unwrap();
    let res = pool.reserve(owner(1), 16).unwrap();
    let g = res.grant().clone();
    let reqs = reqs_for(&g, 1, LAYOUT.page_bytes());
    let a = prefill
        .submit_batch(seg, g.key, reqs[..2].to_vec())
        .unwrap();
    let b = prefill
        .submit_batch(seg, g.key, reqs[2..].to_vec())
        .unwrap();
    res.abort();
    prefill.cancel(seg, g.key).await.unwrap();
    assert_eq!(a.wait().await, BatchStatus::Cancelled { written: 0 });
    assert_eq!(b.wait().await, BatchStatus::Cancelled { written: 0 });
    let c = decode.receiver_counters().snapshot();
    assert_eq!((c.frames_ok, c.dropped_total(), c.drains), (0, 0, 1));
    assert_eq!(
        pool.stats().free,
        4,
        "the drain freed the aborted grant's pages"
    );
}
