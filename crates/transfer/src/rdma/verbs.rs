//! Thin RAII wrappers over the ibverbs calls the RDMA backend needs: device + protection
//! domain + completion queue, registered regions, type-2 memory windows, and the work
//! requests that move pages (RDMA WRITE), grant a window (BIND_MW) and fence it (LOCAL_INV).
//!
//! UNTESTED on hardware: this host has no RDMA device (and no Soft-RoCE). It is built and
//! linted with `--features rdma`; `Device::open_first` returns `Unsupported` without a device.

use std::ptr;

use rdma_sys::{
    ibv_access_flags, ibv_alloc_mw, ibv_alloc_pd, ibv_close_device, ibv_context, ibv_cq,
    ibv_create_cq, ibv_dealloc_mw, ibv_dealloc_pd, ibv_dereg_mr, ibv_destroy_cq,
    ibv_free_device_list, ibv_get_device_list, ibv_mr, ibv_mw, ibv_mw_type, ibv_open_device,
    ibv_pd, ibv_poll_cq, ibv_post_send, ibv_qp, ibv_reg_mr, ibv_send_flags, ibv_send_wr, ibv_sge,
    ibv_wc, ibv_wr_opcode,
};

use crate::engine::TransferError;

/// An opened device with one protection domain and one completion queue.
pub struct Device {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
}

// SAFETY: ibverbs objects may be used from any thread; calls on one QP/CQ are serialized by
// the owner of the `Device`.
unsafe impl Send for Device {}
// SAFETY: as for `Send`, shared references only read the handle.
unsafe impl Sync for Device {}

impl Device {
    /// Opens the first RDMA device of this host.
    pub fn open_first(cq_depth: i32) -> Result<Self, TransferError> {
        // SAFETY: plain ibverbs calls; every pointer is checked before use and released on
        // every error path.
        unsafe {
            let mut n = 0;
            let list = ibv_get_device_list(&mut n);
            if list.is_null() || n == 0 {
                if !list.is_null() {
                    ibv_free_device_list(list);
                }
                return Err(TransferError::Unsupported("no RDMA device on this host"));
            }
            let ctx = ibv_open_device(*list);
            ibv_free_device_list(list);
            if ctx.is_null() {
                return Err(TransferError::Unsupported("cannot open the RDMA device"));
            }
            let pd = ibv_alloc_pd(ctx);
            if pd.is_null() {
                ibv_close_device(ctx);
                return Err(TransferError::Unsupported(
                    "cannot allocate a protection domain",
                ));
            }
            let cq = ibv_create_cq(ctx, cq_depth, ptr::null_mut(), ptr::null_mut(), 0);
            if cq.is_null() {
                ibv_dealloc_pd(pd);
                ibv_close_device(ctx);
                return Err(TransferError::Unsupported(
                    "cannot create a completion queue",
                ));
            }
            Ok(Self { ctx, pd, cq })
        }
    }

    /// Registers `len` zeroed bytes for local write and remote write through windows.
    pub fn register(&self, len: usize) -> Result<Region, TransferError> {
        let mut buf = vec![0u8; len].into_boxed_slice();
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_MW_BIND;
        // SAFETY: `buf` outlives the registration (both live in `Region`, deregistered first).
        let mr = unsafe { ibv_reg_mr(self.pd, buf.as_mut_ptr().cast(), len, access.0 as i32) };
        if mr.is_null() {
            return Err(TransferError::Unsupported("memory registration failed"));
        }
        Ok(Region { mr, buf })
    }

    /// Allocates a type-2 memory window (bound per reservation, invalidated on revoke).
    pub fn alloc_window(&self) -> Result<Window, TransferError> {
        // SAFETY: `pd` is live for the life of `self`.
        match unsafe { ibv_alloc_mw(self.pd, ibv_mw_type::IBV_MW_TYPE_2) } {
            Some(mw) if !mw.is_null() => Ok(Window { mw }),
            Some(_) | None => Err(TransferError::Unsupported("memory windows not supported")),
        }
    }

    /// Polls up to `out.len()` completions of the device's own queue.
    pub fn poll(&self, out: &mut [ibv_wc]) -> Result<usize, TransferError> {
        poll_cq(self.cq, out)
    }

