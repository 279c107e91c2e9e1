//! RDMA sending side of one opened segment. A writer task owns the queue pair: per batch it
//! asks for a window, copies the pages into its registered source region (hashing each page
//! while it is hot), RDMA-WRITEs them into the window, waits for the write completions, then
//! sends the completion message (WRITE headers + BATCH_END) on the control connection. An ack
//! reader task routes WINDOW replies to the writer and BATCH_ACK / DRAIN_ACK to the shared
//! pending state (`pending.rs`, as for TCP). A lost connection fails everything pending.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

use super::control::{encode, read_hello, read_msg, write_hello, Msg, WindowReply};
use super::qp::QueuePair;
use super::receiver::{rand_psn, QP_DEPTH, WR_TIMEOUT};
use super::verbs::{post_rdma_write, wait_completions, CompletionQueue, Device, Region};
use crate::batch::{new_batch, BatchCompleter, BatchFailure, BatchHandle, BatchStatus};
use crate::engine::{FailureEvent, OutPage, SegmentId, TransferError};
use crate::frame::{BatchId, Frame, WriteFrame};
use crate::pending::{PendingBatch, Shared};
use crate::types::GrantKey;

/// In-flight budget unit (KiB), as for TCP.
const UNIT: usize = 1024;
/// Largest control message the sender accepts (acks and window replies are tiny).
const MAX_ACK_PAYLOAD: usize = 64;

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

type WindowWaiters = Arc<Mutex<HashMap<BatchId, oneshot::Sender<WindowReply>>>>;

/// One open RDMA segment (sender side).
pub struct RdmaSender {
    tx: mpsc::UnboundedSender<Cmd>,
    shared: Arc<Shared>,
    next_batch: AtomicU64,
    writer: JoinHandle<()>,
    reader: JoinHandle<()>,
}

/// What the writer task owns. Field order is drop order: the QP before its CQ, both and the
/// source region before the device.
struct Writer {
    qp: QueuePair,
    cq: CompletionQueue,
    src: Option<Region>,
    device: Arc<Device>,
    wr: OwnedWriteHalf,
    shared: Arc<Shared>,
    windows: WindowWaiters,
    inflight: Arc<Semaphore>,
}

