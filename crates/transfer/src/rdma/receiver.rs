//! RDMA receiving side of one control connection: hello (queue-pair exchange), then per
//! batch `WINDOW_REQ -> bind a window (live grants only) -> WINDOW -> [peer RDMA-WRITEs into
//! it] -> WRITE headers + BATCH_END -> invalidate the window -> checked pool writes through
//! the shared ReceiverSession -> BATCH_ACK`. DRAIN invalidates any window of
//! the grant before it is acknowledged; connection loss invalidates every window. A
//! malformed message closes the connection and touches no page.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::control::{read_hello, read_msg, write_hello, ControlError, Msg, WindowReply};
use super::qp::QueuePair;
use super::segment::RdmaSegment;
use super::verbs::{wait_completions, CompletionQueue, Device};
use crate::frame::{BatchId, Frame, FrameError, FrameType, WriteFrame};
use crate::receiver::{CloseReason, ReceiverCounters, ReceiverSession};
use crate::sink::PageSink;
use crate::types::{GrantKey, WriteError};

/// Outstanding work requests a queue pair (and its completion queue) has room for.
pub(crate) const QP_DEPTH: u32 = 256;
/// How long a posted work request may take before the connection is declared dead.
pub(crate) const WR_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves one accepted control connection until it ends.
pub(crate) async fn serve_conn(
    stream: TcpStream,
    device: Arc<Device>,
    sink: Arc<dyn PageSink>,
    counters: Arc<ReceiverCounters>,
    staging_slots: usize,
) -> CloseReason {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let peer = match read_hello(&mut rd).await {
        Ok(p) => p,
        Err(e) => return close_reason(e),
    };
    let page_bytes = sink.page_bytes();
    // Field order matters for drop: the QP goes before its completion queue.
    let cq = match device.create_cq(QP_DEPTH as i32) {
        Ok(c) => c,
        Err(e) => return CloseReason::Transport(e.to_string()),
    };
    let mut qp = match QueuePair::create(&device, &cq, QP_DEPTH, rand_psn()) {
        Ok(q) => q,
        Err(e) => return CloseReason::Transport(e.to_string()),
    };
    if let Err(e) = write_hello(&mut wr, &qp.local()).await {
        return CloseReason::Transport(e.to_string());
    }
    if let Err(e) = qp.connect(&peer) {
        return CloseReason::Transport(e.to_string());
    }
    let mut seg = match RdmaSegment::new(device.clone(), staging_slots, page_bytes) {
        Ok(s) => s,
        Err(e) => return CloseReason::Transport(e.to_string()),
    };
    let mut conn = Conn {
        qp: &qp,
        cq: &cq,
        seg: &mut seg,
        session: ReceiverSession::new(sink.clone(), counters),
        sink,
        headers: Vec::new(),
        page_bytes,
        staging_slots,
    };
    let max_payload = conn.session.max_payload();
    let reason = loop {
        let msg = match read_msg(&mut rd, max_payload).await {
            Ok(m) => m,
            Err(e) => break close_reason(e),
        };
        match conn.on_msg(msg, &mut wr).await {
            Ok(()) => {}
            Err(r) => break r,
        }
    };
    // Fence every window still open: nothing of this connection can land any more.
    let keys = conn.seg.open_keys();
    for key in keys {
        conn.fence(key).await;
    }
    let Conn { session, .. } = conn;
    session.close(&reason);
    reason
}

struct Conn<'a> {
    qp: &'a QueuePair,
    cq: &'a CompletionQueue,
    seg: &'a mut RdmaSegment,
    session: ReceiverSession<dyn PageSink>,
    sink: Arc<dyn PageSink>,
    headers: Vec<WriteFrame<'static>>,
    page_bytes: usize,
    staging_slots: usize,
}

