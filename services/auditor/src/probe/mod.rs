//! Canary probes: the auditor, as its own probe tenants, sends marker-carrying prompts of
//! growing length through the router and checks every answer (see `plan::judge`). Every
//! failed check opens an incident; every step is recorded under its run.
//!
//! A run is a light or a full sweep ([`SweepKind`]). The schedule runs one kind every
//! interval; an operator can start either on demand ([`Prober::start`]). One run at a time:
//! a run waits for its turn, an on-demand start is refused while one is under way.
//!
//! - `plan`: step lengths, prompts and verdicts (pure).
//! - `pace`: the suite's measured prefill pace, which a step's first-token limit follows.
//! - `http`: `/v1/models` and one streamed `/v1/completions`.
//! - `side_channel`: the paired timing and scheduling-order audits of the prefix cache across
//!   tenants.

pub mod http;
pub mod pace;
pub mod plan;
pub mod side_channel;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pagewarden_common::receipt::PublicKey;
use pagewarden_common::TenantId;
use rand::seq::SliceRandom;
use serde_json::json;
use tokio::sync::Mutex;

use crate::domain::{
    IncidentKind, IsolationChannel, ProbeOutcome, ProbeRunId, ProbeRunStatus, SweepKind, UnixMs,
};
use crate::engine::Engine;
use crate::store::{NewIncident, NewIsolationAudit, ProbeResult, ProbeRunEnd, StoreError};
use crate::tokens::TokenCounter;
use plan::{Answer, LatencyBounds, StepSpec};
use side_channel::{Placement, SideChannelSettings};

/// How far apart the requests of an order round's batch are sent: enough that they reach the
/// router in the order drawn, far less than one prompt's prefill.
const ORDER_STAGGER: Duration = Duration::from_millis(10);

/// One side-channel channel's findings, as its step records them.
struct ChannelReport {
    channel: IsolationChannel,
    /// Filler words of its prompts.
    words: u32,
    /// The step's first-token time (the timing channel's cross median).
    ttft_ms: Option<i64>,
    /// What was tested, before the colon of the step's detail.
    headline: String,
    /// One finding per worker that rounds counted for (none: no round counted).
    parts: Vec<String>,
    /// One object per worker it found a leak on.
    leaks: Vec<serde_json::Value>,
    /// The rounds that did not count.
    missed: Missed,
}

/// The rounds of one side-channel channel that did not count, and why.
#[derive(Default)]
struct Missed {
    /// A request did not complete.
    failed: u32,
    /// Its requests were computed on different workers.
    split: u32,
    /// A receipt was missing or did not verify: how many, and the last reason.
    unattributed: u32,
    why: String,
}

impl Missed {
    /// The worker a placed round counts for, or `None` (counted here) when it counts for none.
    fn placed(&mut self, p: Result<Placement, String>) -> Option<String> {
        match p {
            Ok(Placement::On(worker)) => Some(worker),
            Ok(Placement::Split) => {
                self.split += 1;
                None
            }
            Err(why) => {
                self.unattributed += 1;
                self.why = why;
                None
            }
        }
    }

    /// `, 2 rounds failed, 1 split across workers` (empty when every round counted).
    fn describe(&self) -> String {
        let mut out = String::new();
        if self.failed > 0 {
            out.push_str(&format!(", {} rounds failed", self.failed));
        }
        if self.split > 0 {
            out.push_str(&format!(
                ", {} split across workers (no one worker's cache tested)",
                self.split
            ));
        }
        if self.unattributed > 0 {
            out.push_str(&format!(
                ", {} not attributed to a worker ({})",
                self.unattributed, self.why
            ));
        }
        out
    }
}

/// One probe tenant: the name the router knows it by, and its API key.
#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
pub struct ProbeTenant {
    /// Tenant name, as the router reports it in samples.
    pub tenant: String,
    /// Bearer API key.
    pub api_key: String,
}

