//! The gate in front of the forward pass: at most `max_running` jobs are admitted at once, each
//! over local pages for its whole prompt (admitted jobs take turns on the engine chunk by
//! chunk, see `job.rs`). A job that passed admission (I3) but finds no slot or not
//! enough free pages waits in a bounded [`FairQueue`] (FIFO per tenant, tenants in turn),
//! holding no pages, instead of being refused (I9). A full queue or a passed queue deadline
//! answers `queue_full` / `queue_timeout`; a cancelled waiter leaves the queue at once.
//!
//! A tenant with no job admitted is never held behind another tenant's jobs: its first waiter
//! is admitted as soon as its pages are free, past a blocked head and past `max_running` (so
//! at most one job per tenant over the bound; the engine runs one chunk at a time anyway, see
//! `turns.rs`, so the bound only caps jobs holding pages). Otherwise a tenant keeping all the
//! slots with long prompts makes every other tenant's short one wait for a whole long prompt.
//!
//! ```text
//! wait ──slot and pages free──▶ Entered{pages, slot} ──job ends: pages dropped, then slot──▶ (next waiter)
//!   │
//!   └─ cancel / deadline / queue full ──▶ refused (held nothing)
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pagewarden_common::metrics::WorkerMetrics;
use pagewarden_common::TenantId;
use pagewarden_kvcache::{KvPool, Owner, ReadablePages};
use pagewarden_worker::{FairQueue, QueueRefusal, WorkerError};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// Bounds of the gate.
#[derive(Debug, Clone, Copy)]
pub struct GateConfig {
    /// Jobs computing at once (`--max-concurrency`).
    pub max_running: usize,
    /// Jobs waiting at most (`--max-queue`).
    pub max_queue: usize,
    /// Longest wait (`--queue-timeout`).
    pub queue_timeout: Duration,
}

/// A waiter's place in the queue.
struct Waiter {
    id: u64,
    owner: Owner,
    tokens: usize,
    tx: oneshot::Sender<Entered>,
}

struct Inner {
    queue: FairQueue<Waiter>,
    running: usize,
    /// Jobs admitted per tenant (tenants with none are absent).
    by_tenant: HashMap<TenantId, usize>,
    next_id: u64,
}

/// The gate: a slot count, the queue, and the pool it allocates from.
pub struct Gate {
    inner: Mutex<Inner>,
    pool: KvPool,
    cfg: GateConfig,
    metrics: Arc<WorkerMetrics>,
}

/// A job's right to compute: while held, it counts against `max_running`; dropping it lets
/// the next waiter in. Drop the job's pages before it, so they are free for that waiter.
pub struct Slot {
    gate: Arc<Gate>,
    tenant: TenantId,
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut inner = self.gate.inner.lock();
            inner.running -= 1;
            if let Some(n) = inner.by_tenant.get_mut(&self.tenant) {
                *n -= 1;
                if *n == 0 {
                    inner.by_tenant.remove(&self.tenant);
                }
            }
        }
        self.gate.pump();
    }
}

/// What a job that got through the gate holds: its pages (the whole prompt) and its slot.
pub struct Entered {
    pub pages: ReadablePages,
    pub slot: Slot,
}

/// Why a job did not get through the gate.
pub enum Refused {
    /// Cancelled while waiting.
    Cancelled,
    /// The queue's bound.
    Queue(QueueRefusal),
    /// The pool cannot hold the prompt at all (admission should have said so first).
    Invalid(String),
}

