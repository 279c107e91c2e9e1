//! TCP sending side of one opened segment: the wire of its writer task (frames and socket
//! writes; queueing, in-flight budget and DRAIN order are `outbound.rs`'s), the ack reader
//! (framing; routing is `pending.rs`'s), and the hash-ahead helper fed at submit.

use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, watch};

use super::hash_ahead::{self, HashAhead, Progress};
use super::secure::{self, BoxRead, BoxWrite, ClientTls};
use crate::batch::{BatchFailure, BatchHandle, BatchStatus};
use crate::engine::{FailureEvent, OutPage, SegmentId, TransferError};
use crate::frame::{
    decode_header, decode_hello, decode_payload, encode, encode_write_prefix, mark_sealed, Frame,
    FrameType, WriteFrame, CHALLENGE_LEN, HEADER_LEN,
};
use crate::outbound::{OpenConn, OutBatch, SenderFront, Wire};
use crate::pending::Shared;
use crate::seal::{FrameSealer, GrantSeal, SealMode};
use crate::types::GrantKey;

/// Bound on reaching a receiver: the TCP connect, and again the TLS handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Pages at least this long bypass the write buffer.
const DIRECT_WRITE: usize = 32 << 10;

/// The seals of grants registered on a connection, until their DRAIN is sent.
type Seals = Arc<Mutex<HashMap<GrantKey, GrantSeal>>>;

/// One open TCP segment (sender side).
pub struct SenderConn {
    front: SenderFront,
    hasher: Option<HashAhead>,
    seals: Seals,
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
        let seals = Seals::default();
        let (hello_tx, hello) = watch::channel(None);
        let wire = TcpWire {
            wr: BufWriter::with_capacity(256 << 10, wr),
            hdr: Vec::with_capacity(128),
            shared: shared.clone(),
            progress: hasher.as_ref().map(HashAhead::progress),
            seal: WireSeal {
                seals: seals.clone(),
                hello,
                keys: HashMap::new(),
                counter: 0,
                scratch: Vec::new(),
            },
        };
        let read = read_loop(rd, shared.clone(), hello_tx);
        let front = SenderFront::spawn(shared, wire, max_inflight_bytes, read);
        Ok(Self {
            front,
            hasher,
            seals,
        })
    }

    /// Seals every frame of `key` on this connection from now on (the grant's seal, which the
    /// receiver requires). Until its DRAIN is sent.
    pub fn seal(&self, key: GrantKey, seal: GrantSeal) {
        self.seals.lock().insert(key, seal);
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
    seal: WireSeal,
}

/// The sending side's seals on one connection: the registered grants' seals, the receiver's
/// challenge (from its HELLO), the frame keys derived from both, and the frame counter.
struct WireSeal {
    seals: Seals,
    hello: watch::Receiver<Option<[u8; CHALLENGE_LEN]>>,
    keys: HashMap<GrantKey, FrameSealer>,
    counter: u64,
    scratch: Vec<u8>,
}

/// A sealed frame: its tag and, under AEAD, the encrypted page bytes in `scratch`.
struct Sealed<'a> {
    tag: [u8; crate::seal::TAG_LEN],
    body: &'a [u8],
}

