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
//! - `side_channel`: the paired timing audit of the prefix cache across tenants.

pub mod http;
pub mod pace;
pub mod plan;
pub mod side_channel;

use std::sync::Arc;
use std::time::Duration;

use pagewarden_common::TenantId;
use serde_json::json;
use tokio::sync::Mutex;

use crate::domain::{IncidentKind, ProbeOutcome, ProbeRunId, ProbeRunStatus, SweepKind, UnixMs};
use crate::engine::Engine;
use crate::store::{NewIncident, ProbeResult, ProbeRunEnd, StoreError};
use crate::tokens::TokenCounter;
use plan::{Answer, LatencyBounds, StepSpec};
use side_channel::{SideChannelSettings, Timings};

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
            if s.side_channel.rounds > 0 {
                let r = self
                    .side_channel(run, owner, other, steps, limit, &model)
                    .await?;
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
    /// owner's prompt warm, the other tenant on it, and the other tenant cold. Recorded as one
    /// step (its first-token time the cross requests' median); a leak opens a `side_channel`
    /// incident; the p-values go to the metrics.
    async fn side_channel(
        &self,
        run: ProbeRunId,
        owner: &ProbeTenant,
        other: &ProbeTenant,
        step: i64,
        limit: u32,
        model: &str,
    ) -> Result<ProbeResult, StoreError> {
        let s = &self.settings;
        // Within half the context, whatever the pages (a filler word is a token or more).
        let words = (side_channel::PROMPT_PAGES * s.page_size)
            .min(limit / 2)
            .max(1);
        let (client, url, wait) = (&self.http, &s.router_url, s.request_timeout);
        let ttft = |a: Result<Answer, http::ProbeHttpError>| match a {
            Ok(Answer::Completed { ttft_ms, .. }) => Some(ttft_ms as f64),
            _ => None,
        };
        let mut t = Timings::default();
        let mut failed = 0u32;
        for round in 0..s.side_channel.rounds {
            let mine = self.marked_prompt(owner, words).await?;
            let fresh = self.marked_prompt(other, words).await?;
            let send = |tenant: &ProbeTenant, prompt: &str| {
                let (key, prompt) = (tenant.api_key.clone(), prompt.to_string());
                async move { http::complete(client, url, &key, model, &prompt, 1, wait).await }
            };
            let primed = ttft(send(owner, &mine).await);
            let warm = ttft(send(owner, &mine).await);
            // Alternate which of the other tenant's two goes first, so neither always follows
            // the owner's warm request.
            let (cross, cold) = if round % 2 == 0 {
                let c = ttft(send(other, &mine).await);
                (c, ttft(send(other, &fresh).await))
            } else {
                let c = ttft(send(other, &fresh).await);
                (ttft(send(other, &mine).await), c)
            };
            match (primed, warm, cross, cold) {
                (Some(_), Some(w), Some(x), Some(c)) => {
                    t.warm.push(w);
                    t.cross.push(x);
                    t.cold.push(c);
                }
                _ => failed += 1,
            }
        }
        let v = side_channel::judge(&t, s.side_channel.threshold);
        // The router does not say which worker served a probe: one series for the suite.
        let worker = "all";
        self.engine
            .metrics()
            .isolation(worker, v.cross_p, v.control_p);
        let median = side_channel::median;
        let detail = format!(
            "side channel: {} on {}'s cached prompt vs cold: KS D = {:.2}, p = {:.2e} (threshold \
             {:.0e}); control (warm vs cold) p = {:.2e}; medians warm {:.0} / cross {:.0} / \
             cold {:.0} ms over {} rounds{}",
            other.tenant,
            owner.tenant,
            v.cross_d,
            v.cross_p,
            s.side_channel.threshold,
            v.control_p,
            median(&t.warm),
            median(&t.cross),
            median(&t.cold),
            t.cold.len(),
            match (v.conclusive, failed) {
                (_, f) if f > 0 => format!(", {f} rounds failed"),
                (false, _) => ": inconclusive, the control saw no cache hit".to_string(),
                (true, _) => String::new(),
            }
        );
        let outcome = if v.leak {
            ProbeOutcome::Leak
        } else if failed > 0 && t.cold.is_empty() {
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
            http_status: (!t.cross.is_empty()).then_some(200),
            prompt_tokens: None,
            ttft_ms: (!t.cross.is_empty()).then(|| median(&t.cross) as i64),
            detail: detail.clone(),
            at: UnixMs::now(),
        };
        self.engine
            .store()
            .insert_probe_result(run, &result)
            .await?;
        if v.leak {
            let details = json!({
                        "source": "probe",
                        "check": "side_channel",
                        "run_id": run.0,
                        "step": step,
                        "worker": worker,
                        "detail": detail,
                        "ks_d": v.cross_d,
                        "ks_p": v.cross_p,
                        "control_p": v.control_p,
                        "threshold": s.side_channel.threshold,
                "ttft_ms": {"warm": t.warm, "cross": t.cross, "cold": t.cold},
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
