//! Sender-side bookkeeping of one connection, shared by the TCP and RDMA backends: batches
//! sent but not yet acknowledged, drains waiting for their ack, cancelled grants, the routing
//! of acks to them, and the connection's death (which fails every pending batch and drain at
//! once, and is broadcast).

use std::collections::{HashMap, HashSet, VecDeque};

use parking_lot::Mutex;
use tokio::sync::{broadcast, oneshot, OwnedSemaphorePermit};

use crate::batch::{BatchCompleter, BatchFailure, BatchStatus};
use crate::engine::{FailureEvent, SegmentId, TransferError};
use crate::frame::{BatchAck, BatchId, Frame};
use crate::types::GrantKey;

/// A batch whose pages were sent, waiting for its BATCH_ACK.
struct PendingBatch {
    done: BatchCompleter,
    _permit: OwnedSemaphorePermit,
    sent: u32,
    cancelled: bool,
}

/// What a connection still owes its callers.
#[derive(Default)]
pub(crate) struct Pending {
    batches: HashMap<BatchId, PendingBatch>,
    drains: HashMap<GrantKey, VecDeque<oneshot::Sender<Result<(), TransferError>>>>,
    pub(crate) dead: Option<String>,
}

/// State shared by a connection's writer and ack reader.
pub(crate) struct Shared {
    pub(crate) seg: SegmentId,
    pub(crate) pending: Mutex<Pending>,
    pub(crate) cancelled: Mutex<HashSet<GrantKey>>,
    pub(crate) failures: broadcast::Sender<FailureEvent>,
}

impl Shared {
    /// Fresh state for segment `seg`.
    pub(crate) fn new(seg: SegmentId, failures: broadcast::Sender<FailureEvent>) -> Self {
        Self {
            seg,
            pending: Mutex::default(),
            cancelled: Mutex::default(),
            failures,
        }
    }

    /// Fails every pending batch and drain, and broadcasts the failure.
    pub(crate) fn fail_all(&self, reason: String) {
        if self.fail_pending(&reason) {
            tracing::warn!(segment = ?self.seg, %reason, "transfer connection failed");
            let _ = self.failures.send(FailureEvent {
                segment: self.seg,
                reason,
            });
        }
    }

    /// Fails every pending batch and drain; false if the connection was already dead.
    pub(crate) fn fail_pending(&self, reason: &str) -> bool {
        let (batches, drains) = {
            let mut p = self.pending.lock();
            if p.dead.is_some() {
                return false;
            }
            p.dead = Some(reason.to_string());
            (
                std::mem::take(&mut p.batches),
                std::mem::take(&mut p.drains),
            )
        };
        for (_, b) in batches {
            b.done
                .finish(BatchStatus::Failed(BatchFailure::ConnectionLost(
                    reason.to_string(),
                )));
        }
        for tx in drains.into_values().flatten() {
            let _ = tx.send(Err(TransferError::ConnectionLost(reason.to_string())));
        }
        true
    }

    /// Whether `key` was cancelled (its unsent pages are to be skipped).
    pub(crate) fn is_cancelled(&self, key: GrantKey) -> bool {
        self.cancelled.lock().contains(&key)
    }

    /// Queues `reply` for the next DRAIN_ACK of `key`; if the connection is dead, answers it
    /// with the failure instead and returns false (then no DRAIN is to be sent).
    pub(crate) fn expect_drain(
        &self,
        key: GrantKey,
        reply: oneshot::Sender<Result<(), TransferError>>,
    ) -> bool {
        let mut p = self.pending.lock();
        if let Some(r) = &p.dead {
            let _ = reply.send(Err(TransferError::ConnectionLost(r.clone())));
            return false;
        }
        p.drains.entry(key).or_default().push_back(reply);
        true
    }

    /// Parks a batch whose pages were sent (`sent` of `total`) until its BATCH_ACK; if the
    /// connection is dead, fails it instead and returns false (then no BATCH_END is to be sent).
    pub(crate) fn expect_ack(
        &self,
        id: BatchId,
        done: BatchCompleter,
        permit: OwnedSemaphorePermit,
        sent: u32,
        total: usize,
    ) -> bool {
        let mut pend = self.pending.lock();
        if let Some(r) = &pend.dead {
            done.finish(BatchStatus::Failed(BatchFailure::ConnectionLost(r.clone())));
            return false;
        }
        pend.batches.insert(
            id,
            PendingBatch {
                done,
                _permit: permit,
                sent,
                cancelled: (sent as usize) < total,
            },
        );
        true
    }

    /// Routes an ack from the receiver (BATCH_ACK, DRAIN_ACK); any other frame is handed back
    /// (a receiver never sends one: the caller closes the connection).
    pub(crate) fn route_ack<'a>(&self, f: Frame<'a>) -> Result<(), Frame<'a>> {
        match f {
            Frame::BatchAck(a) => self.on_ack(a),
            Frame::DrainAck(k) => self.on_drain_ack(k),
            f @ (Frame::Write(_) | Frame::BatchEnd { .. } | Frame::Drain(_)) => return Err(f),
        }
        Ok(())
    }

    /// Finishes the acknowledged batch.
    pub(crate) fn on_ack(&self, a: BatchAck) {
        let Some(b) = self.pending.lock().batches.remove(&a.batch) else {
            return;
        };
        let status = if b.cancelled && a.rejected == 0 {
            BatchStatus::Cancelled { written: a.written }
        } else if a.rejected == 0 && a.written == b.sent {
            BatchStatus::Completed { pages: a.written }
        } else {
            BatchStatus::Failed(BatchFailure::Rejected {
                written: a.written,
                rejected: a.rejected,
                first: a.first_reject,
            })
        };
        b.done.finish(status);
    }

    /// Answers the oldest drain of `key`.
    pub(crate) fn on_drain_ack(&self, key: GrantKey) {
        let tx = {
            let mut p = self.pending.lock();
            let q = p.drains.get_mut(&key);
            let tx = q.and_then(|q| q.pop_front());
            if p.drains.get(&key).is_some_and(|q| q.is_empty()) {
                p.drains.remove(&key);
            }
            tx
        };
        self.cancelled.lock().remove(&key);
        if let Some(tx) = tx {
            let _ = tx.send(Ok(()));
        }
    }
}
