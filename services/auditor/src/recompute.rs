//! The recompute audit. A marker only catches foreign text copied out word for word; an answer
//! computed over another tenant's KV (the incident's class) usually copies nothing. So, for a
//! sample of served requests, the router sends the prompt's token ids, the served tokens and
//! the raw logprob the serving path computed for each; here a model of the auditor's own (its
//! own process, fresh pages, no prefix cache, never the pool that served the request) runs the
//! same sequence again and scores each served token. A served logprob further than the
//! tolerance from the clean one is a `recompute_mismatch` incident, with the first diverging
//! position, both logprobs, and the pages the serving decode read.
//!
//! The clean pass follows the serving arithmetic: the prompt through prefill, then one decode
//! step per served token (not one scored pass over the whole sequence, whose kernels differ).
//! Most served choices come out bit-equal (the workers report their arithmetic, and the
//! recompute records whether it was its own), but not all can: the kernels pick their float
//! order by a product's row count, as llama.cpp does (parity), so a prompt whose last pass
//! had one row (after a prefix-cache hit), a decode step in a batch of a K-quant model, or a
//! sequence decode preempted and recomputed in one pass, each compute a few logprobs in
//! another order. So a tolerance applies, set from the clean differences measured on the real
//! services (see [`DEFAULT_TOLERANCE`]), and every recompute's largest difference is exported
//! (`pagewarden_auditor_recompute_max_diff_nats`) for operators to check it against.
//! Temperature does not matter: the raw logprob of each served token is scored, nothing is
//! regenerated.
//!
//! Scoring runs on one thread of its own at the lowest CPU priority (`SCHED_IDLE`), behind a
//! bounded queue (full: the report is dropped and counted, never waited for), so it never
//! delays serving.
//! Tokens live only in that queue until their recompute is done; the store keeps digests and
//! the verdict.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pagewarden_common::receipt::ids_sha256;
use pagewarden_kvcache::{KvPool, Owner, PoolConfig, RequestId, TenantId};
use pagewarden_model::llama::{LoadOptions, Model, ModelError};
use pagewarden_model::logprobs::TokenLogprobs;
use serde_json::json;

use crate::domain::{IncidentKind, RecomputeVerdict, UnixMs};
use crate::engine::Engine;
use crate::ingest::ValidRecompute;
use crate::store::{NewIncident, NewRecompute};

/// Reports waiting for their recompute, at most; more are dropped and counted.
const QUEUE: usize = 1024;

/// Token ids (prompts and outputs) waiting in the queue, at most (16 MiB of ids): a flood of
/// long reports is dropped and counted before it can hold more memory than this.
const QUEUED_TOKENS: usize = 4 << 20;

/// Tokens of one KV page of the recompute's own pool.
const PAGE_SIZE: usize = 16;

/// The first wait before storing a verdict again, and the longest.
const STORE_RETRY: Duration = Duration::from_millis(500);
const STORE_RETRY_MAX: Duration = Duration::from_secs(10);

/// The recompute audit's settings.
#[derive(Clone, Debug)]
pub struct RecomputeSettings {
    /// The model the serving workers run (the same GGUF file).
    pub model: PathBuf,
    /// How far (nats) a served logprob may be from the clean one.
    pub tolerance: f32,
}

/// The default tolerance, in nats: above the largest clean difference measured on the real
/// services (0.35 nats, on SmolLM2 under heavy preemption, prefix-cache hits and prompts in
/// chunks, `tests/tests/recompute_audit.rs`: 93 and 109 of 204 choices bit-equal with 151 and 131
/// preemptions, 194 of 204 with 2), well below what attending over someone else's KV does to a
/// logprob (2.6 to 4.2 nats for the incident's B, `tests/tests/incident_real_services.rs`).
pub const DEFAULT_TOLERANCE: f32 = 1.0;

/// The queue in front of the recompute thread.
pub struct Recomputer {
    tx: SyncSender<ValidRecompute>,
    /// Token ids of the reports queued and not yet scored.
    queued: Arc<AtomicUsize>,
}

/// What one recompute found.
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    /// The clean logprob of each served token.
    pub clean: Vec<f32>,
    /// The largest |served − clean|.
    pub max_diff: f32,
    /// The first position beyond the tolerance.
    pub first_divergence: Option<usize>,
}

