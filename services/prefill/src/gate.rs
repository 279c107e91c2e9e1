//! The gate in front of the forward pass: at most `max_running` jobs are admitted at once, each
//! over local pages for its whole prompt (admitted jobs take turns on the engine chunk by
//! chunk, see `job.rs`). A job that passed admission (I3) but finds no slot or not
//! enough free pages waits in a bounded [`FairQueue`] (FIFO per tenant, tenants in turn),
//! holding no pages, instead of being refused (I9). A full queue or a passed queue deadline
//! answers `queue_full` / `queue_timeout`; a cancelled waiter leaves the queue at once.
//!
//! ```text
//! wait ──slot and pages free──▶ Admitted{pages, slot} ──job ends: pages dropped, then slot──▶ (next waiter)
//!   │
//!   └─ cancel / deadline / queue full ──▶ refused (held nothing)
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use pagewarden_common::metrics::WorkerMetrics;
use pagewarden_kvcache::{KvPool, Owner, ReadablePages};
use pagewarden_worker::wire::QueueRefusal;
use pagewarden_worker::FairQueue;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tonic::Status;

/// Bounds of the gate.
#[derive(Debug, Clone, Copy)]
pub struct GateConfig {
    /// Jobs computing at once (`--max-concurrency`).
    pub max_running: usize,
    /// Jobs waiting at most (`--max-queue`).
    pub max_queue: usize,
    /// Longest wait (`--queue-timeout-ms`).
    pub queue_timeout: Duration,
}

/// A waiter's place in the queue.
struct Waiter {
    id: u64,
    owner: Owner,
    tokens: usize,
    tx: oneshot::Sender<Admitted>,
}

struct Inner {
    queue: FairQueue<Waiter>,
    running: usize,
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
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gate.inner.lock().running -= 1;
        self.gate.pump();
    }
}

/// What an admitted job gets: its pages (the whole prompt) and its slot.
pub struct Admitted {
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
    ) -> Result<Admitted, Refused> {
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

    /// Admits waiters, in queue order, while a slot is free and the next one's pages are.
    /// The head is never overtaken, so a long prompt is not starved by short ones.
    fn pump(self: &Arc<Self>) {
        // Admissions whose waiter already left: dropped after the lock is released (their
        // slot's drop takes it again).
        let mut orphaned = Vec::new();
        {
            let mut inner = self.inner.lock();
            while inner.running < self.cfg.max_running {
                let Some(head) = inner.queue.peek() else {
                    break;
                };
                if head.tx.is_closed() {
                    inner.queue.pop();
                    continue;
                }
                let needed = head.tokens.div_ceil(self.pool.layout().page_size);
                if needed > self.pool.stats().free {
                    break;
                }
                let Some(w) = inner.queue.pop() else {
                    break;
                };
                let pages = match self.pool.allocate(w.owner, w.tokens) {
                    Ok(p) => p,
                    Err(e) => {
                        // Checked above under the only allocator's lock: not expected.
                        tracing::error!(error = %e, "prefill pool allocation failed after the check");
                        break;
                    }
                };
                inner.running += 1;
                let admitted = Admitted {
                    pages,
                    slot: Slot { gate: self.clone() },
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

impl Refused {
    /// The wire status.
    pub fn status(self) -> Status {
        match self {
            Refused::Cancelled => Status::cancelled("prefill aborted"),
            Refused::Queue(q) => q.status("prefill"),
            Refused::Invalid(m) => Status::invalid_argument(m),
        }
    }
}
