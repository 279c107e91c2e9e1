//! `pagewarden up` as a user runs it, from an empty directory outside the checkout: the suite
//! starts with its state in that directory, keeps its secrets out of every command line and
//! away from other users, and outlives a worker's death. Under 4 streaming clients, prefill and
//! then decode are killed with SIGKILL: `up` restarts each, every request in flight ends with an
//! error event and `[DONE]` or a JSON error body (never a bare EOF), and requests succeed again
//! within 30 s of each kill.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pagewarden_system_tests::up::{cmdline, send_signal, Up};
use pagewarden_testkit::{eventually, eventually_blocking};
use serde_json::json;

const CLIENTS: usize = 4;
/// How soon after a kill requests must succeed again.
const RECOVERY: Duration = Duration::from_secs(30);

/// How one request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
enum End {
    /// A whole stream, `[DONE]` and no error.
    Served,
    /// An error the client can read: an SSE error event then `[DONE]`, or a JSON error body.
    CleanError(String),
    /// Anything else: a bare EOF, a body that is not an OpenAI error, a transport failure.
    Broken(String),
}

struct Outcome {
    sent: Instant,
    ended: Instant,
    end: End,
}

/// How many requests ended each way (for failure messages).
fn tally<'a>(ends: impl Iterator<Item = &'a End>) -> BTreeMap<String, usize> {
    let mut t = BTreeMap::new();
    for e in ends {
        *t.entry(format!("{e:?}")).or_insert(0) += 1;
    }
    t
}

async fn one_stream(http: &reqwest::Client, api: &str, key: &str, model: &str, n: usize) -> End {
    let r = http
        .post(format!("{api}/v1/completions"))
        .bearer_auth(key)
        .json(
            &json!({"model": model, "prompt": format!("Story number {n}: once upon a time"),
            "max_tokens": 48, "ignore_eos": true, "temperature": 0, "stream": true}),
        )
        .send()
        .await;
    let mut r = match r {
        Ok(r) => r,
        Err(e) => return End::Broken(format!("send: {e}")),
    };
    let status = r.status();
    if !status.is_success() {
        let body = r.text().await.unwrap_or_default();
        let parsed: Option<serde_json::Value> = serde_json::from_str(&body).ok();
        return match parsed {
            Some(v) if v["error"]["message"].is_string() => {
                End::CleanError(format!("{status}: {}", v["error"]["code"]))
            }
            _ => End::Broken(format!("{status} without a JSON error body: {body}")),
        };
    }
    let mut body = String::new();
    loop {
        match r.chunk().await {
            Ok(Some(c)) => body.push_str(&String::from_utf8_lossy(&c)),
            Ok(None) => break,
            Err(e) => return End::Broken(format!("stream cut: {e}; after {body:?}")),
        }
    }
    let done = body.trim_end().ends_with("data: [DONE]");
    match (done, body.contains("\"error\"")) {
        (true, false) => End::Served,
        (true, true) => End::CleanError("error event".into()),
        (false, _) => End::Broken(format!("no [DONE]: {body:?}")),
    }
}

