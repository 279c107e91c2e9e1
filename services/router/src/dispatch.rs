//! One request's life after admission, as one enum owned by one [`Flight`]:
//!
//! ```text
//! Admitted ──Reserve(decode)──▶ Reserved{grant} ──Prefill(prefill, grant)──▶ Prefilled{reply}
//!   ──Generate(decode, manifest)──▶ Streaming{tokens} ──finish──▶ Finished
//! any step ──error / deadline──▶ Failed            (drop at any point = client gone)
//! ```
//!
//! Every transition consumes the old state. The [`AbortGuard`] is armed from the start and only
//! `Finished` disarms it, so `Failed`, a deadline and a dropped `Flight` all abort both halves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pagewarden_common::namespace::Namespace;
use pagewarden_common::{AttemptId, RequestId, TenantId};
use pagewarden_model::{FinishReason, SamplingParams};
use pagewarden_proto::convert::{finish_reason, request_ref};
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::{
    GenerateRequest, Logprobs, PrefillReply, PrefillRequest, RequestRef, ReserveRequest,
    TokenEvent, WriteGrant,
};
use tonic::Streaming;
use tracing::Instrument;

use crate::admission::AdmittedPrompt;
use crate::error::{from_status, Half, RouterError};
use crate::guard::{AbortGuard, AbortReason};
use crate::metrics::{Metrics, Phase};
use crate::openai::Usage;
use crate::provenance::{Provenance, RecomputeCapture};
use crate::telemetry::traced;
use crate::token_rate::TokenMeter;
use crate::workers::{Lease, WorkerPool};

/// One generated token relayed to the client; the last one carries `finish`.
#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    /// Token id.
    pub id: u32,
    /// Text it completes (may be empty mid-UTF-8 or inside a held-back stop prefix).
    pub text: String,
    /// Set on the last token only.
    pub finish: Option<FinishReason>,
    /// Its logprobs, when requested (never on an end marker, which is no completion token).
    pub logprobs: Option<Logprobs>,
    /// On a request's first token, when `prompt_logprobs` asked for them: the logprobs of
    /// every prompt token after the first, from prefill.
    pub prompt_logprobs: Vec<Logprobs>,
}

/// Timeouts for dispatch.
#[derive(Clone, Copy, Debug)]
pub struct DispatchConfig {
    /// Whole-request deadline (`--request-timeout`), when the operator set one.
    pub request_timeout: Option<Duration>,
    /// Bound on each best-effort `Abort` RPC.
    pub abort_timeout: Duration,
    /// A request fails once its decode worker has answered no Info poll for this long (a
    /// frozen decode; its prefill would wait on it for good).
    pub decode_unresponsive: Duration,
}

/// Everything admission produced for one request.
pub struct Job {
    /// The request id.
    pub id: RequestId,
    /// Who asked.
    pub tenant: TenantId,
    /// Prompt tokens and completion budget, checked against the context.
    pub admitted: AdmittedPrompt,
    /// Sampling, its `max_tokens` the admitted one.
    pub sampling: SamplingParams,
    /// When the HTTP request arrived (for TTFT).
    pub arrived: Instant,
    /// The tenant's weight in the workers' queues (the tenants file's `weight`).
    pub weight: u32,
    /// The tenant's prefix-cache namespace (prefill reuses cached KV only within it).
    pub namespace: Namespace,
    /// Charges the tenant's relayed completion tokens to its tokens-per-minute budget.
    pub meter: TokenMeter,
    /// Picked for the recompute audit: decode is asked for every token's logprob (the client
    /// sees them only if it asked), and the choice's prompt and served logprobs are kept.
    pub recompute: bool,
}

/// The request's state (see the module diagram). Exactly one of these at any time.
enum RequestState {
    Admitted,
    Reserved { grant: WriteGrant },
    Prefilled { reply: PrefillReply },
    Streaming { tokens: Streaming<TokenEvent> },
    Finished(FinishReason),
    Failed,
}

