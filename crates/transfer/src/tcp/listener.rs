//! TCP receiving side: one listener per registered segment, one task per connection driving a
//! [`ReceiverSession`]. Frame lengths are checked before a buffer grows; a malformed frame
//! closes that connection (logged, counted) and touches no page. Connections are capped and,
//! under TLS, authenticated before their first frame (`secure.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;

use crate::frame::{
    decode_header, decode_payload, encode, encode_hello, FrameError, Header, HEADER_LEN,
};
use crate::receiver::{CloseReason, ReceiverCounters, ReceiverSession};
use crate::seal::{ConnectionSeal, SealPolicy};
use crate::sink::PageSink;

use super::refusals::{self, RefusalLog};
use super::secure::{self, ListenOptions, RefusedReason};

/// A running TCP receiver. Dropping it stops accepting and closes its connections.
pub struct TcpReceiver {
    addr: SocketAddr,
    counters: Arc<ReceiverCounters>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl TcpReceiver {
    /// Binds `addr` (use port 0 in tests) and serves writes into `sink`, in clear, with the
    /// default connection cap.
    pub async fn bind(
        addr: SocketAddr,
        sink: Arc<dyn PageSink>,
        counters: Arc<ReceiverCounters>,
    ) -> std::io::Result<Self> {
        Self::bind_with(addr, sink, counters, ListenOptions::default()).await
    }

    /// Binds `addr` and serves writes into `sink` under `opts` (TLS and role check,
    /// handshake timeout, connection cap).
    pub async fn bind_with(
        addr: SocketAddr,
        sink: Arc<dyn PageSink>,
        counters: Arc<ReceiverCounters>,
        opts: ListenOptions,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (shutdown, rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, sink, counters.clone(), opts, rx));
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
    opts: ListenOptions,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(opts.max_connections.max(1)));
    let handshakes = Arc::new(Semaphore::new(opts.max_handshakes.max(1)));
    let log = Arc::new(RefusalLog::new(opts.refusal_window));
    let mut summaries = tokio::time::interval(opts.refusal_window.max(Duration::from_secs(1)));
    summaries.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let opts = Arc::new(opts);
    let refuse = {
        let (counters, opts, log) = (counters.clone(), opts.clone(), log.clone());
        move |peer: SocketAddr, reason: RefusedReason| {
            counters.refused_connection();
            if let Some(r) = log.refused(peer, reason, Instant::now()) {
                refusals::report(&opts, &r);
            }
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = summaries.tick() => {
                for r in log.flush(Instant::now()) {
                    refusals::report(&opts, &r);
                }
            }
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    let Ok(handshake) = handshakes.clone().try_acquire_owned() else {
                        refuse(peer, RefusedReason::TooManyHandshakes);
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let session = ReceiverSession::new(sink.clone(), counters.clone());
                    let (shut, opts, slots) = (shutdown.clone(), opts.clone(), slots.clone());
                    let (refuse, log) = (refuse.clone(), log.clone());
                    tokio::spawn(async move {
                        let (rd, wr) = match secure::accept(stream, &opts).await {
                            Ok(halves) => halves,
                            Err(reason) => return refuse(peer, reason),
                        };
                        drop(handshake);
                        // Each connection may hold a page buffer or two: the cap bounds memory.
                        let Ok(slot) = slots.try_acquire_owned() else {
                            return refuse(peer, RefusedReason::TooManyConnections);
                        };
                        let seal = opts.seal.clone();
                        let reason = serve_sealed(rd, wr, session, seal, shut).await;
                        tracing::debug!(%peer, ?reason, "transfer connection closed");
                        if let CloseReason::Malformed(
                            e @ (FrameError::BadSeal(_)
                            | FrameError::NotSealed { .. }
                            | FrameError::UnexpectedSeal),
                        ) = &reason
                        {
                            // Counted as a malformed close already; the hook hears of it, once
                            // per source and window like every refusal.
                            let reason = RefusedReason::Seal(e.to_string());
                            if let Some(r) = log.refused(peer, reason, Instant::now()) {
                                refusals::report(&opts, &r);
                            }
                        }
                        drop(slot);
                    });
                }
                Err(e) => tracing::warn!(error = %e, "accept failed"),
            }
        }
    }
}

/// Frames read ahead of the one being written into the pool.
const PIPELINE: usize = 2;

enum Item {
    Frame(Header, Vec<u8>),
    End(CloseReason),
}

