//! Helpers for tests that start the real Pagewarden binaries on 127.0.0.1.
//!
//! - `lib.rs` (this file): locating binaries, starting a service with port 0 and parsing its
//!   `listening` line, killing it on drop; the reference-json and model locations.
//! - `driver.rs`: a client that drives decode + prefill over gRPC the way the router does.
//! - `reference.rs`: single-process greedy outputs from `pagewarden_model::Engine`.
//! - `prompts.rs`: long, marked prompts a small model continues with their marker.
//! - `up.rs`: `pagewarden up` as a user runs it, its banner read.
#![warn(missing_docs)]

pub mod driver;
pub mod prompts;
pub mod reference;
pub mod up;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a service may take to print its listening line (the real model loads in a second).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The directory holding the workspace's binaries: the test executable lives in
/// `target/<profile>/deps/`, the binaries in `target/<profile>/`.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable has a grandparent directory")
        .to_path_buf()
}

/// Path of a workspace binary; panics with the build command when it is missing.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "binary {} not found: run `cargo build --workspace --bins` first",
        p.display()
    );
    p
}

/// Where `scripts/build-switched.sh` puts the binaries built with the TEST-ONLY defense
/// switches (feature `unsafe-test-switches`), beside the normal ones: `target/<profile>/` +
/// this.
pub const SWITCHED_DIR: &str = "unsafe-test-switches";

/// Path of a workspace binary built with the defense switches; panics with the build command
/// when it is missing.
pub fn switched_bin(name: &str) -> PathBuf {
    let p = bin_dir().join(SWITCHED_DIR).join(name);
    assert!(
        p.exists(),
        "switched binary {} not found: run `scripts/build-switched.sh` first (it builds \
         pagewarden-router, -prefill and -decode with --features \
         pagewarden-router/unsafe-test-switches,pagewarden-prefill/unsafe-test-switches,\
         pagewarden-decode/unsafe-test-switches and copies them there)",
        p.display()
    );
    p
}

/// The real model (env `PAGEWARDEN_MODEL`); panics with a clear message when missing.
pub fn model_path() -> PathBuf {
    let p = std::env::var_os("PAGEWARDEN_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(
        p.exists(),
        "model file {} not found: set PAGEWARDEN_MODEL (`cargo run -p pagewarden -- fetch smollm2` downloads it)",
        p.display()
    );
    p
}

/// Gemma 3 270M (env `PAGEWARDEN_GEMMA_MODEL`); panics with a clear message when missing.
pub fn gemma_model_path() -> PathBuf {
    let p = std::env::var_os("PAGEWARDEN_GEMMA_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("models/gemma-3-270m-q4_k_m.gguf"));
    assert!(
        p.exists(),
        "model file {} not found: set PAGEWARDEN_GEMMA_MODEL (`cargo run -p pagewarden -- \
         fetch gemma3-270m` downloads it)",
        p.display()
    );
    p
}

/// The reference json (env `PAGEWARDEN_REFERENCE`, default `tests/data/reference/...`).
pub fn reference_path() -> PathBuf {
    let p = std::env::var_os("PAGEWARDEN_REFERENCE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            workspace_root().join("tests/data/reference/smollm2-135m-instruct-q4_1.json")
        });
    assert!(
        p.exists(),
        "reference json {} not found: set PAGEWARDEN_REFERENCE",
        p.display()
    );
    p
}

/// The workspace root (parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// A running service; killed when dropped.
pub struct Service {
    child: Child,
    /// `key=value` pairs of its listening line (`grpc`, `metrics`, `transfer`, `http`).
    pub addrs: HashMap<String, String>,
    /// Every stdout line after the listening line is dropped; stderr goes to the test's stderr.
    pub name: String,
    /// Files the service reads (kept until it is dropped).
    pub files: Option<tempfile::TempDir>,
}

