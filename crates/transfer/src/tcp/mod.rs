//! TCP backend (the default): each registered segment is a listener, each opened segment a
//! connection carrying the framed protocol of `frame.rs`.
//!
//! - `listener.rs`: receiving side (accept, read frames, drive a `ReceiverSession`).
//! - `sender.rs`: sending side of one connection (framing and socket writes, ack reader; the
//!   front, queue, in-flight budget and ack routing are shared with RDMA: `outbound.rs`).
//! - `hash_ahead.rs`: checksums pages on a helper thread a bounded distance ahead of the writer.
//! - `secure.rs`: mutual TLS and the writer's role check, handshake timeout and budget,
//!   connection cap.
//! - `refusals.rs`: refused connections summarized per source (one report per window).

mod hash_ahead;
mod listener;
mod refusals;
mod secure;
mod sender;

use std::net::SocketAddr;
use std::sync::Arc;

pub use listener::{serve_sealed, serve_stream, TcpReceiver};
pub use secure::{
    Authorize, ClientTls, ListenOptions, OnRefused, Refused, RefusedReason, ServerTls,
};
pub use sender::SenderConn;

use crate::backend::{transfer_backend_via, Backend, Opening, Registering, Transport};
use crate::engine::{EngineConfig, SegmentDesc, SegmentId, TransferError};
use crate::receiver::ReceiverCounters;
use crate::seal::GrantSeal;
use crate::types::GrantKey;

/// The TCP backend.
pub struct TcpBackend(Backend<Tcp>);

impl TcpBackend {
    /// A backend whose segments listen on `bind` (port 0: any free port), in clear.
    pub fn new(cfg: EngineConfig, bind: SocketAddr) -> Self {
        Self::with_security(cfg, bind, ListenOptions::default(), None)
    }

    /// A backend whose segments listen under `listen` and whose connections speak TLS when
    /// `connect` is given.
    pub fn with_security(
        cfg: EngineConfig,
        bind: SocketAddr,
        listen: ListenOptions,
        connect: Option<ClientTls>,
    ) -> Self {
        Self(Backend::new(cfg, bind, Tcp { listen, connect }))
    }

    /// Counters of every segment this backend registered.
    pub fn receiver_counters(&self) -> &Arc<ReceiverCounters> {
        self.0.receiver_counters()
    }

    /// Opens a segment whose listener seals its frames: plain TCP, whatever TLS this backend
    /// would speak, since every frame carries its grant's seal.
    pub async fn open_sealed_segment(
        &self,
        desc: &SegmentDesc,
    ) -> Result<SegmentId, TransferError> {
        self.0.open_segment_with(desc, false).await
    }

    /// Seals every frame of grant `key` on segment `seg` with the grant's seal (the receiver
    /// requires it when its listener seals); call before the grant's first batch.
    pub fn seal_grant(
        &self,
        seg: SegmentId,
        key: GrantKey,
        seal: GrantSeal,
    ) -> Result<(), TransferError> {
        self.0.conn(seg)?.seal(key, seal);
        Ok(())
    }
}

transfer_backend_via!(TcpBackend);

/// What is TCP-specific about [`TcpBackend`]: a segment is a [`TcpReceiver`], an opened one a
/// [`SenderConn`]; either side may run under TLS.
struct Tcp {
    listen: ListenOptions,
    connect: Option<ClientTls>,
}

impl Transport for Tcp {
    type Conn = SenderConn;
    type Listener = TcpReceiver;

    async fn listen(&self, s: Registering) -> Result<(TcpReceiver, SegmentDesc), TransferError> {
        let r = TcpReceiver::bind_with(s.bind, s.sink, s.counters, self.listen.clone()).await?;
        let addr = r.local_addr().to_string();
        Ok((r, SegmentDesc { addr }))
    }

    async fn connect(&self, o: Opening<'_>) -> Result<SenderConn, TransferError> {
        SenderConn::connect_with(
            o.seg,
            o.addr,
            o.max_inflight_bytes,
            o.failures,
            self.connect.as_ref().filter(|_| o.stream_security),
        )
        .await
    }
}
