//! Hostile clients against the router's edge, one attack after another: 1,024 silent
//! sockets from 16 loopback addresses, 1,024 idle HTTP/2 connections of one tenant, 200
//! slowloris sockets and 1,000 idle HTTP/1 keep-alives of one tenant. During each, a client of
//! another tenant, from the attacker's address and from another, gets every request served on a
//! new connection, and every attacking connection is closed by its deadline (or earlier, by a
//! cap that needed its place). Deadlines are short through the router's flags, and every count
//! and wait is bounded so the test ends in well under a minute.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use pagewarden_system_tests::{
    api_key, start_decode, start_prefill, start_router_with, ModelArg, Service,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

const TINY: ModelArg = ModelArg::Tiny(11);
/// The router's first-request, header and idle deadlines in this test.
const DEADLINE: Duration = Duration::from_secs(3);
/// What a closing may run past its deadline on a loaded machine: the reaper's tick, the
/// scheduler, this process's own reads.
const SLACK: Duration = Duration::from_secs(5);
/// Good requests per client per attack.
const GOOD: usize = 6;
const ATTACKER: usize = 0;
const VICTIM: usize = 1;
const OTHER_ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 200);

fn loopback(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

/// Sockets this test holds at once (attacks plus good clients), with room for the harness.
fn raise_fd_limit() {
    const WANT: libc::rlim_t = 4096;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < WANT {
            assert!(
                lim.rlim_max >= WANT,
                "this test holds ~2,100 sockets: raise the hard limit of open files (ulimit -Hn {})",
                lim.rlim_max
            );
            lim.rlim_cur = WANT;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
}

async fn connect_from(from: Ipv4Addr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(from), 0))?;
    socket.connect(addr).await
}

/// `GOOD` completions for the victim tenant from `from`, each on a new connection; panics on
/// any that is not a 200.
async fn victim_served(router: &Service, from: Ipv4Addr, attack: &str) {
    let client = reqwest::Client::builder()
        .local_address(IpAddr::V4(from))
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    for i in 0..GOOD {
        let r = client
            .post(format!("{}/v1/completions", router.http_url()))
            .bearer_auth(api_key(VICTIM))
            .json(&json!({"prompt": "hello there", "max_tokens": 2, "temperature": 0}))
            .send()
            .await;
        match r {
            Ok(r) if r.status() == 200 => {}
            Ok(r) => panic!(
                "{attack}: good request {i} from {from} got {}: {}",
                r.status(),
                r.text().await.unwrap_or_default()
            ),
            Err(e) => panic!("{attack}: good request {i} from {from} failed: {e}"),
        }
    }
}

/// Both good clients, from the attacker's address and from another.
async fn victims_served(router: &Service, attacker: Ipv4Addr, attack: &str) {
    victim_served(router, attacker, attack).await;
    victim_served(router, OTHER_ADDR, attack).await;
}

/// Waits until the router closes `s`; how long after `since` that was, or `None` when it was
/// still open at `since + DEADLINE + SLACK`.
async fn closed_after(mut s: TcpStream, since: Instant, dribble: bool) -> Option<Duration> {
    let give_up = since + DEADLINE + SLACK;
    let mut buf = [0u8; 256];
    loop {
        if dribble && s.write_all(b"X").await.is_err() {
            return Some(since.elapsed());
        }
        let wait = if dribble {
            Duration::from_millis(200)
        } else {
            give_up.saturating_duration_since(Instant::now())
        };
        match tokio::time::timeout(wait, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(since.elapsed()),
            // A head that is not complete must get no answer; keep reading till the close.
            Ok(Ok(_)) => {}
            Err(_) if Instant::now() >= give_up => return None,
            Err(_) => {}
        }
    }
}

/// Asserts every attacking connection closed within `DEADLINE + SLACK` of when it went quiet.
async fn all_closed(mut closings: JoinSet<Option<Duration>>, n: usize, attack: &str) {
    let mut closed = 0;
    let mut latest = Duration::ZERO;
    while let Some(c) = closings.join_next().await {
        if let Some(after) = c.expect("closing task") {
            closed += 1;
            latest = latest.max(after);
        }
    }
    assert_eq!(
        closed,
        n,
        "{attack}: {} connections were still open {:?} after they went quiet",
        n - closed,
        DEADLINE + SLACK
    );
    eprintln!("{attack}: all {n} closed, the last {latest:?} after it went quiet");
}

/// Opens `n` sockets from `addrs` in turn that send nothing (or dribble a head, `dribble`).
async fn open_silent(
    addr: SocketAddr,
    addrs: &[Ipv4Addr],
    n: usize,
    dribble: bool,
) -> JoinSet<Option<Duration>> {
    let mut closings = JoinSet::new();
    for i in 0..n {
        let from = addrs[i % addrs.len()];
        let since = Instant::now();
        match connect_from(from, addr).await {
            Ok(mut s) => {
                if dribble {
                    let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").await;
                }
                closings.spawn(closed_after(s, since, dribble));
            }
            // Refused outright counts as closed.
            Err(_) => {
                closings.spawn(async move { Some(since.elapsed()) });
            }
        }
    }
    closings
}