/// Waits for `name` to be a child of `up` other than `old`; its pid.
fn wait_restarted(up: &Up, name: &str, old: u32, within: Duration) -> u32 {
    eventually_blocking(within, &format!("{name} to be restarted"), || {
        up.children().get(name).copied().filter(|&p| p != old)
    })
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The secrets stay with their owner: on no command line, and nothing under the state dir can
/// be read by another user.
fn check_secrets(up: &Up, state: &Path) {
    let password = std::fs::read_to_string(state.join("dev-operator.password"))
        .expect("the dev operator's password file")
        .trim()
        .to_string();
    let secrets: Vec<&str> = up
        .keys
        .values()
        .map(String::as_str)
        .chain([password.as_str()])
        .collect();
    let mut pids: Vec<u32> = up.children().into_values().collect();
    pids.push(up.pid());
    assert_eq!(pids.len(), 5, "up and its four services");
    for pid in pids {
        let argv = cmdline(pid).join(" ");
        for s in &secrets {
            assert!(
                !argv.contains(s),
                "a secret is on the command line of pid {pid}: {argv}"
            );
        }
    }
    assert_eq!(mode(state), 0o700, "{}", state.display());
    let files = files_under(state);
    for f in ["keys.toml", "dev-operator.password"] {
        assert!(
            files.iter().any(|p| p.ends_with(f)),
            "{f} is not in the state dir"
        );
    }
    let sqlite: Vec<_> = files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "sqlite"))
        .collect();
    assert!(
        !sqlite.is_empty(),
        "the auditor's SQLite file is in the state dir"
    );
    for f in sqlite
        .into_iter()
        .chain(files.iter().filter(|p| p.ends_with("keys.toml")))
        .chain(
            files
                .iter()
                .filter(|p| p.ends_with("dev-operator.password")),
        )
    {
        assert_eq!(mode(f) & 0o077, 0, "{} is readable by others", f.display());
    }
    // As root, try it as another user: nothing under the state dir can be read.
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let runuser = Path::new("/usr/sbin/runuser");
    if root && runuser.exists() {
        for f in &files {
            let read = Command::new(runuser)
                .args(["-u", "nobody", "--", "cat"])
                .arg(f)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("runuser");
            assert!(!read.success(), "user nobody read {}", f.display());
        }
        eprintln!("user nobody could read none of {} files", files.len());
    } else {
        eprintln!("not root or no runuser: the check as another user is skipped");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_restarts_killed_workers_and_every_request_in_flight_ends_cleanly() {
    // An empty directory outside the checkout, readable by others, so that only the state
    // dir's own modes keep other users out.
    let cwd = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(cwd.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let up = Up::start(cwd.path(), &[]);
    let state = cwd.path().join(".pw");
    assert!(
        state.join("keys.toml").is_file(),
        "up keeps its state in .pw/ of the directory it runs in"
    );
    // Log files are plain text: no terminal colour codes.
    for log in std::fs::read_dir(state.join("logs")).expect("logs dir") {
        let log = log.expect("log entry").path();
        let text = std::fs::read_to_string(&log).expect("log file");
        assert!(
            !text.contains('\x1b'),
            "{} holds colour codes",
            log.display()
        );
    }
    check_secrets(&up, &state);

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client");
    // The read-only token the banner prints opens the auditor's JSON API (the prefix cache's
    // per-tenant view); without it the API refuses.
    let cache = format!("{}/api/cache", up.auditor);
    let with = http.get(&cache).bearer_auth(&up.viewer_token).send().await;
    assert_eq!(
        with.map(|r| r.status().as_u16()).ok(),
        Some(200),
        "{cache} with the token"
    );
    let without = http.get(&cache).send().await;
    assert_eq!(
        without.map(|r| r.status().as_u16()).ok(),
        Some(401),
        "{cache} without a token"
    );
    let (model, _) = up.served_model(&http).await;
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Vec::<Outcome>::new()));
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let (http, api, stop, outcomes) =
            (http.clone(), up.api.clone(), stop.clone(), outcomes.clone());
        let key = up.keys.values().nth(c % 2).expect("key").clone();
        let model = model.clone();
        clients.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let end = one_stream(&http, &api, &key, &model, c * 10_000 + n).await;
                n += 1;
                let wait = matches!(end, End::CleanError(_));
                outcomes.lock().expect("outcomes").push(Outcome {
                    sent,
                    ended: Instant::now(),
                    end,
                });
                // A client retries a failure after a pause, as Retry-After asks: real time, as a
                // real client waits.
                if wait {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }));
    }
    // How many requests sent after `t` were served.
    let served_since = |t: Instant| {
        outcomes
            .lock()
            .expect("outcomes")
            .iter()
            .filter(|o| o.sent > t && o.end == End::Served)
            .count()
    };
    // The outcomes since `t`, for a failure message.
    let tally_since = |t: Instant| {
        tally(
            outcomes
                .lock()
                .expect("outcomes")
                .iter()
                .filter(|o| o.sent > t)
                .map(|o| &o.end),
        )
    };
    // The suite serves a while (two requests a client) before each kill, so that streams are
    // in flight when it comes.
    let serve_a_while = |what: &'static str| async move {
        let t = Instant::now();
        eventually(Duration::from_secs(60), what, || async {
            (served_since(t) >= 2 * CLIENTS)
                .then_some(())
                .ok_or_else(|| format!("{:?}", tally_since(t)))
        })
        .await
    };
    eventually(
        Duration::from_secs(60),
        "a request served after the start",
        || async {
            (served_since(start) > 0)
                .then_some(())
                .ok_or_else(|| format!("{:?}", tally_since(start)))
        },
    )
    .await;
    serve_a_while("the suite to serve a while").await;
    let mut recovered = Vec::new();
    for name in ["pagewarden-prefill", "pagewarden-decode"] {
        let old = *up
            .children()
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not a child of up"));
        let killed = Instant::now();
        send_signal(old, "KILL");
        let new = wait_restarted(&up, name, old, Duration::from_secs(60));
        eprintln!(
            "{name}: pid {old} killed, restarted as {new} after {:?}",
            killed.elapsed()
        );
        let left = RECOVERY.saturating_sub(killed.elapsed());
        eventually(
            left,
            &format!("a request sent after {name}'s kill to be served"),
            || async {
                (served_since(killed) > 0)
                    .then_some(())
                    .ok_or_else(|| format!("{:?}", tally_since(killed)))
            },
        )
        .await;
        recovered.push((name, killed, killed.elapsed()));
        // Let the restarted worker serve a while before the next kill.
        serve_a_while("the restarted worker to serve a while").await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        tokio::time::timeout(Duration::from_secs(150), c)
            .await
            .expect("a client did not finish its last request")
            .expect("client task");
    }
    let outcomes = outcomes.lock().expect("outcomes");
    let served = outcomes.iter().filter(|o| o.end == End::Served).count();
    let broken: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match &o.end {
            End::Broken(why) => Some(format!("{why} ({:?})", o.ended - o.sent)),
            End::Served | End::CleanError(_) => None,
        })
        .collect();
    eprintln!(
        "{} requests: {served} served, the rest {:?}; served again after {:?}",
        outcomes.len(),
        tally(
            outcomes
                .iter()
                .map(|o| &o.end)
                .filter(|e| **e != End::Served)
        ),
        recovered
            .iter()
            .map(|(name, _, took)| (name, took))
            .collect::<Vec<_>>()
    );
    // The decode kill must have hit streams: some in flight across it ended with an error.
    let (_, decode_killed, _) = recovered[1];
    let hit = outcomes
        .iter()
        .filter(|o| o.sent < decode_killed && o.ended > decode_killed)
        .filter(|o| o.end == End::CleanError("error event".into()))
        .count();
    assert!(
        hit > 0,
        "no stream in flight at decode's kill ended with an error event"
    );
    assert!(
        broken.is_empty(),
        "requests that ended without a clean error: {broken:#?}"
    );
    assert_eq!(
        up.children().len(),
        4,
        "every service is running after the kills: {:?}",
        up.children()
    );
}
