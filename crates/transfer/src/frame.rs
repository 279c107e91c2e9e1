//! The wire format shared by every backend: a versioned 12-byte header, a frame type and a
//! length that is checked against a maximum BEFORE any buffer is allocated.
//!
//! ```text
//! header (12 bytes, little endian):  magic "PWKV" | version u8 | type u8 | flags u16 (=0) | payload_len u32
//! WRITE      key[16] batch u64 page u32 generation u64 tokens u32 checksum u64 data_len u32 | data
//! BATCH_END  key[16] batch u64 pages u32
//! DRAIN      key[16]
//! BATCH_ACK  batch u64 written u32 rejected u32 first_reject u8
//! DRAIN_ACK  key[16]
//! HELLO      challenge[16]
//! ```
//! Sender → receiver: WRITE, BATCH_END, DRAIN. Receiver → sender: BATCH_ACK, DRAIN_ACK, and
//! HELLO, first on a connection whose listener seals (`seal.rs`).
//!
//! A sealed frame (flags [`SealMode::flag`]) carries a 16-byte tag after its payload, and
//! `payload_len` counts it; [`Header::payload_len`] is the payload without it.

use thiserror::Error;

use crate::seal::{SealMode, TAG_LEN};
use crate::types::{Generation, GrantKey, PageId, WriteError};

/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"PWKV";
/// Protocol version this build speaks; any other version closes the connection.
pub const VERSION: u8 = 1;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 12;
/// Bytes of a WRITE payload before its page data.
pub const WRITE_FIXED_LEN: usize = 16 + 8 + 4 + 8 + 4 + 8 + 4;
const BATCH_END_LEN: usize = 16 + 8 + 4;
const DRAIN_LEN: usize = 16;
const BATCH_ACK_LEN: usize = 8 + 4 + 4 + 1;
/// Bytes of a HELLO payload: the receiver's challenge.
pub const CHALLENGE_LEN: usize = 16;

/// Frame type byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    /// One page of KV data under a grant.
    Write = 1,
    /// End of a batch: the receiver answers with a BATCH_ACK.
    BatchEnd = 2,
    /// No write of this grant follows on this stream.
    Drain = 3,
    /// Receiver's per-batch tally.
    BatchAck = 4,
    /// Receiver processed everything before the DRAIN and told the pool.
    DrainAck = 5,
    /// A sealing receiver's per-connection challenge (`seal.rs`), its first frame.
    Hello = 6,
}

impl FrameType {
    pub(crate) fn from_u8(b: u8) -> Option<Self> {
        match b {
            1 => Some(Self::Write),
            2 => Some(Self::BatchEnd),
            3 => Some(Self::Drain),
            4 => Some(Self::BatchAck),
            5 => Some(Self::DrainAck),
            6 => Some(Self::Hello),
            _ => None,
        }
    }
}

/// Per-connection batch number chosen by the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId(pub u64);

/// A validated frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What follows.
    pub frame_type: FrameType,
    /// Payload bytes after the header, not counting a seal's tag.
    pub payload_len: u32,
    /// How the frame is sealed, if it is.
    pub seal: Option<SealMode>,
}

impl Header {
    /// Bytes that follow the header on the wire: the payload and a seal's tag.
    pub fn wire_len(&self) -> usize {
        self.payload_len as usize + if self.seal.is_some() { TAG_LEN } else { 0 }
    }
}