/// How the prober behaves.
#[derive(Clone)]
pub struct ProbeSettings {
    /// Router base URL, e.g. `http://127.0.0.1:8080`.
    pub router_url: String,
    /// Probe tenants; every step is sent once per tenant.
    pub tenants: Vec<ProbeTenant>,
    /// `max_tokens` of every probe request.
    pub max_tokens: u32,
    /// First step length, in filler words (one KV page).
    pub page_size: u32,
    /// First-token latency bounds (their pace is the prober's own measure, set per step).
    pub latency: LatencyBounds,
    /// Per-request timeout.
    pub request_timeout: Duration,
    /// Exact prompt token counts, when a tokenizer is available.
    pub tokens: Option<Arc<dyn TokenCounter>>,
    /// The side-channel audit each run ends with (with two probe tenants or more).
    pub side_channel: SideChannelSettings,
    /// The routers' receipt key: when given, the side-channel audit asks for receipts and
    /// reports per prefill worker (see [`side_channel`]).
    pub receipt_key: Option<PublicKey>,
}

/// When scheduled runs happen, and which sweep they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Time between runs.
    pub every: Duration,
    /// The sweep each scheduled run sends.
    pub sweep: SweepKind,
}

/// An on-demand run was refused because another is under way.
#[derive(Debug, thiserror::Error)]
#[error("a probe run is already under way; try again when it has finished")]
pub struct SweepBusy;

/// How long [`Prober::run_every`] waits for the router's `/ready` before its first run.
pub const READY_GRACE: Duration = Duration::from_secs(600);
/// How much longer than its first-token limit a step's request may last (the rest of a short
/// answer after its first token).
const LIMIT_SLACK: Duration = Duration::from_secs(30);
/// How often the router's `/ready` is asked meanwhile (and how long each ask may take).
const READY_POLL: Duration = Duration::from_secs(2);

/// Sends probe runs and records them.
pub struct Prober {
    engine: Arc<Engine>,
    settings: ProbeSettings,
    http: reqwest::Client,
    /// Held by the run under way.
    turn: Arc<Mutex<()>>,
    /// The pace of recent accepted steps, across runs.
    pace: std::sync::Mutex<pace::Pace>,
}

