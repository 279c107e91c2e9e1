//! The engine API every backend implements (Mooncake's shape: register a segment, open a
//! peer's segment, submit a batch of writes, await or poll completion), plus grants: every
//! batch writes under one grant key, and `drain`/`cancel` end a grant on the wire.
//!
//! Sender-side life of a grant on one segment:
//! `submit_batch* --> drain (after the last batch completed) --> DrainAcked`
//! `submit_batch* --> cancel (stop sending unsent pages) --> DrainAcked`
//! A lost connection fails every pending batch and drain, and is broadcast as a [`FailureEvent`].

use std::future::Future;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use thiserror::Error;
use tokio::sync::broadcast;

use crate::batch::BatchHandle;
use crate::sink::PageSink;
use crate::types::{page_checksum, Generation, GrantKey, PageId};

/// A sender's handle to an opened peer segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentId(pub u64);

/// How peers reach a registered segment (for TCP, `host:port`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SegmentDesc {
    /// Backend-specific address.
    pub addr: String,
}

/// One page to write into a peer's granted page.
#[derive(Clone, Debug)]
pub struct PageWriteReq {
    /// Destination page named by the grant.
    pub dst_page: PageId,
    /// Destination generation named by the grant.
    pub dst_generation: Generation,
    /// Valid tokens in this page.
    pub tokens: u32,
    /// The whole page's bytes.
    pub src: Bytes,
}

/// Limits a sender enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most page bytes submitted but not yet acknowledged, per segment.
    pub max_inflight_bytes: usize,
    /// Most pages in one batch.
    pub max_batch_pages: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_inflight_bytes: 64 << 20,
            max_batch_pages: 1024,
        }
    }
}

/// Why an engine call failed.
#[derive(Debug, Error)]
pub enum TransferError {
    /// No open segment with this id.
    #[error("segment {0:?} is not open")]
    UnknownSegment(SegmentId),
    /// No registered segment at this address.
    #[error("no segment registered at {0}")]
    UnknownPeer(String),
    /// A batch must hold at least one page.
    #[error("empty batch")]
    EmptyBatch,
    /// More pages than `max_batch_pages`.
    #[error("batch of {pages} pages exceeds the cap of {max}")]
    BatchTooLarge {
        /// Pages submitted.
        pages: usize,
        /// The cap.
        max: usize,
    },
    /// The batch alone exceeds the in-flight byte budget, so it could never be sent.
    #[error("batch of {bytes} bytes exceeds the in-flight budget of {max}")]
    InflightTooLarge {
        /// Bytes submitted.
        bytes: usize,
        /// The budget.
        max: usize,
    },
    /// Connecting or binding failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The connection to the peer is gone; nothing more can be sent on it.
    #[error("connection to the peer lost: {0}")]
    ConnectionLost(String),
    /// The backend cannot do this (for example an RDMA build on a host without a device).
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
}

/// A connection-level failure, broadcast to subscribers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureEvent {
    /// The segment whose connection failed.
    pub segment: SegmentId,
    /// What happened.
    pub reason: String,
}

/// One page of a validated batch. Its checksum is computed once, by whoever needs it first:
/// the TCP writer just before it sends the page (the bytes then go to the kernel while hot in
/// cache), its hash-ahead helper on hosts with cores to spare (`tcp/hash_ahead.rs`), or the
/// caller asking [`crate::BatchHandle::sent_pages`] for the manifest. Never twice.
#[derive(Clone, Debug)]
pub struct OutPage {
    /// Destination page.
    pub page: PageId,
    /// Destination generation.
    pub generation: Generation,
    /// Valid tokens.
    pub tokens: u32,
    /// Page bytes.
    pub src: Bytes,
    sum: Arc<OnceLock<u64>>,
}

impl OutPage {
    /// A page to send (checksum not yet computed).
    pub fn new(page: PageId, generation: Generation, tokens: u32, src: Bytes) -> Self {
        Self {
            page,
            generation,
            tokens,
            src,
            sum: Arc::default(),
        }
    }

    /// xxh3 of `src`, computed on first use and shared by every clone of this page.
    pub fn checksum(&self) -> u64 {
        *self.sum.get_or_init(|| page_checksum(&self.src))
    }

    /// The checksum if someone already computed it.
    pub fn checksum_if_computed(&self) -> Option<u64> {
        self.sum.get().copied()
    }
}

/// Checks a batch against the caps (shared by all backends); checksums are computed lazily.
pub fn prepare_batch(
    cfg: &EngineConfig,
    reqs: Vec<PageWriteReq>,
) -> Result<Vec<OutPage>, TransferError> {
    if reqs.is_empty() {
        return Err(TransferError::EmptyBatch);
    }
    if reqs.len() > cfg.max_batch_pages {
        return Err(TransferError::BatchTooLarge {
            pages: reqs.len(),
            max: cfg.max_batch_pages,
        });
    }
    let bytes: usize = reqs.iter().map(|r| r.src.len()).sum();
    if bytes > cfg.max_inflight_bytes {
        return Err(TransferError::InflightTooLarge {
            bytes,
            max: cfg.max_inflight_bytes,
        });
    }
    Ok(reqs
        .into_iter()
        .map(|r| OutPage::new(r.dst_page, r.dst_generation, r.tokens, r.src))
        .collect())
}

/// A transfer backend: both the receiving side (`register_segment`) and the sending side.
pub trait TransferBackend: Send + Sync {
    /// Publishes a local page sink (the decode pool) as a segment peers can open.
    fn register_segment(
        &self,
        sink: Arc<dyn PageSink>,
    ) -> impl Future<Output = Result<SegmentDesc, TransferError>> + Send;

    /// Opens a peer's segment for writing.
    fn open_segment(
        &self,
        desc: &SegmentDesc,
    ) -> impl Future<Output = Result<SegmentId, TransferError>> + Send;

    /// Queues a batch of page writes under `key`; returns at once. Pages of one segment are
    /// sent in submission order.
    fn submit_batch(
        &self,
        seg: SegmentId,
        key: GrantKey,
        reqs: Vec<PageWriteReq>,
    ) -> Result<BatchHandle, TransferError>;

    /// After the last batch of `key`: sends DRAIN and waits until the receiver confirms that no
    /// write of `key` is still in flight.
    fn drain(
        &self,
        seg: SegmentId,
        key: GrantKey,
    ) -> impl Future<Output = Result<(), TransferError>> + Send;

    /// Cancels `key`: pages not yet sent are not sent (their batches end `Cancelled`), then
    /// drains as [`TransferBackend::drain`] does.
    fn cancel(
        &self,
        seg: SegmentId,
        key: GrantKey,
    ) -> impl Future<Output = Result<(), TransferError>> + Send;

    /// Connection failures, as they happen.
    fn subscribe_failures(&self) -> broadcast::Receiver<FailureEvent>;

    /// Closes a segment: pending batches fail, the receiver sees the connection end.
    fn close_segment(&self, seg: SegmentId);

    /// Whether `seg` is open and its connection has not ended (a peer that restarted closed
    /// it): a pooled segment is checked before a new grant uses it.
    fn segment_open(&self, seg: SegmentId) -> bool;
}
