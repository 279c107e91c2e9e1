//! Sealed transfer frames over real TCP (I11 without TLS on the stream): a sender holding the
//! grant's seal writes and commits; a sender without it, one whose seal came from another
//! master, and a byte-exact replay of a genuine sealed stream on a new connection are all
//! refused before any of their frames reaches the pool, and counted.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{manifest_for, owner, page_data, pool, reqs_for, LAYOUT, WAIT};
use pagewarden_kvcache::KvPool;
use pagewarden_testkit::eventually;
use pagewarden_transfer::{
    BatchStatus, EngineConfig, GrantSeal, ListenOptions, PageSink, SealMaster, SealMode,
    SealPolicy, TcpBackend, TransferBackend,
};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn sealed_decode(
    pool: &KvPool,
    mode: SealMode,
    master: &SealMaster,
) -> (TcpBackend, pagewarden_transfer::SegmentDesc) {
    let opts = ListenOptions {
        seal: Some(SealPolicy {
            mode,
            master: master.clone(),
        }),
        ..ListenOptions::default()
    };
    let b = TcpBackend::with_security(
        EngineConfig::default(),
        "127.0.0.1:0".parse().unwrap(),
        opts,
        None,
    );
    let desc = b
        .register_segment(Arc::new(pool.clone()) as Arc<dyn PageSink>)
        .await
        .unwrap();
    (b, desc)
}

fn sender() -> TcpBackend {
    TcpBackend::new(EngineConfig::default(), "127.0.0.1:0".parse().unwrap())
}

/// A TCP proxy to `upstream` that keeps a copy of every byte its client sent.
async fn recording_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let tape = Arc::new(Mutex::new(Vec::new()));
    let t = tape.clone();
    tokio::spawn(async move {
        let (client, _) = l.accept().await.unwrap();
        let server = TcpStream::connect(upstream).await.unwrap();
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut sr, &mut cw).await;
        });
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = cr.read(&mut buf).await {
            if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
            t.lock().extend_from_slice(&buf[..n]);
        }
    });
    (addr, tape)
}

#[tokio::test]
async fn only_the_grants_seal_writes_and_a_replayed_stream_is_refused() {
    for mode in [SealMode::Mac, SealMode::Aead] {
        let pool = pool(16);
        let master = SealMaster::random();
        let (decode, desc) = sealed_decode(&pool, mode, &master).await;
        let addr: SocketAddr = desc.addr.parse().unwrap();

        // The grant's seal, through a proxy that records the stream: every page lands.
        let (proxy, tape) = recording_proxy(addr).await;
        let prefill = sender();
        let via_proxy = pagewarden_transfer::SegmentDesc {
            addr: proxy.to_string(),
        };
        let seg = prefill.open_sealed_segment(&via_proxy).await.unwrap();
        let res = pool.reserve(owner(1), 10).unwrap();
        let g = res.grant().clone();
        prefill
            .seal_grant(seg, g.key, master.grant(mode, g.key))
            .unwrap();
        let reqs = reqs_for(&g, 1, LAYOUT.page_bytes());
        let h = prefill.submit_batch(seg, g.key, reqs.clone()).unwrap();
        assert_eq!(
            h.wait().await,
            BatchStatus::Completed { pages: 3 },
            "{mode}"
        );
        let landed = decode.receiver_counters().snapshot();
        assert_eq!(landed.frames_ok, 3);
        // Under AEAD the page bytes crossed the wire encrypted, under MAC in clear.
        let page0 = page_data(1, 0, LAYOUT.page_bytes());
        let in_clear = tape.lock().windows(page0.len()).any(|w| w == page0);
        assert_eq!(
            in_clear,
            mode == SealMode::Mac,
            "{mode}: page bytes in clear"
        );

        // The recorded bytes replayed on a new connection: its challenge differs, so the first
        // frame fails its seal and the connection closes. Without the check, the replayed
        // WRITEs would reach the pool (and be dropped there as duplicates).
        let recorded = tape.lock().clone();
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(&recorded).await;
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
        eventually(WAIT, "the replay closed as malformed", || async {
            decode.receiver_counters().snapshot().malformed_closes == 1
        })
        .await;

        // A sender without the seal, and one with a seal from another master.
        let plain = sender();
        let seg2 = plain.open_sealed_segment(&desc).await.unwrap();
        let res2 = pool.reserve(owner(2), 4).unwrap();
        let g2 = res2.grant().clone();
        let h = plain
            .submit_batch(seg2, g2.key, reqs_for(&g2, 2, LAYOUT.page_bytes()))
            .unwrap();
        assert!(matches!(h.wait().await, BatchStatus::Failed(_)), "{mode}");
        let forger = sender();
        let seg3 = forger.open_sealed_segment(&desc).await.unwrap();
        let forged = SealMaster::random().grant(mode, g2.key);
        forger.seal_grant(seg3, g2.key, forged).unwrap();
        let h = forger
            .submit_batch(seg3, g2.key, reqs_for(&g2, 3, LAYOUT.page_bytes()))
            .unwrap();
        assert!(matches!(h.wait().await, BatchStatus::Failed(_)), "{mode}");

        let c = decode.receiver_counters().snapshot();
        assert_eq!(c.malformed_closes, 3, "{mode}: {c:?}");
        assert_eq!(c.frames_ok, 3, "{mode}: only the genuine pages landed");
        assert_eq!(
            c.dropped_total(),
            0,
            "{mode}: nothing refused reached the pool"
        );

        // The genuine grant still drains and commits with its bytes.
        prefill.drain(seg, g.key).await.unwrap();
        let readable = res.commit(&manifest_for(&g, &reqs)).expect("commit");
        assert_eq!(readable.page_bytes(0).unwrap(), page0.as_slice());
        drop(readable);
        assert!(res2
            .commit(&manifest_for(&g2, &reqs_for(&g2, 2, LAYOUT.page_bytes())))
            .is_err());
    }
}

#[tokio::test]
async fn a_sealed_grant_towards_a_listener_that_does_not_seal_fails_clearly() {
    let pool = pool(4);
    let b = sender();
    let desc = b
        .register_segment(Arc::new(pool.clone()) as Arc<dyn PageSink>)
        .await
        .unwrap();
    let seg = b.open_sealed_segment(&desc).await.unwrap();
    let res = pool.reserve(owner(1), 4).unwrap();
    let g = res.grant().clone();
    b.seal_grant(seg, g.key, GrantSeal::new(SealMode::Aead, [7; 32]))
        .unwrap();
    let h = b
        .submit_batch(seg, g.key, reqs_for(&g, 1, LAYOUT.page_bytes()))
        .unwrap();
    match h.wait().await {
        BatchStatus::Failed(f) => assert!(format!("{f:?}").contains("no seal challenge"), "{f:?}"),
        other => panic!("{other:?}"),
    }
}
