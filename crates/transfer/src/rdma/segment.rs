//! Receiver side of the RDMA backend: one registered staging region, one memory window per
//! open reservation, and the completion path into the shared [`ReceiverSession`].
//!
//! Per batch: `open_window` (bind a window over staging slots for a live grant; the sender
//! gets only that window's address and rkey) → RDMA WRITEs land in staging → `seal`
//! (LOCAL_INV: later WRITEs under the rkey fault at the NIC) → `complete` (checked pool
//! writes from the now-immutable slots) → `release`. UNTESTED on hardware; see `mod.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use rdma_sys::ibv_qp;

use super::staging::StagingTable;
use super::verbs::{post_bind_window, post_invalidate, Device, Region, Window};
use crate::engine::TransferError;
use crate::frame::{BatchId, FrameError, WriteFrame};
use crate::receiver::ReceiverSession;
use crate::sink::PageSink;
use crate::types::GrantKey;

/// Where a sender may write one grant's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteWindow {
    /// Remote virtual address of slot 0.
    pub addr: u64,
    /// The window's rkey (valid until revoke).
    pub rkey: u32,
    /// Page-sized slots in the window.
    pub slots: usize,
}

/// A registered staging region with per-grant memory windows.
pub struct RdmaSegment {
    // Field order is drop order: windows and the region go before the device handle.
    windows: HashMap<GrantKey, (Window, u32, bool)>,
    staging: Region,
    table: StagingTable,
    device: Arc<Device>,
    next_wr: u64,
}

impl RdmaSegment {
    /// Registers `slots` page-sized staging slots on `device`.
    pub fn new(
        device: Arc<Device>,
        slots: usize,
        page_bytes: usize,
    ) -> Result<Self, TransferError> {
        let staging = device.register(slots * page_bytes)?;
        Ok(Self {
            windows: HashMap::new(),
            staging,
            table: StagingTable::new(slots, page_bytes),
            device,
            next_wr: 1,
        })
    }

    fn wr_id(&mut self) -> u64 {
        self.next_wr += 1;
        self.next_wr
    }

    /// Binds a fresh window over `pages` staging slots for `key` (one signaled work request:
    /// wait for its completion before handing the window to the peer).
    ///
    /// # Safety
    /// `qp` must be a live, connected queue pair of this segment's device.
    pub unsafe fn open_window(
        &mut self,
        qp: *mut ibv_qp,
        key: GrantKey,
        pages: usize,
        page_bytes: usize,
    ) -> Result<RemoteWindow, TransferError> {
        let spec = self
            .table
            .open(key, pages)
            .ok_or(TransferError::Unsupported("staging region full"))?;
        let window = match self.device.alloc_window() {
            Ok(w) => w,
            Err(e) => {
                self.table.close(key);
                return Err(e);
            }
        };
        let len = (spec.slots * page_bytes) as u64;
        let wr = self.wr_id();
        // SAFETY: the caller guarantees a live QP of this device.
        let rkey =
            match unsafe { post_bind_window(qp, &window, &self.staging, spec.offset, len, wr) } {
                Ok(k) => k,
                Err(e) => {
                    self.table.close(key);
                    return Err(e);
                }
            };
        let remote = RemoteWindow {
            addr: self.staging.bytes().as_ptr() as u64 + spec.offset as u64,
            rkey,
            slots: spec.slots,
        };
        self.windows.insert(key, (window, rkey, false));
        Ok(remote)
    }

    /// First half of a fence: posts the invalidation (LOCAL_INV) of `key`'s window and
    /// returns whether one was posted; await its completion, then [`RdmaSegment::release`].
    /// The slots stay readable in between, so a batch is verified and copied only after the
    /// peer can no longer write into them (no change between checksum and copy).
    ///
    /// # Safety
    /// `qp` must be a live queue pair of this segment's device.
    pub unsafe fn seal(&mut self, qp: *mut ibv_qp, key: GrantKey) -> Result<bool, TransferError> {
        let Some((_, rkey, sealed)) = self.windows.get(&key) else {
            return Ok(false);
        };
        if *sealed {
            return Ok(false);
        }
        let rkey = *rkey;
        let wr = self.wr_id();
        // SAFETY: the caller guarantees a live QP of this device.
        unsafe { post_invalidate(qp, rkey, wr)? };
        if let Some(w) = self.windows.get_mut(&key) {
            w.2 = true;
        }
        Ok(true)
    }

    /// Second half of a fence: frees `key`'s window and slots (after the invalidation
    /// completed, or when none was posted).
    pub fn release(&mut self, key: GrantKey) {
        self.windows.remove(&key);
        self.table.close(key);
    }

    /// Keys with an open window.
    pub fn open_keys(&self) -> Vec<GrantKey> {
        self.windows.keys().copied().collect()
    }

    /// Feeds a completion message (WRITE headers naming staging slots) through `session`.
    pub fn complete<S: PageSink + ?Sized>(
        &self,
        session: &mut ReceiverSession<S>,
        headers: &[WriteFrame<'_>],
        batch: BatchId,
    ) -> Result<(), FrameError> {
        self.table
            .complete(self.staging.bytes(), session, headers, batch)
    }
}