/// Why the bytes on a connection are not a frame of this protocol. Any of these closes the
/// connection; no page is touched.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum FrameError {
    /// The first four bytes are not "PWKV".
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// The peer speaks another protocol version.
    #[error("unsupported protocol version {0}")]
    BadVersion(u8),
    /// Unknown frame type byte.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// Reserved flag bits set.
    #[error("reserved flags {0:#x} set")]
    BadFlags(u16),
    /// The payload is larger than this connection accepts.
    #[error("payload of {len} bytes exceeds the maximum of {max}")]
    Oversize {
        /// Announced payload length.
        len: usize,
        /// Largest accepted.
        max: usize,
    },
    /// The payload length does not match what the frame's fields say.
    #[error("{frame:?} payload is {len} bytes, expected {expected}")]
    BadLength {
        /// Frame type.
        frame: FrameType,
        /// Actual payload bytes.
        len: usize,
        /// Bytes the fields require.
        expected: usize,
    },
    /// The stream ended inside a frame.
    #[error("connection ended inside a frame")]
    Truncated,
    /// A frame that only flows the other way arrived.
    #[error("{0:?} is not valid in this direction")]
    WrongDirection(FrameType),
    /// A reject code that is not defined.
    #[error("unknown reject code {0}")]
    BadRejectCode(u8),
    /// A WRITE names a page the receiver's pool does not have.
    #[error("page {0} does not exist on this receiver")]
    UnknownPage(u32),
    /// More batches open at once than a connection may hold.
    #[error("more than {0} batches open on one connection")]
    TooManyOpenBatches(usize),
    /// This listener seals its connections and the frame is not sealed its way.
    #[error("frame sealed as {got:?}; this listener requires {want}")]
    NotSealed {
        /// The frame's seal.
        got: Option<SealMode>,
        /// The listener's.
        want: SealMode,
    },
    /// A sealed frame on a connection that does not seal.
    #[error("sealed frame on a connection that does not seal")]
    UnexpectedSeal,
    /// The frame's tag does not verify: forged, altered, replayed or out of order.
    #[error("{0:?} frame failed its seal check (forged, altered or replayed)")]
    BadSeal(FrameType),
}

/// A decoded frame borrowing its page data from the receive buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// One page under a grant.
    Write(WriteFrame<'a>),
    /// End of a batch.
    BatchEnd {
        /// Grant the batch wrote under.
        key: GrantKey,
        /// Sender's batch number.
        batch: BatchId,
        /// WRITE frames the sender put in this batch.
        pages: u32,
    },
    /// No more writes of `key` on this stream.
    Drain(GrantKey),
    /// Receiver's tally for a batch.
    BatchAck(BatchAck),
    /// Drain of `key` confirmed.
    DrainAck(GrantKey),
}

/// Fields of a WRITE frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteFrame<'a> {
    /// Grant the write is made under.
    pub key: GrantKey,
    /// Batch it belongs to.
    pub batch: BatchId,
    /// Destination page.
    pub page: PageId,
    /// Destination page generation the grant names.
    pub generation: Generation,
    /// Valid tokens in the page.
    pub tokens: u32,
    /// xxh3 of `data`, computed by the sender.
    pub checksum: u64,
    /// The page bytes.
    pub data: &'a [u8],
}

/// Receiver's answer to a BATCH_END.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchAck {
    /// Batch acknowledged.
    pub batch: BatchId,
    /// Pages that landed.
    pub written: u32,
    /// Pages dropped by the receiver.
    pub rejected: u32,
    /// Reason of the first drop, if any.
    pub first_reject: Option<WriteError>,
}

/// Wire code of a drop reason (0 = none).
pub fn reject_code(e: Option<WriteError>) -> u8 {
    match e {
        None => 0,
        Some(WriteError::UnknownGrant) => 1,
        Some(WriteError::RevokedGrant) => 2,
        Some(WriteError::WrongPage) => 3,
        Some(WriteError::StaleGeneration) => 4,
        Some(WriteError::DuplicateWrite) => 5,
        Some(WriteError::BadLength) => 6,
        Some(WriteError::TooManyTokens) => 7,
        Some(WriteError::ChecksumMismatch) => 8,
    }
}

/// Drop reason of a wire code ([`reject_code`]'s inverse).
pub fn reject_from_code(c: u8) -> Result<Option<WriteError>, FrameError> {
    Ok(Some(match c {
        0 => return Ok(None),
        1 => WriteError::UnknownGrant,
        2 => WriteError::RevokedGrant,
        3 => WriteError::WrongPage,
        4 => WriteError::StaleGeneration,
        5 => WriteError::DuplicateWrite,
        6 => WriteError::BadLength,
        7 => WriteError::TooManyTokens,
        8 => WriteError::ChecksumMismatch,
        other => return Err(FrameError::BadRejectCode(other)),
    }))
}

