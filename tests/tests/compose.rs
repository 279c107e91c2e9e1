//! The compose file, run for real (issue 18). Builds the images here from the binaries this
//! build made, on a base made from Debian's packages (`scripts/compose-images.sh`, which calls
//! `scripts/compose-base.sh`: debootstrap from the host's own apt mirror, `docker import`,
//! cached by a content tag), starts `compose/docker-compose.yml` with the overrides in
//! `compose/local/` (local images instead of public ones, small workers), and on that one
//! stack:
//!
//! - the `init` service drew the keys: a dev tenant's key from its admin volume opens the
//!   router, a made-up one does not, and completions (plain and chat) come back;
//! - `pagewarden probe` (this build's binary, from the host) sweeps the router clean;
//! - the auditor's own first probe run, which waits for the router, passes;
//! - PostgreSQL, read directly, holds no incident, a preflight report from each of the four
//!   workers and the router's samples of the completions (all over mutual TLS).
//!
//! The stack, its volumes, network and the image built for this run are removed at the end,
//! failure included (the base image stays, cached by its tag). Needs Docker with Compose
//! (`docker compose` or `docker-compose`) and debootstrap (`scripts/test.sh` installs it);
//! fails, never skips, without them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pagewarden_common::tenants::ClientKeys;
use pagewarden_system_tests::{bin, bin_dir, model_path};
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
    env: Vec<(String, String)>,
    image: String,
}

impl Stack {
    fn cmd(&self, args: &[&str]) -> Command {
        let dir = repo().join("compose");
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
        self.ok(&[
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
        .lines()
        .map(str::to_string)
        .collect()
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
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let r = rt.block_on(http.get(format!("{router}/ready")).send());
        if r.as_ref().is_ok_and(|r| r.status().is_success()) {
            return;
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
        assert!(
            Instant::now() < deadline,
            "the router at {router} was not ready within {READY_TIMEOUT:?}: {r:?}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
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
        "compose/local/small-worker.toml's context reaches the router: {models}"
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
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let rows =
            stack.sql("SELECT status, started_at, message FROM probe_runs ORDER BY id LIMIT 1");
        if let Some(row) = rows.first() {
            let mut cols = row.splitn(3, '|');
            let status = cols.next().unwrap_or_default().to_string();
            let started: i64 = cols.next().unwrap_or_default().parse().unwrap_or(0);
            let message = cols.next().unwrap_or_default().to_string();
            if status != "running" {
                return (status, message, started);
            }
        }
        assert!(
            Instant::now() < deadline,
            "the auditor's first probe run did not end within 300s: {rows:?}"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
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
    // Created before the build so that the image goes even if a later step fails.
    let stack = Stack {
        program,
        project,
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
    phase("pagewarden probe", || {
        let out = Command::new(bin("pagewarden"))
            .env("RUST_BACKTRACE", "0")
            .args(["probe", "--router", &router, "--timeout-s", "120"])
            .args(["--key", &format!("dev-alice={alice}")])
            .args(["--key", &format!("dev-bob={bob}")])
            .arg("--model")
            .arg(&model)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pagewarden probe failed:\n{}",
            output_text(&out)
        );
    });
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
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let tenants = stack.sql("SELECT DISTINCT tenant FROM samples ORDER BY tenant");
            let seen = ["dev-alice", "dev-bob"]
                .iter()
                .all(|t| tenants.iter().any(|s| s == t));
            if seen {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the router's samples of the completions never reached the auditor: {tenants:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    phase("compose down (volumes, network, image)", || drop(stack));
}