impl Gate {
    /// A gate over `pool`.
    pub fn new(pool: KvPool, cfg: GateConfig, metrics: Arc<WorkerMetrics>) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner {
                queue: FairQueue::new(),
                running: 0,
                by_tenant: HashMap::new(),
                next_id: 0,
            }),
            pool,
            cfg,
            metrics,
        })
    }

    /// Jobs waiting.
    pub fn queued(&self) -> usize {
        self.inner.lock().queue.len()
    }

    /// Waits for a slot and pages for `tokens` prompt tokens, in queue order.
    pub async fn admit(
        self: &Arc<Self>,
        owner: Owner,
        weight: u32,
        tokens: usize,
        cancel: &CancellationToken,
    ) -> Result<Entered, Refused> {
        if tokens.div_ceil(self.pool.layout().page_size) > self.pool.capacity_pages() {
            return Err(Refused::Invalid(format!(
                "{tokens} prompt tokens exceed this worker's KV pool"
            )));
        }
        let queued_at = Instant::now();
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut inner = self.inner.lock();
            let id = inner.next_id;
            inner.next_id += 1;
            let tenant = owner.tenant.clone();
            inner.queue.push(
                &tenant,
                weight,
                Waiter {
                    id,
                    owner,
                    tokens,
                    tx,
                },
            );
            id
        };
        let _leave = Leave { gate: self, id };
        self.pump();
        // Only a job that must wait counts against the bound (`--max-queue 0`: never wait).
        if self.queued() > self.cfg.max_queue {
            let removed = self.inner.lock().queue.remove_first(|w| w.id == id);
            if removed.is_some() {
                let refusal = QueueRefusal::Full {
                    limit: self.cfg.max_queue,
                };
                self.metrics.rejection(refusal.reason());
                return Err(Refused::Queue(refusal));
            }
        }
        tokio::select! {
            admitted = rx => {
                self.metrics.observe_queue_time(queued_at.elapsed().as_secs_f64());
                admitted.map_err(|_| Refused::Cancelled)
            }
            () = tokio::time::sleep(self.cfg.queue_timeout) => {
                let refusal = QueueRefusal::Timeout { waited: self.cfg.queue_timeout };
                self.metrics.rejection(refusal.reason());
                Err(Refused::Queue(refusal))
            }
            () = cancel.cancelled() => Err(Refused::Cancelled),
        }
    }

    /// Admits waiters, in queue order, while a slot is free and the next one's pages are; a
    /// tenant with no job admitted passes a blocked head and the slot bound (module doc). The
    /// head is never overtaken otherwise, so a long prompt is not starved by short ones.
    fn pump(self: &Arc<Self>) {
        // Admissions whose waiter already left: dropped after the lock is released (their
        // slot's drop takes it again).
        let mut orphaned = Vec::new();
        {
            let mut inner = self.inner.lock();
            loop {
                // A waiter that already left is only removed (its `Leave` may not have run).
                if inner.queue.remove_first(|w| w.tx.is_closed()).is_some() {
                    continue;
                }
                let page_size = self.pool.layout().page_size;
                let free = self.pool.available_pages();
                let slot_free = inner.running < self.cfg.max_running;
                let Inner {
                    queue, by_tenant, ..
                } = &mut *inner;
                let idle = |tenant: &TenantId| !by_tenant.contains_key(tenant);
                let next = queue.pop_fitting(
                    |w| {
                        w.tokens.div_ceil(page_size) <= free && (slot_free || idle(&w.owner.tenant))
                    },
                    idle,
                );
                let Some(w) = next else {
                    break;
                };
                let tenant = w.owner.tenant.clone();
                let pages = match self.pool.allocate(w.owner, w.tokens) {
                    Ok(p) => p,
                    Err(e) => {
                        // Checked above under the only allocator's lock: not expected.
                        tracing::error!(error = %e, "prefill pool allocation failed after the check");
                        break;
                    }
                };
                inner.running += 1;
                *inner.by_tenant.entry(tenant.clone()).or_default() += 1;
                let admitted = Entered {
                    pages,
                    slot: Slot {
                        gate: self.clone(),
                        tenant,
                    },
                };
                if let Err(a) = w.tx.send(admitted) {
                    orphaned.push(a);
                }
            }
            self.metrics.set_queue_depth(inner.queue.len());
        }
        drop(orphaned);
    }
}

/// Removes a waiter that stopped waiting (cancelled, timed out, call dropped) from the queue.
struct Leave<'a> {
    gate: &'a Arc<Gate>,
    id: u64,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let removed = {
            let mut inner = self.gate.inner.lock();
            let w = inner.queue.remove_first(|w| w.id == self.id);
            self.gate.metrics.set_queue_depth(inner.queue.len());
            w
        };
        if removed.is_some() {
            // The head may have been waiting behind it for nothing else.
            self.gate.pump();
        }
    }
}

