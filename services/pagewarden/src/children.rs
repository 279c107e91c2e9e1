//! Child services: start a binary, read its one start line (`<name> listening k=v ...`), keep
//! its last stderr lines for the post-mortem, log everything to a file, and stop it with
//! SIGTERM, a grace period, then SIGKILL.
//!
//! Children run in their own process group, so a terminal's Ctrl-C reaches only the launcher,
//! which then stops them in reverse start order; on Linux each child also gets SIGTERM if the
//! launcher dies without cleaning up (`PR_SET_PDEATHSIG`).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// Lines of stderr kept per child.
const TAIL_LINES: usize = 20;

/// What to start.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Short name (`router`, `decode`, ...).
    pub name: String,
    /// The binary.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
}

/// The `k=v` pairs of a start line.
pub type Listening = BTreeMap<String, String>;

/// Parses `<binary> listening k=v k=v`; `None` for any other line.
pub fn parse_listening(line: &str) -> Option<Listening> {
    let mut words = line.split_whitespace();
    words.next()?;
    if words.next()? != "listening" {
        return None;
    }
    Some(
        words
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// One running child.
pub struct Running {
    /// Short name.
    pub name: String,
    /// The parsed start line.
    pub listening: Listening,
    /// The log file holding its stdout and stderr.
    pub log: PathBuf,
    /// What it was started from (a restart starts it again).
    pub spec: Spec,
    child: Child,
    tail: Arc<Mutex<VecDeque<String>>>,
}

fn push_tail(tail: &Mutex<VecDeque<String>>, line: &str) {
    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
    if t.len() == TAIL_LINES {
        t.pop_front();
    }
    t.push_back(line.to_string());
}

/// Starts `spec`, writing its output to `log_dir/<name>.log`, and waits up to `timeout` for its
/// start line. On failure the error carries the child's last stderr lines.
pub async fn start(spec: &Spec, log_dir: &Path, timeout: Duration) -> anyhow::Result<Running> {
    start_logging(spec, log_dir, timeout, false).await
}

/// Like [`start`]; `append` keeps what the log file already holds (a restarted child's log
/// follows its earlier life's).
pub async fn start_logging(
    spec: &Spec,
    log_dir: &Path,
    timeout: Duration,
    append: bool,
) -> anyhow::Result<Running> {
    std::fs::create_dir_all(log_dir)?;
    let log_path = log_dir.join(format!("{}.log", spec.name));
    let log = tokio::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(&log_path)
        .await
        .with_context(|| format!("creating {}", log_path.display()))?;
    let log = Arc::new(tokio::sync::Mutex::new(log));
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .envs(spec.env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", spec.program.display()))?;
    let tail = Arc::new(Mutex::new(VecDeque::new()));

    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| anyhow!("no stderr pipe"))?;
    let (t, l) = (tail.clone(), log.clone());
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            push_tail(&t, &line);
            let _ = l
                .lock()
                .await
                .write_all(format!("{line}\n").as_bytes())
                .await;
        }
    });

    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout pipe"))?;
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(found) = parse_listening(&line) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(found);
                }
            }
            let _ = log
                .lock()
                .await
                .write_all(format!("{line}\n").as_bytes())
                .await;
        }
    });

    let mut running = Running {
        name: spec.name.clone(),
        listening: Listening::new(),
        log: log_path,
        spec: spec.clone(),
        child,
        tail,
    };
    tokio::select! {
        found = rx => match found {
            Ok(l) => {
                running.listening = l;
                Ok(running)
            }
            Err(_) => {
                let status = running.child.wait().await.ok();
                Err(running.failure(status, "exited before printing its start line").await)
            }
        },
        status = running.child.wait() => {
            Err(running.failure(status.ok(), "exited before printing its start line").await)
        }
        _ = tokio::time::sleep(timeout) => {
            let msg = format!("printed no start line within {}s", timeout.as_secs());
            let _ = running.stop(Duration::from_secs(5)).await;
            Err(running.failure(None, &msg).await)
        }
    }
}

impl Running {
    /// The `k` field of the start line.
    pub fn addr(&self, k: &str) -> anyhow::Result<&str> {
        self.listening
            .get(k)
            .map(String::as_str)
            .ok_or_else(|| anyhow!("{}'s start line has no {k}=", self.name))
    }

    /// The child's process id (`None` once it was reaped).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The last stderr lines.
    pub fn tail(&self) -> Vec<String> {
        let t = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        t.iter().cloned().collect()
    }

