//! `KvPool`: the shared handle, allocation (local and reserved), and state queries.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::ReserveError;
use crate::free_list::FreeList;
use crate::grant::{GrantRecord, GrantStatus, Registry, WriteGrant};
use crate::ids::{Generation, GrantKey, PageId};
use crate::layout::{KvLayout, PoolConfig};
use crate::metrics::{PoolMetrics, PoolStats};
use crate::page::{Gauges, PageSlot, PageState};
use crate::prefix::PrefixIndex;
use crate::readable::ReadablePages;
use crate::reserved::ReservedPages;
use crate::store::PageStore;
use crate::Owner;
use pagewarden_types::namespace::Namespace;
use pagewarden_types::RequestId;

/// Cheap-to-clone, `Send + Sync` handle to one pool.
#[derive(Clone)]
pub struct KvPool {
    pub(crate) inner: Arc<PoolInner>,
}

pub(crate) struct PoolInner {
    pub(crate) cfg: PoolConfig,
    pub(crate) store: PageStore,
    pub(crate) slots: Box<[PageSlot]>,
    pub(crate) free: FreeList,
    pub(crate) grants: Mutex<Registry>,
    pub(crate) gauges: Gauges,
    pub(crate) metrics: PoolMetrics,
    /// The prefix cache's index. Lock order: this lock, then page metadata locks, then the
    /// grant registry; never the reverse.
    pub(crate) prefix: Mutex<PrefixIndex>,
    /// Cached pages each namespace lost to allocations since the last
    /// [`KvPool::take_reclaimed`] (taken under `prefix`).
    pub(crate) reclaimed: Mutex<HashMap<Namespace, usize>>,
}

