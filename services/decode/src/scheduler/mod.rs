//! The scheduler task: the single owner of every request's [`RequestState`], fed by
//! [`Command`]s with `oneshot` replies.
//!
//! `queue.rs` holds the queue half, `step.rs` the batching half, `preempt.rs` the pages-as-you-go
//! half (growth, preemption, recompute), `share.rs` the tenants' shares of the pool while
//! another tenant waits, `prefix.rs` the prefix cache (a prompt is granted after the pages of
//! it this worker holds).
//!
//! - Queue, don't refuse (I9): a `Reserve` that passed admission (I3) waits in a bounded
//!   [`FairQueue`] (FIFO per tenant, tenants in turn), holding no pages, until its prompt's
//!   pages (plus the page its first generated token may need) are free beside what is owed to
//!   earlier reservations, preempted sequences and sequences about to grow; a full queue or a
//!   passed queue deadline answers `queue_full` / `queue_timeout`.
//! - Pages as you go: a sequence gets a page when its last one is full, just before the step
//!   that needs it. When none is free, the youngest sequences (by arrival) are preempted: their
//!   pages are freed and they are recomputed from their token ids when pages free up, oldest
//!   first and before any new grant (see `state.rs`).
//! - Continuous batching, fair: whenever no step is in flight, up to `max_batch` running
//!   sequences go to the model thread for one `decode_step`, taken in commit order from a
//!   rotation; those stepped go to its back, so with more sequences than the batch every one
//!   is stepped in turn and none waits for another to finish. Commands keep being served while
//!   the step runs.

mod preempt;
mod prefix;
mod queue;
mod share;
mod step;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use pagewarden_common::admission::Admission;
use pagewarden_common::integrity::{IntegrityEvent, IntegrityKind, IntegritySink, PageTag};
use pagewarden_common::metrics::WorkerMetrics;
use pagewarden_common::namespace::Namespace;
use pagewarden_common::shutdown::Shutdown;
use pagewarden_common::{AttemptId, RequestId, TenantId};
use pagewarden_kvcache::{CommitError, Erasure, KvPool, Owner};
use pagewarden_model::{Sampled, SamplingParams, Tokenizer};
use pagewarden_worker::{
    Compute, ComputeError, FairQueue, PrefixCacheLog, QueueRefusal, WorkerError,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::events;
use crate::rotation::Rotation;
use crate::state::{Entry, GenerateArgs, GrantReply, Queued, RequestState, Running};

/// How long terminal tombstones are remembered (to recognise stale messages, I5).
const TOMBSTONE_TTL: Duration = Duration::from_secs(300);

/// A request to the scheduler.
pub enum Command {
    /// Admission, then a grant now or a place in the queue; `reply` answers either way.
    Reserve {
        req: RequestId,
        attempt: AttemptId,
        tenant: TenantId,
        /// The tenant's weight in the queue (at least 1).
        weight: u32,
        /// The prompt's ids (the grant covers them after the cached prefix decode holds).
        prompt: Vec<u32>,
        sampling: Box<SamplingParams>,
        /// The request's prefix-cache namespace (the router's); `None`: no caching.
        namespace: Option<Namespace>,
        reply: GrantReply,
    },
    Generate {
        req: RequestId,
        attempt: AttemptId,
        args: GenerateArgs,
        reply: oneshot::Sender<Result<(), WorkerError>>,
    },
    Abort {
        req: RequestId,
        attempt: AttemptId,
        reason: String,
        reply: oneshot::Sender<bool>,
    },
    /// The `Reserve` call of a queued request is gone: it leaves the queue (a request already
    /// granted is left to its `Abort` or grant expiry).
    Withdraw { req: RequestId, attempt: AttemptId },
    /// Requests holding pages, and requests waiting.
    Load { reply: oneshot::Sender<Load> },
    /// Erases `tenant`'s namespace from the prefix cache (pages its running sequences read
    /// are zeroed when they let go).
    EraseCache {
        tenant: TenantId,
        namespace: Namespace,
        reply: oneshot::Sender<Erasure>,
    },
}

/// What `Info` reports about the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Requests reserved or running.
    pub active: usize,
    /// Requests in the queue.
    pub queued: usize,
    /// Draining: finishing what it holds, taking nothing new.
    pub draining: bool,
}