impl From<Refused> for WorkerError {
    fn from(r: Refused) -> WorkerError {
        match r {
            Refused::Cancelled => WorkerError::Cancelled("prefill aborted".into()),
            Refused::Queue(q) => q.error("prefill"),
            Refused::Invalid(m) => WorkerError::Invalid(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewarden_common::RequestId;
    use pagewarden_kvcache::{KvLayout, PoolConfig};

    const PAGE: usize = 4;

    fn gate(pages: usize, max_running: usize) -> Arc<Gate> {
        let layout = KvLayout {
            layers: 1,
            kv_heads: 1,
            head_dim: 4,
            page_size: PAGE,
        };
        Gate::new(
            KvPool::new(PoolConfig::with_pages(layout, pages)),
            GateConfig {
                max_running,
                max_queue: 16,
                queue_timeout: Duration::from_secs(60),
            },
            Arc::new(WorkerMetrics::new("prefill", "test")),
        )
    }

    fn owner(tenant: &str) -> Owner {
        Owner {
            request: RequestId::random(),
            tenant: TenantId::new(tenant),
        }
    }

    /// Starts a job's wait at the gate; its admission arrives on the returned task.
    fn wait(
        gate: &Arc<Gate>,
        tenant: &str,
        tokens: usize,
    ) -> tokio::task::JoinHandle<Result<Entered, Refused>> {
        let (gate, owner) = (gate.clone(), owner(tenant));
        tokio::spawn(async move {
            let cancel = CancellationToken::new();
            gate.admit(owner, 1, tokens, &cancel).await
        })
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_tenant_with_nothing_admitted_does_not_wait_for_another_tenants_slots() {
        // One slot, held by "flood"; a second "flood" job and "quiet"'s first wait.
        let gate = gate(64, 1);
        let held = wait(&gate, "flood", 8 * PAGE).await.unwrap().ok().unwrap();
        let flood2 = wait(&gate, "flood", 8 * PAGE);
        settle().await;
        let quiet = wait(&gate, "quiet", PAGE);
        settle().await;
        assert!(
            quiet.is_finished(),
            "quiet's first job waited for flood's slot"
        );
        let quiet = quiet.await.unwrap().ok().unwrap();
        assert!(!flood2.is_finished(), "flood went past its slot bound");
        assert_eq!(gate.queued(), 1);
        // A second "quiet" job, with one admitted, waits its turn like everyone else.
        let quiet2 = wait(&gate, "quiet", PAGE);
        settle().await;
        assert!(!quiet2.is_finished());
        // Its job ended, flood has nothing admitted: its next job goes in, not quiet2.
        drop(held);
        let flood2 = flood2.await.unwrap().ok().unwrap();
        settle().await;
        assert!(!quiet2.is_finished());
        // Once "quiet" has nothing admitted again, its next job passes.
        drop(quiet);
        settle().await;
        assert!(quiet2.is_finished());
        drop(flood2);
    }

    #[tokio::test]
    async fn a_blocked_head_is_passed_only_by_a_tenant_with_nothing_admitted() {
        // Pages for 10; "flood" holds 8 and its next job needs 8: it waits for pages.
        let gate = gate(10, 8);
        let held = wait(&gate, "flood", 8 * PAGE).await.unwrap().ok().unwrap();
        let flood2 = wait(&gate, "flood", 8 * PAGE);
        settle().await;
        let quiet = wait(&gate, "quiet", PAGE);
        settle().await;
        assert!(
            quiet.is_finished(),
            "quiet waited behind flood's blocked head"
        );
        let quiet = quiet.await.unwrap().ok().unwrap();
        let quiet2 = wait(&gate, "quiet", PAGE);
        settle().await;
        assert!(
            !quiet2.is_finished(),
            "a tenant with a job admitted passed the head"
        );
        drop(held);
        let flood2 = flood2.await.unwrap().ok().unwrap();
        drop(quiet);
        settle().await;
        assert!(quiet2.is_finished());
        drop(flood2);
    }
}
