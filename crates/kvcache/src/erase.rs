//! Erasing one namespace from the prefix cache: every cached page of it leaves the index at
//! once, and its bytes are zeroed (generation bumped, page freed) as soon as no request reads
//! it.
//!
//! ```text
//!   Shared{readers: 0} ──erase──▶ zeroed, generation + 1 ──▶ Free            (pages_zeroed)
//!   Shared{readers: n} ──erase──▶ Erased{readers: n} ──last unpin: zeroed, generation + 1──▶ Free
//!                                                                            (pages_deferred)
//! ```
//!
//! A page still pinned by a running request of the namespace is not taken from under it (a
//! pinned page is never released, I10): it is unpublished, so no later lookup can find it,
//! and zeroed when its last reader lets go. A request that looked up its prefix at or before
//! the erasure caches nothing when it finishes (`PrefixIndex::erased_at`), so nothing computed
//! before an erasure is served from the cache after it.
//!
//! The digest is SHA-256 over a domain tag, the namespace and the erased `(page, generation)`
//! pairs sorted by page: a worker's certificate of exactly which cached copies it dropped.

use std::sync::atomic::Ordering;

use pagewarden_types::namespace::Namespace;
use sha2::{Digest, Sha256};

use crate::ids::{Generation, PageId};
use crate::page::PageState;
use crate::pool::{KvPool, PoolInner};

/// What [`KvPool::erase_namespace`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Erasure {
    /// Cached pages (index entries) of the namespace removed from the index.
    pub entries: usize,
    /// Of those, pages zeroed and freed at once (no request read them).
    pub pages_zeroed: usize,
    /// Of those, pages still read by running requests: unpublished now, zeroed and freed when
    /// the last of them unpins.
    pub pages_deferred: usize,
    /// [`erasure_digest`] of the erased pages.
    pub digest: [u8; 32],
}

/// SHA-256 over `pagewarden-erasure-v1\0`, the namespace's 32 bytes, the count of pages
/// (u64, little-endian), then each `(page u32, generation u64)` little-endian, sorted by
/// page. The same erasure of the same cached copies always gives the same digest.
pub fn erasure_digest(namespace: &Namespace, pages: &[(PageId, Generation)]) -> [u8; 32] {
    let mut sorted = pages.to_vec();
    sorted.sort_unstable();
    let mut h = Sha256::new();
    h.update(b"pagewarden-erasure-v1\0");
    h.update(namespace.as_bytes());
    h.update((sorted.len() as u64).to_le_bytes());
    for (page, generation) in sorted {
        h.update(page.0.to_le_bytes());
        h.update(generation.0.to_le_bytes());
    }
    h.finalize().into()
}

/// What erasing did to one page.
enum PageErased {
    /// Unread: zeroed, generation bumped, Free (the caller puts it on the free list).
    Zeroed,
    /// Read by running requests: now Erased, zeroed by the last unpin.
    Deferred,
    /// Not the cached copy the index named (cannot happen while the index and the page agree).
    Stale,
}

impl KvPool {
    /// Removes every cached page of `namespace` from the prefix cache and zeroes it: at once
    /// when no request reads it, else when its last reader unpins (it can no longer be found).
    /// Other namespaces' pages are not touched. Idempotent: a second call finds nothing.
    pub fn erase_namespace(&self, namespace: &Namespace) -> Erasure {
        let inner = &self.inner;
        let mut zeroed = Vec::new();
        let mut deferred = 0;
        let pages = {
            let mut idx = inner.prefix.lock();
            let pages = idx.remove_space(namespace);
            for &(page, generation) in &pages {
                match inner.erase_page(page, generation) {
                    PageErased::Zeroed => zeroed.push(page),
                    PageErased::Deferred => deferred += 1,
                    PageErased::Stale => {}
                }
            }
            pages
        };
        inner.put_free(&zeroed);
        inner.metrics.add(|m| &m.prefix_pages_erased, pages.len());
        Erasure {
            entries: pages.len(),
            pages_zeroed: zeroed.len(),
            pages_deferred: deferred,
            digest: erasure_digest(namespace, &pages),
        }
    }
}

impl PoolInner {
    /// A cached page of an erased namespace. Caller holds the index lock (and has already
    /// taken the page's entry out of it).
    fn erase_page(&self, page: PageId, generation: Generation) -> PageErased {
        let slot = &self.slots[page.index()];
        let mut meta = slot.meta.lock();
        let current = slot.generation.load(Ordering::Relaxed) == generation.0;
        match meta.state {
            PageState::Shared { readers: 0 } if current => {
                self.evict_locked(page, &mut meta);
                PageErased::Zeroed
            }
            PageState::Shared { readers } if current => {
                self.gauges
                    .transition(&mut meta, PageState::Erased { readers });
                PageErased::Deferred
            }
            PageState::Free
            | PageState::Reserved { .. }
            | PageState::Readable
            | PageState::Shared { .. }
            | PageState::Erased { .. }
            | PageState::Draining { .. }
            | PageState::Quarantined { .. } => PageErased::Stale,
        }
    }
}
