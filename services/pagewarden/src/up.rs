//! `pagewarden up`: the whole suite on 127.0.0.1 for a developer. Fetches the default model
//! when missing, writes the dev config dir (tenants with random keys, the auditor's dev
//! operator with a random password, the auditor's SQLite file, logs), starts auditor → decode → prefill → router as child processes, waits until the
//! router reports its workers live, prints how to use it, and stops everything on Ctrl-C or
//! SIGTERM. A child that exits early ends the launcher with that child's last stderr lines.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use crate::children::{self, Group, Running, Spec};
use crate::devconfig::{self, Plan};
use crate::devsecrets::{self, DevOperator, DEV_OPERATOR, DEV_TENANTS};
use crate::fetch::{self, spinner};
use crate::supervise::{self, Decision, Restarts, MAX_RESTARTS};
use pagewarden_common::tenants::{create_private_dir, ClientKeys};

/// The four service binaries, expected next to the `pagewarden` executable.
pub const SERVICES: [&str; 4] = [
    "pagewarden-auditor",
    "pagewarden-decode",
    "pagewarden-prefill",
    "pagewarden-router",
];

/// `pagewarden up` flags.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Router (API) address (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub router_addr: SocketAddr,
    /// Auditor web UI address (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:7401")]
    pub auditor_addr: SocketAddr,
    /// When the router's or the auditor's port is taken, use a free one (and say which)
    /// instead of refusing to start.
    #[arg(long)]
    pub pick_free_ports: bool,
    /// GGUF model file, or the name of a model fetched when missing (`smollm2`,
    /// `gemma3-270m`; default: the SmolLM2-135M model).
    #[arg(long, env = "PAGEWARDEN_MODEL")]
    pub model: Option<PathBuf>,
    /// Dev config dir (default: `.pw/` in the directory `up` runs in).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// KV pool size in tokens for each worker (default: the workers' own, two contexts).
    #[arg(long)]
    pub pool_tokens: Option<usize>,
    /// Advertised context length (default: the model's).
    #[arg(long)]
    pub context_length: Option<usize>,
    /// Workers attend in llama.cpp's flash-attention arithmetic (`llama-server`'s default on a
    /// CPU), for its greedy text (Gemma 3); slower.
    #[arg(long)]
    pub flash_attention: bool,
    /// Write grant idle lifetime: a grant expires this long after it was issued or its last
    /// write landed (a prompt being computed and sent keeps its grant however long it takes).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    pub grant_ttl: Duration,
    /// How often the auditor runs its light canary sweep, as every dev tenant (`0s`: only on
    /// demand, from its Probes page or with `pagewarden probe`).
    #[arg(long, value_name = "DURATION", default_value = "3m", value_parser = humantime::parse_duration)]
    pub probe_interval: Duration,
    /// Seconds each service may take to start (model load included).
    #[arg(long, default_value_t = 300)]
    pub start_timeout_s: u64,
    /// Do not run `cargo build` for the service binaries, even from a checkout.
    #[arg(long)]
    pub no_build: bool,
    /// Print the four command lines (with port-0 placeholders) and exit; fetches nothing.
    #[arg(long)]
    pub print_commands: bool,
}

/// The workspace root when this binary runs from a checkout (current dir or build location).
pub fn checkout_root() -> Option<PathBuf> {
    let is_root = |p: &Path| p.join("services/pagewarden/Cargo.toml").is_file();
    if let Ok(cwd) = std::env::current_dir() {
        if let Some(r) = cwd.ancestors().find(|p| is_root(p)) {
            return Some(r.to_path_buf());
        }
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    is_root(&built).then(|| built.canonicalize().unwrap_or(built))
}

/// Whether a busy port is an error or swapped for a free one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusyPort {
    /// Refuse to start, naming the port and the flags that help.
    Refuse,
    /// Take a free port on the same IP and say which.
    PickFree,
}