/// What the scheduler needs.
pub struct SchedulerDeps {
    pub compute: Compute,
    pub tokenizer: Arc<Tokenizer>,
    pub pool: KvPool,
    pub admission: Admission,
    pub metrics: Arc<WorkerMetrics>,
    pub integrity: Arc<dyn IntegritySink>,
    /// Prefix-cache hits, misses and evictions: metrics, and the auditor.
    pub prefix_log: PrefixCacheLog,
    pub node_id: String,
    pub max_batch: usize,
    /// Most requests in the queue.
    pub max_queue: usize,
    /// Longest wait in the queue.
    pub queue_timeout: Duration,
    /// Tokens per recompute turn of a preempted sequence (the prefill chunk).
    pub recompute_chunk: usize,
}

/// What came back from the model thread.
enum Done {
    /// One batched decode step: each sequence's sampled token or why it failed.
    Step(Vec<(RequestId, Box<Running>, Result<Sampled, ComputeError>)>),
    /// One chunk of a preempted sequence's recompute.
    Recompute(RequestId, Box<Running>, Result<(), ComputeError>),
}

struct Scheduler {
    /// Since when it drains (SIGTERM), if it does.
    draining: Option<Instant>,
    deps: SchedulerDeps,
    table: HashMap<RequestId, Entry>,
    step: Option<JoinHandle<Done>>,
    /// Queued requests, in serving order.
    queue: FairQueue<(RequestId, AttemptId)>,
    /// Committed requests in the order they are stepped.
    rotation: Rotation,
    /// Arrivals so far: the next `Reserve`'s arrival number.
    arrivals: u64,
    /// Preempted sequences by arrival: the oldest is recomputed first.
    preempted: BTreeMap<u64, RequestId>,
    /// Sequences being recomputed, the one in progress first.
    recomputing: VecDeque<RequestId>,
    /// Whether the model thread's next turn goes to a recompute chunk (turns alternate with
    /// decode steps, so a long recompute never stalls the running streams).
    recompute_turn: bool,
}

/// How long a draining decode waits for its sequences before it stops anyway: long enough
/// for a whole context to be generated on a slow CPU, as the deploy files' stop timeouts allow.
const DRAIN_GRACE: Duration = Duration::from_secs(300);

/// How long a drained decode keeps answering before it stops (a few of the router's polls).
const DRAIN_LINGER: Duration = Duration::from_millis(1500);

/// Why a draining decode refuses a reservation: `UNAVAILABLE`, so the router tries another.
const DRAINING: &str = "decode is draining: it finishes its sequences and takes no new ones";

/// Runs the scheduler until `stop` (or every sender is gone). When `drain` fires (SIGTERM) it
/// refuses new and queued reservations as unavailable, finishes every sequence it holds
/// (reserved ones included), and then returns; after [`DRAIN_GRACE`] it returns anyway.
pub async fn run(
    deps: SchedulerDeps,
    mut rx: mpsc::Receiver<Command>,
    drain: Shutdown,
    stop: Shutdown,
) {
    let mut s = Scheduler {
        draining: None,
        deps,
        table: HashMap::new(),
        step: None,
        queue: FairQueue::new(),
        rotation: Rotation::default(),
        arrivals: 0,
        preempted: BTreeMap::new(),
        recomputing: VecDeque::new(),
        recompute_turn: false,
    };
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut drained: Option<Instant> = None;
    loop {
        if s.step.is_none() {
            s.start_work();
        }
        tokio::select! {
            cmd = rx.recv() => match cmd {
                Some(cmd) => s.handle(cmd),
                None => break,
            },
            done = async { match s.step.as_mut() { Some(h) => h.await, None => std::future::pending().await } } => {
                s.step = None;
                match done {
                    Ok(Done::Step(results)) => s.finish_step(results),
                    Ok(Done::Recompute(req, running, result)) => {
                        s.finish_recompute(req, running, result)
                    }
                    Err(e) => tracing::error!(error = %e, "decode step panicked"),
                }
            }
            _ = tick.tick() => s.housekeeping(),
            () = drain.cancelled(), if s.draining.is_none() => s.start_drain(),
            () = stop.cancelled() => break,
        }
        if let Some(since) = s.draining {
            if s.step.is_none() && !s.table.values().any(|e| e.state.is_active()) {
                // Linger a moment, still answering: the last streams flush, and calls already
                // on their way get their "unavailable" instead of a closed connection.
                let linger = drained.get_or_insert_with(Instant::now);
                if linger.elapsed() >= DRAIN_LINGER {
                    tracing::info!("drained: every sequence finished");
                    break;
                }
            }
            if since.elapsed() > DRAIN_GRACE {
                tracing::warn!(grace = ?DRAIN_GRACE, "drain grace over: stopping with sequences left");
                break;
            }
        }
    }
    // The servers stop with the scheduler (after a drain, or with it).
    stop.cancel();
    // Dropping the table aborts reservations (revoke) and frees readable pages.
    for (_, entry) in s.table.drain() {
        match entry.state {
            RequestState::Running(r) | RequestState::Recomputing(r) => {
                let _ = r.seq.tx.send(Err(shutting_down().into()));
            }
            RequestState::Preempted(seq) => {
                let _ = seq.tx.send(Err(shutting_down().into()));
            }
            RequestState::Queued(q) => {
                let _ = q.reply.send(Err(shutting_down()));
            }
            RequestState::Reserved(_)
            | RequestState::Stepping { .. }
            | RequestState::Finished
            | RequestState::Aborted => {}
        }
    }
}

