//! The router's edge against slow clients: 500 sockets that dribble a request head
//! one byte at a time are closed once `--header-read-timeout` passes, while a well-behaved
//! client keeps being served throughout; a body that never finishes ends in a clean 400. One
//! client address holds at most `--max-unauthenticated-per-addr` sockets that have not shown a
//! key: past it its oldest is closed for the new one, and other addresses, and that address's
//! authenticated connections, are served.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use pagewarden_system_tests::{
    api_key, start_decode, start_prefill, start_router_with, ModelArg, Service,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const TINY: ModelArg = ModelArg::Tiny(11);
const SLOW: usize = 500;
/// Bound on the whole test: far beyond the 1 s header timeout, only there so that a router
/// without one fails instead of hanging.
const GIVE_UP: Duration = Duration::from_secs(60);

/// A connection to `addr` from the loopback address `from` (all of 127/8 is this host).
async fn connect_from(from: Ipv4Addr, addr: &str) -> std::io::Result<TcpStream> {
    let addr: SocketAddr = addr.parse().expect("router address");
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(from), 0))?;
    socket.connect(addr).await
}

/// A two-token completion through `router` with `client`; its status.
async fn complete(client: &reqwest::Client, router: &Service) -> reqwest::Result<u16> {
    client
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth(api_key(0))
        .json(&json!({"prompt": "hello there", "max_tokens": 2, "temperature": 0}))
        .send()
        .await
        .map(|r| r.status().as_u16())
}

/// Whether the router closes a socket that has sent nothing within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// Dribbles a request head forever from 127.0.0.2; returns once the router closed the socket.
async fn dribble(addr: String) -> bool {
    let Ok(mut s) = connect_from(Ipv4Addr::new(127, 0, 0, 2), &addr).await else {
        return true;
    };
    if s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        .await
        .is_err()
    {
        return true;
    }
    let start = Instant::now();
    let mut buf = [0u8; 64];
    while start.elapsed() < GIVE_UP {
        if s.write_all(b"X").await.is_err() {
            return true;
        }
        match tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // Whatever the router answered (it must not, for a head not yet complete), the
            // socket is still being served.
            Ok(Ok(_)) | Err(_) => {}
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dribbling_sockets_are_closed_while_a_good_client_is_served() {
    let decode = start_decode(&TINY, &[]);
    let prefill = start_prefill(&TINY, &[]);
    let router = start_router_with(
        &TINY,
        &[&decode],
        &[&prefill],
        &[
            "--header-read-timeout",
            "1s",
            "--body-read-timeout",
            "1s",
            "--max-unauthenticated-per-addr",
            "1000",
        ],
    )
    .await;
    let addr = router.addrs["http"].clone();
    let slow: Vec<_> = (0..SLOW)
        .map(|_| tokio::spawn(dribble(addr.clone())))
        .collect();

    // The good client is served while the slow sockets are open.
    let client = reqwest::Client::new();
    for _ in 0..5 {
        let status = complete(&client, &router).await.expect("good request");
        assert_eq!(status, 200);
    }

    let mut closed = 0;
    for t in slow {
        closed += usize::from(t.await.expect("dribbler task"));
    }
    assert_eq!(closed, SLOW, "sockets dribbling a head were left open");

    // A body that stops arriving: a clean 400, not a held slot.
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"prompt\":",
        api_key(0)
    );
    s.write_all(head.as_bytes()).await.expect("write head");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(GIVE_UP, async {
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
            if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_cap_of_unauthenticated_sockets() {
    const CAP: usize = 4;
    let flooder = Ipv4Addr::new(127, 0, 0, 3);
    let decode = start_decode(&TINY, &[]);
    let prefill = start_prefill(&TINY, &[]);
    let router = start_router_with(
        &TINY,
        &[&decode],
        &[&prefill],
        &[
            "--header-read-timeout",
            "60s",
            "--first-request-timeout",
            "60s",
            "--max-unauthenticated-per-addr",
            &CAP.to_string(),
        ],
    )
    .await;
    let addr = router.addrs["http"].clone();
    let mut idle = Vec::new();
    for _ in 0..CAP {
        // One after the other: the router takes them in in this order, so the first is the
        // oldest (equal ages go to the first taken).
        idle.push(connect_from(flooder, &addr).await.expect("connect"));
    }
    // Held open: the router has no reason to close them yet.
    for s in &mut idle {
        assert!(!closed_within(s, Duration::from_millis(300)).await);
    }
    // One more from the same address: the oldest goes, the new one stays.
    let mut newest = connect_from(flooder, &addr).await.expect("connect");
    assert!(
        closed_within(&mut idle[0], Duration::from_secs(10)).await,
        "the address's oldest unauthenticated socket was kept past its cap"
    );
    assert!(
        !closed_within(&mut newest, Duration::from_millis(300)).await,
        "the new socket was closed instead of the oldest"
    );
    for s in &mut idle[1..] {
        assert!(!closed_within(s, Duration::from_millis(100)).await);
    }

    // Another address is served while the flooder holds its cap.
    let elsewhere = reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 4)))
        .build()
        .expect("client");
    assert_eq!(
        complete(&elsewhere, &router)
            .await
            .expect("another address"),
        200
    );
    // And so is the flooder's own address, on a new connection that authenticates.
    let same = reqwest::Client::builder()
        .local_address(IpAddr::V4(flooder))
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    for _ in 0..3 {
        assert_eq!(complete(&same, &router).await.expect("same address"), 200);
    }

    let metrics = reqwest::get(format!("{}/metrics", router.http_url()))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    let closed: f64 = metrics
        .lines()
        .find(|l| {
            l.starts_with("pagewarden_router_closed_connections_total")
                && l.contains("unauthenticated_per_address")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(closed >= 1.0, "closing not counted:\n{metrics}");
}
