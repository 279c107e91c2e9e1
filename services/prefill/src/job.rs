//! One prefill job: the forward pass over local pages chunk by chunk, taking turns with other
//! jobs' chunks, the pages each chunk completes streamed into decode's granted pages while the
//! next computes ([`GrantWriter`]), first-token sampling, and the final drain; cancellation is
//! checked between chunks and batches.
//!
//! ```text
//! Admitted ──gate: slot + pages──▶ Computing (chunk, send its pages)* ──logits──▶ Finishing (rest, drain ack) ──▶ Done(manifest)
//!     │  (waits in the gate's queue)   │                                          │
//!     └──── cancel / queue bound ──────┴──────── cancel (within one chunk) ───────┴─▶ Cancelled (grant cancelled + drained)
//! ```

use std::sync::Arc;
use std::time::Instant;

use pagewarden_common::metrics::WorkerMetrics;
use pagewarden_common::TenantId;
use pagewarden_kvcache::{KvPool, Owner, ReadablePages, SharedPages};
use pagewarden_model::{Model, Sampled, Sampler, TokenLogprobs};
use pagewarden_proto::v1 as pb;
use pagewarden_worker::{wire, Compute, ComputeError, PrefixCacheLog, WorkerError};
use tokio_util::sync::CancellationToken;

use crate::gate::{Entered, Gate};
use crate::grant::ValidPrefill;
use crate::grant_writer::GrantWriter;
use crate::segments::Segments;
use crate::turns::Turns;

/// Everything a job needs, shared by all jobs.
pub struct JobDeps {
    pub compute: Compute,
    pub pool: KvPool,
    pub segments: Segments,
    pub gate: Arc<Gate>,
    pub metrics: Arc<WorkerMetrics>,
    /// Prefix-cache hits, misses and evictions: metrics, and the auditor.
    pub prefix_log: PrefixCacheLog,
    pub chunk_tokens: usize,
    pub batch_pages: usize,
    /// One chunk computes at a time; waiting jobs take turns, tenants in rotation.
    pub turns: Turns,
    /// The model, for its tokenizer: end-of-generation tokens (`min_tokens` masks them) and
    /// the vocabulary a `response_format` grammar is compiled against.
    pub model: Arc<Model>,
}

/// Runs one admitted job to its end.
pub async fn run(
    deps: Arc<JobDeps>,
    job: ValidPrefill,
    cancel: CancellationToken,
) -> Result<pb::PrefillReply, WorkerError> {
    #[cfg(feature = "unsafe-test-switches")]
    let job = beyond_the_pool(job, &deps.pool);
    let owner = Owner {
        request: job.req,
        tenant: job.tenant.clone(),
    };
    // The cached prefix is pinned before the wait for pages, so the wait is for the rest only
    // and the prefix cannot be evicted meanwhile.
    let prefix = pin_prefix(&deps, &job);
    let cached = prefix.as_ref().map_or(0, |p| p.len());
    let arrived = Instant::now();
    let admitted = deps
        .gate
        .admit(owner, job.weight, job.prompt.len() - cached, &cancel)
        .await;
    let Entered { pages, slot } = match admitted {
        Ok(a) => a,
        Err(refused) => {
            GrantWriter::abandon(&deps, &job).await;
            return Err(refused.into());
        }
    };
    tracing::debug!(request = %job.req, gate_ms = arrived.elapsed().as_secs_f64() * 1e3, "admitted");
    let result = compute_and_send(&deps, &job, prefix, pages, &cancel).await;
    // The pages were dropped inside: the next waiter finds them free.
    drop(slot);
    result
}

/// TEST-ONLY: with worker admission switched off, a prompt longer than this worker's pool is
/// cut to what the pool holds, as the incident's prefill did: only those tokens are computed
/// and sent, and the manifest claims only them, fewer than decode reserved.
#[cfg(feature = "unsafe-test-switches")]
fn beyond_the_pool(mut job: ValidPrefill, pool: &KvPool) -> ValidPrefill {
    use pagewarden_common::test_switches::{Switch, TestSwitches};
    let holds = pool.capacity_tokens();
    if TestSwitches::current().is_off(Switch::WorkerAdmission) && job.prompt.len() > holds {
        tracing::error!(
            request = %job.req,
            prompt = job.prompt.len(),
            pool = holds,
            "UNSAFE TEST SWITCH: prompt longer than the pool; computing and sending only its start"
        );
        job.prompt.truncate(holds);
    }
    job
}

