//! Loom model check of the free list under concurrent take/put: no page is ever held by two
//! takers at once, a failed take changes nothing, and every page comes back.
//!
//! Run: RUSTFLAGS="--cfg pagewarden_loom" cargo test -p pagewarden-kvcache --test loom --release
#![cfg(pagewarden_loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;
use pagewarden_kvcache::{FreeList, PageId};

const PAGES: usize = 3;

struct Owned([AtomicBool; PAGES]);

impl Owned {
    fn claim(&self, pages: &[PageId]) {
        for p in pages {
            assert!(
                !self.0[p.index()].swap(true, Ordering::SeqCst),
                "{p} handed out twice"
            );
        }
    }

    fn release(&self, pages: &[PageId]) {
        for p in pages {
            self.0[p.index()].store(false, Ordering::SeqCst);
        }
    }
}

fn worker(list: Arc<FreeList>, owned: Arc<Owned>, n: usize) -> thread::JoinHandle<bool> {
    thread::spawn(move || match list.take(n) {
        Ok(pages) => {
            assert_eq!(pages.len(), n);
            owned.claim(&pages);
            owned.release(&pages);
            list.put(&pages);
            true
        }
        Err(free) => {
            assert!(free < n, "take({n}) refused with {free} free");
            false
        }
    })
}

#[test]
fn concurrent_take_and_put_never_share_a_page() {
    loom::model(|| {
        let list = Arc::new(FreeList::new(PAGES));
        let owned = Arc::new(Owned(Default::default()));
        let a = worker(list.clone(), owned.clone(), 2);
        let b = worker(list.clone(), owned.clone(), 2);
        let took_a = a.join().unwrap();
        let took_b = b.join().unwrap();
        // At least one of two 2-page takes from 3 pages succeeds.
        assert!(took_a || took_b);
        assert_eq!(list.len(), PAGES);
        let all = list.take(PAGES).unwrap();
        owned.claim(&all);
    });
}

#[test]
fn three_threads_single_pages() {
    loom::model(|| {
        let list = Arc::new(FreeList::new(2));
        let owned = Arc::new(Owned(Default::default()));
        let hs: Vec<_> = (0..3)
            .map(|_| worker(list.clone(), owned.clone(), 1))
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(list.len(), 2);
    });
}
