//! The receiver side of a transfer: `KvPool::write_page`, the grant fence.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::error::WriteError;
use crate::grant::{page_checksum, GrantStatus, PageWrite};
use crate::ids::GrantKey;
use crate::page::PageState;
use crate::pool::{KvPool, PoolInner};

impl KvPool {
    /// Receiver side of a transfer: write one whole page under a grant. Checks, before
    /// touching data, in this order: the grant key is live (not revoked/unknown), the page
    /// belongs to that grant at `generation`, the page was not already written under this
    /// grant, `data.len() == page_bytes`, `tokens <= page_size`, and
    /// `checksum == page_checksum(data)`. On any failure: typed error, no byte written,
    /// counted in metrics.
    ///
    /// The copy happens under the page's metadata lock, so once a revoke has passed a page
    /// no write to it can land any more (the fence is synchronous for in-process writes).
    pub fn write_page(&self, w: PageWrite<'_>) -> Result<(), WriteError> {
        let r = self.inner.write_page(&w);
        if let Err(e) = r {
            self.inner.metrics.write_rejected(e);
        }
        r
    }
}

impl PoolInner {
    fn write_page(&self, w: &PageWrite<'_>) -> Result<(), WriteError> {
        let Some(slot) = self.slots.get(w.page.index()) else {
            return Err(self.classify(w));
        };
        let layout = self.cfg.layout;
        let length_ok = w.data.len() == layout.page_bytes();
        // Hash outside the lock; whether a mismatch matters is decided in check order below.
        let sum = if length_ok && self.check_checksums() {
            page_checksum(w.data)
        } else {
            w.checksum
        };
        let mut meta = slot.meta.lock();
        match meta.state {
            PageState::Reserved { grant } if grant == w.key => {
                if slot.generation.load(Ordering::Relaxed) != w.generation.0 {
                    return Err(WriteError::StaleGeneration);
                }
                if meta.written {
                    return Err(WriteError::DuplicateWrite);
                }
                if !length_ok {
                    return Err(WriteError::BadLength);
                }
                if w.tokens as usize > layout.page_size {
                    return Err(WriteError::TooManyTokens);
                }
                if sum != w.checksum {
                    return Err(WriteError::ChecksumMismatch);
                }
                self.store.write(w.page, w.data);
                meta.written = true;
                meta.tokens = w.tokens;
                meta.landed_checksum = sum;
                drop(meta);
                self.progressed(w.key);
                Ok(())
            }
            PageState::Free
            | PageState::Reserved { .. }
            | PageState::Readable
            | PageState::Shared { .. }
            | PageState::Erased { .. }
            | PageState::Draining { .. }
            | PageState::Quarantined { .. } => {
                if !self.check_grant_fencing() && length_ok {
                    // TEST-ONLY path: an unfenced one-sided write lands whatever the state.
                    self.store.write(w.page, w.data);
                    return Ok(());
                }
                drop(meta);
                Err(self.classify(w))
            }
        }
    }

    /// Why a write that missed the fast path is refused. Takes the registry lock with no page
    /// lock held (lock order).
    fn classify(&self, w: &PageWrite<'_>) -> WriteError {
        let grants = self.grants.lock();
        let Some(rec) = grants.get(&w.key) else {
            return WriteError::UnknownGrant;
        };
        match rec.status {
            GrantStatus::Revoked { .. } | GrantStatus::Quarantined => WriteError::RevokedGrant,
            GrantStatus::Live { .. } => match rec.pages.iter().find(|(p, _)| *p == w.page) {
                None => WriteError::WrongPage,
                Some((_, g)) if *g != w.generation => WriteError::StaleGeneration,
                // Raced with a commit of this grant: the page was already taken over.
                Some(_) => WriteError::DuplicateWrite,
            },
        }
    }

    /// A write landed under `key`: its idle lifetime starts again.
    fn progressed(&self, key: GrantKey) {
        if let Some(rec) = self.grants.lock().get_mut(&key) {
            rec.progress_at = self.cfg.clock.now();
        }
    }

    /// Whether the live grant `key` has gone `ttl` without progress (issue or a landed write)
    /// at `now`. A revoked, quarantined or retired grant has ended otherwise: false.
    pub(crate) fn grant_expired(&self, key: GrantKey, ttl: Duration, now: Instant) -> bool {
        self.grants.lock().get(&key).is_some_and(|r| {
            matches!(r.status, GrantStatus::Live { .. })
                && now.saturating_duration_since(r.progress_at) >= ttl
        })
    }

    /// Whether `key` is a live grant (for callers that fence before sending).
    pub(crate) fn grant_is_live(&self, key: GrantKey) -> bool {
        matches!(
            self.grants.lock().get(&key).map(|r| r.status),
            Some(GrantStatus::Live { .. })
        )
    }
}
