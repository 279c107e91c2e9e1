//! RDMA backend (feature `rdma`, ibverbs through `rdma-sys`).
//!
//! **Experimental:** it builds, and its device-free parts (staging, control messages, window
//! bookkeeping) are tested, but it has never run on a NIC. Until it has, no service selects it:
//! the workers move KV over the TCP backend.
//!
//! Design: the sender RDMA-WRITEs each page of a batch from its registered region into the
//! receiver's *staging* slots for that batch's grant, reachable only through one type-2 memory
//! window bound for a live grant; then it sends a completion message (the batch's WRITE
//! headers) on the TCP control connection. The receiver feeds staged bytes plus headers to the
//! same [`crate::ReceiverSession`] as TCP, so grant, page, generation and checksum checks,
//! drain and counters are shared. Fencing: each window is invalidated (LOCAL_INV) as soon as
//! its batch's completion message arrives, and the staged pages are verified and copied only
//! after the NIC confirmed it (the peer cannot change them between checksum and copy); DRAIN
//! and connection loss invalidate any window still open. A late one-sided write faults at the
//! NIC; a late completion is dropped by the pool as revoked/unknown.
//! Queue pairs connect without rdma_cm: the control connection swaps QP number, PSN, LID and
//! GID (`qp.rs`, `control.rs`).
//!
//! - `verbs.rs`: device, completion queues, registered regions, memory windows, WRITE /
//!   BIND_MW / LOCAL_INV posts, completion polling.
//! - `qp.rs`: RC queue pair, endpoint exchange, INIT -> RTR -> RTS.
//! - `control.rs`: hello and tagged control messages (window request / reply, frames).
//! - `staging.rs`: staging slots per window and the completion path (device-free, tested).
//! - `segment.rs`: one connection's staging region and windows (bind, revoke, complete).
//! - `receiver.rs`: serving one control connection.
//! - `sender.rs`: one opened segment: the RDMA wire of its writer task, its ack reader (the
//!   front, queue, budget and ack routing are shared with TCP: `outbound.rs`, `pending.rs`).
//! - `backend.rs`: [`RdmaBackend`], the RDMA `Transport` of the shared backend skeleton.
//!
//! Status: built and linted with `--features rdma`; without a device `RdmaBackend::new`
//! returns `TransferError::Unsupported` (tested). The device paths (`verbs.rs`, `qp.rs`,
//! `receiver.rs`, `sender.rs`) have never run against a NIC or Soft-RoCE: the development
//! host has neither (no `rdma_rxe` module, no RDMA netlink).

pub mod backend;
pub mod control;
pub mod qp;
mod receiver;
pub mod segment;
mod sender;
pub mod staging;
pub mod verbs;

pub use backend::RdmaBackend;
pub use segment::{RdmaSegment, RemoteWindow};
pub use staging::{StagingTable, WindowSpec};
pub use verbs::{CompletionQueue, Device, Region, Window};
