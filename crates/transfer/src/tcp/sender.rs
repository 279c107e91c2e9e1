//! TCP sending side of one opened segment: a writer task (owns the write half, sends batches
//! and DRAINs in submission order, holds in-flight byte permits) and an ack reader task
//! (BATCH_ACK / DRAIN_ACK). A lost connection fails every pending batch and drain at once.

use std::io::IoSlice;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

use super::hash_ahead::{self, HashAhead, Progress};
use crate::batch::{new_batch, BatchCompleter, BatchFailure, BatchHandle, BatchStatus};
use crate::engine::{FailureEvent, OutPage, SegmentId, TransferError};
use crate::frame::{
    decode_header, decode_payload, encode, encode_write_prefix, BatchId, Frame, WriteFrame,
    HEADER_LEN,
};
use crate::pending::{PendingBatch, Shared};
use crate::types::GrantKey;

/// Pages at least this long bypass the write buffer.
const DIRECT_WRITE: usize = 32 << 10;

/// In-flight budget unit: permits count KiB so a budget above 4 GiB still fits a permit count.
const UNIT: usize = 1024;

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

/// One open TCP segment (sender side).
pub struct SenderConn {
    tx: mpsc::UnboundedSender<Cmd>,
    hasher: Option<HashAhead>,
    shared: Arc<Shared>,
    next_batch: AtomicU64,
    writer: JoinHandle<()>,
    reader: JoinHandle<()>,
}

impl SenderConn {
    /// Connects to a receiver.
    pub async fn connect(
        seg: SegmentId,
        addr: &str,
        max_inflight_bytes: usize,
        failures: broadcast::Sender<FailureEvent>,
    ) -> Result<Self, TransferError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (rd, wr) = stream.into_split();
        let shared = Arc::new(Shared::new(seg, failures));
        let (tx, rx) = mpsc::unbounded_channel();
        let inflight = Arc::new(Semaphore::new(max_inflight_bytes.div_ceil(UNIT)));
        let hasher = if hash_ahead::worthwhile() {
            Some(HashAhead::spawn()?)
        } else {
            None
        };
        let progress = hasher.as_ref().map(HashAhead::progress);
        let writer = tokio::spawn(write_loop(wr, rx, shared.clone(), inflight, progress));
        let reader = tokio::spawn(read_loop(rd, shared.clone()));
        Ok(Self {
            tx,
            hasher,
            shared,
            next_batch: AtomicU64::new(1),
            writer,
            reader,
        })
    }

    /// Queues a prepared batch.
    pub fn submit(&self, key: GrantKey, pages: Vec<OutPage>) -> Result<BatchHandle, TransferError> {
        if let Some(r) = &self.shared.pending.lock().dead {
            return Err(TransferError::ConnectionLost(r.clone()));
        }
        let id = BatchId(self.next_batch.fetch_add(1, Ordering::Relaxed));
        let (handle, done) = new_batch(id, &pages);
        if let Some(h) = &self.hasher {
            h.queue(pages.clone());
        }
        // If the writer is gone the command is dropped and its completer fails the batch.
        let _ = self.tx.send(Cmd::Batch {
            key,
            id,
            pages,
            done,
        });
        Ok(handle)
    }

    /// Sends DRAIN(key) after everything queued before it and waits for the ack.
    pub async fn drain(&self, key: GrantKey) -> Result<(), TransferError> {
        let (reply, rx) = oneshot::channel();
        let _ = self.tx.send(Cmd::Drain { key, reply });
        rx.await
            .unwrap_or_else(|_| Err(TransferError::ConnectionLost("writer stopped".into())))
    }

    /// Stops sending unsent pages of `key`, then drains it.
    pub async fn cancel(&self, key: GrantKey) -> Result<(), TransferError> {
        self.shared.cancelled.lock().insert(key);
        self.drain(key).await
    }
}

impl Drop for SenderConn {
    fn drop(&mut self) {
        self.writer.abort();
        self.reader.abort();
        // A deliberate close is not a failure: pending work fails, nothing is broadcast.
        self.shared.fail_pending("segment closed");
    }
}

async fn write_loop(
    wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    shared: Arc<Shared>,
    inflight: Arc<Semaphore>,
    progress: Option<Arc<Progress>>,
) {
    let mut wr = BufWriter::with_capacity(256 << 10, wr);
    let mut hdr = Vec::with_capacity(128);
    while let Some(cmd) = rx.recv().await {
        let res = match cmd {
            Cmd::Batch {
                key,
                id,
                pages,
                done,
            } => {
                let out = Out {
                    wr: &mut wr,
                    hdr: &mut hdr,
                    shared: &shared,
                    inflight: &inflight,
                    progress: progress.as_deref(),
                };
                send_batch(out, key, id, pages, done).await
            }
            Cmd::Drain { key, reply } => {
                {
                    let mut p = shared.pending.lock();
                    if let Some(r) = &p.dead {
                        let _ = reply.send(Err(TransferError::ConnectionLost(r.clone())));
                        continue;
                    }
                    p.drains.entry(key).or_default().push_back(reply);
                }
                hdr.clear();
                encode(&mut hdr, &Frame::Drain(key));
                match wr.write_all(&hdr).await {
                    Ok(()) => wr.flush().await,
                    Err(e) => Err(e),
                }
            }
        };
        if let Err(e) = res {
            shared.fail_all(format!("write failed: {e}"));
            return;
        }
    }
    let _ = wr.shutdown().await;
}

