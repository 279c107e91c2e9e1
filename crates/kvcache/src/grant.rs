//! Write grants, commit manifests, page writes and their checksums; the pool's grant registry.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::ids::{Generation, GrantKey, PageId};
use crate::Owner;

/// Checksum of one page's bytes (xxh3-64).
pub fn page_checksum(data: &[u8]) -> u64 {
    xxh3_64(data)
}

/// Digest of a manifest: xxh3-64 over `tokens_written` then every page checksum, little-endian.
pub fn manifest_digest(page_checksums: &[u64], tokens_written: usize) -> u64 {
    let mut h = Xxh3::new();
    h.update(&(tokens_written as u64).to_le_bytes());
    for c in page_checksums {
        h.update(&c.to_le_bytes());
    }
    h.digest()
}

/// Permission for one remote writer to write the listed pages, once each, until commit or
/// revocation. Travels to the writer (prefill) with the request.
#[derive(Clone, Debug)]
pub struct WriteGrant {
    /// Single-use key every write must carry.
    pub key: GrantKey,
    /// The request the pages are for.
    pub owner: Owner,
    /// Pages in token order, each at the generation it was allocated with.
    pub pages: Vec<(PageId, Generation)>,
    /// Tokens reserved.
    pub tokens: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// How long the grant lives without progress: it expires (commit fails with
    /// `CommitError::Expired`, decode aborts the reservation) once this long has passed since
    /// it was issued or since its last landed write, whichever is later. A long prompt that
    /// is being computed and sent is never cut off; a writer that went silent is.
    pub idle_ttl: Duration,
}

impl WriteGrant {
    /// Tokens page `index` must hold: full pages, the last one the remainder.
    pub fn tokens_in_page(&self, index: usize) -> usize {
        self.tokens
            .saturating_sub(index * self.page_size)
            .min(self.page_size)
    }
}

/// What the writer claims it wrote; commit verifies it against what actually landed.
#[derive(Clone, Debug)]
pub struct CommitManifest {
    /// The grant written under.
    pub key: GrantKey,
    /// Tokens written in total.
    pub tokens_written: usize,
    /// Checksum of each page in grant order.
    pub page_checksums: Vec<u64>,
    /// `manifest_digest(page_checksums, tokens_written)`.
    pub digest: u64,
}

impl CommitManifest {
    /// A manifest with its digest computed.
    pub fn new(key: GrantKey, tokens_written: usize, page_checksums: Vec<u64>) -> Self {
        let digest = manifest_digest(&page_checksums, tokens_written);
        Self {
            key,
            tokens_written,
            page_checksums,
            digest,
        }
    }
}

/// One whole-page write arriving at the receiver.
#[derive(Clone, Copy, Debug)]
pub struct PageWrite<'a> {
    /// Grant the write is made under.
    pub key: GrantKey,
    /// Target page.
    pub page: PageId,
    /// Generation the grant names for the page.
    pub generation: Generation,
    /// Tokens of valid KV in the page.
    pub tokens: u32,
    /// Exactly `page_bytes` bytes.
    pub data: &'a [u8],
    /// `page_checksum(data)` as computed by the sender.
    pub checksum: u64,
}

/// Where a grant is in its life, as far as the registry knows. Committed grants are removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GrantStatus {
    /// Writes may land. `ended`: how the transfer said its stream ended meanwhile (`None`:
    /// still open), read when the grant ends without a commit.
    Live { ended: Option<StreamEnd> },
    /// Revoked at `since`; its pages drain.
    Revoked { since: Instant },
    /// Drain timed out; its pages are quarantined.
    Quarantined,
}

/// How a grant's write stream ended, as the transfer receiver reported it while the grant was
/// still live (`KvPool::mark_drained`, `KvPool::peer_gone`). Read once, when the grant itself
/// ends without a commit: a stream that already ended can land nothing more, so the grant's
/// pages are freed then instead of waiting for a drain that will not come again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamEnd {
    /// The sender drained: every write it sent was processed.
    Drained,
    /// The connection that carried the grant's writes is gone.
    PeerGone,
}

/// The one record of a grant's life: its pages and its status.
#[derive(Debug)]
pub(crate) struct GrantRecord {
    pub(crate) pages: Vec<(PageId, Generation)>,
    pub(crate) status: GrantStatus,
    /// When the grant was issued or its last write landed: its idle lifetime counts from here.
    pub(crate) progress_at: Instant,
}

/// Grants not yet committed or drained. Lock order: a page's metadata lock may be held while
/// taking the registry lock, never the reverse.
pub(crate) type Registry = HashMap<GrantKey, GrantRecord>;
