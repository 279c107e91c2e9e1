//! `pagewarden bench chat`: multi-turn chat, the workload a prefix cache is for,
//! side by side with llama.cpp's `llama-server` and its prompt cache.
//!
//! `--conversations` chats of `--turns` turns each, interleaved (turn 1 of every chat, then
//! turn 2, ...) as users of one server would be. Every turn resends the whole history (a long
//! system prompt, the earlier questions and the server's own earlier answers) plus a new
//! question, streamed, greedy. Each chat is its own tenant on Pagewarden; llama-server gets
//! one slot per chat (`--parallel`) and keeps its prompt cache on (`cache_prompt`, its
//! default). Each round runs Pagewarden,
//! then llama-server, with chats neither has seen. Reported: the median time to first token
//! per turn on each side, and their ratio.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};

use crate::bench_serve::{for_each_event, on_suite, pct, SuiteRun, TEXT};

/// Arguments of `pagewarden bench chat`.
#[derive(Debug, Args)]
pub struct BenchChatArgs {
    /// GGUF model file, or a known model's name (`smollm2`, `gemma3-270m`), fetched when missing.
    #[arg(long, env = "PAGEWARDEN_MODEL", default_value = "smollm2")]
    pub model: PathBuf,
    /// Path of llama.cpp's `llama-server`, run on the same model with `-t 2 -fa on`.
    #[arg(long)]
    pub llama_server: PathBuf,
    /// Chats, interleaved.
    #[arg(long, default_value_t = 8)]
    pub conversations: usize,
    /// Turns per chat.
    #[arg(long, default_value_t = 6)]
    pub turns: usize,
    /// Completion tokens of each answer.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Rounds, each with fresh chats on both sides.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Seconds to wait for each service's start line and for /health.
    #[arg(long, default_value_t = 120)]
    pub start_timeout_s: u64,
}

/// The tenants of the chats (one each); at most this many chats.
const TENANTS: [&str; 8] = [
    "chat-0", "chat-1", "chat-2", "chat-3", "chat-4", "chat-5", "chat-6", "chat-7",
];

/// Runs `pagewarden bench chat`.
pub fn run(a: BenchChatArgs) -> anyhow::Result<()> {
    // A file, or a known model's name fetched when missing (as `up` resolves it).
    let a = BenchChatArgs {
        model: crate::fetch::resolve(&a.model)?,
        ..a
    };
    if a.conversations == 0 || a.conversations > TENANTS.len() || a.turns == 0 || a.rounds == 0 {
        bail!("--conversations must be 1 to 8, --turns and --rounds at least 1");
    }
    let timeout = Duration::from_secs(a.start_timeout_s);
    let suite = SuiteRun {
        model: &a.model,
        tenants: TENANTS,
        start_timeout: timeout,
    };
    let a = &a;
    on_suite(suite, |api, keys, dir| async move {
        let mut llama = LlamaServer::start(a, &dir, timeout).await?;
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for round in 0..a.rounds {
            eprintln!("round {round}: Pagewarden");
            ours.push(run_chats(a, &api, Some(&keys), round).await?);
            eprintln!("round {round}: llama-server");
            theirs.push(run_chats(a, &llama.url, None, round).await?);
        }
        llama.stop().await;
        report(a, &ours, &theirs);
        Ok(())
    })
}

/// TTFT in ms per turn (outer) per chat (inner) of one round on one server.
type TurnTimes = Vec<Vec<f64>>;

/// Runs every chat of `round` against `api`; with `keys`, chat `i` is tenant `keys[i]`.
async fn run_chats(
    a: &BenchChatArgs,
    api: &str,
    keys: Option<&[String; 8]>,
    round: usize,
) -> anyhow::Result<TurnTimes> {
    let http = reqwest::Client::new();
    let mut models = http.get(format!("{api}/v1/models"));
    if let Some(k) = keys {
        models = models.bearer_auth(&k[0]);
    }
    let models: Value = models.send().await?.json().await?;
    let model = models["data"][0]["id"]
        .as_str()
        .context("GET /v1/models named no model")?
        .to_string();
    let mut chats: Vec<Vec<Value>> = (0..a.conversations)
        .map(|c| {
            vec![json!({
                "role": "system",
                "content": format!(
                    "You are assistant {c} of round {round}. Answer briefly, using this \
                     background where it helps.\n{}",
                    TEXT.repeat(4)
                ),
            })]
        })
        .collect();
    let mut times = Vec::new();
    for turn in 0..a.turns {
        let mut row = Vec::new();
        for (c, history) in chats.iter_mut().enumerate() {
            history.push(json!({
                "role": "user",
                "content": format!(
                    "Question {turn} of chat {c}: in one sentence, what does the background \
                     say about point {}? {}",
                    turn + 1,
                    &TEXT[..TEXT.len().min(240)]
                ),
            }));
            let key = keys.map(|k| k[c].as_str());
            let (ttft, answer) = chat_turn(&http, api, key, &model, history, a.max_tokens).await?;
            history.push(json!({"role": "assistant", "content": answer}));
            row.push(ttft);
        }
        times.push(row);
    }
    Ok(times)
}

