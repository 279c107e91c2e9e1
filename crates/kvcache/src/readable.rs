//! `ReadablePages`: pages a request owns and may read; the only type attention accepts.
//! `layer_block` and `kv_row_mut` are the attention hot path: one atomic load (the page's
//! generation) plus pointer arithmetic, no lock, no allocation.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use half::f16;

use crate::error::{ReadError, ReserveError};
use crate::ids::{Generation, PageId};
use crate::pool::PoolInner;
use crate::Owner;

/// Pages a request owns and may read. `Send`, `!Clone`. Dropping it returns its pages to the
/// free list (RAII), zeroed if configured.
pub struct ReadablePages {
    pool: Arc<PoolInner>,
    owner: Owner,
    table: Vec<(PageId, Generation)>,
    len: usize,
}

impl ReadablePages {
    pub(crate) fn new(
        pool: Arc<PoolInner>,
        owner: Owner,
        table: Vec<(PageId, Generation)>,
        len: usize,
    ) -> Self {
        Self {
            pool,
            owner,
            table,
            len,
        }
    }

    pub(crate) fn pool(&self) -> &Arc<PoolInner> {
        &self.pool
    }

    /// Who owns these pages.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// Tokens holding valid KV.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token holds valid KV yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens the pages can hold (`pages * page_size`).
    pub fn capacity(&self) -> usize {
        self.table.len() * self.pool.cfg.layout.page_size
    }

    /// The shape of every page.
    pub fn layout(&self) -> crate::KvLayout {
        self.pool.cfg.layout
    }

    /// `(page, generation)` for each page in token order.
    pub fn table(&self) -> &[(PageId, Generation)] {
        &self.table
    }

    /// Valid tokens in page `index` (full pages, then the remainder of `len`, then 0).
    pub fn page_tokens(&self, index: usize) -> usize {
        let ps = self.pool.cfg.layout.page_size;
        self.len.saturating_sub(index * ps).min(ps)
    }

    /// Allocate more pages so `capacity() >= tokens` (decode appending generated tokens).
    /// No-op if the capacity already suffices; on error nothing changed.
    pub fn grow(&mut self, tokens: usize) -> Result<(), ReserveError> {
        let cap = self.capacity();
        if tokens <= cap {
            return Ok(());
        }
        let capacity_tokens = self.pool.cfg.pages * self.pool.cfg.layout.page_size;
        if tokens > capacity_tokens {
            return Err(ReserveError::TooLarge {
                requested_tokens: tokens,
                capacity_tokens,
            });
        }
        let more = self.pool.claim(tokens - cap, &self.owner, |_| {
            crate::page::PageState::Readable
        })?;
        self.table.extend(more);
        Ok(())
    }

