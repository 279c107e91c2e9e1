//! Which defenses run. In normal builds each answer is the constant `true`, so the checks are
//! unconditional code; only `cfg(test)` or the test-only `unsafe-test-switches` feature reads
//! the switches in `PoolConfig::defenses`.

use crate::pool::PoolInner;

#[cfg(any(test, feature = "unsafe-test-switches"))]
impl PoolInner {
    #[inline(always)]
    pub(crate) fn check_read_generation(&self) -> bool {
        self.cfg.defenses.read_generation_check
    }
    #[inline(always)]
    pub(crate) fn check_commit_tokens(&self) -> bool {
        self.cfg.defenses.commit_token_count
    }
    #[inline(always)]
    pub(crate) fn check_checksums(&self) -> bool {
        self.cfg.defenses.checksum_check
    }
    #[inline(always)]
    pub(crate) fn check_grant_fencing(&self) -> bool {
        self.cfg.defenses.grant_fencing
    }
}

#[cfg(not(any(test, feature = "unsafe-test-switches")))]
impl PoolInner {
    #[inline(always)]
    pub(crate) fn check_read_generation(&self) -> bool {
        true
    }
    #[inline(always)]
    pub(crate) fn check_commit_tokens(&self) -> bool {
        true
    }
    #[inline(always)]
    pub(crate) fn check_checksums(&self) -> bool {
        true
    }
    #[inline(always)]
    pub(crate) fn check_grant_fencing(&self) -> bool {
        true
    }
}
