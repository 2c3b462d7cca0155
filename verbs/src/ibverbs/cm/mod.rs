//! Connection management over librdmacm (`rdma_cm`, TCP port space).
//!
//! QPs are ours (created with `ibv_create_qp`), not librdmacm's (`rdma_create_qp`), so the
//! cm ids have no `qp` and librdmacm leaves every state change to us: each side moves its QP
//! with the attributes `rdma_init_qp_attr` gives for the id (plus local policy from the
//! caller's [`QpAttr`]: access flags, read/atomic depths, RNR timer, retry counts).
//!
//! - Passive side: [`IbvListener::get_request`] takes a CONNECT_REQUEST and moves the new id to
//!   its own event channel (`rdma_migrate_id`), so each connection's events are its own;
//!   [`IbvConnRequest::accept`] moves the QP to INIT, RTR and RTS, calls `rdma_accept` and waits
//!   for ESTABLISHED (up to [`crate::ACCEPT_WAIT`]); `accept_start` does the same without the
//!   wait, which an [`IbvAccepting`] does (polled, so that no connector delays another).
//! - Active side: [`connect_start`] starts resolving the address; an [`IbvConnecting`], polled,
//!   resolves the route, moves the QP to INIT, calls
//!   `rdma_connect`, and on CONNECT_RESPONSE moves it to RTR and RTS and calls
//!   `rdma_establish` (which sends the RTU).
//!
//! Notes:
//! - Private data arrives zero-padded to the size the transport carries (56 bytes in a
//!   connect request, 196 in an accept, 148 in a reject); compare prefixes.
//! - When the peer disconnects, [`IbvConnection::poll_event`] reports
//!   [`CmEvent::Disconnected`] but leaves the local QP alone: moving it to ERR (to flush its
//!   requests) is the caller's job. [`IbvConnection::disconnect`] does move it to ERR.
//! - The QP may be on any context of the cm id's device (a sibling, see
//!   [`crate::Context::open_sibling`]): rdma_cm needs only its number, and we move it with the
//!   device's attributes. A QP of another device is [`Error::WrongDevice`].
//! - UC QPs are connected like RC ones (the id's attributes are filtered of what UC does not
//!   have); UD QPs are [`Error::Unsupported`] (UD needs no connection).
//! - If `connect` or `accept` fails after the QP has left RESET, the QP is left where it got
//!   to (INIT or later); reset it before reusing it.
//!
//! Layout: this file holds the shared checks and limits; `channel` the event channel, cm id
//! and cm event wrappers; `qp_state` the QP state changes driven by `rdma_init_qp_attr` and
//! the connection parameters; `listener` the listener (`rdma_listen`, CONNECT_REQUEST);
//! `request` a connection request (accept, reject); `active` the active side's connect; and
//! `connection` an established connection and its events.
//!
//! [`QpAttr`]: crate::types::QpAttr
//! [`IbvListener::get_request`]: crate::provider::Listener::get_request
//! [`IbvConnRequest::accept`]: crate::provider::ConnRequest::accept
//! [`IbvConnection::poll_event`]: crate::provider::Connection::poll_event
//! [`CmEvent::Disconnected`]: crate::provider::CmEvent::Disconnected
//! [`IbvConnection::disconnect`]: crate::provider::Connection::disconnect

mod active;
mod channel;
mod connection;
mod listener;
mod qp_state;
mod request;
mod waiter;

use std::io;
use std::net::SocketAddr;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

pub(crate) use active::connect_start;
pub use active::IbvConnecting;
pub use connection::IbvConnection;
pub(crate) use listener::listen;
pub use listener::IbvListener;
pub use request::{IbvAccepting, IbvConnRequest};
pub use waiter::IbvCmWaiter;

use super::context::CtxInner;
use super::qp::IbvQp;
use super::unsupported;
use crate::error::{Error, Result};
use crate::types::{QpState, QpType};

/// Private data bytes a connect request carries (IB CM REQ's 92 less the 36-byte CMA header).
const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Private data bytes an accept carries (IB CM REP).
const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Private data bytes a reject carries (IB CM REJ).
const MAX_REJECT_PRIVATE_DATA: usize = 148;

/// `IB_CM_REJ_CONSUMER_DEFINED`: the status of a REJECTED event the peer's application caused.
const REJ_CONSUMER_DEFINED: c_int = 28;

fn cm_err(op: &'static str, addr: SocketAddr) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Cm { op, addr, source }
}

fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

fn deadline(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// The device name of a context pointer, for messages.
fn ctx_name(v: *mut rdma_sys::ibv_context) -> String {
    if v.is_null() {
        return "(none)".into();
    }
    // SAFETY: a live context's device is valid.
    unsafe { super::device_name((*v).device) }
}

/// Checks that `ctx` can be used with rdma_cm.
fn check_cm_ctx(ctx: &CtxInner, op: &'static str, addr: SocketAddr) -> Result<()> {
    if ctx.is_rdma_cm() {
        return Ok(());
    }
    Err(Error::Cm {
        op,
        addr,
        source: other(format!(
            "device {} was opened without librdmacm (rdma_get_devices does not list it), so \
             rdma_cm cannot use it",
            ctx.name
        )),
    })
}

/// Checks that `qp` is on the device of `ctx` (the connection manager's), on any of its
/// contexts: rdma_cm only needs the QP's number, and we move the QP ourselves.
fn check_device(ctx: &CtxInner, qp: &IbvQp, op: &'static str) -> Result<()> {
    let qp_ctx = &qp.inner.pd.ctx;
    if ctx.same_device(qp_ctx) {
        return Ok(());
    }
    Err(Error::WrongDevice {
        op,
        qpn: qp.qp_num,
        qp_device: qp_ctx.name.clone(),
        device: ctx.name.clone(),
    })
}

/// Checks that `qp` can be connected: RC or UC, in RESET or INIT.
fn check_qp(qp: &IbvQp) -> Result<()> {
    if qp.qp_type == QpType::Ud {
        return Err(unsupported("connecting a UD QP through the connection manager"));
    }
    if !matches!(qp.state, QpState::Reset | QpState::Init) {
        return Err(Error::InvalidArgument(format!(
            "QP {} is in {:?}; the connection manager needs it in RESET or INIT",
            qp.qp_num, qp.state
        )));
    }
    Ok(())
}
