//! `SharedPages`: pins on cached prefix pages (see `prefix`), read-only inputs to attention.
//! Reads are generation-checked like `ReadablePages`' (I1); dropping it releases the pins.
//! The pins also remember who published each page, as [`PinnedRun`]s: what a worker reports
//! as reused, for isolation receipts.

use std::sync::Arc;

use half::f16;
use pagewarden_types::namespace::Namespace;
use pagewarden_types::RequestId;

use crate::error::ReadError;
use crate::ids::{Generation, PageId};
use crate::pool::PoolInner;

/// Read-only pins on the cached pages of one prefix, in token order, each full. While it
/// lives its pages are never written, released, evicted or reused. `Send + Sync`, `!Clone`.
pub struct SharedPages {
    pool: Arc<PoolInner>,
    namespace: Namespace,
    table: Vec<(PageId, Generation)>,
    /// The request that published each page of `table` (read under the index lock at pin
    /// time, beside the page it names).
    producers: Vec<RequestId>,
    /// The prefix index's clock when the pins were taken (see `PrefixIndex::erased_at`).
    pinned_at: u64,
}

/// Consecutive pinned pages all published by one request: a run of cached KV reused instead
/// of computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinnedRun<'a> {
    /// The request whose computation published the pages.
    pub producer: RequestId,
    /// Tokens of KV in the run (`pages.len() * page_size`: cached pages are full).
    pub tokens: usize,
    /// `(page, generation)` of each page of the run, in token order.
    pub pages: &'a [(PageId, Generation)],
}

impl SharedPages {
    pub(crate) fn new(
        pool: Arc<PoolInner>,
        namespace: Namespace,
        table: Vec<(PageId, Generation)>,
        producers: Vec<RequestId>,
        pinned_at: u64,
    ) -> Self {
        debug_assert_eq!(table.len(), producers.len(), "one producer per pinned page");
        Self {
            pool,
            namespace,
            table,
            producers,
            pinned_at,
        }
    }

    pub(crate) fn pinned_at(&self) -> u64 {
        self.pinned_at
    }

    pub(crate) fn pool(&self) -> &Arc<PoolInner> {
        &self.pool
    }

    /// The namespace the pages were cached under (and looked up in).
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// Tokens of KV the pinned pages hold (`pages * page_size`: only full pages are cached).
    pub fn len(&self) -> usize {
        self.table.len() * self.pool.cfg.layout.page_size
    }

    /// Whether nothing was cached.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// `(page, generation)` for each pinned page in token order.
    pub fn table(&self) -> &[(PageId, Generation)] {
        &self.table
    }

    /// The pinned pages as runs of consecutive pages with the same producer, in token order
    /// (empty when nothing was cached). Every pinned page is in exactly one run.
    pub fn runs(&self) -> Vec<PinnedRun<'_>> {
        let ps = self.pool.cfg.layout.page_size;
        let mut runs = Vec::new();
        let mut start = 0;
        for same in self.producers.chunk_by(|a, b| a == b) {
            let end = start + same.len();
            if let (Some(pages), Some(&producer)) = (self.table.get(start..end), same.first()) {
                runs.push(PinnedRun {
                    producer,
                    tokens: pages.len() * ps,
                    pages,
                });
            }
            start = end;
        }
        runs
    }

    /// The K and V blocks of `layer` in pinned page `page_index`, as
    /// `ReadablePages::layer_block`: the presented generation is checked against the page's
    /// current one on every call (I1).
    #[inline]
    pub fn layer_block(
        &self,
        layer: usize,
        page_index: usize,
    ) -> Result<(&[f16], &[f16]), ReadError> {
        if layer >= self.pool.cfg.layout.layers {
            return Err(ReadError::OutOfRange);
        }
        let page = self.pool.checked_read(self.table.get(page_index))?;
        // SAFETY: the page is Shared and pinned by `self`: no write path reaches a Shared
        // page, and it cannot be evicted (zeroed) while it has a reader.
        Ok(unsafe { self.pool.layer_blocks(page, layer) })
    }

    /// Whole page bytes (all layers) of pinned page `page_index`. Generation-checked.
    pub fn page_bytes(&self, page_index: usize) -> Result<&[u8], ReadError> {
        let page = self.pool.checked_read(self.table.get(page_index))?;
        // SAFETY: as in `layer_block`: pinned and Shared, so no writer.
        Ok(unsafe { self.pool.store.bytes(page) })
    }

    /// TEST-ONLY: replace the generation this table presents for page `index`, to exercise
    /// the read-side check.
    #[cfg(any(test, feature = "unsafe-test-switches"))]
    pub fn test_set_table_generation(&mut self, index: usize, generation: Generation) {
        self.table[index].1 = generation;
    }
}

impl Drop for SharedPages {
    fn drop(&mut self) {
        for (page, _) in &self.table {
            self.pool.unpin_page(*page);
        }
    }
}

impl std::fmt::Debug for SharedPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPages")
            .field("namespace", &self.namespace)
            .field("table", &self.table)
            .field("producers", &self.producers)
            .finish()
    }
}
