//! A connection request on the passive side: accepting it (QP to RTS, `rdma_accept`; then an
//! [`IbvAccepting`] waits for ESTABLISHED) or rejecting it.

use std::net::SocketAddr;

use rdma_sys::{rdma_cm_event_type as Ev, rdma_cm_id};

use super::channel::Binding;
use super::connection::IbvConnection;
use super::qp_state::{cm_modify, conn_param, QpFacts};
use super::{check_qp, cm_err, ctx_name, MAX_ACCEPT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA};
use crate::error::{Error, Result};
use crate::ibverbs::convert::last_err;
use crate::ibverbs::qp::IbvQp;
use crate::ibverbs::Ibverbs;
use crate::provider::{Accepting, ConnRequest, Progress};
use crate::types::{QpAttr, QpState};

/// An accepted request waiting for the connector's RTU (ESTABLISHED on its own channel).
pub struct IbvAccepting {
    cm: Binding,
    peer_private: Vec<u8>,
    peer: SocketAddr,
}

// SAFETY: as `IbvConnRequest`: librdmacm ids and channels may be used from any thread.
unsafe impl Send for IbvAccepting {}

impl std::fmt::Debug for IbvAccepting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvAccepting").field("peer", &self.peer).finish()
    }
}

impl Accepting<Ibverbs> for IbvAccepting {
    fn watch(&self) -> crate::Watch {
        self.cm.watch()
    }

    fn poll(
        self,
        qp: &mut IbvQp,
        timeout: std::time::Duration,
    ) -> Result<Progress<Ibverbs, IbvAccepting>> {
        let peer = self.peer;
        let until = Some(std::time::Instant::now() + timeout);
        loop {
            let Some(ev) = self.cm.next(until).map_err(cm_err("rdma_get_cm_event", peer))? else {
                return Ok(Progress::Pending(self));
            };
            match ev.kind() {
                Ev::RDMA_CM_EVENT_ESTABLISHED => break,
                Ev::RDMA_CM_EVENT_REJECTED
                | Ev::RDMA_CM_EVENT_CONNECT_ERROR
                | Ev::RDMA_CM_EVENT_UNREACHABLE
                | Ev::RDMA_CM_EVENT_DISCONNECTED
                | Ev::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                    let reason = ev.describe();
                    drop(ev);
                    let _ = qp.inner.to_err();
                    return Err(Error::Unreachable { addr: peer, reason });
                }
                _ => {}
            }
        }
        let IbvAccepting { cm, peer_private, peer } = self;
        Ok(Progress::Ready(IbvConnection {
            cm,
            qp: qp.inner.clone(),
            peer_private,
            peer,
            pending_established: true,
            disconnected: false,
        }))
    }

    fn abandon(self, qp: &mut IbvQp) -> Error {
        let _ = qp.inner.to_err();
        Error::CmTimeout { op: "rdma_accept", addr: self.peer }
    }
}

/// A connection request. Dropping it without accepting rejects it.
pub struct IbvConnRequest {
    pub(super) cm: Binding,
    pub(super) private_data: Vec<u8>,
    pub(super) peer: SocketAddr,
    /// Reads/atomics the connector wants us to serve (its initiator depth).
    pub(super) responder_resources: u8,
    /// Reads/atomics the connector will serve for us.
    pub(super) initiator_depth: u8,
}

// SAFETY: librdmacm ids and channels may be used from any thread; one owner at a time.
unsafe impl Send for IbvConnRequest {}

impl std::fmt::Debug for IbvConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvConnRequest")
            .field("peer", &self.peer)
            .field("private_data", &self.private_data.len())
            .finish()
    }
}

impl IbvConnRequest {
    /// The request's `rdma_cm_id` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut rdma_cm_id {
        self.cm.id().0
    }
}

impl ConnRequest<Ibverbs> for IbvConnRequest {
    fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Moves `qp` to INIT, RTR and RTS and calls `rdma_accept`; the connector's RTU is the
    /// [`IbvAccepting`]'s to wait for.
    fn accept_start(
        self,
        qp: &mut IbvQp,
        attr: &QpAttr,
        private_data: &[u8],
    ) -> Result<IbvAccepting> {
        let peer = self.peer;
        check_qp(qp)?;
        if private_data.len() > MAX_ACCEPT_PRIVATE_DATA {
            return Err(Error::InvalidArgument(format!(
                "{} bytes of private data; an accept carries at most {MAX_ACCEPT_PRIVATE_DATA}",
                private_data.len()
            )));
        }
        let ctx = qp.inner.pd.ctx.clone();
        // Any context of the request's device will do (rdma_cm needs only the QP number).
        if !ctx.is_device_of(self.cm.id().verbs()) {
            return Err(Error::WrongDevice {
                op: "rdma_accept",
                qpn: qp.qp_num,
                qp_device: ctx.name.clone(),
                device: ctx_name(self.cm.id().verbs()),
            });
        }
        let resp_res =
            self.responder_resources.min(attr.max_dest_rd_atomic).min(ctx.max_qp_rd_atom);
        let init_depth = self.initiator_depth.min(attr.max_rd_atomic).min(ctx.max_qp_init_rd_atom);
        cm_modify(qp, self.cm.id(), QpState::Init, attr, 0)?;
        cm_modify(qp, self.cm.id(), QpState::Rtr, attr, resp_res)?;
        cm_modify(qp, self.cm.id(), QpState::Rts, attr, init_depth)?;
        let mut param = conn_param(&QpFacts::of(qp), attr, private_data, resp_res, init_depth);
        // SAFETY: a live id; `param` (and the private data it points to) outlive the call.
        if unsafe { rdma_sys::rdma_accept(self.cm.id().0, &mut param) } != 0 {
            let e = last_err();
            let _ = qp.inner.to_err();
            return Err(Error::Cm { op: "rdma_accept", addr: peer, source: e });
        }
        let IbvConnRequest { cm, private_data: peer_private, .. } = self;
        Ok(IbvAccepting { cm, peer_private, peer })
    }

    fn reject(self, private_data: &[u8]) -> Result<()> {
        if private_data.len() > MAX_REJECT_PRIVATE_DATA {
            return Err(Error::InvalidArgument(format!(
                "{} bytes of private data; a reject carries at most {MAX_REJECT_PRIVATE_DATA}",
                private_data.len()
            )));
        }
        let ptr = if private_data.is_empty() { std::ptr::null() } else { private_data.as_ptr() };
        // SAFETY: a live id with a pending request; the data outlives the call.
        let ret =
            unsafe { rdma_sys::rdma_reject(self.cm.id().0, ptr.cast(), private_data.len() as u8) };
        if ret != 0 {
            return Err(Error::Cm { op: "rdma_reject", addr: self.peer, source: last_err() });
        }
        Ok(())
    }
}
