//! The transfer stream under mutual TLS (I11): a prefill certificate's writes land; a forged
//! frame sent in clear, a frame replayed from a recorded stream, and a suite certificate of the
//! wrong role are refused before any page is touched, counted, and handed to the refusal hook
//! (decode reports it to the auditor); the connection cap closes connections beyond it; a
//! flood of unauthenticated connects leaves a prefill its place and makes one report per source.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{manifest_for, owner, page_data, pool, reqs_for, LAYOUT, WAIT};
use pagewarden_common::tls::{
    peer_roles, rustls_client_config, rustls_server_config, write_dev_suite, DevSuite, InternalTls,
    SuiteRole, TlsFlags,
};
use pagewarden_kvcache::{page_checksum, KvPool};
use pagewarden_testkit::{eventually, Polling};
use pagewarden_transfer::frame::{encode, BatchId, Frame, WriteFrame};
use pagewarden_transfer::{
    BatchStatus, ClientTls, EngineConfig, ListenOptions, PageSink, Refused, RefusedReason,
    ServerTls, TcpBackend, TransferBackend,
};
use parking_lot::Mutex;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn material(suite: &DevSuite, role: SuiteRole) -> Arc<pagewarden_common::tls::TlsMaterial> {
    let flags = TlsFlags {
        tls_ca: Some(suite.ca()),
        tls_cert: Some(suite.cert(role)),
        tls_key: Some(suite.key(role)),
    };
    match InternalTls::load(&flags).expect("load TLS") {
        InternalTls::Mutual(m) => m,
        InternalTls::Plaintext => unreachable!("files were given"),
    }
}

fn client(suite: &DevSuite, role: SuiteRole) -> ClientTls {
    ClientTls {
        config: rustls_client_config(&material(suite, role)).unwrap(),
        server_name: ServerName::try_from(SuiteRole::Decode.dns_name()).unwrap(),
    }
}

/// Decode's listener: prefill certificates only; refusals recorded.
fn listener(suite: &DevSuite, refused: Arc<Mutex<Vec<Refused>>>) -> ListenOptions {
    ListenOptions {
        tls: Some(ServerTls {
            config: rustls_server_config(&material(suite, SuiteRole::Decode)).unwrap(),
            authorize: Arc::new(|chain| {
                let roles = chain.first().map(peer_roles).unwrap_or_default();
                if roles.contains(&SuiteRole::Prefill) {
                    Ok(())
                } else {
                    Err(format!("{roles:?}"))
                }
            }),
        }),
        on_refused: Some(Arc::new(move |r: &Refused| refused.lock().push(r.clone()))),
        // Every refusal reported on its own: these tests count them one by one.
        refusal_window: Duration::ZERO,
        ..ListenOptions::default()
    }
}