/// Parses and validates a header; `max_payload` is checked here, before the caller allocates.
pub fn decode_header(b: &[u8; HEADER_LEN], max_payload: usize) -> Result<Header, FrameError> {
    let magic = [b[0], b[1], b[2], b[3]];
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    if b[4] != VERSION {
        return Err(FrameError::BadVersion(b[4]));
    }
    let frame_type = FrameType::from_u8(b[5]).ok_or(FrameError::UnknownType(b[5]))?;
    let flags = u16::from_le_bytes([b[6], b[7]]);
    let seal = match flags {
        0 => None,
        f => Some(SealMode::from_flag(f).ok_or(FrameError::BadFlags(f))?),
    };
    let wire_len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    let payload_len = match seal {
        None => wire_len,
        Some(_) => wire_len
            .checked_sub(TAG_LEN as u32)
            .ok_or(FrameError::Truncated)?,
    };
    if payload_len as usize > max_payload {
        return Err(FrameError::Oversize {
            len: payload_len as usize,
            max: max_payload,
        });
    }
    let fixed = match frame_type {
        FrameType::Write => None,
        FrameType::BatchEnd => Some(BATCH_END_LEN),
        FrameType::Drain | FrameType::DrainAck => Some(DRAIN_LEN),
        FrameType::BatchAck => Some(BATCH_ACK_LEN),
        FrameType::Hello => Some(CHALLENGE_LEN),
    };
    if let Some(expected) = fixed {
        if payload_len as usize != expected {
            return Err(FrameError::BadLength {
                frame: frame_type,
                len: payload_len as usize,
                expected,
            });
        }
    }
    Ok(Header {
        frame_type,
        payload_len,
        seal,
    })
}

/// The challenge of a HELLO whose header was accepted by [`decode_header`].
pub fn decode_hello(p: &[u8]) -> Result<[u8; CHALLENGE_LEN], FrameError> {
    p.try_into().map_err(|_| FrameError::BadLength {
        frame: FrameType::Hello,
        len: p.len(),
        expected: CHALLENGE_LEN,
    })
}

/// Appends a HELLO carrying `challenge`.
pub fn encode_hello(out: &mut Vec<u8>, challenge: &[u8; CHALLENGE_LEN]) {
    header(out, FrameType::Hello, CHALLENGE_LEN);
    out.extend_from_slice(challenge);
}

/// Marks the frame encoded at the start of `out` (header and payload, no tag yet) as sealed
/// with `mode`: its flags, and a payload length that counts the tag the caller sends after it.
pub fn mark_sealed(out: &mut [u8], mode: SealMode) {
    out[6..8].copy_from_slice(&mode.flag().to_le_bytes());
    let len = u32::from_le_bytes([out[8], out[9], out[10], out[11]]) + TAG_LEN as u32;
    out[8..12].copy_from_slice(&len.to_le_bytes());
}

/// Little-endian field reader over a payload whose length was already checked.
struct Rd<'a>(&'a [u8]);

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        h
    }
    fn key(&mut self) -> GrantKey {
        GrantKey(self.take(16).try_into().expect("16 bytes"))
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().expect("8 bytes"))
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().expect("4 bytes"))
    }
}