impl Prober {
    /// A prober reporting into `engine`.
    pub fn new(engine: Arc<Engine>, settings: ProbeSettings) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(settings.request_timeout)
            .build()?;
        Ok(Prober {
            engine,
            settings,
            http,
            turn: Arc::default(),
            pace: std::sync::Mutex::default(),
        })
    }

    /// Runs `schedule` until `shutdown` resolves, the first run once the router says it is
    /// ready (or [`READY_GRACE`] has passed): an auditor started before the router, as in any
    /// deployment where the router reports to it, opens no incident for that. From then on an
    /// unreachable router is an incident.
    pub async fn run_every(
        self: Arc<Self>,
        schedule: Schedule,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        tokio::select! {
            _ = &mut shutdown => return,
            ready = self.wait_router_ready(READY_GRACE) => {
                if !ready {
                    tracing::warn!(
                        router = %self.settings.router_url,
                        "router not ready after {}s: probing anyway", READY_GRACE.as_secs()
                    );
                }
            }
        }
        let mut tick = tokio::time::interval(schedule.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => {
                    if let Err(e) = self.run(schedule.sweep).await {
                        tracing::error!(error = %e, "probe run could not be stored");
                    }
                }
            }
        }
    }

    /// Starts a run of `sweep` in the background, unless a run is under way.
    pub fn start(self: &Arc<Self>, sweep: SweepKind) -> Result<(), SweepBusy> {
        let turn = self.turn.clone().try_lock_owned().map_err(|_| SweepBusy)?;
        let me = self.clone();
        tokio::spawn(async move {
            let _turn = turn;
            if let Err(e) = me.sweep(sweep).await {
                tracing::error!(error = %e, "on-demand probe run could not be stored");
            }
        });
        Ok(())
    }

    /// The router's `/health` as JSON (live workers of each half, effective context), or why
    /// it could not be read; asked once, for at most [`READY_POLL`].
    pub async fn router_health(&self) -> Result<serde_json::Value, String> {
        let url = format!("{}/health", self.settings.router_url);
        let resp = self
            .http
            .get(&url)
            .timeout(READY_POLL)
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        resp.json().await.map_err(|e| format!("{url}: {e}"))
    }

    /// Polls the router's `/ready` until it answers 200, for at most `grace`; whether it did.
    pub async fn wait_router_ready(&self, grace: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + grace;
        let url = format!("{}/ready", self.settings.router_url);
        loop {
            let answer = self.http.get(&url).timeout(READY_POLL).send().await;
            if answer.is_ok_and(|r| r.status().is_success()) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// One full run: every step for every probe tenant. Returns the run's id.
    pub async fn run_once(&self) -> Result<ProbeRunId, StoreError> {
        self.run(SweepKind::Full).await
    }

    /// One run of `sweep`, waiting for its turn. Returns the run's id.
    pub async fn run(&self, sweep: SweepKind) -> Result<ProbeRunId, StoreError> {
        let _turn = self.turn.lock().await;
        self.sweep(sweep).await
    }

    /// Every step of `sweep` for every probe tenant; the caller holds the turn.
    async fn sweep(&self, sweep: SweepKind) -> Result<ProbeRunId, StoreError> {
        let store = self.engine.store();
        let run = store.start_probe_run(UnixMs::now(), sweep).await?;
        let s = &self.settings;
        let Some(first) = s.tenants.first() else {
            return self
                .finish(
                    run,
                    ProbeRunStatus::Error,
                    None,
                    0,
                    0,
                    "no probe tenants configured",
                )
                .await;
        };
        let (limit, model) = match http::context_limit(&self.http, &s.router_url, &first.api_key)
            .await
        {
            Ok(v) => v,
            Err(e) => {
                let details = json!({"source": "probe", "run_id": run.0, "error": e.to_string()});
                self.open_incident(
                    IncidentKind::ProbeUnreachable,
                    &first.tenant,
                    None,
                    details,
                    UnixMs::now(),
                )
                .await?;
                return self
                    .finish(run, ProbeRunStatus::Error, None, 0, 1, &e.to_string())
                    .await;
            }
        };
        let (mut steps, mut failures) = (0i64, 0i64);
        for tenant in &s.tenants {
            for (i, words) in plan::steps_of(sweep, limit, s.page_size, s.max_tokens)
                .into_iter()
                .enumerate()
            {
                let r = self
                    .step(run, tenant, i as i64, words, limit, &model)
                    .await?;
                steps += 1;
                if r.outcome.incident_kind().is_some() {
                    failures += 1;
                }
            }
        }
        if let [owner, other, ..] = s.tenants.as_slice() {
            let r = self
                .prefix_isolation(run, owner, other, steps, &model)
                .await?;
            steps += 1;
            if r.outcome.incident_kind().is_some() {
                failures += 1;
            }
            for r in self
                .side_channel(run, owner, other, steps, limit, &model)
                .await?
            {
                steps += 1;
                if r.outcome != ProbeOutcome::Accepted {
                    failures += 1;
                }
            }
        }
        let status = if failures == 0 {
            ProbeRunStatus::Passed
        } else {
            ProbeRunStatus::Failed
        };
        let msg = format!("{sweep} sweep: {steps} steps, {failures} failed, limit {limit}");
        self.finish(run, status, Some(i64::from(limit)), steps, failures, &msg)
            .await
    }

    async fn finish(
        &self,
        run: ProbeRunId,
        status: ProbeRunStatus,
        limit: Option<i64>,
        steps: i64,
        failures: i64,
        message: &str,
    ) -> Result<ProbeRunId, StoreError> {
        self.engine
            .store()
            .finish_probe_run(
                run,
                &ProbeRunEnd {
                    status,
                    context_limit: limit,
                    steps,
                    failures,
                    message: message.to_string(),
                    at: UnixMs::now(),
                },
            )
            .await?;
        self.engine.metrics().probe_run(failures.max(0) as u64);
        tracing::info!(run = run.0, status = %status, summary = message, "probe run finished");
        Ok(run)
    }

    /// The prefix cache stays within a namespace: `owner` sends a marked prompt of a few pages
    /// twice (the second is served from its cache, when the cache is on), then `other` sends
    /// the very same prompt, which must not be served from `owner`'s cache. Probe tenants are
    /// expected in namespaces of their own (the tenants file places none of them in a shared
    /// one), so any cached token in `other`'s answer is a leak.
    async fn prefix_isolation(
        &self,
        run: ProbeRunId,
        owner: &ProbeTenant,
        other: &ProbeTenant,
        step: i64,
        model: &str,
    ) -> Result<ProbeResult, StoreError> {
        let s = &self.settings;
        let tid = TenantId::new(owner.tenant.clone());
        let start = self.engine.issue_marker(&tid).await?;
        let end = self.engine.issue_marker(&tid).await?;
        let words = 8 * s.page_size;
        let prompt = plan::prompt(&start.marker, &end.marker, words);
        let cached = |a: &Result<Answer, http::ProbeHttpError>| match a {
            Ok(Answer::Completed { cached_tokens, .. }) => Some(cached_tokens.unwrap_or(0)),
            _ => None,
        };
        let (client, url, wait) = (&self.http, &s.router_url, s.request_timeout);
        let first = http::complete(client, url, &owner.api_key, model, &prompt, 1, wait).await;
        let again = http::complete(client, url, &owner.api_key, model, &prompt, 1, wait).await;
        let crossed = http::complete(client, url, &other.api_key, model, &prompt, 1, wait).await;
        let (outcome, detail) = match (cached(&first), cached(&again), cached(&crossed)) {
            (_, _, Some(n)) if n > 0 => (
                ProbeOutcome::Leak,
                format!(
                    "{} was served {n} prompt tokens from the prefix cache for a prompt only {} \
                     had sent",
                    other.tenant, owner.tenant
                ),
            ),
            (Some(_), Some(hit), Some(0)) => (
                ProbeOutcome::Accepted,
                if hit > 0 {
                    format!(
                        "{} reused {hit} cached prompt tokens; {} reused none",
                        owner.tenant, other.tenant
                    )
                } else {
                    format!(
                        "no cache hit for {} either (prefix cache off or evicted); {} reused none",
                        owner.tenant, other.tenant
                    )
                },
            ),
            _ => (
                ProbeOutcome::TransportError,
                "a prefix-isolation request did not complete".to_string(),
            ),
        };
        let (prompt_tokens, ttft_ms) = match &crossed {
            Ok(Answer::Completed {
                prompt_tokens,
                ttft_ms,
                ..
            }) => (prompt_tokens.map(i64::from), Some(*ttft_ms as i64)),
            _ => (None, None),
        };
        let result = ProbeResult {
            tenant: other.tenant.clone(),
            step,
            prompt_words: i64::from(words),
            expected_tokens: s
                .tokens
                .as_ref()
                .and_then(|t| t.count(&prompt).ok())
                .map(i64::from),
            outcome,
            http_status: crossed.as_ref().ok().map(|_| 200),
            prompt_tokens,
            ttft_ms,
            detail: format!("prefix isolation: {detail}"),
            at: UnixMs::now(),
        };
        let details = json!({
            "source": "probe",
            "check": "prefix_isolation",
            "run_id": run.0,
            "step": step,
            "detail": result.detail,
            "markers": [start.marker, end.marker],
        });
        self.record(run, result, Some(owner.tenant.clone()), details)
            .await
    }

    /// The side-channel audit (see [`side_channel`]): `s.side_channel.rounds` rounds of the
    /// owner's prompt warm, the other tenant on it, and the other tenant cold, then
    /// `s.side_channel.order_rounds` rounds of the other tenant's mixed batch. Each channel is
    /// recorded as one step (the timing step's first-token time the cross requests' median),
    /// with one verdict per worker in `isolation_audits`; a leak on any worker opens a
    /// `side_channel` incident naming it; the p-values go to the metrics.
    async fn side_channel(
        &self,
        run: ProbeRunId,
        owner: &ProbeTenant,
        other: &ProbeTenant,
        step: i64,
        limit: u32,
        model: &str,
    ) -> Result<Vec<ProbeResult>, StoreError> {
        let s = &self.settings;
        // Within half the context, whatever the pages (a filler word is a token or more).
        let words = (side_channel::PROMPT_PAGES * s.page_size)
            .min(limit / 2)
            .max(1);
        let mut results = Vec::new();
        if s.side_channel.rounds > 0 {
            let r = self
                .timing_channel(run, owner, other, step, words, model)
                .await?;
            results.push(r);
        }
        if s.side_channel.order_rounds > 0 {
            let step = step + results.len() as i64;
            let r = self
                .order_channel(run, owner, other, step, words, model)
                .await?;
            results.push(r);
        }
        Ok(results)
    }

    /// One side-channel audit request: its first-token time and, when receipts are signed,
    /// which prefill worker computed it. `None` when it did not complete.
    async fn audit_request(
        &self,
        tenant: &ProbeTenant,
        prompt: &str,
        model: &str,
    ) -> Option<(f64, http::Attribution)> {
        let s = &self.settings;
        let r = http::Request {
            router: &s.router_url,
            api_key: &tenant.api_key,
            model,
            prompt,
            max_tokens: 1,
            timeout: s.request_timeout,
        };
        match http::complete_attributed(&self.http, &r, s.receipt_key.as_ref()).await {
            Ok((Answer::Completed { ttft_ms, .. }, a)) => Some((ttft_ms as f64, a)),
            _ => None,
        }
    }

    /// Where a round's requests were computed: one worker, split, or (with receipts on) not
    /// known because a receipt was missing or did not verify (the reason).
    fn placed(&self, attributions: &[&http::Attribution]) -> Result<Placement, String> {
        if self.settings.receipt_key.is_none() {
            return Ok(side_channel::placement(attributions.iter().map(|_| None)));
        }
        let mut workers = Vec::new();
        for a in attributions {
            match a {
                http::Attribution::Worker(w) => workers.push(Some(w.as_str())),
                http::Attribution::Unknown => return Err("no receipt came back".to_string()),
                http::Attribution::Unverified(why) => return Err(format!("a receipt {why}")),
            }
        }
        Ok(side_channel::placement(workers))
    }

    /// The timing channel: first-token times of warm, cross and cold requests per round.
    async fn timing_channel(
        &self,
        run: ProbeRunId,
        owner: &ProbeTenant,
        other: &ProbeTenant,
        step: i64,
        words: u32,
        model: &str,
    ) -> Result<ProbeResult, StoreError> {
        let s = &self.settings;
        let mut rounds = Vec::new();
        let mut missed = Missed::default();
        for round in 0..s.side_channel.rounds {
            let mine = self.marked_prompt(owner, words).await?;
            let fresh = self.marked_prompt(other, words).await?;
            let primed = self.audit_request(owner, &mine, model).await;
            let warm = self.audit_request(owner, &mine, model).await;
            // Alternate which of the other tenant's two goes first, so neither always follows
            // the owner's warm request.
            let (cross, cold) = if round % 2 == 0 {
                let c = self.audit_request(other, &mine, model).await;
                (c, self.audit_request(other, &fresh, model).await)
            } else {
                let c = self.audit_request(other, &fresh, model).await;
                (self.audit_request(other, &mine, model).await, c)
            };
            let (Some(p), Some(w), Some(x), Some(c)) = (primed, warm, cross, cold) else {
                missed.failed += 1;
                continue;
            };
            match missed.placed(self.placed(&[&p.1, &w.1, &x.1, &c.1])) {
                Some(worker) => rounds.push(side_channel::Round {
                    worker,
                    warm: w.0,
                    cross: x.0,
                    cold: c.0,
                }),
                None => continue,
            }
        }
        let threshold = s.side_channel.threshold;
        let median = side_channel::median;
        let mut leaks = Vec::new();
        let mut parts = Vec::new();
        let all_cross: Vec<f64> = rounds.iter().map(|r| r.cross).collect();
        for (worker, t) in side_channel::by_worker(&rounds) {
            let v = side_channel::judge(&t, threshold);
            self.engine
                .metrics()
                .isolation(&worker, v.cross_p, v.control_p);
            self.engine
                .store()
                .insert_isolation_audit(&NewIsolationAudit {
                    run_id: run,
                    worker: worker.clone(),
                    channel: IsolationChannel::Timing,
                    rounds: t.cold.len() as i64,
                    p: v.cross_p,
                    control_p: Some(v.control_p),
                    threshold,
                    conclusive: v.conclusive,
                    leak: v.leak,
                    at: UnixMs::now(),
                })
                .await?;
            parts.push(format!(
                "worker {worker}: KS D = {:.2}, p = {:.2e}; control (warm vs cold) p = {:.2e}; \
                 medians warm {:.0} / cross {:.0} / cold {:.0} ms over {} rounds{}",
                v.cross_d,
                v.cross_p,
                v.control_p,
                median(&t.warm),
                median(&t.cross),
                median(&t.cold),
                t.cold.len(),
                if v.conclusive {
                    ""
                } else {
                    " (inconclusive: the control saw no cache hit)"
                },
            ));
            if v.leak {
                leaks.push(json!({
                    "worker": worker,
                    "ks_d": v.cross_d,
                    "ks_p": v.cross_p,
                    "control_p": v.control_p,
                    "ttft_ms": {"warm": t.warm, "cross": t.cross, "cold": t.cold},
                }));
            }
        }
        let report = ChannelReport {
            channel: IsolationChannel::Timing,
            words,
            ttft_ms: (!all_cross.is_empty()).then(|| median(&all_cross) as i64),
            headline: format!(
                "side channel: {} on {}'s cached prompt vs cold (threshold {threshold:.0e})",
                other.tenant, owner.tenant
            ),
            parts,
            leaks,
            missed,
        };
        self.channel_result(run, (owner, other), step, report).await
    }

    /// The scheduling-order channel (PromptPeek): the order of the other tenant's mixed batch.
    async fn order_channel(
        &self,
        run: ProbeRunId,
        owner: &ProbeTenant,
        other: &ProbeTenant,
        step: i64,
        words: u32,
        model: &str,
    ) -> Result<ProbeResult, StoreError> {
        let s = &self.settings;
        // Per worker: rounds and the cross-first pair count summed over them.
        let mut per_worker: BTreeMap<String, (usize, u32)> = BTreeMap::new();
        let mut missed = Missed::default();
        for _ in 0..s.side_channel.order_rounds {
            let mut owned = Vec::new();
            let mut fresh = Vec::new();
            for _ in 0..side_channel::ORDER_PAIRS {
                owned.push(self.marked_prompt(owner, words).await?);
                fresh.push(self.marked_prompt(other, words).await?);
            }
            let mut primes = Vec::new();
            for p in &owned {
                primes.push(self.audit_request(owner, p, model).await);
            }
            // The batch in positions drawn at random: under isolation its order cannot tell
            // which positions hold the owner's prompts.
            let mut batch: Vec<(bool, &str)> = owned
                .iter()
                .map(|p| (true, p.as_str()))
                .chain(fresh.iter().map(|p| (false, p.as_str())))
                .collect();
            batch.shuffle(&mut rand::rng());
            let start = Instant::now();
            let sent = futures::future::join_all(batch.iter().enumerate().map(
                |(i, &(cross, prompt))| async move {
                    tokio::time::sleep(ORDER_STAGGER * i as u32).await;
                    let at = start.elapsed().as_secs_f64() * 1e3;
                    let r = self.audit_request(other, prompt, model).await;
                    r.map(|(ttft, a)| (cross, at + ttft, a))
                },
            ))
            .await;
            let (Some(primes), Some(sent)) = (
                primes.into_iter().collect::<Option<Vec<_>>>(),
                sent.into_iter().collect::<Option<Vec<_>>>(),
            ) else {
                missed.failed += 1;
                continue;
            };
            let attributions: Vec<&http::Attribution> = primes
                .iter()
                .map(|p| &p.1)
                .chain(sent.iter().map(|x| &x.2))
                .collect();
            let Some(worker) = missed.placed(self.placed(&attributions)) else {
                continue;
            };
            let times = |want: bool| -> Vec<f64> {
                sent.iter().filter(|x| x.0 == want).map(|x| x.1).collect()
            };
            let e = per_worker.entry(worker).or_default();
            e.0 += 1;
            e.1 += side_channel::cross_first(&times(true), &times(false));
        }
        let threshold = s.side_channel.threshold;
        let (mut leaks, mut parts) = (Vec::new(), Vec::new());
        let pairs = side_channel::ORDER_PAIRS;
        for (worker, (rounds, first)) in per_worker {
            let p = side_channel::order_p(pairs, pairs, rounds, first);
            let leak = p < threshold;
            self.engine.metrics().isolation_order(&worker, p);
            self.engine
                .store()
                .insert_isolation_audit(&NewIsolationAudit {
                    run_id: run,
                    worker: worker.clone(),
                    channel: IsolationChannel::Order,
                    rounds: rounds as i64,
                    p,
                    control_p: None,
                    threshold,
                    conclusive: true,
                    leak,
                    at: UnixMs::now(),
                })
                .await?;
            let of = rounds * pairs * pairs;
            parts.push(format!(
                "worker {worker}: the cross request came first in {first} of {of} (cross, cold) \
                 pairs over {rounds} rounds (chance: half), exact p = {p:.2e}"
            ));
            if leak {
                leaks.push(json!({
                    "worker": worker,
                    "order_p": p,
                    "cross_first_pairs": first,
                    "pairs": of,
                }));
            }
        }
        let report = ChannelReport {
            channel: IsolationChannel::Order,
            words,
            ttft_ms: None,
            headline: format!(
                "side channel, scheduling order: {}'s mixed batches, half on {}'s cached prompts \
                 (threshold {threshold:.0e})",
                other.tenant, owner.tenant
            ),
            parts,
            leaks,
            missed,
        };
        self.channel_result(run, (owner, other), step, report).await
    }

    /// Records one channel's step; a leak opens one `side_channel` incident naming the workers
    /// it was found on.
    async fn channel_result(
        &self,
        run: ProbeRunId,
        (owner, other): (&ProbeTenant, &ProbeTenant),
        step: i64,
        c: ChannelReport,
    ) -> Result<ProbeResult, StoreError> {
        let ChannelReport {
            channel,
            words,
            ttft_ms,
            headline,
            parts,
            leaks,
            missed,
        } = c;
        let counted = !parts.is_empty();
        let detail = format!(
            "{headline}: {}{}",
            if counted {
                parts.join("; ")
            } else {
                "no round counted".to_string()
            },
            missed.describe(),
        );
        let outcome = if !leaks.is_empty() {
            ProbeOutcome::Leak
        } else if !counted && missed.failed > 0 {
            ProbeOutcome::TransportError
        } else {
            ProbeOutcome::Accepted
        };
        let result = ProbeResult {
            tenant: other.tenant.clone(),
            step,
            prompt_words: i64::from(words),
            expected_tokens: None,
            outcome,
            http_status: counted.then_some(200),
            prompt_tokens: None,
            ttft_ms,
            detail: detail.clone(),
            at: UnixMs::now(),
        };
        self.engine
            .store()
            .insert_probe_result(run, &result)
            .await?;
        if !leaks.is_empty() {
            let details = json!({
                "source": "probe",
                "check": "side_channel",
                "channel": channel.as_str(),
                "run_id": run.0,
                "step": step,
                "detail": detail,
                "threshold": self.settings.side_channel.threshold,
                "workers": leaks,
            });
            let (tenant, owner) = (&other.tenant, Some(owner.tenant.clone()));
            self.open_incident(IncidentKind::SideChannel, tenant, owner, details, result.at)
                .await?;
        }
        Ok(result)
    }

    /// A prompt of `words` filler words between two fresh markers issued to `tenant`.
    async fn marked_prompt(&self, tenant: &ProbeTenant, words: u32) -> Result<String, StoreError> {
        let tid = TenantId::new(tenant.tenant.clone());
        let start = self.engine.issue_marker(&tid).await?;
        let end = self.engine.issue_marker(&tid).await?;
        Ok(plan::prompt(&start.marker, &end.marker, words))
    }

    async fn step(
        &self,
        run: ProbeRunId,
        tenant: &ProbeTenant,
        step: i64,
        words: u32,
        limit: u32,
        model: &str,
    ) -> Result<ProbeResult, StoreError> {
        let s = &self.settings;
        let tid = TenantId::new(tenant.tenant.clone());
        let start = self.engine.issue_marker(&tid).await?;
        let end = self.engine.issue_marker(&tid).await?;
        let prompt = plan::prompt(&start.marker, &end.marker, words);
        let expected = s.tokens.as_ref().and_then(|t| t.count(&prompt).ok());
        let spec = StepSpec {
            words,
            expected_tokens: expected,
            max_tokens: s.max_tokens,
            limit,
        };
        // The request may last as long as the step's limit allows (a filler word is at least a
        // token, so the words bound the prompt from below when no tokenizer counts it), so a
        // slow suite's answer is judged by the limit, not cut off by the client.
        let paced = LatencyBounds {
            pace_tokens_per_s: self.pace_lock().tokens_per_s(),
            ..s.latency
        };
        let timeout = s
            .request_timeout
            .max(Duration::from_millis(paced.limit_ms(expected.unwrap_or(words))) + LIMIT_SLACK);
        let answer = http::complete(
            &self.http,
            &s.router_url,
            &tenant.api_key,
            model,
            &prompt,
            s.max_tokens,
            timeout,
        )
        .await;
        let mut leaked = Vec::new();
        let (outcome, detail, http_status, prompt_tokens, ttft) = match &answer {
            Err(e) => (
                ProbeOutcome::TransportError,
                e.to_string(),
                None,
                None,
                None,
            ),
            Ok(a) => {
                let (mut outcome, mut detail) = plan::judge(&spec, a, paced);
                if let (
                    ProbeOutcome::Accepted,
                    Answer::Completed {
                        prompt_tokens: Some(pt),
                        ttft_ms,
                        ..
                    },
                ) = (outcome, a)
                {
                    self.pace_lock().observe(*pt, *ttft_ms);
                }
                let (status, pt, ttft) = match a {
                    Answer::Completed {
                        text,
                        prompt_tokens,
                        ttft_ms,
                        ..
                    } => {
                        leaked = self.engine.foreign_markers(&tid, text);
                        (
                            Some(200),
                            prompt_tokens.map(i64::from),
                            Some(*ttft_ms as i64),
                        )
                    }
                    Answer::Refused { status, .. } => (Some(i64::from(*status)), None, None),
                };
                if let Some(f) = leaked.first() {
                    // A leak outranks every other finding.
                    outcome = ProbeOutcome::Leak;
                    detail = format!("response carries {} issued to {}", f.marker, f.owner);
                }
                (outcome, detail, status, pt, ttft)
            }
        };
        let result = ProbeResult {
            tenant: tenant.tenant.clone(),
            step,
            prompt_words: i64::from(words),
            expected_tokens: expected.map(i64::from),
            outcome,
            http_status,
            prompt_tokens,
            ttft_ms: ttft,
            detail: detail.clone(),
            at: UnixMs::now(),
        };
        let details = json!({
            "source": "probe",
            "run_id": run.0,
            "step": step,
            "prompt_words": words,
            "expected_tokens": expected,
            "http_status": http_status,
            "prompt_tokens": prompt_tokens,
            "ttft_ms": ttft,
            "detail": detail,
            "markers": [start.marker, end.marker],
        });
        let other = leaked.first().map(|f| f.owner.as_str().to_string());
        self.record(run, result, other, details).await
    }

    fn pace_lock(&self) -> std::sync::MutexGuard<'_, pace::Pace> {
        // A panic elsewhere cannot leave the window half-written: take it as it is.
        self.pace
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stores one step's result under `run` and, when its outcome is a finding, opens the
    /// incident (`other_tenant`: the tenant whose marker or cache it reached).
    async fn record(
        &self,
        run: ProbeRunId,
        result: ProbeResult,
        other_tenant: Option<String>,
        details: serde_json::Value,
    ) -> Result<ProbeResult, StoreError> {
        self.engine
            .store()
            .insert_probe_result(run, &result)
            .await?;
        if let Some(kind) = result.outcome.incident_kind() {
            self.open_incident(kind, &result.tenant, other_tenant, details, result.at)
                .await?;
        }
        Ok(result)
    }

    /// Opens an incident of `kind` about probe tenant `tenant` (and `other_tenant`).
    async fn open_incident(
        &self,
        kind: IncidentKind,
        tenant: &str,
        other_tenant: Option<String>,
        details: serde_json::Value,
        at: UnixMs,
    ) -> Result<(), StoreError> {
        self.engine
            .open_incident(NewIncident {
                kind,
                severity: kind.severity(),
                node: None,
                request_id: None,
                tenant: Some(tenant.to_string()),
                other_tenant,
                page: None,
                generation: None,
                details: details.to_string(),
                at,
            })
            .await?;
        Ok(())
    }
}
