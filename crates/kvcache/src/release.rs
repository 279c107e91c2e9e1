//! Deferred release: revoke (fence), drain confirmation, timeout to quarantine, and release
//! of quarantine when the peer is gone.

use std::time::Instant;

use crate::grant::GrantStatus;
use crate::ids::{GrantKey, PageId};
use crate::page::PageState;
use crate::pool::{KvPool, PoolInner};

impl KvPool {
    /// The transfer layer confirms no write of `key` can still land: the draining (or
    /// quarantined) pages of that revoked grant go to the free list, zeroed if configured.
    /// No-op for a live, committed or unknown grant.
    pub fn mark_drained(&self, key: GrantKey) {
        let n = self.inner.finish_revoked(key, |s| {
            matches!(s, GrantStatus::Revoked { .. } | GrantStatus::Quarantined)
        });
        self.inner.metrics.add(|m| &m.deferred_drained, n);
    }

    /// Draining grants whose drain was not confirmed within `drain_timeout` of their
    /// revocation move to quarantine. Call periodically; returns how many pages moved.
    pub fn sweep_expired(&self, now: Instant) -> usize {
        let timeout = self.inner.cfg.drain_timeout;
        let mut expired = Vec::new();
        {
            let mut grants = self.inner.grants.lock();
            for (key, rec) in grants.iter_mut() {
                match rec.status {
                    GrantStatus::Revoked { since }
                        if now.saturating_duration_since(since) >= timeout =>
                    {
                        rec.status = GrantStatus::Quarantined;
                        expired.push((*key, rec.pages.clone()));
                    }
                    GrantStatus::Live | GrantStatus::Revoked { .. } | GrantStatus::Quarantined => {}
                }
            }
        }
        let mut moved = 0;
        for (key, pages) in expired {
            for (page, _) in pages {
                let mut meta = self.inner.slots[page.index()].meta.lock();
                if meta.state == (PageState::Draining { grant: key }) {
                    self.inner
                        .gauges
                        .transition(&mut meta, PageState::Quarantined { grant: key });
                    moved += 1;
                }
            }
        }
        self.inner.metrics.add(|m| &m.deferred_timed_out, moved);
        moved
    }

    /// The peer that held `key` is gone (connection torn down), so none of its writes can
    /// land: its quarantined (or still draining) pages are freed. No-op for a live grant.
    pub fn release_quarantined(&self, key: GrantKey) {
        let n = self.inner.finish_revoked(key, |s| {
            matches!(s, GrantStatus::Revoked { .. } | GrantStatus::Quarantined)
        });
        self.inner
            .metrics
            .add(|m| &m.deferred_quarantine_released, n);
    }

    /// Whether `key` is a live grant (issued, not yet committed or revoked).
    pub fn grant_is_live(&self, key: GrantKey) -> bool {
        self.inner.grant_is_live(key)
    }
}

impl PoolInner {
    /// Revokes a live grant: from now on its writes are refused, and each page, once its lock
    /// is taken here (so no write to it is mid-copy), is Draining.
    pub(crate) fn revoke(&self, key: GrantKey, pages: &[(PageId, crate::Generation)]) {
        if let Some(rec) = self.grants.lock().get_mut(&key) {
            rec.status = GrantStatus::Revoked {
                since: Instant::now(),
            };
        }
        for (page, _) in pages {
            let mut meta = self.slots[page.index()].meta.lock();
            if meta.state == (PageState::Reserved { grant: key }) {
                self.gauges
                    .transition(&mut meta, PageState::Draining { grant: key });
            }
        }
    }

    /// Removes a revoked grant whose status passes `ok` and frees its draining/quarantined
    /// pages. Returns how many pages were freed.
    fn finish_revoked(&self, key: GrantKey, ok: impl Fn(GrantStatus) -> bool) -> usize {
        let pages = {
            let mut grants = self.grants.lock();
            match grants.get(&key) {
                Some(rec) if ok(rec.status) => grants.remove(&key).map(|r| r.pages),
                Some(_) | None => None,
            }
        };
        let Some(pages) = pages else { return 0 };
        let mut freed = Vec::with_capacity(pages.len());
        for (page, _) in pages {
            let mut meta = self.slots[page.index()].meta.lock();
            match meta.state {
                PageState::Draining { grant } | PageState::Quarantined { grant }
                    if grant == key =>
                {
                    self.free_locked(page, &mut meta);
                    freed.push(page);
                }
                PageState::Free
                | PageState::Reserved { .. }
                | PageState::Readable
                | PageState::Shared { .. }
                | PageState::Draining { .. }
                | PageState::Quarantined { .. } => {}
            }
        }
        self.put_free(&freed);
        freed.len()
    }

    /// Frees pages owned by a dropped `ReadablePages` (no grant can write them).
    pub(crate) fn release_readable(&self, pages: &[(PageId, crate::Generation)]) {
        let mut freed = Vec::with_capacity(pages.len());
        for (page, _) in pages {
            let mut meta = self.slots[page.index()].meta.lock();
            if meta.state == PageState::Readable {
                self.free_locked(*page, &mut meta);
                freed.push(*page);
            }
        }
        self.put_free(&freed);
    }
}