/// What `send_batch` writes with.
struct Out<'a> {
    wr: &'a mut BufWriter<OwnedWriteHalf>,
    hdr: &'a mut Vec<u8>,
    shared: &'a Shared,
    inflight: &'a Arc<Semaphore>,
    progress: Option<&'a Progress>,
}

async fn send_batch(
    out: Out<'_>,
    key: GrantKey,
    id: BatchId,
    pages: Vec<OutPage>,
    done: BatchCompleter,
) -> std::io::Result<()> {
    let Out {
        wr,
        hdr,
        shared,
        inflight,
        progress,
    } = out;
    let bytes: usize = pages.iter().map(|p| p.src.len()).sum();
    let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX);
    let Ok(permit) = inflight.clone().acquire_many_owned(units).await else {
        return Ok(());
    };
    let mut sent = 0u32;
    for p in &pages {
        if shared.cancelled.lock().contains(&key) {
            break;
        }
        hdr.clear();
        let w = WriteFrame {
            key,
            batch: id,
            page: p.page,
            generation: p.generation,
            tokens: p.tokens,
            checksum: p.checksum(),
            data: &p.src,
        };
        encode_write_prefix(hdr, &w);
        if p.src.len() >= DIRECT_WRITE {
            // Big page: header and page in one syscall, straight from the caller's bytes.
            wr.flush().await?;
            write_two(wr.get_mut(), hdr, &p.src).await?;
        } else {
            wr.write_all(hdr).await?;
            wr.write_all(&p.src).await?;
        }
        sent += 1;
        if let Some(pr) = progress {
            pr.advance(p.src.len());
        }
    }
    if let Some(pr) = progress {
        // Pages skipped by a cancel count as done, so the hasher does not wait for them.
        pr.advance(pages[sent as usize..].iter().map(|p| p.src.len()).sum());
    }
    {
        let mut pend = shared.pending.lock();
        if let Some(r) = &pend.dead {
            done.finish(BatchStatus::Failed(BatchFailure::ConnectionLost(r.clone())));
            return Ok(());
        }
        pend.batches.insert(
            id,
            PendingBatch {
                done,
                _permit: permit,
                sent,
                cancelled: (sent as usize) < pages.len(),
            },
        );
    }
    hdr.clear();
    encode(
        hdr,
        &Frame::BatchEnd {
            key,
            batch: id,
            pages: sent,
        },
    );
    wr.write_all(hdr).await?;
    wr.flush().await
}

/// Writes `a` then `b` with vectored writes until both are fully sent.
async fn write_two(w: &mut OwnedWriteHalf, mut a: &[u8], mut b: &[u8]) -> std::io::Result<()> {
    while !a.is_empty() || !b.is_empty() {
        let n = w
            .write_vectored(&[IoSlice::new(a), IoSlice::new(b)])
            .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        if n <= a.len() {
            a = &a[n..];
        } else {
            b = &b[n - a.len()..];
            a = &[];
        }
    }
    Ok(())
}

async fn read_loop(mut rd: OwnedReadHalf, shared: Arc<Shared>) {
    let mut hdr = [0u8; HEADER_LEN];
    let mut buf = [0u8; 64];
    let reason = loop {
        if let Err(e) = rd.read_exact(&mut hdr).await {
            break format!("receiver closed the connection ({e})");
        }
        // Acks are tiny; anything larger is a broken peer.
        let h = match decode_header(&hdr, buf.len()) {
            Ok(h) => h,
            Err(e) => break format!("malformed ack: {e}"),
        };
        let p = &mut buf[..h.payload_len as usize];
        if let Err(e) = rd.read_exact(p).await {
            break format!("receiver closed the connection ({e})");
        }
        match decode_payload(h, p) {
            Ok(Frame::BatchAck(a)) => shared.on_ack(a),
            Ok(Frame::DrainAck(k)) => shared.on_drain_ack(k),
            Ok(f @ (Frame::Write(_) | Frame::BatchEnd { .. } | Frame::Drain(_))) => {
                break format!("unexpected frame from receiver: {f:?}")
            }
            Err(e) => break format!("malformed ack: {e}"),
        }
    };
    shared.fail_all(reason);
}
