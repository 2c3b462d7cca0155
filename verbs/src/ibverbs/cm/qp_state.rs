//! QP state changes driven by `rdma_init_qp_attr`, and the connection parameters sent with a
//! connect or an accept.

use std::os::raw::c_int;

use rdma_sys::{ibv_qp_attr, ibv_qp_attr_mask, rdma_conn_param};

use super::channel::Id;
use crate::error::Result;
use crate::ibverbs::context::CtxInner;
use crate::ibverbs::convert::{access_to_ibv, last_err};
use crate::ibverbs::qp::{IbvQp, InitAs};
use crate::types::{AccessFlags, LinkLayer, QpAttr, QpState, QpType};

/// Moves `qp` to `to` with `rdma_init_qp_attr`'s attributes for `id`, plus local policy from
/// `attr`; `rd_atomic` is the negotiated depth (responder resources at RTR, initiator depth at
/// RTS).
pub(super) fn cm_modify(
    qp: &mut IbvQp,
    id: &Id,
    to: QpState,
    attr: &QpAttr,
    rd_atomic: u8,
) -> Result<()> {
    use ibv_qp_attr_mask as M;
    let rc = qp.qp_type == QpType::Rc;
    let access = cm_access(qp.qp_type, attr);
    if to == QpState::Init && QpFacts::of(qp).already_init(&qp.inner.pd.ctx, id, attr) {
        return Ok(()); // (two system calls fewer per connection: a pool's QP, on RoCE)
    }
    // SAFETY: plain old data; all-zero is valid.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = crate::ibverbs::convert::qp_state_to_ibv(to);
    let mut mask: c_int = 0;
    // SAFETY: a live id; `a` and `mask` are valid out-pointers.
    let ret = unsafe { rdma_sys::rdma_init_qp_attr(id.0, &mut a, &mut mask) };
    if ret != 0 {
        return Err(qp.modify_err(to, last_err()));
    }
    let mut m = M(mask as u32);
    match to {
        QpState::Init => {
            a.qp_access_flags = access;
            m |= M::IBV_QP_ACCESS_FLAGS;
        }
        QpState::Rtr => {
            // librdmacm's workaround for an rdma_ucm bug: on InfiniBand, bits 21-24 of the
            // mask (RoCE-only attributes) must not be passed.
            if qp.inner.pd.ctx.link_layer(id.port_num()).ok() == Some(LinkLayer::InfiniBand) {
                m = M(m.0 & !0x00e0_0000);
            }
            if rc {
                a.max_dest_rd_atomic = rd_atomic;
                a.min_rnr_timer = attr.min_rnr_timer;
                m |= M::IBV_QP_MAX_DEST_RD_ATOMIC | M::IBV_QP_MIN_RNR_TIMER;
            }
        }
        QpState::Rts if rc => {
            a.max_rd_atomic = rd_atomic;
            a.retry_cnt = attr.retry_cnt;
            a.rnr_retry = attr.rnr_retry;
            // Ours, not the connection manager's default (19: about 2.1 s per try).
            a.timeout = attr.timeout;
            m |= M::IBV_QP_MAX_QP_RD_ATOMIC
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_TIMEOUT;
        }
        _ => {}
    }
    if !rc {
        // The id is an RC one (TCP port space); UC has no reads, atomics or retries.
        let not_uc = M::IBV_QP_MAX_DEST_RD_ATOMIC.0
            | M::IBV_QP_MIN_RNR_TIMER.0
            | M::IBV_QP_TIMEOUT.0
            | M::IBV_QP_RETRY_CNT.0
            | M::IBV_QP_RNR_RETRY.0
            | M::IBV_QP_MAX_QP_RD_ATOMIC.0;
        m = M(m.0 & !not_uc);
    }
    qp.modify_raw(&mut a, m.0 as c_int, to)
}

/// The access flags a connection manager's move to INIT sets for a QP of type `t`.
fn cm_access(t: QpType, attr: &QpAttr) -> u32 {
    let rc = t == QpType::Rc;
    access_to_ibv(if rc { attr.access } else { attr.access & AccessFlags::REMOTE_WRITE })
}

/// What a connect needs of its QP besides moving it: taken when the connect starts, so that
/// its steps up to the answer can go on while the QP is elsewhere (lent to post receives).
#[derive(Clone, Copy, Debug)]
pub(super) struct QpFacts {
    pub(super) qp_num: u32,
    qp_type: QpType,
    has_srq: bool,
    /// What its move to INIT set, while it is in INIT.
    init_as: Option<InitAs>,
}

impl QpFacts {
    pub(super) fn of(qp: &IbvQp) -> QpFacts {
        QpFacts { qp_num: qp.qp_num, qp_type: qp.qp_type, has_srq: qp.has_srq, init_as: qp.init_as }
    }

    /// Whether the QP is in INIT with what `rdma_init_qp_attr` would give for `id` and
    /// `attr`: its port, and on RoCE (Ethernet link layer) P_Key index 0, the index of the
    /// default P_Key that an Ethernet port's connection manager resolves every address to.
    pub(super) fn already_init(&self, ctx: &CtxInner, id: &Id, attr: &QpAttr) -> bool {
        let port = id.port_num();
        let roce = ctx.link_layer(port).ok() == Some(LinkLayer::Ethernet);
        let want = InitAs { port, pkey_index: 0, access: cm_access(self.qp_type, attr) };
        roce && self.init_as == Some(want)
    }
}

/// The connection parameters we send.
pub(super) fn conn_param(
    qp: &QpFacts,
    attr: &QpAttr,
    private_data: &[u8],
    responder_resources: u8,
    initiator_depth: u8,
) -> rdma_conn_param {
    rdma_conn_param {
        private_data: if private_data.is_empty() {
            std::ptr::null()
        } else {
            private_data.as_ptr().cast()
        },
        private_data_len: private_data.len() as u8,
        responder_resources,
        initiator_depth,
        flow_control: 1,
        retry_count: attr.retry_cnt.min(7),
        rnr_retry_count: attr.rnr_retry.min(7),
        srq: u8::from(qp.has_srq),
        qp_num: qp.qp_num,
    }
}
