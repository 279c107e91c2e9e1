//! `ReservedPages`: pages under a live write grant. `commit` is the only way to readable pages.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::MutexGuard;
use rayon::prelude::*;

use crate::error::CommitError;
use crate::grant::{manifest_digest, page_checksum, CommitManifest, WriteGrant};
use crate::ids::{Generation, PageId};
use crate::page::{PageMeta, PageState};
use crate::pool::PoolInner;
use crate::readable::ReadablePages;

/// Below this many bytes the commit re-hash runs on the calling thread (about 0.1 ms of
/// xxh3): handing it to the rayon pool would cost more than it saves.
const PARALLEL_REHASH_BYTES: usize = 4 << 20;

/// Pages reserved for a remote writer. `!Clone`. Dropping it without `commit` is an abort:
/// the grant is revoked and the pages drain.
pub struct ReservedPages {
    pool: Arc<PoolInner>,
    grant: WriteGrant,
    /// Set once `commit` or `abort` has consumed the reservation, so `Drop` does nothing.
    finished: bool,
}

impl ReservedPages {
    pub(crate) fn new(pool: Arc<PoolInner>, grant: WriteGrant) -> Self {
        Self {
            pool,
            grant,
            finished: false,
        }
    }

    /// The grant to hand to the writer.
    pub fn grant(&self) -> &WriteGrant {
        &self.grant
    }

    /// Whether the grant went its whole idle lifetime without a landed write at `now`: the
    /// writer is gone or stalled, and the reservation should be aborted.
    pub fn expired(&self, now: Instant) -> bool {
        self.pool
            .grant_expired(self.grant.key, self.grant.idle_ttl, now)
    }

    /// Verifies the manifest against what landed (I2): the key matches, the grant has not
    /// expired, tokens written == tokens reserved (claimed and landed, page by page), every
    /// page was written exactly once under this grant, the manifest's checksums match the
    /// landed bytes, guard words are intact, and the digest matches. All page locks are held
    /// during the check, so nothing lands in between. On `Err` the grant is revoked and the
    /// pages drain (freed at once when nothing of the grant can land any more; see
    /// `KvPool::mark_drained`).
    pub fn commit(mut self, m: &CommitManifest) -> Result<ReadablePages, CommitError> {
        self.finished = true;
        let pool = self.pool.clone();
        let grant = &self.grant;
        let mut metas: Vec<MutexGuard<'_, PageMeta>> = grant
            .pages
            .iter()
            .map(|(p, _)| pool.slots[p.index()].meta.lock())
            .collect();
        match pool.verify(grant, m, &metas) {
            Ok(()) => {
                for meta in metas.iter_mut() {
                    pool.gauges.transition(meta, PageState::Readable);
                }
                // Retire the key while still holding the page locks: later writes are Unknown.
                pool.grants.lock().remove(&grant.key);
                // A granted page no write reached (only possible with the token count check
                // switched off) holds bytes of an earlier generation: its table entry presents
                // one, so the read check (I1) refuses every read of it.
                let table = grant
                    .pages
                    .iter()
                    .zip(&metas)
                    .map(|(&(page, generation), meta)| {
                        if meta.written {
                            (page, generation)
                        } else {
                            (page, Generation(generation.0.wrapping_sub(1)))
                        }
                    })
                    .collect();
                drop(metas);
                let grant = self.grant.clone();
                Ok(ReadablePages::new(pool, grant.owner, table, grant.tokens))
            }
            Err(e) => {
                pool.metrics.commit_failed(&e);
                // Revoke with the page locks still held: no write lands between check and fence.
                for meta in metas.iter_mut() {
                    if meta.state == (PageState::Reserved { grant: grant.key }) {
                        pool.gauges
                            .transition(meta, PageState::Draining { grant: grant.key });
                    }
                }
                let stream = pool.mark_revoked(grant.key);
                drop(metas);
                pool.after_revoke(grant.key, stream);
                Err(e)
            }
        }
    }

