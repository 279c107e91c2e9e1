//! `KvPool` as a [`PageSink`]: the pool does every grant, page, generation, length and
//! checksum check before it writes a byte.

use pagewarden_kvcache::KvPool;

use crate::sink::PageSink;
use crate::types::{GrantKey, PageWrite, WriteError};

impl PageSink for KvPool {
    fn page_bytes(&self) -> usize {
        self.layout().page_bytes()
    }

    fn page_count(&self) -> usize {
        self.capacity_pages()
    }

    fn write_page(&self, w: PageWrite<'_>) -> Result<(), WriteError> {
        KvPool::write_page(self, w)
    }

    fn mark_drained(&self, key: GrantKey) {
        KvPool::mark_drained(self, key);
    }

    fn peer_gone(&self, key: GrantKey) {
        KvPool::peer_gone(self, key);
    }

    fn grant_is_live(&self, key: GrantKey) -> bool {
        KvPool::grant_is_live(self, key)
    }
}
