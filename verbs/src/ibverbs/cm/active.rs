//! The active side, a step per event of the connect's id (polled, never waited on
//! by the caller): resolving the address and route, `rdma_connect`, and on CONNECT_RESPONSE
//! the QP's move to RTR and RTS and `rdma_establish`. Up to the answer the steps need no QP
//! when it was in INIT at the start as the connection manager would set it
//! (`Connecting::advance`): a control core lets them go on while a worker posts its receives.

use std::net::SocketAddr;
use std::os::raw::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys::rdma_cm_event_type as Ev;

use super::channel::{Binding, Event};
use super::connection::IbvConnection;
use super::qp_state::{cm_modify, conn_param, QpFacts};
use super::{
    check_cm_ctx, check_device, check_qp, cm_err, ctx_name, deadline, other,
    MAX_CONNECT_PRIVATE_DATA, REJ_CONSUMER_DEFINED,
};
use crate::error::{Error, Result};
use crate::ibverbs::context::CtxInner;
use crate::ibverbs::convert::{last_err, sockaddr_from, timeout_ms};
use crate::ibverbs::qp::IbvQp;
use crate::ibverbs::Ibverbs;
use crate::provider::Progress;
use crate::types::{QpAttr, QpState};

/// What an event on a connect's channel means while it waits for `want`: `Ok(Some(ev))` the
/// one it waits for, `Ok(None)` one to skip, or the error it reports (as `connect` maps them).
fn classify(ev: Event, want: u32, op: &'static str, addr: SocketAddr) -> Result<Option<Event>> {
    let kind = ev.kind();
    if kind == want {
        return Ok(Some(ev));
    }
    match kind {
        Ev::RDMA_CM_EVENT_REJECTED => {
            let private_data =
                if ev.status() == REJ_CONSUMER_DEFINED { ev.private_data() } else { Vec::new() };
            Err(Error::Rejected { addr, private_data })
        }
        Ev::RDMA_CM_EVENT_ADDR_ERROR
        | Ev::RDMA_CM_EVENT_ROUTE_ERROR
        | Ev::RDMA_CM_EVENT_UNREACHABLE
        | Ev::RDMA_CM_EVENT_CONNECT_ERROR
        | Ev::RDMA_CM_EVENT_DEVICE_REMOVAL => {
            Err(Error::Unreachable { addr, reason: format!("{op}: {}", ev.describe()) })
        }
        _ => Ok(None),
    }
}

/// Where a connect is: waiting for the address, the route, its QP (to send the connect
/// with), or the accepter's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Addr,
    Route,
    Connect,
    Answer,
}

/// A connect in progress: its id, and the step it waits for.
pub struct IbvConnecting {
    cm: Binding,
    ctx: Arc<CtxInner>,
    addr: SocketAddr,
    attr: QpAttr,
    private_data: Vec<u8>,
    /// Its QP, as it was at the start.
    qp: QpFacts,
    step: Step,
    deadline: Option<Instant>,
}

// SAFETY: librdmacm ids and channels may be used from any thread; one owner at a time.
unsafe impl Send for IbvConnecting {}

impl std::fmt::Debug for IbvConnecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvConnecting").field("addr", &self.addr).field("step", &self.step).finish()
    }
}

impl IbvConnecting {
    /// Milliseconds left before the deadline, for rdma_cm's own timeouts (at least 1).
    fn remaining_ms(&self) -> c_int {
        match self.deadline {
            Some(d) => timeout_ms(d.saturating_duration_since(Instant::now())).max(1),
            None => c_int::MAX,
        }
    }