/// The longest cached prefix of the prompt in the request's namespace, pinned; `None` when
/// the request has no namespace. The last prompt token is always computed: its logits give
/// the first token.
fn pin_prefix(deps: &JobDeps, job: &ValidPrefill) -> Option<Arc<SharedPages>> {
    let ns = job.namespace.as_ref()?;
    if job.prompt.is_empty() {
        return None;
    }
    let prefix = deps
        .pool
        .pin_prefix(ns, &job.prompt[..job.prompt.len() - 1]);
    deps.prefix_log
        .lookup(&job.tenant, ns, job.req, job.prompt.len(), prefix.len());
    Some(Arc::new(prefix))
}

/// The forward pass over the admitted pages, chunk by chunk, with the pages each chunk
/// completes streamed to decode meanwhile. The full prompt pages then join the prefix cache
/// (when the request has a namespace); the rest are released when this returns.
async fn compute_and_send(
    deps: &Arc<JobDeps>,
    job: &ValidPrefill,
    prefix: Option<Arc<SharedPages>>,
    pages: ReadablePages,
    cancel: &CancellationToken,
) -> Result<pb::PrefillReply, WorkerError> {
    let started = Instant::now();
    let cached = prefix.as_ref().map_or(0, |p| p.len());
    let mut out = GrantWriter::open(deps, job, prefix.clone()).await?;
    let (pages, first, scored) =
        match compute(deps, job, prefix.clone(), pages, &mut out, cancel).await {
            Ok(done) => done,
            Err(Failure::Compute(s)) => {
                out.abort().await;
                return Err(s);
            }
            Err(Failure::Transfer(s)) => return Err(s),
        };
    deps.metrics
        .observe_prefill(started.elapsed().as_secs_f64());
    let t0 = Instant::now();
    tracing::debug!(request = %job.req, compute_ms = started.elapsed().as_secs_f64() * 1e3, "computed");
    let (manifest, bytes) = out.finish(&pages, cancel).await?;
    let reused = prefix.as_deref().map(wire::reused_runs).unwrap_or_default();
    if let Some(prefix) = prefix {
        let published = pages.publish_prefix(&prefix, &job.prompt, job.req);
        deps.prefix_log
            .published(&job.tenant, prefix.namespace(), &published);
    } else {
        drop(pages);
    }
    // What the transfer added after the forward pass: the pipeline hides the rest.
    let secs = t0.elapsed();
    deps.metrics.observe_transfer(bytes, secs.as_secs_f64());
    Ok(pb::PrefillReply {
        req: Some(pagewarden_proto::convert::request_ref(job.req, job.attempt)),
        manifest: Some(wire::manifest_to_wire(manifest)),
        first_token: first.token,
        transfer_bytes: bytes,
        transfer_micros: secs.as_micros() as u64,
        first_logprobs: first.logprobs.as_ref().map(wire::logprobs),
        cached_tokens: cached as u32,
        prompt_logprobs: scored.iter().map(wire::logprobs).collect(),
        reused,
    })
}

pub(crate) fn cancelled() -> WorkerError {
    WorkerError::Cancelled("prefill aborted".into())
}

/// How a forward pass ended early: the grant still needs ending (`Compute`: aborted or the
/// pass failed), or the transfer already ended it.
enum Failure {
    Compute(WorkerError),
    Transfer(WorkerError),
}