/// Other decode workers a request tries when the one it picked answers `UNAVAILABLE` to its
/// `Reserve` (draining for a restart, or gone), at most.
const DECODE_RETRIES: u32 = 2;

/// A dispatched request: its state, its workers and its abort guard.
pub struct Flight {
    state: RequestState,
    /// Where another decode is picked from when this one is unavailable.
    pool: Arc<WorkerPool>,
    cfg: DispatchConfig,
    /// The last call's half, when it failed as `UNAVAILABLE`.
    unavailable: Option<Half>,
    decode_retries: u32,
    req: RequestRef,
    job: Job,
    decode: Lease,
    prefill: Lease,
    guard: AbortGuard,
    deadline: Option<Deadline>,
    metrics: Arc<Metrics>,
    span: tracing::Span,
    completion_tokens: u32,
    /// Prompt tokens whose KV prefill took from its prefix cache.
    cached_tokens: u32,
    /// Prefill's logprobs of the prompt's tokens, until the first token carries them.
    prompt_logprobs: Vec<Logprobs>,
    last_token_at: Option<Instant>,
    ttft: Option<Duration>,
    /// When decode granted the reservation and when prefill replied (the TTFT's phases).
    granted_at: Option<Instant>,
    prefilled_at: Option<Instant>,
    /// What the choice is computed over, as the workers report it.
    provenance: Provenance,
}

impl Flight {
    /// Picks the request's namespace's decode and prefill workers (or the least-loaded ones
    /// when those are busy) and arms the abort guard. Sends
    /// nothing yet; the first [`Flight::next`] does.
    pub fn start(
        pool: &Arc<WorkerPool>,
        cfg: DispatchConfig,
        metrics: Arc<Metrics>,
        job: Job,
    ) -> Result<Self, RouterError> {
        let decode = pool.pick_for(Half::Decode, &job.namespace)?;
        let prefill = pool.pick_for(Half::Prefill, &job.namespace)?;
        let req = request_ref(job.id, AttemptId(1));
        let guard = AbortGuard::new(
            req.clone(),
            decode.worker().clone(),
            prefill.worker().clone(),
            metrics.clone(),
            cfg.abort_timeout,
        );
        let span = tracing::info_span!(
            "request",
            request_id = %job.id,
            tenant = %job.tenant,
            decode = decode.worker().url(),
            prefill = prefill.worker().url(),
        );
        Ok(Self {
            state: RequestState::Admitted,
            pool: pool.clone(),
            cfg,
            unavailable: None,
            decode_retries: 0,
            req,
            deadline: cfg.request_timeout.map(|within| Deadline {
                at: tokio::time::Instant::from_std(job.arrived + within),
                within,
            }),
            decode,
            prefill,
            guard,
            metrics,
            span,
            completion_tokens: 0,
            cached_tokens: 0,
            prompt_logprobs: Vec::new(),
            last_token_at: None,
            ttft: None,
            granted_at: None,
            prefilled_at: None,
            provenance: Provenance {
                recompute: job.recompute.then(|| RecomputeCapture {
                    prompt: job.admitted.prompt.clone(),
                    served: Vec::new(),
                    temperature: job.sampling.temperature,
                }),
                ..Provenance::default()
            },
            job,
        })
    }

    /// Completion tokens relayed so far (marker-only events do not count).
    pub fn completion_tokens(&self) -> u32 {
        self.completion_tokens
    }

    /// How the generation ended, once it has.
    pub fn finish(&self) -> Option<FinishReason> {
        match self.state {
            RequestState::Finished(f) => Some(f),
            RequestState::Admitted
            | RequestState::Reserved { .. }
            | RequestState::Prefilled { .. }
            | RequestState::Streaming { .. }
            | RequestState::Failed => None,
        }
    }

    /// Prompt tokens.
    pub fn prompt_tokens(&self) -> u32 {
        self.job.admitted.prompt.len() as u32
    }