/// The address `what` (`router`, `auditor`, named by `flag`) listens on: `addr` when it can
/// be bound now, else per `busy`.
pub fn listen_addr(
    what: &str,
    flag: &str,
    addr: SocketAddr,
    busy: BusyPort,
) -> anyhow::Result<SocketAddr> {
    if addr.port() == 0 || TcpListener::bind(addr).is_ok() {
        return free_addr(addr);
    }
    match busy {
        BusyPort::Refuse => bail!(
            "the {what}'s address {addr} is taken by another program: stop it, choose another \
             with {flag} (port 0 picks a free one), or pass --pick-free-ports"
        ),
        BusyPort::PickFree => {
            let free = free_addr(SocketAddr::new(addr.ip(), 0))?;
            eprintln!("{addr} is taken: the {what} listens on {free} instead");
            Ok(free)
        }
    }
}

/// `addr` when it can be bound now, else a free port on the same IP.
pub fn free_addr(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    if addr.port() != 0 && TcpListener::bind(addr).is_ok() {
        return Ok(addr);
    }
    let l = TcpListener::bind(SocketAddr::new(addr.ip(), 0))
        .with_context(|| format!("binding {}", addr.ip()))?;
    Ok(l.local_addr()?)
}

/// Finds the service binaries next to this executable; from a checkout, builds them first.
fn service_binaries(root: Option<&Path>, no_build: bool) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the pagewarden executable")?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent dir", exe.display()))?
        .to_path_buf();
    let missing = || {
        SERVICES
            .iter()
            .filter(|s| !dir.join(s).is_file())
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    let profile = dir.file_name().and_then(|n| n.to_str());
    if let (Some(root), false, Some(p @ ("release" | "debug"))) = (root, no_build, profile) {
        // Cargo's own progress ("Building [===>  ] 153/402: crate") on the terminal, or its
        // "Compiling ..." lines in a log: the first build takes minutes.
        eprintln!("building the service binaries (cargo build; quick when up to date)");
        let mut cmd = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()));
        cmd.current_dir(root).args(["build", "--bins"]);
        if p == "release" {
            cmd.arg("--release");
        }
        for s in SERVICES {
            cmd.args(["-p", s]);
        }
        if let Some(target) = dir.parent() {
            cmd.arg("--target-dir").arg(target);
        }
        let status = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::io::stderr())
            .status()
            .context("running cargo build")?;
        if !status.success() {
            bail!("cargo build of the services failed ({status}): its errors are above");
        }
    }
    let gone = missing();
    if !gone.is_empty() {
        bail!(
            "{} not found in {}: build them with `cargo build --release --workspace --bins` \
             (from the checkout) and run pagewarden from the same target dir",
            gone.join(", "),
            dir.display()
        );
    }
    Ok(dir)
}

/// Everything `up` prints at the end.
struct Endpoints {
    api: String,
    auditor: String,
    model_name: String,
}

/// Runs `pagewarden up` until Ctrl-C, SIGTERM or a child's exit.
pub fn run(args: UpArgs) -> anyhow::Result<()> {
    // One thread: children are spawned from it, which PR_SET_PDEATHSIG ties their life to.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(up(args))
}