/// Decodes a payload whose header was accepted by [`decode_header`].
pub fn decode_payload(h: Header, p: &[u8]) -> Result<Frame<'_>, FrameError> {
    if h.seal.is_some() {
        // The tag is checked and stripped by the connection's seal before this.
        return Err(FrameError::UnexpectedSeal);
    }
    let len = p.len();
    if len != h.payload_len as usize {
        return Err(FrameError::Truncated);
    }
    let mut r = Rd(p);
    Ok(match h.frame_type {
        FrameType::Write => {
            if len < WRITE_FIXED_LEN {
                return Err(FrameError::BadLength {
                    frame: FrameType::Write,
                    len,
                    expected: WRITE_FIXED_LEN,
                });
            }
            let key = r.key();
            let batch = BatchId(r.u64());
            let page = PageId(r.u32());
            let generation = Generation(r.u64());
            let tokens = r.u32();
            let checksum = r.u64();
            let data_len = r.u32() as usize;
            if WRITE_FIXED_LEN + data_len != len {
                return Err(FrameError::BadLength {
                    frame: FrameType::Write,
                    len,
                    expected: WRITE_FIXED_LEN.saturating_add(data_len),
                });
            }
            Frame::Write(WriteFrame {
                key,
                batch,
                page,
                generation,
                tokens,
                checksum,
                data: r.0,
            })
        }
        FrameType::BatchEnd => Frame::BatchEnd {
            key: r.key(),
            batch: BatchId(r.u64()),
            pages: r.u32(),
        },
        FrameType::Drain => Frame::Drain(r.key()),
        FrameType::DrainAck => Frame::DrainAck(r.key()),
        FrameType::BatchAck => Frame::BatchAck(BatchAck {
            batch: BatchId(r.u64()),
            written: r.u32(),
            rejected: r.u32(),
            first_reject: reject_from_code(r.take(1)[0])?,
        }),
        // Read by the sender's connection set-up, never as a frame of the stream.
        FrameType::Hello => return Err(FrameError::WrongDirection(FrameType::Hello)),
    })
}

fn header(out: &mut Vec<u8>, t: FrameType, payload_len: usize) {
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(t as u8);
    out.extend_from_slice(&0u16.to_le_bytes());
    let len = u32::try_from(payload_len).expect("payload fits u32");
    out.extend_from_slice(&len.to_le_bytes());
}

/// Appends the header and fixed fields of a WRITE; the caller sends `w.data` right after, so a
/// page is never copied into a frame buffer.
pub fn encode_write_prefix(out: &mut Vec<u8>, w: &WriteFrame<'_>) {
    header(out, FrameType::Write, WRITE_FIXED_LEN + w.data.len());
    out.extend_from_slice(&w.key.0);
    out.extend_from_slice(&w.batch.0.to_le_bytes());
    out.extend_from_slice(&w.page.0.to_le_bytes());
    out.extend_from_slice(&w.generation.0.to_le_bytes());
    out.extend_from_slice(&w.tokens.to_le_bytes());
    out.extend_from_slice(&w.checksum.to_le_bytes());
    let dl = u32::try_from(w.data.len()).expect("page fits u32");
    out.extend_from_slice(&dl.to_le_bytes());
}

/// Appends a whole frame (page data included) to `out`.
pub fn encode(out: &mut Vec<u8>, f: &Frame<'_>) {
    match f {
        Frame::Write(w) => {
            encode_write_prefix(out, w);
            out.extend_from_slice(w.data);
        }
        Frame::BatchEnd { key, batch, pages } => {
            header(out, FrameType::BatchEnd, BATCH_END_LEN);
            out.extend_from_slice(&key.0);
            out.extend_from_slice(&batch.0.to_le_bytes());
            out.extend_from_slice(&pages.to_le_bytes());
        }
        Frame::Drain(key) => {
            header(out, FrameType::Drain, DRAIN_LEN);
            out.extend_from_slice(&key.0);
        }
        Frame::DrainAck(key) => {
            header(out, FrameType::DrainAck, DRAIN_LEN);
            out.extend_from_slice(&key.0);
        }
        Frame::BatchAck(a) => {
            header(out, FrameType::BatchAck, BATCH_ACK_LEN);
            out.extend_from_slice(&a.batch.0.to_le_bytes());
            out.extend_from_slice(&a.written.to_le_bytes());
            out.extend_from_slice(&a.rejected.to_le_bytes());
            out.push(reject_code(a.first_reject));
        }
    }
}

