//! The scheduler task: the single owner of every request's [`RequestState`], fed by
//! [`Command`]s with `oneshot` replies. Continuous batching: whenever no step is in flight and
//! some request is running, every running sequence goes to the model thread for one
//! `decode_step`; commands keep being served while the step runs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pagewarden_common::admission::Admission;
use pagewarden_common::integrity::{IntegrityEvent, IntegrityKind, IntegritySink};
use pagewarden_common::metrics::WorkerMetrics;
use pagewarden_common::shutdown::Shutdown;
use pagewarden_common::{AttemptId, RequestId, TenantId};
use pagewarden_kvcache::{CommitError, KvPool, Owner, ReserveError, WriteGrant};
use pagewarden_model::Tokenizer;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic::Status;

use crate::compute::{Compute, StepError};
use crate::events;
use crate::output::{Finish, Output};
use crate::sink::{DecodeSink, StreamEnd};
use crate::state::{Entry, GenerateArgs, RequestState, Reservation, Running};

/// How long terminal tombstones are remembered (to recognise stale messages, I5).
const TOMBSTONE_TTL: Duration = Duration::from_secs(300);

/// A request to the scheduler.
pub enum Command {
    Reserve {
        req: RequestId,
        attempt: AttemptId,
        tenant: TenantId,
        prompt_tokens: usize,
        max_tokens: usize,
        reply: oneshot::Sender<Result<WriteGrant, Status>>,
    },
    Generate {
        req: RequestId,
        attempt: AttemptId,
        max_tokens: usize,
        stop: Vec<String>,
        args: GenerateArgs,
        reply: oneshot::Sender<Result<(), Status>>,
    },
    Abort {
        req: RequestId,
        attempt: AttemptId,
        reason: String,
        reply: oneshot::Sender<bool>,
    },
    /// Number of live requests.
    Load { reply: oneshot::Sender<usize> },
}

/// What the scheduler needs.
pub struct SchedulerDeps {
    pub compute: Compute,
    pub tokenizer: Arc<Tokenizer>,
    pub pool: KvPool,
    pub sink: DecodeSink,
    pub admission: Admission,
    pub metrics: Arc<WorkerMetrics>,
    pub integrity: Arc<dyn IntegritySink>,
    pub node_id: String,
    pub max_batch: usize,
}

type StepResult = Vec<(RequestId, Box<Running>, Result<u32, StepError>)>;

struct Scheduler {
    deps: SchedulerDeps,
    table: HashMap<RequestId, Entry>,
    step: Option<JoinHandle<StepResult>>,
}

/// Runs the scheduler until `shutdown` (or every sender is gone).
pub async fn run(deps: SchedulerDeps, mut rx: mpsc::Receiver<Command>, shutdown: Shutdown) {
    let mut s = Scheduler {
        deps,
        table: HashMap::new(),
        step: None,
    };
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        if s.step.is_none() {
            s.start_step();
        }
        tokio::select! {
            cmd = rx.recv() => match cmd {
                Some(cmd) => s.handle(cmd),
                None => break,
            },
            done = async { match s.step.as_mut() { Some(h) => h.await, None => std::future::pending().await } } => {
                s.step = None;
                match done {
                    Ok(results) => s.finish_step(results),
                    Err(e) => tracing::error!(error = %e, "decode step panicked"),
                }
            }
            _ = tick.tick() => s.housekeeping(),
            () = shutdown.cancelled() => break,
        }
    }
    // Dropping the table aborts reservations (revoke) and frees readable pages.
    for (_, entry) in s.table.drain() {
        if let RequestState::Running(r) = entry.state {
            let _ =
                r.tx.send(Err(Status::unavailable("decode worker shutting down")));
        }
    }
}