    /// An error naming the child, what happened, and its last stderr lines.
    pub async fn failure(&self, status: Option<ExitStatus>, what: &str) -> anyhow::Error {
        // Let the stderr reader catch up with what the child wrote before it died.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let status = status.map(|s| format!(" ({s})")).unwrap_or_default();
        let mut msg = format!("{} {what}{status}; last stderr lines:", self.name);
        for line in self.tail() {
            msg.push_str("\n  | ");
            msg.push_str(&line);
        }
        msg.push_str(&format!("\n(full log: {})", self.log.display()));
        anyhow!(msg)
    }

    /// Waits until the child exits.
    pub async fn exited(&mut self) -> Option<ExitStatus> {
        self.child.wait().await.ok()
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL. Returns how it ended.
    pub async fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        if let Ok(Some(s)) = self.child.try_wait() {
            return Some(s);
        }
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: plain syscall on our own child's pid, which has not been reaped yet.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = self.child.kill().await;
                self.child.wait().await.ok()
            }
        }
    }
}

/// Children in start order.
#[derive(Default)]
pub struct Group {
    children: Vec<Running>,
}

impl Group {
    /// Adds a started child.
    pub fn push(&mut self, r: Running) {
        self.children.push(r);
    }

    /// The child called `name`.
    pub fn get(&self, name: &str) -> Option<&Running> {
        self.children.iter().find(|c| c.name == name)
    }

    /// Resolves when any child exits: which one (its index) and its exit status.
    pub async fn next_exit(&mut self) -> (usize, Option<ExitStatus>) {
        if self.children.is_empty() {
            return std::future::pending().await;
        }
        let waits = self.children.iter_mut().map(|c| Box::pin(c.exited()));
        let (status, i, _) = futures::future::select_all(waits).await;
        (i, status)
    }

    /// Every child, in start order.
    pub fn iter(&self) -> impl Iterator<Item = &Running> {
        self.children.iter()
    }

    /// The child at `i` (from [`Group::next_exit`]).
    pub fn at(&self, i: usize) -> &Running {
        &self.children[i]
    }

    /// Puts `r` in the place of the child at `i` (its restart).
    pub fn replace(&mut self, i: usize, r: Running) {
        self.children[i] = r;
    }

    /// Stops every child, last started first, each with the grace `grace` gives its name (time
    /// for its own drain before SIGKILL); returns each one's name and how it ended.
    pub async fn stop_all(
        &mut self,
        grace: impl Fn(&str) -> Duration,
    ) -> Vec<(String, Option<ExitStatus>)> {
        let mut out = Vec::new();
        for c in self.children.iter_mut().rev() {
            let status = c.stop(grace(&c.name)).await;
            out.push((c.name.clone(), status));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_lines_parse() {
        let l = parse_listening(
            "pagewarden-decode listening grpc=127.0.0.1:1 metrics=127.0.0.1:2 transfer=127.0.0.1:3",
        )
        .unwrap();
        assert_eq!(l["grpc"], "127.0.0.1:1");
        assert_eq!(l["transfer"], "127.0.0.1:3");
        assert!(parse_listening("2026 INFO decode starting").is_none());
    }

    fn sh(name: &str, script: &str) -> Spec {
        Spec {
            name: name.into(),
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            env: vec![],
        }
    }

    #[tokio::test]
    async fn early_exit_reports_the_last_stderr_lines() {
        let dir = tempfile::tempdir().unwrap();
        let err = start(
            &sh(
                "bad",
                "echo 'pool holds 10 tokens < context 20' >&2; exit 3",
            ),
            dir.path(),
            Duration::from_secs(10),
        )
        .await
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.contains("bad exited before printing its start line"),
            "{err}"
        );
        assert!(err.contains("pool holds 10 tokens < context 20"), "{err}");
    }

    #[tokio::test]
    async fn a_started_child_stops_on_sigterm_and_its_exit_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let mut g = Group::default();
        let r = start(
            &sh("ok", "echo 'x listening http=127.0.0.1:9'; exec sleep 30"),
            dir.path(),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!(r.addr("http").unwrap(), "127.0.0.1:9");
        g.push(r);
        let quick = start(
            &sh(
                "quick",
                "echo 'y listening a=b'; echo dying >&2; sleep 0.2; exit 1",
            ),
            dir.path(),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        g.push(quick);
        let (i, status) = g.next_exit().await;
        let err = g.at(i).failure(status, "exited").await.to_string();
        assert!(
            err.contains("quick exited") && err.contains("dying"),
            "{err}"
        );
        let stopped = g.stop_all(|_| Duration::from_secs(20)).await;
        use std::os::unix::process::ExitStatusExt;
        // `ok` was still running: it must have ended by our SIGTERM, not by the SIGKILL fallback.
        let ok = stopped.iter().find(|(n, _)| n == "ok").unwrap();
        assert_eq!(ok.1.and_then(|s| s.signal()), Some(libc::SIGTERM));
    }
}
