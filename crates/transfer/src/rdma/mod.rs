//! RDMA backend (feature `rdma`, ibverbs through `rdma-sys`).
//!
//! Design: the sender RDMA-WRITEs each page of a batch from its registered region into the
//! receiver's *staging* slots for that reservation, reachable only through one type-2 memory
//! window per reservation; then it SENDs a completion message (the batch's WRITE headers). The
//! receiver feeds staged bytes plus headers to the same [`crate::ReceiverSession`] as TCP, so
//! grant, page, generation and checksum checks, drain and counters are shared. Revoke =
//! LOCAL_INV of the window (late one-sided writes fault at the NIC) + closing its staging
//! slots (late completions are dropped by the pool as revoked/unknown).
//!
//! - `verbs.rs`: device, registered regions, memory windows, WRITE / BIND_MW / LOCAL_INV posts.
//! - `staging.rs`: staging slots per reservation and the completion path (device-free, tested).
//! - `segment.rs`: receiver segment tying them together (bind window, revoke, complete).
//!
//! What is NOT done or tested here (no RDMA device, no Soft-RoCE on this host):
//! - queue-pair connection management (rdma_cm address/route resolution, QP state
//!   transitions, exchange of window address + rkey per grant) is not written, so there is no
//!   `TransferBackend` impl for RDMA yet; the TCP backend is the one the services use;
//! - `verbs.rs` is compiled and linted only; none of it has run against a NIC;
//! - `staging.rs` is exercised by unit tests with a plain byte buffer standing in for the
//!   registered region.

pub mod segment;
pub mod staging;
pub mod verbs;

pub use segment::{RdmaSegment, RemoteWindow};
pub use staging::{StagingTable, WindowSpec};
pub use verbs::{Device, Region, Window};
