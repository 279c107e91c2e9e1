//! The paged KV pool: fixed-size pages of K and V for all layers, whose types make reading
//! another request's KV unrepresentable.
//!
//! Module map:
//! - `ids`: `PageId`, `Generation`, `GrantKey` newtypes.
//! - `layout`: `KvLayout` (page shape), `PoolConfig`, test-only `Defenses`.
//! - `error`: `ReserveError`, `WriteError`, `CommitError`, `ReadError`.
//! - `metrics`: `PoolMetrics` counters, `PoolMetricsSnapshot`, `PoolStats`.
//! - `page`: `PageState` (the lifecycle below) and per-page metadata.
//! - `store`: the page bytes (one aligned buffer) and guard words.
//! - `free_list`: the free list (mutex over a stack; loom-tested).
//! - `sync`: std/loom shim for the free list's mutex.
//! - `grant`: `WriteGrant`, `CommitManifest`, `PageWrite`, checksums, the grant registry.
//! - `pool`: `KvPool`: construction, `allocate`, `reserve`, stats.
//! - `receive`: `KvPool::write_page`, the grant fence.
//! - `reserved`: `ReservedPages` and `commit` (I2).
//! - `readable`: `ReadablePages`, generation-checked reads (I1), RAII release.
//! - `release`: a grant's end without a commit: revoke, `mark_drained`, `peer_gone`,
//!   `sweep_expired` (I4), all reading the one grant record.
//! - `prefix`: the prefix cache: hash-chained index per namespace, publish, pin, LRU
//!   eviction within quotas, reclaim under allocation pressure (I10).
//! - `erase`: `KvPool::erase_namespace`: one namespace's cached pages out of the index and
//!   zeroed (at once, or at their last reader's unpin), with a digest of what was erased.
//! - `shared`: `SharedPages`, read-only pins on cached pages, generation-checked reads, and
//!   `PinnedRun`s: which request published each run of them.
//! - `clock`: the pool's clock (`WallClock`; `ManualClock` for tests).
//! - `checks`: which defenses run (constant `true` outside tests).
//!
//! # Page lifecycle
//!
//! ```text
//!              allocate (local, no grant)
//!       ┌──────────────────────────────────────────────┐
//!       │                                              ▼
//!     Free ──reserve──▶ Reserved(grant) ──commit ok──▶ Readable ──drop──▶ Free
//!       ▲  ▲                  │                            │
//!       │  │                  │                  publish_prefix (full prompt pages)
//!       │  │                  │                            ▼
//!       │  └─evict: zero, generation + 1── Shared{readers} (pin / unpin; evict at 0 only)
//!       │  │                                          │ erase_namespace with readers > 0
//!       │  └─last unpin: zero, generation + 1── Erased{readers} (no new pins)
//!       │                     │
//!       │        abort / drop / commit err (revoke: writes fenced)
//!       │                     ▼
//!       ├──mark_drained── Draining(grant) ──sweep_expired (drain_timeout)──▶ Quarantined(grant)
//!       │  (or at once:                                                          │
//!       │   stream ended)                                                        │
//!       └──────────────────────────peer_gone / mark_drained──────────────────────┘
//! ```
//!
//! Every move to Reserved or Readable bumps the page's `Generation`, and so does eviction
//! from Shared. A page reaches Free only when no write can still land on it and nobody reads
//! it: Readable pages have no grant; Draining pages wait for the transfer layer's drain
//! confirmation; Quarantined ones for their peer to be gone; Shared and Erased ones for their last
//! reader (a Shared page is never written: see `prefix`). A drain or a lost peer reported
//! while the grant is still live is kept in its record, so the grant's end frees its pages at
//! once; so does a pool that takes revocation as the drain (`PoolConfig::revocation_drains`).
//!
//! # Safety model
//!
//! Page bytes live in one buffer reached through raw pointers, with no global lock. Access is
//! safe because each page has exactly one owner at a time: a `ReadablePages` (reads through
//! `&self`, writes through `&mut self`), or a writer holding the page's metadata lock while the
//! page is Reserved to its grant, or the pool itself while freeing under that lock.
//!
//! # Test-only switches
//!
//! The `unsafe-test-switches` feature (test use only) adds `PoolConfig::defenses` to switch
//! single checks off, plus fault-injection hooks (`test_*`). Without it the checks are
//! unconditional.
//!
//! Loom test of the free list: `RUSTFLAGS="--cfg pagewarden_loom" cargo test -p
//! pagewarden-kvcache --test loom --release`. (Not `--cfg loom`: that also switches tokio,
//! which `pagewarden-common` pulls in, to its loom mode, where `tokio::net` does not exist.)
#![warn(missing_docs)]

mod checks;
mod clock;
mod erase;
mod error;
mod free_list;
mod grant;
mod ids;
mod layout;
mod metrics;
mod page;
mod pool;
mod prefix;
mod readable;
mod receive;
mod release;
mod reserved;
mod shared;
mod store;
mod sync;

pub use clock::{Clock, ManualClock, WallClock};
pub use erase::{erasure_digest, Erasure};
pub use error::{CommitError, ReadError, ReserveError, WriteError};
pub use free_list::FreeList;
pub use grant::{manifest_digest, page_checksum, CommitManifest, PageWrite, WriteGrant};
pub use half::f16;
pub use ids::{Generation, GrantKey, PageId};
#[cfg(any(test, feature = "unsafe-test-switches"))]
pub use layout::Defenses;
pub use layout::{KvLayout, PoolConfig, DEFAULT_PAGE_SIZE};
pub use metrics::{PoolMetrics, PoolMetricsSnapshot, PoolStats};
pub use page::PageState;
pub use pagewarden_types::namespace::{Namespace, NamespaceSecret, Placement};
pub use pagewarden_types::{RequestId, TenantId};
pub use pool::KvPool;
pub use prefix::{PrefixHash, Published};
pub use readable::ReadablePages;
pub use reserved::ReservedPages;
pub use shared::{PinnedRun, SharedPages};

/// Who owns an allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The request the pages hold KV for.
    pub request: RequestId,
    /// The tenant that made the request.
    pub tenant: TenantId,
}
