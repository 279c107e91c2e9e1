//! One enum per request: its whole state on this decode worker, owned by the scheduler task.
//!
//! ```text
//!   Reserve ──▶ Queued ──pages free──▶ Reserved ──commit ok (I2)──▶ Running ⇄ Stepping ──eog/stop/length──▶ Finished
//!                 │                       │                          │  ▲  ▲
//!                 │                       │          pool short:     │  │  └──────────────┐
//!                 │                       │          youngest first  ▼  │ last chunk      │
//!                 │                       │                    Preempted ──pages free──▶ Recomputing ⇄ Stepping
//!                 │ abort / withdrawn /   │ expiry / abort /        │                       │
//!                 │ queue deadline        │ commit refused          │ abort / client gone / KV read refused (I1)
//!                 └───────────────────────┴─────────────────────────┴──────────▶ Aborted ◀───┘
//! ```
//!
//! `Queued` holds no pages: a request that fits the context (admission, I3, already passed)
//! waits there, in the scheduler's fair queue, until its prompt's pages are free (I9).
//!
//! Pages as you go: a reservation holds the prompt's pages only (the grant's); the pages of
//! generated tokens are allocated by decode, one page when a sequence's last one is full, at
//! fresh generations and written only by decode's own engine (`ReadablePages`, no grant: no
//! remote writer can reach them). When the pool runs short, the youngest sequences are
//! `Preempted` (vLLM's recompute preemption): their pages are freed and only their token ids
//! are kept (the [`Sequence`]: prompt then every sampled token, sampler and output state).
//! When pages free up the oldest preempted sequence is `Recomputing`: fresh local pages, and
//! decode's engine runs its tokens through a prefill pass, a chunk per turn, writing the same
//! K/V the undisturbed run held (each row's K/V depend only on the tokens before it, computed
//! by the same kernels), then it is `Running` again with its next input unchanged: the same
//! greedy text as an undisturbed run, the client stream only pauses.
//!
//! `Stepping` means the sequence's pages are on the model thread for one batched step or one
//! recompute chunk; an abort that arrives meanwhile is recorded and applied when it returns.
//! `Finished` and `Aborted` are terminal and hold no pages (tombstones, kept so a late or
//! repeated message is recognised as stale, I5).

use tokio::time::Instant;

use pagewarden_common::namespace::Namespace;
use pagewarden_common::{AttemptId, TenantId};
use pagewarden_kvcache::{
    CommitError, CommitManifest, Owner, Published, ReadablePages, ReservedPages, SharedPages,
    WriteGrant,
};
use std::sync::Arc;

use pagewarden_model::{Sampler, SamplingParams, TokenLogprobs, TokenOutput, Tokenizer};
use pagewarden_proto::v1::TokenEvent;
use pagewarden_worker::WorkerError;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

/// Events sent to one `Generate` stream.
pub type EventTx = mpsc::UnboundedSender<Result<TokenEvent, Status>>;

/// Where a `Reserve` call waits for its grant.
pub type GrantReply = oneshot::Sender<Result<Granted, WorkerError>>;

/// A `Reserve`'s answer: the write grant for the prompt after the cached prefix decode holds.
#[derive(Debug, Clone)]
pub struct Granted {
    pub grant: WriteGrant,
    /// Leading prompt tokens whose KV decode already holds (pinned cached pages): prefill
    /// sends none of them.
    pub prefix_tokens: usize,
}

/// An admitted `Reserve` waiting for pages; it holds none.
pub struct Queued {
    pub owner: Owner,
    /// Arrival order on this worker (the youngest is preempted first).
    pub arrival: u64,
    /// The tenant's weight in the queue.
    pub weight: u32,
    /// The prompt's ids (recompute after a preemption, repetition penalty).
    pub prompt: Vec<u32>,
    /// The whole generation's parameters (`max_tokens` among them), given once at `Reserve`.
    pub sampling: Box<SamplingParams>,
    /// The prefix-cache namespace the router derived; `None`: no caching for this request.
    pub namespace: Option<Namespace>,
    pub reply: GrantReply,
    /// When it joined the queue.
    pub queued_at: Instant,
    /// When the wait ends with `queue_timeout`.
    pub deadline: Instant,
}

/// Pages reserved under a write grant, waiting for prefill's commit.
pub struct Reservation {
    pub owner: Owner,
    pub arrival: u64,
    /// The cached prefix pinned for this prompt (the grant starts after it).
    pub prefix: Option<SharedPages>,
    /// The grant covers exactly the prompt's tokens after `prefix`.
    pub pages: ReservedPages,
    pub prompt: Vec<u32>,
    pub sampling: Box<SamplingParams>,
    pub namespace: Option<Namespace>,
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
        let mut sampler = Sampler::for_model(&self.sampling, &self.prompt, &tokenizer);
        // Prefill sampled the first token: it counts for the penalties, `min_tokens` and the
        // grammar. The scheduler emits it next, which appends it to `tokens` (the next input).
        sampler.accept(args.first_token);
        Ok(Running {
            prefix: self.prefix,
            pages,
            seq: Sequence {
                owner: self.owner,
                arrival: self.arrival,
                prompt_len: self.prompt.len(),
                namespace: self.namespace,
                tokens: self.prompt,
                sampler,
                output: TokenOutput::new(tokenizer, &self.sampling),
                tx: args.tx,
                received_at: args.received_at,
                last_emit: None,
                preemptions: 0,
            },
        })
    }

    /// Revokes the grant; pages go to the free list after the drain (or to quarantine).
    pub fn abort(self) {
        self.pages.abort();
    }
}

