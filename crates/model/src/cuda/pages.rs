//! Host-side bookkeeping of the device KV pool: the free list of device page ids, each page's
//! current generation, and the generation updates still to be copied to the device.
//!
//! Every allocation and every release bumps the page's generation, so a page table kept by a
//! sequence that no longer owns a page presents an old generation and the GPU kernels refuse it
//! (invariant I1). A page's lifecycle: `Free --allocate--> Owned(gen) --release|revoke--> Free`;
//! each arrow bumps the generation.

/// A page of the device pool (index into `DeviceKvPool`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePageId(pub u32);

/// A page's generation: the value an owner presents and the pool checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageGeneration(pub u64);

/// One entry of a sequence's page table: the page and the generation its owner holds.
pub type PageEntry = (DevicePageId, PageGeneration);

/// Free list and generations of every page of one device pool.
#[derive(Debug)]
pub struct PageBook {
    /// Free pages; the next allocation pops from the end.
    free: Vec<DevicePageId>,
    /// Whether each page is on the free list (guards against a double release).
    is_free: Vec<bool>,
    /// Current generation of each page (the device copy follows through `take_updates`).
    current: Vec<u64>,
    /// Pages whose generation changed since the last `take_updates`.
    dirty: Vec<DevicePageId>,
    is_dirty: Vec<bool>,
}

impl PageBook {
    /// A book of `pages` free pages, all at generation 0 (as a fresh device pool).
    pub fn new(pages: usize) -> PageBook {
        assert!(pages <= u32::MAX as usize, "at most 2^32 - 1 pages");
        PageBook {
            free: (0..pages as u32).rev().map(DevicePageId).collect(),
            is_free: vec![true; pages],
            current: vec![0; pages],
            dirty: Vec::new(),
            is_dirty: vec![false; pages],
        }
    }

    /// Number of pages in the pool.
    pub fn pages(&self) -> usize {
        self.current.len()
    }

    /// Pages on the free list.
    pub fn free_pages(&self) -> usize {
        self.free.len()
    }

    /// The page's current generation (`None` for a page outside the pool).
    pub fn current(&self, page: DevicePageId) -> Option<PageGeneration> {
        self.current
            .get(page.0 as usize)
            .map(|&g| PageGeneration(g))
    }

    /// Takes `n` pages off the free list, each at a freshly bumped generation; `None` (and
    /// nothing taken) when fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<PageEntry>> {
        if n > self.free.len() {
            return None;
        }
        let at = self.free.len() - n;
        let taken: Vec<DevicePageId> = self.free.drain(at..).rev().collect();
        Some(
            taken
                .into_iter()
                .map(|p| {
                    self.is_free[p.0 as usize] = false;
                    (p, self.bump(p))
                })
                .collect(),
        )
    }

    /// Returns an owner's pages. A page whose generation is no longer the presented one was
    /// already taken from this owner (revoked) and is left alone. Returns how many were freed.
    pub fn release(&mut self, pages: &[PageEntry]) -> usize {
        let mut freed = 0;
        for &(p, g) in pages {
            if self.current(p) == Some(g) && !self.is_free[p.0 as usize] {
                self.bump(p);
                self.is_free[p.0 as usize] = true;
                self.free.push(p);
                freed += 1;
            }
        }
        freed
    }

    /// Takes `page` away from whoever owns it (as a pool does when it quarantines or reassigns
    /// a page): bumps its generation and puts it back on the free list. The old owner's table
    /// now presents a stale generation.
    pub fn revoke(&mut self, page: DevicePageId) -> Option<PageGeneration> {
        let i = page.0 as usize;
        if i >= self.current.len() {
            return None;
        }
        let g = self.bump(page);
        if !self.is_free[i] {
            self.is_free[i] = true;
            self.free.push(page);
        }
        Some(g)
    }

    /// The generation changes not yet on the device, as `(page ids, generations)` for
    /// `CudaBackend::set_generations`; clears the list.
    pub fn take_updates(&mut self) -> (Vec<u32>, Vec<u64>) {
        let pages = std::mem::take(&mut self.dirty);
        let mut ids = Vec::with_capacity(pages.len());
        let mut gens = Vec::with_capacity(pages.len());
        for p in pages {
            self.is_dirty[p.0 as usize] = false;
            ids.push(p.0);
            gens.push(self.current[p.0 as usize]);
        }
        (ids, gens)
    }

    fn bump(&mut self, p: DevicePageId) -> PageGeneration {
        let i = p.0 as usize;
        self.current[i] += 1;
        if !self.is_dirty[i] {
            self.is_dirty[i] = true;
            self.dirty.push(p);
        }
        PageGeneration(self.current[i])
    }
}

