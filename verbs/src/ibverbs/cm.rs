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
//!   for ESTABLISHED (up to [`ACCEPT_TIMEOUT`]).
//! - Active side: [`connect`] resolves the address and route, moves the QP to INIT, calls
//!   `rdma_connect`, and on CONNECT_RESPONSE moves it to RTR and RTS and calls
//!   `rdma_establish` (which sends the RTU).
//!
//! Notes:
//! - Private data arrives zero-padded to the size the transport carries (56 bytes in a
//!   connect request, 196 in an accept, 148 in a reject); compare prefixes.
//! - When the peer disconnects, [`IbvConnection::poll_event`] reports
//!   [`CmEvent::Disconnected`] but leaves the local QP alone: moving it to ERR (to flush its
//!   requests) is the caller's job. [`IbvConnection::disconnect`] does move it to ERR.
//! - UC QPs are connected like RC ones (the id's attributes are filtered of what UC does not
//!   have); UD QPs are [`Error::Unsupported`] (UD needs no connection).
//! - If `connect` or `accept` fails after the QP has left RESET, the QP is left where it got
//!   to (INIT or later); reset it before reusing it.

use std::io;
use std::net::SocketAddr;
use std::os::raw::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys::{
    ibv_qp_attr, ibv_qp_attr_mask, rdma_cm_event, rdma_cm_event_type as Ev, rdma_cm_id,
    rdma_conn_param, rdma_event_channel, rdma_port_space,
};

use super::context::CtxInner;
use super::convert::{
    access_to_ibv, err_text, errno_err, last_err, sockaddr_from, sockaddr_to, timeout_ms,
};
use super::qp::{IbvQp, QpInner};
use super::{unsupported, Ibverbs};
use crate::error::{Error, Result};
use crate::provider::{CmEvent, ConnRequest, Connection, Listener};
use crate::types::{AccessFlags, LinkLayer, QpAttr, QpState, QpType};

/// How long [`IbvConnRequest::accept`] waits for the connector's RTU (ESTABLISHED).
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(30);

/// Private data bytes a connect request carries (IB CM REQ's 92 less the 36-byte CMA header).
const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Private data bytes an accept carries (IB CM REP).
const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Private data bytes a reject carries (IB CM REJ).
const MAX_REJECT_PRIVATE_DATA: usize = 148;

/// `IB_CM_REJ_CONSUMER_DEFINED`: the status of a REJECTED event the peer's application caused.
const REJ_CONSUMER_DEFINED: c_int = 28;

/// An event channel, non-blocking, destroyed on drop.
struct Channel(*mut rdma_event_channel);

impl Channel {
    fn new() -> io::Result<Channel> {
        // SAFETY: no arguments; NULL on failure.
        let ch = unsafe { rdma_sys::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(last_err());
        }
        let ch = Channel(ch);
        let fd = ch.fd();
        // SAFETY: fcntl on the channel's valid descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(last_err());
        }
        Ok(ch)
    }

    fn fd(&self) -> c_int {
        // SAFETY: a live channel.
        unsafe { (*self.0).fd }
    }

    /// The next event, waiting until `deadline` (`None`: forever). `Ok(None)` on timeout.
    fn wait(&self, deadline: Option<Instant>) -> io::Result<Option<Event>> {
        loop {
            let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
            // SAFETY: a live channel; the fd is non-blocking, so this returns at once.
            let ret = unsafe { rdma_sys::rdma_get_cm_event(self.0, &mut ev) };
            if ret == 0 && !ev.is_null() {
                return Ok(Some(Event(ev)));
            }
            let e = last_err();
            match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => {}
                _ => return Err(e),
            }
            let wait_ms = match deadline {
                None => -1,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(None);
                    }
                    timeout_ms(d - now)
                }
            };
            let mut pfd = libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            let rc = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
            if rc < 0 {
                let e = last_err();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(e);
                }
            }
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: created by rdma_create_event_channel; every id on it is destroyed first
        // (ids are declared before their channel in every owner).
        unsafe { rdma_sys::rdma_destroy_event_channel(self.0) };
    }
}