    /// A completion queue of its own (one per queue pair, so connections never steal each
    /// other's completions).
    pub fn create_cq(&self, depth: i32) -> Result<CompletionQueue, TransferError> {
        // SAFETY: `ctx` is live for the life of `self`; the CQ is destroyed before the device
        // (connections drop before the backend that owns the device).
        let cq = unsafe { ibv_create_cq(self.ctx, depth, ptr::null_mut(), ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(TransferError::Unsupported(
                "cannot create a completion queue",
            ));
        }
        Ok(CompletionQueue { cq })
    }

    /// Registers `len` zeroed bytes for local use only (a sender's source pages).
    pub fn register_local(&self, len: usize) -> Result<Region, TransferError> {
        let mut buf = vec![0u8; len].into_boxed_slice();
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        // SAFETY: as in `register`.
        let mr = unsafe { ibv_reg_mr(self.pd, buf.as_mut_ptr().cast(), len, access.0 as i32) };
        if mr.is_null() {
            return Err(TransferError::Unsupported("memory registration failed"));
        }
        Ok(Region { mr, buf })
    }

    pub(crate) fn context(&self) -> *mut ibv_context {
        self.ctx
    }

    pub(crate) fn pd(&self) -> *mut ibv_pd {
        self.pd
    }
}

fn poll_cq(cq: *mut ibv_cq, out: &mut [ibv_wc]) -> Result<usize, TransferError> {
    let n = i32::try_from(out.len()).unwrap_or(i32::MAX);
    // SAFETY: `cq` is live (owned by the caller); `out` has room for `n` entries.
    let got = unsafe { ibv_poll_cq(cq, n, out.as_mut_ptr()) };
    usize::try_from(got).map_err(|_| TransferError::ConnectionLost("ibv_poll_cq failed".into()))
}

/// A completion queue owned by one queue pair.
pub struct CompletionQueue {
    cq: *mut ibv_cq,
}

// SAFETY: a handle to a device object, polled by its single owner.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// Polls up to `out.len()` completions; returns how many were filled in.
    pub fn poll(&self, out: &mut [ibv_wc]) -> Result<usize, TransferError> {
        poll_cq(self.cq, out)
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_cq {
        self.cq
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: created by `create_cq`, destroyed once, after its QP (QueuePair drops first).
        unsafe {
            ibv_destroy_cq(self.cq);
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: created in `open_first`, destroyed once, in reverse order.
        unsafe {
            ibv_destroy_cq(self.cq);
            ibv_dealloc_pd(self.pd);
            ibv_close_device(self.ctx);
        }
    }
}

/// Registered memory (the sender's source pages, or the receiver's staging region).
pub struct Region {
    mr: *mut ibv_mr,
    buf: Box<[u8]>,
}

// SAFETY: the registration is a handle; the bytes are owned by `buf`.
unsafe impl Send for Region {}
// SAFETY: as for `Send`, shared references only read the handle.
unsafe impl Sync for Region {}

impl Region {
    /// The registered bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The registered bytes, for filling source pages.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// Local key for scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is live while `self` is.
        unsafe { (*self.mr).lkey }
    }

    fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: deregistered before `buf` is freed (fields drop after this body).
        unsafe {
            ibv_dereg_mr(self.mr);
        }
    }
}

/// A type-2 memory window: the only remote key a sender ever gets for a reservation.
pub struct Window {
    mw: *mut ibv_mw,
}

// SAFETY: a handle to a device object.
unsafe impl Send for Window {}
// SAFETY: as for `Send`, shared references only read the handle.
unsafe impl Sync for Window {}

impl Window {
    /// The window's current remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: `mw` is live while `self` is.
        unsafe { (*self.mw).rkey }
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: allocated by `alloc_window`, freed once.
        unsafe {
            ibv_dealloc_mw(self.mw);
        }
    }
}

fn post(qp: *mut ibv_qp, wr: &mut ibv_send_wr) -> Result<(), TransferError> {
    let mut bad: *mut ibv_send_wr = ptr::null_mut();
    // SAFETY: `wr` and its scatter list live across the call; the caller owns a connected QP.
    let rc = unsafe { ibv_post_send(qp, wr, &mut bad) };
    if rc == 0 {
        Ok(())
    } else {
        Err(TransferError::ConnectionLost(format!(
            "ibv_post_send failed: {rc}"
        )))
    }
}

