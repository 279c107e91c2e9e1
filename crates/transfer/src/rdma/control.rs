//! The RDMA backend's control connection (plain TCP): a hello that swaps queue-pair
//! [`Endpoint`]s, then tagged messages. Page bytes never travel here; they are RDMA-written
//! into a window. What does travel here reuses `frame.rs`: the completion message is the
//! batch's WRITE headers (empty data, the staging slot in the `batch` field), then BATCH_END,
//! DRAIN, and the receiver's BATCH_ACK / DRAIN_ACK.
//!
//! ```text
//! hello       "PWRD" version u8 | Endpoint (26 bytes)              both ways, once
//! tag 0       frame.rs frame                                        both ways
//! tag 1       WINDOW_REQ  key[16] batch u64 slots u32               sender -> receiver
//! tag 2       WINDOW      batch u64 addr u64 rkey u32 reject u8     receiver -> sender
//! ```

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::qp::Endpoint;
use crate::frame::{self, BatchId, Frame, FrameError, Header, HEADER_LEN};
use crate::types::{GrantKey, WriteError};

const HELLO_MAGIC: [u8; 4] = *b"PWRD";
const HELLO_VERSION: u8 = 1;
const TAG_FRAME: u8 = 0;
const TAG_WINDOW_REQ: u8 = 1;
const TAG_WINDOW: u8 = 2;
const WINDOW_REQ_LEN: usize = 16 + 8 + 4;
const WINDOW_LEN: usize = 8 + 8 + 4 + 1;

/// The receiver's answer to a window request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowReply {
    /// Batch the window is for.
    pub batch: BatchId,
    /// Remote address of slot 0 (0 when refused).
    pub addr: u64,
    /// The window's rkey (0 when refused).
    pub rkey: u32,
    /// Why no window was bound (the grant is not live, or no staging room).
    pub refused: Option<WriteError>,
}

/// One control message (frames borrow nothing: completion headers carry no data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// A `frame.rs` frame; WRITE frames here carry an empty payload.
    Frame(Frame<'static>),
    /// Sender asks for a window over `slots` staging slots for `key`'s batch.
    WindowReq {
        /// Grant the batch writes under.
        key: GrantKey,
        /// The batch.
        batch: BatchId,
        /// Pages in the batch.
        slots: u32,
    },
    /// Receiver's answer.
    Window(WindowReply),
}

/// Sends this side's hello.
pub async fn write_hello<W: AsyncWrite + Unpin>(w: &mut W, e: &Endpoint) -> std::io::Result<()> {
    let mut b = Vec::with_capacity(5 + Endpoint::LEN);
    b.extend_from_slice(&HELLO_MAGIC);
    b.push(HELLO_VERSION);
    b.extend_from_slice(&e.encode());
    w.write_all(&b).await?;
    w.flush().await
}

/// Reads the peer's hello.
pub async fn read_hello<R: AsyncRead + Unpin>(r: &mut R) -> Result<Endpoint, ControlError> {
    let mut b = [0u8; 5 + Endpoint::LEN];
    r.read_exact(&mut b).await?;
    if b[..4] != HELLO_MAGIC || b[4] != HELLO_VERSION {
        return Err(ControlError::Frame(FrameError::BadMagic([
            b[0], b[1], b[2], b[3],
        ])));
    }
    let e: &[u8; Endpoint::LEN] = b[5..].try_into().expect("endpoint length");
    Ok(Endpoint::decode(e))
}

/// Why the control stream ended.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Transport failure or EOF.
    #[error("control connection: {0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the protocol.
    #[error("malformed control message: {0}")]
    Frame(#[from] FrameError),
}

/// Appends `m` to `out`.
pub fn encode(out: &mut Vec<u8>, m: &Msg) {
    match m {
        Msg::Frame(f) => {
            out.push(TAG_FRAME);
            frame::encode(out, f);
        }
        Msg::WindowReq { key, batch, slots } => {
            out.push(TAG_WINDOW_REQ);
            out.extend_from_slice(&key.0);
            out.extend_from_slice(&batch.0.to_le_bytes());
            out.extend_from_slice(&slots.to_le_bytes());
        }
        Msg::Window(w) => {
            out.push(TAG_WINDOW);
            out.extend_from_slice(&w.batch.0.to_le_bytes());
            out.extend_from_slice(&w.addr.to_le_bytes());
            out.extend_from_slice(&w.rkey.to_le_bytes());
            out.push(frame::reject_code(w.refused));
        }
    }
}