/// Opens `n` connections of the attacking tenant from `from` (HTTP/2 with prior knowledge, or
/// HTTP/1 keep-alive), one authenticated `GET /v1/models` on each, then holds them quiet. Each
/// task ends when the router closes its connection, with the time since its response.
async fn open_idle(
    addr: SocketAddr,
    from: Ipv4Addr,
    n: usize,
    http2: bool,
) -> JoinSet<Option<Duration>> {
    let mut closings = JoinSet::new();
    let mut opening = JoinSet::new();
    for _ in 0..n {
        // A few dozen at a time: the attack is the idle connections, not a connect storm.
        while opening.len() >= 32 {
            let _ = opening.join_next().await;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        opening.spawn(async move {
            let _ = tx.send(idle_connection(addr, from, http2).await);
        });
        closings.spawn(async move {
            match rx.await {
                Ok(Some(closed)) => closed.await.ok().flatten(),
                // Refused or closed before its request was answered: closed, at once.
                Ok(None) | Err(_) => Some(Duration::ZERO),
            }
        });
    }
    while opening.join_next().await.is_some() {}
    closings
}

/// One idle connection; `None` when the router closed it before answering. The receiver
/// gives the time from the response to the close.
async fn idle_connection(
    addr: SocketAddr,
    from: Ipv4Addr,
    http2: bool,
) -> Option<tokio::sync::oneshot::Receiver<Option<Duration>>> {
    let io = TokioIo::new(connect_from(from, addr).await.ok()?);
    let req = hyper::Request::get(format!("http://{addr}/v1/models"))
        .header("host", addr.to_string())
        .header("authorization", format!("Bearer {}", api_key(ATTACKER)))
        .body(Empty::<Bytes>::new())
        .expect("request");
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<Instant>();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    macro_rules! drive {
        ($sender:expr, $conn:expr) => {{
            let mut sender = $sender;
            let conn = $conn;
            tokio::spawn(async move {
                let _ = conn.await;
                let closed = Instant::now();
                let quiet = done_rx.await.ok();
                let _ = closed_tx.send(quiet.map(|q| closed.saturating_duration_since(q)));
            });
            sender.ready().await.ok()?;
            let resp = sender.send_request(req).await.ok()?;
            if resp.status() != 200 {
                return None;
            }
            resp.into_body().collect().await.ok()?;
            let _ = done_tx.send(Instant::now());
            // The sender stays alive with the connection: dropping it would close it.
            tokio::spawn(async move {
                let _keep = sender;
                std::future::pending::<()>().await
            });
        }};
    }
    if http2 {
        let (s, c) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .ok()?;
        drive!(s, c);
    } else {
        let (s, c) = hyper::client::conn::http1::handshake(io).await.ok()?;
        drive!(s, c);
    }
    Some(closed_rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_and_hostile_clients_cannot_lock_another_tenant_out() {
    raise_fd_limit();
    let decode = start_decode(&TINY, &[]);
    let prefill = start_prefill(&TINY, &[]);
    let deadline = format!("{}ms", DEADLINE.as_millis());
    let router = start_router_with(
        &TINY,
        &[&decode],
        &[&prefill],
        &[
            "--first-request-timeout",
            &deadline,
            "--header-read-timeout",
            &deadline,
            "--idle-timeout",
            &deadline,
            "--max-connections",
            "512",
            "--max-idle-connections",
            "384",
            "--max-unauthenticated-per-addr",
            "64",
            "--max-connections-per-tenant",
            "64",
        ],
    )
    .await;
    let addr: SocketAddr = router.addrs["http"].parse().expect("router address");
    let started = Instant::now();

    // 1,024 silent sockets, 64 from each of 16 addresses.
    let attackers: Vec<Ipv4Addr> = (2..18).map(loopback).collect();
    let silent = open_silent(addr, &attackers, 1024, false).await;
    victims_served(&router, attackers[0], "silent sockets").await;
    all_closed(silent, 1024, "silent sockets").await;

    // 1,024 HTTP/2 connections of one tenant, each quiet after one request.
    let from = loopback(20);
    let h2 = open_idle(addr, from, 1024, true).await;
    victims_served(&router, from, "idle HTTP/2").await;
    all_closed(h2, 1024, "idle HTTP/2").await;

    // 200 sockets dribbling a request head.
    let from = loopback(21);
    let slow = open_silent(addr, &[from], 200, true).await;
    victims_served(&router, from, "slowloris").await;
    all_closed(slow, 200, "slowloris").await;

    // 1,000 HTTP/1 keep-alives of one tenant.
    let from = loopback(22);
    let kept = open_idle(addr, from, 1000, false).await;
    victims_served(&router, from, "keep-alives").await;
    all_closed(kept, 1000, "keep-alives").await;

    let metrics = reqwest::get(format!("{}/metrics", router.http_url()))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    for reason in ["first_request_timeout", "idle_timeout", "per_principal"] {
        let closed = metrics
            .lines()
            .find(|l| {
                l.starts_with("pagewarden_router_closed_connections_total")
                    && l.contains(&format!("reason=\"{reason}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        assert!(
            closed >= 1.0,
            "no connection closed for {reason}:\n{metrics}"
        );
    }
    eprintln!("all four attacks in {:?}", started.elapsed());
}
