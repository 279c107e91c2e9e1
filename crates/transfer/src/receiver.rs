//! Sans-IO receiver: turns decoded frames of one ordered stream into checked page writes, drain
//! confirmations and acks. The TCP listener, the RDMA completion path, the in-memory backend and
//! the simulation all drive this one type, so they share every check.
//!
//! Per connection: `Open --frames--> Open --close(reason)--> Closed`. On close, every grant that
//! used this stream and whose DRAIN was never processed is reported to the sink as peer-gone.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::frame::{BatchAck, BatchId, Frame, FrameError, WriteFrame};
use crate::sink::PageSink;
use crate::types::{GrantKey, PageWrite, WriteError};

/// Most batches that may be open (ended by no BATCH_END yet) on one connection.
pub const MAX_OPEN_BATCHES: usize = 4096;

/// Number of distinct [`WriteError`] reasons.
pub const DROP_REASONS: usize = 8;

/// Index of a drop reason in [`CountersSnapshot::dropped`].
pub fn drop_index(e: WriteError) -> usize {
    match e {
        WriteError::UnknownGrant => 0,
        WriteError::RevokedGrant => 1,
        WriteError::WrongPage => 2,
        WriteError::StaleGeneration => 3,
        WriteError::DuplicateWrite => 4,
        WriteError::BadLength => 5,
        WriteError::TooManyTokens => 6,
        WriteError::ChecksumMismatch => 7,
    }
}

/// Receiver counters, shared by all connections of one listener.
#[derive(Debug, Default)]
pub struct ReceiverCounters {
    frames_ok: AtomicU64,
    bytes_ok: AtomicU64,
    dropped: [AtomicU64; DROP_REASONS],
    malformed_closes: AtomicU64,
    drains: AtomicU64,
    peer_gone: AtomicU64,
    refused_connections: AtomicU64,
}

/// A point-in-time copy of [`ReceiverCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    /// WRITE frames whose page landed.
    pub frames_ok: u64,
    /// Page bytes that landed.
    pub bytes_ok: u64,
    /// WRITE frames dropped, by reason (index with [`drop_index`]).
    pub dropped: [u64; DROP_REASONS],
    /// Connections closed because of a malformed frame.
    pub malformed_closes: u64,
    /// DRAIN frames processed.
    pub drains: u64,
    /// Grants reported peer-gone at connection teardown.
    pub peer_gone: u64,
    /// Connections refused before any frame was read (cap, TLS handshake, role).
    pub refused_connections: u64,
}

impl CountersSnapshot {
    /// Dropped frames of one reason.
    pub fn dropped_for(&self, e: WriteError) -> u64 {
        self.dropped[drop_index(e)]
    }

    /// Dropped frames of every reason.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }
}

impl ReceiverCounters {
    /// Current values.
    pub fn snapshot(&self) -> CountersSnapshot {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CountersSnapshot {
            frames_ok: ld(&self.frames_ok),
            bytes_ok: ld(&self.bytes_ok),
            dropped: std::array::from_fn(|i| ld(&self.dropped[i])),
            malformed_closes: ld(&self.malformed_closes),
            drains: ld(&self.drains),
            peer_gone: ld(&self.peer_gone),
            refused_connections: ld(&self.refused_connections),
        }
    }

    /// Counts a connection refused before any frame was read.
    pub(crate) fn refused_connection(&self) {
        Self::bump(&self.refused_connections, 1);
    }

    fn bump(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }
}

/// Why a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// The peer closed cleanly between frames.
    PeerClosed,
    /// The transport failed (reset, I/O error, partition).
    Transport(String),
    /// A frame broke the protocol; the connection is closed and nothing of it was written.
    Malformed(FrameError),
    /// The receiver shut down.
    Shutdown,
}

#[derive(Clone, Copy, Default)]
struct Tally {
    written: u32,
    rejected: u32,
    first_reject: Option<WriteError>,
}