/// Decodes one complete frame from the front of `buf`; `Ok(None)` when more bytes are needed.
/// Returns the frame and the bytes it used.
pub fn decode_from(
    buf: &[u8],
    max_payload: usize,
) -> Result<Option<(Frame<'_>, usize)>, FrameError> {
    let Some(hb) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let h = decode_header(hb, max_payload)?;
    let end = HEADER_LEN + h.wire_len();
    if buf.len() < end {
        return Ok(None);
    }
    Ok(Some((decode_payload(h, &buf[HEADER_LEN..end])?, end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_frame(data: &[u8]) -> Frame<'_> {
        Frame::Write(WriteFrame {
            key: GrantKey([7; 16]),
            batch: BatchId(3),
            page: PageId(9),
            generation: Generation(11),
            tokens: 4,
            checksum: 0xdead_beef,
            data,
        })
    }

    #[test]
    fn every_frame_round_trips() {
        let data = [1u8, 2, 3, 4, 5];
        let frames = [
            write_frame(&data),
            Frame::BatchEnd {
                key: GrantKey([1; 16]),
                batch: BatchId(2),
                pages: 3,
            },
            Frame::Drain(GrantKey([4; 16])),
            Frame::DrainAck(GrantKey([5; 16])),
            Frame::BatchAck(BatchAck {
                batch: BatchId(6),
                written: 7,
                rejected: 1,
                first_reject: Some(WriteError::RevokedGrant),
            }),
        ];
        for f in &frames {
            let mut buf = Vec::new();
            encode(&mut buf, f);
            let (g, used) = decode_from(&buf, 1 << 20).unwrap().unwrap();
            assert_eq!(&g, f);
            assert_eq!(used, buf.len());
            // Every strict prefix is "need more bytes", never a frame.
            for cut in 0..buf.len() {
                assert!(decode_from(&buf[..cut], 1 << 20).unwrap().is_none());
            }
        }
    }

    #[test]
    fn header_checks_reject_before_allocation() {
        let mut buf = Vec::new();
        encode(&mut buf, &write_frame(&[0; 64]));
        let mut bad = buf.clone();
        bad[0] = b'X';
        assert!(matches!(
            decode_from(&bad, 1 << 20),
            Err(FrameError::BadMagic(_))
        ));
        let mut bad = buf.clone();
        bad[4] = 2;
        assert_eq!(
            decode_from(&bad, 1 << 20).unwrap_err(),
            FrameError::BadVersion(2)
        );
        let mut bad = buf.clone();
        bad[5] = 42;
        assert_eq!(
            decode_from(&bad, 1 << 20).unwrap_err(),
            FrameError::UnknownType(42)
        );
        let mut bad = buf.clone();
        bad[6] = 4;
        assert_eq!(
            decode_from(&bad, 1 << 20).unwrap_err(),
            FrameError::BadFlags(4)
        );
        // A seal flag on a frame read without its connection's seal.
        let mut bad = buf.clone();
        mark_sealed(&mut bad, SealMode::Aead);
        bad.extend_from_slice(&[0; TAG_LEN]);
        assert_eq!(
            decode_from(&bad, 1 << 20).unwrap_err(),
            FrameError::UnexpectedSeal
        );
        assert!(matches!(
            decode_from(&buf, 32),
            Err(FrameError::Oversize { .. })
        ));
        // data_len field disagrees with the payload length.
        let mut bad = buf.clone();
        bad[HEADER_LEN + WRITE_FIXED_LEN - 4] = 63;
        assert!(matches!(
            decode_from(&bad, 1 << 20),
            Err(FrameError::BadLength { .. })
        ));
        // A DRAIN with a wrong fixed length.
        let mut d = Vec::new();
        encode(&mut d, &Frame::Drain(GrantKey([0; 16])));
        d[8] = 15;
        assert!(matches!(
            decode_from(&d, 1 << 20),
            Err(FrameError::BadLength { .. })
        ));
    }
}
