//! The active side: resolving the address and route, `rdma_connect`, and on CONNECT_RESPONSE
//! the QP's move to RTR and RTS and `rdma_establish`.

use std::net::SocketAddr;
use std::os::raw::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys::rdma_cm_event_type as Ev;

use super::channel::{Channel, Event, Id};
use super::connection::IbvConnection;
use super::qp_state::{cm_modify, conn_param};
use super::{
    check_cm_ctx, check_device, check_qp, cm_err, ctx_name, deadline, other,
    MAX_CONNECT_PRIVATE_DATA, REJ_CONSUMER_DEFINED,
};
use crate::error::{Error, Result};
use crate::ibverbs::context::CtxInner;
use crate::ibverbs::convert::{last_err, sockaddr_from, timeout_ms};
use crate::ibverbs::qp::IbvQp;
use crate::types::{QpAttr, QpState};

/// Waits for one of `want` on `ch`, skipping others. Errors map as `connect` reports them.
fn wait_for(
    ch: &Channel,
    dl: Option<Instant>,
    want: u32,
    op: &'static str,
    addr: SocketAddr,
) -> Result<Event> {
    loop {
        let Some(ev) = ch.wait(dl).map_err(cm_err("rdma_get_cm_event", addr))? else {
            return Err(Error::CmTimeout { op, addr });
        };
        let kind = ev.kind();
        if kind == want {
            return Ok(ev);
        }
        match kind {
            Ev::RDMA_CM_EVENT_REJECTED => {
                let private_data = if ev.status() == REJ_CONSUMER_DEFINED {
                    ev.private_data()
                } else {
                    Vec::new()
                };
                return Err(Error::Rejected { addr, private_data });
            }
            Ev::RDMA_CM_EVENT_ADDR_ERROR
            | Ev::RDMA_CM_EVENT_ROUTE_ERROR
            | Ev::RDMA_CM_EVENT_UNREACHABLE
            | Ev::RDMA_CM_EVENT_CONNECT_ERROR
            | Ev::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                return Err(Error::Unreachable {
                    addr,
                    reason: format!("{op}: {}", ev.describe()),
                });
            }
            _ => {}
        }
    }
}

/// [`crate::Context::connect`].
pub(crate) fn connect(
    ctx: &Arc<CtxInner>,
    addr: SocketAddr,
    qp: &mut IbvQp,
    attr: &QpAttr,
    private_data: &[u8],
    timeout: Duration,
) -> Result<IbvConnection> {
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
    let dl = deadline(timeout);
    let remaining_ms = || match dl {
        Some(d) => timeout_ms(d.saturating_duration_since(Instant::now())).max(1),
        None => c_int::MAX,
    };
    let ch = Channel::new().map_err(cm_err("rdma_create_event_channel", addr))?;
    let id = Id::create(&ch).map_err(cm_err("rdma_create_id", addr))?;

    let (mut dst, _) = sockaddr_from(addr);
    // SAFETY: a live id; `dst` holds a valid address; NULL source lets rdma_cm pick.
    let ret = unsafe {
        rdma_sys::rdma_resolve_addr(
            id.0,
            std::ptr::null_mut(),
            (&mut dst as *mut libc::sockaddr_storage).cast(),
            remaining_ms(),
        )
    };
    if ret != 0 {
        return Err(Error::Cm { op: "rdma_resolve_addr", addr, source: last_err() });
    }
    drop(wait_for(&ch, dl, Ev::RDMA_CM_EVENT_ADDR_RESOLVED, "rdma_resolve_addr", addr)?);
    if !ctx.is_device_of(id.verbs()) {
        return Err(Error::Cm {
            op: "rdma_resolve_addr",
            addr,
            source: other(format!(
                "{addr} is reached through RDMA device {}, not {}",
                ctx_name(id.verbs()),
                ctx.name
            )),
        });
    }
    // SAFETY: a live id with a resolved address.
    if unsafe { rdma_sys::rdma_resolve_route(id.0, remaining_ms()) } != 0 {
        return Err(Error::Cm { op: "rdma_resolve_route", addr, source: last_err() });
    }
    drop(wait_for(&ch, dl, Ev::RDMA_CM_EVENT_ROUTE_RESOLVED, "rdma_resolve_route", addr)?);

    cm_modify(qp, &id, QpState::Init, attr, 0)?;
    let resp_res = attr.max_dest_rd_atomic.min(ctx.max_qp_rd_atom);
    let init_depth = attr.max_rd_atomic.min(ctx.max_qp_init_rd_atom);
    let mut param = conn_param(qp, attr, private_data, resp_res, init_depth);
    // SAFETY: a live id with a resolved route; `param` and its data outlive the call.
    if unsafe { rdma_sys::rdma_connect(id.0, &mut param) } != 0 {
        return Err(Error::Cm { op: "rdma_connect", addr, source: last_err() });
    }
    let ev = wait_for(&ch, dl, Ev::RDMA_CM_EVENT_CONNECT_RESPONSE, "rdma_connect", addr)?;
    let peer_private = ev.private_data();
    // The accepter's depths, already from our point of view.
    let resp_res = resp_res.min(ev.conn().responder_resources);
    let init_depth = init_depth.min(ev.conn().initiator_depth);
    drop(ev);
    let finish = |qp: &mut IbvQp| -> Result<()> {
        cm_modify(qp, &id, QpState::Rtr, attr, resp_res)?;
        cm_modify(qp, &id, QpState::Rts, attr, init_depth)?;
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
    Ok(IbvConnection {
        id,
        ch,
        qp: qp.inner.clone(),
        peer_private,
        peer: addr,
        pending_established: true,
        disconnected: false,
    })
}