    /// Mark tokens `[0, len)` as holding valid KV (after the owner wrote them).
    /// Panics if `len > capacity()`.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity(),
            "set_len({len}) beyond capacity {}",
            self.capacity()
        );
        self.len = len;
    }

    /// Checks the presented generation of page `index` against the page's current one (I1).
    #[inline]
    fn checked_page(&self, index: usize) -> Result<PageId, ReadError> {
        self.pool.checked_read(self.table.get(index))
    }

    /// Takes the table and token count out without freeing the pages (the caller moves them
    /// on: `publish_prefix`).
    pub(crate) fn into_table(mut self) -> (Vec<(PageId, Generation)>, usize) {
        // `self` then drops with an empty table: nothing is freed.
        let table = std::mem::take(&mut self.table);
        (table, self.len)
    }

    /// Mutable K and V rows for one token position at one layer (each `token_width` f16).
    /// Checks the page's generation (I1). `pos < capacity()`.
    #[inline]
    pub fn kv_row_mut(
        &mut self,
        layer: usize,
        pos: usize,
    ) -> Result<(&mut [f16], &mut [f16]), ReadError> {
        let l = self.pool.cfg.layout;
        if layer >= l.layers {
            return Err(ReadError::OutOfRange);
        }
        let page = self.checked_page(pos / l.page_size)?;
        let slot = pos % l.page_size;
        let tw = l.token_width();
        let base = self.pool.store.page_ptr(page).cast::<f16>();
        // SAFETY: layer < layers and slot < page_size, so both rows lie inside the page and do
        // not overlap (K block before V block). The page is Readable and owned by `self`;
        // `&mut self` makes this the only live reference into the page's bytes.
        unsafe {
            let k = base.add(l.block_offset(layer, 0) + slot * tw);
            let v = base.add(l.block_offset(layer, 1) + slot * tw);
            Ok((
                std::slice::from_raw_parts_mut(k, tw),
                std::slice::from_raw_parts_mut(v, tw),
            ))
        }
    }

    /// Read access for attention: for page index `page_index` of this request, the K block and
    /// V block of `layer` (each `page_size * token_width` f16). Checks the presented generation
    /// against the page's current one on every call (I1); a mismatch is
    /// `ReadError::GenerationMismatch`, counted in metrics.
    #[inline]
    pub fn layer_block(
        &self,
        layer: usize,
        page_index: usize,
    ) -> Result<(&[f16], &[f16]), ReadError> {
        if layer >= self.pool.cfg.layout.layers {
            return Err(ReadError::OutOfRange);
        }
        let page = self.checked_page(page_index)?;
        // SAFETY: the page is Readable and owned by `self`; writers need `&mut self`
        // (kv_row_mut), so none is live while the returned borrow of `self` is.
        Ok(unsafe { self.pool.layer_blocks(page, layer) })
    }

    /// Whole page bytes (all layers), for the transfer sender. Generation-checked.
    pub fn page_bytes(&self, page_index: usize) -> Result<&[u8], ReadError> {
        let page = self.checked_page(page_index)?;
        // SAFETY: the page is Readable and owned by `self`; no writer while `&self` lives.
        Ok(unsafe { self.pool.store.bytes(page) })
    }

    /// TEST-ONLY: replace the generation this table presents for page `index`, to exercise
    /// the read-side check.
    #[cfg(any(test, feature = "unsafe-test-switches"))]
    pub fn test_set_table_generation(&mut self, index: usize, generation: Generation) {
        self.table[index].1 = generation;
    }
}

impl PoolInner {
    /// The page of a reader's table entry, after checking the generation it presents against
    /// the page's current one (I1); a mismatch is counted. `None`: out of range.
    #[inline]
    pub(crate) fn checked_read(
        &self,
        entry: Option<&(PageId, Generation)>,
    ) -> Result<PageId, ReadError> {
        let &(page, expected) = entry.ok_or(ReadError::OutOfRange)?;
        if self.check_read_generation() {
            let current = self.slots[page.index()].generation.load(Ordering::Acquire);
            if current != expected.0 {
                self.metrics.add(|m| &m.generation_mismatches, 1);
                return Err(ReadError::GenerationMismatch {
                    page,
                    expected,
                    current: Generation(current),
                });
            }
        }
        Ok(page)
    }

    /// The K and V blocks of `layer` in `page` (each `page_size * token_width` f16).
    ///
    /// # Safety
    /// `layer < layers`, and no writer touches the page while the returned slices live.
    #[inline]
    pub(crate) unsafe fn layer_blocks(&self, page: PageId, layer: usize) -> (&[f16], &[f16]) {
        let l = self.cfg.layout;
        let n = l.block_elems();
        let base = self.store.page_ptr(page).cast::<f16>();
        // SAFETY: both blocks lie inside the page (layer < layers, caller contract); no
        // writer by caller contract.
        unsafe {
            (
                std::slice::from_raw_parts(base.add(l.block_offset(layer, 0)), n),
                std::slice::from_raw_parts(base.add(l.block_offset(layer, 1)), n),
            )
        }
    }
}

impl Drop for ReadablePages {
    fn drop(&mut self) {
        self.pool.release_readable(&self.table);
    }
}

impl std::fmt::Debug for ReadablePages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadablePages")
            .field("owner", &self.owner)
            .field("len", &self.len)
            .field("table", &self.table)
            .finish()
    }
}
