//! TCP sending side of one opened segment: the wire of its writer task (frames and socket
//! writes; queueing, in-flight budget and DRAIN order are `outbound.rs`'s), the ack reader
//! (framing; routing is `pending.rs`'s), and the hash-ahead helper fed at submit.

use std::io::IoSlice;
use std::sync::Arc;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::broadcast;

use super::hash_ahead::{self, HashAhead, Progress};
use super::secure::{self, BoxRead, BoxWrite, ClientTls};
use crate::batch::BatchHandle;
use crate::engine::{FailureEvent, OutPage, SegmentId, TransferError};
use crate::frame::{
    decode_header, decode_payload, encode, encode_write_prefix, Frame, WriteFrame, HEADER_LEN,
};
use crate::outbound::{OpenConn, OutBatch, SenderFront, Wire};
use crate::pending::Shared;
use crate::types::GrantKey;

/// Bound on reaching a receiver: the TCP connect, and again the TLS handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Pages at least this long bypass the write buffer.
const DIRECT_WRITE: usize = 32 << 10;

/// One open TCP segment (sender side).
pub struct SenderConn {
    front: SenderFront,
    hasher: Option<HashAhead>,
}

impl SenderConn {
    /// Connects to a receiver, in clear.
    pub async fn connect(
        seg: SegmentId,
        addr: &str,
        max_inflight_bytes: usize,
        failures: broadcast::Sender<FailureEvent>,
    ) -> Result<Self, TransferError> {
        Self::connect_with(seg, addr, max_inflight_bytes, failures, None).await
    }

    /// Connects to a receiver within [`CONNECT_TIMEOUT`] (and handshakes within it again
    /// under `tls`).
    pub async fn connect_with(
        seg: SegmentId,
        addr: &str,
        max_inflight_bytes: usize,
        failures: broadcast::Sender<FailureEvent>,
        tls: Option<&ClientTls>,
    ) -> Result<Self, TransferError> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connecting to {addr} took over {CONNECT_TIMEOUT:?}"),
                )
            })??;
        stream.set_nodelay(true)?;
        let (rd, wr) = secure::connect(stream, tls, CONNECT_TIMEOUT).await?;
        let shared = Arc::new(Shared::new(seg, failures));
        let hasher = if hash_ahead::worthwhile() {
            Some(HashAhead::spawn()?)
        } else {
            None
        };
        let wire = TcpWire {
            wr: BufWriter::with_capacity(256 << 10, wr),
            hdr: Vec::with_capacity(128),
            shared: shared.clone(),
            progress: hasher.as_ref().map(HashAhead::progress),
        };
        let read = read_loop(rd, shared.clone());
        let front = SenderFront::spawn(shared, wire, max_inflight_bytes, read);
        Ok(Self { front, hasher })
    }

    /// Queues a prepared batch.
    pub fn submit(&self, key: GrantKey, pages: Vec<OutPage>) -> Result<BatchHandle, TransferError> {
        self.front.submit_with(key, pages, |pages| {
            if let Some(h) = &self.hasher {
                h.queue(pages.to_vec());
            }
        })
    }

    /// Sends DRAIN(key) after everything queued before it and waits for the ack.
    pub async fn drain(&self, key: GrantKey) -> Result<(), TransferError> {
        self.front.drain(key).await
    }

    /// Stops sending unsent pages of `key`, then drains it.
    pub async fn cancel(&self, key: GrantKey) -> Result<(), TransferError> {
        self.front.cancel(key).await
    }
}

impl OpenConn for SenderConn {
    fn front(&self) -> &SenderFront {
        &self.front
    }

    fn submit(&self, key: GrantKey, pages: Vec<OutPage>) -> Result<BatchHandle, TransferError> {
        SenderConn::submit(self, key, pages)
    }
}

/// The TCP writer: frames on a buffered socket, big pages written straight from the caller's
/// bytes, the hash-ahead helper told how far it got.
struct TcpWire {
    wr: BufWriter<BoxWrite>,
    hdr: Vec<u8>,
    shared: Arc<Shared>,
    progress: Option<Arc<Progress>>,
}

impl Wire for TcpWire {
    type Error = std::io::Error;
    const FAILED: &'static str = "write failed";

    async fn send_batch(&mut self, b: OutBatch) -> std::io::Result<()> {
        let (key, id, pages) = (b.key, b.id, &b.pages);
        let Self {
            wr,
            hdr,
            shared,
            progress,
        } = self;
        let mut sent = 0u32;
        for p in pages {
            if shared.is_cancelled(key) {
                break;
            }
            hdr.clear();
            let w = WriteFrame {
                key,
                batch: id,
                page: p.page,
                generation: p.generation,
                tokens: p.tokens,
                checksum: p.checksum(),
                data: &p.src,
            };
            encode_write_prefix(hdr, &w);
            if p.src.len() >= DIRECT_WRITE {
                // Big page: header and page in one syscall, straight from the caller's bytes.
                wr.flush().await?;
                write_two(wr.get_mut(), hdr, &p.src).await?;
            } else {
                wr.write_all(hdr).await?;
                wr.write_all(&p.src).await?;
            }
            sent += 1;
            if let Some(pr) = progress {
                pr.advance(p.src.len());
            }
        }
        if let Some(pr) = progress {
            // Pages skipped by a cancel count as done, so the hasher does not wait for them.
            pr.advance(pages[sent as usize..].iter().map(|p| p.src.len()).sum());
        }
        if !b.park(shared, sent) {
            return Ok(());
        }
        hdr.clear();
        encode(
            hdr,
            &Frame::BatchEnd {
                key,
                batch: id,
                pages: sent,
            },
        );
        wr.write_all(hdr).await?;
        wr.flush().await
    }

    async fn send_drain(&mut self, key: GrantKey) -> std::io::Result<()> {
        self.hdr.clear();
        encode(&mut self.hdr, &Frame::Drain(key));
        self.wr.write_all(&self.hdr).await?;
        self.wr.flush().await
    }

    async fn shutdown(&mut self) {
        let _ = self.wr.shutdown().await;
    }
}

/// Writes `a` then `b` with vectored writes until both are fully sent.
async fn write_two(w: &mut BoxWrite, mut a: &[u8], mut b: &[u8]) -> std::io::Result<()> {
    while !a.is_empty() || !b.is_empty() {
        let n = w
            .write_vectored(&[IoSlice::new(a), IoSlice::new(b)])
            .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        if n <= a.len() {
            a = &a[n..];
        } else {
            b = &b[n - a.len()..];
            a = &[];
        }
    }
    Ok(())
}

/// Reads acks until the connection ends; returns why it did.
async fn read_loop(mut rd: BoxRead, shared: Arc<Shared>) -> String {
    let mut hdr = [0u8; HEADER_LEN];
    let mut buf = [0u8; 64];
    loop {
        if let Err(e) = rd.read_exact(&mut hdr).await {
            return format!("receiver closed the connection ({e})");
        }
        // Acks are tiny; anything larger is a broken peer.
        let h = match decode_header(&hdr, buf.len()) {
            Ok(h) => h,
            Err(e) => return format!("malformed ack: {e}"),
        };
        let p = &mut buf[..h.payload_len as usize];
        if let Err(e) = rd.read_exact(p).await {
            return format!("receiver closed the connection ({e})");
        }
        match decode_payload(h, p).map(|f| shared.route_ack(f)) {
            Ok(Ok(())) => {}
            Ok(Err(f)) => return format!("unexpected frame from receiver: {f:?}"),
            Err(e) => return format!("malformed ack: {e}"),
        }
    }
}