impl Conn<'_> {
    async fn on_msg<W: AsyncWrite + Unpin>(
        &mut self,
        msg: Msg,
        wr: &mut W,
    ) -> Result<(), CloseReason> {
        let reply = match msg {
            Msg::WindowReq { key, batch, slots } => Some(Msg::Window(
                self.open_window(key, batch, slots as usize).await?,
            )),
            Msg::Frame(Frame::Write(h)) => {
                if self.headers.len() >= self.staging_slots {
                    return Err(CloseReason::Malformed(FrameError::TooManyOpenBatches(
                        self.staging_slots,
                    )));
                }
                self.headers.push(h);
                None
            }
            Msg::Frame(f @ Frame::BatchEnd { key, batch, .. }) => {
                let headers = std::mem::take(&mut self.headers);
                // Seal first: once the NIC confirmed the invalidation the peer cannot change
                // a staged byte between the pool's checksum and its copy.
                let sealed = self.seal(key).await;
                let done = self.seg.complete(&mut self.session, &headers, batch);
                self.seg.release(key);
                sealed?;
                done.map_err(CloseReason::Malformed)?;
                self.session
                    .on_frame(f)
                    .map_err(CloseReason::Malformed)?
                    .map(Msg::Frame)
            }
            Msg::Frame(f @ Frame::Drain(key)) => {
                // No write of `key` can land after its DRAIN_ACK: an unconfirmed
                // invalidation closes the connection instead of acknowledging.
                self.seal(key).await?;
                self.seg.release(key);
                self.session
                    .on_frame(f)
                    .map_err(CloseReason::Malformed)?
                    .map(Msg::Frame)
            }
            Msg::Frame(Frame::BatchAck(_)) => {
                return Err(CloseReason::Malformed(FrameError::WrongDirection(
                    FrameType::BatchAck,
                )))
            }
            Msg::Frame(Frame::DrainAck(_)) => {
                return Err(CloseReason::Malformed(FrameError::WrongDirection(
                    FrameType::DrainAck,
                )))
            }
            Msg::Window(_) => {
                return Err(CloseReason::Malformed(FrameError::UnknownType(2)));
            }
        };
        if let Some(m) = reply {
            let mut out = Vec::with_capacity(64);
            super::control::encode(&mut out, &m);
            wr.write_all(&out)
                .await
                .map_err(|e| CloseReason::Transport(e.to_string()))?;
        }
        Ok(())
    }

    async fn open_window(
        &mut self,
        key: GrantKey,
        batch: BatchId,
        slots: usize,
    ) -> Result<WindowReply, CloseReason> {
        let refused = |e| WindowReply {
            batch,
            addr: 0,
            rkey: 0,
            refused: Some(e),
        };
        if !self.sink.grant_is_live(key) {
            return Ok(refused(WriteError::UnknownGrant));
        }
        if slots == 0 || slots > self.staging_slots {
            return Ok(refused(WriteError::BadLength));
        }
        // SAFETY: `qp` is this connection's live, connected QP on the segment's device.
        let w = unsafe {
            self.seg
                .open_window(self.qp.as_ptr(), key, slots, self.page_bytes)
        };
        match w {
            Ok(w) => {
                wait_completions(self.cq, 1, super::receiver::WR_TIMEOUT)
                    .await
                    .map_err(|e| CloseReason::Transport(e.to_string()))?;
                Ok(WindowReply {
                    batch,
                    addr: w.addr,
                    rkey: w.rkey,
                    refused: None,
                })
            }
            // A second window for a key with one open, or no staging room.
            Err(_) => Ok(refused(WriteError::DuplicateWrite)),
        }
    }

    /// Invalidates `key`'s window, if open, and waits until the NIC confirmed it. An
    /// unconfirmed invalidation fails the connection.
    async fn seal(&mut self, key: GrantKey) -> Result<(), CloseReason> {
        // SAFETY: `qp` is this connection's live QP on the segment's device.
        let posted = unsafe { self.seg.seal(self.qp.as_ptr(), key) }
            .map_err(|e| CloseReason::Transport(e.to_string()))?;
        if posted {
            wait_completions(self.cq, 1, WR_TIMEOUT)
                .await
                .map_err(|e| CloseReason::Transport(e.to_string()))?;
        }
        Ok(())
    }

    /// Seals and releases `key`'s window at teardown (the staging region goes with the
    /// connection, so an unconfirmed invalidation is only logged).
    async fn fence(&mut self, key: GrantKey) {
        if let Err(e) = self.seal(key).await {
            tracing::warn!(reason = ?e, "window invalidation not confirmed");
        }
        self.seg.release(key);
    }
}

fn close_reason(e: ControlError) -> CloseReason {
    match e {
        ControlError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            CloseReason::PeerClosed
        }
        ControlError::Io(e) => CloseReason::Transport(e.to_string()),
        ControlError::Frame(f) => CloseReason::Malformed(f),
    }
}

/// A first packet sequence number (24 bits) that differs between connections.
pub(crate) fn rand_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    (h.finish() as u32) & 0xff_ffff
}
