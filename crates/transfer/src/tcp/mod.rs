//! TCP backend (the default): each registered segment is a listener, each opened segment a
//! connection carrying the framed protocol of `frame.rs`.
//!
//! - `listener.rs`: receiving side (accept, read frames, drive a `ReceiverSession`).
//! - `sender.rs`: sending side of one connection (ordered writer, ack reader, in-flight budget).
//! - `hash_ahead.rs`: checksums pages on a helper thread a bounded distance ahead of the writer.

mod hash_ahead;
mod listener;
mod sender;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::broadcast;

pub use listener::{serve_stream, TcpReceiver};
pub use sender::SenderConn;

use crate::batch::BatchHandle;
use crate::engine::{
    prepare_batch, EngineConfig, FailureEvent, PageWriteReq, SegmentDesc, SegmentId,
    TransferBackend, TransferError,
};
use crate::receiver::ReceiverCounters;
use crate::sink::PageSink;
use crate::types::GrantKey;

/// The TCP backend.
pub struct TcpBackend {
    cfg: EngineConfig,
    bind: SocketAddr,
    counters: Arc<ReceiverCounters>,
    receivers: Mutex<Vec<TcpReceiver>>,
    conns: Mutex<HashMap<SegmentId, Arc<SenderConn>>>,
    next_seg: AtomicU64,
    failures: broadcast::Sender<FailureEvent>,
}

impl TcpBackend {
    /// A backend whose segments listen on `bind` (port 0: any free port).
    pub fn new(cfg: EngineConfig, bind: SocketAddr) -> Self {
        Self {
            cfg,
            bind,
            counters: Arc::default(),
            receivers: Mutex::default(),
            conns: Mutex::default(),
            next_seg: AtomicU64::new(1),
            failures: broadcast::channel(256).0,
        }
    }

    /// Counters of every segment this backend registered.
    pub fn receiver_counters(&self) -> &Arc<ReceiverCounters> {
        &self.counters
    }

    fn conn(&self, seg: SegmentId) -> Result<Arc<SenderConn>, TransferError> {
        self.conns
            .lock()
            .get(&seg)
            .cloned()
            .ok_or(TransferError::UnknownSegment(seg))
    }
}

impl TransferBackend for TcpBackend {
    async fn register_segment(
        &self,
        sink: Arc<dyn PageSink>,
    ) -> Result<SegmentDesc, TransferError> {
        let r = TcpReceiver::bind(self.bind, sink, self.counters.clone()).await?;
        let addr = r.local_addr().to_string();
        self.receivers.lock().push(r);
        Ok(SegmentDesc { addr })
    }

    async fn open_segment(&self, desc: &SegmentDesc) -> Result<SegmentId, TransferError> {
        let seg = SegmentId(self.next_seg.fetch_add(1, Ordering::Relaxed));
        let conn = SenderConn::connect(
            seg,
            &desc.addr,
            self.cfg.max_inflight_bytes,
            self.failures.clone(),
        )
        .await?;
        self.conns.lock().insert(seg, Arc::new(conn));
        Ok(seg)
    }

    fn submit_batch(
        &self,
        seg: SegmentId,
        key: GrantKey,
        reqs: Vec<PageWriteReq>,
    ) -> Result<BatchHandle, TransferError> {
        let conn = self.conn(seg)?;
        conn.submit(key, prepare_batch(&self.cfg, reqs)?)
    }

    async fn drain(&self, seg: SegmentId, key: GrantKey) -> Result<(), TransferError> {
        self.conn(seg)?.drain(key).await
    }

    async fn cancel(&self, seg: SegmentId, key: GrantKey) -> Result<(), TransferError> {
        self.conn(seg)?.cancel(key).await
    }

    fn subscribe_failures(&self) -> broadcast::Receiver<FailureEvent> {
        self.failures.subscribe()
    }

    fn close_segment(&self, seg: SegmentId) {
        self.conns.lock().remove(&seg);
    }
}
