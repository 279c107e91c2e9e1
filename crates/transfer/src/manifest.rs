//! Commit manifest builder: what the sender claims it wrote (tokens, per-page checksums in
//! grant order, digest). Decode's commit checks it against what actually landed.

use crate::batch::BatchHandle;
use crate::engine::PageWriteReq;
use crate::types::{manifest_digest, page_checksum, CommitManifest, GrantKey};

/// Accumulates the pages written under one grant, in grant page order.
#[derive(Clone, Debug)]
pub struct ManifestBuilder {
    key: GrantKey,
    tokens: usize,
    checksums: Vec<u64>,
}

impl ManifestBuilder {
    /// An empty manifest for `key`.
    pub fn new(key: GrantKey) -> Self {
        Self {
            key,
            tokens: 0,
            checksums: Vec::new(),
        }
    }

    /// Records the next page of the grant.
    pub fn add_page(&mut self, checksum: u64, tokens: usize) -> &mut Self {
        self.checksums.push(checksum);
        self.tokens += tokens;
        self
    }

    /// Records every request of a batch (in the order they follow the grant's pages).
    pub fn add_batch(&mut self, reqs: &[PageWriteReq]) -> &mut Self {
        for r in reqs {
            self.add_page(page_checksum(&r.src), r.tokens as usize);
        }
        self
    }

    /// Records the pages of a submitted batch, using the checksums the engine already computed.
    pub fn add_sent(&mut self, batch: &BatchHandle) -> &mut Self {
        for (checksum, tokens) in batch.sent_pages() {
            self.add_page(checksum, tokens as usize);
        }
        self
    }

    /// The finished manifest, digest included.
    pub fn build(&self) -> CommitManifest {
        CommitManifest {
            key: self.key,
            tokens_written: self.tokens,
            page_checksums: self.checksums.clone(),
            digest: manifest_digest(&self.checksums, self.tokens),
        }
    }
}
