//! The prefix cache: full prompt pages of finished requests stay in the pool, read-only, so a
//! later request of the same namespace attends over them instead of recomputing them.
//!
//! # Design
//!
//! A cached page is keyed by a hash chain: `PrefixHash::next(namespace, parent, tokens)` is
//! SHA-256 over the namespace, the parent page's hash (none for the first page) and the
//! page's `page_size` token ids, so a hash names a whole prefix, not one page. The index keeps
//! one map per namespace ([`Namespace`], derived by the server from the tenant, never from
//! the client): a lookup under namespace B walks B's map only, so a page cached under A can
//! never be returned to B, whatever the tokens (I10). Each entry also keeps its parent hash
//! and its token ids and a lookup compares them, so even a hash collision is only a miss.
//!
//! The API, in the order prefill will use it:
//! - (a) [`KvPool::cached_prefix_tokens`]: how many leading tokens are cached (routing,
//!   scheduling); pins nothing.
//! - (b) [`KvPool::pin_prefix`]: pins the longest cached chain of full pages as
//!   [`SharedPages`], read-only inputs to attention. Lookup and pin are one step under the
//!   index lock, so nothing is evicted between them; each pin also takes the page's producer
//!   (the request that published it), so the pins can say whose computation they reuse.
//! - (c) [`ReadablePages::publish_prefix`]: a finished request hands over the pages it
//!   computed after its pinned prefix; its full prompt pages not yet cached become Shared,
//!   chained after that prefix, each recording that request as its producer, and the rest
//!   (partial last page, generated tokens, pages another request cached first) are freed as
//!   on drop.
//! - (d) dropping [`SharedPages`] releases its pins.
//!
//! # Page states
//!
//! ```text
//!   Readable ──publish──▶ Shared{readers: 0} ◀──pin / unpin──▶ Shared{readers: n > 0}
//!                               │
//!                               └──evict: zero, generation + 1──▶ Free
//! ```
//!
//! # Invariants kept
//!
//! - A Shared page is never written: the only write paths are `write_page` (needs Reserved
//!   under a live grant) and `ReadablePages::kv_row_mut` (the publisher's `ReadablePages` was
//!   consumed by `publish_prefix`); `SharedPages` offers reads only.
//! - A page with readers is never released, evicted or reused: eviction and pinning both run
//!   under the index lock and the page's lock, and eviction requires `readers == 0`.
//! - Generations are checked on every read (I1): `SharedPages` presents `(page, generation)`
//!   like `ReadablePages`, and a pin is taken only at the generation the entry recorded.
//! - An evicted page is zeroed and its generation bumped at once, so no byte of it reaches
//!   its next owner and every `(page, generation)` naming the cached copy is stale.
//! - Eviction is LRU within a namespace's quota (`PoolConfig::prefix_pages_per_namespace`):
//!   publishing never evicts another namespace's pages. A chain is stamped deepest-oldest, so
//!   leaves go before the prefixes they extend. The one cross-namespace eviction is
//!   `reclaim`, when an allocation finds too few free pages: then the oldest unpinned pages of
//!   any namespace go, because a cached page must never make a live request wait (I9).
//!
//! Lock order: the index lock, then page metadata locks, then the grant registry.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pagewarden_types::namespace::Namespace;
use pagewarden_types::RequestId;
use sha2::{Digest, Sha256};

use crate::ids::{Generation, PageId};
use crate::page::{PageMeta, PageState};
use crate::pool::{KvPool, PoolInner};
use crate::readable::ReadablePages;
use crate::shared::SharedPages;

/// Hash of a prefix of whole pages within one namespace: the last link of its hash chain.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrefixHash(pub [u8; 32]);

impl PrefixHash {
    /// The hash of the page holding `tokens` after the prefix `parent` (none: the first page).
    pub fn next(namespace: &Namespace, parent: Option<&PrefixHash>, tokens: &[u32]) -> Self {
        let mut h = Sha256::new();
        h.update(b"pagewarden-prefix-v1\0");
        h.update(namespace.as_bytes());
        match parent {
            Some(p) => {
                h.update([1u8]);
                h.update(p.0);
            }
            None => h.update([0u8]),
        }
        h.update((tokens.len() as u32).to_le_bytes());
        for t in tokens {
            h.update(t.to_le_bytes());
        }
        Self(h.finalize().into())
    }

