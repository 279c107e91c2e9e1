//! Page shape (`KvLayout`) and pool configuration (`PoolConfig`, test-only `Defenses`).

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, WallClock};

/// Shape of one page. A page holds `page_size` tokens of K and V for ALL layers, f16,
/// contiguous: `[layer][K|V][slot][head][dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Transformer layers.
    pub layers: usize,
    /// Key/value heads per layer.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Tokens per page (default 16).
    pub page_size: usize,
}

/// Tokens per page unless configured otherwise.
pub const DEFAULT_PAGE_SIZE: usize = 16;

impl KvLayout {
    /// f16 elements per token per K or V: `kv_heads * head_dim`.
    pub fn token_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// f16 elements in one page: `layers * 2 * page_size * token_width`.
    pub fn page_elems(&self) -> usize {
        self.layers * 2 * self.page_size * self.token_width()
    }

    /// Bytes in one page (`page_elems * 2`).
    pub fn page_bytes(&self) -> usize {
        self.page_elems() * 2
    }

    /// Element offset inside a page of the K (`kind = 0`) or V (`kind = 1`) block of `layer`:
    /// `((layer * 2 + kind) * page_size) * token_width`. Within that block, token slot `s`,
    /// head `h`, dim `d` is at `s * token_width + h * head_dim + d`.
    pub fn block_offset(&self, layer: usize, kind: usize) -> usize {
        ((layer * 2 + kind) * self.page_size) * self.token_width()
    }

    /// f16 elements in one K or V block of one layer (`page_size * token_width`).
    pub fn block_elems(&self) -> usize {
        self.page_size * self.token_width()
    }

    /// Zeroes the rows of token slots `tokens..page_size` in every layer's K and V block of
    /// one page's bytes (`page_bytes` long), so a page leaving the pool carries only rows
    /// written for its request (I12). A full page (`tokens >= page_size`) is left as it is.
    pub fn zero_unwritten_rows(&self, page: &mut [u8], tokens: usize) {
        if tokens >= self.page_size {
            return;
        }
        assert_eq!(page.len(), self.page_bytes(), "not one page of this layout");
        let row = self.token_width() * 2;
        for layer in 0..self.layers {
            for kind in 0..2 {
                let block = self.block_offset(layer, kind) * 2;
                page[block + tokens * row..block + self.page_size * row].fill(0);
            }
        }
    }

    /// Pages needed to hold `tokens` tokens.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_size)
    }
}

/// Configuration of one pool.
///
/// Build it with [`PoolConfig::with_pages`] or [`PoolConfig::from_byte_budget`] and then set
/// fields; the struct may gain fields, so struct literals outside this crate will break.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Shape of each page.
    pub layout: KvLayout,
    /// Number of pages.
    pub pages: usize,
    /// Zero a page's bytes when it returns to the free list.
    pub zero_on_release: bool,
    /// How long a revoked grant may wait for its drain confirmation before its pages move to
    /// quarantine (on the next `sweep_expired`).
    pub drain_timeout: Duration,
    /// Idle lifetime of a write grant (`WriteGrant::idle_ttl`): after this long with no write
    /// landing, commit fails with `CommitError::Expired`.
    pub grant_ttl: Duration,
    /// Commit re-reads every landed page and compares it with the checksum taken as it
    /// landed (on by default). Each page is hashed under its lock as it lands, and commit
    /// always compares the sender's manifest with those landed checksums; this second pass
    /// catches what changed a page after it landed, such as a late write that got past the
    /// fence (the checksum defense of the incident's second bug class). It costs one more
    /// pass over the prompt's KV between the last page and the first decode step, spread
    /// over the rayon pool for large grants (`cargo bench -p pagewarden-transfer --bench
    /// goodput` measures both settings). Off trusts the fence alone for that window.
    pub commit_rehash: bool,
    /// Revoking a grant is its drain: every write into this pool lands through
    /// `KvPool::write_page`, which copies under the page's lock and only into a page reserved
    /// for a live grant, and revoking takes each page's lock, so once a grant is revoked no
    /// write of it is mid-copy and none can land later. Its pages are then freed at once when
    /// it ends without a commit. Off (the default) waits for the transfer's drain confirmation
    /// or the drain timeout, as a pool that a NIC writes without that copy must.
    pub revocation_drains: bool,
    /// The pool's clock: grants' idle lifetimes and drain timeouts count on it (the wall
    /// clock by default; a test moves a `ManualClock`).
    pub clock: Arc<dyn Clock>,
    /// Prefix cache: pages each namespace may keep cached (LRU within it beyond that). 0 (the
    /// default) turns the cache off: `publish_prefix` frees every page.
    pub prefix_pages_per_namespace: usize,
    /// TEST-ONLY switches that remove single defenses (feature `unsafe-test-switches`).
    #[cfg(any(test, feature = "unsafe-test-switches"))]
    pub defenses: Defenses,
}

