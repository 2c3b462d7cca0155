//! Queue pairs: creation and state changes (`ibv_modify_qp`). The data path is in `post`.

use std::os::raw::c_int;
use std::sync::Arc;

use rdma_sys::{
    ibv_ah_attr, ibv_gid, ibv_global_route, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_cap,
    ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr,
};

use super::convert::{
    access_to_ibv, last_err, mtu_to_ibv, qp_state_from_ibv, qp_state_to_ibv, qp_type_to_ibv,
    ret_err,
};
use super::cq::CqInner;
use super::pd::PdInner;
use super::post;
use super::srq::SrqInner;
use super::Ibverbs;
use crate::error::{Error, Result};
use crate::provider::{Qp, QpInitAttr};
use crate::types::{AccessFlags, LinkLayer, QpAttr, QpCap, QpState, QpType};
use crate::wr::{RecvWr, SendWr};

/// The shared state of a QP (shared with a connection-manager [`super::IbvConnection`], which
/// moves it to ERR on disconnect).
pub(crate) struct QpInner {
    pub(crate) qp: *mut ibv_qp,
    pub(crate) pd: Arc<PdInner>,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    _srq: Option<Arc<SrqInner>>,
}

// SAFETY: libibverbs QPs may be modified, posted to and destroyed from any thread (providers
// lock their queues); the pointers never change.
unsafe impl Send for QpInner {}
// SAFETY: as above.
unsafe impl Sync for QpInner {}

impl Drop for QpInner {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once; its CQs/SRQ/PD outlive it (we hold
        // their Arcs and drop them after this).
        let ret = unsafe { rdma_sys::ibv_destroy_qp(self.qp) };
        if ret != 0 {
            eprintln!("corelink ibverbs: ibv_destroy_qp failed: {ret}");
        }
    }
}

impl QpInner {
    /// `ibv_modify_qp` to ERR (used by connection-manager disconnects).
    pub(crate) fn to_err(&self) -> std::io::Result<()> {
        // SAFETY: plain old data; all-zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = qp_state_to_ibv(QpState::Err);
        // SAFETY: the QP is live; only the state is read.
        let ret = unsafe {
            rdma_sys::ibv_modify_qp(self.qp, &mut a, ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int)
        };
        if ret != 0 {
            return Err(ret_err(ret));
        }
        Ok(())
    }
}

/// The attributes a QP's move to INIT set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InitAs {
    pub(crate) port: u8,
    pub(crate) pkey_index: u16,
    pub(crate) access: u32,
}

/// A queue pair.
///
/// It owns the scratch arrays of the data path: `max_send_wr` send requests and `max_recv_wr`
/// receive requests, allocated at creation, so posting never allocates. Scatter/gather lists
/// are handed to the device as the caller's slices ([`crate::Sge`] is laid out as `ibv_sge`).
pub struct IbvQp {
    pub(crate) inner: Arc<QpInner>,
    pub(crate) qp_num: u32,
    pub(crate) qp_type: QpType,
    pub(crate) cap: QpCap,
    pub(crate) has_srq: bool,
    /// The state we last moved it to.
    pub(crate) state: QpState,
    /// What its move to INIT set (port, P_Key index, access flags), while it is in INIT: a
    /// connection manager's INIT that would set the same is skipped (`cm/qp_state.rs`).
    pub(crate) init_as: Option<InitAs>,
    pub(crate) send_wrs: Vec<ibv_send_wr>,
    pub(crate) recv_wrs: Vec<ibv_recv_wr>,
}

// SAFETY: the scratch arrays hold raw pointers only while a post runs (under `&mut self`);
// everything else is Send (QpInner above).
unsafe impl Send for IbvQp {}

impl std::fmt::Debug for IbvQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvQp")
            .field("qp_num", &self.qp_num)
            .field("qp_type", &self.qp_type)
            .field("state", &self.state)
            .field("cap", &self.cap)
            .finish()
    }
}

