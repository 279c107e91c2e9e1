//! Long prompts on a machine someone else is using: `pagewarden up` on its defaults but a
//! context of 2,048 tokens, while another process keeps every core busy, serves two tenants'
//! marked prompts at once at growing lengths up to 0.98 × the context it advertises. Every answer is 200 with its own tenant's
//! marker and never the other's: no deadline fires on a request that is being served, however
//! slowly (the machine is shared, so prefill runs at a fraction of its speed).
//!
//! Why 2,048 and not the model's 8,192: past about 6,000 tokens of this filler the 135M test
//! model no longer copies the marker (its answer is 200, but not the code), so a marker check
//! there would test the model, and each round would take minutes on busy cores.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use pagewarden_model::{GgufFile, Tokenizer};
use pagewarden_system_tests::model_path;
use pagewarden_system_tests::prompts::marked_prompt;
use pagewarden_system_tests::up::Up;
use serde_json::{json, Value};

/// One busy loop per core, each its own process (`sh`), killed when dropped.
struct BusyCores {
    loops: Vec<Child>,
    started: Instant,
}

impl BusyCores {
    fn start() -> BusyCores {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let loops = (0..cores)
            .map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(Stdio::null())
                    .spawn()
                    .expect("starting a busy loop")
            })
            .collect();
        BusyCores {
            loops,
            started: Instant::now(),
        }
    }

    /// The share of one core each loop got since it started (its user + system time over the
    /// wall time), lowest first.
    fn shares(&self) -> Vec<f64> {
        // Clock ticks per second: 100 on every Linux this runs on (USER_HZ).
        const TICKS: f64 = 100.0;
        let wall = self.started.elapsed().as_secs_f64();
        let mut shares: Vec<f64> = self
            .loops
            .iter()
            .map(|c| {
                let stat = std::fs::read_to_string(format!("/proc/{}/stat", c.id()))
                    .expect("a busy loop's /proc stat");
                // After `pid (comm)`: state is field 3, utime 14 and stime 15 (1-based).
                let rest: Vec<&str> = stat
                    .rsplit_once(')')
                    .expect("stat's comm")
                    .1
                    .split_whitespace()
                    .collect();
                let ticks: f64 = rest[11].parse::<f64>().expect("utime")
                    + rest[12].parse::<f64>().expect("stime");
                ticks / TICKS / wall
            })
            .collect();
        shares.sort_by(f64::total_cmp);
        shares
    }
}

impl Drop for BusyCores {
    fn drop(&mut self) {
        for c in &mut self.loops {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn up_serves_two_tenants_prompts_up_to_the_context_on_busy_cores() {
    let cwd = tempfile::tempdir().expect("tempdir");
    let up = Up::start(cwd.path(), &["--context-length", "2048"]);
    let http = reqwest::Client::new();
    let (model, context) = up.served_model(&http).await;
    let tok = Arc::new(
        Tokenizer::from_gguf(&GgufFile::open(&model_path()).expect("model")).expect("tokenizer"),
    );
    let tenants: Vec<(String, String)> = up.keys.clone().into_iter().collect();
    let codes = ["QX7A", "ZV9B"];
    let max_tokens = 6usize;
    let top = context * 98 / 100 - max_tokens;
    // The prompts are written before the cores are taken, so that only serving is contended.
    let rounds: Vec<(usize, Vec<String>)> = [200, context * 44 / 100, context * 73 / 100, top]
        .into_iter()
        .map(|len| (len, codes.map(|c| marked_prompt(&tok, c, len)).to_vec()))
        .collect();

    let busy = BusyCores::start();
    for (len, prompts) in rounds {
        let round = Instant::now();
        let calls: Vec<_> = prompts
            .into_iter()
            .zip(&tenants)
            .map(|(prompt, (_, key))| {
                let (http, api, key, model) =
                    (http.clone(), up.api.clone(), key.clone(), model.clone());
                tokio::spawn(async move {
                    let r = http
                        .post(format!("{api}/v1/completions"))
                        .bearer_auth(key)
                        .json(&json!({"model": model, "prompt": prompt,
                            "max_tokens": max_tokens, "temperature": 0}))
                        .send()
                        .await
                        .expect("send");
                    let status = r.status().as_u16();
                    let body: Value = r.json().await.expect("a JSON body");
                    (status, body)
                })
            })
            .collect();
        for (t, call) in calls.into_iter().enumerate() {
            let (status, v) = call.await.expect("request task");
            let tenant = &tenants[t].0;
            assert_eq!(status, 200, "{tenant}, ~{len} tokens on busy cores: {v}");
            let text = v["choices"][0]["text"].as_str().unwrap_or_default();
            eprintln!(
                "{tenant}: {} prompt tokens -> {text:?} ({:.1?} into the round)",
                v["usage"]["prompt_tokens"],
                round.elapsed()
            );
            assert!(
                text.contains(codes[t]),
                "{tenant}, ~{len} tokens: own marker missing: {v}"
            );
            assert!(
                !text.contains(codes[1 - t]),
                "{tenant} got the other tenant's marker: {v}"
            );
        }
    }
    // The cores were in fact contended: each busy loop got a good share of a core throughout
    // (the suite's threads and the loops share them; alone, a loop takes a whole core).
    let shares = busy.shares();
    eprintln!("busy loops' share of a core each: {shares:.2?}");
    assert!(
        shares[0] > 0.25,
        "a busy loop got only {:.2} of a core: the suite did not run on busy cores",
        shares[0]
    );
}