impl Scheduler {
    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Reserve {
                req,
                attempt,
                tenant,
                prompt_tokens,
                max_tokens,
                reply,
            } => {
                let r = self.reserve(req, attempt, tenant, prompt_tokens, max_tokens);
                let _ = reply.send(r);
            }
            Command::Generate {
                req,
                attempt,
                max_tokens,
                stop,
                args,
                reply,
            } => {
                let r = self.generate(req, attempt, max_tokens, stop, args);
                let _ = reply.send(r);
            }
            Command::Abort {
                req,
                attempt,
                reason,
                reply,
            } => {
                let _ = reply.send(self.abort(req, attempt, &reason));
            }
            Command::Load { reply } => {
                let _ = reply.send(self.live());
            }
        }
        self.deps.metrics.set_active(self.live());
    }

    fn live(&self) -> usize {
        self.table.values().filter(|e| e.state.is_live()).count()
    }

    fn stale(&self, req: RequestId, what: &str) -> Status {
        self.deps.metrics.stale_message();
        self.deps.integrity.report(IntegrityEvent {
            node_id: self.deps.node_id.clone(),
            role: "decode",
            kind: IntegrityKind::StaleMessage,
            request: Some(req),
            tenant: None,
            detail: what.to_string(),
        });
        Status::aborted(format!("stale message: {what}"))
    }

    fn reserve(
        &mut self,
        req: RequestId,
        attempt: AttemptId,
        tenant: TenantId,
        prompt_tokens: usize,
        max_tokens: usize,
    ) -> Result<WriteGrant, Status> {
        // I3: admission before any allocation; a rejection is terminal for this call.
        let admitted = self
            .deps
            .admission
            .check(prompt_tokens, max_tokens)
            .map_err(|r| {
                self.deps.metrics.rejection(r.reason());
                self.deps.metrics.request("rejected");
                crate::service::rejection_status(&r)
            })?;
        if let Some(old) = self.table.get(&req) {
            if old.attempt >= attempt {
                return Err(self.stale(
                    req,
                    &format!("reserve of attempt {} after {}", attempt.0, old.attempt.0),
                ));
            }
            // A newer attempt supersedes the old one.
            self.abort(req, old.attempt, "superseded by a newer attempt");
        }
        let layout = self.deps.pool.layout();
        let needed = admitted.total_tokens().div_ceil(layout.page_size);
        let free = self.deps.pool.stats().free;
        if needed > free {
            self.deps.metrics.rejection("pool_exhausted");
            return Err(Status::resource_exhausted(format!(
                "KV pool busy: request needs {needed} pages, {free} free"
            )));
        }
        let owner = Owner {
            request: req,
            tenant,
        };
        let pages = self
            .deps
            .pool
            .reserve(owner.clone(), prompt_tokens)
            .map_err(|e| match e {
                ReserveError::Exhausted { .. } => {
                    self.deps.metrics.rejection("pool_exhausted");
                    Status::resource_exhausted(e.to_string())
                }
                ReserveError::TooLarge { .. } | ReserveError::ZeroTokens => {
                    Status::invalid_argument(e.to_string())
                }
            })?;
        let grant = pages.grant().clone();
        self.table.insert(
            req,
            Entry {
                attempt,
                expires_at: grant.expires_at,
                ended_at: None,
                state: RequestState::Reserved(Reservation {
                    owner,
                    pages,
                    prompt_tokens,
                    max_tokens,
                }),
            },
        );
        Ok(grant)
    }

    fn generate(
        &mut self,
        req: RequestId,
        attempt: AttemptId,
        max_tokens: usize,
        stop: Vec<String>,
        args: GenerateArgs,
    ) -> Result<(), Status> {
        let Some(entry) = self.table.get_mut(&req) else {
            return Err(Status::not_found(format!(
                "no reservation for request {req}"
            )));
        };
        if entry.attempt != attempt {
            let what = format!(
                "generate for attempt {} but reservation is attempt {}",
                attempt.0, entry.attempt.0
            );
            return Err(self.stale(req, &what));
        }
        let state = std::mem::replace(&mut entry.state, RequestState::Aborted);
        let reservation = match state {
            RequestState::Reserved(r) => r,
            other @ (RequestState::Running(_)
            | RequestState::Stepping { .. }
            | RequestState::Finished
            | RequestState::Aborted) => {
                let name = other.name();
                entry.state = other;
                return Err(self.stale(req, &format!("generate for a request already {name}")));
            }
        };
        if max_tokens != reservation.max_tokens {
            let what = format!(
                "max_tokens {max_tokens} differs from the reserved {}",
                reservation.max_tokens
            );
            reservation.abort();
            entry.ended_at = Some(Instant::now());
            self.deps.metrics.request("error");
            return Err(Status::invalid_argument(what));
        }
        let tenant = reservation.owner.tenant.clone();
        let key = reservation.pages.grant().key;
        let output = Output::new(self.deps.tokenizer.clone(), reservation.max_tokens, stop);
        let first = args.first_token;
        let committed = reservation.commit(args, output);
        let ended = self.deps.sink.take(key);
        match committed {
            Ok(mut running) => {
                if let Err(e) = running.pages.grow(running.max_total) {
                    entry.ended_at = Some(Instant::now());
                    self.deps.metrics.request("error");
                    return Err(Status::resource_exhausted(format!(
                        "cannot grow pages for generation: {e}"
                    )));
                }
                self.deps.metrics.request("committed");
                entry.state = RequestState::Running(Box::new(running));
                self.accept(req, first);
                Ok(())
            }
            Err((e, _tx)) => {
                match ended {
                    Some(StreamEnd::Drained) => self.deps.pool.mark_drained(key),
                    Some(StreamEnd::PeerGone) => self.deps.pool.release_quarantined(key),
                    None => self.deps.pool.mark_drained(key),
                }
                entry.ended_at = Some(Instant::now());
                self.deps.metrics.request("commit_refused");
                self.deps.integrity.report(IntegrityEvent {
                    node_id: self.deps.node_id.clone(),
                    role: "decode",
                    kind: commit_kind(&e),
                    request: Some(req),
                    tenant: Some(tenant),
                    detail: e.to_string(),
                });
                Err(Status::failed_precondition(format!("commit refused: {e}")))
            }
        }
    }

    /// Ends a request. A reserved request's grant is revoked, and its pages are freed at once
    /// even when no drain was seen: every write into this pool lands through
    /// `KvPool::write_page`, which copies under the page's lock and only into a page reserved
    /// for a live grant, and revoking took each page's lock. So once revoked, no write of the
    /// grant is mid-copy and none can land later (the TCP receiver refuses frames of a revoked
    /// key; the RDMA receiver stages and copies through the same call): the revocation is the
    /// drain. Waiting instead left grants whose prefill died before it ever connected to time
    /// out into quarantine for good.
    fn abort(&mut self, req: RequestId, attempt: AttemptId, reason: &str) -> bool {
        let Some(current) = self.table.get(&req).map(|e| e.attempt) else {
            return false;
        };
        if current != attempt {
            let _ = self.stale(
                req,
                &format!(
                    "abort for attempt {} but request is attempt {}",
                    attempt.0, current.0
                ),
            );
            return false;
        }
        let Some(entry) = self.table.get_mut(&req) else {
            return false;
        };
        let state = std::mem::replace(&mut entry.state, RequestState::Aborted);
        let found = match state {
            RequestState::Reserved(r) => {
                let key = r.pages.grant().key;
                r.abort();
                match self.deps.sink.take(key) {
                    Some(StreamEnd::Drained) => self.deps.pool.mark_drained(key),
                    Some(StreamEnd::PeerGone) => self.deps.pool.release_quarantined(key),
                    None => self.deps.pool.mark_drained(key),
                }
                true
            }
            RequestState::Running(r) => {
                let _ = r.tx.send(Ok(events::abort(req, attempt)));
                true
            }
            RequestState::Stepping { .. } => {
                entry.state = RequestState::Stepping { abort: true };
                return true;
            }
            RequestState::Finished => {
                entry.state = RequestState::Finished;
                false
            }
            RequestState::Aborted => false,
        };
        if found {
            tracing::info!(request = %req, reason, "aborted");
            entry.ended_at = Some(Instant::now());
            self.deps.metrics.request("aborted");
        }
        found
    }

    /// Emits `token` for a running request and ends it if it finished or its client is gone.
    fn accept(&mut self, req: RequestId, token: u32) {
        let Some(entry) = self.table.get_mut(&req) else {
            return;
        };
        let state = std::mem::replace(&mut entry.state, RequestState::Aborted);
        let RequestState::Running(mut r) = state else {
            entry.state = state;
            return;
        };
        let emitted = r.output.push(token);
        let now = Instant::now();
        match r.last_emit {
            None => self
                .deps
                .metrics
                .observe_ttft((now - r.received_at).as_secs_f64()),
            Some(prev) => self
                .deps
                .metrics
                .observe_inter_token((now - prev).as_secs_f64()),
        }
        r.last_emit = Some(now);
        if !emitted.end_of_generation {
            self.deps.metrics.generated(1);
        }
        let finish = emitted.finish;
        let sent =
            r.tx.send(Ok(events::token(req, entry.attempt, emitted)))
                .is_ok();
        match (finish, sent) {
            (Some(f), _) => {
                entry.state = RequestState::Finished;
                entry.ended_at = Some(now);
                self.deps.metrics.request(match f {
                    Finish::Stop => "stop",
                    Finish::Length => "length",
                });
            }
            (None, false) => {
                // The client dropped the stream: abort (pages freed with `r`).
                entry.state = RequestState::Aborted;
                entry.ended_at = Some(now);
                self.deps.metrics.request("client_gone");
            }
            (None, true) => {
                r.next_input = token;
                entry.state = RequestState::Running(r);
            }
        }
    }

    fn start_step(&mut self) {
        let mut seqs = Vec::new();
        for (req, entry) in self.table.iter_mut() {
            if seqs.len() >= self.deps.max_batch {
                break;
            }
            if matches!(entry.state, RequestState::Running(_)) {
                let RequestState::Running(r) =
                    std::mem::replace(&mut entry.state, RequestState::Stepping { abort: false })
                else {
                    unreachable!("checked just above")
                };
                if r.tx.is_closed() {
                    entry.state = RequestState::Aborted;
                    entry.ended_at = Some(Instant::now());
                    self.deps.metrics.request("client_gone");
                    continue;
                }
                seqs.push((*req, r));
            }
        }
        if seqs.is_empty() {
            return;
        }
        let compute = self.deps.compute.clone();
        self.step = Some(tokio::task::spawn_blocking(move || {
            let mut seqs = seqs;
            let results = {
                let mut batch: Vec<_> = seqs
                    .iter_mut()
                    .map(|(_, r)| (&mut r.pages, r.next_input))
                    .collect();
                compute.decode_step(&mut batch)
            };
            seqs.into_iter()
                .zip(results)
                .map(|((req, mut r), logits)| {
                    let tok = logits.map(|l| r.sampler.sample(&l));
                    (req, r, tok)
                })
                .collect()
        }));
    }

    fn finish_step(&mut self, results: StepResult) {
        for (req, running, result) in results {
            let Some(entry) = self.table.get_mut(&req) else {
                continue;
            };
            let aborted = match entry.state {
                RequestState::Stepping { abort } => abort,
                RequestState::Reserved(_)
                | RequestState::Running(_)
                | RequestState::Finished
                | RequestState::Aborted => true,
            };
            if aborted {
                let _ = running.tx.send(Ok(events::abort(req, entry.attempt)));
                entry.state = RequestState::Aborted;
                entry.ended_at = Some(Instant::now());
                continue;
            }
            match result {
                Ok(token) => {
                    entry.state = RequestState::Running(running);
                    self.accept(req, token);
                }
                Err(e) => {
                    // I1/I8: fail only this request, count it, report it; never data.
                    let kind = match e {
                        StepError::KvRefused(_) => {
                            self.deps.integrity.report(IntegrityEvent {
                                node_id: self.deps.node_id.clone(),
                                role: "decode",
                                kind: IntegrityKind::GenerationMismatch,
                                request: Some(req),
                                tenant: Some(running.owner.tenant.clone()),
                                detail: e.to_string(),
                            });
                            "kv_read_refused"
                        }
                        StepError::Failed(_) => "error",
                    };
                    tracing::warn!(request = %req, error = %e, "sequence failed");
                    let _ = running
                        .tx
                        .send(Err(Status::internal(format!("generation failed: {e}"))));
                    entry.state = RequestState::Aborted;
                    entry.ended_at = Some(Instant::now());
                    self.deps.metrics.request(kind);
                }
            }
        }
        self.deps.metrics.set_active(self.live());
    }

    fn housekeeping(&mut self) {
        let now = Instant::now();
        let expired: Vec<(RequestId, AttemptId)> = self
            .table
            .iter()
            .filter(|(_, e)| matches!(e.state, RequestState::Reserved(_)) && e.expires_at <= now)
            .map(|(r, e)| (*r, e.attempt))
            .collect();
        for (req, attempt) in expired {
            tracing::warn!(request = %req, "reservation expired before commit: aborting");
            self.abort(req, attempt, "grant expired");
        }
        let moved = self.deps.pool.sweep_expired(now);
        if moved > 0 {
            tracing::warn!(
                pages = moved,
                "drain not confirmed in time: pages quarantined"
            );
            self.deps.integrity.report(IntegrityEvent {
                node_id: self.deps.node_id.clone(),
                role: "decode",
                kind: IntegrityKind::Quarantine,
                request: None,
                tenant: None,
                detail: format!("{moved} pages quarantined"),
            });
        }
        self.table.retain(|_, e| {
            e.ended_at
                .is_none_or(|t| now.duration_since(t) < TOMBSTONE_TTL)
                || e.state.is_live()
        });
        self.deps.metrics.set_active(self.live());
    }
}

fn commit_kind(e: &CommitError) -> IntegrityKind {
    match e {
        CommitError::KeyMismatch | CommitError::DigestMismatch | CommitError::Expired => {
            IntegrityKind::ManifestMismatch
        }
        CommitError::TokenCountMismatch { .. } => IntegrityKind::TokenCountMismatch,
        CommitError::PageNotWritten(_) => IntegrityKind::PageNotWritten,
        CommitError::ChecksumMismatch(_) => IntegrityKind::ChecksumMismatch,
        CommitError::GuardWordCorrupt(_) => IntegrityKind::GuardWordCorrupt,
    }
}
