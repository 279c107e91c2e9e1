//! The skeleton of a networked [`TransferBackend`], shared by TCP and RDMA: registered
//! segments' listeners, the table of opened segments, batch preparation, drain / cancel / close
//! by segment id, and failure broadcast. A [`Transport`] supplies only how a segment listens
//! and how one is connected; [`transfer_backend_via!`] makes a public backend type of it.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::broadcast;

use crate::batch::BatchHandle;
use crate::engine::{
    prepare_batch, EngineConfig, FailureEvent, PageWriteReq, SegmentDesc, SegmentId, TransferError,
};
use crate::outbound::OpenConn;
use crate::receiver::ReceiverCounters;
use crate::sink::PageSink;
use crate::types::GrantKey;

/// How a networked backend listens for and connects to segments.
pub(crate) trait Transport: Send + Sync + 'static {
    /// One opened segment.
    type Conn: OpenConn;
    /// Kept while the backend lives, one per registered segment (dropping it stops serving).
    type Listener: Send + 'static;

    /// Starts serving a registered segment.
    fn listen(
        &self,
        s: Registering,
    ) -> impl Future<Output = Result<(Self::Listener, SegmentDesc), TransferError>> + Send;

    /// Connects to a segment.
    fn connect(
        &self,
        o: Opening<'_>,
    ) -> impl Future<Output = Result<Self::Conn, TransferError>> + Send;
}

/// A segment being registered: where it listens, and what it writes into.
pub(crate) struct Registering {
    pub(crate) bind: SocketAddr,
    pub(crate) sink: Arc<dyn PageSink>,
    /// The backend's counters, shared by all its segments.
    pub(crate) counters: Arc<ReceiverCounters>,
}

/// A segment being opened: its id, where it is served, and what the connection needs.
pub(crate) struct Opening<'a> {
    pub(crate) seg: SegmentId,
    pub(crate) addr: &'a str,
    pub(crate) max_inflight_bytes: usize,
    pub(crate) failures: broadcast::Sender<FailureEvent>,
    /// Whether the transport's stream security (TLS) applies; off for a sealed segment,
    /// whose frames carry their own (`seal.rs`).
    pub(crate) stream_security: bool,
}

/// A backend over transport `T`. Field order is drop order: the transport (which may hold a
/// device every listener and connection uses) goes last.
pub(crate) struct Backend<T: Transport> {
    cfg: EngineConfig,
    bind: SocketAddr,
    counters: Arc<ReceiverCounters>,
    listeners: Mutex<Vec<T::Listener>>,
    conns: Mutex<HashMap<SegmentId, Arc<T::Conn>>>,
    next_seg: AtomicU64,
    failures: broadcast::Sender<FailureEvent>,
    transport: T,
}

impl<T: Transport> Backend<T> {
    /// A backend whose segments listen on `bind`.
    pub(crate) fn new(cfg: EngineConfig, bind: SocketAddr, transport: T) -> Self {
        Self {
            cfg,
            bind,
            counters: Arc::default(),
            listeners: Mutex::default(),
            conns: Mutex::default(),
            next_seg: AtomicU64::new(1),
            failures: broadcast::channel(256).0,
            transport,
        }
    }

    /// Counters of every segment this backend registered.
    pub(crate) fn receiver_counters(&self) -> &Arc<ReceiverCounters> {
        &self.counters
    }

    pub(crate) fn conn(&self, seg: SegmentId) -> Result<Arc<T::Conn>, TransferError> {
        self.conns
            .lock()
            .get(&seg)
            .cloned()
            .ok_or(TransferError::UnknownSegment(seg))
    }

    pub(crate) async fn register_segment(
        &self,
        sink: Arc<dyn PageSink>,
    ) -> Result<SegmentDesc, TransferError> {
        let s = Registering {
            bind: self.bind,
            sink,
            counters: self.counters.clone(),
        };
        let (listener, desc) = self.transport.listen(s).await?;
        self.listeners.lock().push(listener);
        Ok(desc)
    }

