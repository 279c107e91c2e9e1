//! `pagewarden up` as a user runs it: started in a directory of the test's, its banner read
//! (the API's URL, the dev tenants' keys, the auditor's URL and read-only token), its children
//! found through `/proc`, and stopped with SIGTERM (then SIGKILL) when dropped.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pagewarden_testkit::poll_until_blocking;

use crate::{bin, model_path};

/// How long `up` may take to print its whole banner (it starts four services).
const BANNER_TIMEOUT: Duration = Duration::from_secs(300);

/// The running `up`; stopped with SIGTERM (then SIGKILL) when dropped.
pub struct Up {
    child: Child,
    /// The OpenAI-compatible API's base URL (without `/v1`).
    pub api: String,
    /// The dev tenants' API keys by tenant name (`dev-alice`, `dev-bob`).
    pub keys: BTreeMap<String, String>,
    /// The auditor UI's base URL.
    pub auditor: String,
    /// The read-only API token of the auditor the banner prints.
    pub viewer_token: String,
}

impl Up {
    /// `up` run in `cwd` on the test model, with no `--dir` (its state goes to `cwd/.pw`),
    /// no probes, both listeners on port 0, and `extra` flags.
    pub fn start(cwd: &Path, extra: &[&str]) -> Up {
        let mut child = Command::new(bin("pagewarden"))
            .current_dir(cwd)
            .env("RUST_LOG", "info")
            .env_remove("PAGEWARDEN_MODEL")
            .args(["up", "--no-build", "--probe-interval", "0s"])
            .args([
                "--router-addr",
                "127.0.0.1:0",
                "--auditor-addr",
                "127.0.0.1:0",
            ])
            .arg("--model")
            .arg(model_path())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting pagewarden up");
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("up| {line}");
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let deadline = Instant::now() + BANNER_TIMEOUT;
        let (mut api, mut keys) = (None, BTreeMap::new());
        let (mut auditor, mut viewer_token) = (None, None);
        while api.is_none() || keys.len() < 2 || auditor.is_none() || viewer_token.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(l) => l,
                Err(_) => {
                    let _ = child.kill();
                    panic!("`pagewarden up` printed no banner within {BANNER_TIMEOUT:?}");
                }
            };
            if let Some(url) = line.trim().strip_prefix("API (OpenAI-compatible):") {
                api = Some(url.trim().trim_end_matches("/v1").to_string());
            }
            if let Some(url) = line.trim().strip_prefix("auditor UI:") {
                auditor = Some(url.trim().trim_end_matches('/').to_string());
            }
            if let Some(rest) = line.trim().strip_prefix("read-only API token:") {
                viewer_token = rest.split_whitespace().next().map(str::to_string);
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            if let [tenant @ ("dev-alice" | "dev-bob"), key] = words[..] {
                keys.insert(tenant.to_string(), key.to_string());
            }
        }
        // Keep draining stdout so that `up` never blocks on a full pipe.
        std::thread::spawn(move || while rx.recv().is_ok() {});
        Up {
            child,
            api: api.expect("api"),
            keys,
            auditor: auditor.expect("auditor"),
            viewer_token: viewer_token.expect("viewer token"),
        }
    }

    /// `up`'s own pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `up`'s children by program name (`pagewarden-prefill`, ...).
    pub fn children(&self) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // `pid (comm) state ppid ...`: comm may hold spaces, so split after its ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid != Some(self.pid())
                || stat
                    .rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            {
                continue;
            }
            let argv0 = cmdline(pid).into_iter().next().unwrap_or_default();
            if let Some(name) = Path::new(&argv0).file_name().and_then(|n| n.to_str()) {
                out.insert(name.to_string(), pid);
            }
        }
        out
    }

    /// The model the router serves and its context length, as `/v1/models` names them.
    pub async fn served_model(&self, http: &reqwest::Client) -> (String, usize) {
        let key = self.keys.values().next().expect("a dev key");
        let models: serde_json::Value = http
            .get(format!("{}/v1/models", self.api))
            .bearer_auth(key)
            .send()
            .await
            .expect("/v1/models")
            .json()
            .await
            .expect("/v1/models json");
        let model = &models["data"][0];
        (
            model["id"].as_str().expect("a served model").to_string(),
            model["max_model_len"]
                .as_u64()
                .expect("the served model's max_model_len") as usize,
        )
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        send_signal(self.pid(), "TERM");
        let exited = poll_until_blocking(Duration::from_secs(45), || {
            self.child.try_wait().ok().flatten()
        });
        if exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A process's command line (empty when it is gone).
pub fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Sends `signal` (`TERM`, `KILL`, ...) to `pid`; a process already gone is not an error.
pub fn send_signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status();
}
