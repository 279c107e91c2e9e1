//! Receiver-side seam: where checked page writes go. `KvPool` implements it (`pool_sink.rs`);
//! [`MemorySink`] is a small in-memory stand-in for unit tests.

use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;

use crate::types::{page_checksum, Generation, GrantKey, PageId, PageWrite, WriteError};

/// Destination of checked page writes on the receiving side.
///
/// `write_page` must check the grant, page, generation, length and checksum before writing a
/// byte (the pool's job); the receiver only calls it and counts what it returns.
pub trait PageSink: Send + Sync {
    /// Bytes in one page; larger WRITE frames are malformed.
    fn page_bytes(&self) -> usize;
    /// Pages in the pool; a WRITE naming a page beyond it is malformed.
    fn page_count(&self) -> usize;
    /// Writes one page under a grant, or says why it was dropped.
    fn write_page(&self, w: PageWrite<'_>) -> Result<(), WriteError>;
    /// Every write of `key` sent on a stream has been processed: no write of it can still land.
    fn mark_drained(&self, key: GrantKey);
    /// The connection that carried `key` is torn down and no frame of it can still arrive,
    /// yet its drain was never seen: quarantined pages of `key` may be released.
    fn peer_gone(&self, key: GrantKey);
    /// Whether `key` is a live grant. The RDMA backend binds a memory window only for a live
    /// grant (defense in depth: every staged page still goes through `write_page`). The default
    /// says yes, leaving the decision to `write_page`.
    fn grant_is_live(&self, key: GrantKey) -> bool {
        let _ = key;
        true
    }
}

#[derive(Default)]
struct MemState {
    grants: HashMap<GrantKey, Vec<(PageId, Generation)>>,
    revoked: HashSet<GrantKey>,
    pages: HashMap<PageId, (GrantKey, Vec<u8>, u32)>,
    drained: Vec<GrantKey>,
    gone: Vec<GrantKey>,
}

/// In-memory [`PageSink`] for tests: grants are registered by hand, writes are checked the way
/// the pool checks them and kept per page.
pub struct MemorySink {
    page_bytes: usize,
    pages: usize,
    st: Mutex<MemState>,
}

impl MemorySink {
    /// A sink of `pages` pages, each `page_bytes` long.
    pub fn new(pages: usize, page_bytes: usize) -> Self {
        Self {
            page_bytes,
            pages,
            st: Mutex::new(MemState::default()),
        }
    }

    /// Allows writes of `key` to these pages.
    pub fn grant(&self, key: GrantKey, pages: Vec<(PageId, Generation)>) {
        self.st.lock().grants.insert(key, pages);
    }

    /// Fences `key`: later writes are dropped as revoked.
    pub fn revoke(&self, key: GrantKey) {
        self.st.lock().revoked.insert(key);
    }

    /// Bytes, tokens and grant of what landed on `page`.
    pub fn page(&self, page: PageId) -> Option<(GrantKey, Vec<u8>, u32)> {
        self.st.lock().pages.get(&page).cloned()
    }

    /// Pages written so far.
    pub fn written(&self) -> usize {
        self.st.lock().pages.len()
    }

    /// Keys passed to `mark_drained`, in order.
    pub fn drained(&self) -> Vec<GrantKey> {
        self.st.lock().drained.clone()
    }

    /// Keys passed to `peer_gone`, in order.
    pub fn gone(&self) -> Vec<GrantKey> {
        self.st.lock().gone.clone()
    }
}

impl PageSink for MemorySink {
    fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    fn page_count(&self) -> usize {
        self.pages
    }

    fn write_page(&self, w: PageWrite<'_>) -> Result<(), WriteError> {
        let mut st = self.st.lock();
        if st.revoked.contains(&w.key) {
            return Err(WriteError::RevokedGrant);
        }
        let pages = st.grants.get(&w.key).ok_or(WriteError::UnknownGrant)?;
        match pages.iter().find(|(p, _)| *p == w.page) {
            None => return Err(WriteError::WrongPage),
            Some((_, g)) if *g != w.generation => return Err(WriteError::StaleGeneration),
            Some(_) => {}
        }
        if w.data.len() != self.page_bytes {
            return Err(WriteError::BadLength);
        }
        if page_checksum(w.data) != w.checksum {
            return Err(WriteError::ChecksumMismatch);
        }
        if matches!(st.pages.get(&w.page), Some((k, _, _)) if *k == w.key) {
            return Err(WriteError::DuplicateWrite);
        }
        st.pages.insert(w.page, (w.key, w.data.to_vec(), w.tokens));
        Ok(())
    }

    fn mark_drained(&self, key: GrantKey) {
        self.st.lock().drained.push(key);
    }

    fn peer_gone(&self, key: GrantKey) {
        self.st.lock().gone.push(key);
    }

    fn grant_is_live(&self, key: GrantKey) -> bool {
        let st = self.st.lock();
        st.grants.contains_key(&key) && !st.revoked.contains(&key)
    }
}
