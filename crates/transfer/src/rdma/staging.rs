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

/// Slot bookkeeping for a staging region of `capacity` page-sized slots. A window always
/// covers a contiguous run of slots (one memory window is one byte range).
#[derive(Debug)]
pub struct StagingTable {
    page_bytes: usize,
    free: Vec<bool>,
    windows: HashMap<GrantKey, WindowSpec>,
}

impl StagingTable {
    /// A table over `capacity` slots of `page_bytes` each.
    pub fn new(capacity: usize, page_bytes: usize) -> Self {
        Self {
            page_bytes,
            free: vec![true; capacity],
            windows: HashMap::new(),
        }
    }

    /// Reserves `pages` contiguous slots for `key`; `None` when no such run is free, when
    /// `pages` is 0, or when `key` already has a window.
    pub fn open(&mut self, key: GrantKey, pages: usize) -> Option<WindowSpec> {
        if pages == 0 || self.windows.contains_key(&key) {
            return None;
        }
        let mut run = 0;
        let mut start = None;
        for (i, f) in self.free.iter().enumerate() {
            run = if *f { run + 1 } else { 0 };
            if run == pages {
                start = Some(i + 1 - pages);
                break;
            }
        }
        let first = start?;
        self.free[first..first + pages].fill(false);
        let spec = WindowSpec {
            offset: first * self.page_bytes,
            slots: pages,
        };
        self.windows.insert(key, spec);
        Some(spec)
    }

    /// Forgets `key`'s window (after the device invalidated it); its slots become free.
    pub fn close(&mut self, key: GrantKey) -> Option<WindowSpec> {
        let spec = self.windows.remove(&key)?;
        let first = spec.offset / self.page_bytes.max(1);
        self.free[first..first + spec.slots].fill(true);
        Some(spec)
    }

    /// Byte range of slot `index` of `key`'s window, if the window is open.
    pub fn slot_range(&self, key: GrantKey, index: usize) -> Option<std::ops::Range<usize>> {
        let spec = self.windows.get(&key)?;
        if index >= spec.slots {
            return None;
        }
        let at = spec.offset + index * self.page_bytes;
        Some(at..at + self.page_bytes)
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
    fn windows_are_contiguous_runs_and_slots_are_reused() {
        let (a, b, c) = (GrantKey([1; 16]), GrantKey([2; 16]), GrantKey([3; 16]));
        let mut t = StagingTable::new(4, 8);
        assert_eq!(t.open(a, 2).unwrap().offset, 0);
        assert_eq!(t.open(b, 1).unwrap().offset, 16);
        assert!(t.open(c, 2).is_none(), "only one free slot is left");
        assert!(t.open(b, 1).is_none(), "one window per key");
        t.close(a);
        let w = t.open(c, 2).unwrap();
        assert_eq!((w.offset, w.slots), (0, 2));
        assert_eq!(t.slot_range(c, 1), Some(8..16));
        assert_eq!(t.slot_range(c, 2), None);
        assert_eq!(t.slot_range(a, 0), None, "a closed window has no slots");
    }

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