    /// The step after `ev` (the event the address or route step waited for); `qp` is the
    /// connect's QP when the caller has it.
    fn step(&mut self, qp: Option<&mut IbvQp>, ev: Event) -> Result<()> {
        let addr = self.addr;
        match self.step {
            Step::Addr => {
                drop(ev);
                if !self.ctx.is_device_of(self.cm.id().verbs()) {
                    return Err(Error::Cm {
                        op: "rdma_resolve_addr",
                        addr,
                        source: other(format!(
                            "{addr} is reached through RDMA device {}, not {}",
                            ctx_name(self.cm.id().verbs()),
                            self.ctx.name
                        )),
                    });
                }
                // SAFETY: a live id with a resolved address.
                if unsafe { rdma_sys::rdma_resolve_route(self.cm.id().0, self.remaining_ms()) } != 0
                {
                    return Err(Error::Cm { op: "rdma_resolve_route", addr, source: last_err() });
                }
                self.step = Step::Route;
                Ok(())
            }
            Step::Route => {
                drop(ev);
                self.step = Step::Connect;
                self.connect(qp)
            }
            Step::Connect | Step::Answer => Ok(()), // (`connect` and `answered` take those)
        }
    }

    /// The route is resolved: the QP to INIT and `rdma_connect`, when that needs no QP or
    /// `qp` is here (else the step waits for it).
    fn connect(&mut self, qp: Option<&mut IbvQp>) -> Result<()> {
        let (addr, attr) = (self.addr, self.attr);
        match qp {
            Some(qp) => cm_modify(qp, self.cm.id(), QpState::Init, &attr, 0)?,
            None if self.qp.already_init(&self.ctx, self.cm.id(), &attr) => {}
            None => return Ok(()),
        }
        let resp_res = attr.max_dest_rd_atomic.min(self.ctx.max_qp_rd_atom);
        let init_depth = attr.max_rd_atomic.min(self.ctx.max_qp_init_rd_atom);
        let mut param = conn_param(&self.qp, &attr, &self.private_data, resp_res, init_depth);
        // SAFETY: a live id with a resolved route; `param` and its data outlive the call.
        if unsafe { rdma_sys::rdma_connect(self.cm.id().0, &mut param) } != 0 {
            return Err(Error::Cm { op: "rdma_connect", addr, source: last_err() });
        }
        self.step = Step::Answer;
        Ok(())
    }

    /// The accepter's answer `ev` came: the QP to RTR and RTS, the RTU, the connection.
    fn answered(self, qp: &mut IbvQp, ev: Event) -> Result<IbvConnection> {
        let addr = self.addr;
        {
            {
                let peer_private = ev.private_data();
                let attr = self.attr;
                // The accepter's depths, already from our point of view.
                let resp_res = attr
                    .max_dest_rd_atomic
                    .min(self.ctx.max_qp_rd_atom)
                    .min(ev.conn().responder_resources);
                let init_depth = attr
                    .max_rd_atomic
                    .min(self.ctx.max_qp_init_rd_atom)
                    .min(ev.conn().initiator_depth);
                drop(ev);
                let id = self.cm.id();
                let finish = |qp: &mut IbvQp| -> Result<()> {
                    cm_modify(qp, id, QpState::Rtr, &attr, resp_res)?;
                    cm_modify(qp, id, QpState::Rts, &attr, init_depth)?;
                    // SAFETY: a live id that got CONNECT_RESPONSE and has no librdmacm QP.
                    if unsafe { rdma_sys::rdma_establish(id.0) } != 0 {
                        return Err(Error::Cm { op: "rdma_establish", addr, source: last_err() });
                    }
                    Ok(())
                };
                if let Err(e) = finish(qp) {
                    let _ = qp.inner.to_err();
                    return Err(e);
                }
                let IbvConnecting { cm, .. } = self;
                Ok(IbvConnection {
                    cm,
                    qp: qp.inner.clone(),
                    peer_private,
                    peer: addr,
                    pending_established: true,
                    disconnected: false,
                })
            }
        }
    }

