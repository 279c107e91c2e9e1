//! `pagewarden bench goodput`: requests per second that meet both a time-to-first-token and an
//! inter-token SLO (DistServe's goodput), on a mixed load of chats and long documents arriving
//! as a Poisson process, against a running Pagewarden router and, with `--peer`, any other
//! OpenAI-compatible server (llama-server) driven with the same arrivals and prompts in the
//! same run, rate by rate, with the ratio.
//!
//! A request meets its SLOs when it is answered 200, its stream ends in `[DONE]`, its first
//! token arrives within `--ttft-slo` and its mean gap between tokens (time per output token
//! after the first) is within `--tpot-slo`. Goodput at a rate is the count of such requests
//! over the span from the first arrival to the last response. Every prompt starts with its own
//! request number, so no server reuses another request's prefix.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::bench_serve::{stream_body, TEXT};

/// Arguments of `pagewarden bench goodput`.
#[derive(Debug, Args)]
pub struct BenchGoodputArgs {
    /// Pagewarden's API base (the router), e.g. `http://127.0.0.1:8080`.
    #[arg(long)]
    pub url: String,
    /// An API key of Pagewarden's.
    #[arg(long, env = "PAGEWARDEN_API_KEY")]
    pub key: String,
    /// The peer's API base (llama-server), measured after Pagewarden at each rate.
    #[arg(long)]
    pub peer: Option<String>,
    /// The peer's API key, if it wants one.
    #[arg(long, default_value = "none")]
    pub peer_key: String,
    /// JSON fields added to every request the peer gets (llama-server: no prompt cache, as
    /// Pagewarden reuses no other request's prefix here either).
    #[arg(long, default_value = r#"{"cache_prompt": false}"#)]
    pub peer_extra: String,
    /// Arrival rates to measure, requests per second, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "0.05,0.1,0.2")]
    pub rates: Vec<f64>,
    /// Seconds of arrivals at each rate (the run then waits for the last responses).
    #[arg(long, default_value_t = 120)]
    pub duration_s: u64,
    /// Share of the requests that are long documents; the rest are chats.
    #[arg(long, default_value_t = 0.2)]
    pub doc_share: f64,
    /// A chat's prompt length in words: from..to.
    #[arg(long, default_value = "150..400", value_parser = parse_range)]
    pub chat_words: (usize, usize),
    /// A document's prompt length in words: from..to.
    #[arg(long, default_value = "3000..6000", value_parser = parse_range)]
    pub doc_words: (usize, usize),
    /// Completion tokens of every request (ignore_eos: exactly this many).
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// A chat's time-to-first-token SLO (`2s`, `500ms`).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub chat_ttft_slo: Duration,
    /// A document's time-to-first-token SLO.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub doc_ttft_slo: Duration,
    /// Mean time per output token after the first, every request.
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    pub tpot_slo: Duration,
    /// Seed of the arrivals, kinds and lengths.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
}

fn parse_range(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("{s:?}: want FROM..TO"))?;
    let parse = |v: &str| v.trim().parse::<usize>().map_err(|e| format!("{s:?}: {e}"));
    let (a, b) = (parse(a)?, parse(b)?);
    if a == 0 || a > b {
        return Err(format!("{s:?}: want 0 < FROM <= TO"));
    }
    Ok((a, b))
}

/// A request's kind, which decides its length and its TTFT SLO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Chat,
    Doc,
}

/// One planned request: when it arrives (after the rate's start), what it sends.
#[derive(Clone, Debug)]
struct Planned {
    at: Duration,
    kind: Kind,
    prompt: String,
}

/// What one request saw.
#[derive(Clone, Debug)]
struct Outcome {
    kind: Kind,
    ttft: Option<Duration>,
    tpot: Option<Duration>,
    done_at: Instant,
    ok: bool,
}

/// The arrivals at `rate` over `duration`: exponential gaps, seeded, so both servers get the
/// same schedule and the same prompts.
fn plan(a: &BenchGoodputArgs, rate: f64, rate_index: usize) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(a.seed ^ (rate_index as u64).wrapping_mul(0x9e37));
    let words: Vec<&str> = TEXT.split_whitespace().collect();
    let mut out = Vec::new();
    let mut t = 0.0f64;
    loop {
        // Inverse transform of the exponential distribution; 1 - u is in (0, 1].
        let u: f64 = rng.random();
        t += -(1.0 - u).ln() / rate;
        if t >= a.duration_s as f64 {
            return out;
        }
        let kind = if rng.random::<f64>() < a.doc_share {
            Kind::Doc
        } else {
            Kind::Chat
        };
        let (lo, hi) = match kind {
            Kind::Chat => a.chat_words,
            Kind::Doc => a.doc_words,
        };
        let n = rng.random_range(lo..=hi);
        let mut prompt = format!("Request {rate_index}-{}.", out.len());
        for i in 0..n {
            prompt.push(' ');
            prompt.push_str(words[i % words.len()]);
        }
        out.push(Planned {
            at: Duration::from_secs_f64(t),
            kind,
            prompt,
        });
    }
}