impl WireSeal {
    /// The frame key of `key` on this connection, if its grant is sealed. Waits (bounded) for
    /// the receiver's HELLO the first time.
    async fn key(&mut self, key: GrantKey) -> std::io::Result<Option<SealMode>> {
        if let Some(k) = self.keys.get(&key) {
            return Ok(Some(k.mode()));
        }
        let Some(seal) = self.seals.lock().get(&key).cloned() else {
            return Ok(None);
        };
        let challenge =
            match tokio::time::timeout(CONNECT_TIMEOUT, self.hello.wait_for(Option::is_some)).await
            {
                Ok(Ok(c)) => c.expect("waited for Some"),
                Ok(Err(_)) => return Err(std::io::ErrorKind::ConnectionAborted.into()),
                Err(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the grant is sealed but the receiver sent no seal challenge",
                    ))
                }
            };
        self.keys.insert(key, seal.on_connection(&challenge));
        Ok(Some(seal.mode))
    }

    /// Seals the frame whose header and clear fields are `frame` (marked sealed here), with
    /// `body` (page bytes) after them.
    fn seal<'a>(&'a mut self, key: GrantKey, frame: &mut [u8], body: &'a [u8]) -> Sealed<'a> {
        let sealer = &self.keys[&key];
        mark_sealed(frame, sealer.mode());
        let t = FrameType::from_u8(frame[5]).expect("a frame this side encoded");
        let (fields, counter) = (&frame[HEADER_LEN..], self.counter);
        self.counter += 1;
        self.scratch.clear();
        match sealer.mode() {
            SealMode::Aead => {
                self.scratch.extend_from_slice(body);
                let tag = sealer.seal(t, counter, fields, &mut self.scratch);
                Sealed {
                    tag,
                    body: &self.scratch,
                }
            }
            SealMode::Mac => {
                self.scratch.extend_from_slice(fields);
                self.scratch.extend_from_slice(body);
                let tag = sealer.seal(t, counter, &self.scratch, &mut []);
                Sealed { tag, body }
            }
        }
    }

    /// `key`'s DRAIN is sent: nothing more of it is sealed here.
    fn forget(&mut self, key: GrantKey) {
        self.keys.remove(&key);
        self.seals.lock().remove(&key);
    }
}

impl Wire for TcpWire {
    type Error = std::io::Error;
    const FAILED: &'static str = "write failed";

    async fn send_batch(&mut self, b: OutBatch) -> std::io::Result<()> {
        let (key, id, pages) = (b.key, b.id, &b.pages);
        let sealed = match self.seal.key(key).await {
            Ok(seal) => seal.is_some(),
            Err(e) => {
                // Say why, rather than "dropped": this is a configuration mismatch.
                let why = BatchFailure::ConnectionLost(e.to_string());
                b.done.finish(BatchStatus::Failed(why));
                return Err(e);
            }
        };
        let Self {
            wr,
            hdr,
            shared,
            progress,
            seal,
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
            if sealed {
                let s = seal.seal(key, hdr, &p.src);
                wr.write_all(hdr).await?;
                wr.write_all(s.body).await?;
                wr.write_all(&s.tag).await?;
            } else if p.src.len() >= DIRECT_WRITE {
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
        if sealed {
            let tag = seal.seal(key, hdr, &[]).tag;
            hdr.extend_from_slice(&tag);
        }
        wr.write_all(hdr).await?;
        wr.flush().await
    }

    async fn send_drain(&mut self, key: GrantKey) -> std::io::Result<()> {
        let sealed = self.seal.key(key).await?.is_some();
        self.hdr.clear();
        encode(&mut self.hdr, &Frame::Drain(key));
        if sealed {
            let tag = self.seal.seal(key, &mut self.hdr, &[]).tag;
            self.hdr.extend_from_slice(&tag);
            self.seal.forget(key);
        }
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

/// Reads acks (and a sealing receiver's HELLO) until the connection ends; returns why it did.
async fn read_loop(
    mut rd: BoxRead,
    shared: Arc<Shared>,
    hello: watch::Sender<Option<[u8; CHALLENGE_LEN]>>,
) -> String {
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
        if h.frame_type == FrameType::Hello && h.seal.is_none() {
            match decode_hello(p) {
                Ok(c) if hello.borrow().is_none() => {
                    hello.send_replace(Some(c));
                    continue;
                }
                Ok(_) => return "second HELLO from receiver".into(),
                Err(e) => return format!("malformed HELLO: {e}"),
            }
        }
        match decode_payload(h, p).map(|f| shared.route_ack(f)) {
            Ok(Ok(())) => {}
            Ok(Err(f)) => return format!("unexpected frame from receiver: {f:?}"),
            Err(e) => return format!("malformed ack: {e}"),
        }
    }
}