    /// The response's `usage` so far: prompt tokens (and how many of them came from the
    /// prefix cache) and completion tokens.
    pub fn usage(&self) -> Usage {
        Usage::new(
            self.prompt_tokens(),
            self.completion_tokens,
            self.cached_tokens,
        )
    }

    /// When the HTTP request arrived.
    pub fn arrived(&self) -> Instant {
        self.job.arrived
    }

    /// Time to first token, once there was one.
    pub fn ttft(&self) -> Option<Duration> {
        self.ttft
    }

    /// From arrival to decode's grant, once granted.
    pub fn scheduled(&self) -> Option<Duration> {
        self.granted_at.map(|t| t - self.job.arrived)
    }

    /// From arrival to the last token relayed so far.
    pub fn last_token(&self) -> Option<Duration> {
        self.last_token_at.map(|t| t - self.job.arrived)
    }

    /// The request id.
    pub fn id(&self) -> RequestId {
        self.job.id
    }

    /// The tenant.
    pub fn tenant(&self) -> &TenantId {
        &self.job.tenant
    }

    /// What the choice was computed over, so far.
    pub fn provenance(&self) -> &Provenance {
        &self.provenance
    }

    /// Drives the request to its next token. `None` after the last token or after an error.
    pub async fn next(&mut self) -> Option<Result<Token, RouterError>> {
        loop {
            let state = std::mem::replace(&mut self.state, RequestState::Failed);
            let next = match state {
                RequestState::Admitted => match self.reserve().await {
                    Ok(grant) => Ok(RequestState::Reserved { grant }),
                    // Nothing was reserved: a draining or vanished decode sends the request to
                    // another one (a rolling restart fails no request).
                    Err(_) if self.unavailable == Some(Half::Decode) && self.other_decode() => {
                        self.state = RequestState::Admitted;
                        continue;
                    }
                    Err(e) => Err(e),
                },
                RequestState::Reserved { grant } => self
                    .prefill(grant)
                    .await
                    .map(|reply| RequestState::Prefilled { reply }),
                RequestState::Prefilled { reply } => self
                    .generate(reply)
                    .await
                    .map(|tokens| RequestState::Streaming { tokens }),
                RequestState::Streaming { mut tokens } => match self.receive(&mut tokens).await {
                    Ok(Some(token)) => {
                        self.state = match token.finish {
                            Some(finish) => {
                                self.guard.disarm();
                                RequestState::Finished(finish)
                            }
                            None => RequestState::Streaming { tokens },
                        };
                        return Some(Ok(token));
                    }
                    Ok(None) => Ok(RequestState::Streaming { tokens }),
                    Err(e) => Err(e),
                },
                done @ (RequestState::Finished(_) | RequestState::Failed) => {
                    self.state = done;
                    return None;
                }
            };
            match next {
                Ok(state) => self.state = state,
                Err(e) => {
                    tracing::warn!(parent: &self.span, error = %e, "request failed");
                    return Some(Err(e));
                }
            }
        }
    }

