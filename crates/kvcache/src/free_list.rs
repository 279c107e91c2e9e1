//! The free list: a mutex-guarded stack of page ids. All-or-nothing takes, so a failed
//! reservation changes no page's state.

use crate::ids::PageId;
use crate::sync::{Mutex, MutexGuard};

/// Stack of free pages. Public so the loom test can drive it in isolation.
#[derive(Debug)]
pub struct FreeList {
    pages: Mutex<Vec<PageId>>,
}

impl FreeList {
    /// A list holding pages `0..n`; page 0 is taken first.
    pub fn new(n: usize) -> Self {
        let pages = (0..n as u32).rev().map(PageId).collect();
        Self {
            pages: Mutex::new(pages),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<PageId>> {
        // The Vec is never left half-updated, so a poisoned lock still guards valid data.
        self.pages.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes exactly `n` pages, or none: `Err(free)` with the number free at the time.
    pub fn take(&self, n: usize) -> Result<Vec<PageId>, usize> {
        let mut pages = self.lock();
        if pages.len() < n {
            return Err(pages.len());
        }
        let at = pages.len() - n;
        let mut taken = pages.split_off(at);
        taken.reverse();
        Ok(taken)
    }

    /// Returns pages to the list. Callers have already moved them to `PageState::Free`.
    pub fn put(&self, pages: &[PageId]) {
        self.lock().extend(pages.iter().rev().copied());
    }

    /// Number of free pages.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no page is free.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
