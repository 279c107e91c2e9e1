//! The compose file, run for real. Builds the images here from the binaries this
//! build made, on a base made from Debian's packages (`scripts/compose-images.sh`, which calls
//! `scripts/compose-base.sh`: debootstrap from the host's own apt mirror, `docker import`,
//! cached by a content tag), starts `deploy/compose/docker-compose.yml` with the overrides in
//! `deploy/compose/local/` (local images instead of public ones, small workers), and on that one
//! stack:
//!
//! - the `init` service drew the keys: a dev tenant's key from its admin volume opens the
//!   router, a made-up one does not, and completions (plain and chat) come back;
//! - `pagewarden probe` (this build's binary, from the host) sweeps the router clean;
//! - the auditor's own first probe run, which waits for the router, passes;
//! - PostgreSQL, read directly, holds no incident, a preflight report from each of the four
//!   workers and the router's samples of the completions (all over mutual TLS);
//! - faults across the containers (each its own host on the compose networks) under a steady
//!   load of 4 clients: decode-0 killed with -9 and started again, prefill-0 frozen (a hang)
//!   and thawed, decode-1 cut off the KV network mid-transfer and joined again. No response
//!   holds the other tenant's marker, no request outlives the router's deadline, failures are
//!   clean 5xx, the router (which finds the workers by DNS name) sends to every worker again,
//!   and no page of any pool stays held, draining or quarantined;
//! - PostgreSQL stopped while completions are served: once it is back, the auditor holds every
//!   one of their samples, once (the router's client kept them);
//! - `pagewarden probe` passes again, and the auditor's incidents are only those a fault may
//!   cause (none in practice).
//!
//! The stack, its volumes, network and the image built for this run are removed at the end,
//! failure included (the base image stays, cached by its tag). Needs Docker with Compose
//! (`docker compose` or `docker-compose`) and debootstrap (`scripts/test.sh` installs it);
//! fails, never skips, without them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pagewarden_common::tenants::ClientKeys;
use pagewarden_system_tests::{bin, bin_dir, model_path};
use pagewarden_testkit::{eventually, eventually_blocking, Polling};
use pagewarden_transfer::RefusedReason;
use serde_json::{json, Value};

/// The model file name the compose file's commands name under `/models`.
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The four workers, as the compose file names them (and as they report to the auditor).
const WORKERS: [&str; 4] = ["prefill-0", "prefill-1", "decode-0", "decode-1"];
/// How long the whole stack may take to become ready after `up` returns.
const READY_TIMEOUT: Duration = Duration::from_secs(240);

/// The repository this test was compiled from (its compose file and scripts).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf()
}

fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `cmd`; its stdout when it succeeded, else panics with everything it said.
fn ok(cmd: &mut Command) -> String {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(o.status.success(), "{cmd:?} failed:\n{}", output_text(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// `docker pause`, retried when the kernel's cgroup freezer gives up (`unable to freeze`: a
/// task of the container sat in uninterruptible I/O past runc's wait, which a loaded machine
/// can see); the fault under test is the hang, not the freezer.
fn pause(container: &str) {
    for attempt in 1..=3 {
        let o = Command::new("docker")
            .args(["pause", container])
            .output()
            .unwrap_or_else(|e| panic!("cannot run docker pause: {e}"));
        if o.status.success() {
            return;
        }
        let text = output_text(&o);
        assert!(
            attempt < 3 && text.contains("unable to freeze"),
            "docker pause {container} failed:\n{text}"
        );
        // Real time: the freezer is the kernel's; it is retried once the I/O it waited on ends.
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `docker compose` when the plugin is there, else `docker-compose`.
fn compose_program() -> Vec<String> {
    let works = |c: &mut Command| c.output().is_ok_and(|o| o.status.success());
    if works(Command::new("docker").args(["compose", "version"])) {
        return vec!["docker".into(), "compose".into()];
    }
    assert!(
        works(Command::new("docker-compose").arg("version")),
        "neither `docker compose` nor `docker-compose` runs here: the compose test needs \
         Docker Engine with Compose"
    );
    vec!["docker-compose".into()]
}

/// One compose project over the repository's compose file and the local overrides.
struct Stack {
    program: Vec<String>,
    project: String,
    /// The first three octets of the KV network (`PAGEWARDEN_KV_SUBNET`).
    kv_subnet: String,
    env: Vec<(String, String)>,
    image: String,
}

impl Stack {
    fn cmd(&self, args: &[&str]) -> Command {
        let dir = repo().join("deploy/compose");
        let mut c = Command::new(&self.program[0]);
        c.args(&self.program[1..]).args(["-p", &self.project]);
        for f in [
            "docker-compose.yml",
            "local/local-images.yml",
            "local/small.yml",
        ] {
            c.arg("-f").arg(dir.join(f));
        }
        c.args(args).envs(self.env.iter().cloned());
        c
    }

    fn ok(&self, args: &[&str]) -> String {
        ok(&mut self.cmd(args))
    }

    /// One SQL query's rows (`|`-separated columns), read with psql inside the postgres
    /// container.
    fn sql(&self, query: &str) -> Vec<String> {
        self.try_sql(query)
            .unwrap_or_else(|why| panic!("psql {query:?} failed:\n{why}"))
    }

    /// [`Stack::sql`], or what psql said when it could not answer (a database still
    /// starting up after a restart).
    fn try_sql(&self, query: &str) -> Result<Vec<String>, String> {
        let o = self
            .cmd(&[
                "exec",
                "-T",
                "postgres",
                "psql",
                "-U",
                "pagewarden",
                "-d",
                "pagewarden",
                "-tA",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                query,
            ])
            .output()
            .map_err(|e| e.to_string())?;
        if !o.status.success() {
            return Err(output_text(&o));
        }
        Ok(String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// The host address a service's container port is published on.
    fn published(&self, service: &str, port: u16) -> String {
        let addr = self.ok(&["port", service, &port.to_string()]);
        assert!(!addr.is_empty(), "{service}:{port} is not published");
        addr.replace("0.0.0.0", "127.0.0.1")
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Ok(o) = self.cmd(&["logs", "--no-color", "--tail", "60"]).output() {
                eprintln!(
                    "== compose logs (last lines per service)\n{}",
                    output_text(&o)
                );
            }
            if let Ok(o) = self.cmd(&["ps"]).output() {
                eprintln!("{}", output_text(&o));
            }
        }
        let down = self
            .cmd(&["down", "-v", "--remove-orphans", "-t", "5"])
            .output();
        if let Ok(o) = &down {
            if !o.status.success() {
                eprintln!("compose down failed:\n{}", output_text(o));
            }
        }
        let _ = Command::new("docker")
            .args(["rmi", "-f", &self.image])
            .output();
    }
}

/// Runs one phase and says how long it took.
fn phase<T>(name: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let v = f();
    eprintln!("== {name}: {:.1}s", t.elapsed().as_secs_f64());
    v
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The API keys in clear that the init step drew, read from its admin volume.
fn dev_keys(stack: &Stack) -> ClientKeys {
    let text = stack.ok(&[
        "run",
        "--rm",
        "--no-deps",
        "-T",
        "init",
        "cat",
        "/etc/pagewarden/admin/keys.toml",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.toml");
    std::fs::write(&path, text).unwrap();
    ClientKeys::load(&path).expect("the init step's keys.toml parses")
}

/// Waits for the router's `/ready`; fails at once, instead of at the timeout, when a service
/// of the stack has exited or restarted (a misconfigured service crash-loops under
/// `restart: unless-stopped`).
fn wait_ready(stack: &Stack, rt: &tokio::runtime::Runtime, router: &str) {
    let _in_runtime = rt.enter();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let polling = Polling::within(READY_TIMEOUT).every(Duration::from_secs(1));
    let what = format!("the router at {router} to be ready");
    eventually_blocking(polling, &what, || {
        let r = rt.block_on(http.get(format!("{router}/ready")).send());
        if r.as_ref().is_ok_and(|r| r.status().is_success()) {
            return Ok(());
        }
        for service in WORKERS.iter().chain(&["router", "auditor", "postgres"]) {
            let id = stack.ok(&["ps", "-q", service]);
            let state = ok(Command::new("docker").args([
                "inspect",
                "-f",
                "{{.State.Status}} restarts={{.RestartCount}}",
                &id,
            ]));
            assert!(
                state == "running restarts=0",
                "{service} is not running steadily ({state}): see its logs below"
            );
        }
        Err(format!("{r:?}"))
    });
}

async fn post(http: &reqwest::Client, url: String, key: &str, body: Value) -> (u16, Value) {
    let r = http
        .post(&url)
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Completions through the router as two tenants at once, a chat turn, and a made-up key.
async fn completions(router: &str, alice: &str, bob: &str) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(180))
        .build()
        .unwrap();
    let models: Value = http
        .get(format!("{router}/v1/models"))
        .bearer_auth(alice)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let model = models["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        models["data"][0]["max_model_len"], 256,
        "deploy/compose/local/small-worker.toml's context reaches the router: {models}"
    );
    let mut sent = Vec::new();
    for (i, key) in [alice, bob, alice, bob].into_iter().enumerate() {
        let body = json!({
            "model": model,
            "prompt": format!("The capital of France is{}", " really".repeat(i)),
            "max_tokens": 8,
            "temperature": 0.0,
        });
        sent.push(post(&http, format!("{router}/v1/completions"), key, body));
    }
    for (status, body) in futures::future::join_all(sent).await {
        assert_eq!(status, 200, "{body}");
        assert!(
            body["usage"]["completion_tokens"].as_u64() > Some(0),
            "{body}"
        );
        assert!(body["choices"][0]["text"].as_str().is_some(), "{body}");
    }
    let (status, body) = post(
        &http,
        format!("{router}/v1/chat/completions"),
        bob,
        json!({"model": model, "max_tokens": 8, "temperature": 0.0,
               "messages": [{"role": "user", "content": "Say hello."}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["choices"][0]["message"]["content"].is_string(),
        "{body}"
    );
    let (status, body) = post(
        &http,
        format!("{router}/v1/completions"),
        "pw-not-a-key-anyone-was-given-0000",
        json!({"model": model, "prompt": "hi", "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 401, "a made-up key must not get in: {body}");
}

/// Waits for the auditor's own first probe run to end; its status and message.
fn auditor_probe_run(stack: &Stack) -> (String, String, i64) {
    let polling = Polling::within(Duration::from_secs(300)).every(Duration::from_secs(2));
    eventually_blocking(polling, "the auditor's first probe run to end", || {
        let rows =
            stack.sql("SELECT status, started_at, message FROM probe_runs ORDER BY id LIMIT 1");
        if let Some(row) = rows.first() {
            let mut cols = row.splitn(3, '|');
            let status = cols.next().unwrap_or_default().to_string();
            let started: i64 = cols.next().unwrap_or_default().parse().unwrap_or(0);
            let message = cols.next().unwrap_or_default().to_string();
            if status != "running" {
                return Ok((status, message, started));
            }
        }
        Err(format!("{rows:?}"))
    })
}

/// The router's deadline on every request under `deploy/compose/local/small.yml`.
const REQUEST_DEADLINE: Duration = Duration::from_secs(30);
/// How long each fault lasts before it heals.
const FAULT_FOR: Duration = Duration::from_secs(8);

/// What one request of the steady load got.
#[derive(Debug)]
struct Outcome {
    tenant: &'static str,
    /// The fault in force when it was sent.
    during: &'static str,
    status: u16,
    elapsed: Duration,
    text: String,
    error: Value,
}

/// Each tenant's marker, in every prompt it sends: no other tenant's response may hold it.
const MARKERS: [(&str, &str); 2] = [("dev-alice", "ALICEQX"), ("dev-bob", "BOBZV")];

/// A prompt of about 150 tokens that no cached prefix covers (its number comes first).
fn load_prompt(tenant: &str, n: usize) -> String {
    let marker = MARKERS.iter().find(|(t, _)| *t == tenant).unwrap().1;
    format!(
        "Request {n}. {}The capital of France is",
        format!("Note {marker}: keep this note private. ").repeat(12)
    )
}

/// One client sending completions back to back, tagging each with the fault in force, until
/// `stop`; each outcome goes to `out` as it ends.
async fn client(
    router: String,
    tenant: &'static str,
    key: String,
    during: Arc<Mutex<&'static str>>,
    stop: Arc<AtomicBool>,
    out: Arc<Mutex<Vec<Outcome>>>,
) {
    let http = reqwest::Client::builder()
        .timeout(REQUEST_DEADLINE + Duration::from_secs(60))
        .build()
        .unwrap();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let fault = *during.lock().unwrap();
        let t = Instant::now();
        let body = json!({"prompt": load_prompt(tenant, n), "max_tokens": 8, "temperature": 0.0});
        let r = http
            .post(format!("{router}/v1/completions"))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await;
        let (status, v) = match r {
            Ok(r) => {
                // As a client should: a 503 says when to come back (`Retry-After`).
                let status = r.status().as_u16();
                let wait = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
                let v = r.json().await.unwrap_or(Value::Null);
                // Real time, as a real client waits.
                if let (503, Some(secs)) = (status, wait) {
                    tokio::time::sleep(Duration::from_secs(secs.min(5))).await;
                }
                (status, v)
            }
            Err(e) => (0, json!({ "client_error": e.to_string() })),
        };
        out.lock().unwrap().push(Outcome {
            tenant,
            during: fault,
            status,
            elapsed: t.elapsed(),
            text: v["choices"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            error: v["error"].clone(),
        });
    }
}

/// The router's `/health` body.
async fn health(http: &reqwest::Client, router: &str) -> Value {
    match http.get(format!("{router}/health")).send().await {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// Waits until the router sees both workers of each half live again.
async fn wait_all_live(router: &str, what: &str) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let polling = Polling::within(Duration::from_secs(120)).every(Duration::from_millis(500));
    let what = format!("the router to see every worker again after {what}");
    eventually(polling, &what, || async {
        let h = health(&http, router).await;
        if h["live_decode"] == 2 && h["live_prefill"] == 2 {
            Ok(())
        } else {
            Err(h)
        }
    })
    .await
}

/// One series of a worker's `/metrics`, read inside its container (0 when absent), with the
/// metrics token the worker requires (its role's secrets volume holds it).
fn worker_metric(stack: &Stack, service: &str, series: &str) -> f64 {
    let (role, port) = if service.starts_with("decode") {
        ("decode", 7202)
    } else {
        ("prefill", 7102)
    };
    let text = stack.ok(&[
        "exec",
        "-T",
        service,
        "sh",
        "-c",
        &format!(
            "curl -fsS -H \"Authorization: Bearer $(cat /etc/pagewarden/{role}/metrics-token)\" \
             http://127.0.0.1:{port}/metrics"
        ),
    ]);
    text.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The container behind a compose service.
fn container(stack: &Stack, service: &str) -> String {
    stack.ok(&["ps", "-q", service])
}

/// Steady load by 4 clients (2 per tenant) while, one after another: a decode is killed with -9
/// and started again; a prefill hangs (its container frozen) and thaws; a decode is cut off the
/// KV network (partitioned from both prefills, mid-transfer under this load) and joins again.
/// After each, the router must see every worker again. Then: no request outlived the router's
/// deadline by more than the time to answer, every failure was a clean error, no response held
/// the other tenant's marker, every worker served again, and no page of any pool is left
/// quarantined, draining or held.
async fn faults_under_load(stack: &Stack, router: &str, keys: [(&'static str, String); 2]) {
    let during = Arc::new(Mutex::new("steady"));
    let stop = Arc::new(AtomicBool::new(false));
    let ended = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = [0, 1, 0, 1]
        .into_iter()
        .map(|i| {
            let (tenant, key) = keys[i].clone();
            tokio::spawn(client(
                router.to_string(),
                tenant,
                key,
                during.clone(),
                stop.clone(),
                ended.clone(),
            ))
        })
        .collect();
    let set = |what: &'static str| *during.lock().unwrap() = what;
    // A while of load in `phase`: `n` requests sent in it have ended.
    let load_for = |phase: &'static str, n: usize| {
        let ended = ended.clone();
        async move {
            let polling =
                Polling::within(Duration::from_secs(300)).every(Duration::from_millis(500));
            let what = format!("{n} requests {phase}");
            eventually(polling, &what, || async {
                ended
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|o| o.during == phase)
                    .count()
                    >= n
            })
            .await
        }
    };
    load_for("steady", 8).await;

    let kv = format!("{}_kv", stack.project);
    let kv_ip = format!("{}.22", stack.kv_subnet);
    let decode0 = container(stack, "decode-0");
    let prefill0 = container(stack, "prefill-0");
    let decode1 = container(stack, "decode-1");
    // Each fault: what it is, how it starts, how it heals, and what follows.
    type Step<'a> = Box<dyn Fn() + 'a>;
    let faults: [(&'static str, Step, Step, &'static str, &str); 3] = [
        (
            "decode-0 killed",
            Box::new(|| {
                ok(Command::new("docker").args(["kill", "-s", "KILL", &decode0]));
            }),
            // Docker may already have restarted it (restart: unless-stopped); start is a no-op
            // then.
            Box::new(|| {
                stack.ok(&["start", "decode-0"]);
            }),
            "decode-0 restarting",
            "decode-0's restart",
        ),
        (
            "prefill-0 hung",
            Box::new(|| {
                pause(&prefill0);
            }),
            Box::new(|| {
                ok(Command::new("docker").args(["unpause", &prefill0]));
            }),
            "prefill-0 thawed",
            "prefill-0's thaw",
        ),
        (
            "decode-1 partitioned",
            Box::new(|| {
                ok(Command::new("docker").args(["network", "disconnect", &kv, &decode1]));
            }),
            Box::new(|| {
                ok(Command::new("docker")
                    .args(["network", "connect", "--ip", &kv_ip, &kv, &decode1]));
            }),
            "decode-1 rejoined",
            "decode-1's partition",
        ),
    ];
    for (fault, start, heal, healing, what) in faults {
        set(fault);
        start();
        // Real time: a fault lasts as long as an outage would, under the load.
        tokio::time::sleep(FAULT_FOR).await;
        heal();
        set(healing);
        wait_all_live(router, what).await;
    }

    // Healed: a while of steady load, which must all succeed.
    set("healed");
    load_for("healed", 16).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("a load client panicked");
    }
    let outcomes = std::mem::take(&mut *ended.lock().unwrap());

    let mut phases: Vec<&str> = Vec::new();
    for o in &outcomes {
        if !phases.contains(&o.during) {
            phases.push(o.during);
        }
    }
    eprintln!("   load during faults (4 clients, ~150-token prompts, 8 tokens each):");
    for p in &phases {
        let of: Vec<&Outcome> = outcomes.iter().filter(|o| o.during == *p).collect();
        let failed: Vec<&&Outcome> = of.iter().filter(|o| o.status != 200).collect();
        let slowest = of.iter().map(|o| o.elapsed).max().unwrap_or_default();
        eprintln!(
            "     {p:<22} {:>4} requests, {:>3} failed, slowest {:.1}s",
            of.len(),
            failed.len(),
            slowest.as_secs_f64()
        );
        for f in failed.iter().take(3) {
            eprintln!(
                "       {} {} after {:.1}s: {}",
                f.tenant,
                f.status,
                f.elapsed.as_secs_f64(),
                f.error
            );
        }
    }
    for o in &outcomes {
        assert!(
            o.elapsed <= REQUEST_DEADLINE + Duration::from_secs(10),
            "a request hung past the router's deadline: {o:?}"
        );
        if o.status != 200 {
            assert!(
                o.status >= 500 && o.error["message"].is_string(),
                "a failure during a fault was not a clean server error: {o:?}"
            );
        }
        for (tenant, marker) in MARKERS {
            assert!(
                o.tenant == tenant || !o.text.contains(marker),
                "{}'s response holds {tenant}'s marker: {o:?}",
                o.tenant
            );
        }
    }
    let healed: Vec<&Outcome> = outcomes.iter().filter(|o| o.during == "healed").collect();
    assert!(
        !healed.is_empty() && healed.iter().all(|o| o.status == 200),
        "after every fault healed, requests still failed: {:?}",
        healed
            .iter()
            .filter(|o| o.status != 200)
            .collect::<Vec<_>>()
    );
    assert!(
        outcomes.iter().filter(|o| o.status == 200).count() > outcomes.len() / 2,
        "most of the load failed"
    );
    // The restarted decode serves again (its counters began at its restart).
    assert!(
        worker_metric(
            stack,
            "decode-0",
            "pagewarden_requests_total{role=\"decode\",outcome=\"committed\"}"
        ) > 0.0,
        "the router never sent the restarted decode-0 a request"
    );
    // Every reservation ended and every page came back: nothing quarantined or draining.
    let deadline = Instant::now() + Duration::from_secs(60);
    for w in WORKERS {
        let left = deadline.saturating_duration_since(Instant::now());
        let polling = Polling::within(left).every(Duration::from_millis(500));
        let what = format!("{w}: no page held after the faults healed");
        eventually(polling, &what, || async {
            let held: Vec<(&str, f64)> = ["used", "draining", "quarantined"]
                .into_iter()
                .map(|state| {
                    let series = format!(
                        "pagewarden_pool_pages{{role=\"{}\",state=\"{state}\"}}",
                        &w[..w.len() - 2]
                    );
                    (state, worker_metric(stack, w, &series))
                })
                .collect();
            if held.iter().all(|(_, v)| *v == 0.0) {
                Ok(())
            } else {
                Err(format!("{held:?}"))
            }
        })
        .await;
    }
}

/// The auditor's database down for a while: completions keep being served, their samples wait
/// in the router's buffer, and once PostgreSQL is back every one of them is stored, once.
async fn database_outage(stack: &Stack, router: &str, key: &str) {
    let count = || -> i64 {
        stack.sql("SELECT count(*) FROM samples")[0]
            .parse()
            .expect("a count")
    };
    // The load's last samples are still on their way: wait for the count to settle (the same
    // in two reads 2 s apart).
    let mut last = count();
    let polling = Polling::within(Duration::from_secs(120)).every(Duration::from_secs(2));
    let before = eventually(polling, "the sample count to settle", || {
        let now = count();
        let settled = (now == last).then_some(now);
        last = now;
        async move { settled }
    })
    .await;
    stack.ok(&["stop", "-t", "5", "postgres"]);
    let http = reqwest::Client::builder()
        .timeout(REQUEST_DEADLINE + Duration::from_secs(30))
        .build()
        .unwrap();
    const SENT: i64 = 6;
    for n in 0..SENT {
        let (status, body) = post(
            &http,
            format!("{router}/v1/completions"),
            key,
            json!({"prompt": format!("While the database is down, {n}"), "max_tokens": 4}),
        )
        .await;
        assert_eq!(
            status, 200,
            "serving must not need the auditor's database: {body}"
        );
    }
    // Real time: the database stays down a while after the completions, as in an outage.
    tokio::time::sleep(Duration::from_secs(5)).await;
    stack.ok(&["start", "postgres"]);
    let polling = Polling::within(Duration::from_secs(90)).every(Duration::from_secs(1));
    let what = "the samples sent while the database was down";
    eventually(polling, what, || async {
        // The database may still be starting up: no count yet, ask again.
        let now = stack
            .try_sql("SELECT count(*) FROM samples")
            .ok()
            .and_then(|rows| rows.first().and_then(|c| c.parse::<i64>().ok()));
        assert!(
            now.is_none_or(|n| n < before + SENT) || now == Some(before + SENT),
            "more samples than were sent: {now:?} > {before} + {SENT}"
        );
        if now == Some(before + SENT) {
            Ok(())
        } else {
            Err(format!("{now:?} of {before} + {SENT}"))
        }
    })
    .await;
}

/// `pagewarden probe` (this build's binary, from the host) as both dev tenants: it must pass.
fn probe(router: &str, alice: &str, bob: &str, model: &Path) {
    let out = Command::new(bin("pagewarden"))
        .env("RUST_BACKTRACE", "0")
        .args(["probe", "--router", router, "--timeout-s", "120"])
        .args(["--key", &format!("dev-alice={alice}")])
        .args(["--key", &format!("dev-bob={bob}")])
        .arg("--model")
        .arg(model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pagewarden probe failed:\n{}",
        output_text(&out)
    );
    // One row per tenant and step, each printed once (the second tenant's steps sort between
    // the first's in the store: a printer that skipped by count printed the first's last row
    // again for each of them).
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<(&str, &str)> = stdout
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next()) {
                (Some(t @ ("dev-alice" | "dev-bob")), Some(step)) => Some((t, step)),
                _ => None,
            }
        })
        .collect();
    let distinct: std::collections::BTreeSet<_> = rows.iter().collect();
    assert_eq!(
        distinct.len(),
        rows.len(),
        "a step printed twice:\n{stdout}"
    );
    assert!(
        rows.iter().any(|r| r.0 == "dev-bob"),
        "no row of the second tenant:\n{stdout}"
    );
}

#[test]
fn the_compose_stack_serves_probes_clean_and_logs_no_false_incident() {
    let model = model_path();
    assert_eq!(
        model.file_name().and_then(|n| n.to_str()),
        Some(MODEL_FILE),
        "the compose file serves {MODEL_FILE}; PAGEWARDEN_MODEL names another file"
    );
    let models_dir: PathBuf = model.parent().unwrap().canonicalize().unwrap();
    for b in [
        "pagewarden",
        "pagewarden-router",
        "pagewarden-prefill",
        "pagewarden-decode",
        "pagewarden-auditor",
    ] {
        bin(b);
    }
    let program = compose_program();
    let root = repo();
    let script = |name: &str| -> PathBuf { root.join("scripts").join(name) };
    let base = phase(
        "base image (debootstrap + docker import, or cached)",
        || ok(&mut Command::new(script("compose-base.sh"))),
    );
    eprintln!("   base: {base}");
    let id = format!("{}-{}", std::process::id(), unix_ms() % 1_000_000);
    let image = format!("pagewarden-local:test-{id}");
    let project = format!("pwcompose{}", id.replace('-', ""));
    let kv_subnet = format!("172.29.{}", 40 + std::process::id() % 200);
    // Created before the build so that the image goes even if a later step fails.
    let stack = Stack {
        program,
        project,
        kv_subnet: kv_subnet.clone(),
        image: image.clone(),
        env: vec![
            ("PAGEWARDEN_LOCAL_IMAGE".into(), image.clone()),
            ("PAGEWARDEN_MODELS".into(), models_dir.display().to_string()),
            // A subnet of its own and host ports Docker picks: no clash with a suite of
            // someone else's on this host.
            (
                "PAGEWARDEN_SUBNET".into(),
                format!("172.28.{}", 40 + std::process::id() % 200),
            ),
            ("PAGEWARDEN_KV_SUBNET".into(), kv_subnet),
            ("PAGEWARDEN_ROUTER_PORT".into(), "0".into()),
            ("PAGEWARDEN_AUDITOR_PORT".into(), "0".into()),
            ("RUST_LOG".into(), "info".into()),
        ],
    };
    phase("service image (host binaries on the base)", || {
        ok(Command::new(script("compose-images.sh"))
            .arg("--bin-dir")
            .arg(bin_dir())
            .args(["--tag", &image]))
    });
    let up_at = unix_ms();
    phase(
        "compose up (postgres, init, auditor and 4 workers healthy, router started)",
        || stack.ok(&["up", "-d", "--no-build"]),
    );
    let router = format!("http://{}", stack.published("router", 8080));
    let keys = dev_keys(&stack);
    let (alice, bob) = (
        keys.key_of("dev-alice")
            .expect("a dev-alice key")
            .to_string(),
        keys.key_of("dev-bob").expect("a dev-bob key").to_string(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    phase("router ready", || wait_ready(&stack, &rt, &router));
    phase("completions through the router", || {
        rt.block_on(completions(&router, &alice, &bob))
    });
    phase("pagewarden probe", || probe(&router, &alice, &bob, &model));
    let (status, message, started) = phase("the auditor's own first probe run", || {
        auditor_probe_run(&stack)
    });
    assert_eq!(status, "passed", "the auditor's probe run: {message}");
    assert!(
        started >= up_at,
        "a probe run from before this stack started?"
    );
    // Workers report their preflight as they start, before the router (which waits for them)
    // can be ready: an auditor probing before the router was ready would have started earlier.
    let last_worker: i64 = stack.sql("SELECT max(at) FROM preflight_reports")[0]
        .parse()
        .expect("preflight reports");
    assert!(
        started >= last_worker,
        "the auditor probed at {started}, before the last worker started ({last_worker})"
    );
    phase("the auditor's records in PostgreSQL", || {
        let incidents = stack.sql("SELECT kind || ' ' || details FROM incidents");
        assert!(
            incidents.is_empty(),
            "the auditor logged incidents: {incidents:#?}"
        );
        let nodes =
            stack.sql("SELECT DISTINCT node FROM preflight_reports WHERE ok = 1 ORDER BY node");
        let mut want: Vec<&str> = WORKERS.to_vec();
        want.sort();
        assert_eq!(
            nodes, want,
            "every worker's preflight report reached the auditor"
        );
        // Samples travel in the background: give the last ones a moment.
        let polling = Polling::within(Duration::from_secs(30)).every(Duration::from_millis(500));
        let what = "the router's samples of the completions at the auditor";
        eventually_blocking(polling, what, || {
            let tenants = stack.sql("SELECT DISTINCT tenant FROM samples ORDER BY tenant");
            let seen = ["dev-alice", "dev-bob"]
                .iter()
                .all(|t| tenants.iter().any(|s| s == t));
            if seen {
                Ok(())
            } else {
                Err(format!("{tenants:?}"))
            }
        });
    });
    phase(
        "faults under load: decode kill -9, prefill hang, KV partition",
        || {
            rt.block_on(faults_under_load(
                &stack,
                &router,
                [("dev-alice", alice.clone()), ("dev-bob", bob.clone())],
            ))
        },
    );
    phase("the auditor's database down, then back", || {
        rt.block_on(database_outage(&stack, &router, &bob))
    });
    phase("pagewarden probe, after the faults", || {
        probe(&router, &alice, &bob, &model)
    });
    // What the faults may show the auditor: writes refused under a grant that a timeout
    // revoked, pages set aside until their stream ended, and a transfer connection that the
    // frozen prefill opened but could not finish within decode's handshake deadline (reported
    // as a refusal, docs/security.md). Never a marker across tenants, a corrupt page, another
    // refusal or a probe that failed.
    let incidents = stack
        .sql("SELECT kind, details, count(*) FROM incidents GROUP BY kind, details ORDER BY kind");
    eprintln!("   the auditor's incidents after the faults: {incidents:?}");
    for row in &incidents {
        let mut cols = row.split('|');
        let (kind, details) = (
            cols.next().unwrap_or_default(),
            cols.next().unwrap_or_default(),
        );
        let frozen_handshake = kind == "stale_message"
            && details.ends_with(&format!(": {}", RefusedReason::HandshakeTimeout));
        assert!(
            ["write_rejected", "quarantine", "deferred_release_timed_out"].contains(&kind)
                || frozen_handshake,
            "the faults led to a {kind} incident: {incidents:?}"
        );
    }
    // The recompute audit scored the routers' 5% sample (how many is chance): every one
    // matched, faults and all.
    let recomputes =
        stack.sql("SELECT verdict, count(*) FROM recomputes GROUP BY verdict ORDER BY verdict");
    eprintln!("   the recompute audit's verdicts: {recomputes:?}");
    assert!(
        recomputes.iter().all(|r| r.starts_with("match|")),
        "{recomputes:?}"
    );
    phase("compose down (volumes, network, image)", || drop(stack));
}