impl Scheduler {
    /// SIGTERM: no new work; queued reservations go elsewhere (the router retries an
    /// unavailable decode on another one); what holds pages runs to its end.
    fn start_drain(&mut self) {
        self.draining = Some(Instant::now());
        let queued: Vec<(RequestId, AttemptId)> = self
            .table
            .iter()
            .filter(|(_, e)| matches!(e.state, RequestState::Queued(_)))
            .map(|(r, e)| (*r, e.attempt))
            .collect();
        let active = self.active();
        tracing::info!(active, queued = queued.len(), "draining");
        for (req, attempt) in queued {
            if let Some(q) = self.leave_queue(req, attempt) {
                let _ = q.reply.send(Err(WorkerError::Unavailable(DRAINING.into())));
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Reserve { reply, .. } if self.draining.is_some() => {
                let _ = reply.send(Err(WorkerError::Unavailable(DRAINING.into())));
            }
            Command::Reserve {
                req,
                attempt,
                tenant,
                weight,
                prompt,
                sampling,
                namespace,
                reply,
            } => {
                let now = Instant::now();
                self.arrivals += 1;
                let q = Queued {
                    owner: Owner {
                        request: req,
                        tenant,
                    },
                    arrival: self.arrivals,
                    weight,
                    prompt,
                    sampling,
                    namespace,
                    reply,
                    queued_at: now,
                    deadline: now + self.deps.queue_timeout,
                };
                if let Err((status, q)) = self.enqueue(req, attempt, q) {
                    let _ = q.reply.send(Err(status));
                }
            }
            Command::Generate {
                req,
                attempt,
                args,
                reply,
            } => {
                let r = self.generate(req, attempt, args);
                let _ = reply.send(r);
            }
            Command::Withdraw { req, attempt } => {
                if self.table.get(&req).is_some_and(|e| {
                    e.attempt == attempt && matches!(e.state, RequestState::Queued(_))
                }) {
                    self.abort(req, attempt, "Reserve call gone while queued");
                }
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
                let _ = reply.send(Load {
                    active: self.active(),
                    queued: self.queue.len(),
                    draining: self.draining.is_some(),
                });
            }
            Command::EraseCache {
                tenant,
                namespace,
                reply,
            } => {
                let _ = reply.send(self.deps.prefix_log.erase(&tenant, &namespace));
            }
        }
        self.admit_waiting();
    }

    /// Requests holding pages.
    fn active(&self) -> usize {
        self.table.values().filter(|e| e.state.is_active()).count()
    }

    fn stale(&self, req: RequestId, what: &str) -> WorkerError {
        self.deps.metrics.stale_message();
        self.deps.integrity.report(IntegrityEvent {
            node_id: self.deps.node_id.clone(),
            role: "decode",
            kind: IntegrityKind::StaleMessage,
            request: Some(req),
            tenant: None,
            page: None,
            detail: what.to_string(),
        });
        WorkerError::Stale(what.to_string())
    }

    fn generate(
        &mut self,
        req: RequestId,
        attempt: AttemptId,
        args: GenerateArgs,
    ) -> Result<(), WorkerError> {
        let Some(entry) = self.table.get_mut(&req) else {
            return Err(WorkerError::NotFound(format!(
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
            RequestState::Reserved(r) => *r,
            other @ (RequestState::Queued(_)
            | RequestState::Running(_)
            | RequestState::Preempted(_)
            | RequestState::Recomputing(_)
            | RequestState::Stepping { .. }
            | RequestState::Finished
            | RequestState::Aborted) => {
                let name = other.name();
                entry.state = other;
                return Err(self.stale(req, &format!("generate for a request already {name}")));
            }
        };
        let tenant = reservation.owner.tenant.clone();
        let first = Sampled {
            token: args.first_token,
            logprobs: args.first_logprobs.clone(),
        };
        // The pages' generations, to tag a refusal that names one of them.
        let granted = reservation.pages.grant().pages.clone();
        // On a refusal the grant ends inside `commit`: the pool frees its pages (`KvPool`).
        let committed = reservation.commit(args, self.deps.tokenizer.clone());
        match committed {
            Ok(running) => {
                // Pages for generated tokens come as they are needed (`preempt.rs`).
                self.deps.metrics.request("committed");
                entry.state = RequestState::Running(Box::new(running));
                self.rotation.push(req);
                self.accept(req, first);
                Ok(())
            }
            Err((e, _tx)) => {
                entry.ended_at = Some(Instant::now());
                self.deps.metrics.request("commit_refused");
                self.deps.integrity.report(IntegrityEvent {
                    node_id: self.deps.node_id.clone(),
                    role: "decode",
                    kind: commit_kind(&e),
                    request: Some(req),
                    tenant: Some(tenant),
                    page: e
                        .page()
                        .and_then(|p| granted.iter().find(|(q, _)| *q == p))
                        .map(|(p, g)| PageTag {
                            page: p.0,
                            generation: g.0,
                        }),
                    detail: e.to_string(),
                });
                Err(WorkerError::CommitRefused(e.to_string()))
            }
        }
    }

    /// Ends a request. A reserved request's grant is revoked, and the pool frees its pages at
    /// once even when no drain was seen: decode's pool takes revocation as the drain
    /// (`PoolConfig::revocation_drains`: the TCP receiver refuses frames of a revoked key, the
    /// RDMA receiver stages and copies through the same checked write). Waiting instead left
    /// grants whose prefill died before it ever connected to time out into quarantine.
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
            RequestState::Queued(q) => {
                self.queue.remove_first(|&(r, a)| r == req && a == attempt);
                let _ = q.reply.send(Err(WorkerError::Cancelled(format!(
                    "aborted while queued: {reason}"
                ))));
                true
            }
            RequestState::Reserved(r) => {
                r.abort();
                true
            }
            RequestState::Running(r) | RequestState::Recomputing(r) => {
                // Its pages are freed with `r`.
                let _ = r.seq.tx.send(Ok(events::abort(req, attempt)));
                true
            }
            RequestState::Preempted(seq) => {
                self.preempted.remove(&seq.arrival);
                let _ = seq.tx.send(Ok(events::abort(req, attempt)));
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

    fn housekeeping(&mut self) {
        // The scheduler's deadlines run on tokio's clock (tests pause it); the pool's grants
        // on the pool's own clock.
        let now = Instant::now();
        let pool_now = self.deps.pool.now();
        let expired: Vec<(RequestId, AttemptId)> = self
            .table
            .iter()
            .filter(
                |(_, e)| matches!(&e.state, RequestState::Reserved(r) if r.pages.expired(pool_now)),
            )
            .map(|(r, e)| (*r, e.attempt))
            .collect();
        for (req, attempt) in expired {
            tracing::warn!(request = %req, "reservation expired before commit: aborting");
            self.abort(req, attempt, "grant expired");
        }
        let overdue: Vec<(RequestId, AttemptId)> = self
            .table
            .iter()
            .filter(|(_, e)| matches!(&e.state, RequestState::Queued(q) if q.deadline <= now))
            .map(|(r, e)| (*r, e.attempt))
            .collect();
        for (req, attempt) in overdue {
            let waited = self.deps.queue_timeout;
            self.refuse_queued(req, attempt, QueueRefusal::Timeout { waited });
        }
        let moved = self.deps.pool.sweep_expired(pool_now);
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
                page: None,
                detail: format!("{moved} pages quarantined"),
            });
        }
        self.table.retain(|_, e| {
            e.ended_at
                .is_none_or(|t| now.duration_since(t) < TOMBSTONE_TTL)
                || e.state.is_live()
        });
        self.admit_waiting();
    }
}

fn commit_kind(e: &CommitError) -> IntegrityKind {
    match e {
        CommitError::KeyMismatch | CommitError::DigestMismatch | CommitError::Expired => {
            IntegrityKind::ManifestMismatch
        }
        CommitError::TokenCountMismatch { .. } => IntegrityKind::CountMismatch,
        CommitError::PageNotWritten(_) => IntegrityKind::PageNotWritten,
        CommitError::ChecksumMismatch(_) => IntegrityKind::ChecksumMismatch,
        CommitError::GuardWordCorrupt(_) => IntegrityKind::GuardWordCorrupt,
    }
}

/// What every request still in the table is told when the worker stops.
fn shutting_down() -> WorkerError {
    WorkerError::Unavailable("decode worker shutting down".into())
}