impl IbvQp {
    pub(crate) fn create(pd: &Arc<PdInner>, attr: &QpInitAttr<'_, Ibverbs>) -> Result<IbvQp> {
        // The kernel looks the CQs and SRQ up by handle among the PD's context's objects: one
        // of another context (even of this device) would name another object, or none.
        let ctx = pd.ctx.ctx;
        let foreign = |what| Error::ForeignObject { what, device: pd.ctx.name.clone() };
        if attr.send_cq.inner.ctx.ctx != ctx {
            return Err(foreign("send CQ"));
        }
        if attr.recv_cq.inner.ctx.ctx != ctx {
            return Err(foreign("receive CQ"));
        }
        if attr.srq.is_some_and(|s| s.inner.pd.ctx.ctx != ctx) {
            return Err(foreign("SRQ"));
        }
        let srq = attr.srq.map(|s| s.inner.clone());
        let (max_recv_wr, max_recv_sge) =
            if srq.is_some() { (0, 0) } else { (attr.cap.max_recv_wr, attr.cap.max_recv_sge) };
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: attr.send_cq.inner.cq,
            recv_cq: attr.recv_cq.inner.cq,
            srq: srq.as_ref().map_or(std::ptr::null_mut(), |s| s.srq),
            cap: ibv_qp_cap {
                max_send_wr: attr.cap.max_send_wr,
                max_recv_wr,
                max_send_sge: attr.cap.max_send_sge,
                max_recv_sge,
                max_inline_data: attr.cap.max_inline_data,
            },
            qp_type: qp_type_to_ibv(attr.qp_type),
            sq_sig_all: c_int::from(attr.sq_sig_all),
        };
        // SAFETY: the PD and CQs (and SRQ) are live; `init` is valid and updated in place
        // with the capacities the device gave.
        let qp = unsafe { rdma_sys::ibv_create_qp(pd.pd, &mut init) };
        if qp.is_null() {
            return Err(Error::CreateQp {
                qp_type: attr.qp_type,
                cap: attr.cap,
                source: last_err(),
            });
        }
        // SAFETY: a live QP.
        let qp_num = unsafe { (*qp).qp_num };
        let inner = Arc::new(QpInner {
            qp,
            pd: pd.clone(),
            _send_cq: attr.send_cq.inner.clone(),
            _recv_cq: attr.recv_cq.inner.clone(),
            _srq: srq,
        });
        let cap = QpCap {
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: init.cap.max_recv_wr,
            max_send_sge: init.cap.max_send_sge,
            max_recv_sge: init.cap.max_recv_sge,
            max_inline_data: init.cap.max_inline_data,
        };
        // SAFETY: ibv_send_wr / ibv_recv_wr are plain C structs (integers, raw pointers and
        // unions of them); all-zero is a valid value.
        let send_wrs = (0..cap.max_send_wr).map(|_| unsafe { std::mem::zeroed() }).collect();
        // SAFETY: as above.
        let recv_wrs = (0..cap.max_recv_wr).map(|_| unsafe { std::mem::zeroed() }).collect();
        Ok(IbvQp {
            inner,
            qp_num,
            qp_type: attr.qp_type,
            cap,
            has_srq: attr.srq.is_some(),
            state: QpState::Reset,
            init_as: None,
            send_wrs,
            recv_wrs,
        })
    }

    /// The underlying `ibv_qp` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut ibv_qp {
        self.inner.qp
    }

    /// `ibv_modify_qp` with a prepared attribute block; on success the QP is in `to`.
    pub(crate) fn modify_raw(
        &mut self,
        a: &mut ibv_qp_attr,
        mask: c_int,
        to: QpState,
    ) -> Result<()> {
        a.qp_state = qp_state_to_ibv(to);
        // SAFETY: the QP is live; `a` is a valid attribute block for `mask`.
        let ret = unsafe { rdma_sys::ibv_modify_qp(self.inner.qp, a, mask) };
        if ret != 0 {
            return Err(self.modify_err(to, ret_err(ret)));
        }
        use ibv_qp_attr_mask as M;
        let all = (M::IBV_QP_PORT | M::IBV_QP_PKEY_INDEX | M::IBV_QP_ACCESS_FLAGS).0 as c_int;
        self.init_as = match to {
            // (a move that sets only some of them leaves them unknown)
            QpState::Init if mask & all == all => Some(InitAs {
                port: a.port_num,
                pkey_index: a.pkey_index,
                access: a.qp_access_flags,
            }),
            _ => None,
        };
        self.state = to;
        Ok(())
    }

    pub(crate) fn modify_err(&self, to: QpState, source: std::io::Error) -> Error {
        Error::ModifyQp { qpn: self.qp_num, from: self.state, to, source }
    }

    /// The attribute block and mask for moving to `attr.state` from the state we last set.
    fn build_attr(&self, attr: &QpAttr) -> Result<(ibv_qp_attr, c_int)> {
        use ibv_qp_attr_mask as M;
        let ctx = &self.inner.pd.ctx;
        // SAFETY: plain old data; all-zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        let mut mask = M::IBV_QP_STATE;
        let connected = self.qp_type != QpType::Ud;
        match attr.state {
            QpState::Init => {
                a.pkey_index = attr.pkey_index;
                a.port_num = attr.port;
                mask |= M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT;
                match self.qp_type {
                    QpType::Rc => {
                        a.qp_access_flags = access_to_ibv(attr.access);
                        mask |= M::IBV_QP_ACCESS_FLAGS;
                    }
                    QpType::Uc => {
                        // UC has no reads or atomics; only remote writes mean anything.
                        a.qp_access_flags = access_to_ibv(attr.access & AccessFlags::REMOTE_WRITE);
                        mask |= M::IBV_QP_ACCESS_FLAGS;
                    }
                    QpType::Ud => {
                        a.qkey = attr.qkey;
                        mask |= M::IBV_QP_QKEY;
                    }
                }
            }
            QpState::Rtr if connected => {
                let port = ctx.port_attr(attr.port).map_err(|e| match e {
                    Error::QueryPort { source, .. } => self.modify_err(attr.state, source),
                    other => other,
                })?;
                let global = port.link_layer == LinkLayer::Ethernet || attr.dest.lid == 0;
                a.ah_attr = ibv_ah_attr {
                    grh: ibv_global_route {
                        dgid: ibv_gid { raw: attr.dest.gid.0 },
                        flow_label: 0,
                        sgid_index: attr.sgid_index,
                        hop_limit: attr.hop_limit,
                        traffic_class: 0,
                    },
                    dlid: attr.dest.lid,
                    sl: 0,
                    src_path_bits: 0,
                    static_rate: 0,
                    is_global: u8::from(global),
                    port_num: attr.port,
                };
                a.path_mtu = mtu_to_ibv(attr.path_mtu.min(port.active_mtu));
                a.dest_qp_num = attr.dest.qpn;
                a.rq_psn = attr.rq_psn;
                mask |= M::IBV_QP_AV | M::IBV_QP_PATH_MTU | M::IBV_QP_DEST_QPN | M::IBV_QP_RQ_PSN;
                if self.qp_type == QpType::Rc {
                    a.max_dest_rd_atomic = attr.max_dest_rd_atomic.min(ctx.max_qp_rd_atom);
                    a.min_rnr_timer = attr.min_rnr_timer;
                    mask |= M::IBV_QP_MAX_DEST_RD_ATOMIC | M::IBV_QP_MIN_RNR_TIMER;
                }
            }
            QpState::Rts if self.state == QpState::Rtr => {
                a.sq_psn = attr.sq_psn;
                mask |= M::IBV_QP_SQ_PSN;
                if self.qp_type == QpType::Rc {
                    a.timeout = attr.timeout;
                    a.retry_cnt = attr.retry_cnt;
                    a.rnr_retry = attr.rnr_retry;
                    a.max_rd_atomic = attr.max_rd_atomic.min(ctx.max_qp_init_rd_atom);
                    mask |= M::IBV_QP_TIMEOUT
                        | M::IBV_QP_RETRY_CNT
                        | M::IBV_QP_RNR_RETRY
                        | M::IBV_QP_MAX_QP_RD_ATOMIC;
                }
            }
            // UD RTR; RTS from RTS/SQD/SQE; SQD, ERR, RESET: the state alone.
            _ => {}
        }
        Ok((a, mask.0 as c_int))
    }
}