    pub(crate) async fn open_segment(
        &self,
        desc: &SegmentDesc,
    ) -> Result<SegmentId, TransferError> {
        self.open_segment_with(desc, true).await
    }

    /// Opens a segment, with or without the transport's stream security.
    pub(crate) async fn open_segment_with(
        &self,
        desc: &SegmentDesc,
        stream_security: bool,
    ) -> Result<SegmentId, TransferError> {
        let seg = SegmentId(self.next_seg.fetch_add(1, Ordering::Relaxed));
        let o = Opening {
            seg,
            addr: &desc.addr,
            max_inflight_bytes: self.cfg.max_inflight_bytes,
            failures: self.failures.clone(),
            stream_security,
        };
        let conn = self.transport.connect(o).await?;
        self.conns.lock().insert(seg, Arc::new(conn));
        Ok(seg)
    }

    pub(crate) fn submit_batch(
        &self,
        seg: SegmentId,
        key: GrantKey,
        reqs: Vec<PageWriteReq>,
    ) -> Result<BatchHandle, TransferError> {
        let conn = self.conn(seg)?;
        conn.submit(key, prepare_batch(&self.cfg, reqs)?)
    }

    pub(crate) async fn drain(&self, seg: SegmentId, key: GrantKey) -> Result<(), TransferError> {
        self.conn(seg)?.front().drain(key).await
    }

    pub(crate) async fn cancel(&self, seg: SegmentId, key: GrantKey) -> Result<(), TransferError> {
        self.conn(seg)?.front().cancel(key).await
    }

    pub(crate) fn subscribe_failures(&self) -> broadcast::Receiver<FailureEvent> {
        self.failures.subscribe()
    }

    pub(crate) fn close_segment(&self, seg: SegmentId) {
        self.conns.lock().remove(&seg);
    }

    pub(crate) fn segment_open(&self, seg: SegmentId) -> bool {
        self.conns
            .lock()
            .get(&seg)
            .is_some_and(|c| c.front().lost().is_none())
    }
}

/// `impl TransferBackend for $ty` by delegating to its `.0`, a [`Backend`].
macro_rules! transfer_backend_via {
    ($ty:ty) => {
        impl $crate::engine::TransferBackend for $ty {
            async fn register_segment(
                &self,
                sink: ::std::sync::Arc<dyn $crate::sink::PageSink>,
            ) -> Result<$crate::engine::SegmentDesc, $crate::engine::TransferError> {
                self.0.register_segment(sink).await
            }

            async fn open_segment(
                &self,
                desc: &$crate::engine::SegmentDesc,
            ) -> Result<$crate::engine::SegmentId, $crate::engine::TransferError> {
                self.0.open_segment(desc).await
            }

            fn submit_batch(
                &self,
                seg: $crate::engine::SegmentId,
                key: $crate::types::GrantKey,
                reqs: Vec<$crate::engine::PageWriteReq>,
            ) -> Result<$crate::batch::BatchHandle, $crate::engine::TransferError> {
                self.0.submit_batch(seg, key, reqs)
            }

            $crate::backend::grant_ends_via!(drain, cancel);

            fn subscribe_failures(
                &self,
            ) -> ::tokio::sync::broadcast::Receiver<$crate::engine::FailureEvent> {
                self.0.subscribe_failures()
            }

            fn close_segment(&self, seg: $crate::engine::SegmentId) {
                self.0.close_segment(seg)
            }

            fn segment_open(&self, seg: $crate::engine::SegmentId) -> bool {
                self.0.segment_open(seg)
            }
        }
    };
}
pub(crate) use transfer_backend_via;

/// `drain` and `cancel` of [`transfer_backend_via!`]: the same delegation.
macro_rules! grant_ends_via {
    ($($m:ident),*) => {
        $(
            async fn $m(
                &self,
                seg: $crate::engine::SegmentId,
                key: $crate::types::GrantKey,
            ) -> Result<(), $crate::engine::TransferError> {
                self.0.$m(seg, key).await
            }
        )*
    };
}
pub(crate) use grant_ends_via;
