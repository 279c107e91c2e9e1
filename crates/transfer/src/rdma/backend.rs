//! [`RdmaBackend`]: the [`TransferBackend`] over RDMA. A registered segment is a TCP control
//! listener; each accepted control connection gets its own queue pair, completion queue and
//! staging region (`receiver.rs`). An opened segment is a control connection plus a queue
//! pair (`sender.rs`). Without an RDMA device, [`RdmaBackend::new`] fails with
//! [`TransferError::Unsupported`]; nothing panics.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::receiver::{serve_conn, QP_DEPTH};
use super::sender::RdmaSender;
use super::verbs::Device;
use crate::batch::BatchHandle;
use crate::engine::{
    prepare_batch, EngineConfig, FailureEvent, PageWriteReq, SegmentDesc, SegmentId,
    TransferBackend, TransferError,
};
use crate::receiver::ReceiverCounters;
use crate::sink::PageSink;
use crate::types::GrantKey;

/// The RDMA backend.
pub struct RdmaBackend {
    cfg: EngineConfig,
    bind: SocketAddr,
    counters: Arc<ReceiverCounters>,
    // Tasks and connections hold the device too; it is closed when the last one goes.
    listeners: Mutex<Vec<JoinHandle<()>>>,
    conns: Mutex<HashMap<SegmentId, Arc<RdmaSender>>>,
    next_seg: AtomicU64,
    failures: broadcast::Sender<FailureEvent>,
    device: Arc<Device>,
}

impl RdmaBackend {
    /// Opens the host's first RDMA device. Control listeners bind `bind` (port 0: any free
    /// port). Fails with [`TransferError::Unsupported`] when the host has no RDMA device.
    pub fn new(cfg: EngineConfig, bind: SocketAddr) -> Result<Self, TransferError> {
        let device = Arc::new(Device::open_first(QP_DEPTH as i32)?);
        Ok(Self {
            cfg,
            bind,
            counters: Arc::default(),
            listeners: Mutex::default(),
            conns: Mutex::default(),
            next_seg: AtomicU64::new(1),
            failures: broadcast::channel(256).0,
            device,
        })
    }

    /// Counters of every segment this backend registered.
    pub fn receiver_counters(&self) -> &Arc<ReceiverCounters> {
        &self.counters
    }

    fn conn(&self, seg: SegmentId) -> Result<Arc<RdmaSender>, TransferError> {
        self.conns
            .lock()
            .get(&seg)
            .cloned()
            .ok_or(TransferError::UnknownSegment(seg))
    }
}

impl Drop for RdmaBackend {
    fn drop(&mut self) {
        for l in self.listeners.lock().drain(..) {
            l.abort();
        }
    }
}

impl TransferBackend for RdmaBackend {
    async fn register_segment(
        &self,
        sink: Arc<dyn PageSink>,
    ) -> Result<SegmentDesc, TransferError> {
        let listener = TcpListener::bind(self.bind).await?;
        let addr = listener.local_addr()?.to_string();
        // Staging for one connection: the in-flight budget's worth of pages (the sender never
        // has more unacknowledged, and each batch's window closes before its ack).
        let slots = (self.cfg.max_inflight_bytes / sink.page_bytes().max(1)).max(1);
        let (device, counters) = (self.device.clone(), self.counters.clone());
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, peer)) => {
                        let (d, s, c) = (device.clone(), sink.clone(), counters.clone());
                        tokio::spawn(async move {
                            let reason = serve_conn(stream, d, s, c, slots).await;
                            tracing::debug!(%peer, ?reason, "RDMA control connection closed");
                        });
                    }
                    Err(e) => tracing::warn!(error = %e, "accept failed"),
                }
            }
        });
        self.listeners.lock().push(task);
        Ok(SegmentDesc { addr })
    }

    async fn open_segment(&self, desc: &SegmentDesc) -> Result<SegmentId, TransferError> {
        let seg = SegmentId(self.next_seg.fetch_add(1, Ordering::Relaxed));
        let conn = RdmaSender::connect(
            seg,
            &desc.addr,
            self.device.clone(),
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