/// Serves one ordered stream until it ends. The read side (this task) reads frames ahead
/// while a processing task checks and writes them into the pool in stream order, so the
/// kernel copy of page N+1 overlaps the checksum and copy of page N. The session is closed
/// (peer-gone for undrained grants) by the processing task after its last frame, so no
/// frame of the stream can still be processed when that happens.
pub async fn serve_stream<R, W>(
    rd: R,
    wr: W,
    session: ReceiverSession<dyn PageSink>,
    shutdown: watch::Receiver<bool>,
) -> CloseReason
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    serve_sealed(rd, wr, session, None, shutdown).await
}

/// [`serve_stream`], requiring every frame sealed under `seal` when given (a HELLO with the
/// connection's challenge goes out first).
pub async fn serve_sealed<R, W>(
    mut rd: R,
    wr: W,
    session: ReceiverSession<dyn PageSink>,
    seal: Option<SealPolicy>,
    mut shutdown: watch::Receiver<bool>,
) -> CloseReason
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let max_payload = session.max_payload();
    let (tx, rx) = mpsc::channel::<Item>(PIPELINE);
    let (recycle_tx, mut recycle_rx) = mpsc::channel::<Vec<u8>>(PIPELINE + 2);
    let seal = seal.map(ConnectionSeal::new);
    let processor = tokio::spawn(process(rx, recycle_tx, wr, session, seal));
    let end = loop {
        let mut hdr = [0u8; HEADER_LEN];
        let first = tokio::select! {
            _ = shutdown.changed() => break Some(CloseReason::Shutdown),
            _ = tx.closed() => break None,
            r = rd.read(&mut hdr) => r,
        };
        match first {
            Ok(0) => break Some(CloseReason::PeerClosed),
            Ok(n) => {
                if let Err(e) = rd.read_exact(&mut hdr[n..]).await {
                    break Some(io_reason(e));
                }
            }
            Err(e) => break Some(CloseReason::Transport(e.to_string())),
        }
        let h = match decode_header(&hdr, max_payload) {
            Ok(h) => h,
            Err(e) => break Some(CloseReason::Malformed(e)),
        };
        // Safe to size the buffer now: payload_len <= max_payload was checked above. No read
        // buffer in between: page payloads go straight from the kernel into `buf`.
        let mut buf = recycle_rx.try_recv().unwrap_or_default();
        buf.resize(h.wire_len(), 0);
        if let Err(e) = rd.read_exact(&mut buf).await {
            break Some(io_reason(e));
        }
        if tx.send(Item::Frame(h, buf)).await.is_err() {
            break None;
        }
    };
    if let Some(reason) = end {
        let _ = tx.send(Item::End(reason)).await;
    }
    drop(tx);
    drop(rd);
    processor
        .await
        .unwrap_or_else(|e| CloseReason::Transport(format!("receiver task failed: {e}")))
}

async fn process<W: AsyncWrite + Unpin>(
    mut rx: mpsc::Receiver<Item>,
    recycle: mpsc::Sender<Vec<u8>>,
    mut wr: W,
    mut session: ReceiverSession<dyn PageSink>,
    mut seal: Option<ConnectionSeal>,
) -> CloseReason {
    let mut out: Vec<u8> = Vec::with_capacity(64);
    if let Some(s) = &seal {
        encode_hello(&mut out, s.challenge());
        if let Err(e) = wr.write_all(&out).await {
            session.close(&CloseReason::Transport(e.to_string()));
            return CloseReason::Transport(e.to_string());
        }
    }
    let reason = loop {
        let (mut h, mut buf) = match rx.recv().await {
            Some(Item::Frame(h, buf)) => (h, buf),
            Some(Item::End(r)) => break r,
            None => break CloseReason::Shutdown,
        };
        // The seal is checked (and the page decrypted) before the frame is even decoded.
        let opened = match (&mut seal, h.seal) {
            (Some(s), _) => s.open(&h, &mut buf).map(|()| h.seal = None),
            (None, Some(_)) => Err(FrameError::UnexpectedSeal),
            (None, None) => Ok(()),
        };
        let reply = match opened
            .and_then(|()| decode_payload(h, &buf))
            .and_then(|f| session.on_frame(f))
        {
            Ok(r) => r,
            Err(e) => break CloseReason::Malformed(e),
        };
        let _ = recycle.try_send(buf);
        if let Some(r) = reply {
            out.clear();
            encode(&mut out, &r);
            if let Err(e) = wr.write_all(&out).await {
                break CloseReason::Transport(e.to_string());
            }
        }
    };
    // Frames still queued after a malformed one are never processed.
    rx.close();
    let _ = wr.shutdown().await;
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
