//! RC queue pair and its out-of-band connection: each side creates a QP, the two swap
//! [`Endpoint`]s (QP number, first PSN, LID, GID) over the TCP control connection, then move
//! their QP `RESET -> INIT -> RTR -> RTS`. No rdma_cm: the control connection the backend
//! already needs (completions, acks, drains) carries the exchange.
//!
//! UNTESTED on hardware (no RDMA device, no Soft-RoCE on the development host).

use rdma_sys::{
    ___ibv_query_port, ibv_access_flags, ibv_create_qp, ibv_destroy_qp, ibv_gid, ibv_modify_qp,
    ibv_mtu, ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_init_attr, ibv_qp_state,
    ibv_qp_type, ibv_query_gid,
};

use super::verbs::{CompletionQueue, Device};
use crate::engine::TransferError;

/// Port every QP of this backend uses.
const PORT: u8 = 1;
/// GID table entry used for RoCE (index 0: the port's default GID).
const GID_INDEX: u8 = 0;

/// What a peer needs to address this side's queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number this side sends.
    pub psn: u32,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Port GID (RoCE addressing).
    pub gid: [u8; 16],
}

impl Endpoint {
    /// Bytes of an encoded endpoint.
    pub const LEN: usize = 4 + 4 + 2 + 16;

    /// Little-endian wire form.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..4].copy_from_slice(&self.qpn.to_le_bytes());
        b[4..8].copy_from_slice(&self.psn.to_le_bytes());
        b[8..10].copy_from_slice(&self.lid.to_le_bytes());
        b[10..].copy_from_slice(&self.gid);
        b
    }

    /// Parses [`Endpoint::encode`]'s output.
    pub fn decode(b: &[u8; Self::LEN]) -> Self {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[10..]);
        Self {
            qpn: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            psn: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            lid: u16::from_le_bytes([b[8], b[9]]),
            gid,
        }
    }
}

/// A reliable-connected queue pair on a [`Device`], sharing its completion queue.
pub struct QueuePair {
    qp: *mut ibv_qp,
    local: Endpoint,
    mtu: ibv_mtu::Type,
}

// SAFETY: a handle to a device object; posts on it are serialized by its single owner task.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

fn modify(
    qp: *mut ibv_qp,
    attr: &mut ibv_qp_attr,
    mask: ibv_qp_attr_mask,
    step: &'static str,
) -> Result<(), TransferError> {
    // SAFETY: `qp` is live (owned by the caller's QueuePair); `attr` is a valid struct.
    let rc = unsafe { ibv_modify_qp(qp, attr, mask.0 as i32) };
    if rc == 0 {
        Ok(())
    } else {
        Err(TransferError::ConnectionLost(format!(
            "ibv_modify_qp to {step} failed: {rc}"
        )))
    }
}

fn zeroed_attr() -> ibv_qp_attr {
    // SAFETY: plain C struct; all-zero is the documented "unset" value.
    unsafe { std::mem::zeroed() }
}

impl QueuePair {
    /// Creates an RC QP on `dev` whose completions go to `cq` (room for `depth` outstanding
    /// sends and receives) and moves it to INIT. `psn` is the first sequence number this side
    /// will send. Drop the QP before `cq`.
    pub fn create(
        dev: &Device,
        cq: &CompletionQueue,
        depth: u32,
        psn: u32,
    ) -> Result<Self, TransferError> {
        // SAFETY: plain C structs for which all-zero is valid; every pointer comes from `dev`,
        // which outlives the QP (the backend drops QPs before the device).
        unsafe {
            let mut port: ibv_port_attr = std::mem::zeroed();
            if ___ibv_query_port(dev.context(), PORT, &mut port) != 0 {
                return Err(TransferError::Unsupported("cannot query the RDMA port"));
            }
            let mut gid: ibv_gid = std::mem::zeroed();
            if ibv_query_gid(dev.context(), PORT, GID_INDEX as i32, &mut gid) != 0 {
                return Err(TransferError::Unsupported("cannot query the port GID"));
            }
            let mut init: ibv_qp_init_attr = std::mem::zeroed();
            init.send_cq = cq.as_ptr();
            init.recv_cq = cq.as_ptr();
            init.qp_type = ibv_qp_type::IBV_QPT_RC;
            init.cap.max_send_wr = depth;
            init.cap.max_recv_wr = depth;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            let qp = ibv_create_qp(dev.pd(), &mut init);
            if qp.is_null() {
                return Err(TransferError::Unsupported("cannot create a queue pair"));
            }
            let this = Self {
                qp,
                local: Endpoint {
                    qpn: (*qp).qp_num,
                    psn: psn & 0xff_ffff,
                    lid: port.lid,
                    gid: gid.raw,
                },
                mtu: port.active_mtu,
            };
            let mut a = zeroed_attr();
            a.qp_state = ibv_qp_state::IBV_QPS_INIT;
            a.pkey_index = 0;
            a.port_num = PORT;
            a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                | ibv_access_flags::IBV_ACCESS_MW_BIND)
                .0;
            modify(
                qp,
                &mut a,
                ibv_qp_attr_mask::IBV_QP_STATE
                    | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                    | ibv_qp_attr_mask::IBV_QP_PORT
                    | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS,
                "INIT",
            )?;
            Ok(this)
        }
    }

    /// This side's endpoint, to send to the peer.
    pub fn local(&self) -> Endpoint {
        self.local
    }

    /// Connects to the peer's endpoint: INIT -> RTR -> RTS.
    pub fn connect(&mut self, remote: &Endpoint) -> Result<(), TransferError> {
        let mut a = zeroed_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = self.mtu;
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.port_num = PORT;
        if remote.gid != [0; 16] {
            // RoCE (and routed InfiniBand) address the peer by GID.
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
            a.ah_attr.grh.sgid_index = GID_INDEX;
            a.ah_attr.grh.hop_limit = 1;
        }
        modify(
            self.qp,
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_AV
                | ibv_qp_attr_mask::IBV_QP_PATH_MTU
                | ibv_qp_attr_mask::IBV_QP_DEST_QPN
                | ibv_qp_attr_mask::IBV_QP_RQ_PSN
                | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
                | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        let mut a = zeroed_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.sq_psn = self.local.psn;
        a.max_rd_atomic = 1;
        modify(
            self.qp,
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_TIMEOUT
                | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
                | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
                | ibv_qp_attr_mask::IBV_QP_SQ_PSN
                | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )
    }

    /// The raw QP, for posting work requests (see `verbs.rs`).
    pub fn as_ptr(&self) -> *mut ibv_qp {
        self.qp
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created in `create`, destroyed once.
        unsafe {
            ibv_destroy_qp(self.qp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trips() {
        let e = Endpoint {
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            lid: 7,
            gid: [9; 16],
        };
        assert_eq!(Endpoint::decode(&e.encode()), e);
    }
}