/// Reads one message. Frames may announce at most `max_payload` bytes; control frames carry
/// no page data, so a WRITE with data is malformed.
pub async fn read_msg<R: AsyncRead + Unpin>(
    r: &mut R,
    max_payload: usize,
) -> Result<Msg, ControlError> {
    let mut tag = [0u8; 1];
    r.read_exact(&mut tag).await?;
    match tag[0] {
        TAG_FRAME => {
            let mut h = [0u8; HEADER_LEN];
            r.read_exact(&mut h).await?;
            let h: Header = frame::decode_header(&h, max_payload)?;
            let mut p = vec![0u8; h.payload_len as usize];
            r.read_exact(&mut p).await?;
            Ok(Msg::Frame(owned(frame::decode_payload(h, &p)?)?))
        }
        TAG_WINDOW_REQ => {
            let mut b = [0u8; WINDOW_REQ_LEN];
            r.read_exact(&mut b).await?;
            Ok(Msg::WindowReq {
                key: GrantKey(b[..16].try_into().expect("16 bytes")),
                batch: BatchId(u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"))),
                slots: u32::from_le_bytes(b[24..].try_into().expect("4 bytes")),
            })
        }
        TAG_WINDOW => {
            let mut b = [0u8; WINDOW_LEN];
            r.read_exact(&mut b).await?;
            Ok(Msg::Window(WindowReply {
                batch: BatchId(u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))),
                addr: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
                rkey: u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")),
                refused: frame::reject_from_code(b[20])?,
            }))
        }
        other => Err(ControlError::Frame(FrameError::UnknownType(other))),
    }
}

/// A frame without borrowed data (completion headers are data-free).
fn owned(f: Frame<'_>) -> Result<Frame<'static>, FrameError> {
    Ok(match f {
        Frame::Write(w) => {
            if !w.data.is_empty() {
                return Err(FrameError::BadLength {
                    frame: frame::FrameType::Write,
                    len: w.data.len(),
                    expected: 0,
                });
            }
            Frame::Write(frame::WriteFrame { data: &[], ..w })
        }
        Frame::BatchEnd { key, batch, pages } => Frame::BatchEnd { key, batch, pages },
        Frame::Drain(k) => Frame::Drain(k),
        Frame::BatchAck(a) => Frame::BatchAck(a),
        Frame::DrainAck(k) => Frame::DrainAck(k),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Generation, PageId};

    #[tokio::test]
    async fn messages_round_trip_and_writes_with_data_are_refused() {
        let key = GrantKey([3; 16]);
        let msgs = [
            Msg::WindowReq {
                key,
                batch: BatchId(4),
                slots: 5,
            },
            Msg::Window(WindowReply {
                batch: BatchId(4),
                addr: 0x1000,
                rkey: 77,
                refused: None,
            }),
            Msg::Window(WindowReply {
                batch: BatchId(5),
                addr: 0,
                rkey: 0,
                refused: Some(WriteError::RevokedGrant),
            }),
            Msg::Frame(Frame::Write(frame::WriteFrame {
                key,
                batch: BatchId(1),
                page: PageId(2),
                generation: Generation(3),
                tokens: 4,
                checksum: 5,
                data: &[],
            })),
            Msg::Frame(Frame::Drain(key)),
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            encode(&mut buf, m);
        }
        let mut r = &buf[..];
        for m in &msgs {
            assert_eq!(&read_msg(&mut r, 1024).await.unwrap(), m);
        }
        let mut bad = Vec::new();
        encode(
            &mut bad,
            &Msg::Frame(Frame::Write(frame::WriteFrame {
                key,
                batch: BatchId(1),
                page: PageId(2),
                generation: Generation(3),
                tokens: 4,
                checksum: 5,
                data: &[1, 2],
            })),
        );
        assert!(matches!(
            read_msg(&mut &bad[..], 1024).await,
            Err(ControlError::Frame(FrameError::BadLength { .. }))
        ));
        let e = Endpoint {
            qpn: 1,
            psn: 2,
            lid: 3,
            gid: [4; 16],
        };
        let mut h = Vec::new();
        write_hello(&mut h, &e).await.unwrap();
        assert_eq!(read_hello(&mut &h[..]).await.unwrap(), e);
    }
}