/// A sequence on the GPU: its page table (with the generations it was granted) and its length.
/// Release it with [`super::GpuModel::release`].
#[derive(Debug, Default)]
pub struct GpuSequence {
    pub(crate) table: Vec<PageEntry>,
    pub(crate) len: usize,
}

impl GpuSequence {
    /// Tokens whose K/V are in the sequence's pages.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before the first prefill.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The page table: each page with the generation this sequence presents.
    pub fn pages(&self) -> &[PageEntry] {
        &self.table
    }

    /// Grows the table from `book` until it holds `tokens` tokens of `page_size`; all or
    /// nothing. Returns the pages still missing when the pool is short.
    pub(crate) fn grow(
        &mut self,
        book: &mut PageBook,
        tokens: usize,
        page_size: usize,
    ) -> Result<(), (usize, usize)> {
        let need = tokens.div_ceil(page_size).saturating_sub(self.table.len());
        if need == 0 {
            return Ok(());
        }
        match book.allocate(need) {
            Some(pages) => {
                self.table.extend(pages);
                Ok(())
            }
            None => Err((need, book.free_pages())),
        }
    }

    /// `(page id, generation)` pairs as the attention kernel takes them.
    pub(crate) fn raw_table(&self) -> Vec<(u32, u64)> {
        self.table.iter().map(|(p, g)| (p.0, g.0)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_bumps_generations_and_queues_device_updates() {
        let mut b = PageBook::new(4);
        let a = b.allocate(2).unwrap();
        assert_eq!(a.len(), 2);
        assert!(a.iter().all(|&(_, g)| g == PageGeneration(1)));
        assert_ne!(a[0].0, a[1].0);
        assert_eq!(b.free_pages(), 2);
        let (ids, gens) = b.take_updates();
        let mut got: Vec<(u32, u64)> = ids.into_iter().zip(gens).collect();
        got.sort();
        let mut want: Vec<(u32, u64)> = a.iter().map(|(p, g)| (p.0, g.0)).collect();
        want.sort();
        assert_eq!(got, want);
        assert_eq!(b.take_updates(), (vec![], vec![]), "updates are taken once");
    }

    #[test]
    fn allocation_is_all_or_nothing() {
        let mut b = PageBook::new(3);
        assert!(b.allocate(4).is_none());
        assert_eq!(b.free_pages(), 3);
        assert!(b.take_updates().0.is_empty());
        assert_eq!(b.allocate(3).unwrap().len(), 3);
        assert!(b.allocate(1).is_none());
    }

    #[test]
    fn reallocated_page_never_reuses_a_generation() {
        let mut b = PageBook::new(1);
        let first = b.allocate(1).unwrap();
        assert_eq!(b.release(&first), 1);
        let second = b.allocate(1).unwrap();
        assert_eq!(first[0].0, second[0].0);
        assert!(second[0].1 > first[0].1);
        assert_ne!(
            b.current(first[0].0),
            Some(first[0].1),
            "old table is stale"
        );
        let (ids, gens) = b.take_updates();
        assert_eq!(
            (ids, gens),
            (vec![0], vec![second[0].1 .0]),
            "latest generation only"
        );
    }

    #[test]
    fn revoked_page_is_stale_for_its_owner_and_not_freed_twice() {
        let mut b = PageBook::new(2);
        let mine = b.allocate(2).unwrap();
        let victim = mine[0].0;
        let g = b.revoke(victim).unwrap();
        assert!(g > mine[0].1);
        assert_eq!(b.free_pages(), 1);
        // The old owner's release frees only the page it still owns.
        assert_eq!(b.release(&mine), 1);
        assert_eq!(b.free_pages(), 2);
        assert_eq!(b.release(&mine), 0, "a second release frees nothing");
        assert_eq!(b.free_pages(), 2);
        assert!(b.revoke(DevicePageId(9)).is_none());
    }

    #[test]
    fn sequence_grows_page_by_page() {
        let mut b = PageBook::new(3);
        let mut s = GpuSequence::default();
        s.grow(&mut b, 5, 4).unwrap();
        assert_eq!(s.pages().len(), 2);
        s.grow(&mut b, 8, 4).unwrap();
        assert_eq!(s.pages().len(), 2);
        assert_eq!(s.grow(&mut b, 20, 4), Err((3, 1)));
        assert_eq!(s.pages().len(), 2, "nothing taken on failure");
        s.grow(&mut b, 12, 4).unwrap();
        assert_eq!(s.raw_table().len(), 3);
        assert!(s.raw_table().iter().all(|&(_, g)| g == 1));
    }
}