impl Service {
    /// Starts `binary` with `args` and waits for `"<binary> listening k=v ..."` on stdout.
    pub fn start(binary: &str, args: &[String]) -> Service {
        Self::try_start(binary, args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`Service::start`], returning the failure (exit status and stderr tail) instead.
    pub fn try_start(binary: &str, args: &[String]) -> Result<Service, String> {
        Self::try_start_program(&bin(binary), binary, args, &[])
    }

    /// Starts the switched build of `binary` ([`switched_bin`]) with `env` added to its
    /// environment, and waits for its listening line.
    pub fn start_switched(binary: &str, args: &[String], env: &[(&str, &str)]) -> Service {
        Self::try_start_program(&switched_bin(binary), binary, args, env)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts `program`, which prints `"<binary> listening ..."`, with `env` added.
    fn try_start_program(
        program: &Path,
        binary: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<Service, String> {
        let mut child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {binary}: {e}"))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        let prefix = format!("{binary} listening ");
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if !sent {
                    if let Some(rest) = line.strip_prefix(&prefix) {
                        let _ = tx.send(rest.to_string());
                        sent = true;
                    }
                }
            }
        });
        let (etx, erx) = mpsc::channel::<String>();
        let tag = binary.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[{tag}] {line}");
                let _ = etx.send(line);
            }
        });
        match rx.recv_timeout(START_TIMEOUT) {
            Ok(rest) => {
                let addrs = rest
                    .split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                Ok(Service {
                    child,
                    addrs,
                    name: binary.to_string(),
                    files: None,
                })
            }
            Err(_) => {
                let status = child.wait_timeout_or_kill();
                // The child is gone: read its stderr to the end (the reader thread may not have
                // passed on the last lines yet, and they say why it stopped).
                let mut err = Vec::new();
                while let Ok(line) = erx.recv_timeout(Duration::from_secs(5)) {
                    err.push(line);
                }
                Err(format!(
                    "{binary} did not print its listening line (exit: {status:?}); stderr:\n{}",
                    err.join("\n")
                ))
            }
        }
    }

    /// `http://` URL of the service's gRPC address.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.addrs["grpc"])
    }

    /// `http://` URL of the router's HTTP address.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.addrs["http"])
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.addrs["metrics"]);
        reqwest::get(&url)
            .await
            .and_then(|r| r.error_for_status())
            .unwrap_or_else(|e| panic!("{} metrics: {e}", self.name))
            .text()
            .await
            .expect("metrics body")
    }

    /// One sample of `/metrics` (0 when absent).
    pub async fn metric(&self, series: &str) -> f64 {
        pagewarden_common::metrics::sample_value(&self.metrics().await, series).unwrap_or(0.0)
    }

    /// Kills the process at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (a `kill -s` name: `TERM`, `STOP`, `CONT`, ...) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args(["-s", signal, &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -s {signal} {} failed", self.pid());
    }

    /// Waits up to `within` for the process to exit; `None` if it is still running.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        pagewarden_testkit::poll_until_blocking(within, || self.child.try_wait().ok().flatten())
    }

    /// One sample of the router's own `/metrics` (served on its HTTP address; 0 when absent).
    pub async fn http_metric(&self, series: &str) -> f64 {
        let text = reqwest::get(format!("{}/metrics", self.http_url()))
            .await
            .and_then(|r| r.error_for_status())
            .unwrap_or_else(|e| panic!("{} /metrics: {e}", self.name))
            .text()
            .await
            .expect("metrics body");
        pagewarden_common::metrics::sample_value(&text, series).unwrap_or(0.0)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

trait WaitOrKill {
    fn wait_timeout_or_kill(&mut self) -> Option<std::process::ExitStatus>;
}

impl WaitOrKill for Child {
    fn wait_timeout_or_kill(&mut self) -> Option<std::process::ExitStatus> {
        let exited = pagewarden_testkit::poll_until_blocking(Duration::from_secs(1), || {
            self.try_wait().ok().flatten()
        });
        exited.or_else(|| {
            let _ = self.kill();
            self.wait().ok()
        })
    }
}

/// Flags for a worker on loopback with every port 0.
pub fn worker_args(model: &ModelArg, extra: &[&str]) -> Vec<String> {
    worker_args_on("127.0.0.1:0", model, extra)
}

/// Flags for a worker whose gRPC listens on `grpc` (a restart on its old address), its other
/// listeners on port 0.
pub fn worker_args_on(grpc: &str, model: &ModelArg, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "--grpc-addr",
        grpc,
        "--metrics-addr",
        "127.0.0.1:0",
        "--transfer-addr",
        "127.0.0.1:0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(model.flags());
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Which model a worker runs.
#[derive(Debug, Clone, Copy)]
pub enum ModelArg {
    /// The real model from `PAGEWARDEN_MODEL`.
    Real,
    /// Gemma 3 270M from `PAGEWARDEN_GEMMA_MODEL` (K-quants, BOS, sliding-window layers).
    Gemma,
    /// The seeded tiny test model.
    Tiny(u64),
}

impl ModelArg {
    /// The command-line flags that make a service load this model.
    pub fn flags(&self) -> [String; 2] {
        match self {
            ModelArg::Real => ["--model".into(), model_path().display().to_string()],
            ModelArg::Gemma => ["--model".into(), gemma_model_path().display().to_string()],
            ModelArg::Tiny(seed) => ["--tiny-test-model".into(), seed.to_string()],
        }
    }
}

/// Starts a decode worker.
pub fn start_decode(model: &ModelArg, extra: &[&str]) -> Service {
    Service::start("pagewarden-decode", &worker_args(model, extra))
}

/// Starts a prefill worker.
pub fn start_prefill(model: &ModelArg, extra: &[&str]) -> Service {
    Service::start("pagewarden-prefill", &worker_args(model, extra))
}

/// Starts an auditor with its SQLite database in `dir`, both listeners on port 0, and no
/// scheduled canary sweep.
pub fn start_auditor(dir: &Path) -> Service {
    start_auditor_with(dir, &[])
}

/// The operator token of the JSON API of auditors started by [`start_auditor_with`].
pub const AUDITOR_TOKEN: &str = "pw-system-test-auditor-token";

/// Like [`start_auditor`], with `extra` flags (TLS); writes `dir/auditor.toml` granting
/// [`AUDITOR_TOKEN`] (stored as its SHA-256) the operator role.
pub fn start_auditor_with(dir: &Path, extra: &[String]) -> Service {
    std::fs::create_dir_all(dir).expect("auditor dir");
    let config = dir.join("auditor.toml");
    let hash = pagewarden_common::secret::SecretHash::of(AUDITOR_TOKEN);
    std::fs::write(
        &config,
        format!("[[api_tokens]]\nname = \"system-tests\"\nrole = \"operator\"\ntoken_sha256 = \"{hash}\"\n"),
    )
    .expect("write auditor config");
    let mut args: Vec<String> = [
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
        "--probe-interval",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend([
        "--config".into(),
        config.display().to_string(),
        "--data-dir".into(),
        dir.display().to_string(),
        "--database-url".into(),
        format!("sqlite://{}/auditor.sqlite?mode=rwc", dir.display()),
    ]);
    args.extend(extra.iter().cloned());
    Service::start("pagewarden-auditor", &args)
}

/// GETs `path` from a service's HTTP listener as JSON (with [`AUDITOR_TOKEN`], which the
/// auditor's API needs and other services ignore); panics on any failure.
pub async fn get_json(service: &Service, path: &str) -> serde_json::Value {
    reqwest::Client::new()
        .get(format!("{}{path}", service.http_url()))
        .bearer_auth(AUDITOR_TOKEN)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        .json()
        .await
        .expect("json body")
}

async fn post(
    router: &Service,
    path: &str,
    tenant: usize,
    body: &serde_json::Value,
) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}{path}", router.http_url()))
        .bearer_auth(api_key(tenant))
        .json(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

/// POSTs `body` to `path` on a router as tenant `tenant-N`: the status and the JSON body.
pub async fn post_json(
    router: &Service,
    path: &str,
    tenant: usize,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = post(router, path, tenant, body).await;
    let status = r.status().as_u16();
    (status, r.json().await.expect("json body"))
}

/// POSTs a streaming request (`body` as sent) to `path` on a router as tenant `tenant-N`:
/// the JSON of every `data:` event before `[DONE]`; panics unless 200 without error events.
pub async fn post_sse(
    router: &Service,
    path: &str,
    tenant: usize,
    body: &serde_json::Value,
) -> Vec<serde_json::Value> {
    let r = post(router, path, tenant, body).await;
    assert_eq!(r.status().as_u16(), 200, "POST {path} (stream)");
    let text = r.text().await.expect("sse body");
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .take_while(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("sse json"))
        .collect();
    for v in &events {
        assert!(v.get("error").is_none(), "stream error: {v}");
    }
    events
}

/// The API key of tenant `tenant-N` in routers started by [`start_router`].
pub fn api_key(n: usize) -> String {
    format!("test-key-{n}")
}

/// Writes a tenants file at `path`: tenants `tenant-0..n` with [`api_key`] (as its SHA-256).
pub fn write_tenants(path: &Path, n: usize) {
    use pagewarden_common::secret::SecretHash;
    let mut toml = String::new();
    for i in 0..n {
        toml.push_str(&format!(
            "[[tenants]]\nname = \"tenant-{i}\"\nkey_sha256 = [\"{}\"]\n",
            SecretHash::of(&api_key(i))
        ));
    }
    std::fs::write(path, toml).expect("write tenants");
}

/// Starts a router serving model name `m` over the given workers (tenants `tenant-0..3` with [`api_key`]) and waits
/// until `/health` reports every half live.
pub async fn start_router(
    model: &ModelArg,
    decodes: &[&Service],
    prefills: &[&Service],
) -> Service {
    start_router_with(model, decodes, prefills, &[]).await
}

/// Like [`start_router`], with `extra` router flags (`--max-concurrency 1`, `--auditor URL`).
pub async fn start_router_with(
    model: &ModelArg,
    decodes: &[&Service],
    prefills: &[&Service],
    extra: &[&str],
) -> Service {
    start_router_program(model, decodes, prefills, extra, None).await
}

/// Like [`start_router_with`], the switched build ([`switched_bin`]) with `env` added.
pub async fn start_switched_router(
    model: &ModelArg,
    decodes: &[&Service],
    prefills: &[&Service],
    extra: &[&str],
    env: &[(&str, &str)],
) -> Service {
    start_router_program(model, decodes, prefills, extra, Some(env)).await
}

async fn start_router_program(
    model: &ModelArg,
    decodes: &[&Service],
    prefills: &[&Service],
    extra: &[&str],
    switched: Option<&[(&str, &str)]>,
) -> Service {
    let dir = tempfile::tempdir().expect("tempdir");
    let tenants = dir.path().join("tenants.toml");
    write_tenants(&tenants, 4);
    let mut args: Vec<String> = vec![
        "--http-addr".into(),
        "127.0.0.1:0".into(),
        "--tenants".into(),
        tenants.display().to_string(),
        "--served-model-name".into(),
        "m".into(),
    ];
    // A flag given twice is an error: `extra` may choose its own poll interval.
    if !extra.contains(&"--info-interval") {
        args.extend(["--info-interval".into(), "200ms".into()]);
    }
    args.extend(model.flags());
    for d in decodes {
        args.extend(["--decode".into(), d.grpc_url()]);
    }
    for p in prefills {
        args.extend(["--prefill".into(), p.grpc_url()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut router = match switched {
        None => Service::start("pagewarden-router", &args),
        Some(env) => Service::start_switched("pagewarden-router", &args, env),
    };
    router.files = Some(dir);
    let url = format!("{}/health", router.http_url());
    pagewarden_testkit::eventually(START_TIMEOUT, "the router's /health", || async {
        reqwest::get(&url)
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    router
}
