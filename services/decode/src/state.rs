//! One enum per request: its whole state on this decode worker, owned by the scheduler task.
//!
//! ```text
//!   Reserve ──▶ Queued ──pages free──▶ Reserved ──commit ok (I2)──▶ Running ⇄ Stepping ──eog/stop/length──▶ Finished
//!                 │                       │                            │         │
//!                 │ abort / withdrawn /   │ expiry / abort /           │ abort / client gone / KV read refused (I1)
//!                 │ queue deadline        │ commit refused             ▼         ▼
//!                 └───────────────────────┴─────────────────────────▶ Aborted ◀───┘
//! ```
//!
//! `Queued` holds no pages: a request that fits the context (admission, I3, already passed)
//! waits there, in the scheduler's fair queue, until its whole budget's pages are free (I9).
//!
//! `Stepping` means the sequence's pages are on the model thread for one batched step; an abort
//! that arrives meanwhile is recorded and applied when the step returns. `Finished` and
//! `Aborted` are terminal and hold no pages (tombstones, kept so a late or repeated message is
//! recognised as stale, I5).

use std::time::Instant;

use pagewarden_common::AttemptId;
use pagewarden_kvcache::{
    CommitError, CommitManifest, Owner, ReadablePages, ReservedPages, WriteGrant,
};
use std::sync::Arc;

use pagewarden_model::{Sampler, SamplingParams, TokenLogprobs, Tokenizer};
use pagewarden_proto::v1::TokenEvent;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use crate::output::Output;

/// Events sent to one `Generate` stream.
pub type EventTx = mpsc::UnboundedSender<Result<TokenEvent, Status>>;

/// Where a `Reserve` call waits for its grant.
pub type GrantReply = oneshot::Sender<Result<WriteGrant, Status>>;

/// An admitted `Reserve` waiting for pages; it holds none.
pub struct Queued {
    pub owner: Owner,
    pub prompt_tokens: usize,
    /// The whole generation's parameters (`max_tokens` among them), given once at `Reserve`.
    pub sampling: SamplingParams,
    /// The prompt's ids when a repetition penalty needs them, else empty.
    pub penalty_prompt: Vec<u32>,
    pub reply: GrantReply,
    /// When it joined the queue.
    pub queued_at: Instant,
    /// When the wait ends with `queue_timeout`.
    pub deadline: Instant,
}

/// Pages reserved under a write grant, waiting for prefill's commit.
pub struct Reservation {
    pub owner: Owner,
    pub pages: ReservedPages,
    pub prompt_tokens: usize,
    pub sampling: SamplingParams,
    pub penalty_prompt: Vec<u32>,
}

/// What `Generate` brings to a reservation: only what prefill produced. The sampling
/// parameters were fixed at `Reserve`, so a `Generate` cannot contradict them.
pub struct GenerateArgs {
    pub manifest: CommitManifest,
    pub first_token: u32,
    /// Prefill's logprobs of `first_token`, when the sampling asked for them.
    pub first_logprobs: Option<TokenLogprobs>,
    pub tx: EventTx,
    pub received_at: Instant,
}

impl Reservation {
    /// I2: verifies the manifest against what landed; only then do the pages become readable.
    /// On refusal the pool has revoked the grant and the pages wait for their drain.
    pub fn commit(
        self,
        args: GenerateArgs,
        tokenizer: Arc<Tokenizer>,
    ) -> Result<Running, (CommitError, EventTx)> {
        let pages = match self.pages.commit(&args.manifest) {
            Ok(p) => p,
            Err(e) => return Err((e, args.tx)),
        };
        let mut sampler =
            Sampler::for_model(&self.sampling, &self.penalty_prompt, &tokenizer);
        // Prefill sampled the first token: it counts for the penalties and `min_tokens`.
        sampler.accept(args.first_token);
        Ok(Running {
            owner: self.owner,
            pages,
            next_input: args.first_token,
            sampler,
            output: Output::new(tokenizer, &self.sampling),
            tx: args.tx,
            received_at: args.received_at,
            last_emit: None,
            max_total: self.prompt_tokens + self.sampling.max_tokens,
        })
    }

    /// Revokes the grant; pages go to the free list after the drain (or to quarantine).
    pub fn abort(self) {
        self.pages.abort();
    }
}

/// A committed sequence being generated.
pub struct Running {
    pub owner: Owner,
    pub pages: ReadablePages,
    /// The token whose KV the next step writes (the last one emitted).
    pub next_input: u32,
    pub sampler: Sampler,
    pub output: Output,
    pub tx: EventTx,
    pub received_at: Instant,
    pub last_emit: Option<Instant>,
    /// prompt + max_tokens: pages are grown to this up front.
    pub max_total: usize,
}

/// The state of one request.
pub enum RequestState {
    Queued(Box<Queued>),
    Reserved(Box<Reservation>),
    Running(Box<Running>),
    /// On the model thread; `abort` records an abort that arrived meanwhile.
    Stepping {
        abort: bool,
    },
    Finished,
    Aborted,
}

/// A request's entry in the scheduler's table.
pub struct Entry {
    pub attempt: AttemptId,
    pub state: RequestState,
    /// When a reservation must be committed by; irrelevant after commit.
    pub expires_at: Instant,
    /// When the entry became terminal (tombstones are pruned after a while).
    pub ended_at: Option<Instant>,
}

impl Entry {
    /// Takes a queued request out of its entry, leaving `Aborted` for the caller to replace;
    /// any other state is left as it was.
    pub fn take_queued(&mut self) -> Option<Box<Queued>> {
        match std::mem::replace(&mut self.state, RequestState::Aborted) {
            RequestState::Queued(q) => Some(q),
            other => {
                self.state = other;
                None
            }
        }
    }
}

impl RequestState {
    /// Label for logs.
    pub fn name(&self) -> &'static str {
        match self {
            RequestState::Queued(_) => "queued",
            RequestState::Reserved(_) => "reserved",
            RequestState::Running(_) => "running",
            RequestState::Stepping { .. } => "stepping",
            RequestState::Finished => "finished",
            RequestState::Aborted => "aborted",
        }
    }

    /// Whether the request is not over yet (queued, or holding pages).
    pub fn is_live(&self) -> bool {
        match self {
            RequestState::Queued(_)
            | RequestState::Reserved(_)
            | RequestState::Running(_)
            | RequestState::Stepping { .. } => true,
            RequestState::Finished | RequestState::Aborted => false,
        }
    }

    /// Whether the request holds (or is about to hold) pages: live and past the queue.
    pub fn is_active(&self) -> bool {
        match self {
            RequestState::Reserved(_)
            | RequestState::Running(_)
            | RequestState::Stepping { .. } => true,
            RequestState::Queued(_) | RequestState::Finished | RequestState::Aborted => false,
        }
    }
}
