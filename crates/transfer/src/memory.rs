//! In-memory backend for unit tests: segments are sinks in a registry, and every batch is
//! encoded to real frames, optionally tampered with, decoded, and fed to a
//! [`ReceiverSession`] in-process. Nothing is ever in flight after `submit_batch` returns.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::broadcast;

use crate::batch::{new_batch, BatchFailure, BatchHandle, BatchStatus};
use crate::engine::{
    prepare_batch, EngineConfig, FailureEvent, PageWriteReq, SegmentDesc, SegmentId,
    TransferBackend, TransferError,
};
use crate::frame::{decode_from, encode, BatchId, Frame, WriteFrame};
use crate::receiver::{CloseReason, ReceiverCounters, ReceiverSession};
use crate::sink::PageSink;
use crate::types::GrantKey;

/// Rewrites the encoded frames of one batch in transit (bit flips, swapped pages).
pub type Tamper = Arc<dyn Fn(&mut Vec<Vec<u8>>) + Send + Sync>;

struct Conn {
    session: Option<ReceiverSession<dyn PageSink>>,
    next_batch: u64,
}

#[derive(Default)]
struct State {
    sinks: Vec<Arc<dyn PageSink>>,
    conns: HashMap<SegmentId, Conn>,
    next_seg: u64,
}

/// The in-memory backend.
pub struct MemoryBackend {
    cfg: EngineConfig,
    st: Mutex<State>,
    counters: Arc<ReceiverCounters>,
    tamper: Option<Tamper>,
    failures: broadcast::Sender<FailureEvent>,
}

impl MemoryBackend {
    /// A backend with these sender limits.
    pub fn new(cfg: EngineConfig) -> Self {
        Self {
            cfg,
            st: Mutex::new(State::default()),
            counters: Arc::default(),
            tamper: None,
            failures: broadcast::channel(64).0,
        }
    }

    /// Applies `t` to every batch's encoded frames before the receiver sees them.
    pub fn with_tamper(mut self, t: Tamper) -> Self {
        self.tamper = Some(t);
        self
    }

    /// Receiver counters of every segment registered here.
    pub fn counters(&self) -> &ReceiverCounters {
        &self.counters
    }

    fn deliver(
        &self,
        seg: SegmentId,
        frames: Vec<Vec<u8>>,
    ) -> Result<Vec<Frame<'static>>, TransferError> {
        let mut st = self.st.lock();
        let conn = st
            .conns
            .get_mut(&seg)
            .ok_or(TransferError::UnknownSegment(seg))?;
        let session = conn.session.as_mut().ok_or_else(|| {
            TransferError::ConnectionLost("closed after a malformed frame".into())
        })?;
        let mut replies = Vec::new();
        for bytes in frames {
            let res = match decode_from(&bytes, session.max_payload()) {
                Ok(Some((f, used))) if used == bytes.len() => session.on_frame(f),
                Ok(Some(_)) | Ok(None) => Err(crate::frame::FrameError::Truncated),
                Err(e) => Err(e),
            };
            match res {
                Ok(Some(r)) => replies.push(r),
                Ok(None) => {}
                Err(e) => {
                    let reason = e.to_string();
                    if let Some(s) = conn.session.take() {
                        s.close(&CloseReason::Malformed(e));
                    }
                    let _ = self.failures.send(FailureEvent {
                        segment: seg,
                        reason: reason.clone(),
                    });
                    return Err(TransferError::ConnectionLost(reason));
                }
            }
        }
        Ok(replies)
    }

    fn drain_now(&self, seg: SegmentId, key: GrantKey) -> Result<(), TransferError> {
        let mut buf = Vec::new();
        encode(&mut buf, &Frame::Drain(key));
        let replies = self.deliver(seg, vec![buf])?;
        match replies.as_slice() {
            [Frame::DrainAck(k)] if *k == key => Ok(()),
            other => Err(TransferError::ConnectionLost(format!(
                "unexpected drain reply {other:?}"
            ))),
        }
    }
}

impl TransferBackend for MemoryBackend {
    async fn register_segment(
        &self,
        sink: Arc<dyn PageSink>,
    ) -> Result<SegmentDesc, TransferError> {
        let mut st = self.st.lock();
        st.sinks.push(sink);
        Ok(SegmentDesc {
            addr: format!("mem:{}", st.sinks.len() - 1),
        })
    }

