//! What the TCP and RDMA senders of one opened segment share: the caller-facing front
//! ([`SenderFront`]: submit, drain, cancel, close), the command queue to the writer task, the
//! in-flight byte budget, and the writer loop ([`Wire`] is all a transport supplies: how a
//! batch's pages, its end and a DRAIN go on the wire). Acks are routed by `pending.rs`.

use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::batch::{new_batch, BatchCompleter, BatchHandle};
use crate::engine::{OutPage, TransferError};
use crate::frame::BatchId;
use crate::pending::Shared;
use crate::types::GrantKey;

/// In-flight budget unit: permits count KiB so a budget above 4 GiB still fits a permit count.
const UNIT: usize = 1024;

/// What the front asks the writer task for, in submission order.
enum Cmd {
    Batch {
        key: GrantKey,
        id: BatchId,
        pages: Vec<OutPage>,
        done: BatchCompleter,
    },
    Drain {
        key: GrantKey,
        reply: oneshot::Sender<Result<(), TransferError>>,
    },
}

/// A batch as the writer hands it to its wire, its in-flight budget held.
pub(crate) struct OutBatch {
    pub(crate) key: GrantKey,
    pub(crate) id: BatchId,
    pub(crate) pages: Vec<OutPage>,
    pub(crate) done: BatchCompleter,
    pub(crate) permit: OwnedSemaphorePermit,
}

impl OutBatch {
    /// Parks the batch until its BATCH_ACK, `sent` of its pages sent; false if the connection
    /// is dead (the batch failed; no BATCH_END is to be sent). See [`Shared::expect_ack`].
    pub(crate) fn park(self, shared: &Shared, sent: u32) -> bool {
        shared.expect_ack(self.id, self.done, self.permit, sent, self.pages.len())
    }
}

/// The transport-specific half of a connection's writer task.
pub(crate) trait Wire: Send + 'static {
    /// Why a write failed.
    type Error: Display + Send;

    /// How a failed write is reported (`"<FAILED>: <error>"`).
    const FAILED: &'static str;

    /// Sends the pages of batch `b` (skipping those left when its grant is cancelled, see
    /// [`Shared::is_cancelled`]); then parks it ([`OutBatch::park`]) and, if that succeeded,
    /// sends its BATCH_END.
    fn send_batch(&mut self, b: OutBatch) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Sends DRAIN(key) (its reply is already queued).
    fn send_drain(&mut self, key: GrantKey)
        -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Closes the write side after the last command.
    fn shutdown(&mut self) -> impl Future<Output = ()> + Send;
}

/// The caller-facing half of one open segment: queues batches and drains to its writer task;
/// dropping it stops both tasks and fails what is pending (a deliberate close, not broadcast).
pub(crate) struct SenderFront {
    tx: mpsc::UnboundedSender<Cmd>,
    shared: Arc<Shared>,
    next_batch: AtomicU64,
    writer: JoinHandle<()>,
    reader: JoinHandle<()>,
}

impl SenderFront {
    /// Spawns the writer task over `wire` (at most `max_inflight_bytes` sent and not yet
    /// acknowledged), then the ack reader task `read`, which returns why the connection ended
    /// (that fails everything pending, and is broadcast).
    pub(crate) fn spawn<W: Wire>(
        shared: Arc<Shared>,
        wire: W,
        max_inflight_bytes: usize,
        read: impl Future<Output = String> + Send + 'static,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let inflight = Arc::new(Semaphore::new(max_inflight_bytes.div_ceil(UNIT)));
        let writer = tokio::spawn(write_loop(wire, rx, shared.clone(), inflight));
        let s = shared.clone();
        let reader = tokio::spawn(async move {
            let reason = read.await;
            s.fail_all(reason);
        });
        Self {
            tx,
            shared,
            next_batch: AtomicU64::new(1),
            writer,
            reader,
        }
    }

    /// Queues a prepared batch; `queued` sees its pages first (before the writer can).
    pub(crate) fn submit_with(
        &self,
        key: GrantKey,
        pages: Vec<OutPage>,
        queued: impl FnOnce(&[OutPage]),
    ) -> Result<BatchHandle, TransferError> {
        if let Some(r) = &self.shared.pending.lock().dead {
            return Err(TransferError::ConnectionLost(r.clone()));
        }
        let id = BatchId(self.next_batch.fetch_add(1, Ordering::Relaxed));
        let (handle, done) = new_batch(id, &pages);
        queued(&pages);
        // If the writer is gone the command is dropped and its completer fails the batch.
        let _ = self.tx.send(Cmd::Batch {
            key,
            id,
            pages,
            done,
        });
        Ok(handle)
    }

    /// Why the connection ended, once it has (the ack reader saw it close or fail).
    pub(crate) fn lost(&self) -> Option<String> {
        self.shared.pending.lock().dead.clone()
    }

    /// Sends DRAIN(key) after everything queued before it and waits for the ack.
    pub(crate) async fn drain(&self, key: GrantKey) -> Result<(), TransferError> {
        let (reply, rx) = oneshot::channel();
        let _ = self.tx.send(Cmd::Drain { key, reply });
        rx.await
            .unwrap_or_else(|_| Err(TransferError::ConnectionLost("writer stopped".into())))
    }

    /// Stops sending unsent pages of `key`, then drains it.
    pub(crate) async fn cancel(&self, key: GrantKey) -> Result<(), TransferError> {
        self.shared.cancelled.lock().insert(key);
        self.drain(key).await
    }
}

impl Drop for SenderFront {
    fn drop(&mut self) {
        self.writer.abort();
        self.reader.abort();
        // A deliberate close is not a failure: pending work fails, nothing is broadcast.
        self.shared.fail_pending("segment closed");
    }
}

/// One opened segment as a backend holds it (see `backend.rs`).
pub(crate) trait OpenConn: Send + Sync + 'static {
    /// Its front (drain, cancel).
    fn front(&self) -> &SenderFront;

    /// Queues a prepared batch.
    fn submit(&self, key: GrantKey, pages: Vec<OutPage>) -> Result<BatchHandle, TransferError> {
        self.front().submit_with(key, pages, |_| {})
    }
}

impl OpenConn for SenderFront {
    fn front(&self) -> &SenderFront {
        self
    }
}

async fn write_loop<W: Wire>(
    mut wire: W,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    shared: Arc<Shared>,
    inflight: Arc<Semaphore>,
) {
    while let Some(cmd) = rx.recv().await {
        let res = match cmd {
            Cmd::Batch {
                key,
                id,
                pages,
                done,
            } => {
                let bytes: usize = pages.iter().map(|p| p.src.len()).sum();
                let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX);
                let Ok(permit) = inflight.clone().acquire_many_owned(units).await else {
                    continue;
                };
                let b = OutBatch {
                    key,
                    id,
                    pages,
                    done,
                    permit,
                };
                wire.send_batch(b).await
            }
            Cmd::Drain { key, reply } => {
                if !shared.expect_drain(key, reply) {
                    continue;
                }
                wire.send_drain(key).await
            }
        };
        if let Err(e) = res {
            shared.fail_all(format!("{}: {e}", W::FAILED));
            return;
        }
    }
    wire.shutdown().await;
}