async fn up(args: UpArgs) -> anyhow::Result<()> {
    let root = checkout_root();
    let bin_dir = service_binaries(root.as_deref(), args.no_build)?;
    let dir = args.dir.clone().unwrap_or_else(devconfig::dev_dir);
    if args.print_commands {
        return print_commands(&args, &bin_dir, &dir);
    }
    // One suite per dev dir: a second `up` over the same keys, certificates and database
    // would fight the first for them.
    let _lock = devconfig::lock_dir(&dir)?;
    let model = match &args.model {
        Some(m) => fetch::resolve(m)?,
        None => fetch::ensure_model(&fetch::model_path())?,
    };
    if !model.is_file() {
        bail!("model {} not found", model.display());
    }
    let (tenants_path, tenants) = devsecrets::ensure_tenants(&dir)?;
    let operator = devsecrets::ensure_operator(&dir)?;
    // Mutual TLS on every internal link, with a dev CA kept in `.pw/tls/`.
    devconfig::ensure_tls(&dir)?;
    devsecrets::ensure_receipt_key(&dir)?;
    let mut group = Group::default();
    let started = tokio::select! {
        r = start_all(&args, &bin_dir, &dir, &model, &tenants_path, &tenants, &mut group) => r,
        () = pagewarden_common::shutdown::signal() => Err(anyhow!("interrupted while starting")),
    };
    let endpoints = match started {
        Ok(e) => e,
        Err(e) => {
            group.stop_all(grace).await;
            return Err(e);
        }
    };
    print_banner(&endpoints, &group, &dir, &tenants_path, &tenants, &operator);
    let outcome = tokio::select! {
        err = supervise(&mut group, &dir, Duration::from_secs(args.start_timeout_s)) => Err(err),
        () = pagewarden_common::shutdown::signal() => Ok(()),
    };
    eprintln!("stopping the services ...");
    group.stop_all(grace).await;
    outcome
}

/// Time each child gets after SIGTERM for its own drain before SIGKILL: the router drains its
/// streams for up to 25 s, a decode worker its sequences (`--drain-timeout`, 5 s by default).
fn grace(name: &str) -> Duration {
    match name {
        "router" => Duration::from_secs(30),
        _ => Duration::from_secs(10),
    }
}

/// Restarts workers that die, with back-off and a limit, printing why; returns the error that
/// ends the suite (another child died, or a worker past its limit or failing to start).
async fn supervise(group: &mut Group, dir: &Path, timeout: Duration) -> anyhow::Error {
    let mut restarts = Restarts::default();
    loop {
        let (i, status) = group.next_exit().await;
        let died = group.at(i);
        let why = died.failure(status, "exited").await;
        match restarts.decide(&died.name) {
            Decision::StopAll(reason) => return why.context(reason),
            Decision::Restart { after, attempt } => {
                eprintln!("{why:#}");
                eprintln!(
                    "restarting {} in {after:?} (restart {attempt} of {MAX_RESTARTS}); the rest \
                     keeps serving",
                    died.name
                );
                let spec = supervise::pinned(&died.spec, &died.listening);
                tokio::time::sleep(after).await;
                match children::start_logging(&spec, &dir.join("logs"), timeout, true).await {
                    Ok(r) => {
                        eprintln!("{} restarted", r.name);
                        group.replace(i, r);
                    }
                    Err(e) => return e.context(format!("restarting {}", spec.name)),
                }
            }
        }
    }
}

fn print_commands(args: &UpArgs, bin_dir: &Path, dir: &Path) -> anyhow::Result<()> {
    let plan = Plan {
        bin_dir: bin_dir.to_path_buf(),
        dir: dir.to_path_buf(),
        model: args.model.clone().unwrap_or_else(fetch::model_path),
        tenants: dir.join("tenants.toml"),
        auditor_config: devsecrets::auditor_config(dir),
        router_addr: args.router_addr,
        auditor_addr: args.auditor_addr,
        probe_interval: args.probe_interval,
        grant_ttl: args.grant_ttl,
        pool_tokens: args.pool_tokens,
        context_length: args.context_length,
        flash_attention: args.flash_attention,
        auditor_grpc: Some("http://127.0.0.1:0".into()),
    };
    for s in [
        plan.auditor(),
        plan.worker("decode"),
        plan.worker("prefill"),
        plan.router("127.0.0.1:0", "127.0.0.1:0"),
    ] {
        println!("{} {}", s.program.display(), s.args.join(" "));
    }
    Ok(())
}