    /// Runs one RPC under the request's deadline and span; classifies failures once.
    async fn call<T>(
        &mut self,
        half: Half,
        fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, RouterError> {
        let decode = self.decode.worker().clone();
        let outcome = tokio::select! {
            r = within(self.deadline, fut.instrument(self.span.clone())) => r,
            () = decode.silent_for(self.cfg.decode_unresponsive) => {
                return Err(self.decode_unresponsive());
            }
        };
        match outcome {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => {
                self.guard.set_reason(failed(half));
                if status.code() == tonic::Code::Unavailable {
                    self.lease(half).worker().mark_down(status.to_string());
                    self.unavailable = Some(half);
                }
                Err(from_status(half, &status))
            }
            Err(Elapsed(within)) => {
                self.guard.set_reason(AbortReason::Deadline);
                Err(RouterError::Timeout(within))
            }
        }
    }

    /// Where the time to first token went, phase by phase: metrics, and a debug line.
    fn first_token_phases(&self, now: Instant) {
        let (Some(granted), Some(prefilled)) = (self.granted_at, self.prefilled_at) else {
            return;
        };
        let phases = [
            (Phase::Reserve, granted - self.job.arrived),
            (Phase::Prefill, prefilled - granted),
            (Phase::Generate, now - prefilled),
        ];
        for (phase, d) in phases {
            self.metrics.phase(phase, d.as_secs_f64());
        }
        let [reserve, prefill, generate] = phases.map(|(_, d)| d.as_secs_f64() * 1e3);
        tracing::debug!(
            parent: &self.span,
            reserve_ms = reserve,
            prefill_ms = prefill,
            generate_ms = generate,
            "first token"
        );
    }

    /// The request's decode worker stopped answering: both halves are aborted.
    fn decode_unresponsive(&mut self) -> RouterError {
        self.guard.set_reason(AbortReason::DecodeFailed);
        RouterError::Worker {
            half: Half::Decode,
            message: format!(
                "the decode worker answered nothing for {:?}",
                self.cfg.decode_unresponsive
            ),
        }
    }

    /// Moves a request whose `Reserve` found its decode unavailable to another live decode,
    /// as a new attempt (the old one reserved nothing, so its guard is disarmed). False when
    /// there is none or the retries are spent.
    fn other_decode(&mut self) -> bool {
        if self.decode_retries >= DECODE_RETRIES {
            return false;
        }
        let Ok(lease) = self.pool.pick(Half::Decode) else {
            return false;
        };
        if Arc::ptr_eq(lease.worker(), self.decode.worker()) {
            return false;
        }
        self.decode_retries += 1;
        self.unavailable = None;
        tracing::info!(parent: &self.span, decode = lease.worker().url(), "decode unavailable: trying another");
        self.req = request_ref(self.job.id, AttemptId(1 + self.decode_retries));
        self.guard.disarm();
        self.guard = AbortGuard::new(
            self.req.clone(),
            lease.worker().clone(),
            self.prefill.worker().clone(),
            self.metrics.clone(),
            self.cfg.abort_timeout,
        );
        self.decode = lease;
        true
    }

    fn lease(&self, half: Half) -> &Lease {
        match half {
            Half::Decode => &self.decode,
            Half::Prefill => &self.prefill,
        }
    }

    /// A reply that names another request or attempt is stale (I5): counted, and this request
    /// fails rather than use it.
    fn check_ref(&mut self, half: Half, got: Option<&RequestRef>) -> Result<(), RouterError> {
        if got == Some(&self.req) {
            return Ok(());
        }
        self.metrics.stale_messages.inc();
        self.guard.set_reason(failed(half));
        Err(RouterError::Worker {
            half,
            message: "reply names another request or attempt".into(),
        })
    }

    /// The namespace as the workers get it: none for a request that scores its prompt (every
    /// prompt position is computed, so nothing is read from or put in the prefix cache).
    fn wire_namespace(&self) -> Vec<u8> {
        match self.job.sampling.prompt_logprobs {
            Some(_) => Vec::new(),
            None => self.job.namespace.as_bytes().to_vec(),
        }
    }

    /// The sampling the workers get: the request's, asking for each token's logprob (no top
    /// ones) when the choice is picked for the recompute audit and the client asked for none.
    fn sampling(&self) -> pb::SamplingParams {
        let mut wire = pb::SamplingParams::from(&self.job.sampling);
        if self.job.recompute && wire.logprobs.is_none() {
            wire.logprobs = Some(0);
        }
        wire
    }

    async fn reserve(&mut self) -> Result<WriteGrant, RouterError> {
        let msg = ReserveRequest {
            req: Some(self.req.clone()),
            tenant: self.job.tenant.to_string(),
            prompt_tokens: self.prompt_tokens(),
            sampling: Some(self.sampling()),
            // Decode recomputes a preempted sequence from them; a repetition penalty counts them.
            prompt_token_ids: self.job.admitted.prompt.clone(),
            tenant_weight: self.job.weight,
            namespace: self.wire_namespace(),
        };
        let mut client = self.decode.worker().decode();
        let reply = self
            .call(
                Half::Decode,
                async move { client.reserve(traced(msg)).await },
            )
            .await?;
        self.check_ref(Half::Decode, reply.req.as_ref())?;
        self.granted_at = Some(Instant::now());
        let grant = reply.grant.ok_or_else(|| missing(Half::Decode, "grant"))?;
        self.provenance.decode_worker = worker_name(self.decode.worker());
        self.provenance.arithmetic[1] = arithmetic(self.decode.worker());
        self.provenance.granted(&grant);
        Ok(grant)
    }

    async fn prefill(&mut self, grant: WriteGrant) -> Result<PrefillReply, RouterError> {
        let msg = PrefillRequest {
            req: Some(self.req.clone()),
            tenant: self.job.tenant.to_string(),
            prompt_tokens: self.job.admitted.prompt.clone(),
            grant: Some(grant),
            sampling: Some(self.sampling()),
            tenant_weight: self.job.weight,
            namespace: self.wire_namespace(),
        };
        let mut client = self.prefill.worker().prefill();
        let mut reply = self
            .call(
                Half::Prefill,
                async move { client.prefill(traced(msg)).await },
            )
            .await?;
        self.check_ref(Half::Prefill, reply.req.as_ref())?;
        if reply.manifest.is_none() {
            self.guard.set_reason(AbortReason::PrefillFailed);
            return Err(missing(Half::Prefill, "manifest"));
        }
        self.cached_tokens = reply.cached_tokens.min(self.prompt_tokens());
        self.provenance.prefill_worker = worker_name(self.prefill.worker());
        self.provenance.arithmetic[0] = arithmetic(self.prefill.worker());
        self.provenance.prefilled(&reply);
        if self.job.sampling.prompt_logprobs.is_some() {
            let want = self.job.admitted.prompt.len() - 1;
            if reply.prompt_logprobs.len() != want {
                self.guard.set_reason(AbortReason::PrefillFailed);
                return Err(RouterError::Worker {
                    half: Half::Prefill,
                    message: format!(
                        "sent {} prompt logprobs for the {want} prompt tokens after the first",
                        reply.prompt_logprobs.len()
                    ),
                });
            }
        }
        self.prompt_logprobs = std::mem::take(&mut reply.prompt_logprobs);
        self.prefilled_at = Some(Instant::now());
        Ok(reply)
    }

    async fn generate(
        &mut self,
        reply: PrefillReply,
    ) -> Result<Streaming<TokenEvent>, RouterError> {
        let msg = GenerateRequest {
            req: Some(self.req.clone()),
            manifest: reply.manifest,
            first_token: reply.first_token,
            first_logprobs: reply.first_logprobs,
        };
        let mut client = self.decode.worker().decode();
        self.call(
            Half::Decode,
            async move { client.generate(traced(msg)).await },
        )
        .await
    }

    /// The next token event for this request; `Ok(None)` for a stale event (dropped, counted).
    async fn receive(
        &mut self,
        tokens: &mut Streaming<TokenEvent>,
    ) -> Result<Option<Token>, RouterError> {
        let decode = self.decode.worker().clone();
        let next = tokio::select! {
            r = within(self.deadline, tokens.message()) => r,
            () = decode.silent_for(self.cfg.decode_unresponsive) => {
                return Err(self.decode_unresponsive());
            }
        };
        let event = match next {
            Ok(Ok(Some(event))) => event,
            Ok(Ok(None)) => {
                self.guard.set_reason(AbortReason::DecodeFailed);
                return Err(RouterError::Worker {
                    half: Half::Decode,
                    message: "token stream ended without a finish reason".into(),
                });
            }
            Ok(Err(status)) => {
                self.guard.set_reason(AbortReason::DecodeFailed);
                return Err(from_status(Half::Decode, &status));
            }
            Err(Elapsed(within)) => {
                self.guard.set_reason(AbortReason::Deadline);
                return Err(RouterError::Timeout(within));
            }
        };
        if event.req.as_ref() != Some(&self.req) {
            self.metrics.stale_messages.inc();
            tracing::warn!(parent: &self.span, "dropped a token event naming another request");
            return Ok(None);
        }
        let finish = match finish_reason(event.finish) {
            Ok(f) => f,
            Err(_) => {
                self.guard.set_reason(AbortReason::DecodeFailed);
                return Err(missing(Half::Decode, "a known finish reason"));
            }
        };
        // A marker-only event ends the stream without a completion token (EOG or abort).
        if !event.marker_only {
            self.completion_tokens += 1;
            self.job.meter.charge(1);
            self.provenance.output_ids.push(event.token);
            let chosen = event.logprobs.as_ref().and_then(|l| l.chosen.as_ref());
            if let (Some(r), Some(c)) = (&mut self.provenance.recompute, chosen) {
                r.served.push(c.logprob);
            }
        }
        if event.account.is_some() {
            self.provenance.account = event.account;
        }
        if self.completion_tokens > self.job.admitted.max_tokens {
            self.guard.set_reason(AbortReason::DecodeFailed);
            return Err(RouterError::Worker {
                half: Half::Decode,
                message: format!(
                    "sent more than max_tokens = {} tokens",
                    self.job.admitted.max_tokens
                ),
            });
        }
        let now = Instant::now();
        match self.last_token_at {
            None => {
                let ttft = now - self.job.arrived;
                self.ttft = Some(ttft);
                self.metrics.first_token(ttft.as_secs_f64());
                self.first_token_phases(now);
            }
            Some(prev) => self.metrics.next_token((now - prev).as_secs_f64()),
        }
        self.last_token_at = Some(now);
        let logprobs = match (self.job.sampling.logprobs, event.marker_only) {
            (Some(_), false) => Some(event.logprobs.ok_or_else(|| {
                self.guard.set_reason(AbortReason::DecodeFailed);
                missing(Half::Decode, "the logprobs the request asked for")
            })?),
            (None, _) | (Some(_), true) => None,
        };
        Ok(Some(Token {
            id: event.token,
            text: event.text,
            finish,
            logprobs,
            prompt_logprobs: std::mem::take(&mut self.prompt_logprobs),
        }))
    }
}

/// The operator's whole-request deadline: when it passes, and the duration it was set to.
#[derive(Clone, Copy, Debug)]
struct Deadline {
    at: tokio::time::Instant,
    within: Duration,
}

/// The deadline passed; it was set to this long.
struct Elapsed(Duration);

/// `fut` under the deadline, when there is one. Without one nothing here times a request out:
/// the workers' queue deadlines bound waiting, the channels' keep-alive a dead worker, and the
/// client's own timeout the rest, so a long prompt that is being computed is never cut off.
async fn within<T>(
    deadline: Option<Deadline>,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, Elapsed> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.at, fut)
            .await
            .map_err(|_| Elapsed(d.within)),
        None => Ok(fut.await),
    }
}

/// How a provenance names a worker: its node id once a poll has told it, else its URL.
fn worker_name(w: &crate::workers::Worker) -> String {
    w.live_info()
        .map_or_else(|| w.url().to_string(), |info| info.node_id)
}

/// A worker's arithmetic as its last poll told it (empty before one did).
fn arithmetic(w: &crate::workers::Worker) -> String {
    w.live_info()
        .map(|info| info.arithmetic)
        .unwrap_or_default()
}

fn failed(half: Half) -> AbortReason {
    match half {
        Half::Decode => AbortReason::DecodeFailed,
        Half::Prefill => AbortReason::PrefillFailed,
    }
}

fn missing(half: Half, what: &str) -> RouterError {
    RouterError::Worker {
        half,
        message: format!("reply is missing {what}"),
    }
}