    /// Until when a poll of `timeout` may wait: then, or the connect's deadline if sooner.
    fn until(&self, timeout: Duration) -> Option<Instant> {
        match (Instant::now().checked_add(timeout), self.deadline) {
            (Some(u), Some(d)) => Some(u.min(d)),
            (u, d) => u.or(d),
        }
    }

    /// What the current step waits for, and its name for messages.
    fn want(&self) -> (u32, &'static str) {
        match self.step {
            Step::Addr => (Ev::RDMA_CM_EVENT_ADDR_RESOLVED, "rdma_resolve_addr"),
            Step::Route => (Ev::RDMA_CM_EVENT_ROUTE_RESOLVED, "rdma_resolve_route"),
            Step::Connect | Step::Answer => (Ev::RDMA_CM_EVENT_CONNECT_RESPONSE, "rdma_connect"),
        }
    }
}

impl crate::provider::Connecting<Ibverbs> for IbvConnecting {
    fn watch(&self) -> crate::Watch {
        self.cm.watch()
    }

    fn poll(mut self, qp: &mut IbvQp, timeout: Duration) -> Result<Progress<Ibverbs, Self>> {
        let until = self.until(timeout);
        if self.step == Step::Connect {
            self.connect(Some(qp))?;
        }
        loop {
            let (want, op) = self.want();
            let addr = self.addr;
            let Some(ev) = self.cm.next(until).map_err(cm_err("rdma_get_cm_event", addr))? else {
                if self.deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(Error::CmTimeout { op, addr });
                }
                return Ok(Progress::Pending(self));
            };
            let Some(ev) = classify(ev, want, op, addr)? else { continue };
            if self.step == Step::Answer {
                return self.answered(qp, ev).map(Progress::Ready);
            }
            self.step(Some(qp), ev)?;
        }
    }

    fn advance(mut self, timeout: Duration) -> Result<Self> {
        let until = self.until(timeout);
        while matches!(self.step, Step::Addr | Step::Route) {
            let (want, op) = self.want();
            let addr = self.addr;
            let Some(ev) = self.cm.next(until).map_err(cm_err("rdma_get_cm_event", addr))? else {
                break; // (its deadline is `poll`'s to report)
            };
            if let Some(ev) = classify(ev, want, op, addr)? {
                self.step(None, ev)?;
            }
        }
        Ok(self)
    }
}

/// [`crate::Context::connect_start`].
pub(crate) fn connect_start(
    ctx: &Arc<CtxInner>,
    addr: SocketAddr,
    qp: &mut IbvQp,
    attr: &QpAttr,
    private_data: &[u8],
    timeout: Duration,
) -> Result<IbvConnecting> {
    check_cm_ctx(ctx, "rdma_connect", addr)?;
    check_qp(qp)?;
    check_device(ctx, qp, "rdma_connect")?;
    if private_data.len() > MAX_CONNECT_PRIVATE_DATA {
        return Err(Error::InvalidArgument(format!(
            "{} bytes of private data; a connect request carries at most \
             {MAX_CONNECT_PRIVATE_DATA}",
            private_data.len()
        )));
    }
    let cm = Binding::create().map_err(cm_err("rdma_create_id", addr))?;
    let c = IbvConnecting {
        cm,
        ctx: ctx.clone(),
        addr,
        attr: *attr,
        private_data: private_data.to_vec(),
        qp: QpFacts::of(qp),
        step: Step::Addr,
        deadline: deadline(timeout),
    };
    let (mut dst, _) = sockaddr_from(addr);
    // SAFETY: a live id; `dst` holds a valid address; NULL source lets rdma_cm pick.
    let ret = unsafe {
        rdma_sys::rdma_resolve_addr(
            c.cm.id().0,
            std::ptr::null_mut(),
            (&mut dst as *mut libc::sockaddr_storage).cast(),
            c.remaining_ms(),
        )
    };
    if ret != 0 {
        return Err(Error::Cm { op: "rdma_resolve_addr", addr, source: last_err() });
    }
    Ok(c)
}
