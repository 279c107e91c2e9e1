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

    /// Polls up to `out.len()` completions; returns how many were filled in.
    pub fn poll(&self, out: &mut [ibv_wc]) -> Result<usize, TransferError> {
        let n = i32::try_from(out.len()).unwrap_or(i32::MAX);
        // SAFETY: `out` has room for `n` entries.
        let got = unsafe { ibv_poll_cq(self.cq, n, out.as_mut_ptr()) };
        usize::try_from(got).map_err(|_| TransferError::ConnectionLost("ibv_poll_cq failed".into()))
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
) -> Result<(), TransferError> {
    let mut wr = zeroed_wr();
    wr.wr_id = wr_id;
    wr.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
    wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
    let b = &mut wr.bind_mw_tso_union.bind_mw;
    b.mw = window.mw;
    b.rkey = rdma_sys::ibv_inc_rkey(window.rkey());
    b.bind_info.mr = region.mr;
    b.bind_info.addr = region.addr() + offset as u64;
    b.bind_info.length = len;
    b.bind_info.mw_access_flags = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    post(qp, &mut wr)
}

/// Invalidates `window` (revoke): RDMA WRITEs under its key fail at the NIC from now on.
///
/// # Safety
/// `qp` must be a live queue pair on the same device as `window`.
pub unsafe fn post_invalidate(
    qp: *mut ibv_qp,
    window: &Window,
    wr_id: u64,
) -> Result<(), TransferError> {
    let mut wr = zeroed_wr();
    wr.wr_id = wr_id;
    wr.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
    wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
    wr.imm_data_invalidated_rkey_union.invalidated_rkey = window.rkey();
    post(qp, &mut wr)
}
