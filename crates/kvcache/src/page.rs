//! One page's lifecycle state (`PageState`) and the metadata kept beside its bytes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::ids::GrantKey;
use pagewarden_types::RequestId;

/// Where a page is in its lifecycle (see the crate docs for the diagram). Exactly one state
/// per page, held under the page's metadata lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageState {
    /// On the free list; owned by nobody.
    Free,
    /// Allocated to a reservation; only writes under `grant` may land.
    Reserved {
        /// The live grant the page is reserved to.
        grant: GrantKey,
    },
    /// Owned by a `ReadablePages`; readable by its owner only.
    Readable,
    /// In the prefix cache, bound to one namespace: read-only, never written again. `readers`
    /// `SharedPages` pin it; only at 0 may it be evicted (zeroed, generation bumped, freed).
    Shared {
        /// Pins held on the page right now.
        readers: u32,
    },
    /// Was Shared; its namespace was erased (`KvPool::erase_namespace`) while `readers`
    /// requests still held pins. Out of the index, so no new pin can be taken; still
    /// read-only for those readers. The last unpin zeroes it, bumps its generation and frees
    /// it.
    Erased {
        /// Pins still held on the page (at least 1).
        readers: u32,
    },
    /// `grant` was revoked; waiting until no write of it can still land.
    Draining {
        /// The revoked grant.
        grant: GrantKey,
    },
    /// The drain of `grant` was never confirmed; held until its peer is declared gone.
    Quarantined {
        /// The revoked grant.
        grant: GrantKey,
    },
}

/// Metadata of one page, under its lock. Never stored inside the page's bytes.
#[derive(Debug)]
pub(crate) struct PageMeta {
    pub(crate) state: PageState,
    pub(crate) owner: Option<RequestId>,
    /// Whether a write under the current grant has landed.
    pub(crate) written: bool,
    /// Tokens that write claimed.
    pub(crate) tokens: u32,
    /// xxh3 of the bytes that landed.
    pub(crate) landed_checksum: u64,
}

/// A page's metadata lock plus its generation, readable without the lock (hot path).
#[derive(Debug)]
pub(crate) struct PageSlot {
    /// Current generation; written only under `meta`'s lock, when the page is allocated.
    pub(crate) generation: AtomicU64,
    pub(crate) meta: Mutex<PageMeta>,
}

impl PageSlot {
    pub(crate) fn new() -> Self {
        Self {
            generation: AtomicU64::new(0),
            meta: Mutex::new(PageMeta {
                state: PageState::Free,
                owner: None,
                written: false,
                tokens: 0,
                landed_checksum: 0,
            }),
        }
    }
}

/// Page counts per non-free state, kept in step with every transition.
#[derive(Debug, Default)]
pub(crate) struct Gauges {
    reserved: AtomicUsize,
    readable: AtomicUsize,
    shared: AtomicUsize,
    /// Of the shared pages, those with readers (not evictable).
    pinned: AtomicUsize,
    draining: AtomicUsize,
    quarantined: AtomicUsize,
}

impl Gauges {
    fn counter(&self, s: PageState) -> Option<&AtomicUsize> {
        match s {
            PageState::Free => None,
            PageState::Reserved { .. } => Some(&self.reserved),
            PageState::Readable => Some(&self.readable),
            // Erased pages are still shared pages being read; they count as pinned below.
            PageState::Shared { .. } | PageState::Erased { .. } => Some(&self.shared),
            PageState::Draining { .. } => Some(&self.draining),
            PageState::Quarantined { .. } => Some(&self.quarantined),
        }
    }

    /// Moves `meta` to `to`, keeping the gauges in step. Caller holds the page's lock.
    pub(crate) fn transition(&self, meta: &mut PageMeta, to: PageState) {
        if let Some(c) = self.counter(meta.state) {
            c.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(c) = self.counter(to) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let pinned = |s: PageState| match s {
            PageState::Shared { readers } => readers > 0,
            PageState::Erased { .. } => true,
            PageState::Free
            | PageState::Reserved { .. }
            | PageState::Readable
            | PageState::Draining { .. }
            | PageState::Quarantined { .. } => false,
        };
        match (pinned(meta.state), pinned(to)) {
            (true, false) => {
                self.pinned.fetch_sub(1, Ordering::Relaxed);
            }
            (false, true) => {
                self.pinned.fetch_add(1, Ordering::Relaxed);
            }
            (true, true) | (false, false) => {}
        }
        meta.state = to;
    }

    /// Shared pages without readers: the prefix cache gives them up when an allocation needs
    /// them.
    pub(crate) fn evictable(&self) -> usize {
        self.shared
            .load(Ordering::Relaxed)
            .saturating_sub(self.pinned.load(Ordering::Relaxed))
    }

    /// (reserved, readable, shared, draining, quarantined).
    pub(crate) fn read(&self) -> [usize; 5] {
        [
            self.reserved.load(Ordering::Relaxed),
            self.readable.load(Ordering::Relaxed),
            self.shared.load(Ordering::Relaxed),
            self.draining.load(Ordering::Relaxed),
            self.quarantined.load(Ordering::Relaxed),
        ]
    }
}