    /// The hashes of every full page of `tokens`, in order (`tokens.len() / page_size`).
    pub fn chain(namespace: &Namespace, tokens: &[u32], page_size: usize) -> Vec<Self> {
        let mut out: Vec<Self> = Vec::with_capacity(tokens.len() / page_size);
        for chunk in tokens.chunks_exact(page_size) {
            let next = Self::next(namespace, out.last(), chunk);
            out.push(next);
        }
        out
    }
}

impl std::fmt::Debug for PrefixHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrefixHash(")?;
        self.0[..4].iter().try_for_each(|b| write!(f, "{b:02x}"))?;
        f.write_str("…)")
    }
}

/// What `publish_prefix` did with a request's pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// Full prompt pages newly cached.
    pub cached: usize,
    /// Full prompt pages whose prefix was already cached (their copy was freed).
    pub already_cached: usize,
    /// Pages of the namespace evicted to stay within its quota.
    pub evicted: usize,
    /// Pages freed (not cached, including `already_cached`).
    pub freed: usize,
}

/// One cached page.
#[derive(Debug)]
struct Entry {
    page: PageId,
    /// The generation the page had when it was cached; a pin presents exactly this.
    generation: Generation,
    parent: Option<PrefixHash>,
    tokens: Box<[u32]>,
    /// The request whose `publish_prefix` cached the page (what a pin reports as its origin).
    producer: RequestId,
    /// Position in the namespace's LRU order (larger: used more recently).
    stamp: u64,
}

/// The cached pages of one namespace.
#[derive(Debug, Default)]
struct Space {
    entries: HashMap<PrefixHash, Entry>,
    lru: BTreeMap<u64, PrefixHash>,
}

impl Space {
    /// The entries of the longest cached chain of full pages of `tokens`, in order.
    fn walk(&self, ns: &Namespace, tokens: &[u32], page_size: usize) -> Vec<PrefixHash> {
        let mut out: Vec<PrefixHash> = Vec::new();
        for chunk in tokens.chunks_exact(page_size) {
            let parent = out.last().copied();
            let h = PrefixHash::next(ns, parent.as_ref(), chunk);
            match self.entries.get(&h) {
                Some(e) if e.parent == parent && *e.tokens == *chunk => out.push(h),
                Some(_) | None => break,
            }
        }
        out
    }

    fn touch(&mut self, h: &PrefixHash, stamp: u64) {
        if let Some(e) = self.entries.get_mut(h) {
            self.lru.remove(&e.stamp);
            e.stamp = stamp;
            self.lru.insert(stamp, *h);
        }
    }

    fn remove(&mut self, h: &PrefixHash) -> Option<Entry> {
        let e = self.entries.remove(h)?;
        self.lru.remove(&e.stamp);
        Some(e)
    }
}

/// The prefix cache's index: one `Space` per namespace, and the LRU clock.
#[derive(Debug, Default)]
pub(crate) struct PrefixIndex {
    spaces: HashMap<Namespace, Space>,
    clock: u64,
    /// The clock at each namespace's last erasure: a request that pinned (looked up) at or
    /// before it publishes nothing, so no prompt computed before an erasure is cached after it.
    erased_at: HashMap<Namespace, u64>,
}

impl PrefixIndex {
    /// `n` fresh stamps, all newer than any before: `base..base + n`.
    fn stamps(&mut self, n: usize) -> u64 {
        let base = self.clock;
        self.clock += n as u64;
        base
    }