async fn decode_with(
    pool: &KvPool,
    opts: ListenOptions,
) -> (TcpBackend, pagewarden_transfer::SegmentDesc) {
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

#[tokio::test]
async fn a_prefill_certificate_writes_and_everyone_else_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let suite = write_dev_suite(dir.path()).unwrap();
    let pool = pool(8);
    let refused = Arc::new(Mutex::new(Vec::new()));
    let (decode, desc) = decode_with(&pool, listener(&suite, refused.clone())).await;
    let addr: std::net::SocketAddr = desc.addr.parse().unwrap();

    // A prefill certificate: every page lands and commits.
    let prefill = TcpBackend::with_security(
        EngineConfig::default(),
        "127.0.0.1:0".parse().unwrap(),
        ListenOptions::default(),
        Some(client(&suite, SuiteRole::Prefill)),
    );
    let seg = prefill.open_segment(&desc).await.unwrap();
    let res = pool.reserve(owner(1), 10).unwrap();
    let g = res.grant().clone();
    let reqs = reqs_for(&g, 1, LAYOUT.page_bytes());
    let manifest = manifest_for(&g, &reqs);
    let h = prefill.submit_batch(seg, g.key, reqs.clone()).unwrap();
    assert_eq!(h.wait().await, BatchStatus::Completed { pages: 3 });
    prefill.drain(seg, g.key).await.unwrap();
    let readable = res.commit(&manifest).expect("commit over TLS");
    assert_eq!(
        readable.page_bytes(0).unwrap(),
        page_data(1, 0, LAYOUT.page_bytes()).as_slice()
    );
    drop(readable);

    // A forged WRITE in clear, for a live grant: refused at the handshake, nothing lands.
    let res = pool.reserve(owner(2), 4).unwrap();
    let g = res.grant().clone();
    let data = vec![0x5A; LAYOUT.page_bytes()];
    let mut forged = Vec::new();
    encode(
        &mut forged,
        &Frame::Write(WriteFrame {
            key: g.key,
            batch: BatchId(1),
            page: g.pages[0].0,
            generation: g.pages[0].1,
            tokens: 4,
            checksum: page_checksum(&data),
            data: &data,
        }),
    );
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(&forged).await;
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut sink)).await;
    // Replaying the bytes a real prefill sent is no better: a recorded TLS stream is not a
    // handshake for a new connection.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let replay: Vec<u8> = [&[0x16u8, 3, 3, 0, 5][..], &forged[..64]].concat();
    let _ = s.write_all(&replay).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut sink)).await;

    // A suite certificate of the wrong role (a router's).
    let router = TcpBackend::with_security(
        EngineConfig::default(),
        "127.0.0.1:0".parse().unwrap(),
        ListenOptions::default(),
        Some(client(&suite, SuiteRole::Router)),
    );
    if let Ok(seg) = router.open_segment(&desc).await {
        let reqs = reqs_for(&g, 9, LAYOUT.page_bytes());
        if let Ok(h) = router.submit_batch(seg, g.key, reqs) {
            assert_ne!(
                h.wait().await,
                BatchStatus::Completed { pages: 1 },
                "a router certificate wrote KV"
            );
        }
    }

    eventually(WAIT, "three refusals", || async {
        refused.lock().len() >= 3
    })
    .await;
    let reasons: Vec<RefusedReason> = refused.lock().iter().map(|r| r.reason.clone()).collect();
    let count = |f: fn(&RefusedReason) -> bool| reasons.iter().filter(|r| f(r)).count();
    assert_eq!(
        count(|r| matches!(r, RefusedReason::Handshake(_))),
        2,
        "{reasons:?}"
    );
    assert_eq!(
        count(|r| matches!(r, RefusedReason::Role(_))),
        1,
        "{reasons:?}"
    );
    let c = decode.receiver_counters().snapshot();
    assert_eq!(c.refused_connections, 3);
    assert_eq!(c.frames_ok, 3, "only the prefill's pages landed");
    assert!(res
        .commit(&manifest_for(&g, &reqs_for(&g, 9, LAYOUT.page_bytes())))
        .is_err());
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_once() {
    let pool = pool(4);
    let refused = Arc::new(Mutex::new(Vec::new()));
    let r2 = refused.clone();
    let opts = ListenOptions {
        max_connections: 2,
        on_refused: Some(Arc::new(move |r: &Refused| r2.lock().push(r.clone()))),
        ..ListenOptions::default()
    };
    let (decode, desc) = decode_with(&pool, opts).await;
    let addr: std::net::SocketAddr = desc.addr.parse().unwrap();
    // Two idle sockets hold both slots.
    let _a = TcpStream::connect(addr).await.unwrap();
    let _b = TcpStream::connect(addr).await.unwrap();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
        .await
        .expect("the third connection is closed, not left hanging");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    eventually(WAIT, "one refusal", || async { refused.lock().len() == 1 }).await;
    assert_eq!(refused.lock()[0].reason, RefusedReason::TooManyConnections);
    assert_eq!(decode.receiver_counters().snapshot().refused_connections, 1);
}

