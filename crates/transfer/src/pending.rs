//! Sender-side bookkeeping of one connection, shared by the TCP and RDMA backends: batches
//! sent but not yet acknowledged, drains waiting for their ack, cancelled grants, and the
//! connection's death (which fails every pending batch and drain at once, and is broadcast).

use std::collections::{HashMap, HashSet, VecDeque};

use parking_lot::Mutex;
use tokio::sync::{broadcast, oneshot, OwnedSemaphorePermit};

use crate::batch::{BatchCompleter, BatchFailure, BatchStatus};
use crate::engine::{FailureEvent, SegmentId, TransferError};
use crate::frame::{BatchAck, BatchId};
use crate::types::GrantKey;

/// A batch whose pages were sent, waiting for its BATCH_ACK.
pub(crate) struct PendingBatch {
    pub(crate) done: BatchCompleter,
    pub(crate) _permit: OwnedSemaphorePermit,
    pub(crate) sent: u32,
    pub(crate) cancelled: bool,
}

/// What a connection still owes its callers.
#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) batches: HashMap<BatchId, PendingBatch>,
    pub(crate) drains: HashMap<GrantKey, VecDeque<oneshot::Sender<Result<(), TransferError>>>>,
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