async fn start_one(
    group: &mut Group,
    spec: Spec,
    what: &str,
    dir: &Path,
    timeout: Duration,
) -> anyhow::Result<()> {
    let pb = spinner(format!("starting {} ({what})", spec.name));
    let began = std::time::Instant::now();
    let r = children::start(&spec, &dir.join("logs"), timeout).await;
    pb.finish_and_clear();
    let r: Running = r?;
    eprintln!(
        "{} listening after {:.1} s: {}",
        r.name,
        began.elapsed().as_secs_f64(),
        r.listening
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    group.push(r);
    Ok(())
}

async fn start_all(
    up: &UpArgs,
    bin_dir: &Path,
    dir: &Path,
    model: &Path,
    tenants_path: &Path,
    tenants: &ClientKeys,
    group: &mut Group,
) -> anyhow::Result<Endpoints> {
    let timeout = Duration::from_secs(up.start_timeout_s);
    let busy = if up.pick_free_ports {
        BusyPort::PickFree
    } else {
        BusyPort::Refuse
    };
    let router_addr = listen_addr("router", "--router-addr", up.router_addr, busy)?;
    let auditor_addr = listen_addr("auditor", "--auditor-addr", up.auditor_addr, busy)?;
    let plan = Plan {
        bin_dir: bin_dir.to_path_buf(),
        dir: dir.to_path_buf(),
        model: model.to_path_buf(),
        tenants: tenants_path.to_path_buf(),
        auditor_config: devsecrets::auditor_config(dir),
        router_addr,
        auditor_addr,
        probe_interval: up.probe_interval,
        grant_ttl: up.grant_ttl,
        pool_tokens: up.pool_tokens,
        context_length: up.context_length,
        flash_attention: up.flash_attention,
        auditor_grpc: None,
    };
    create_private_dir(&dir.join("auditor"))?;
    start_one(group, plan.auditor(), "SQLite incident log", dir, timeout).await?;
    let auditor_http = group_addr(group, "auditor", "http")?;
    let plan = Plan {
        auditor_grpc: Some(format!("http://{}", group_addr(group, "auditor", "grpc")?)),
        ..plan
    };
    start_one(
        group,
        plan.worker("decode"),
        "loading the model",
        dir,
        timeout,
    )
    .await?;
    start_one(
        group,
        plan.worker("prefill"),
        "loading the model",
        dir,
        timeout,
    )
    .await?;
    let router = plan.router(
        &group_addr(group, "decode", "grpc")?,
        &group_addr(group, "prefill", "grpc")?,
    );
    start_one(group, router, "loading the tokenizer", dir, timeout).await?;
    let api = format!("http://{}", group_addr(group, "router", "http")?);
    let auditor = format!("http://{auditor_http}");

    let pb = spinner("waiting for the router to see its workers live");
    let health = wait_healthy(&api, &auditor, timeout).await;
    pb.finish_and_clear();
    health?;
    let key = tenants
        .key_of(DEV_TENANTS[0])
        .ok_or_else(|| anyhow!("no dev key"))?;
    let model_name = model_name(&api, key).await.unwrap_or_else(|_| {
        model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    Ok(Endpoints {
        api,
        auditor,
        model_name,
    })
}

fn group_addr(group: &Group, name: &str, key: &str) -> anyhow::Result<String> {
    group
        .get(name)
        .ok_or_else(|| anyhow!("{name} is not running"))?
        .addr(key)
        .map(str::to_string)
}

/// Polls the router's and the auditor's `/health` until both answer 200.
async fn wait_healthy(api: &str, auditor: &str, timeout: Duration) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        let mut ok = true;
        for url in [format!("{api}/health"), format!("{auditor}/health")] {
            match http.get(&url).send().await {
                Ok(r) if r.status().is_success() => {}
                Ok(r) => {
                    ok = false;
                    last = format!(
                        "{url}: {} {}",
                        r.status(),
                        r.text().await.unwrap_or_default()
                    );
                }
                Err(e) => {
                    ok = false;
                    last = format!("{url}: {e}");
                }
            }
        }
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "services did not become healthy in {}s; last answer: {last}",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn model_name(api: &str, key: &str) -> anyhow::Result<String> {
    let v: serde_json::Value = reqwest::Client::new()
        .get(format!("{api}/v1/models"))
        .bearer_auth(key)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("/v1/models lists no model"))
}

/// The curl line the banner prints.
pub fn curl_example(api: &str, key: &str, model: &str) -> String {
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Name three colors."}],
        "max_tokens": 32,
    });
    format!(
        "curl -s {api}/v1/chat/completions -H 'Authorization: Bearer {key}' \
         -H 'Content-Type: application/json' -d '{body}'"
    )
}

