//! Atomic counters of pool events (`PoolMetrics`), their snapshot, and page-state gauges.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{CommitError, WriteError};

/// Pages per lifecycle state right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// On the free list.
    pub free: usize,
    /// Reserved under a live grant, awaiting commit.
    pub reserved: usize,
    /// Owned by a `ReadablePages`.
    pub readable: usize,
    /// In the prefix cache (pinned or not), or erased from it and still read (`Erased`).
    pub shared: usize,
    /// Grant revoked, waiting for drain confirmation.
    pub draining: usize,
    /// Drain never confirmed; held until the peer is declared gone.
    pub quarantined: usize,
}

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Monotonic event counters. Cheap to bump from any thread (relaxed atomics).
        #[derive(Debug, Default)]
        pub struct PoolMetrics { $( $(#[$doc])* pub $name: AtomicU64, )* }

        /// A point-in-time copy of [`PoolMetrics`].
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct PoolMetricsSnapshot { $( $(#[$doc])* pub $name: u64, )* }

        impl PoolMetrics {
            /// Reads every counter.
            pub fn snapshot(&self) -> PoolMetricsSnapshot {
                PoolMetricsSnapshot { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }
    };
}

counters! {
    /// Pages handed out (allocate, reserve, grow).
    allocations,
    /// Pages returned to the free list (by any path).
    releases,
    /// Deferred releases: pages freed after their drain was confirmed.
    deferred_drained,
    /// Deferred releases: pages whose drain timed out and moved to quarantine.
    deferred_timed_out,
    /// Deferred releases: quarantined pages freed because their peer was declared gone.
    deferred_quarantine_released,
    /// Reads refused because the page's generation changed (I1).
    generation_mismatches,
    /// Guard words found corrupt (on commit or before reuse).
    guard_word_failures,
    /// Writes dropped: unknown grant.
    write_unknown_grant,
    /// Writes dropped: revoked grant.
    write_revoked_grant,
    /// Writes dropped: page not in grant.
    write_wrong_page,
    /// Writes dropped: stale generation.
    write_stale_generation,
    /// Writes dropped: duplicate.
    write_duplicate,
    /// Writes dropped: bad length.
    write_bad_length,
    /// Writes dropped: too many tokens.
    write_too_many_tokens,
    /// Writes dropped: checksum mismatch.
    write_checksum_mismatch,
    /// Commits refused: key mismatch.
    commit_key_mismatch,
    /// Commits refused: token count mismatch.
    commit_token_count_mismatch,
    /// Commits refused: page not written.
    commit_page_not_written,
    /// Commits refused: checksum mismatch.
    commit_checksum_mismatch,
    /// Commits refused: guard word corrupt.
    commit_guard_word_corrupt,
    /// Commits refused: digest mismatch.
    commit_digest_mismatch,
    /// Commits refused: grant expired.
    commit_expired,
    /// Prefix cache: pages newly cached by `ReadablePages::publish_prefix`.
    prefix_pages_cached,
    /// Prefix cache: pages pinned by `KvPool::pin_prefix` (hits, in pages).
    prefix_pages_hit,
    /// Prefix cache: `pin_prefix` calls.
    prefix_pins,
    /// Prefix cache: pages evicted (zeroed, generation bumped, freed).
    prefix_evictions,
    /// Prefix cache: pages taken out by `KvPool::erase_namespace` (each also counts in
    /// `prefix_evictions` when it is zeroed, at once or at its last unpin).
    prefix_pages_erased,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl PoolMetrics {
    pub(crate) fn add(&self, c: fn(&Self) -> &AtomicU64, n: usize) {
        bump(c(self), n as u64);
    }

    pub(crate) fn write_rejected(&self, e: WriteError) {
        let c = match e {
            WriteError::UnknownGrant => &self.write_unknown_grant,
            WriteError::RevokedGrant => &self.write_revoked_grant,
            WriteError::WrongPage => &self.write_wrong_page,
            WriteError::StaleGeneration => &self.write_stale_generation,
            WriteError::DuplicateWrite => &self.write_duplicate,
            WriteError::BadLength => &self.write_bad_length,
            WriteError::TooManyTokens => &self.write_too_many_tokens,
            WriteError::ChecksumMismatch => &self.write_checksum_mismatch,
        };
        bump(c, 1);
    }

    pub(crate) fn commit_failed(&self, e: &CommitError) {
        let c = match e {
            CommitError::KeyMismatch => &self.commit_key_mismatch,
            CommitError::TokenCountMismatch { .. } => &self.commit_token_count_mismatch,
            CommitError::PageNotWritten(_) => &self.commit_page_not_written,
            CommitError::ChecksumMismatch(_) => &self.commit_checksum_mismatch,
            CommitError::GuardWordCorrupt(_) => {
                bump(&self.guard_word_failures, 1);
                &self.commit_guard_word_corrupt
            }
            CommitError::DigestMismatch => &self.commit_digest_mismatch,
            CommitError::Expired => &self.commit_expired,
        };
        bump(c, 1);
    }
}

impl PoolMetricsSnapshot {
    /// All writes dropped, whatever the reason.
    pub fn write_rejections(&self) -> u64 {
        self.write_unknown_grant
            + self.write_revoked_grant
            + self.write_wrong_page
            + self.write_stale_generation
            + self.write_duplicate
            + self.write_bad_length
            + self.write_too_many_tokens
            + self.write_checksum_mismatch
    }

    /// All commits refused, whatever the reason.
    pub fn commit_failures(&self) -> u64 {
        self.commit_key_mismatch
            + self.commit_token_count_mismatch
            + self.commit_page_not_written
            + self.commit_checksum_mismatch
            + self.commit_guard_word_corrupt
            + self.commit_digest_mismatch
            + self.commit_expired
    }
}