/// Connects from `from` and either sends nothing (held until the handshake deadline) or sends
/// bytes that are no TLS handshake; returns once the listener closed the socket.
async fn unauthenticated(addr: std::net::SocketAddr, from: std::net::Ipv4Addr, silent: bool) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(std::net::SocketAddr::new(from.into(), 0))
        .unwrap();
    let Ok(mut s) = socket.connect(addr).await else {
        return;
    };
    if !silent {
        let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n").await;
    }
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut sink)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unauthenticated_connects_neither_starves_a_prefill_nor_floods_reports() {
    const FLOOD: usize = 2000;
    const SOURCES: u8 = 4;
    let dir = tempfile::tempdir().unwrap();
    let suite = write_dev_suite(dir.path()).unwrap();
    let pool = pool(8);
    let refused = Arc::new(Mutex::new(Vec::<Refused>::new()));
    let r2 = refused.clone();
    let opts = ListenOptions {
        handshake_timeout: Duration::from_millis(500),
        max_handshakes: 16,
        max_connections: 4,
        refusal_window: Duration::from_secs(60),
        on_refused: Some(Arc::new(move |r: &Refused| r2.lock().push(r.clone()))),
        ..listener(&suite, Arc::default())
    };
    let (decode, desc) = decode_with(&pool, opts).await;
    let addr: std::net::SocketAddr = desc.addr.parse().unwrap();

    // The flood: silent sockets and garbage from a few loopback addresses, 64 at a time.
    let flood = tokio::spawn(async move {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..FLOOD {
            while set.len() >= 64 {
                set.join_next().await;
            }
            let from = std::net::Ipv4Addr::new(127, 0, 1, 1 + (i % SOURCES as usize) as u8);
            set.spawn(unauthenticated(addr, from, i % 2 == 0));
        }
        while set.join_next().await.is_some() {}
    });

    // A real prefill during the flood: its handshake gets a place and its pages land.
    eventually(WAIT, "the flood to be refused", || async {
        decode.receiver_counters().snapshot().refused_connections > 0
    })
    .await;
    let prefill = TcpBackend::with_security(
        EngineConfig::default(),
        "127.0.0.1:0".parse().unwrap(),
        ListenOptions::default(),
        Some(client(&suite, SuiteRole::Prefill)),
    );
    // A try whose handshake found no place is tried again.
    let tries = Polling::within(Duration::from_secs(30)).every(Duration::from_millis(100));
    eventually(tries, "a transfer landed during the flood", || async {
        let seg = prefill.open_segment(&desc).await.ok()?;
        let res = pool.reserve(owner(1), 10).unwrap();
        let g = res.grant().clone();
        let reqs = reqs_for(&g, 1, LAYOUT.page_bytes());
        let h = prefill.submit_batch(seg, g.key, reqs.clone()).unwrap();
        if h.wait().await != (BatchStatus::Completed { pages: 3 }) {
            return None;
        }
        prefill.drain(seg, g.key).await.unwrap();
        res.commit(&manifest_for(&g, &reqs))
            .expect("commit during the flood");
        Some(())
    })
    .await;
    flood.await.unwrap();

    let refusals = decode.receiver_counters().snapshot().refused_connections;
    let reports = refused.lock().clone();
    let mut per_source = std::collections::HashMap::<std::net::IpAddr, usize>::new();
    for r in &reports {
        *per_source.entry(r.peer.ip()).or_default() += 1;
    }
    eprintln!(
        "{FLOOD} connects: {refusals} refused, {} reports: {per_source:?}",
        reports.len()
    );
    assert!(
        refusals as usize >= FLOOD / 2,
        "the flood was not refused: {refusals}"
    );
    assert!(
        // The flood's sources, and 127.0.0.1 when a prefill try met a full handshake budget.
        per_source.values().all(|&n| n == 1) && per_source.len() <= SOURCES as usize + 1,
        "more than one report per source in one window: {per_source:?}"
    );
}