    /// Revokes the grant (fences later writes). The pages are freed at once when the grant's
    /// stream already ended or the pool takes revocation as the drain; otherwise they wait for
    /// `mark_drained`, or go to quarantine on `sweep_expired`.
    pub fn abort(mut self) {
        self.finished = true;
        self.pool.revoke(self.grant.key, &self.grant.pages);
    }
}

impl Drop for ReservedPages {
    fn drop(&mut self) {
        if !self.finished {
            self.pool.revoke(self.grant.key, &self.grant.pages);
        }
    }
}

impl std::fmt::Debug for ReservedPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReservedPages")
            .field("grant", &self.grant)
            .finish()
    }
}

impl PoolInner {
    /// The checks of `commit`, with every page's lock held by the caller (`metas` in grant
    /// order).
    fn verify(
        &self,
        grant: &WriteGrant,
        m: &CommitManifest,
        metas: &[MutexGuard<'_, PageMeta>],
    ) -> Result<(), CommitError> {
        if m.key != grant.key {
            return Err(CommitError::KeyMismatch);
        }
        if self.grant_expired(grant.key, grant.idle_ttl, self.cfg.clock.now()) {
            return Err(CommitError::Expired);
        }
        if self.check_commit_tokens() && m.tokens_written != grant.tokens {
            return Err(CommitError::TokenCountMismatch {
                written: m.tokens_written,
                reserved: grant.tokens,
            });
        }
        // One checksum per granted page: a manifest that leaves pages out is refused with the
        // checksums (a test build may switch them off).
        if (self.check_checksums() && m.page_checksums.len() != grant.pages.len())
            || m.digest != manifest_digest(&m.page_checksums, m.tokens_written)
        {
            return Err(CommitError::DigestMismatch);
        }
        let rehashed =
            (self.check_checksums() && self.cfg.commit_rehash).then(|| self.rehash(grant));
        let mut per_page_ok = true;
        for (i, ((page, generation), meta)) in grant.pages.iter().zip(metas).enumerate() {
            let ours = meta.state == (PageState::Reserved { grant: grant.key })
                && self.slots[page.index()]
                    .generation
                    .load(std::sync::atomic::Ordering::Relaxed)
                    == generation.0;
            if !ours || (!meta.written && self.check_commit_tokens()) {
                return Err(CommitError::PageNotWritten(*page));
            }
            if self.store.guard(*page) != self.store.expected_guard(*page, *generation) {
                return Err(CommitError::GuardWordCorrupt(*page));
            }
            if self.check_checksums() {
                // The sender's checksum against the one taken of the bytes that landed.
                if m.page_checksums[i] != meta.landed_checksum {
                    return Err(CommitError::ChecksumMismatch(*page));
                }
                // The bytes still in the page against the same: a write that slipped past the
                // fence after landing (the late-write class) changed them.
                if rehashed
                    .as_ref()
                    .is_some_and(|now| now[i] != meta.landed_checksum)
                {
                    return Err(CommitError::ChecksumMismatch(*page));
                }
            }
            per_page_ok &= meta.tokens as usize == grant.tokens_in_page(i);
        }
        if self.check_commit_tokens() && !per_page_ok {
            let landed: usize = metas.iter().map(|m| m.tokens as usize).sum();
            return Err(CommitError::TokenCountMismatch {
                written: landed,
                reserved: grant.tokens,
            });
        }
        Ok(())
    }

    /// Checksums of the bytes now in every page of `grant`, in grant order. The caller holds
    /// every page's lock, so no write can be mid-copy. Large grants are hashed on the rayon
    /// pool: this pass sits between the last landed page and the first decode step.
    fn rehash(&self, grant: &WriteGrant) -> Vec<u64> {
        // SAFETY (both closures): the caller holds the page's lock (no writer can copy into
        // it), and readers only read.
        let hash = |(page, _): &(PageId, Generation)| {
            // SAFETY: as above (the page's lock is held).
            page_checksum(unsafe { self.store.bytes(*page) })
        };
        if grant.pages.len() * self.store.page_bytes() < PARALLEL_REHASH_BYTES {
            grant.pages.iter().map(hash).collect()
        } else {
            grant.pages.par_iter().with_min_len(4).map(hash).collect()
        }
    }
}
