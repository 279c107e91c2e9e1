//! Page bytes: one anonymous mapping for the whole pool (zero pages the kernel backs only
//! when first written, so a pool's resident size is the pages it has used, not its
//! capacity). Each page slot is the page's data followed by its guard word, so an overrun of
//! a page lands on the guard, not on the next page, and a transfer (which writes exactly
//! `page_bytes`) can never forge the guard.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use memmap2::MmapMut;

use crate::ids::{Generation, PageId};

const ALIGN: usize = 64;

pub(crate) struct PageStore {
    base: NonNull<u8>,
    /// The mapping `base` points into (none for an empty pool); unmapped on drop.
    _map: Option<MmapMut>,
    page_bytes: usize,
    guard_at: usize,
    stride: usize,
    pages: usize,
    secret: u64,
}

// SAFETY: the store is a plain byte buffer; which thread may touch which page is governed by
// page ownership (ReadablePages, the page's metadata lock), documented at each access.
unsafe impl Send for PageStore {}
// SAFETY: as above.
unsafe impl Sync for PageStore {}

impl PageStore {
    pub(crate) fn new(page_bytes: usize, pages: usize) -> Self {
        let guard_at = page_bytes.next_multiple_of(8);
        let stride = (guard_at + 8).next_multiple_of(ALIGN);
        let size = stride
            .checked_mul(pages)
            .expect("pool size overflows usize");
        let (base, map) = if size == 0 {
            (NonNull::<u64>::dangling().cast(), None)
        } else {
            // Every page starts at generation 0, whose guard word is defined as 0: the zero
            // pages of a fresh anonymous mapping, page-aligned (so every slot is ALIGN-aligned).
            // An allocator's zeroed memory would not do: for this alignment it writes the zeros,
            // making the whole capacity resident at start.
            let mut map = MmapMut::map_anon(size).unwrap_or_else(|_| {
                alloc::handle_alloc_error(
                    Layout::from_size_align(size, ALIGN).expect("pool layout"),
                )
            });
            let base = NonNull::new(map.as_mut_ptr()).expect("a mapping is never at address 0");
            (base, Some(map))
        };
        Self {
            base,
            _map: map,
            page_bytes,
            guard_at,
            stride,
            pages,
            secret: rand::random(),
        }
    }

    /// Pointer to the first byte of `page`. Panics if the page is out of range.
    #[inline]
    pub(crate) fn page_ptr(&self, page: PageId) -> *mut u8 {
        assert!(page.index() < self.pages, "{page} out of range");
        // SAFETY: in bounds of the allocation (checked above).
        unsafe { self.base.as_ptr().add(page.index() * self.stride) }
    }

    pub(crate) fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    fn guard_ptr(&self, page: PageId) -> *mut u64 {
        // SAFETY: guard_at + 8 <= stride, so in bounds; 8-aligned because stride and guard_at
        // are multiples of 8 and base is 64-aligned.
        unsafe { self.page_ptr(page).add(self.guard_at).cast() }
    }

    /// The guard word `page` should carry at `generation`; generation 0 (never allocated)
    /// is 0 so a fresh zeroed pool is consistent.
    pub(crate) fn expected_guard(&self, page: PageId, generation: Generation) -> u64 {
        if generation.0 == 0 {
            return 0;
        }
        let mut bytes = [0u8; 12];
        bytes[..4].copy_from_slice(&page.0.to_le_bytes());
        bytes[4..].copy_from_slice(&generation.0.to_le_bytes());
        xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, self.secret) | 1
    }

    /// Caller holds `page`'s metadata lock.
    pub(crate) fn guard(&self, page: PageId) -> u64 {
        // SAFETY: in bounds and aligned (guard_ptr); guard words are only touched under the
        // page's metadata lock, which the caller holds.
        unsafe { self.guard_ptr(page).read_volatile() }
    }

    /// Caller holds `page`'s metadata lock.
    pub(crate) fn set_guard(&self, page: PageId, value: u64) {
        // SAFETY: as in `guard`.
        unsafe { self.guard_ptr(page).write_volatile(value) }
    }

    /// Caller has exclusive access to the page (its metadata lock, with no reader).
    pub(crate) fn zero(&self, page: PageId) {
        // SAFETY: page_bytes bytes from page_ptr are in bounds; exclusive by caller contract.
        unsafe { self.page_ptr(page).write_bytes(0, self.page_bytes) }
    }

    /// Copies one page of data in. Caller has exclusive access (metadata lock held, page
    /// reserved to the writer's grant) and `data.len() == page_bytes`.
    pub(crate) fn write(&self, page: PageId, data: &[u8]) {
        assert_eq!(data.len(), self.page_bytes());
        // SAFETY: lengths equal, in bounds; `data` is caller memory, so no overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.page_ptr(page), self.page_bytes)
        }
    }

    /// The page's bytes. Caller guarantees no concurrent writer for the returned lifetime.
    pub(crate) unsafe fn bytes(&self, page: PageId) -> &[u8] {
        // SAFETY: in bounds; no writer by caller contract.
        unsafe { std::slice::from_raw_parts(self.page_ptr(page), self.page_bytes) }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn resident_bytes() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
        let kb: usize = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS line");
        kb * 1024
    }

    #[test]
    fn a_pool_is_resident_only_where_pages_were_written() {
        const PAGE: usize = 1 << 20;
        let before = resident_bytes();
        let store = PageStore::new(PAGE, 2048);
        let fresh = resident_bytes().saturating_sub(before);
        assert!(
            fresh < 256 << 20,
            "a fresh 2 GiB pool made {fresh} bytes resident"
        );
        let page = vec![7u8; PAGE];
        for i in 0..64 {
            store.write(PageId(i), &page);
        }
        let used = resident_bytes().saturating_sub(before);
        assert!(
            used >= 64 * PAGE,
            "64 written pages of 1 MiB, {used} bytes resident"
        );
        // The pages not written read as generation 0's zeros.
        let untouched = store.page_ptr(PageId(2047));
        // SAFETY: in bounds of the store, not shared with any other thread in this test.
        assert_eq!(unsafe { *untouched }, 0);
    }
}