impl Qp<Ibverbs> for IbvQp {
    fn qp_num(&self) -> u32 {
        self.qp_num
    }

    fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Asks the device (`ibv_query_qp` for the state alone: one system call), so a QP the
    /// device (or a disconnect) moved to ERR reports ERR; falls back to the state we last set
    /// if the query fails.
    fn state(&self) -> QpState {
        // SAFETY: plain old data; all-zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is live; both out-pointers are valid.
        let ret = unsafe {
            rdma_sys::ibv_query_qp(
                self.inner.qp,
                &mut a,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int,
                &mut init,
            )
        };
        if ret != 0 {
            return self.state;
        }
        qp_state_from_ibv(a.qp_state).unwrap_or(self.state)
    }

    fn cap(&self) -> QpCap {
        self.cap
    }

    /// Takes from `attr` what the transition needs, per transport (RC: INIT pkey/port/access,
    /// RTR AV/MTU/dest QPN/RQ PSN/max_dest_rd_atomic/min RNR timer, RTS timeout/retry/RNR
    /// retry/SQ PSN/max_rd_atomic; UC: the same without reads, atomics and retries; UD: INIT
    /// pkey/port/qkey, RTR state alone, RTS SQ PSN). RTS from anything but RTR, SQD, ERR and
    /// RESET change the state alone. On RoCE ports (or with `dest.lid == 0`) the address
    /// vector is global. `path_mtu` is clamped to the port's active MTU and the read/atomic
    /// depths to the device's limits.
    fn modify(&mut self, attr: &QpAttr) -> Result<()> {
        let (mut a, mask) = self.build_attr(attr)?;
        self.modify_raw(&mut a, mask, attr.state)
    }

    #[inline]
    unsafe fn post_send(&mut self, wrs: &[SendWr<'_, Ibverbs>]) -> Result<()> {
        // SAFETY: forwarded caller contract.
        unsafe { post::post_send(self, wrs) }
    }

    #[inline]
    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        // SAFETY: forwarded caller contract.
        unsafe { post::post_recv(self, wrs) }
    }
}