    async fn open_segment(&self, desc: &SegmentDesc) -> Result<SegmentId, TransferError> {
        let idx: usize = desc
            .addr
            .strip_prefix("mem:")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| TransferError::UnknownPeer(desc.addr.clone()))?;
        let mut st = self.st.lock();
        let sink = st
            .sinks
            .get(idx)
            .cloned()
            .ok_or_else(|| TransferError::UnknownPeer(desc.addr.clone()))?;
        let id = SegmentId(st.next_seg);
        st.next_seg += 1;
        let session = ReceiverSession::new(sink, self.counters.clone());
        st.conns.insert(
            id,
            Conn {
                session: Some(session),
                next_batch: 0,
            },
        );
        Ok(id)
    }

    fn submit_batch(
        &self,
        seg: SegmentId,
        key: GrantKey,
        reqs: Vec<PageWriteReq>,
    ) -> Result<BatchHandle, TransferError> {
        let pages = prepare_batch(&self.cfg, reqs)?;
        let batch = {
            let mut st = self.st.lock();
            let conn = st
                .conns
                .get_mut(&seg)
                .ok_or(TransferError::UnknownSegment(seg))?;
            conn.next_batch += 1;
            BatchId(conn.next_batch)
        };
        let mut frames: Vec<Vec<u8>> = pages
            .iter()
            .map(|p| {
                let mut b = Vec::with_capacity(crate::frame::HEADER_LEN + 64 + p.src.len());
                encode(
                    &mut b,
                    &Frame::Write(WriteFrame {
                        key,
                        batch,
                        page: p.page,
                        generation: p.generation,
                        tokens: p.tokens,
                        checksum: p.checksum(),
                        data: &p.src,
                    }),
                );
                b
            })
            .collect();
        let mut end = Vec::new();
        let n = u32::try_from(pages.len()).expect("capped batch");
        encode(
            &mut end,
            &Frame::BatchEnd {
                key,
                batch,
                pages: n,
            },
        );
        frames.push(end);
        if let Some(t) = &self.tamper {
            t(&mut frames);
        }
        let (handle, done) = new_batch(batch, &pages);
        match self.deliver(seg, frames) {
            Ok(replies) => {
                let ack = replies.iter().find_map(|r| match r {
                    Frame::BatchAck(a) if a.batch == batch => Some(*a),
                    Frame::BatchAck(_)
                    | Frame::Write(_)
                    | Frame::BatchEnd { .. }
                    | Frame::Drain(_)
                    | Frame::DrainAck(_) => None,
                });
                done.finish(match ack {
                    Some(a) if a.rejected == 0 && a.written == n => {
                        BatchStatus::Completed { pages: n }
                    }
                    Some(a) => BatchStatus::Failed(BatchFailure::Rejected {
                        written: a.written,
                        rejected: a.rejected,
                        first: a.first_reject,
                    }),
                    None => {
                        BatchStatus::Failed(BatchFailure::ConnectionLost("no batch ack".into()))
                    }
                });
            }
            Err(e) => done.finish(BatchStatus::Failed(BatchFailure::ConnectionLost(
                e.to_string(),
            ))),
        }
        Ok(handle)
    }

    async fn drain(&self, seg: SegmentId, key: GrantKey) -> Result<(), TransferError> {
        self.drain_now(seg, key)
    }

    async fn cancel(&self, seg: SegmentId, key: GrantKey) -> Result<(), TransferError> {
        // Batches are delivered synchronously, so nothing is left to stop: only drain.
        self.drain_now(seg, key)
    }

    fn subscribe_failures(&self) -> broadcast::Receiver<FailureEvent> {
        self.failures.subscribe()
    }

    fn close_segment(&self, seg: SegmentId) {
        let conn = self.st.lock().conns.remove(&seg);
        if let Some(s) = conn.and_then(|c| c.session) {
            s.close(&CloseReason::PeerClosed);
        }
    }

    fn segment_open(&self, seg: SegmentId) -> bool {
        self.st
            .lock()
            .conns
            .get(&seg)
            .is_some_and(|c| c.session.is_some())
    }
}
