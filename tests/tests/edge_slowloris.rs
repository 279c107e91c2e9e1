//! The router's edge against slow clients (issue 14): 500 sockets that dribble a request head
//! one byte at a time are closed once `--header-read-timeout` passes, while a well-behaved
//! client keeps being served throughout; a body that never finishes ends in a clean 400.

use std::time::{Duration, Instant};

use pagewarden_system_tests::{api_key, start_decode, start_prefill, start_router_with, ModelArg};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TINY: ModelArg = ModelArg::Tiny(11);
const SLOW: usize = 500;
/// Bound on the whole test: far beyond the 1 s header timeout, only there so that a router
/// without one fails instead of hanging.
const GIVE_UP: Duration = Duration::from_secs(60);

/// Dribbles a request head forever; returns once the router closed the socket.
async fn dribble(addr: String) -> bool {
    let Ok(mut s) = TcpStream::connect(&addr).await else {
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
        &["--header-read-timeout", "1s", "--body-read-timeout", "1s"],
    )
    .await;
    let addr = router.addrs["http"].clone();
    let slow: Vec<_> = (0..SLOW)
        .map(|_| tokio::spawn(dribble(addr.clone())))
        .collect();

    // The good client is served while the slow sockets are open.
    let client = reqwest::Client::new();
    for _ in 0..5 {
        let r = client
            .post(format!("{}/v1/completions", router.http_url()))
            .bearer_auth(api_key(0))
            .json(&json!({"prompt": "hello there", "max_tokens": 2, "temperature": 0}))
            .send()
            .await
            .expect("good request");
        assert_eq!(r.status().as_u16(), 200);
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
