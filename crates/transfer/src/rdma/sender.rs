//! RDMA sending side of one opened segment. A writer task owns the queue pair: per batch it
//! asks for a window, copies the pages into its registered source region (hashing each page
//! while it is hot), RDMA-WRITEs them into the window, waits for the write completions, then
//! sends the completion message (WRITE headers + BATCH_END) on the control connection. An ack
//! reader task routes WINDOW replies to the writer and BATCH_ACK / DRAIN_ACK to the shared
//! pending state (`pending.rs`, as for TCP). Queueing, the in-flight budget, DRAIN order and
//! failing everything pending when the connection is lost are shared with TCP (`outbound.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use super::control::{encode, read_hello, read_msg, write_hello, Msg, WindowReply};
use super::qp::QueuePair;
use super::receiver::{rand_psn, QP_DEPTH, WR_TIMEOUT};
use super::verbs::{post_rdma_write, wait_completions, CompletionQueue, Device, Region};
use crate::backend::Opening;
use crate::batch::{BatchFailure, BatchStatus};
use crate::engine::TransferError;
use crate::frame::{BatchId, Frame, WriteFrame};
use crate::outbound::{OutBatch, SenderFront, Wire};
use crate::pending::Shared;
use crate::types::GrantKey;

/// Largest control message the sender accepts (acks and window replies are tiny).
const MAX_ACK_PAYLOAD: usize = 64;

type WindowWaiters = Arc<Mutex<HashMap<BatchId, oneshot::Sender<WindowReply>>>>;

/// The RDMA writer: what the writer task owns. Field order is drop order: the QP before its
/// CQ, both and the source region before the device.
struct RdmaWire {
    qp: QueuePair,
    cq: CompletionQueue,
    src: Option<Region>,
    device: Arc<Device>,
    wr: OwnedWriteHalf,
    shared: Arc<Shared>,
    windows: WindowWaiters,
}

/// Connects the control connection and the queue pair to a receiver at `addr`; the result is
/// one open RDMA segment (sender side).
pub(crate) async fn connect(
    o: Opening<'_>,
    device: Arc<Device>,
) -> Result<SenderFront, TransferError> {
    let stream = TcpStream::connect(o.addr).await?;
    stream.set_nodelay(true)?;
    let (mut rd, mut wr) = stream.into_split();
    let cq = device.create_cq(QP_DEPTH as i32)?;
    let mut qp = QueuePair::create(&device, &cq, QP_DEPTH, rand_psn())?;
    write_hello(&mut wr, &qp.local()).await?;
    let peer = read_hello(&mut rd)
        .await
        .map_err(|e| TransferError::ConnectionLost(e.to_string()))?;
    qp.connect(&peer)?;
    let shared = Arc::new(Shared::new(o.seg, o.failures));
    let windows = WindowWaiters::default();
    let wire = RdmaWire {
        qp,
        cq,
        src: None,
        device,
        wr,
        shared: shared.clone(),
        windows: windows.clone(),
    };
    let read = read_loop(rd, shared.clone(), windows);
    Ok(SenderFront::spawn(shared, wire, o.max_inflight_bytes, read))
}

impl Wire for RdmaWire {
    type Error = TransferError;
    const FAILED: &'static str = "RDMA send failed";

    async fn send_batch(&mut self, b: OutBatch) -> Result<(), TransferError> {
        let (key, id, pages) = (b.key, b.id, &b.pages);
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
            b.done.finish(BatchStatus::Failed(BatchFailure::Rejected {
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
            if self.shared.is_cancelled(key) {
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
        if !b.park(&self.shared, sent) {
            return Ok(());
        }
        headers.push(Msg::Frame(Frame::BatchEnd {
            key,
            batch: id,
            pages: sent,
        }));
        self.send(&headers).await
    }

    async fn send_drain(&mut self, key: GrantKey) -> Result<(), TransferError> {
        self.send(&[Msg::Frame(Frame::Drain(key))]).await
    }

    async fn shutdown(&mut self) {
        let _ = self.wr.shutdown().await;
    }
}

impl RdmaWire {
    async fn send(&mut self, msgs: &[Msg]) -> Result<(), TransferError> {
        let mut out = Vec::with_capacity(msgs.len() * 96);
        for m in msgs {
            encode(&mut out, m);
        }
        self.wr.write_all(&out).await?;
        Ok(())
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

/// Reads acks and window replies until the connection ends; returns why it did.
async fn read_loop(mut rd: OwnedReadHalf, shared: Arc<Shared>, windows: WindowWaiters) -> String {
    let reason = loop {
        match read_msg(&mut rd, MAX_ACK_PAYLOAD).await {
            Ok(Msg::Frame(f)) => {
                if let Err(f) = shared.route_ack(f) {
                    break format!("unexpected message from receiver: {:?}", Msg::Frame(f));
                }
            }
            Ok(Msg::Window(w)) => match windows.lock().remove(&w.batch) {
                Some(tx) => {
                    let _ = tx.send(w);
                }
                None => break format!("window reply for unknown batch {:?}", w.batch),
            },
            Ok(m @ Msg::WindowReq { .. }) => {
                break format!("unexpected message from receiver: {m:?}")
            }
            Err(e) => break format!("receiver closed the connection ({e})"),
        }
    };
    // Wake a writer waiting for a window: its channel closes.
    windows.lock().clear();
    reason
}
