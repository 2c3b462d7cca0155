//! The in-process connection manager of `soft`: the same listen / connect / accept / reject /
//! disconnect exchange as rdma_cm, with a `SocketAddr` as the rendezvous name.
//!
//! Connect and accept are blocking calls of the control plane: the connector waits for the
//! answer, the acceptor for the connector's "ready to use" (its QP in RTS), so both QPs are in
//! RTS when either call returns.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::context::{CtxShared, SoftContext};
use super::fabric::Fabric;
use super::port::PeerLink;
use super::qp::{QpShared, SoftQp};
use super::wire::Msg;
use super::Soft;
use crate::error::{Error, Result};
use crate::provider::{CmEvent, Qp};
use crate::types::{AsyncElement, AsyncEventKind, Endpoint, Gid, QpAttr, QpState, QpType};

/// Private data rdma_cm carries in a connect request, an accept and a reject (RDMA_PS_TCP).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// See [`MAX_CONNECT_PRIVATE_DATA`].
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// See [`MAX_CONNECT_PRIVATE_DATA`].
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;
/// Ports a listener bound to port 0 gets.
const EPHEMERAL_PORTS: (u16, u16) = (32768, 60999);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn too_long(what: &str, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(Error::InvalidArgument(format!(
            "{len} bytes of {what} private data; at most {max}"
        )));
    }
    Ok(())
}

/// A condition with its mutex.
#[derive(Debug, Default)]
struct Signal<T> {
    value: Mutex<T>,
    cv: Condvar,
}

impl<T> Signal<T> {
    fn update(&self, f: impl FnOnce(&mut T)) {
        f(&mut lock(&self.value));
        self.notify();
    }

    /// Wakes its waiters, and every [`SoftCmWaiter`] (the fabric's connection manager changed).
    fn notify(&self) {
        self.cv.notify_all();
        Activity::bump();
    }

    /// Waits until `ready` says yes or `deadline` passes; returns the guard either way.
    fn wait_until(
        &self,
        deadline: Instant,
        mut ready: impl FnMut(&T) -> bool,
    ) -> MutexGuard<'_, T> {
        let mut g = lock(&self.value);
        while !ready(&g) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = self.cv.wait_timeout(g, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        g
    }
}

/// Every change of the fabric's connection manager, counted: what a [`SoftCmWaiter`] waits on.
struct Activity {
    changes: Mutex<u64>,
    cv: Condvar,
}

static ACTIVITY: Activity = Activity { changes: Mutex::new(0), cv: Condvar::new() };

impl Activity {
    fn bump() {
        *lock(&ACTIVITY.changes) += 1;
        ACTIVITY.cv.notify_all();
    }
}

/// `soft`'s [`crate::CmWaiter`]: it returns once anything changed in the process's connection
/// manager since its last wait returned (a request, an answer, an event, a waker), so that a
/// change made while its caller looked at its objects ends the next wait at once.
#[derive(Debug)]
pub struct SoftCmWaiter {
    seen: u64,
}

impl SoftCmWaiter {
    pub(crate) fn new() -> SoftCmWaiter {
        SoftCmWaiter { seen: *lock(&ACTIVITY.changes) }
    }
}

impl crate::CmWaiter for SoftCmWaiter {
    fn waker(&self) -> crate::Waker {
        crate::Waker::new(Activity::bump)
    }

