//! Mooncake-style KV page transfer with write grants, per-page checksums and fencing.
//!
//! A decode worker registers its pool as a segment; a prefill worker opens it, submits
//! batches of page writes under the grant the decode worker issued, awaits or polls their
//! completion, and ends the grant with a drain (or a cancel). The receiver hands every write to
//! the pool, which checks grant, page, generation, length and checksum before writing.
//!
//! The workers move KV over the TCP backend. The RDMA backend is experimental until it has run
//! on a real NIC: it builds and its device-free parts are tested, but its device paths have run
//! on no RDMA device, not even Soft-RoCE (rxe).
//!
//! - `types.rs`: page, generation, grant and checksum types re-used from `pagewarden-kvcache`.
//! - `frame.rs`: the versioned binary wire format, with lengths checked before allocation.
//! - `receiver.rs`: sans-IO receiver session (checks via the sink, drain, acks, counters).
//! - `sink.rs`: the `PageSink` seam and an in-memory test sink.
//! - `pool_sink.rs`: `PageSink` for `KvPool`.
//! - `engine.rs`: the `TransferBackend` API, its request, config and error types.
//! - `batch.rs`: batch completion handles (poll / await).
//! - `manifest.rs`: commit manifest builder (tokens, per-page checksums, digest).
//! - `pending.rs`: sender-side pending batches and drains of one connection, ack routing.
//! - `outbound.rs`: sender front (submit, drain, cancel), in-flight budget and writer loop of
//!   one connection over a transport's `Wire` (TCP and RDMA).
//! - `backend.rs`: backend skeleton over a `Transport` (segment table, TransferBackend impl).
//! - `memory.rs`: in-memory backend for unit tests (with a tamper hook).
//! - `seal.rs`: sealed frames (per-grant secret, AES-GCM tag per frame, page bytes optionally
//!   encrypted), the alternative to TLS on the transfer stream.
//! - `tcp/`: the default TCP backend (listener and sender), under mutual TLS or sealed frames.
//! - `rdma/`: RDMA backend over ibverbs (feature `rdma`, experimental; without a device it
//!   reports `Unsupported`).
#![warn(missing_docs)]

mod backend;
pub mod batch;
pub mod engine;
pub mod frame;
pub mod manifest;
pub mod memory;
mod outbound;
mod pending;
mod pool_sink;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod receiver;
pub mod seal;
pub mod sink;
pub mod tcp;
pub mod types;

pub use batch::{BatchFailure, BatchHandle, BatchStatus};
pub use engine::{
    EngineConfig, FailureEvent, PageWriteReq, SegmentDesc, SegmentId, TransferBackend,
    TransferError,
};
pub use manifest::ManifestBuilder;
pub use memory::MemoryBackend;
pub use receiver::{CountersSnapshot, ReceiverCounters, ReceiverSession};
pub use seal::{GrantSeal, SealMaster, SealMode, SealPolicy};
pub use sink::{MemorySink, PageSink};
pub use tcp::{
    Authorize, ClientTls, ListenOptions, OnRefused, Refused, RefusedReason, ServerTls, TcpBackend,
    TcpReceiver,
};