/// One server under test.
struct Server {
    name: &'static str,
    url: String,
    key: String,
    extra: serde_json::Map<String, serde_json::Value>,
}

/// Sends the planned requests at their times; returns every request's outcome.
async fn drive(server: Arc<Server>, planned: &[Planned], max_tokens: usize) -> Vec<Outcome> {
    let http = reqwest::Client::new();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for p in planned {
        tokio::time::sleep_until((start + p.at).into()).await;
        let (http, server, p) = (http.clone(), server.clone(), p.clone());
        tasks.push(tokio::spawn(async move {
            let mut body = serde_json::json!({
                "prompt": p.prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": true,
                "stream": true,
                "stream_options": {"include_usage": true},
            });
            if let Some(b) = body.as_object_mut() {
                b.extend(server.extra.clone());
            }
            let r = stream_body(&http, &server.url, &server.key, &body).await;
            let done_at = Instant::now();
            match r {
                Ok(s) => {
                    let tpot = (!s.gaps.is_empty())
                        .then(|| s.gaps.iter().sum::<Duration>() / s.gaps.len() as u32);
                    Outcome {
                        kind: p.kind,
                        ttft: s.ttft,
                        tpot,
                        done_at,
                        ok: true,
                    }
                }
                Err(e) => {
                    eprintln!("  {}: request failed: {e:#}", server.name);
                    Outcome {
                        kind: p.kind,
                        ttft: None,
                        tpot: None,
                        done_at,
                        ok: false,
                    }
                }
            }
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        if let Ok(o) = t.await {
            out.push(o);
        }
    }
    out
}

/// A rate's result on one server.
#[derive(Clone, Copy, Debug)]
struct Tally {
    requests: usize,
    failed: usize,
    met: usize,
    goodput: f64,
}

fn tally(a: &BenchGoodputArgs, outcomes: &[Outcome], start: Instant) -> Tally {
    let meets = |o: &Outcome| {
        let ttft_slo = match o.kind {
            Kind::Chat => a.chat_ttft_slo,
            Kind::Doc => a.doc_ttft_slo,
        };
        o.ok && o.ttft.is_some_and(|t| t <= ttft_slo) && o.tpot.is_none_or(|t| t <= a.tpot_slo)
    };
    let met = outcomes.iter().filter(|o| meets(o)).count();
    let ok = outcomes.iter().filter(|o| o.ok).count();
    let span = outcomes
        .iter()
        .map(|o| o.done_at.saturating_duration_since(start))
        .max()
        .unwrap_or_default()
        .max(Duration::from_secs(a.duration_s))
        .as_secs_f64();
    Tally {
        requests: outcomes.len(),
        failed: outcomes.len() - ok,
        met,
        goodput: met as f64 / span,
    }
}

/// Runs `pagewarden bench goodput`.
pub fn run(a: BenchGoodputArgs) -> anyhow::Result<()> {
    if a.rates.is_empty() || a.rates.iter().any(|r| !(*r > 0.0 && r.is_finite())) {
        bail!("--rates must be positive numbers");
    }
    if !(0.0..=1.0).contains(&a.doc_share) {
        bail!("--doc-share must be between 0 and 1");
    }
    let extra = match serde_json::from_str::<serde_json::Value>(&a.peer_extra)? {
        serde_json::Value::Object(m) => m,
        other => bail!("--peer-extra must be a JSON object, not {other}"),
    };
    let mut servers = vec![Arc::new(Server {
        name: "pagewarden",
        url: a.url.trim_end_matches('/').to_string(),
        key: a.key.clone(),
        extra: Default::default(),
    })];
    if let Some(peer) = &a.peer {
        servers.push(Arc::new(Server {
            name: "peer",
            url: peer.trim_end_matches('/').to_string(),
            key: a.peer_key.clone(),
            extra,
        }));
    }
    let rt = tokio::runtime::Runtime::new()?;
    let mut rows = Vec::new();
    for (i, &rate) in a.rates.iter().enumerate() {
        let planned = plan(&a, rate, i);
        let docs = planned.iter().filter(|p| p.kind == Kind::Doc).count();
        eprintln!(
            "rate {rate} req/s: {} requests ({docs} documents) over {} s",
            planned.len(),
            a.duration_s
        );
        let mut row = Vec::new();
        for s in &servers {
            let start = Instant::now();
            let outcomes = rt.block_on(drive(s.clone(), &planned, a.max_tokens));
            let t = tally(&a, &outcomes, start);
            eprintln!(
                "  {}: {}/{} met the SLOs, {} failed, goodput {:.4} req/s",
                s.name, t.met, t.requests, t.failed, t.goodput
            );
            row.push(t);
        }
        rows.push((rate, row));
    }
    println!(
        "SLOs: TTFT {:?} (chat) / {:?} (document), TPOT {:?}; {} completion tokens; {}% documents",
        a.chat_ttft_slo,
        a.doc_ttft_slo,
        a.tpot_slo,
        a.max_tokens,
        (a.doc_share * 100.0).round()
    );
    println!(
        "{:>8} {:>10} {:>16} {:>12} {:>16} {:>12} {:>8}",
        "rate", "requests", "ours: met/fail", "ours req/s", "peer: met/fail", "peer req/s", "ratio"
    );
    for (rate, row) in rows {
        let ours = row[0];
        let (peer, peer_good, ratio) = match row.get(1) {
            Some(p) => (
                format!("{}/{}", p.met, p.failed),
                format!("{:.4}", p.goodput),
                if p.goodput > 0.0 {
                    format!("{:.2}x", ours.goodput / p.goodput)
                } else {
                    "-".into()
                },
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "{:>8} {:>10} {:>16} {:>12.4} {:>16} {:>12} {:>8}",
            rate,
            ours.requests,
            format!("{}/{}", ours.met, ours.failed),
            ours.goodput,
            peer,
            peer_good,
            ratio
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: BenchGoodputArgs,
    }

    fn args(extra: &[&str]) -> BenchGoodputArgs {
        let mut v = vec!["b", "--url", "http://x", "--key", "k"];
        v.extend(extra);
        Cli::parse_from(v).a
    }

    #[test]
    fn arrivals_are_poisson_at_the_rate_and_the_same_for_every_server() {
        let a = args(&["--duration-s", "2000", "--doc-share", "0.25"]);
        let p = plan(&a, 0.5, 1);
        // 1,000 expected arrivals: a Poisson count's standard deviation is about 32.
        assert!((880..1120).contains(&p.len()), "{} arrivals", p.len());
        let docs = p.iter().filter(|r| r.kind == Kind::Doc).count() as f64 / p.len() as f64;
        assert!((0.2..0.3).contains(&docs), "{docs} documents");
        assert!(p.windows(2).all(|w| w[0].at <= w[1].at));
        let again = plan(&a, 0.5, 1);
        assert_eq!(p.len(), again.len());
        assert!(p
            .iter()
            .zip(&again)
            .all(|(x, y)| x.prompt == y.prompt && x.at == y.at));
        // Each prompt starts with its own number: no server can reuse another's prefix.
        assert_ne!(p[0].prompt[..12], p[1].prompt[..12]);
    }

    #[test]
    fn a_request_meets_its_slos_only_answered_in_time_on_both_counts() {
        let a = args(&[
            "--chat-ttft-slo",
            "1s",
            "--doc-ttft-slo",
            "10s",
            "--tpot-slo",
            "100ms",
        ]);
        let start = Instant::now();
        let o = |kind, ttft: u64, tpot: u64, ok| Outcome {
            kind,
            ttft: Some(Duration::from_millis(ttft)),
            tpot: Some(Duration::from_millis(tpot)),
            done_at: start,
            ok,
        };
        let t = tally(
            &a,
            &[
                o(Kind::Chat, 900, 90, true),
                o(Kind::Chat, 1100, 90, true),
                o(Kind::Doc, 9000, 90, true),
                o(Kind::Doc, 9000, 150, true),
                o(Kind::Chat, 100, 10, false),
            ],
            start,
        );
        assert_eq!((t.requests, t.met, t.failed), (5, 2, 1));
        assert!((t.goodput - 2.0 / a.duration_s as f64).abs() < 1e-9);
    }

    #[test]
    fn bad_ranges_are_refused() {
        assert!(parse_range("10..5").is_err());
        assert!(parse_range("0..5").is_err());
        assert_eq!(parse_range("3..9"), Ok((3, 9)));
    }
}
