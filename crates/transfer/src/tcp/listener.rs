//! TCP receiving side: one listener per registered segment, one task per connection driving a
//! [`ReceiverSession`]. Frame lengths are checked before a buffer grows; a malformed frame
//! closes that connection (logged, counted) and touches no page.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::frame::{decode_header, decode_payload, encode, FrameError, HEADER_LEN};
use crate::receiver::{CloseReason, ReceiverCounters, ReceiverSession};
use crate::sink::PageSink;

/// A running TCP receiver. Dropping it stops accepting and closes its connections.
pub struct TcpReceiver {
    addr: SocketAddr,
    counters: Arc<ReceiverCounters>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl TcpReceiver {
    /// Binds `addr` (use port 0 in tests) and serves writes into `sink`.
    pub async fn bind(
        addr: SocketAddr,
        sink: Arc<dyn PageSink>,
        counters: Arc<ReceiverCounters>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (shutdown, rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, sink, counters.clone(), rx));
        Ok(Self {
            addr,
            counters,
            shutdown,
            task,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// This receiver's counters.
    pub fn counters(&self) -> &Arc<ReceiverCounters> {
        &self.counters
    }
}

impl Drop for TcpReceiver {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    sink: Arc<dyn PageSink>,
    counters: Arc<ReceiverCounters>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let (rd, wr) = stream.into_split();
                    let session = ReceiverSession::new(sink.clone(), counters.clone());
                    let shut = shutdown.clone();
                    tokio::spawn(async move {
                        let reason = serve_stream(rd, wr, session, shut).await;
                        tracing::debug!(%peer, ?reason, "transfer connection closed");
                    });
                }
                Err(e) => tracing::warn!(error = %e, "accept failed"),
            }
        }
    }
}

/// Serves one ordered stream until it ends; closes the session (peer-gone for undrained
/// grants) only after the read side is finished, so no frame of it can still be processed.
pub async fn serve_stream<R, W>(
    mut rd: R,
    mut wr: W,
    mut session: ReceiverSession<dyn PageSink>,
    mut shutdown: watch::Receiver<bool>,
) -> CloseReason
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let max_payload = session.max_payload();
    // No read buffer: page payloads are read straight into `buf` (one copy out of the kernel).
    let mut buf: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::with_capacity(64);
    let reason = loop {
        let mut hdr = [0u8; HEADER_LEN];
        let first = tokio::select! {
            _ = shutdown.changed() => break CloseReason::Shutdown,
            r = rd.read(&mut hdr) => r,
        };
        match first {
            Ok(0) => break CloseReason::PeerClosed,
            Ok(n) => {
                if let Err(e) = rd.read_exact(&mut hdr[n..]).await {
                    break io_reason(e);
                }
            }
            Err(e) => break CloseReason::Transport(e.to_string()),
        }
        let h = match decode_header(&hdr, max_payload) {
            Ok(h) => h,
            Err(e) => break CloseReason::Malformed(e),
        };
        // Safe to size the buffer now: payload_len <= max_payload was checked above.
        buf.resize(h.payload_len as usize, 0);
        if let Err(e) = rd.read_exact(&mut buf).await {
            break io_reason(e);
        }
        let reply = match decode_payload(h, &buf).and_then(|f| session.on_frame(f)) {
            Ok(r) => r,
            Err(e) => break CloseReason::Malformed(e),
        };
        if let Some(r) = reply {
            out.clear();
            encode(&mut out, &r);
            if let Err(e) = wr.write_all(&out).await {
                break CloseReason::Transport(e.to_string());
            }
        }
    };
    let _ = wr.shutdown().await;
    drop(rd);
    drop(wr);
    session.close(&reason);
    reason
}

fn io_reason(e: std::io::Error) -> CloseReason {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        CloseReason::Malformed(FrameError::Truncated)
    } else {
        CloseReason::Transport(e.to_string())
    }
}