impl PoolConfig {
    /// A pool of exactly `pages` pages, defaults elsewhere (no zeroing, 5 s drain timeout,
    /// 60 s grant lifetime, re-hash on commit, revocation not taken as the drain, no prefix
    /// cache).
    pub fn with_pages(layout: KvLayout, pages: usize) -> Self {
        Self {
            layout,
            pages,
            zero_on_release: false,
            drain_timeout: Duration::from_secs(5),
            grant_ttl: Duration::from_secs(60),
            commit_rehash: true,
            revocation_drains: false,
            clock: Arc::new(WallClock),
            prefix_pages_per_namespace: 0,
            #[cfg(any(test, feature = "unsafe-test-switches"))]
            defenses: Defenses::default(),
        }
    }

    /// As many pages as fit in `bytes` (`bytes / page_bytes`, guard words not counted).
    pub fn from_byte_budget(layout: KvLayout, bytes: usize) -> Self {
        let per = layout.page_bytes().max(1);
        Self::with_pages(layout, bytes / per)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_unwritten_rows_clears_exactly_the_unused_slots() {
        let l = KvLayout {
            layers: 2,
            kv_heads: 1,
            head_dim: 2,
            page_size: 4,
        };
        let mut page = vec![0xAB; l.page_bytes()];
        l.zero_unwritten_rows(&mut page, 1);
        let row = l.token_width() * 2;
        for layer in 0..2 {
            for kind in 0..2 {
                let b = l.block_offset(layer, kind) * 2;
                assert!(page[b..b + row].iter().all(|&x| x == 0xAB));
                assert!(page[b + row..b + 4 * row].iter().all(|&x| x == 0));
            }
        }
        let mut full = vec![0xAB; l.page_bytes()];
        l.zero_unwritten_rows(&mut full, 4);
        assert!(full.iter().all(|&x| x == 0xAB));
    }
}

/// TEST-ONLY: which defenses are active. All on by default. Exists only with `cfg(test)` or
/// the `unsafe-test-switches` feature; in normal builds every check is unconditional code.
#[cfg(any(test, feature = "unsafe-test-switches"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defenses {
    /// Every read compares the presented generation with the page's current one (I1).
    pub read_generation_check: bool,
    /// Commit verifies tokens written == tokens reserved, in total and per page, and that
    /// every granted page was written (I2).
    pub commit_token_count: bool,
    /// Writes verify their checksum and commit verifies manifest/landed checksums, one per
    /// granted page.
    pub checksum_check: bool,
    /// Writes must carry a live grant for a page reserved to it at the presented generation.
    /// Off: a write lands on the page whatever its state (an unfenced one-sided write). Data
    /// race if the page is read concurrently: single-threaded tests only.
    pub grant_fencing: bool,
}

#[cfg(any(test, feature = "unsafe-test-switches"))]
impl Default for Defenses {
    fn default() -> Self {
        Self {
            read_generation_check: true,
            commit_token_count: true,
            checksum_check: true,
            grant_fencing: true,
        }
    }
}
