//! Device-independent half of the RDMA backend: where one-sided writes may land, and how a
//! completion message turns staged bytes into checked pool writes.
//!
//! RDMA WRITE bypasses the receiver's CPU, so it must never target pool pages directly (a
//! late write would land whatever the page's state). Instead each reservation gets slots in a
//! registered staging region, exposed through one memory window per reservation. The sender
//! writes pages into its window, then SENDs a completion message: the WRITE frame headers of
//! those pages (each with an empty payload) naming the slot in `batch`'s place. The receiver
//! turns each header plus the staged bytes into the same `Frame::Write` the TCP path decodes,
//! and drives the same [`ReceiverSession`]: one set of grant, page, generation and checksum
//! checks for both backends. Revoking a grant invalidates its window (late RDMA writes fault
//! at the NIC) and forgets its slots (late completions are dropped as unknown).

use std::collections::HashMap;

use crate::frame::{BatchId, Frame, FrameError, WriteFrame};
use crate::receiver::ReceiverSession;
use crate::sink::PageSink;
use crate::types::GrantKey;

/// Byte range of one reservation's slots in the staging region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    /// Offset of the first slot.
    pub offset: usize,
    /// Slots (pages) in the window.
    pub slots: usize,
}

/// Slot bookkeeping for a staging region of `capacity` page-sized slots.
#[derive(Debug)]
pub struct StagingTable {
    page_bytes: usize,
    free: Vec<usize>,
    windows: HashMap<GrantKey, (WindowSpec, Vec<usize>)>,
}

impl StagingTable {
    /// A table over `capacity` slots of `page_bytes` each.
    pub fn new(capacity: usize, page_bytes: usize) -> Self {
        Self {
            page_bytes,
            free: (0..capacity).rev().collect(),
            windows: HashMap::new(),
        }
    }

    /// Reserves `pages` contiguous-in-window slots for `key`; `None` when the region is full.
    /// (Slots are handed out one by one; the window covers `slots * page_bytes` bytes at the
    /// first slot's offset only when they are contiguous, which a fresh region guarantees.)
    pub fn open(&mut self, key: GrantKey, pages: usize) -> Option<WindowSpec> {
        if self.free.len() < pages || pages == 0 {
            return None;
        }
        let slots: Vec<usize> = (0..pages).filter_map(|_| self.free.pop()).collect();
        let spec = WindowSpec {
            offset: slots[0] * self.page_bytes,
            slots: pages,
        };
        self.windows.insert(key, (spec, slots));
        Some(spec)
    }

    /// Forgets `key`'s window (after the device invalidated it); its slots become free.
    pub fn close(&mut self, key: GrantKey) -> Option<WindowSpec> {
        let (spec, slots) = self.windows.remove(&key)?;
        self.free.extend(slots);
        Some(spec)
    }

    /// Byte range of slot `index` of `key`'s window, if the window is open.
    pub fn slot_range(&self, key: GrantKey, index: usize) -> Option<std::ops::Range<usize>> {
        let (_, slots) = self.windows.get(&key)?;
        let s = *slots.get(index)?;
        Some(s * self.page_bytes..(s + 1) * self.page_bytes)
    }

    /// Processes a completion message: for each header, the staged slot's bytes go through
    /// `session` exactly as a TCP WRITE frame would. Headers of a closed (revoked) or unknown
    /// window are fed with empty data, so the pool drops and counts them as it would any frame
    /// of that grant; a slot index beyond the window is malformed.
    pub fn complete<S: PageSink + ?Sized>(
        &self,
        staging: &[u8],
        session: &mut ReceiverSession<S>,
        headers: &[WriteFrame<'_>],
        batch: BatchId,
    ) -> Result<(), FrameError> {
        for h in headers {
            let slot = h.batch.0 as usize;
            let data = match self.windows.get(&h.key) {
                Some(_) => {
                    let r = self
                        .slot_range(h.key, slot)
                        .ok_or(FrameError::UnknownPage(h.page.0))?;
                    &staging[r]
                }
                None => &[][..],
            };
            session.on_frame(Frame::Write(WriteFrame {
                batch,
                data,
                ..h.clone()
            }))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::receiver::ReceiverCounters;
    use crate::sink::MemorySink;
    use crate::types::{page_checksum, Generation, PageId, WriteError};

    #[test]
    fn staged_pages_go_through_the_same_checks_and_revoked_windows_land_nothing() {
        let sink = Arc::new(MemorySink::new(8, 16));
        let key = GrantKey([1; 16]);
        sink.grant(
            key,
            vec![(PageId(3), Generation(1)), (PageId(5), Generation(1))],
        );
        let counters = Arc::new(ReceiverCounters::default());
        let mut session = ReceiverSession::new(sink.clone(), counters.clone());
        let mut table = StagingTable::new(4, 16);
        table.open(key, 2).unwrap();
        let mut staging = vec![0u8; 64];
        // The "NIC" writes both pages into the window's slots.
        for (i, b) in [7u8, 9].iter().enumerate() {
            let r = table.slot_range(key, i).unwrap();
            staging[r].fill(*b);
        }
        let header = |slot: u64, page: u32, fill: u8| WriteFrame {
            key,
            batch: BatchId(slot),
            page: PageId(page),
            generation: Generation(1),
            tokens: 1,
            checksum: page_checksum(&[fill; 16]),
            data: &[],
        };
        let hs = [header(0, 3, 7), header(1, 5, 0xff)];
        table
            .complete(&staging, &mut session, &hs, BatchId(1))
            .unwrap();
        assert_eq!(sink.page(PageId(3)).unwrap().1, vec![7u8; 16]);
        assert!(
            sink.page(PageId(5)).is_none(),
            "a staged page that fails its checksum never lands"
        );
        assert_eq!(
            counters
                .snapshot()
                .dropped_for(WriteError::ChecksumMismatch),
            1
        );

        // Revoke: the window closes; a late completion lands nothing.
        table.close(key);
        sink.revoke(key);
        table
            .complete(&staging, &mut session, &[header(1, 5, 9)], BatchId(2))
            .unwrap();
        assert!(sink.page(PageId(5)).is_none());
        assert_eq!(counters.snapshot().dropped_for(WriteError::RevokedGrant), 1);
    }
}