impl Recomputer {
    /// Loads the model (a failure is the caller's start-up error) and starts the thread that
    /// scores what [`Recomputer::submit`] queues, recording into `engine` on `rt`.
    pub fn start(
        settings: RecomputeSettings,
        engine: Arc<Engine>,
        rt: tokio::runtime::Handle,
    ) -> anyhow::Result<Self> {
        let opts = LoadOptions {
            threads: 1,
            ..LoadOptions::default()
        };
        let model = Model::load(&settings.model, &opts)
            .map_err(|e| anyhow::anyhow!("recompute model {}: {e}", settings.model.display()))?;
        let (tx, rx) = sync_channel::<ValidRecompute>(QUEUE);
        let queued = Arc::new(AtomicUsize::new(0));
        let taken = queued.clone();
        std::thread::Builder::new()
            .name("recompute".into())
            .spawn(move || {
                lowest_priority();
                let own = model.arithmetic();
                while let Ok(r) = rx.recv() {
                    taken.fetch_sub(r.tokens(), Ordering::Relaxed);
                    let started = Instant::now();
                    let tolerance = settings.tolerance;
                    let scored = score(&model, &r, tolerance);
                    let took = started.elapsed();
                    let same = r.arithmetic.iter().all(|a| *a == own);
                    // A verdict (a mismatch's incident above all) outlives a database outage:
                    // the thread waits for the store, as the routers' reports do.
                    let (mut wait, mut stored) = (STORE_RETRY, None);
                    loop {
                        let done = record(&engine, &r, &scored, tolerance, same, took, &mut stored);
                        match rt.block_on(done) {
                            Ok(()) => break,
                            Err(e) => {
                                engine.metrics().ingest_error();
                                tracing::warn!(error = %e, "storing a recompute failed; retrying");
                                std::thread::sleep(wait);
                                wait = (wait * 2).min(STORE_RETRY_MAX);
                            }
                        }
                    }
                }
            })
            .map_err(|e| anyhow::anyhow!("cannot start the recompute thread: {e}"))?;
        Ok(Self { tx, queued })
    }

    /// Queues `r` for its recompute; false (and nothing queued) when the queue is full, in
    /// reports or in token ids.
    pub fn submit(&self, r: ValidRecompute) -> bool {
        let n = r.tokens();
        let fits = self
            .queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
                (q + n <= QUEUED_TOKENS).then_some(q + n)
            })
            .is_ok();
        if !fits {
            return false;
        }
        match self.tx.try_send(r) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.queued.fetch_sub(n, Ordering::Relaxed);
                false
            }
        }
    }
}

/// This thread under Linux's `SCHED_IDLE` policy: it runs only on a core that no serving thread
/// wants, and any serving thread that wakes takes the core at once. (Nice 19 alone was not
/// enough: under 16 streams on two cores a nice-19 recompute still took 7% of both cores, as
/// the scheduler gives every runnable thread a slice by its weight.) Best effort: where the
/// policy cannot be set, nice 19; where neither can, the thread runs at normal priority.
fn lowest_priority() {
    // SAFETY: gettid takes no pointers; sched_setscheduler reads `param`, which outlives the
    // call, and with a thread id changes only this thread's policy (Linux: per-thread);
    // setpriority on this thread's id changes only its nice value.
    let rc = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::pid_t;
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) == 0 {
            0
        } else {
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19)
        }
    };
    if rc != 0 {
        tracing::warn!("could not lower the recompute thread's priority");
    }
}

/// Scores `r`'s served tokens on a clean pass: the prompt through prefill, then each served
/// token after a decode step over the one before it, on fresh pages (a pool of its own, sized
/// to the sequence, dropped after it); a position
/// diverges when its served logprob is more than `tolerance` nats from the clean one.
pub fn score(model: &Model, r: &ValidRecompute, tolerance: f32) -> Result<Scored, ModelError> {
    let vocab = model.config().vocab;
    if let Some(&token) = r.output.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::TokenOutOfRange { token, vocab });
    }
    let owner = Owner {
        request: RequestId::random(),
        tenant: TenantId::new("recompute"),
    };
    let tokens = r.prompt.len() + r.output.len();
    if tokens > model.context_length() {
        return Err(ModelError::ContextExceeded {
            tokens,
            context: model.context_length(),
        });
    }
    let pages = tokens.div_ceil(PAGE_SIZE);
    let pool = KvPool::new(PoolConfig::with_pages(model.kv_layout(PAGE_SIZE), pages));
    let mut seq = pool.allocate(owner, tokens)?;
    let mut logits = model.prefill(&mut seq, &r.prompt)?;
    let mut clean = Vec::with_capacity(r.output.len());
    for (i, &token) in r.output.iter().enumerate() {
        clean.push(TokenLogprobs::compute(&logits, token, 0).chosen.logprob);
        if i + 1 < r.output.len() {
            logits = model
                .decode_step(&mut [(&mut seq, token)])
                .pop()
                .expect("one result per sequence")?;
        }
    }
    let diffs = r.served.iter().zip(&clean).map(|(s, c)| (s - c).abs());
    let max_diff = diffs.clone().fold(0.0f32, f32::max);
    // A NaN difference (a NaN clean logit) diverges too.
    let first_divergence = diffs.clone().position(|d| d.is_nan() || d > tolerance);
    Ok(Scored {
        clean,
        max_diff,
        first_divergence,
    })
}