    /// Takes `namespace`'s entries out of the index, `(page, generation)` each as cached, and
    /// records the erasure's time on the clock (see `erased_at`).
    pub(crate) fn remove_space(&mut self, namespace: &Namespace) -> Vec<(PageId, Generation)> {
        let at = self.stamps(1);
        self.erased_at.insert(*namespace, at);
        self.spaces
            .remove(namespace)
            .map(|s| {
                s.entries
                    .into_values()
                    .map(|e| (e.page, e.generation))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether `namespace` was erased at or after `pinned_at` (a `SharedPages`' clock).
    fn erased_since(&self, namespace: &Namespace, pinned_at: u64) -> bool {
        self.erased_at
            .get(namespace)
            .is_some_and(|&at| at >= pinned_at)
    }
}

impl KvPool {
    /// (a) How many leading tokens of `tokens` the cache holds for `namespace` (a multiple
    /// of `page_size`). Pins nothing: the answer may be stale by the time it is used.
    pub fn cached_prefix_tokens(&self, namespace: &Namespace, tokens: &[u32]) -> usize {
        let ps = self.inner.cfg.layout.page_size;
        let idx = self.inner.prefix.lock();
        idx.spaces
            .get(namespace)
            .map_or(0, |s| s.walk(namespace, tokens, ps).len() * ps)
    }

    /// (b) Pins the longest cached chain of full pages of `tokens` under `namespace` (empty
    /// when nothing is cached) as read-only pages. A caller that needs the logits of the last
    /// prompt token passes the prompt without it, so at least that token is computed. The
    /// result, even empty, is also what `publish_prefix` chains the request's pages after.
    pub fn pin_prefix(&self, namespace: &Namespace, tokens: &[u32]) -> SharedPages {
        let inner = &self.inner;
        let ps = inner.cfg.layout.page_size;
        let mut table = Vec::new();
        let mut producers = Vec::new();
        let pinned_at;
        {
            let mut idx = inner.prefix.lock();
            let chain = idx
                .spaces
                .get(namespace)
                .map(|s| s.walk(namespace, tokens, ps))
                .unwrap_or_default();
            let base = idx.stamps(chain.len());
            pinned_at = base;
            if let Some(space) = idx.spaces.get_mut(namespace) {
                for (i, h) in chain.iter().enumerate() {
                    let Some(e) = space.entries.get(h) else { break };
                    if !inner.pin_page(e.page, e.generation) {
                        break;
                    }
                    table.push((e.page, e.generation));
                    producers.push(e.producer);
                    // Deepest oldest: the chain's leaves are evicted before its root.
                    space.touch(h, base + (chain.len() - 1 - i) as u64);
                }
            }
        }
        inner.metrics.add(|m| &m.prefix_pins, 1);
        inner.metrics.add(|m| &m.prefix_pages_hit, table.len());
        SharedPages::new(inner.clone(), *namespace, table, producers, pinned_at)
    }

    /// Pages cached under `namespace` right now (pinned or not).
    pub fn cached_pages(&self, namespace: &Namespace) -> usize {
        self.inner
            .prefix
            .lock()
            .spaces
            .get(namespace)
            .map_or(0, |s| s.entries.len())
    }
}

impl ReadablePages {
    /// (c) A finished request hands its pages to the prefix cache. `prefix` is what it pinned
    /// with `pin_prefix` (possibly empty) and still holds: its namespace is the one published
    /// under, and these pages hold the KV of the prompt `tokens` after it (at most `len()`
    /// tokens of them). Their full pages not cached yet become Shared, chained after
    /// `prefix`, read-only from now on; every other page is freed. The caller vouches that
    /// the pages hold the KV of exactly these tokens (a wrong claim can only poison its own
    /// namespace). Beyond the namespace's quota its least recently used unpinned pages are
    /// evicted; when all are pinned, the rest of the chain is not cached. Each newly cached
    /// page records `producer`, the request that computed it, which later pins report
    /// ([`SharedPages::runs`]); a page already cached keeps its first producer.
    pub fn publish_prefix(
        self,
        prefix: &SharedPages,
        tokens: &[u32],
        producer: RequestId,
    ) -> Published {
        let pool = self.pool().clone();
        let (table, len) = self.into_table();
        let namespace = prefix.namespace();
        let ps = pool.cfg.layout.page_size;
        let quota = pool.cfg.prefix_pages_per_namespace;
        let skip = prefix.table().len() * ps;
        let rest = tokens.get(skip..).unwrap_or_default();
        // Pins of another pool name nothing here: cache nothing (a caller's bug).
        let full = if quota == 0 || !Arc::ptr_eq(&pool, prefix.pool()) {
            0
        } else {
            (len.min(rest.len()) / ps).min(table.len())
        };
        let mut out = Published::default();
        let mut free = Vec::new();
        let mut evicted = Vec::new();
        let mut linked = 0;
        if full > 0 {
            let mut idx = pool.prefix.lock();
            // Pinned before its namespace was erased: the pages stay uncached, freed below.
            let full = if idx.erased_since(namespace, prefix.pinned_at()) {
                0
            } else {
                full
            };
            let base = idx.stamps(full);
            let space = idx.spaces.entry(*namespace).or_default();
            let mut parent = PrefixHash::chain(namespace, &tokens[..skip], ps).pop();
            // The chain links on only after the very pages `prefix` pins.
            let linked_to_prefix = match (&parent, prefix.table().last()) {
                (None, None) => true,
                (Some(h), Some(&(page, generation))) => space
                    .entries
                    .get(h)
                    .is_some_and(|e| e.page == page && e.generation == generation),
                (Some(_), None) | (None, Some(_)) => false,
            };
            let chunks = rest
                .chunks_exact(ps)
                .take(if linked_to_prefix { full } else { 0 });
            for (i, chunk) in chunks.enumerate() {
                let (page, generation) = table[i];
                let h = PrefixHash::next(namespace, parent.as_ref(), chunk);
                let stamp = base + (full - 1 - i) as u64;
                match space.entries.get(&h) {
                    Some(e) if e.parent == parent && *e.tokens == *chunk => {
                        space.touch(&h, stamp);
                        free.push((page, generation));
                        out.already_cached += 1;
                    }
                    // A hash collision with other tokens: this chain cannot link on.
                    Some(_) => break,
                    None => {
                        if space.entries.len() >= quota {
                            // Only pages older than this publish: never its own chain.
                            match pool.evict_oldest(space, base) {
                                Some(p) => evicted.push(p),
                                None => break,
                            }
                        }
                        if !pool.share_page(page, generation) {
                            break;
                        }
                        space.entries.insert(
                            h,
                            Entry {
                                page,
                                generation,
                                parent,
                                tokens: chunk.into(),
                                producer,
                                stamp,
                            },
                        );
                        space.lru.insert(stamp, h);
                        out.cached += 1;
                    }
                }
                parent = Some(h);
                linked = i + 1;
            }
            if space.entries.is_empty() {
                idx.spaces.remove(namespace);
            }
        }
        free.extend_from_slice(&table[linked..]);
        out.evicted = evicted.len();
        out.freed = free.len();
        pool.put_free(&evicted);
        pool.release_readable(&free);
        pool.metrics.add(|m| &m.prefix_pages_cached, out.cached);
        out
    }
}

impl PoolInner {
    /// Readable → Shared{readers: 0}, if the page is still Readable at `generation`.
    fn share_page(&self, page: PageId, generation: Generation) -> bool {
        let slot = &self.slots[page.index()];
        let mut meta = slot.meta.lock();
        let ours = slot.generation.load(Ordering::Relaxed) == generation.0;
        match meta.state {
            PageState::Readable if ours => {
                self.gauges
                    .transition(&mut meta, PageState::Shared { readers: 0 });
                true
            }
            PageState::Free
            | PageState::Reserved { .. }
            | PageState::Readable
            | PageState::Shared { .. }
            | PageState::Erased { .. }
            | PageState::Draining { .. }
            | PageState::Quarantined { .. } => false,
        }
    }

    /// One more reader on a Shared page at `generation`; false (nothing changed) otherwise.
    /// Caller holds the index lock.
    fn pin_page(&self, page: PageId, generation: Generation) -> bool {
        let slot = &self.slots[page.index()];
        let mut meta = slot.meta.lock();
        let current = slot.generation.load(Ordering::Relaxed) == generation.0;
        match meta.state {
            PageState::Shared { readers } if current => {
                let readers = readers + 1;
                self.gauges
                    .transition(&mut meta, PageState::Shared { readers });
                true
            }
            PageState::Free
            | PageState::Reserved { .. }
            | PageState::Readable
            | PageState::Shared { .. }
            | PageState::Erased { .. }
            | PageState::Draining { .. }
            | PageState::Quarantined { .. } => false,
        }
    }

    /// One reader fewer on a Shared page (a `SharedPages` dropped). Its debug checks stay
    /// quiet while unwinding: a second panic in a drop would abort the process.
    pub(crate) fn unpin_page(&self, page: PageId) {
        let mut meta = self.slots[page.index()].meta.lock();
        match meta.state {
            // The namespace was erased while this page was read: the last reader frees it.
            PageState::Erased { readers } if readers <= 1 => {
                self.evict_locked(page, &mut meta);
                drop(meta);
                self.put_free(&[page]);
            }
            PageState::Erased { readers } => {
                self.gauges.transition(
                    &mut meta,
                    PageState::Erased {
                        readers: readers - 1,
                    },
                );
            }
            PageState::Shared { readers } => {
                debug_assert!(
                    readers > 0 || std::thread::panicking(),
                    "{page} unpinned with no reader"
                );
                let readers = readers.saturating_sub(1);
                self.gauges
                    .transition(&mut meta, PageState::Shared { readers });
            }
            PageState::Free
            | PageState::Reserved { .. }
            | PageState::Readable
            | PageState::Draining { .. }
            | PageState::Quarantined { .. } => {
                debug_assert!(
                    std::thread::panicking(),
                    "{page} pinned but {:?}",
                    meta.state
                );
            }
        }
    }

    /// Evicts the least recently used unpinned page of `space` stamped before `before`;
    /// returns it (Free, not yet on the free list), or `None` when every such page is pinned.
    /// Caller holds the index lock.
    fn evict_oldest(&self, space: &mut Space, before: u64) -> Option<PageId> {
        let victims: Vec<PrefixHash> = space.lru.range(..before).map(|(_, h)| *h).collect();
        for h in victims {
            let e = &space.entries[&h];
            if self.evict_page(e.page, e.generation) {
                let page = e.page;
                space.remove(&h);
                return Some(page);
            }
        }
        None
    }

    /// Shared{readers: 0} at `generation` → zeroed, generation bumped, Free (the caller puts
    /// it on the free list). False, with nothing changed, if it has readers.
    fn evict_page(&self, page: PageId, generation: Generation) -> bool {
        let slot = &self.slots[page.index()];
        let mut meta = slot.meta.lock();
        let current = slot.generation.load(Ordering::Relaxed);
        match meta.state {
            PageState::Shared { readers: 0 } if current == generation.0 => {
                self.evict_locked(page, &mut meta);
                true
            }
            PageState::Free
            | PageState::Reserved { .. }
            | PageState::Readable
            | PageState::Shared { .. }
            | PageState::Erased { .. }
            | PageState::Draining { .. }
            | PageState::Quarantined { .. } => false,
        }
    }

    /// Zeroes a locked, unread page, bumps its generation (with its guard word) and moves it
    /// to Free. The zeroing is unconditional, whatever `zero_on_release` says: cached bytes
    /// were another request's prompt.
    pub(crate) fn evict_locked(&self, page: PageId, meta: &mut PageMeta) {
        let slot = &self.slots[page.index()];
        self.store.zero(page);
        let next = Generation(slot.generation.load(Ordering::Relaxed) + 1);
        slot.generation.store(next.0, Ordering::Release);
        self.store
            .set_guard(page, self.store.expected_guard(page, next));
        meta.owner = None;
        meta.written = false;
        self.gauges.transition(meta, PageState::Free);
        self.metrics.add(|m| &m.prefix_evictions, 1);
    }

    /// Allocation pressure: evicts up to `want` unpinned cached pages, least recently used
    /// first across every namespace, and puts them on the free list. Returns how many.
    pub(crate) fn reclaim(&self, want: usize) -> usize {
        let mut freed = Vec::new();
        {
            let mut idx = self.prefix.lock();
            let mut order: Vec<(u64, Namespace, PrefixHash)> = idx
                .spaces
                .iter()
                .flat_map(|(ns, s)| s.lru.iter().map(move |(st, h)| (*st, *ns, *h)))
                .collect();
            order.sort_unstable_by_key(|(st, _, _)| *st);
            for (_, ns, h) in order {
                if freed.len() == want {
                    break;
                }
                let Some(space) = idx.spaces.get_mut(&ns) else {
                    continue;
                };
                let e = &space.entries[&h];
                if self.evict_page(e.page, e.generation) {
                    freed.push(e.page);
                    space.remove(&h);
                    *self.reclaimed.lock().entry(ns).or_insert(0) += 1;
                }
            }
            idx.spaces.retain(|_, s| !s.entries.is_empty());
        }
        self.put_free(&freed);
        freed.len()
    }
}
