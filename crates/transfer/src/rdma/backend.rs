//! [`RdmaBackend`]: the [`crate::TransferBackend`] over RDMA, on the skeleton shared with TCP
//! (`crate::backend`). A registered segment is a TCP control listener; each accepted control
//! connection gets its own queue pair, completion queue and staging region (`receiver.rs`).
//! An opened segment is a control connection plus a queue pair (`sender.rs`). Without an RDMA
//! device, [`RdmaBackend::new`] fails with [`TransferError::Unsupported`]; nothing panics.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::receiver::{serve_conn, QP_DEPTH};
use super::sender;
use super::verbs::Device;
use crate::backend::{transfer_backend_via, Backend, Opening, Registering, Transport};
use crate::engine::{EngineConfig, SegmentDesc, TransferError};
use crate::outbound::SenderFront;
use crate::receiver::ReceiverCounters;

/// The RDMA backend.
pub struct RdmaBackend(Backend<Rdma>);

impl RdmaBackend {
    /// Opens the host's first RDMA device. Control listeners bind `bind` (port 0: any free
    /// port). Fails with [`TransferError::Unsupported`] when the host has no RDMA device.
    pub fn new(cfg: EngineConfig, bind: SocketAddr) -> Result<Self, TransferError> {
        let device = Arc::new(Device::open_first(QP_DEPTH as i32)?);
        let max_inflight_bytes = cfg.max_inflight_bytes;
        let rdma = Rdma {
            max_inflight_bytes,
            device,
        };
        Ok(Self(Backend::new(cfg, bind, rdma)))
    }

    /// Counters of every segment this backend registered.
    pub fn receiver_counters(&self) -> &Arc<ReceiverCounters> {
        self.0.receiver_counters()
    }
}

transfer_backend_via!(RdmaBackend);

/// What is RDMA-specific about [`RdmaBackend`]: the device; a segment is a control listener
/// task, an opened one a control connection plus a queue pair.
struct Rdma {
    /// The engine's in-flight budget (it sizes each connection's staging).
    max_inflight_bytes: usize,
    // Tasks and connections hold the device too; it is closed when the last one goes.
    device: Arc<Device>,
}

/// A control listener task, stopped when the backend goes.
struct ListenerTask(JoinHandle<()>);

impl Drop for ListenerTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Transport for Rdma {
    type Conn = SenderFront;
    type Listener = ListenerTask;

    async fn listen(&self, s: Registering) -> Result<(ListenerTask, SegmentDesc), TransferError> {
        let Registering {
            bind,
            sink,
            counters,
        } = s;
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?.to_string();
        // Staging for one connection: the in-flight budget's worth of pages (the sender never
        // has more unacknowledged, and each batch's window closes before its ack).
        let slots = (self.max_inflight_bytes / sink.page_bytes().max(1)).max(1);
        let device = self.device.clone();
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
        Ok((ListenerTask(task), SegmentDesc { addr }))
    }

    async fn connect(&self, o: Opening<'_>) -> Result<SenderFront, TransferError> {
        sender::connect(o, self.device.clone()).await
    }
}