fn print_banner(
    e: &Endpoints,
    group: &Group,
    dir: &Path,
    tenants_path: &Path,
    t: &ClientKeys,
    operator: &DevOperator,
) {
    let key = |n: &str| t.key_of(n).unwrap_or_default().to_string();
    let (a, b) = (DEV_TENANTS[0], DEV_TENANTS[1]);
    println!();
    println!("Pagewarden is up.");
    println!("  API (OpenAI-compatible): {}/v1", e.api);
    println!("  auditor UI:              {}/", e.auditor);
    println!(
        "    sign in as {DEV_OPERATOR}, password {} (kept in {})",
        operator.password,
        operator.password_file.display()
    );
    println!(
        "    read-only API token: {} (kept in {}); e.g. curl -H 'Authorization: Bearer {}' {}/api/cache",
        operator.viewer_token,
        operator.viewer_token_file.display(),
        operator.viewer_token,
        e.auditor
    );
    println!(
        "  dev tenants (keys in {}, hashed in {}):",
        dir.join("keys.toml").display(),
        tenants_path.display()
    );
    println!("    {a:<10} {}", key(a));
    println!("    {b:<10} {}", key(b));
    println!("  try it:");
    println!("    {}", curl_example(&e.api, &key(a), &e.model_name));
    println!(
        "  isolation receipts: add -H 'X-Pagewarden-Receipt: 1', save the answer, then \
         pagewarden verify-receipt FILE --auditor {}",
        e.auditor
    );
    println!(
        "  recompute audit: the auditor scores 5% of served requests again on its own copy of \
         the model (recompute_rate in {}: 0 to 1 per tenant); verdicts at {}/api/recomputes",
        tenants_path.display(),
        e.auditor
    );
    println!(
        "  canary sweep: pagewarden probe --router {} --key {a}={} --key {b}={}",
        e.api,
        key(a),
        key(b)
    );
    println!(
        "  more keys: pagewarden keys add --tenant NAME --file {}, then kill -HUP the router",
        tenants_path.display()
    );
    println!("  services (logs in {}):", dir.join("logs").display());
    for c in group.iter() {
        let pid = c.pid().map_or_else(|| "-".to_string(), |p| p.to_string());
        // Workers have a metrics listener of their own; router and auditor serve
        // `/metrics` beside their HTTP API.
        let metrics = c
            .addr("metrics")
            .or_else(|_| c.addr("http"))
            .map_or_else(|_| "-".to_string(), |a| format!("http://{a}/metrics"));
        println!("    {:<8} pid {pid:<8} metrics {metrics}", c.name);
    }
    println!("Ctrl-C stops everything.");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curl_example_is_valid_shell_and_json() {
        let c = curl_example("http://127.0.0.1:8080", "pw-k", "m");
        let body = c.split("-d '").nth(1).unwrap().trim_end_matches('\'');
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["model"], "m");
        assert!(c.contains("Bearer pw-k"));
    }

    #[test]
    fn a_busy_port_is_refused_by_name_or_replaced_when_asked() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let busy = l.local_addr().unwrap();
        let e = listen_addr("router", "--router-addr", busy, BusyPort::Refuse)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&busy.to_string()) && e.contains("--pick-free-ports"),
            "{e}"
        );
        let got = listen_addr("router", "--router-addr", busy, BusyPort::PickFree).unwrap();
        assert_ne!(got, busy);
        assert!(got.ip().is_loopback());
    }
}