/// Millionths of a nat, for the store (integers on both backends).
fn micro(nats: f32) -> i64 {
    if nats.is_finite() {
        (f64::from(nats) * 1e6).round() as i64
    } else {
        i64::MAX
    }
}

/// Stores the verdict (once: `stored` keeps its row id across retries); a mismatch opens a
/// `recompute_mismatch` incident. `same_arithmetic`: both serving workers reported the
/// recompute's own arithmetic.
async fn record(
    engine: &Engine,
    r: &ValidRecompute,
    scored: &Result<Scored, ModelError>,
    tolerance: f32,
    same_arithmetic: bool,
    took: std::time::Duration,
    stored: &mut Option<i64>,
) -> Result<(), crate::store::StoreError> {
    let at = UnixMs::now();
    let request_id = r.request.map(|id| id.to_string());
    let (verdict, max_diff, first) = match scored {
        Ok(s) if s.first_divergence.is_some() => {
            (RecomputeVerdict::Mismatch, s.max_diff, s.first_divergence)
        }
        Ok(s) => (RecomputeVerdict::Match, s.max_diff, None),
        Err(e) => {
            tracing::warn!(error = %e, request = request_id.as_deref().unwrap_or(""), "recompute failed");
            (RecomputeVerdict::Failed, 0.0, None)
        }
    };
    let id = match *stored {
        Some(id) => id,
        None => {
            let id = engine
                .store()
                .insert_recompute(&NewRecompute {
                    request_id: request_id.clone(),
                    tenant: r.tenant.as_str().to_string(),
                    decode_node: r.decode_node.clone(),
                    prompt_tokens: r.prompt.len() as i64,
                    output_tokens: r.output.len() as i64,
                    prompt_sha256: ids_sha256(&r.prompt),
                    output_sha256: ids_sha256(&r.output),
                    verdict,
                    max_diff_micro: micro(max_diff).max(0),
                    tolerance_micro: micro(tolerance).max(0),
                    first_divergence: first.map(|p| p as i64),
                    recompute_ms: i64::try_from(took.as_millis()).unwrap_or(i64::MAX),
                    at,
                })
                .await?;
            engine.metrics().recompute(verdict, max_diff);
            *stored = Some(id);
            id
        }
    };
    let (Ok(s), Some(pos)) = (scored, first) else {
        return Ok(());
    };
    let kind = IncidentKind::RecomputeMismatch;
    engine
        .open_incident(NewIncident {
            kind,
            severity: kind.severity(),
            node: r.decode_node.clone(),
            request_id,
            tenant: Some(r.tenant.as_str().to_string()),
            other_tenant: None,
            page: None,
            generation: None,
            details: json!({
                "source": "recompute",
                "recompute_id": id,
                "first_divergence": pos,
                "served_logprob": r.served[pos],
                "clean_logprob": s.clean[pos],
                "max_abs_diff": s.max_diff,
                "tolerance": tolerance,
                "serving_arithmetic": { "prefill": r.arithmetic[0], "decode": r.arithmetic[1] },
                "same_arithmetic": same_arithmetic,
                "prompt_tokens": r.prompt.len(),
                "output_tokens": r.output.len(),
                "cached_tokens": r.cached_tokens,
                "temperature": r.temperature,
                "prefill_node": r.prefill_node,
                "decode_node": r.decode_node,
                "pages": r.pages.iter().map(|(p, g)| json!({"page": p, "generation": g})).collect::<Vec<_>>(),
            })
            .to_string(),
            at,
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use pagewarden_common::TenantId;

    fn report(tokens: usize) -> ValidRecompute {
        ValidRecompute {
            tenant: TenantId::new("t"),
            request: None,
            prompt: vec![1; tokens - 1],
            output: vec![2],
            served: vec![-1.0],
            temperature: 0.0,
            decode_node: None,
            prefill_node: None,
            pages: Vec::new(),
            cached_tokens: 0,
            arithmetic: Default::default(),
        }
    }

    /// A report longer than the whole token budget is dropped, never queued; a short one is.
    #[tokio::test]
    async fn the_queue_is_bounded_in_token_ids_too() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("tiny.gguf");
        std::fs::write(&model, pagewarden_model::tiny_llama_gguf(5)).unwrap();
        let store = Store::connect("sqlite::memory:").await.unwrap();
        let engine = Arc::new(Engine::new(store).await.unwrap());
        let settings = RecomputeSettings {
            model,
            tolerance: DEFAULT_TOLERANCE,
        };
        let q = Recomputer::start(settings, engine, tokio::runtime::Handle::current()).unwrap();
        assert!(!q.submit(report(QUEUED_TOKENS + 1)));
        assert!(q.submit(report(4)));
    }
}
