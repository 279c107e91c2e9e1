//! A grant's end without a commit: revoke (fence), then free its pages once nothing of it can
//! land (its stream already ended, the pool takes revocation as the drain, or the drain is
//! confirmed later), else timeout to quarantine, released when the peer is gone. Every path
//! reads the one grant record (`GrantRecord`): the transfer receiver writes how the stream
//! ended into its live status, the reservation's end reads it.

use std::time::Instant;

use crate::grant::{GrantStatus, StreamEnd};
use crate::ids::{GrantKey, PageId};
use crate::page::PageState;
use crate::pool::{KvPool, PoolInner};

impl KvPool {
    /// The transfer layer confirms no write of `key` can still land. For a live grant this is
    /// recorded, and acted on when the grant ends (`ReservedPages::abort`, a failed commit);
    /// a revoked grant's draining (or quarantined) pages go to the free list at once, zeroed
    /// if configured. No-op for a committed or unknown grant.
    pub fn mark_drained(&self, key: GrantKey) {
        if !self.inner.note_stream_end(key, StreamEnd::Drained) {
            self.inner.finish_revoked(key, StreamEnd::Drained);
        }
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
                    GrantStatus::Live { .. }
                    | GrantStatus::Revoked { .. }
                    | GrantStatus::Quarantined => {}
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
    /// land. For a live grant this is recorded (see `mark_drained`); a revoked grant's
    /// quarantined (or still draining) pages are freed at once.
    pub fn peer_gone(&self, key: GrantKey) {
        if !self.inner.note_stream_end(key, StreamEnd::PeerGone) {
            self.inner.finish_revoked(key, StreamEnd::PeerGone);
        }
    }

    /// Now, on the pool's clock (`PoolConfig::clock`): what `sweep_expired` and
    /// `ReservedPages::expired` compare with.
    pub fn now(&self) -> Instant {
        self.inner.cfg.clock.now()
    }

    /// Whether `key` is a live grant (issued, not yet committed or revoked).
    pub fn grant_is_live(&self, key: GrantKey) -> bool {
        self.inner.grant_is_live(key)
    }
}

impl PoolInner {
    /// Records how a live grant's stream ended; `false` when `key` is not live (revoked,
    /// committed or unknown). A lost peer outranks a drain seen before it.
    fn note_stream_end(&self, key: GrantKey, end: StreamEnd) -> bool {
        let mut grants = self.grants.lock();
        match grants.get_mut(&key).map(|rec| &mut rec.status) {
            Some(GrantStatus::Live { ended }) => {
                if *ended != Some(StreamEnd::PeerGone) {
                    *ended = Some(end);
                }
                true
            }
            Some(GrantStatus::Revoked { .. } | GrantStatus::Quarantined) | None => false,
        }
    }

    /// Ends a live grant that will not be committed (abort, drop): fences it, then frees its
    /// pages if nothing of it can land any more (`after_revoke`). Each page turns Draining
    /// under its lock (so no write to it is mid-copy, and every later one is refused) before
    /// the record says Revoked, so a drain reported meanwhile is recorded on the live grant
    /// and read here, never lost.
    pub(crate) fn revoke(&self, key: GrantKey, pages: &[(PageId, crate::Generation)]) {
        for (page, _) in pages {
            let mut meta = self.slots[page.index()].meta.lock();
            if meta.state == (PageState::Reserved { grant: key }) {
                self.gauges
                    .transition(&mut meta, PageState::Draining { grant: key });
            }
        }
        let stream = self.mark_revoked(key);
        self.after_revoke(key, stream);
    }

    /// Marks `key` revoked in the registry; returns how its stream had ended, if it had.
    pub(crate) fn mark_revoked(&self, key: GrantKey) -> Option<StreamEnd> {
        let mut grants = self.grants.lock();
        let rec = grants.get_mut(&key)?;
        let revoked = GrantStatus::Revoked {
            since: self.cfg.clock.now(),
        };
        match std::mem::replace(&mut rec.status, revoked) {
            GrantStatus::Live { ended } => ended,
            GrantStatus::Revoked { .. } | GrantStatus::Quarantined => None,
        }
    }

    /// A revoked grant's pages are freed now when its stream had already ended, or when the
    /// pool takes revocation as the drain (`PoolConfig::revocation_drains`); otherwise they
    /// drain: `mark_drained`, or quarantine at the drain timeout. Call with no page lock held.
    pub(crate) fn after_revoke(&self, key: GrantKey, stream: Option<StreamEnd>) {
        match stream {
            Some(end) => {
                self.finish_revoked(key, end);
            }
            None if self.cfg.revocation_drains => {
                self.finish_revoked(key, StreamEnd::Drained);
            }
            None => {}
        }
    }

    /// Removes a revoked grant and frees its draining/quarantined pages, counting them by how
    /// its stream ended. No-op for a live or unknown grant. Returns how many pages were freed.
    fn finish_revoked(&self, key: GrantKey, end: StreamEnd) -> usize {
        let pages = {
            let mut grants = self.grants.lock();
            match grants.get(&key).map(|r| r.status) {
                Some(GrantStatus::Revoked { .. } | GrantStatus::Quarantined) => {
                    grants.remove(&key).map(|r| r.pages)
                }
                Some(GrantStatus::Live { .. }) | None => None,
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
                | PageState::Erased { .. }
                | PageState::Draining { .. }
                | PageState::Quarantined { .. } => {}
            }
        }
        self.put_free(&freed);
        let n = freed.len();
        match end {
            StreamEnd::Drained => self.metrics.add(|m| &m.deferred_drained, n),
            StreamEnd::PeerGone => self.metrics.add(|m| &m.deferred_quarantine_released, n),
        }
        n
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