impl RdmaSender {
    /// Connects the control connection and the queue pair to a receiver at `addr`.
    pub async fn connect(
        seg: SegmentId,
        addr: &str,
        device: Arc<Device>,
        max_inflight_bytes: usize,
        failures: broadcast::Sender<FailureEvent>,
    ) -> Result<Self, TransferError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (mut rd, mut wr) = stream.into_split();
        let cq = device.create_cq(QP_DEPTH as i32)?;
        let mut qp = QueuePair::create(&device, &cq, QP_DEPTH, rand_psn())?;
        write_hello(&mut wr, &qp.local()).await?;
        let peer = read_hello(&mut rd)
            .await
            .map_err(|e| TransferError::ConnectionLost(e.to_string()))?;
        qp.connect(&peer)?;
        let shared = Arc::new(Shared::new(seg, failures));
        let windows = WindowWaiters::default();
        let (tx, rx) = mpsc::unbounded_channel();
        let w = Writer {
            qp,
            cq,
            src: None,
            device,
            wr,
            shared: shared.clone(),
            windows: windows.clone(),
            inflight: Arc::new(Semaphore::new(max_inflight_bytes.div_ceil(UNIT))),
        };
        let writer = tokio::spawn(w.run(rx));
        let reader = tokio::spawn(read_loop(rd, shared.clone(), windows));
        Ok(Self {
            tx,
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

impl Drop for RdmaSender {
    fn drop(&mut self) {
        self.writer.abort();
        self.reader.abort();
        self.shared.fail_pending("segment closed");
    }
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        while let Some(cmd) = rx.recv().await {
            let res = match cmd {
                Cmd::Batch {
                    key,
                    id,
                    pages,
                    done,
                } => self.send_batch(key, id, pages, done).await,
                Cmd::Drain { key, reply } => {
                    {
                        let mut p = self.shared.pending.lock();
                        if let Some(r) = &p.dead {
                            let _ = reply.send(Err(TransferError::ConnectionLost(r.clone())));
                            continue;
                        }
                        p.drains.entry(key).or_default().push_back(reply);
                    }
                    self.send(&[Msg::Frame(Frame::Drain(key))]).await
                }
            };
            if let Err(e) = res {
                self.shared.fail_all(format!("RDMA send failed: {e}"));
                return;
            }
        }
        let _ = self.wr.shutdown().await;
    }

    async fn send(&mut self, msgs: &[Msg]) -> Result<(), TransferError> {
        let mut out = Vec::with_capacity(msgs.len() * 96);
        for m in msgs {
            encode(&mut out, m);
        }
        self.wr.write_all(&out).await?;
        Ok(())
    }

    async fn send_batch(
        &mut self,
        key: GrantKey,
        id: BatchId,
        pages: Vec<OutPage>,
        done: BatchCompleter,
    ) -> Result<(), TransferError> {
        let bytes: usize = pages.iter().map(|p| p.src.len()).sum();
        let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX);
        let Ok(permit) = self.inflight.clone().acquire_many_owned(units).await else {
            return Ok(());
        };
        let n = pages.len();
        let (wtx, wrx) = oneshot::channel();
        self.windows.lock().insert(id, wtx);
        let slots = u32::try_from(n).expect("capped batch");
        self.send(&[Msg::WindowReq {
            key,
            batch: id,
            slots,
        }])
        .await?;
        let Ok(window) = wrx.await else {
            return Err(TransferError::ConnectionLost("no window reply".into()));
        };
        if let Some(first) = window.refused {
            done.finish(BatchStatus::Failed(BatchFailure::Rejected {
                written: 0,
                rejected: slots,
                first: Some(first),
            }));
            return Ok(());
        }
        let page_bytes = pages.iter().map(|p| p.src.len()).max().unwrap_or(0);
        let mut src = self.take_region(page_bytes * n)?;
        let mut headers = Vec::with_capacity(n + 1);
        let mut posted = 0usize;
        let mut outstanding = 0usize;
        for (i, p) in pages.iter().enumerate() {
            if self.shared.cancelled.lock().contains(&key) {
                break;
            }
            let at = i * page_bytes;
            src.bytes_mut()[at..at + p.src.len()].copy_from_slice(&p.src);
            if outstanding == QP_DEPTH as usize / 2 {
                wait_completions(&self.cq, outstanding, WR_TIMEOUT).await?;
                outstanding = 0;
            }
            let len = u32::try_from(p.src.len()).expect("page fits u32");
            // SAFETY: the QP is connected (see `connect`) and on the device `src` is
            // registered with; the region outlives the completion we wait for below.
            unsafe {
                post_rdma_write(
                    self.qp.as_ptr(),
                    &src,
                    at,
                    len,
                    window.addr + at as u64,
                    window.rkey,
                    i as u64,
                )?;
            }
            outstanding += 1;
            posted += 1;
            headers.push(Msg::Frame(Frame::Write(WriteFrame {
                key,
                // The staging slot the page was written to (see `staging.rs`).
                batch: BatchId(i as u64),
                page: p.page,
                generation: p.generation,
                tokens: p.tokens,
                checksum: p.checksum(),
                data: &[],
            })));
        }
        wait_completions(&self.cq, outstanding, WR_TIMEOUT).await?;
        self.src = Some(src);
        let sent = u32::try_from(posted).expect("capped batch");
        {
            let mut pend = self.shared.pending.lock();
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
                    cancelled: posted < n,
                },
            );
        }
        headers.push(Msg::Frame(Frame::BatchEnd {
            key,
            batch: id,
            pages: sent,
        }));
        self.send(&headers).await
    }

    /// The registered source region, at least `len` bytes (kept between batches; after a
    /// failure a fresh one is registered).
    fn take_region(&mut self, len: usize) -> Result<Region, TransferError> {
        match self.src.take() {
            Some(r) if r.bytes().len() >= len => Ok(r),
            Some(_) | None => self.device.register_local(len),
        }
    }
}

async fn read_loop(mut rd: OwnedReadHalf, shared: Arc<Shared>, windows: WindowWaiters) {
    let reason = loop {
        match read_msg(&mut rd, MAX_ACK_PAYLOAD).await {
            Ok(Msg::Frame(Frame::BatchAck(a))) => shared.on_ack(a),
            Ok(Msg::Frame(Frame::DrainAck(k))) => shared.on_drain_ack(k),
            Ok(Msg::Window(w)) => match windows.lock().remove(&w.batch) {
                Some(tx) => {
                    let _ = tx.send(w);
                }
                None => break format!("window reply for unknown batch {:?}", w.batch),
            },
            Ok(m @ (Msg::WindowReq { .. } | Msg::Frame(_))) => {
                break format!("unexpected message from receiver: {m:?}")
            }
            Err(e) => break format!("receiver closed the connection ({e})"),
        }
    };
    // Wake a writer waiting for a window: its channel closes.
    windows.lock().clear();
    shared.fail_all(reason);
}
