//! A rolling restart of both decode workers under a steady load of 4 streams fails no
//! request. SIGTERM makes a decode drain: it finishes the sequences it holds, answers new and
//! queued reservations `UNAVAILABLE` (and its `Info` too, so the router stops picking it), and
//! exits once empty; the router sends a request whose `Reserve` found it unavailable to the
//! other decode. Each decode is restarted on its own gRPC address and serves again before the
//! other one goes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pagewarden_system_tests::{
    api_key, start_prefill, start_router_with, worker_args_on, ModelArg, Service,
};
use pagewarden_testkit::eventually;
use serde_json::json;

const TINY: ModelArg = ModelArg::Tiny(5);

/// A free loopback port below the ephemeral range (32768 and up on Linux), so that no
/// outbound connection takes its number while its decode is down for the restart.
fn port_for_restarts() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let seed = std::process::id() as u64 ^ now.map_or(0, |d| d.as_nanos() as u64);
    (0..1000u64)
        .map(|i| 20_000 + (seed.wrapping_mul(2_654_435_761).wrapping_add(i * 7_919) % 12_000))
        .find_map(|p| {
            std::net::TcpListener::bind(("127.0.0.1", p as u16))
                .ok()
                .map(|_| format!("127.0.0.1:{p}"))
        })
        .expect("a free port below the ephemeral range")
}

/// A decode worker on `grpc` (its other listeners on free ports).
fn decode_on(grpc: &str) -> Service {
    Service::start("pagewarden-decode", &worker_args_on(grpc, &TINY, &[]))
}

/// What the load saw.
#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    failed: AtomicUsize,
}

/// One client: streamed completions back to back until `stop`; a request counts as ok only
/// with a 200 whose stream ends in `[DONE]` and carries no error event.
async fn client(url: String, n: usize, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let http = reqwest::Client::new();
    while !stop.load(Ordering::Relaxed) {
        let r = http
            .post(&url)
            .bearer_auth(api_key(n % 4))
            .json(&json!({"prompt": format!("stream {n} says"), "max_tokens": 24, "stream": true}))
            .send()
            .await;
        let good = match r {
            Ok(r) if r.status().as_u16() == 200 => match r.text().await {
                Ok(body) if body.contains("[DONE]") && !body.contains("\"error\"") => true,
                Ok(body) => {
                    eprintln!("stream {n}: 200 but {body}");
                    false
                }
                Err(e) => {
                    eprintln!("stream {n}: 200 but the body failed: {e}");
                    false
                }
            },
            Ok(r) => {
                eprintln!("stream {n}: {} {:?}", r.status(), r.text().await);
                false
            }
            Err(e) => {
                eprintln!("stream {n}: {e}");
                false
            }
        };
        let c = if good { &tally.ok } else { &tally.failed };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_both_decodes_fails_no_request() {
    let mut decodes = [
        decode_on(&port_for_restarts()),
        decode_on(&port_for_restarts()),
    ];
    let addrs: Vec<String> = decodes.iter().map(|d| d.addrs["grpc"].clone()).collect();
    let prefill = start_prefill(&TINY, &[]);
    let router = start_router_with(&TINY, &[&decodes[0], &decodes[1]], &[&prefill], &[]).await;
    let url = format!("{}/v1/completions", router.http_url());

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let load: Vec<_> = (0..4)
        .map(|n| tokio::spawn(client(url.clone(), n, stop.clone(), tally.clone())))
        .collect();
    let served = |t: &Tally| t.ok.load(Ordering::Relaxed);
    let settle = |want: usize| {
        let tally = tally.clone();
        async move {
            eventually(Duration::from_secs(60), "the load to go on", || async {
                served(&tally) >= want
            })
            .await
        }
    };
    settle(20).await;

    for (i, addr) in addrs.iter().enumerate() {
        decodes[i].signal("TERM");
        let status = tokio::task::block_in_place(|| decodes[i].wait_exit(Duration::from_secs(60)))
            .expect("a draining decode exits once its sequences are done");
        assert!(status.success(), "decode {i} exited {status:?}");
        let before = served(&tally);
        // The other decode alone carries the load meanwhile.
        settle(before + 10).await;
        decodes[i] = decode_on(addr);
        // Back in the router's rotation (it polls every 200 ms) and serving.
        let health = format!("{}/health", router.http_url());
        eventually(
            Duration::from_secs(10),
            "both decodes live again",
            || async {
                let v: serde_json::Value = reqwest::get(&health).await.ok()?.json().await.ok()?;
                (v["live_decode"] == 2).then_some(())
            },
        )
        .await;
        settle(served(&tally) + 10).await;
    }
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.expect("client task");
    }
    let (ok, failed) = (served(&tally), tally.failed.load(Ordering::Relaxed));
    eprintln!("rolling restart under 4 streams: {ok} requests served, {failed} failed");
    assert_eq!(failed, 0, "{failed} of {} requests failed", ok + failed);
}
