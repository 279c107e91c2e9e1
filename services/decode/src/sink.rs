//! The transfer receiver's sink: the decode pool, plus a record of live grants whose stream
//! already confirmed its drain (or whose peer is gone). A reservation aborted after that point
//! will never be drained again, so the scheduler finishes its release at once instead of
//! leaving its pages to time out into quarantine.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use pagewarden_kvcache::{GrantKey, KvPool, PageWrite, WriteError};
use pagewarden_transfer::PageSink;

/// What a live grant's stream has already told us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The sender drained: no write of the grant is still in flight.
    Drained,
    /// The connection that wrote under the grant is gone.
    PeerGone,
}

/// `KvPool` as a `PageSink`, remembering drains and peer losses of still-live grants.
#[derive(Clone)]
pub struct DecodeSink {
    pool: KvPool,
    ended: Arc<Mutex<HashSet<(GrantKey, bool)>>>,
}

impl DecodeSink {
    pub fn new(pool: KvPool) -> Self {
        Self {
            pool,
            ended: Arc::default(),
        }
    }

    fn record(&self, key: GrantKey, gone: bool) {
        if self.pool.grant_is_live(key) {
            self.ended
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert((key, gone));
        }
    }

    /// Takes what is known about `key` (call when its reservation ends).
    pub fn take(&self, key: GrantKey) -> Option<StreamEnd> {
        let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        let gone = ended.remove(&(key, true));
        let drained = ended.remove(&(key, false));
        match (gone, drained) {
            (true, _) => Some(StreamEnd::PeerGone),
            (false, true) => Some(StreamEnd::Drained),
            (false, false) => None,
        }
    }
}

impl PageSink for DecodeSink {
    fn page_bytes(&self) -> usize {
        self.pool.layout().page_bytes()
    }

    fn page_count(&self) -> usize {
        self.pool.capacity_pages()
    }

    fn write_page(&self, w: PageWrite<'_>) -> Result<(), WriteError> {
        self.pool.write_page(w)
    }

    fn mark_drained(&self, key: GrantKey) {
        self.pool.mark_drained(key);
        self.record(key, false);
    }

    fn peer_gone(&self, key: GrantKey) {
        self.pool.release_quarantined(key);
        self.record(key, true);
    }
}