    fn wait(&mut self, _watched: &[crate::Watch], timeout: Duration) -> Result<()> {
        let deadline = Instant::now().checked_add(timeout).unwrap_or_else(far_future);
        let mut n = lock(&ACTIVITY.changes);
        while *n == self.seen {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            n = ACTIVITY.cv.wait_timeout(n, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        self.seen = *n;
        Ok(())
    }

    fn ready(&self, _w: crate::Watch) -> bool {
        true // (it cannot tell which object changed)
    }
}

#[derive(Debug, Default)]
enum Answer {
    #[default]
    Waiting,
    /// Accepted; the connector hears it at `at` (a plan's `cm_delay_us`).
    Accepted {
        qpn: u32,
        /// The accepting QP's port.
        gid: Gid,
        private_data: Vec<u8>,
        link: Arc<Link>,
        at: Instant,
    },
    Rejected(Vec<u8>),
    /// The connector is up; the accepting side hears it at `at`.
    Ready {
        at: Instant,
    },
    Abandoned,
}

/// Sleeps until `at` if that comes no later than `until` (a message in flight that arrives
/// within the caller's wait); whether it has arrived.
fn arrived_by(at: Instant, until: Instant) -> bool {
    let now = Instant::now();
    if at <= now {
        return true;
    }
    if at > until {
        return false;
    }
    std::thread::sleep(at - now);
    true
}

#[derive(Debug)]
struct Attempt {
    /// When the listener hears of it (a plan's `cm_delay_us` after it was made).
    arrives: Instant,
    /// How late each of its connection-manager messages is.
    late: Duration,
    from: SocketAddr,
    /// The connector's port.
    gid: Gid,
    qpn: u32,
    qp_type: QpType,
    private_data: Vec<u8>,
    answer: Signal<Answer>,
    /// Set when the other end is in another process (`soft::port`).
    remote: Option<RemoteEnd>,
}

/// The other process of an attempt across processes: the link to it, the connector's number
/// for the attempt, and which end this process is.
#[derive(Debug)]
struct RemoteEnd {
    link: Arc<PeerLink>,
    id: u64,
    /// This process made the connect.
    connector: bool,
    /// The listener it was made to.
    listener: SocketAddr,
}

impl Attempt {
    /// An attempt whose other end is in another process (`remote`), from QP `qpn` on the port
    /// with `gid`, recorded for that process's messages about it.
    fn far(
        remote: RemoteEnd,
        gid: Gid,
        qpn: u32,
        qp_type: QpType,
        private_data: Vec<u8>,
    ) -> Arc<Attempt> {
        let a = Arc::new(Attempt {
            arrives: Instant::now(),
            late: Duration::ZERO,
            from: SocketAddr::new(IpAddr::V6(gid.0.into()), 0),
            gid,
            qpn,
            qp_type,
            private_data,
            answer: Signal::default(),
            remote: Some(remote),
        });
        remember(a.remote.as_ref().expect("remote"), &a, None);
        a
    }

    /// Tells the other process of a remote attempt what this end did (`make` builds the
    /// message from the attempt's number).
    fn tell(&self, make: impl FnOnce(u64) -> Msg) {
        if let Some(r) = &self.remote {
            r.link.send(&make(r.id));
        }
    }

    /// Rejects the attempt, and tells a remote connector. (Each end changes its own answer
    /// before it tells the other, whose reply may come at once.)
    fn reject(&self, private_data: Vec<u8>) {
        self.answer.update(|s| *s = Answer::Rejected(private_data.clone()));
        self.tell(|attempt| Msg::Rejected { attempt, private_data });
    }

    /// Gives the attempt up and tells the other process; `connector`: this end connects.
    fn abandon(&self, connector: bool) {
        self.answer.update(|s| *s = Answer::Abandoned);
        self.tell(|attempt| Msg::Abandoned { attempt, to_connector: !connector });
    }
}

/// Both ends' event queues, the address of the listener that accepted the connection, and
/// both ends' QPs (for [`cut`]).
#[derive(Debug)]
struct Link {
    /// Each end's events, with when they reach it.
    sides: [Signal<VecDeque<(CmEvent, Instant)>>; 2],
    listener: SocketAddr,
    qps: Mutex<[Weak<QpShared>; 2]>,
    /// Its wire is cut: the connection manager's messages do not cross it either.
    cut: AtomicBool,
    /// The fault plan of its listener when it was made (`soft::faults::plan_at`), for both
    /// ends' QPs.
    plan: Option<super::faults::FaultPlan>,
    /// Its connection-manager events sent so far (what the plan's `cm_drop` draws from).
    cm_events: AtomicU64,
    /// The plan its connection-manager messages meet (the listener's, else the program's).
    cm_plan: Option<super::faults::FaultPlan>,
    /// Set when the other end is in another process: the link to it and the attempt's number
    /// (this process holds one side's queue; the other side's events go over the link).
    remote: Option<(Arc<PeerLink>, u64)>,
}

impl Link {
    /// A new link for a connection accepted at `listener`, recorded for [`cut`].
    fn new(listener: SocketAddr, remote: Option<(Arc<PeerLink>, u64)>) -> Arc<Link> {
        Link::with_plan(listener, remote, super::faults::at(listener))
    }

    /// [`Link::new`] with `plan` as its listener's plan (a connector in another process than
    /// its listener has it from the accept).
    fn with_plan(
        listener: SocketAddr,
        remote: Option<(Arc<PeerLink>, u64)>,
        plan: Option<super::faults::FaultPlan>,
    ) -> Arc<Link> {
        let link = Arc::new(Link {
            remote,
            sides: Default::default(),
            listener,
            qps: Mutex::new([Weak::new(), Weak::new()]),
            cut: AtomicBool::new(false),
            plan,
            cm_events: AtomicU64::new(0),
            cm_plan: plan.or_else(|| super::faults::for_cm(listener)),
        });
        let mut links = lock(&LINKS);
        if links.len() >= 64 && links.len().is_power_of_two() {
            links.retain(|l| l.strong_count() > 0);
        }
        links.push(Arc::downgrade(&link));
        link
    }
}

/// Every link made, while it lives (dead ones are pruned as the list grows).
static LINKS: Mutex<Vec<Weak<Link>>> = Mutex::new(Vec::new());

/// Fault injection: cuts the wire of every live connection accepted at the listener bound to
/// `listener`, as if the host behind it died or its cable was pulled, without either side
/// being told. From then on nothing either end sends arrives: RC requests end with
/// `RetryExcErr` (at once: `soft` does not wait out the retries), UC and UD ones are lost,
/// and neither end hears the other's disconnect. Connections made later are not affected; a
/// cut QP heals when it is reset. Returns the connections cut.
pub fn cut(listener: SocketAddr) -> usize {
    let links: Vec<Arc<Link>> =
        lock(&LINKS).iter().filter_map(Weak::upgrade).filter(|l| l.listener == listener).collect();
    for link in &links {
        link.cut.store(true, Ordering::Release);
        for qp in lock(&link.qps).iter().filter_map(Weak::upgrade) {
            qp.cut();
        }
    }
    links.len()
}

/// A fatal error on both ends' QPs of every connection accepted at `listener`, as a NIC
/// reports one it cannot put in a completion: each QP goes to ERR (what is posted flushes) and
/// its device raises `IBV_EVENT_QP_FATAL` for it (`Context::poll_async_event`). Returns the
/// QPs failed.
pub fn fail_qps(listener: SocketAddr) -> usize {
    let links: Vec<Arc<Link>> =
        lock(&LINKS).iter().filter_map(Weak::upgrade).filter(|l| l.listener == listener).collect();
    let mut n = 0;
    for link in &links {
        for qp in lock(&link.qps).iter().filter_map(Weak::upgrade) {
            qp.set_error();
            qp.ctx.raise(AsyncEventKind::QpFatal, AsyncElement::Qp(qp.qpn));
            n += 1;
        }
    }
    n
}

/// Fault injection: an asynchronous event on the context of the listener bound to `listener`
/// (an engine's control core's), as its device would raise it (`Context::poll_async_event`).
/// Returns whether such a listener was found.
pub fn raise_at(listener: SocketAddr, kind: AsyncEventKind, element: AsyncElement) -> bool {
    let shared = lock(&Fabric::get().listeners).get(&listener).cloned();
    match shared.and_then(|l| l.ctx.get().and_then(std::sync::Weak::upgrade)) {
        Some(ctx) => {
            ctx.raise(kind, element);
            true
        }
        None => false,
    }
}

/// A listener as connectors find it.
#[derive(Debug, Default)]
pub(crate) struct ListenerShared {
    requests: Signal<VecDeque<Arc<Attempt>>>,
    /// Set by its waker: the next (or current) wait ends at once.
    woken: std::sync::atomic::AtomicBool,
    /// The context it listens on (for [`raise_at`]).
    ctx: std::sync::OnceLock<std::sync::Weak<CtxShared>>,
}

/// A listener of `soft`'s connection manager.
#[derive(Debug)]
pub struct SoftListener {
    addr: SocketAddr,
    shared: Arc<ListenerShared>,
    /// The context it listens on: its requests are accepted with QPs of its device.
    ctx: Arc<CtxShared>,
    /// Its address held on the whole fabric, when this process is on a named one.
    name: Option<super::port::ListenerName>,
}

impl SoftListener {
    pub(crate) fn bind(ctx: &SoftContext, mut addr: SocketAddr) -> Result<Self> {
        let mut table = lock(&Fabric::get().listeners);
        let port = super::port::get();
        // On a named fabric an address is one process's: held by a name the others see.
        let claim = |a: SocketAddr| port.map(|p| p.claim(a)).transpose();
        let mut name = None;
        if addr.port() == 0 {
            // Port 0 picks a free port, as binding a socket does (from the ephemeral range).
            let free = (EPHEMERAL_PORTS.0..=EPHEMERAL_PORTS.1).find(|p| {
                let a = SocketAddr::new(addr.ip(), *p);
                !table.contains_key(&a) && claim(a).map(|n| name = n).is_ok()
            });
            let free = free.ok_or_else(|| Error::Cm {
                op: "rdma_bind_addr",
                addr,
                source: std::io::Error::from_raw_os_error(libc::EADDRNOTAVAIL),
            })?;
            addr.set_port(free);
        } else {
            let in_use = || Error::Cm {
                op: "rdma_bind_addr",
                addr,
                source: std::io::Error::from_raw_os_error(libc::EADDRINUSE),
            };
            if table.contains_key(&addr) {
                return Err(in_use());
            }
            name = claim(addr).map_err(|e| match e.kind() {
                std::io::ErrorKind::AddrInUse => in_use(),
                _ => Error::Cm { op: "rdma_bind_addr", addr, source: e },
            })?;
        }
        let shared = Arc::new(ListenerShared::default());
        let _ = shared.ctx.set(Arc::downgrade(&ctx.shared));
        table.insert(addr, shared.clone());
        Ok(SoftListener { addr, shared, ctx: ctx.shared.clone(), name })
    }
}

impl Drop for SoftListener {
    fn drop(&mut self) {
        lock(&Fabric::get().listeners).remove(&self.addr);
        let waiting: Vec<_> = lock(&self.shared.requests.value).drain(..).collect();
        for a in waiting {
            a.reject(Vec::new());
        }
    }
}

impl crate::Listener<Soft> for SoftListener {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn watch(&self) -> crate::Watch {
        crate::Watch::none()
    }

    fn waker(&self) -> crate::Waker {
        let shared = self.shared.clone();
        crate::Waker::new(move || {
            shared.woken.store(true, std::sync::atomic::Ordering::Release);
            shared.requests.update(|_| {});
        })
    }

    fn get_request(&mut self, timeout: Duration) -> Result<Option<SoftConnRequest>> {
        use std::sync::atomic::Ordering;
        let deadline = Instant::now() + timeout;
        if let Some(name) = &self.name {
            name.drain();
        }
        let woken = &self.shared.woken;
        // (the wake is taken as it ends the wait: one that comes later ends the next one)
        let mut q = self
            .shared
            .requests
            .wait_until(deadline, |q| !q.is_empty() || woken.swap(false, Ordering::AcqRel));
        while let Some(a) = q.front() {
            if a.arrives > Instant::now() {
                // Still on its way (a plan's `cm_delay_us`; those behind it too): it arrives
                // within this wait, or the next one looks again.
                let at = a.arrives;
                drop(q);
                if !arrived_by(at, deadline) {
                    return Ok(None);
                }
                q = lock(&self.shared.requests.value);
                continue;
            }
            let Some(a) = q.pop_front() else { break };
            if !matches!(*lock(&a.answer.value), Answer::Abandoned) {
                let (ctx, listener) = (self.ctx.clone(), self.addr);
                return Ok(Some(SoftConnRequest { attempt: a, ctx, listener }));
            }
        }
        Ok(None)
    }
}

/// A connection request of `soft`.
#[derive(Debug)]
pub struct SoftConnRequest {
    attempt: Arc<Attempt>,
    /// The listener's context.
    ctx: Arc<CtxShared>,
    /// The listener's address.
    listener: SocketAddr,
}

impl Drop for SoftConnRequest {
    /// A request dropped unanswered is rejected, so that the connector does not wait in vain.
    fn drop(&mut self) {
        let waiting = matches!(*lock(&self.attempt.answer.value), Answer::Waiting);
        if waiting {
            self.attempt.reject(Vec::new());
        }
    }
}

/// An accept waiting for the connector's answer (it brings its QP up and says it is ready).
#[derive(Debug)]
pub struct SoftAccepting {
    attempt: Arc<Attempt>,
    link: Arc<Link>,
}

impl crate::Accepting<Soft> for SoftAccepting {
    fn poll(
        self,
        qp: &mut SoftQp,
        timeout: Duration,
    ) -> Result<crate::Progress<Soft, SoftAccepting>> {
        let until = Instant::now().checked_add(timeout).unwrap_or_else(far_future);
        let g = self
            .attempt
            .answer
            .wait_until(until, |s| matches!(s, Answer::Ready { .. } | Answer::Abandoned));
        match *g {
            Answer::Ready { at } => {
                drop(g);
                if !arrived_by(at, until) {
                    return Ok(crate::Progress::Pending(self));
                }
                let pd = self.attempt.private_data.clone();
                Ok(crate::Progress::Ready(SoftConnection::new(self.link, 1, pd, &qp.shared)))
            }
            Answer::Abandoned => {
                drop(g);
                let _ = qp.modify(&QpAttr { state: QpState::Err, ..QpAttr::default() });
                Err(Error::CmTimeout { op: "rdma_accept", addr: self.attempt.from })
            }
            _ => {
                drop(g);
                Ok(crate::Progress::Pending(self))
            }
        }
    }

    fn abandon(self, qp: &mut SoftQp) -> Error {
        self.attempt.abandon(false);
        let _ = qp.modify(&QpAttr { state: QpState::Err, ..QpAttr::default() });
        Error::CmTimeout { op: "rdma_accept", addr: self.attempt.from }
    }

    fn watch(&self) -> crate::Watch {
        crate::Watch::none()
    }
}

/// A connection request that is never confirmed (see [`SoftContext::request_only`]); dropping
/// it gives up.
#[derive(Debug)]
pub struct HalfOpen {
    attempt: Arc<Attempt>,
}

impl Drop for HalfOpen {
    fn drop(&mut self) {
        self.attempt.answer.update(|s| *s = Answer::Abandoned);
    }
}

impl SoftContext {
    /// A test aid: sends a connection request to the listener at `addr` and never confirms an
    /// accept, as a peer that stalls (or is stopped) after its request does, until the
    /// [`HalfOpen`] is dropped.
    #[doc(hidden)]
    pub fn request_only(&self, addr: SocketAddr, private_data: &[u8]) -> Result<HalfOpen> {
        too_long("connect", private_data.len(), MAX_CONNECT_PRIVATE_DATA)?;
        let listener = listener_at(addr)?;
        let late = super::faults::cm_late(addr);
        Ok(HalfOpen { attempt: request(&listener, self, 0, QpType::Rc, private_data, late) })
    }
}

impl crate::ConnRequest<Soft> for SoftConnRequest {
    fn private_data(&self) -> &[u8] {
        &self.attempt.private_data
    }

    fn peer_addr(&self) -> SocketAddr {
        self.attempt.from
    }

    fn accept_start(
        self,
        qp: &mut SoftQp,
        attr: &QpAttr,
        private_data: &[u8],
    ) -> Result<SoftAccepting> {
        too_long("accept", private_data.len(), MAX_ACCEPT_PRIVATE_DATA)?;
        check_device(&self.ctx, qp, "rdma_accept")?;
        let a = &self.attempt;
        if qp.qp_type() != a.qp_type {
            self.attempt.reject(Vec::new());
            return Err(Error::InvalidArgument(format!(
                "the connector's QP is {}, the accepting QP {}",
                a.qp_type,
                qp.qp_type()
            )));
        }
        bring_up(qp, attr, a.qpn, a.gid)?;
        let remote = a.remote.as_ref().map(|r| (r.link.clone(), r.id));
        let link = Link::new(self.listener, remote);
        if let Some(r) = &a.remote {
            remember(r, a, Some(&link));
        }
        let gid = qp.shared.ctx.gid;
        let answer = Answer::Accepted {
            qpn: qp.qp_num(),
            gid,
            private_data: private_data.to_vec(),
            link: link.clone(),
            at: Instant::now() + super::faults::counted_late(a.late),
        };
        // (first here: the connector's "ready" may come back before `tell` returns)
        a.answer.update(|s| *s = answer);
        a.tell(|attempt| Msg::Accepted {
            attempt,
            qpn: qp.qp_num(),
            gid,
            private_data: private_data.to_vec(),
            plan: link.plan,
        });
        Ok(SoftAccepting { attempt: a.clone(), link })
    }

    fn reject(self, private_data: &[u8]) -> Result<()> {
        too_long("reject", private_data.len(), MAX_REJECT_PRIVATE_DATA)?;
        self.attempt.reject(private_data.to_vec());
        Ok(())
    }
}

/// Checks that `qp` is on the device (port) of `ctx`, on any of its contexts.
fn check_device(ctx: &CtxShared, qp: &SoftQp, op: &'static str) -> Result<()> {
    if ctx.same_device(&qp.shared.ctx) {
        return Ok(());
    }
    Err(Error::WrongDevice {
        op,
        qpn: qp.qp_num(),
        qp_device: qp.shared.ctx.describe(),
        device: ctx.describe(),
    })
}

/// RESET/INIT → INIT → RTR → RTS towards QP `dest_qpn` on the port with `gid`.
fn bring_up(qp: &mut SoftQp, attr: &QpAttr, dest_qpn: u32, gid: Gid) -> Result<()> {
    if qp.state() == QpState::Reset {
        qp.modify(&QpAttr { state: QpState::Init, ..*attr })?;
    }
    let dest = Endpoint { qpn: dest_qpn, gid, ..attr.dest };
    qp.modify(&QpAttr { state: QpState::Rtr, dest, ..*attr })?;
    qp.modify(&QpAttr { state: QpState::Rts, dest, ..*attr })
}

/// Starts connecting `qp` to the listener at `addr` (see [`crate::Context::connect_start`]).
pub(crate) fn connect_start(
    ctx: &SoftContext,
    addr: SocketAddr,
    qp: &mut SoftQp,
    attr: &QpAttr,
    private_data: &[u8],
    timeout: Duration,
) -> Result<SoftConnecting> {
    too_long("connect", private_data.len(), MAX_CONNECT_PRIVATE_DATA)?;
    if qp.qp_type() == QpType::Ud {
        return Err(Error::InvalidArgument("UD QPs are not connected".into()));
    }
    check_device(&ctx.shared, qp, "rdma_connect")?;
    if !matches!(qp.state(), QpState::Reset | QpState::Init) {
        return Err(Error::InvalidArgument(format!(
            "the QP is in {:?}; connect needs RESET or INIT",
            qp.state()
        )));
    }
    // Not in this process: a listener of another process of the fabric, if one has it.
    let target = match listener_at(addr) {
        Ok(l) => Err(l),
        Err(e) => Ok(super::port::get().and_then(|p| p.listener_owner(addr)).ok_or(e)?),
    };
    if qp.state() == QpState::Reset {
        qp.modify(&QpAttr { state: QpState::Init, ..*attr })?;
    }
    let late = super::faults::cm_late(addr);
    let attempt = match target {
        Err(listener) => request(&listener, ctx, qp.qp_num(), qp.qp_type(), private_data, late),
        Ok(link) => request_far(link, addr, ctx, qp.qp_num(), qp.qp_type(), private_data)?,
    };
    let deadline = Instant::now().checked_add(timeout);
    Ok(SoftConnecting { attempt, addr, attr: *attr, deadline })
}

/// The listener at `addr`; none is what rdma_cm reports as a reject without private data.
fn listener_at(addr: SocketAddr) -> Result<Arc<ListenerShared>> {
    let table = lock(&Fabric::get().listeners);
    bound_to(addr)
        .find_map(|a| table.get(&a).cloned())
        .ok_or(Error::Rejected { addr, private_data: Vec::new() })
}

/// The addresses a listener that takes connects to `addr` may be bound to: `addr` itself,
/// then the wildcard address of its family and port (as rdma_cm's bind does).
pub(crate) fn bound_to(addr: SocketAddr) -> impl Iterator<Item = SocketAddr> {
    let any: IpAddr = match addr.ip() {
        IpAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    let wild = SocketAddr::new(any, addr.port());
    std::iter::once(addr).chain((wild != addr).then_some(wild))
}

/// Queues a connection request from `ctx`'s QP `qpn` at `listener`.
fn request(
    listener: &ListenerShared,
    ctx: &SoftContext,
    qpn: u32,
    qp_type: QpType,
    private_data: &[u8],
    late: Duration,
) -> Arc<Attempt> {
    let attempt = Arc::new(Attempt {
        arrives: Instant::now() + late,
        late,
        from: SocketAddr::new(IpAddr::V6(ctx.shared.gid.0.into()), 0),
        gid: ctx.shared.gid,
        qpn,
        qp_type,
        private_data: private_data.to_vec(),
        answer: Signal::default(),
        remote: None,
    });
    listener.requests.update(|q| q.push_back(attempt.clone()));
    attempt
}

/// Sends a connection request from `ctx`'s QP `qpn` to the listener at `addr` of the process
/// at the other end of `link`.
fn request_far(
    link: Arc<PeerLink>,
    addr: SocketAddr,
    ctx: &SoftContext,
    qpn: u32,
    qp_type: QpType,
    private_data: &[u8],
) -> Result<Arc<Attempt>> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let gid = ctx.shared.gid;
    let remote = RemoteEnd { link: link.clone(), id, connector: true, listener: addr };
    let attempt = Attempt::far(remote, gid, qpn, qp_type, private_data.to_vec());
    let req = Msg::ConnReq {
        attempt: id,
        listener: addr,
        gid,
        qpn,
        qp_type,
        private_data: private_data.to_vec(),
    };
    if !link.send(&req) {
        return Err(Error::Unreachable { addr, reason: "its process is gone".into() });
    }
    Ok(attempt)
}

/// A `soft` connect waiting for the listener's answer.
#[derive(Debug)]
pub struct SoftConnecting {
    attempt: Arc<Attempt>,
    addr: SocketAddr,
    attr: QpAttr,
    /// When it gives up (`None`: never).
    deadline: Option<Instant>,
}

impl crate::Connecting<Soft> for SoftConnecting {
    fn watch(&self) -> crate::Watch {
        crate::Watch::none()
    }

    fn poll(self, qp: &mut SoftQp, timeout: Duration) -> Result<crate::Progress<Soft, Self>> {
        let until = Instant::now().checked_add(timeout).unwrap_or_else(far_future);
        let until = self.deadline.map_or(until, |d| d.min(until));
        let attempt = &self.attempt;
        let (addr, attr) = (self.addr, self.attr);
        let mut g = attempt.answer.wait_until(until, |s| !matches!(s, Answer::Waiting));
        if let Answer::Accepted { at, .. } = *g {
            drop(g);
            if !arrived_by(at, until) {
                if self.deadline.is_some_and(|d| Instant::now() >= d) {
                    // (dropping `self` abandons the attempt)
                    return Err(Error::CmTimeout { op: "rdma_connect", addr });
                }
                return Ok(crate::Progress::Pending(self));
            }
            g = lock(&attempt.answer.value);
        }
        match std::mem::take(&mut *g) {
            Answer::Accepted { qpn, gid, private_data, link, .. } => {
                if let Err(e) = bring_up(qp, &attr, qpn, gid) {
                    *g = Answer::Abandoned;
                    attempt.answer.notify();
                    attempt.tell(|attempt| Msg::Abandoned { attempt, to_connector: false });
                    return Err(e);
                }
                *g = Answer::Ready {
                    at: Instant::now() + super::faults::counted_late(attempt.late),
                };
                attempt.answer.notify();
                attempt.tell(|attempt| Msg::Ready { attempt });
                Ok(crate::Progress::Ready(SoftConnection::new(link, 0, private_data, &qp.shared)))
            }
            Answer::Rejected(private_data) => Err(Error::Rejected { addr, private_data }),
            Answer::Waiting if self.deadline.is_none_or(|d| Instant::now() < d) => {
                drop(g);
                Ok(crate::Progress::Pending(self))
            }
            Answer::Abandoned => Err(Error::CmTimeout { op: "rdma_connect", addr }),
            _ => {
                *g = Answer::Abandoned;
                attempt.tell(|attempt| Msg::Abandoned { attempt, to_connector: false });
                Err(Error::CmTimeout { op: "rdma_connect", addr })
            }
        }
    }
}

impl Drop for SoftConnecting {
    /// A connect dropped before it was up is abandoned: a listener skips its request, and an
    /// accepting side waiting for its confirmation hears at once, as rdma_cm's peer would when
    /// the connector's id is destroyed.
    fn drop(&mut self) {
        let mut answer = lock(&self.attempt.answer.value);
        if matches!(*answer, Answer::Waiting | Answer::Accepted { .. }) {
            *answer = Answer::Abandoned;
            self.attempt.answer.notify();
            drop(answer);
            self.attempt.tell(|attempt| Msg::Abandoned { attempt, to_connector: false });
        }
    }
}

/// An instant no wait reaches (for a timeout too long to add).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}

/// The connection-manager side of an established `soft` connection.
#[derive(Debug)]
pub struct SoftConnection {
    link: Arc<Link>,
    side: usize,
    peer_private_data: Vec<u8>,
    qp: Weak<QpShared>,
    disconnected: AtomicBool,
}

impl SoftConnection {
    fn new(link: Arc<Link>, side: usize, peer_private_data: Vec<u8>, qp: &Arc<QpShared>) -> Self {
        lock(&link.qps)[side] = Arc::downgrade(qp);
        if link.cut.load(Ordering::Acquire) {
            qp.cut();
        }
        if let Some(plan) = link.plan {
            qp.set_faults(Some(plan));
        }
        link.sides[side].update(|q| q.push_back((CmEvent::Established, Instant::now())));
        SoftConnection {
            link,
            side,
            peer_private_data,
            qp: Arc::downgrade(qp),
            disconnected: AtomicBool::new(false),
        }
    }
}

impl crate::Connection for SoftConnection {
    fn watch(&self) -> crate::Watch {
        crate::Watch::none()
    }

    fn peer_private_data(&self) -> &[u8] {
        &self.peer_private_data
    }

    fn poll_event(&mut self, timeout: Duration) -> Result<Option<CmEvent>> {
        let until = Instant::now().checked_add(timeout).unwrap_or_else(far_future);
        let q = self.link.sides[self.side].wait_until(until, |q| !q.is_empty());
        let Some(&(_, at)) = q.front() else { return Ok(None) };
        drop(q);
        if !arrived_by(at, until) {
            return Ok(None);
        }
        Ok(lock(&self.link.sides[self.side].value).pop_front().map(|(e, _)| e))
    }

    fn disconnect(&mut self) -> Result<()> {
        if self.disconnected.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if let Some(qp) = self.qp.upgrade() {
            qp.set_error();
        }
        // (Across a cut wire only this side hears it; a plan's cm_drop may lose it there.)
        let cut = self.link.cut.load(Ordering::Acquire);
        for (i, side) in self.link.sides.iter().enumerate() {
            let far = i != self.side;
            if far && cut {
                continue;
            }
            let n = self.link.cm_events.fetch_add(1, Ordering::Relaxed);
            let plan = self.link.cm_plan.filter(|_| far);
            if plan.is_some_and(|p| p.loses_cm_event(n)) {
                continue;
            }
            if let (true, Some((link, attempt))) = (far, &self.link.remote) {
                // (the other end's queue is in its process)
                let to_connector = self.side == 1;
                link.send(&Msg::Disconnect { attempt: *attempt, to_connector });
                continue;
            }
            let late = plan.map_or(Duration::ZERO, |p| p.cm_delay());
            let at = Instant::now() + super::faults::counted_late(late);
            side.update(|q| q.push_back((CmEvent::Disconnected, at)));
        }
        Ok(())
    }
}

impl Drop for SoftConnection {
    fn drop(&mut self) {
        let _ = crate::Connection::disconnect(self);
    }
}

/// The attempts and connections of this process whose other end is in another process, by
/// (link, attempt number, whether this process is the connector): what that process's
/// messages about them name.
type FarKey = (u64, u64, bool);

/// A remote attempt and, once it is up, its connection's link.
#[derive(Debug, Clone)]
struct FarEntry {
    attempt: Weak<Attempt>,
    conn: Weak<Link>,
}

impl FarEntry {
    fn attempt(self) -> Option<Arc<Attempt>> {
        self.attempt.upgrade()
    }
}

static FAR: Mutex<Option<std::collections::HashMap<FarKey, FarEntry>>> = Mutex::new(None);

/// Records remote attempt `a` (and its connection's link, once there is one).
fn remember(r: &RemoteEnd, a: &Arc<Attempt>, conn: Option<&Arc<Link>>) {
    let mut far = lock(&FAR);
    let map = far.get_or_insert_with(Default::default);
    if map.len() >= 64 && map.len().is_power_of_two() {
        map.retain(|_, e| e.attempt.strong_count() > 0 || e.conn.strong_count() > 0);
    }
    let conn = conn.map_or_else(Weak::new, Arc::downgrade);
    map.insert((r.link.id, r.id, r.connector), FarEntry { attempt: Arc::downgrade(a), conn });
}

fn find(link: &PeerLink, attempt: u64, connector: bool) -> Option<FarEntry> {
    lock(&FAR).as_ref()?.get(&(link.id, attempt, connector)).cloned()
}

/// A connection-manager message from the process at the other end of `link`.
pub(crate) fn remote_message(link: &Arc<PeerLink>, msg: Msg) {
    match msg {
        Msg::ConnReq { attempt, listener, gid, qpn, qp_type, private_data } => {
            let shared = listener_at(listener).ok();
            let Some(l) = shared else {
                // (the listener is gone: what rdma_cm reports as a reject without data)
                link.send(&Msg::Rejected { attempt, private_data: Vec::new() });
                return;
            };
            let remote = RemoteEnd { link: link.clone(), id: attempt, connector: false, listener };
            let a = Attempt::far(remote, gid, qpn, qp_type, private_data);
            l.requests.update(|q| q.push_back(a));
        }
        Msg::Accepted { attempt, qpn, gid, private_data, plan } => {
            let Some(a) = find(link, attempt, true).and_then(FarEntry::attempt) else { return };
            let Some(r) = &a.remote else { return };
            // (the listener's plan is its connections' both ends', wherever they are)
            let plan = plan.or_else(|| super::faults::at(r.listener));
            let conn = Link::with_plan(r.listener, Some((link.clone(), attempt)), plan);
            remember(r, &a, Some(&conn));
            a.answer.update(|s| {
                if matches!(s, Answer::Waiting) {
                    let at = Instant::now();
                    *s = Answer::Accepted { qpn, gid, private_data, link: conn, at };
                }
            });
        }
        Msg::Rejected { attempt, private_data } => {
            if let Some(a) = find(link, attempt, true).and_then(FarEntry::attempt) {
                a.answer.update(|s| {
                    if matches!(s, Answer::Waiting) {
                        *s = Answer::Rejected(private_data);
                    }
                });
            }
        }
        Msg::Ready { attempt } => {
            if let Some(a) = find(link, attempt, false).and_then(FarEntry::attempt) {
                a.answer.update(|s| {
                    if matches!(s, Answer::Accepted { .. }) {
                        *s = Answer::Ready { at: Instant::now() };
                    }
                });
            }
        }
        Msg::Abandoned { attempt, to_connector } => {
            if let Some(a) = find(link, attempt, to_connector).and_then(FarEntry::attempt) {
                a.answer.update(|s| {
                    if !matches!(s, Answer::Rejected(_)) {
                        *s = Answer::Abandoned;
                    }
                });
            }
        }
        Msg::Disconnect { attempt, to_connector } => {
            if let Some(conn) = find(link, attempt, to_connector).and_then(|e| e.conn.upgrade()) {
                let side = if to_connector { 0 } else { 1 };
                conn.sides[side].update(|q| q.push_back((CmEvent::Disconnected, Instant::now())));
            }
        }
        Msg::Req { .. }
        | Msg::Resp { .. }
        | Msg::Hello { .. }
        | Msg::Mailbox { .. }
        | Msg::Nudge => {}
    }
}

/// The process at the other end of `link` is gone: its attempts are abandoned, and each
/// connection made with it hears `Disconnected` (as after rdma_cm's timeout).
pub(crate) fn link_died(link: &PeerLink) {
    let gone: Vec<(FarKey, FarEntry)> = {
        let mut far = lock(&FAR);
        let Some(map) = far.as_mut() else { return };
        let keys: Vec<FarKey> = map.keys().filter(|k| k.0 == link.id).copied().collect();
        keys.into_iter().filter_map(|k| map.remove(&k).map(|v| (k, v))).collect()
    };
    for ((_, _, connector), e) in gone {
        if let Some(a) = e.attempt.upgrade() {
            a.answer.update(|s| {
                if matches!(s, Answer::Waiting | Answer::Accepted { .. }) {
                    *s = Answer::Abandoned;
                }
            });
        }
        if let Some(conn) = e.conn.upgrade() {
            let side = if connector { 0 } else { 1 };
            conn.sides[side].update(|q| q.push_back((CmEvent::Disconnected, Instant::now())));
        }
    }
}