/// A cm id, destroyed on drop (which also rejects a pending request or disconnects).
struct Id(*mut rdma_cm_id);

impl Id {
    fn create(ch: &Channel) -> io::Result<Id> {
        let mut id: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: a live channel; `id` is a valid out-pointer.
        let ret = unsafe {
            rdma_sys::rdma_create_id(
                ch.0,
                &mut id,
                std::ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        if ret != 0 || id.is_null() {
            return Err(last_err());
        }
        Ok(Id(id))
    }

    /// The verbs context the id is bound to (NULL while unbound or wildcard).
    fn verbs(&self) -> *mut rdma_sys::ibv_context {
        // SAFETY: a live id.
        unsafe { (*self.0).verbs }
    }

    fn port_num(&self) -> u8 {
        // SAFETY: a live id.
        unsafe { (*self.0).port_num }
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: a live id; src_storage is a full sockaddr_storage.
        unsafe {
            sockaddr_to(std::ptr::addr_of!((*self.0).route.addr.src_addr_union.src_storage).cast())
        }
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: a live id; dst_storage is a full sockaddr_storage.
        unsafe {
            sockaddr_to(std::ptr::addr_of!((*self.0).route.addr.dst_addr_union.dst_storage).cast())
        }
    }
}

impl Drop for Id {
    fn drop(&mut self) {
        // SAFETY: a live id whose events have all been acked (Event acks on drop).
        let ret = unsafe { rdma_sys::rdma_destroy_id(self.0) };
        if ret != 0 {
            eprintln!("corelink ibverbs: rdma_destroy_id failed: {}", last_err());
        }
    }
}

/// A cm event, acknowledged on drop.
struct Event(*mut rdma_cm_event);

impl Event {
    fn kind(&self) -> u32 {
        // SAFETY: a live (unacked) event.
        unsafe { (*self.0).event }
    }

    fn status(&self) -> c_int {
        // SAFETY: a live event.
        unsafe { (*self.0).status }
    }

    fn id(&self) -> *mut rdma_cm_id {
        // SAFETY: a live event.
        unsafe { (*self.0).id }
    }

    /// The connection parameters (valid for connection events).
    fn conn(&self) -> &rdma_conn_param {
        // SAFETY: a live event; `conn` is the union member for RC/UC connection events, and
        // every member is plain data, so reading it is defined for any event.
        unsafe { &(*self.0).param.conn }
    }

    fn private_data(&self) -> Vec<u8> {
        let c = self.conn();
        if c.private_data.is_null() || c.private_data_len == 0 {
            return Vec::new();
        }
        // SAFETY: librdmacm points private_data at `private_data_len` bytes inside the event,
        // valid until the ack.
        unsafe {
            std::slice::from_raw_parts(c.private_data.cast::<u8>(), usize::from(c.private_data_len))
        }
        .to_vec()
    }

    fn describe(&self) -> String {
        // SAFETY: rdma_event_str returns a static string for any value.
        let name = unsafe { std::ffi::CStr::from_ptr(rdma_sys::rdma_event_str(self.kind())) }
            .to_string_lossy()
            .into_owned();
        let st = self.status();
        if st < 0 {
            format!("{name} ({})", err_text(&errno_err(-st)))
        } else {
            format!("{name} (status {st})")
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: an event from rdma_get_cm_event, acked once.
        unsafe { rdma_sys::rdma_ack_cm_event(self.0) };
    }
}

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

/// Moves `qp` to `to` with `rdma_init_qp_attr`'s attributes for `id`, plus local policy from
/// `attr`; `rd_atomic` is the negotiated depth (responder resources at RTR, initiator depth at
/// RTS).
fn cm_modify(qp: &mut IbvQp, id: &Id, to: QpState, attr: &QpAttr, rd_atomic: u8) -> Result<()> {
    use ibv_qp_attr_mask as M;
    // SAFETY: plain old data; all-zero is valid.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = super::convert::qp_state_to_ibv(to);
    let mut mask: c_int = 0;
    // SAFETY: a live id; `a` and `mask` are valid out-pointers.
    let ret = unsafe { rdma_sys::rdma_init_qp_attr(id.0, &mut a, &mut mask) };
    if ret != 0 {
        return Err(qp.modify_err(to, last_err()));
    }
    let mut m = M(mask as u32);
    let rc = qp.qp_type == QpType::Rc;
    match to {
        QpState::Init => {
            let access = if rc { attr.access } else { attr.access & AccessFlags::REMOTE_WRITE };
            a.qp_access_flags = access_to_ibv(access);
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
            m |= M::IBV_QP_MAX_QP_RD_ATOMIC | M::IBV_QP_RETRY_CNT | M::IBV_QP_RNR_RETRY;
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

/// The connection parameters we send.
fn conn_param(
    qp: &IbvQp,
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

/// [`crate::Context::listen`].
pub(crate) fn listen(ctx: &Arc<CtxInner>, addr: SocketAddr) -> Result<IbvListener> {
    check_cm_ctx(ctx, "rdma_listen", addr)?;
    let ch = Channel::new().map_err(cm_err("rdma_create_event_channel", addr))?;
    let id = Id::create(&ch).map_err(cm_err("rdma_create_id", addr))?;
    let (mut ss, _) = sockaddr_from(addr);
    // SAFETY: a live id; `ss` holds a valid socket address.
    let ret =
        unsafe { rdma_sys::rdma_bind_addr(id.0, (&mut ss as *mut libc::sockaddr_storage).cast()) };
    if ret != 0 {
        return Err(Error::Cm { op: "rdma_bind_addr", addr, source: last_err() });
    }
    let v = id.verbs();
    if !v.is_null() && v != ctx.ctx {
        return Err(Error::Cm {
            op: "rdma_bind_addr",
            addr,
            source: other(format!(
                "{addr} belongs to RDMA device {}, not {}",
                ctx_name(v),
                ctx.name
            )),
        });
    }
    // SAFETY: a bound id.
    if unsafe { rdma_sys::rdma_listen(id.0, 128) } != 0 {
        return Err(Error::Cm { op: "rdma_listen", addr, source: last_err() });
    }
    let local = id.local_addr().unwrap_or(addr);
    Ok(IbvListener { id, ch, ctx: ctx.clone(), local })
}

/// A connection-manager listener. Bound to a wildcard address it hears requests arriving on
/// any device; [`IbvConnRequest::accept`] then refuses a QP of another device.
pub struct IbvListener {
    // Field order matters: the id is destroyed before its channel.
    id: Id,
    ch: Channel,
    ctx: Arc<CtxInner>,
    local: SocketAddr,
}

// SAFETY: librdmacm ids and channels may be used from any thread; the listener is used by one
// owner at a time (`&mut self`).
unsafe impl Send for IbvListener {}

impl std::fmt::Debug for IbvListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvListener")
            .field("device", &self.ctx.name)
            .field("local", &self.local)
            .finish()
    }
}

impl IbvListener {
    /// The listening `rdma_cm_id` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut rdma_cm_id {
        self.id.0
    }
}

impl Listener<Ibverbs> for IbvListener {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn get_request(&mut self, timeout: Duration) -> Result<Option<IbvConnRequest>> {
        let addr = self.local;
        let dl = deadline(timeout);
        loop {
            let Some(ev) = self.ch.wait(dl).map_err(cm_err("rdma_get_cm_event", addr))? else {
                return Ok(None);
            };
            if ev.kind() != Ev::RDMA_CM_EVENT_CONNECT_REQUEST {
                continue; // acked on drop
            }
            let private_data = ev.private_data();
            let (responder_resources, initiator_depth) =
                (ev.conn().responder_resources, ev.conn().initiator_depth);
            let raw_id = ev.id();
            drop(ev);
            // The channel first: locals drop in reverse order, and the id may end up on it.
            let ch = Channel::new().map_err(cm_err("rdma_create_event_channel", addr))?;
            let id = Id(raw_id);
            let peer = id.peer_addr().unwrap_or(addr);
            // SAFETY: a live id (ours now) and a live channel; its events are all acked.
            if unsafe { rdma_sys::rdma_migrate_id(id.0, ch.0) } != 0 {
                return Err(Error::Cm { op: "rdma_migrate_id", addr: peer, source: last_err() });
            }
            return Ok(Some(IbvConnRequest {
                id,
                ch,
                private_data,
                peer,
                responder_resources,
                initiator_depth,
            }));
        }
    }
}

/// A connection request. Dropping it without accepting rejects it.
pub struct IbvConnRequest {
    // Field order matters: the id is destroyed before its channel.
    id: Id,
    ch: Channel,
    private_data: Vec<u8>,
    peer: SocketAddr,
    /// Reads/atomics the connector wants us to serve (its initiator depth).
    responder_resources: u8,
    /// Reads/atomics the connector will serve for us.
    initiator_depth: u8,
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
        self.id.0
    }
}

impl ConnRequest<Ibverbs> for IbvConnRequest {
    fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Moves `qp` to INIT, RTR and RTS, accepts, and waits up to [`ACCEPT_TIMEOUT`] for the
    /// connector's RTU.
    fn accept(self, qp: &mut IbvQp, attr: &QpAttr, private_data: &[u8]) -> Result<IbvConnection> {
        let peer = self.peer;
        check_qp(qp)?;
        if private_data.len() > MAX_ACCEPT_PRIVATE_DATA {
            return Err(Error::InvalidArgument(format!(
                "{} bytes of private data; an accept carries at most {MAX_ACCEPT_PRIVATE_DATA}",
                private_data.len()
            )));
        }
        let ctx = qp.inner.pd.ctx.clone();
        if self.id.verbs() != ctx.ctx {
            return Err(Error::Cm {
                op: "rdma_accept",
                addr: peer,
                source: other(format!(
                    "the request arrived on device {}, the QP is on {}",
                    ctx_name(self.id.verbs()),
                    ctx.name
                )),
            });
        }
        let resp_res =
            self.responder_resources.min(attr.max_dest_rd_atomic).min(ctx.max_qp_rd_atom);
        let init_depth = self.initiator_depth.min(attr.max_rd_atomic).min(ctx.max_qp_init_rd_atom);
        cm_modify(qp, &self.id, QpState::Init, attr, 0)?;
        cm_modify(qp, &self.id, QpState::Rtr, attr, resp_res)?;
        cm_modify(qp, &self.id, QpState::Rts, attr, init_depth)?;
        let mut param = conn_param(qp, attr, private_data, resp_res, init_depth);
        // SAFETY: a live id; `param` (and the private data it points to) outlive the call.
        if unsafe { rdma_sys::rdma_accept(self.id.0, &mut param) } != 0 {
            let e = last_err();
            let _ = qp.inner.to_err();
            return Err(Error::Cm { op: "rdma_accept", addr: peer, source: e });
        }
        let dl = deadline(ACCEPT_TIMEOUT);
        loop {
            let Some(ev) = self.ch.wait(dl).map_err(cm_err("rdma_get_cm_event", peer))? else {
                let _ = qp.inner.to_err();
                return Err(Error::CmTimeout { op: "rdma_accept", addr: peer });
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
        let IbvConnRequest { id, ch, private_data: peer_private, .. } = self;
        Ok(IbvConnection {
            id,
            ch,
            qp: qp.inner.clone(),
            peer_private,
            peer,
            pending_established: true,
            disconnected: false,
        })
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
        let ret = unsafe { rdma_sys::rdma_reject(self.id.0, ptr.cast(), private_data.len() as u8) };
        if ret != 0 {
            return Err(Error::Cm { op: "rdma_reject", addr: self.peer, source: last_err() });
        }
        Ok(())
    }
}

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
    if !Arc::ptr_eq(&qp.inner.pd.ctx, ctx) && qp.inner.pd.ctx.ctx != ctx.ctx {
        return Err(Error::InvalidArgument(format!(
            "QP {} is on device {}, not {}",
            qp.qp_num, qp.inner.pd.ctx.name, ctx.name
        )));
    }
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
    if id.verbs() != ctx.ctx {
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

/// The connection-manager side of an established connection. Dropping it destroys the id
/// (which disconnects if still connected) and its channel; the QP stays the caller's.
pub struct IbvConnection {
    // Field order matters: the id is destroyed before its channel.
    id: Id,
    ch: Channel,
    qp: Arc<QpInner>,
    peer_private: Vec<u8>,
    peer: SocketAddr,
    /// ESTABLISHED is reported once by the first `poll_event`.
    pending_established: bool,
    /// A disconnect was seen or done.
    disconnected: bool,
}

// SAFETY: librdmacm ids and channels may be used from any thread; one owner at a time.
unsafe impl Send for IbvConnection {}

impl std::fmt::Debug for IbvConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvConnection")
            .field("peer", &self.peer)
            .field("disconnected", &self.disconnected)
            .finish()
    }
}

impl IbvConnection {
    /// The connection's `rdma_cm_id` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut rdma_cm_id {
        self.id.0
    }
}

impl Connection for IbvConnection {
    fn peer_private_data(&self) -> &[u8] {
        &self.peer_private
    }

    /// ESTABLISHED first (once), then DISCONNECTED / DEVICE_REMOVAL as they come; other
    /// events (TIMEWAIT_EXIT, ...) are skipped. A peer's disconnect does not touch the local
    /// QP: move it to ERR to flush it.
    fn poll_event(&mut self, timeout: Duration) -> Result<Option<CmEvent>> {
        if self.pending_established {
            self.pending_established = false;
            return Ok(Some(CmEvent::Established));
        }
        let dl = deadline(timeout);
        loop {
            let Some(ev) = self.ch.wait(dl).map_err(cm_err("rdma_get_cm_event", self.peer))? else {
                return Ok(None);
            };
            match ev.kind() {
                Ev::RDMA_CM_EVENT_DISCONNECTED => {
                    self.disconnected = true;
                    return Ok(Some(CmEvent::Disconnected));
                }
                Ev::RDMA_CM_EVENT_ESTABLISHED => return Ok(Some(CmEvent::Established)),
                Ev::RDMA_CM_EVENT_DEVICE_REMOVAL => return Ok(Some(CmEvent::DeviceRemoval)),
                _ => {}
            }
        }
    }

    /// Moves the QP to ERR (its outstanding requests flush) and sends a disconnect request;
    /// the DISCONNECTED event follows on both sides. Idempotent.
    fn disconnect(&mut self) -> Result<()> {
        self.qp.to_err().map_err(cm_err("ibv_modify_qp(ERR)", self.peer))?;
        if self.disconnected {
            return Ok(());
        }
        self.disconnected = true;
        // SAFETY: a live, connected id.
        if unsafe { rdma_sys::rdma_disconnect(self.id.0) } != 0 {
            let e = last_err();
            // Already disconnected by the peer (event not polled yet): nothing left to do.
            if e.raw_os_error() == Some(libc::EINVAL) {
                return Ok(());
            }
            return Err(Error::Cm { op: "rdma_disconnect", addr: self.peer, source: e });
        }
        Ok(())
    }
}