/// The forward pass, one chunk at a time, each chunk in its turn on the engine ([`Turns`]: a
/// long prompt does not hold the engine until it ends, and a short one behind it waits a chunk
/// per tenant ahead of it, not whole prompts). A chunk runs in passes of
/// [`Compute::yield_tokens`] while another tenant's job waits, and in one pass while none
/// does; the turn ends after the pass during which another tenant's job started waiting, or
/// after the first pass when one was already waiting: that job waits for the pass under way
/// (at most a chunk), never for the rest of the prompt, and a rest that fits one short pass,
/// of a tenant with nothing else at the engine, does not wait even for that: it overtakes
/// (`turns.rs`). Between
/// turns: the pages completed so far go to decode, and a cancel stops the job (within one
/// chunk).
async fn compute(
    deps: &Arc<JobDeps>,
    job: &ValidPrefill,
    prefix: Option<Arc<SharedPages>>,
    mut pages: ReadablePages,
    out: &mut GrantWriter<'_>,
    cancel: &CancellationToken,
) -> Result<(ReadablePages, Sampled, Vec<TokenLogprobs>), Failure> {
    let page_size = deps.pool.layout().page_size;
    let pass = deps.compute.yield_tokens(deps.chunk_tokens);
    let mut logits = Vec::new();
    let mut scored = Vec::new();
    // The cached prefix's positions are done: its pages go to decode during the first pass.
    let mut done = prefix.as_ref().map_or(0, |p| p.len());
    while done < job.prompt.len() {
        let asked = Instant::now();
        // A short rest of a prompt overtakes another tenant's pass (`turns.rs`); otherwise
        // the job waits for its turn.
        let overtake = (job.prompt.len() - done <= pass && deps.compute.overtakes())
            .then(|| deps.turns.overtake(&job.tenant))
            .flatten();
        let urgent = overtake.is_some();
        let turn = match overtake {
            Some(_) => None,
            None => tokio::select! {
                t = deps.turns.take(&job.tenant, job.weight) => Some(t),
                () = cancel.cancelled() => return Err(Failure::Compute(cancelled())),
            },
        };
        tracing::debug!(request = %job.req, wait_ms = asked.elapsed().as_secs_f64() * 1e3, done, urgent, "turn");
        let d = deps.clone();
        let prefix = prefix.clone();
        let tenant = job.tenant.clone();
        let end = (done + deps.chunk_tokens).min(job.prompt.len());
        let chunk = job.prompt[done..end].to_vec();
        // Scoring: the prompt's token after the chunk is scored after its last position.
        let score = job
            .sampling
            .prompt_logprobs
            .map(|top| (top, job.prompt.get(end).copied()));
        let prompt_end = job.prompt.len();
        let pass_task = tokio::task::spawn_blocking(move || {
            let mut run = || {
                passes(
                    &d,
                    &tenant,
                    prefix.as_deref(),
                    &mut pages,
                    &chunk,
                    prompt_end,
                    pass,
                    score,
                )
            };
            let (ran, result) = if urgent { d.compute.urgent(run) } else { run() };
            (pages, ran, result)
        });
        // The cached prefix's pages go to decode while the first pass computes (later passes
        // find them sent).
        let sent = out.send_prefix(cancel).await;
        let (back, ran, result) = pass_task.await.map_err(|e| {
            Failure::Compute(WorkerError::Internal(format!("prefill task failed: {e}")))
        })?;
        sent.map_err(Failure::Transfer)?;
        // The turn passes on, or the overtaken pass resumes.
        drop((turn, overtake));
        tracing::debug!(request = %job.req, ran, pass_ms = asked.elapsed().as_secs_f64() * 1e3, "pass");
        pages = back;
        let (last, part_scored) = result.map_err(|e| {
            Failure::Compute(WorkerError::Internal(format!(
                "prefill forward pass failed: {e}"
            )))
        })?;
        logits = last;
        scored.extend(part_scored);
        deps.metrics.prefill_chunk();
        done += ran;
        if cancel.is_cancelled() {
            return Err(Failure::Compute(cancelled()));
        }
        out.send_upto(&pages, done / page_size, cancel)
            .await
            .map_err(Failure::Transfer)?;
    }
    let first =
        Sampler::for_model(&job.sampling, &job.prompt, deps.model.tokenizer()).next(&logits);
    Ok((pages, first, scored))
}

/// What passes computed: the last position's logits, and the positions scored
/// (`prompt_logprobs`).
type Computed = (Vec<f32>, Vec<TokenLogprobs>);

/// The passes of one turn over `chunk` (the prompt's next tokens). Each pass re-reads every
/// weight and every earlier key of the prompt, so passes are not made small for nothing: while
/// nobody waits, the rest of the chunk in one pass (a lone 260-token prompt of Gemma 3 took
/// 4-8% longer in 64-token passes than in one on a Zen 4, `bench engine --chunk`), and a job
/// that starts waiting waits for at most that chunk; while one waits, one pass of `pass`
/// tokens, then the turn ends. `prompt_end`: where the prompt ends. How many tokens ran, and
/// the last pass's logits (empty unless that pass reached the prompt's end, or scored).
#[allow(clippy::too_many_arguments)]
fn passes(
    d: &JobDeps,
    tenant: &TenantId,
    prefix: Option<&SharedPages>,
    pages: &mut ReadablePages,
    chunk: &[u32],
    prompt_end: usize,
    pass: usize,
    score: Option<(usize, Option<u32>)>,
) -> (usize, Result<Computed, ComputeError>) {
    let mut ran = 0;
    let mut result = Ok((Vec::new(), Vec::new()));
    let mut scored = Vec::new();
    while ran < chunk.len() {
        let n = if d.turns.contended(tenant) {
            pass
        } else {
            chunk.len() - ran
        };
        let part = &chunk[ran..(ran + n).min(chunk.len())];
        result = match score {
            None => d
                .compute
                .prefill_part(prefix, pages, part, prompt_end)
                .map(|l| (l, Vec::new())),
            Some((top, after)) => {
                let next = chunk.get(ran + part.len()).copied().or(after);
                d.compute.prefill_scored(prefix, pages, part, next, top)
            }
        };
        ran += part.len();
        d.metrics.iteration(part.len());
        if let Ok((_, s)) = &mut result {
            scored.append(s);
        }
        if result.is_err() || d.turns.contended(tenant) {
            break;
        }
    }
    (ran, result.map(|(last, _)| (last, scored)))
}

#[cfg(test)]
mod tests;
