//! `pagewarden probe` against the real binaries and the real model on this machine's CPU, a
//! 2,048-token context: with a first-token floor under what the sweep's long steps take here,
//! the sweep passes at the suite's own pace (the limits follow it); with decode frozen
//! (SIGSTOP) in the middle of a sweep for 16 times the last step's time, the step in flight
//! fails as implausibly slow and the sweep fails.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use pagewarden_system_tests::{
    api_key, bin, model_path, start_decode, start_prefill, start_router, ModelArg,
};

const CONTEXT: &str = "2048";

/// One printed step: (prompt tokens, ttft ms, outcome).
type Row = (u64, u64, String);

/// Runs `pagewarden probe` as tenant-0 with the given floor; `on_row` sees each step as it is
/// printed. Returns whether it passed, its rows and its whole output.
fn probe(url: &str, floor_ms: u64, mut on_row: impl FnMut(&Row)) -> (bool, Vec<Row>, String) {
    let mut child = Command::new(bin("pagewarden"))
        .env("RUST_BACKTRACE", "0")
        .args(["probe", "--router", url, "--timeout-s", "300"])
        .args(["--max-ttft-ms", &floor_ms.to_string()])
        .args(["--key", &format!("tenant-0={}", api_key(0))])
        .arg("--model")
        .arg(model_path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting pagewarden probe");
    let (mut rows, mut text) = (Vec::new(), String::new());
    for line in BufReader::new(child.stdout.take().expect("stdout"))
        .lines()
        .map_while(Result::ok)
    {
        text.push_str(&line);
        text.push('\n');
        let w: Vec<&str> = line.split_whitespace().collect();
        // tenant step words http prompt ttft_ms outcome [detail]
        if let ["tenant-0", _, _, _, prompt, ttft, outcome, ..] = w[..] {
            if let (Ok(p), Ok(t)) = (prompt.parse(), ttft.parse()) {
                let row = (p, t, outcome.to_string());
                on_row(&row);
                rows.push(row);
            }
        }
    }
    let out = child.wait_with_output().expect("pagewarden probe");
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), rows, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_cpu_passes_the_sweep_at_its_pace_and_a_frozen_decode_fails_it() {
    let m = ModelArg::Real;
    let decode = start_decode(&m, &["--context-length", CONTEXT]);
    let prefill = start_prefill(&m, &["--context-length", CONTEXT]);
    let router = start_router(&m, &[&decode], &[&prefill]).await;
    let url = router.http_url();

    // What this machine takes: a sweep under a floor no step comes near.
    let (ok, rows, text) = probe(&url, 600_000, |_| {});
    assert!(ok, "calibration sweep failed:\n{text}");
    let first = rows.first().unwrap_or_else(|| panic!("no step:\n{text}"));
    let longest = rows.iter().map(|r| r.1).max().expect("rows");
    // The floor: four times the first step (judged by the floor alone, before any pace is
    // known), so that only the longer steps, judged at the pace, outlast it.
    let floor = (4 * first.1).max(100);
    assert!(
        longest > floor,
        "the longest step ({longest} ms) must outlast the floor ({floor} ms) for this test to \
         show the pace:\n{text}"
    );

    let (ok, _, text) = probe(&url, floor, |_| {});
    assert!(
        ok,
        "at its own pace the sweep must pass (floor {floor} ms):\n{text}"
    );

    // Frozen mid-sweep, once a step of 100+ tokens has passed, while the next is in flight,
    // for 16 times that step's time: the next has about 1.75 times its tokens, so its limit
    // is at most about 4 x 1.75 = 7 times that time at the pace the sweep measured.
    let mut freeze = None;
    let (ok, rows, text) = probe(&url, floor, |r| {
        if freeze.is_none() && r.0 >= 100 {
            let hold = Duration::from_millis(16 * r.1);
            decode.signal("STOP");
            std::thread::sleep(hold);
            decode.signal("CONT");
            freeze = Some(hold);
        }
    });
    let freeze = freeze.unwrap_or_else(|| panic!("no step of 100+ tokens:\n{text}"));
    assert!(
        !ok,
        "the sweep passed with decode frozen for {freeze:?}:\n{text}"
    );
    assert!(
        rows.iter().any(|r| r.2 == "latency_implausible"),
        "no step failed as too slow with decode frozen for {freeze:?}:\n{text}"
    );
}