/// Receiver state of one ordered stream.
pub struct ReceiverSession<S: PageSink + ?Sized> {
    sink: Arc<S>,
    counters: Arc<ReceiverCounters>,
    open: HashMap<BatchId, Tally>,
    // First-use order, so teardown reports keys in a deterministic order.
    undrained: Vec<GrantKey>,
    undrained_set: HashSet<GrantKey>,
}

impl<S: PageSink + ?Sized> ReceiverSession<S> {
    /// A session writing into `sink`, counting into `counters`.
    pub fn new(sink: Arc<S>, counters: Arc<ReceiverCounters>) -> Self {
        Self {
            sink,
            counters,
            open: HashMap::new(),
            undrained: Vec::new(),
            undrained_set: HashSet::new(),
        }
    }

    /// Largest payload a frame on this session may announce.
    pub fn max_payload(&self) -> usize {
        crate::frame::WRITE_FIXED_LEN + self.sink.page_bytes()
    }

    /// Processes one frame. `Ok(Some(reply))` must be sent back on the same stream; `Err` means
    /// the stream is malformed and must be closed with [`ReceiverSession::close`].
    pub fn on_frame(&mut self, f: Frame<'_>) -> Result<Option<Frame<'static>>, FrameError> {
        match f {
            Frame::Write(w) => self.on_write(w).map(|()| None),
            Frame::BatchEnd { batch, .. } => {
                let t = self.open.remove(&batch).unwrap_or_default();
                Ok(Some(Frame::BatchAck(BatchAck {
                    batch,
                    written: t.written,
                    rejected: t.rejected,
                    first_reject: t.first_reject,
                })))
            }
            Frame::Drain(key) => {
                // Everything before this frame on the stream has been processed.
                self.sink.mark_drained(key);
                if self.undrained_set.remove(&key) {
                    self.undrained.retain(|k| *k != key);
                }
                ReceiverCounters::bump(&self.counters.drains, 1);
                Ok(Some(Frame::DrainAck(key)))
            }
            Frame::BatchAck(_) => Err(FrameError::WrongDirection(
                crate::frame::FrameType::BatchAck,
            )),
            Frame::DrainAck(_) => Err(FrameError::WrongDirection(
                crate::frame::FrameType::DrainAck,
            )),
        }
    }

    fn on_write(&mut self, w: WriteFrame<'_>) -> Result<(), FrameError> {
        if w.data.len() > self.sink.page_bytes() {
            return Err(FrameError::Oversize {
                len: w.data.len(),
                max: self.sink.page_bytes(),
            });
        }
        if w.page.index() >= self.sink.page_count() {
            return Err(FrameError::UnknownPage(w.page.0));
        }
        if !self.open.contains_key(&w.batch) && self.open.len() >= MAX_OPEN_BATCHES {
            return Err(FrameError::TooManyOpenBatches(MAX_OPEN_BATCHES));
        }
        let res = self.sink.write_page(PageWrite {
            key: w.key,
            page: w.page,
            generation: w.generation,
            tokens: w.tokens,
            data: w.data,
            checksum: w.checksum,
        });
        let t = self.open.entry(w.batch).or_default();
        match res {
            Ok(()) => {
                t.written += 1;
                ReceiverCounters::bump(&self.counters.frames_ok, 1);
                ReceiverCounters::bump(&self.counters.bytes_ok, w.data.len() as u64);
            }
            Err(e) => {
                t.rejected += 1;
                t.first_reject.get_or_insert(e);
                ReceiverCounters::bump(&self.counters.dropped[drop_index(e)], 1);
                tracing::debug!(key = %w.key, page = %w.page, reason = %e, "write dropped");
            }
        }
        // A key the pool has never heard of owns nothing here; every other key may own pages
        // that wait for this stream's drain.
        if res != Err(WriteError::UnknownGrant) && self.undrained_set.insert(w.key) {
            self.undrained.push(w.key);
        }
        Ok(())
    }

    /// Ends the session. Call only once no frame of this stream can still be processed.
    pub fn close(self, reason: &CloseReason) {
        match reason {
            CloseReason::Malformed(e) => {
                ReceiverCounters::bump(&self.counters.malformed_closes, 1);
                tracing::warn!(reason = %e, "closing connection: malformed frame");
            }
            CloseReason::Transport(e) => tracing::info!(error = %e, "connection lost"),
            CloseReason::PeerClosed | CloseReason::Shutdown => {}
        }
        for key in self.undrained {
            ReceiverCounters::bump(&self.counters.peer_gone, 1);
            self.sink.peer_gone(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::BatchId;
    use crate::sink::MemorySink;
    use crate::types::{page_checksum, Generation, PageId};

    fn write(key: GrantKey, page: u32, data: &[u8]) -> Frame<'_> {
        Frame::Write(WriteFrame {
            key,
            batch: BatchId(1),
            page: PageId(page),
            generation: Generation(1),
            tokens: 1,
            checksum: page_checksum(data),
            data,
        })
    }

    #[test]
    fn drain_and_teardown_report_each_grant_once() {
        let sink = Arc::new(MemorySink::new(8, 4));
        let (a, b) = (GrantKey([1; 16]), GrantKey([2; 16]));
        sink.grant(a, vec![(PageId(0), Generation(1))]);
        sink.grant(b, vec![(PageId(1), Generation(1))]);
        let counters = Arc::new(ReceiverCounters::default());
        let mut s = ReceiverSession::new(sink.clone(), counters.clone());
        assert_eq!(s.on_frame(write(a, 0, &[1; 4])).unwrap(), None);
        assert_eq!(s.on_frame(write(b, 1, &[2; 4])).unwrap(), None);
        // Unknown key: dropped, counted, and not reported at teardown.
        assert_eq!(
            s.on_frame(write(GrantKey([9; 16]), 2, &[3; 4])).unwrap(),
            None
        );
        assert_eq!(
            s.on_frame(Frame::Drain(a)).unwrap(),
            Some(Frame::DrainAck(a))
        );
        let ack = s
            .on_frame(Frame::BatchEnd {
                key: a,
                batch: BatchId(1),
                pages: 3,
            })
            .unwrap();
        assert_eq!(
            ack,
            Some(Frame::BatchAck(BatchAck {
                batch: BatchId(1),
                written: 2,
                rejected: 1,
                first_reject: Some(WriteError::UnknownGrant),
            }))
        );
        s.close(&CloseReason::Transport("reset".into()));
        assert_eq!(sink.drained(), vec![a]);
        assert_eq!(
            sink.gone(),
            vec![b],
            "only the undrained grant is peer-gone"
        );
        let c = counters.snapshot();
        assert_eq!(
            (c.frames_ok, c.dropped_total(), c.drains, c.peer_gone),
            (2, 1, 1, 1)
        );
    }

    #[test]
    fn oversize_pages_unknown_pages_and_reversed_frames_are_malformed() {
        let sink = Arc::new(MemorySink::new(8, 4));
        let counters = Arc::new(ReceiverCounters::default());
        let mut s = ReceiverSession::new(sink.clone(), counters.clone());
        let k = GrantKey([1; 16]);
        assert!(matches!(
            s.on_frame(write(k, 0, &[0; 5])),
            Err(FrameError::Oversize { .. })
        ));
        assert_eq!(
            s.on_frame(write(k, 8, &[0; 4])),
            Err(FrameError::UnknownPage(8))
        );
        assert!(matches!(
            s.on_frame(Frame::DrainAck(k)),
            Err(FrameError::WrongDirection(_))
        ));
        s.close(&CloseReason::Malformed(FrameError::Truncated));
        assert_eq!(counters.snapshot().malformed_closes, 1);
        assert_eq!(sink.written(), 0);
    }
}