impl KvPool {
    /// Allocates the pool's memory (zeroed, mapped lazily) and puts every page on the free list.
    pub fn new(cfg: PoolConfig) -> Self {
        assert!(
            cfg.pages <= u32::MAX as usize,
            "a pool holds at most 2^32 - 1 pages"
        );
        let store = PageStore::new(cfg.layout.page_bytes(), cfg.pages);
        let slots = (0..cfg.pages).map(|_| PageSlot::new()).collect();
        let free = FreeList::new(cfg.pages);
        Self {
            inner: Arc::new(PoolInner {
                cfg,
                store,
                slots,
                free,
                grants: Mutex::new(Registry::new()),
                gauges: Gauges::default(),
                metrics: PoolMetrics::default(),
                prefix: Mutex::new(PrefixIndex::default()),
                reclaimed: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Shape of each page.
    pub fn layout(&self) -> KvLayout {
        self.inner.cfg.layout
    }

    /// Pages in the pool.
    pub fn capacity_pages(&self) -> usize {
        self.inner.cfg.pages
    }

    /// Tokens the whole pool holds (`pages * page_size`).
    pub fn capacity_tokens(&self) -> usize {
        self.inner.cfg.pages * self.inner.cfg.layout.page_size
    }

    /// Pages an allocation can have now: the free ones, and cached prefix pages no request
    /// reads (an allocation evicts those rather than wait, I9).
    pub fn available_pages(&self) -> usize {
        self.inner.free.len() + self.inner.gauges.evictable()
    }

    /// Page counts per lifecycle state.
    pub fn stats(&self) -> PoolStats {
        let [reserved, readable, shared, draining, quarantined] = self.inner.gauges.read();
        PoolStats {
            free: self.inner.free.len(),
            reserved,
            readable,
            shared,
            draining,
            quarantined,
        }
    }

    /// Pages each request holds now (reserved under its grant, or readable by it): a scan of
    /// every page's metadata, for schedulers weighing tenants' shares of the pool.
    pub fn pages_per_request(&self) -> HashMap<RequestId, usize> {
        let mut held = HashMap::new();
        for slot in self.inner.slots.iter() {
            let meta = slot.meta.lock();
            if let (PageState::Reserved { .. } | PageState::Readable, Some(owner)) =
                (meta.state, meta.owner)
            {
                *held.entry(owner).or_insert(0) += 1;
            }
        }
        held
    }

    /// Cached pages each namespace lost to allocations that needed them (I9) since the last
    /// call, so a worker can say whose cache an allocation emptied.
    pub fn take_reclaimed(&self) -> Vec<(Namespace, usize)> {
        self.inner.reclaimed.lock().drain().collect()
    }

    /// Event counters; `.snapshot()` copies them.
    pub fn metrics(&self) -> &PoolMetrics {
        &self.inner.metrics
    }

    /// A page's current state, `None` if out of range. For audits and tests.
    pub fn page_state(&self, page: PageId) -> Option<PageState> {
        self.inner
            .slots
            .get(page.index())
            .map(|s| s.meta.lock().state)
    }

    /// A page's current generation, `None` if out of range.
    pub fn generation(&self, page: PageId) -> Option<Generation> {
        self.inner
            .slots
            .get(page.index())
            .map(|s| Generation(s.generation.load(Ordering::Acquire)))
    }

    /// Local allocation for a sequence this process computes itself (prefill's own pages,
    /// the single-process engine). No remote writer, so no grant: the owner writes through
    /// `&mut`. `len()` starts at 0.
    pub fn allocate(&self, owner: Owner, tokens: usize) -> Result<ReadablePages, ReserveError> {
        let table = self.inner.claim(tokens, &owner, |_| PageState::Readable)?;
        Ok(ReadablePages::new(self.inner.clone(), owner, table, 0))
    }

    /// Remote-write reservation (decode side): pages at fresh generations plus a single-use
    /// write grant for `tokens` tokens.
    pub fn reserve(&self, owner: Owner, tokens: usize) -> Result<ReservedPages, ReserveError> {
        let key = GrantKey::random();
        let table = self
            .inner
            .claim(tokens, &owner, |_| PageState::Reserved { grant: key })?;
        self.inner.grants.lock().insert(
            key,
            GrantRecord {
                pages: table.clone(),
                status: GrantStatus::Live { ended: None },
                progress_at: self.inner.cfg.clock.now(),
            },
        );
        let grant = WriteGrant {
            key,
            owner,
            pages: table,
            tokens,
            page_size: self.inner.cfg.layout.page_size,
            idle_ttl: self.inner.cfg.grant_ttl,
        };
        Ok(ReservedPages::new(self.inner.clone(), grant))
    }

    /// TEST-ONLY: overwrite a page's guard word, as a stray write past the page would.
    #[cfg(any(test, feature = "unsafe-test-switches"))]
    pub fn test_corrupt_guard(&self, page: PageId) {
        let slot = &self.inner.slots[page.index()];
        let _meta = slot.meta.lock();
        let g = self.inner.store.guard(page);
        self.inner.store.set_guard(page, !g);
    }

    /// TEST-ONLY: flip one byte of a page, as memory corruption or an unfenced write would.
    /// Data race if the page is being read: single-threaded tests only.
    #[cfg(any(test, feature = "unsafe-test-switches"))]
    pub fn test_scribble(&self, page: PageId, offset: usize) {
        let slot = &self.inner.slots[page.index()];
        let _meta = slot.meta.lock();
        assert!(offset < self.inner.store.page_bytes());
        // SAFETY: in bounds (asserted); test-only, documented as racy with readers.
        unsafe { *self.inner.store.page_ptr(page).add(offset) ^= 0xff }
    }
}

impl PoolInner {
    /// Takes pages for `tokens` all-or-nothing and moves each from Free to `state(page)`,
    /// bumping its generation. Errors leave every page as it was.
    pub(crate) fn claim(
        &self,
        tokens: usize,
        owner: &Owner,
        state: impl Fn(PageId) -> PageState,
    ) -> Result<Vec<(PageId, Generation)>, ReserveError> {
        if tokens == 0 {
            return Err(ReserveError::ZeroTokens);
        }
        let capacity_tokens = self.cfg.pages * self.cfg.layout.page_size;
        if tokens > capacity_tokens {
            return Err(ReserveError::TooLarge {
                requested_tokens: tokens,
                capacity_tokens,
            });
        }
        let n = self.cfg.layout.pages_for(tokens);
        // Short of free pages, evict unpinned cached prefix pages first (I9: a cached page
        // never makes a live request wait).
        let pages = match self.free.take(n) {
            Ok(pages) => pages,
            Err(free) => {
                self.reclaim(n - free);
                self.free
                    .take(n)
                    .map_err(|free_pages| ReserveError::Exhausted {
                        requested_pages: n,
                        free_pages,
                    })?
            }
        };
        let table = pages
            .into_iter()
            .map(|p| (p, self.claim_page(p, owner, state(p))))
            .collect();
        self.metrics.add(|m| &m.allocations, n);
        Ok(table)
    }

    fn claim_page(&self, page: PageId, owner: &Owner, to: PageState) -> Generation {
        let slot = &self.slots[page.index()];
        let mut meta = slot.meta.lock();
        debug_assert_eq!(
            meta.state,
            PageState::Free,
            "{page} on the free list but not free"
        );
        let old = Generation(slot.generation.load(Ordering::Relaxed));
        // Guard check before reuse: a corrupt guard means something wrote past this page.
        if self.store.guard(page) != self.store.expected_guard(page, old) {
            self.metrics.add(|m| &m.guard_word_failures, 1);
            if !self.cfg.zero_on_release {
                self.store.zero(page);
            }
        }
        let new = Generation(old.0 + 1);
        slot.generation.store(new.0, Ordering::Release);
        self.store
            .set_guard(page, self.store.expected_guard(page, new));
        meta.owner = Some(owner.request);
        meta.written = false;
        meta.tokens = 0;
        meta.landed_checksum = 0;
        self.gauges.transition(&mut meta, to);
        new
    }

    /// Moves a locked page to Free (zeroing if configured). The caller puts it on the free
    /// list after dropping the lock.
    pub(crate) fn free_locked(&self, page: PageId, meta: &mut crate::page::PageMeta) {
        if self.cfg.zero_on_release {
            self.store.zero(page);
        }
        meta.owner = None;
        meta.written = false;
        self.gauges.transition(meta, PageState::Free);
    }

    /// Returns pages already moved to Free to the free list.
    pub(crate) fn put_free(&self, pages: &[PageId]) {
        if pages.is_empty() {
            return;
        }
        self.free.put(pages);
        self.metrics.add(|m| &m.releases, pages.len());
    }
}