/// What a sequence carries between steps besides its pages; all of it survives a preemption.
pub struct Sequence {
    pub owner: Owner,
    /// Arrival order on this worker (the youngest is preempted first).
    pub arrival: u64,
    /// The prompt's ids, then every sampled token. The KV of all but the last is in the
    /// sequence's pages (once recomputed, after a preemption); the last is the next input.
    pub tokens: Vec<u32>,
    /// How many of `tokens` are the prompt's (its full pages join the prefix cache at the end).
    pub prompt_len: usize,
    /// The prefix-cache namespace: where its prefix is looked up again after a preemption,
    /// and where its prompt pages are published when it finishes.
    pub namespace: Option<Namespace>,
    pub sampler: Sampler,
    pub output: TokenOutput<Arc<Tokenizer>>,
    pub tx: EventTx,
    pub received_at: Instant,
    pub last_emit: Option<Instant>,
    /// Times it was preempted (its pages freed, then recomputed): its account says so.
    pub preemptions: u32,
}

impl Sequence {
    /// The token whose KV the next step writes (the last one sampled).
    pub fn next_input(&self) -> u32 {
        *self
            .tokens
            .last()
            .expect("a sequence holds its prompt and first token")
    }

    /// Tokens whose KV the pages hold once the sequence is whole.
    pub fn kv_len(&self) -> usize {
        self.tokens.len() - 1
    }
}

/// A sequence with its pages: a pinned cached prefix (read-only, shared), then its own.
/// `Running`: `kv_held() == seq.kv_len()`; `Recomputing`: the pages hold a prefix of that,
/// the rest is computed a chunk at a time.
pub struct Running {
    pub prefix: Option<SharedPages>,
    pub pages: ReadablePages,
    pub seq: Sequence,
}

impl Running {
    /// Tokens whose KV the sequence holds: its cached prefix's, then its own pages'.
    pub fn kv_held(&self) -> usize {
        self.prefix.as_ref().map_or(0, SharedPages::len) + self.pages.len()
    }

    /// Ends a finished sequence: its full prompt pages join the prefix cache under its
    /// namespace (when it pinned a prefix there, even an empty one), the rest are freed.
    pub fn finish(self) -> Option<Published> {
        let Running { prefix, pages, seq } = self;
        let prefix = prefix?;
        Some(pages.publish_prefix(&prefix, &seq.tokens[..seq.prompt_len], seq.owner.request))
    }
}

/// The state of one request.
pub enum RequestState {
    Queued(Box<Queued>),
    Reserved(Box<Reservation>),
    Running(Box<Running>),
    /// Pages freed for others; waits (holding none) to be recomputed.
    Preempted(Box<Sequence>),
    /// Fresh pages being refilled from the sequence's tokens, a chunk per turn.
    Recomputing(Box<Running>),
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
    /// Whose request it is (the queue lets a tenant with no request active pass a blocked head).
    pub tenant: TenantId,
    /// The tenant's weight (at least 1): its queue turns, and its share of the pool while
    /// another tenant waits (`scheduler/share.rs`).
    pub weight: u32,
    pub state: RequestState,
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
            RequestState::Preempted(_) => "preempted",
            RequestState::Recomputing(_) => "recomputing",
            RequestState::Stepping { .. } => "stepping",
            RequestState::Finished => "finished",
            RequestState::Aborted => "aborted",
        }
    }

    /// Whether the request is not over yet.
    pub fn is_live(&self) -> bool {
        match self {
            RequestState::Queued(_)
            | RequestState::Reserved(_)
            | RequestState::Running(_)
            | RequestState::Preempted(_)
            | RequestState::Recomputing(_)
            | RequestState::Stepping { .. } => true,
            RequestState::Finished | RequestState::Aborted => false,
        }
    }

    /// The sequence, while it holds pages outside the model thread that it could give up
    /// (running, or between recompute chunks).
    pub fn preemptible(&self) -> Option<&Running> {
        match self {
            RequestState::Running(r) | RequestState::Recomputing(r) => Some(r),
            RequestState::Queued(_)
            | RequestState::Reserved(_)
            | RequestState::Preempted(_)
            | RequestState::Stepping { .. }
            | RequestState::Finished
            | RequestState::Aborted => None,
        }
    }

    /// Whether the request is past the queue and live (a preempted one holds no pages for
    /// now, but is being served).
    pub fn is_active(&self) -> bool {
        match self {
            RequestState::Reserved(_)
            | RequestState::Running(_)
            | RequestState::Preempted(_)
            | RequestState::Recomputing(_)
            | RequestState::Stepping { .. } => true,
            RequestState::Queued(_) | RequestState::Finished | RequestState::Aborted => false,
        }
    }
}