/// One streamed greedy chat completion: its TTFT in ms and its text.
async fn chat_turn(
    http: &reqwest::Client,
    api: &str,
    key: Option<&str>,
    model: &str,
    messages: &[Value],
    max_tokens: usize,
) -> anyhow::Result<(f64, String)> {
    let body = json!({
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
    });
    let start = Instant::now();
    let mut req = http.post(format!("{api}/v1/chat/completions")).json(&body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await.context("POST /v1/chat/completions")?;
    if !resp.status().is_success() {
        let status = resp.status();
        bail!("/v1/chat/completions: {status} {}", resp.text().await?);
    }
    let (mut ttft, mut text) = (None, String::new());
    for_each_event(resp, |v| {
        let delta = v["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap_or_default();
        if !delta.is_empty() {
            ttft.get_or_insert_with(|| start.elapsed().as_secs_f64() * 1e3);
            text.push_str(delta);
        }
    })
    .await?;
    Ok((ttft.context("no token streamed")?, text))
}

fn report(a: &BenchChatArgs, ours: &[TurnTimes], theirs: &[TurnTimes]) {
    let per_turn = |rounds: &[TurnTimes], turn: usize| {
        let mut v: Vec<f64> = rounds.iter().flat_map(|r| r[turn].clone()).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    println!(
        "multi-turn chat: {} chats x {} turns, {} completion tokens per answer, {} round(s); \
         TTFT p50 in ms",
        a.conversations, a.turns, a.max_tokens, a.rounds
    );
    println!("  turn   Pagewarden   llama-server   ratio");
    let (mut all_ours, mut all_theirs) = (Vec::new(), Vec::new());
    for t in 0..a.turns {
        let (o, l) = (per_turn(ours, t), per_turn(theirs, t));
        println!(
            "  {:4}   {:10.1}   {:12.1}   {:5.2}x",
            t + 1,
            pct(&o, 0.5),
            pct(&l, 0.5),
            pct(&o, 0.5) / pct(&l, 0.5)
        );
        all_ours.extend(o);
        all_theirs.extend(l);
    }
    all_ours.sort_by(f64::total_cmp);
    all_theirs.sort_by(f64::total_cmp);
    println!(
        "  all    {:10.1}   {:12.1}   {:5.2}x",
        pct(&all_ours, 0.5),
        pct(&all_theirs, 0.5),
        pct(&all_ours, 0.5) / pct(&all_theirs, 0.5)
    );
}

/// llama-server on a free port, stopped by [`LlamaServer::stop`] (or killed on drop).
struct LlamaServer {
    child: tokio::process::Child,
    url: String,
}

impl LlamaServer {
    async fn start(a: &BenchChatArgs, dir: &Path, timeout: Duration) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::File::create(dir.join("llama-server.log"))?;
        let slots = a.conversations.to_string();
        let ctx = (8192 * a.conversations).to_string();
        eprintln!("starting llama-server ({slots} slots)");
        let child = tokio::process::Command::new(&a.llama_server)
            .args(["-m", &a.model.display().to_string()])
            .args(["-t", "2", "-fa", "on", "--host", "127.0.0.1"])
            .args([
                "--port",
                &port.to_string(),
                "--parallel",
                &slots,
                "-c",
                &ctx,
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", a.llama_server.display()))?;
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let started = Instant::now();
        loop {
            if let Ok(r) = http.get(format!("{url}/health")).send().await {
                if r.status().is_success() {
                    return Ok(Self { child, url });
                }
            }
            if started.elapsed() > timeout {
                bail!("llama-server did not become healthy within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn stop(&mut self) {
        let _ = self.child.kill().await;
    }
}
