//! Issue 8, what the defenses cost: the in-process serve path (decode reserve + grant,
//! prefill marker KV, transfer over the memory backend with real frames, commit, read) with
//! every check on beside the same build with the test-only switches off, alternating rounds
//! in one run. Prints throughput and time-to-first-read ratios; asserts nothing about speed.
//! Run: `cargo test -p pagewarden-system-tests --release --test reliability_cost -- --ignored
//! --nocapture`.

#[allow(dead_code)]
#[path = "../src/harness/mod.rs"]
mod harness;

use std::time::{Duration, Instant};

use harness::cluster::Cluster;
use harness::layers::Layers;
use harness::markers::{contains_marker, A};

const ROUNDS: usize = 10;
const REQUESTS: usize = 300;

/// (wall time of `REQUESTS` requests, summed time to first read).
async fn round(layers: Layers) -> (Duration, Duration) {
    let c = Cluster::with_pages(layers, 64, 64).await;
    let mut first = Duration::ZERO;
    let t0 = Instant::now();
    for i in 0..REQUESTS {
        let prompt = 16 + (i * 37) % 240;
        let s = Instant::now();
        let r = c.serve(&A, prompt, 16, None).await.expect("served");
        first += s.elapsed();
        assert!(contains_marker(&r.bytes, A.marker));
    }
    (t0.elapsed(), first)
}

#[tokio::test]
#[ignore = "benchmark: run by hand with --release"]
async fn defenses_cost_on_vs_off() {
    let (mut on, mut off) = (
        (Duration::ZERO, Duration::ZERO),
        (Duration::ZERO, Duration::ZERO),
    );
    round(Layers::all_on()).await; // warm-up
    for _ in 0..ROUNDS {
        let a = round(Layers::all_on()).await;
        let b = round(Layers::all_off()).await;
        on = (on.0 + a.0, on.1 + a.1);
        off = (off.0 + b.0, off.1 + b.1);
    }
    let n = (ROUNDS * REQUESTS) as f64;
    let tput_on = n / on.0.as_secs_f64();
    let tput_off = n / off.0.as_secs_f64();
    println!(
        "defenses on: {tput_on:.0} req/s, mean time to first read {:.1} us",
        on.1.as_secs_f64() * 1e6 / n
    );
    println!(
        "defenses off: {tput_off:.0} req/s, mean time to first read {:.1} us",
        off.1.as_secs_f64() * 1e6 / n
    );
    println!(
        "throughput ratio on/off = {:.4}, TTFR ratio on/off = {:.4}",
        tput_on / tput_off,
        on.1.as_secs_f64() / off.1.as_secs_f64()
    );
}
