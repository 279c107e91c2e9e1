//! Typed failures of reserve, write, commit and read. Each is counted in `PoolMetrics`.

use thiserror::Error;

use crate::ids::{Generation, PageId};

/// Why pages could not be allocated. Returned before any page changes state.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ReserveError {
    /// The request can never fit this pool, even empty.
    #[error("request of {requested_tokens} tokens exceeds the pool's capacity of {capacity_tokens} tokens")]
    TooLarge {
        /// Tokens asked for.
        requested_tokens: usize,
        /// Tokens the whole pool holds.
        capacity_tokens: usize,
    },
    /// Not enough free pages right now.
    #[error("pool exhausted: {requested_pages} pages requested, {free_pages} free")]
    Exhausted {
        /// Pages asked for.
        requested_pages: usize,
        /// Pages free at the time of the request.
        free_pages: usize,
    },
    /// A reservation of zero tokens was asked for.
    #[error("a reservation must hold at least one token")]
    ZeroTokens,
}

/// Why a write was dropped. No byte of the page was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
pub enum WriteError {
    /// The grant key was never issued by this pool or was already retired.
    #[error("write carries an unknown grant key")]
    UnknownGrant,
    /// The grant was revoked (abort, failed commit) or its pages are quarantined.
    #[error("write carries a revoked grant key")]
    RevokedGrant,
    /// The grant is live but does not cover this page.
    #[error("the grant does not cover this page")]
    WrongPage,
    /// The page belongs to the grant but at a different generation.
    #[error("write presents a stale page generation")]
    StaleGeneration,
    /// The page was already written under this grant.
    #[error("the page was already written under this grant")]
    DuplicateWrite,
    /// The data is not exactly one page long.
    #[error("write data is not exactly one page long")]
    BadLength,
    /// The write claims more tokens than a page holds.
    #[error("write claims more tokens than a page holds")]
    TooManyTokens,
    /// The data does not hash to the checksum carried with it.
    #[error("write data does not match its checksum")]
    ChecksumMismatch,
}

/// Why a commit was refused. On any of these the grant is revoked and its pages drain.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum CommitError {
    /// The manifest names a different grant.
    #[error("manifest key does not match the reservation's grant")]
    KeyMismatch,
    /// Tokens written (claimed or landed) differ from tokens reserved.
    #[error("{written} tokens written but {reserved} reserved")]
    TokenCountMismatch {
        /// Tokens the manifest claims, or that landed, whichever differs.
        written: usize,
        /// Tokens reserved.
        reserved: usize,
    },
    /// A granted page never received a write under this grant.
    #[error("{0} was never written under this grant")]
    PageNotWritten(PageId),
    /// The manifest's checksum for a page differs from what landed.
    #[error("checksum of {0} differs between manifest and landed bytes")]
    ChecksumMismatch(PageId),
    /// The guard word after the page's data was overwritten.
    #[error("guard word after {0} is corrupt")]
    GuardWordCorrupt(PageId),
    /// The manifest digest does not match its own checksums and token count.
    #[error("manifest digest does not match its contents")]
    DigestMismatch,
    /// The grant expired before commit.
    #[error("write grant expired before commit")]
    Expired,
}

impl CommitError {
    /// The page the refusal names, if it names one.
    pub fn page(&self) -> Option<PageId> {
        match self {
            CommitError::PageNotWritten(p)
            | CommitError::ChecksumMismatch(p)
            | CommitError::GuardWordCorrupt(p) => Some(*p),
            CommitError::KeyMismatch
            | CommitError::TokenCountMismatch { .. }
            | CommitError::DigestMismatch
            | CommitError::Expired => None,
        }
    }
}

/// Why a read was refused. The request fails; it never sees data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum ReadError {
    /// The page was reallocated since this table entry was made (I1).
    #[error("{page}: presented {expected} but the page is at {current}")]
    GenerationMismatch {
        /// The page read.
        page: PageId,
        /// Generation in the reader's table.
        expected: Generation,
        /// The page's current generation.
        current: Generation,
    },
    /// Layer, page index or position beyond this request's pages.
    #[error("layer, page index or position out of range")]
    OutOfRange,
}