fn zeroed_wr() -> ibv_send_wr {
    // SAFETY: ibv_send_wr is a plain C struct for which all-zero is a valid "empty" value.
    unsafe { std::mem::zeroed() }
}

/// Posts an RDMA WRITE of `len` bytes at `offset` of `src` to `remote_addr` under `rkey`
/// (a window's key), signaled with `wr_id`.
///
/// # Safety
/// `qp` must be a live, connected RC queue pair on the same device as `src`.
pub unsafe fn post_rdma_write(
    qp: *mut ibv_qp,
    src: &Region,
    offset: usize,
    len: u32,
    remote_addr: u64,
    rkey: u32,
    wr_id: u64,
) -> Result<(), TransferError> {
    let mut sge = ibv_sge {
        addr: src.addr() + offset as u64,
        length: len,
        lkey: src.lkey(),
    };
    let mut wr = zeroed_wr();
    wr.wr_id = wr_id;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
    wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    post(qp, &mut wr)
}

/// Binds `window` to `len` bytes at `offset` of `region` for remote write (one reservation).
/// Returns the rkey the window carries once the bind completes (the old one, incremented).
///
/// # Safety
/// `qp` must be a live queue pair on the same device as `region` and `window`.
pub unsafe fn post_bind_window(
    qp: *mut ibv_qp,
    window: &Window,
    region: &Region,
    offset: usize,
    len: u64,
    wr_id: u64,
) -> Result<u32, TransferError> {
    let mut wr = zeroed_wr();
    wr.wr_id = wr_id;
    wr.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
    wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
    // SAFETY: plain arithmetic on the key (an inline helper of libibverbs).
    let rkey = unsafe { rdma_sys::ibv_inc_rkey(window.rkey()) };
    // SAFETY: a bind request's union member; `zeroed_wr` initialized every member.
    let b = unsafe { &mut wr.bind_mw_tso_union.bind_mw };
    b.mw = window.mw;
    b.rkey = rkey;
    b.bind_info.mr = region.mr;
    b.bind_info.addr = region.addr() + offset as u64;
    b.bind_info.length = len;
    b.bind_info.mw_access_flags = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    post(qp, &mut wr)?;
    Ok(rkey)
}

/// Invalidates a bound window's `rkey` (revoke): RDMA WRITEs under it fail at the NIC from
/// now on.
///
/// # Safety
/// `qp` must be a live queue pair on the device the window was bound on.
pub unsafe fn post_invalidate(qp: *mut ibv_qp, rkey: u32, wr_id: u64) -> Result<(), TransferError> {
    let mut wr = zeroed_wr();
    wr.wr_id = wr_id;
    wr.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
    wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
    wr.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
    post(qp, &mut wr)
}

/// Waits (polling, yielding to the runtime in between) until `n` work requests on `cq`
/// completed; the first unsuccessful completion, or `timeout`, fails the connection.
pub async fn wait_completions(
    cq: &CompletionQueue,
    mut n: usize,
    timeout: std::time::Duration,
) -> Result<(), TransferError> {
    let deadline = tokio::time::Instant::now() + timeout;
    // SAFETY: ibv_wc is a plain C struct; all-zero is valid.
    let mut wcs: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
    let mut idle = 0u32;
    while n > 0 {
        let got = cq.poll(&mut wcs[..n.min(16)])?;
        for wc in &wcs[..got] {
            if wc.status != rdma_sys::ibv_wc_status::IBV_WC_SUCCESS {
                return Err(TransferError::ConnectionLost(format!(
                    "work request {} failed with status {}",
                    wc.wr_id, wc.status
                )));
            }
        }
        n -= got;
        if got == 0 {
            if tokio::time::Instant::now() > deadline {
                return Err(TransferError::ConnectionLost(
                    "RDMA completion timed out".into(),
                ));
            }
            // Completions of a page write arrive within microseconds: spin briefly, then
            // back off so an idle connection does not burn a core.
            idle += 1;
            if idle < 64 {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(std::time::Duration::from_micros(50)).await;
            }
        } else {
            idle = 0;
        }
    }
    Ok(())
}
