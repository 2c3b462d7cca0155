//! The provider traits: what a provider (`ibverbs`, `soft`) implements, and therefore the
//! whole safe API of the verbs layer.
//!
//! Code above this layer is generic over `P: Provider` and calls the data path (`post_send`,
//! `post_recv`, `poll`) through these traits: static dispatch, no `dyn`, no allocation.
//! Objects keep their parents alive (a QP holds its PD's and CQs' handles), so drop order is
//! never a safety question.

use std::fmt::Debug;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::types::*;
use crate::wr::{RecvWr, SendWr};

/// A provider: a family of RDMA objects with the same semantics.
pub trait Provider: Sized + Send + Sync + 'static + Debug {
    /// An open device.
    type Context: Context<Self>;
    /// A protection domain.
    type Pd: Pd<Self>;
    /// A registered memory region.
    type Mr: Mr;
    /// A (type 2) memory window.
    type Mw: Mw;
    /// A completion queue.
    type Cq: Cq;
    /// A shared receive queue.
    type Srq: Srq;
    /// A queue pair.
    type Qp: Qp<Self>;
    /// A UD address handle.
    type Ah: Send + Sync + Debug;
    /// A connection-manager listener.
    type Listener: Listener<Self>;
    /// A connection request waiting for accept or reject.
    type ConnRequest: ConnRequest<Self>;
    /// An accept waiting for the connector's confirmation (see [`ConnRequest::accept_start`]).
    type Accepting: Accepting<Self>;
    /// A connect in progress (see [`Context::connect_start`]).
    type Connecting: Connecting<Self>;
    /// An established connection's connection-manager side.
    type Connection: Connection;
    /// One thread's wait for the connection-manager events of many objects at once.
    type CmWaiter: CmWaiter;

    /// The provider's name (`ibverbs`, `soft`).
    const NAME: &'static str;

    /// The devices this provider can open. Empty (not an error) on a host without any.
    fn devices() -> Result<Vec<DeviceInfo>>;

    /// Opens the device called `name`.
    fn open(name: &str) -> Result<Self::Context>;

    /// A new [`CmWaiter`] (for a thread that drives many connects, accepts and connections).
    fn cm_waiter() -> Result<Self::CmWaiter>;
}

/// An open device.
pub trait Context<P: Provider>: Send + Sync + Debug {
    /// Device name.
    fn name(&self) -> &str;

    /// Opens another context of this context's device, a *sibling*, for one thread to own.
    ///
    /// A sibling has resources of its own where the device has them per context: on hardware
    /// its own doorbell registers (UAR pages; on ConnectX, QPs of one context share them under a
    /// lock), and its own asynchronous events (those of its own objects). Objects of two
    /// contexts are not combined: a QP's PD, CQs and SRQ come from one context
    /// ([`Error::ForeignObject`]). Otherwise siblings are one device: their QPs connect to each
    /// other and reach each other's registered memory as QPs of two hosts do, and a QP of any
    /// sibling is connected through any sibling's connection manager ([`Context::connect`],
    /// [`ConnRequest::accept`]; a QP of another device is [`Error::WrongDevice`]).
    ///
    /// On `ibverbs` it is `ibv_open_device` on the same `ibv_device`; on `soft`, a new context
    /// on the same port (same GID and LID). The default, for a provider without it, is
    /// [`Error::Unsupported`].
    fn open_sibling(&self) -> Result<P::Context> {
        Err(Error::Unsupported { what: "opening a second context of a device", provider: P::NAME })
    }

    /// Device capabilities.
    fn query_device(&self) -> Result<DeviceAttr>;
    /// Port attributes (ports count from 1).
    fn query_port(&self, port: u8) -> Result<PortAttr>;
    /// GID table entry.
    fn query_gid(&self, port: u8, index: u32) -> Result<Gid>;
    /// Allocates a protection domain.
    fn alloc_pd(&self) -> Result<P::Pd>;
    /// Creates a completion queue holding at least `depth` completions.
    fn create_cq(&self, depth: u32) -> Result<P::Cq>;
    /// The next asynchronous event, if one is pending. Never blocks.
    fn poll_async_event(&self) -> Result<Option<AsyncEvent>>;
    /// Listens for connections on `addr` (port 0 picks a free port; see
    /// [`Listener::local_addr`]).
    fn listen(&self, addr: SocketAddr) -> Result<P::Listener>;
    /// Connects `qp` (RC or UC, in RESET or INIT, on this device: on this context or a
    /// sibling, see [`Context::open_sibling`]) to the listener at `addr`,
    /// sending `private_data`; blocks until the connection is established, rejected or `timeout`
    /// runs out. On success the QP is in RTS. Control-plane only: never call it on a worker.
    fn connect(
        &self,
        addr: SocketAddr,
        qp: &mut P::Qp,
        attr: &QpAttr,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<P::Connection> {
        let mut c = self.connect_start(addr, qp, attr, private_data, timeout)?;
        loop {
            match c.poll(qp, timeout)? {
                Progress::Ready(conn) => return Ok(conn),
                Progress::Pending(p) => c = p,
            }
        }
    }

    /// Starts connecting as [`Context::connect`] does, without waiting: each step (address
    /// and route resolution, the connect, the answer) waits in [`Connecting::poll`], so that a
    /// control core can drive many connects, and accepts, from one thread. The connect fails
    /// with a timeout once `timeout` has passed from now.
    fn connect_start(
        &self,
        addr: SocketAddr,
        qp: &mut P::Qp,
        attr: &QpAttr,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<P::Connecting>;

    /// The endpoint a peer needs to connect to `qp` by hand (no connection manager).
    fn endpoint(&self, qp: &P::Qp, port: u8, gid_index: u32) -> Result<Endpoint> {
        let port_attr = self.query_port(port)?;
        Ok(Endpoint {
            qpn: qp.qp_num(),
            psn: 0,
            lid: port_attr.lid,
            gid: self.query_gid(port, gid_index)?,
        })
    }
}

/// A protection domain: MRs, MWs, QPs, SRQs and AHs interact only within one.
pub trait Pd<P: Provider>: Send + Sync + Debug {
    /// Registers `len` bytes of fresh, zeroed, page-aligned memory owned by the region.
    fn register(&self, len: usize, access: AccessFlags) -> Result<P::Mr>;

    /// Registers the caller's memory.
    ///
    /// # Safety
    /// `addr..addr+len` must be valid for reads and writes for as long as the region (and any
    /// work request naming it) lives, and nothing may hold a Rust reference into it while the
    /// device may write it.
    unsafe fn register_raw(&self, addr: *mut u8, len: usize, access: AccessFlags) -> Result<P::Mr>;

    /// Allocates a type 2 memory window (bound with [`crate::SendOp::BindMw`]).
    fn alloc_mw(&self) -> Result<P::Mw>;
    /// Creates a shared receive queue.
    fn create_srq(&self, attr: &SrqAttr) -> Result<P::Srq>;
    /// Creates a queue pair in RESET.
    fn create_qp(&self, attr: &QpInitAttr<'_, P>) -> Result<P::Qp>;
    /// Creates a UD address handle.
    fn create_ah(&self, attr: &AhAttr) -> Result<P::Ah>;
}

/// What [`Pd::create_qp`] takes.
pub struct QpInitAttr<'a, P: Provider> {
    /// Transport.
    pub qp_type: QpType,
    /// CQ of the send queue.
    pub send_cq: &'a P::Cq,
    /// CQ of the receive queue.
    pub recv_cq: &'a P::Cq,
    /// Shared receive queue, if receives come from one.
    pub srq: Option<&'a P::Srq>,
    /// Queue sizes and limits.
    pub cap: QpCap,
    /// Every send request asks for a completion, whatever its flags.
    pub sq_sig_all: bool,
}

impl<P: Provider> std::fmt::Debug for QpInitAttr<'_, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpInitAttr")
            .field("qp_type", &self.qp_type)
            .field("srq", &self.srq.is_some())
            .field("cap", &self.cap)
            .field("sq_sig_all", &self.sq_sig_all)
            .finish()
    }
}

/// A registered memory region.
///
/// Its bytes may change under the program at any time (peers write them), so it hands out no
/// Rust references to them: copy in and out with [`Mr::write_at`] and [`Mr::read_at`], or take
/// [`Mr::as_ptr`] and the responsibility that goes with it.
pub trait Mr: Send + Sync + Debug {
    /// Virtual address of the first byte.
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Local key.
    fn lkey(&self) -> u32;
    /// Remote key.
    fn rkey(&self) -> u32;
    /// Access rights it was registered with.
    fn access(&self) -> AccessFlags;

    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pointer to the first byte.
    fn as_ptr(&self) -> *mut u8 {
        self.addr() as *mut u8
    }

    /// The scatter/gather entry for `len` bytes at `offset`.
    fn sge(&self, offset: usize, len: u32) -> Result<Sge> {
        check_range(self.len(), offset, len as usize)?;
        Ok(Sge { addr: self.addr() + offset as u64, length: len, lkey: self.lkey() })
    }

    /// The remote location `offset` bytes in, for a peer.
    fn remote(&self, offset: usize) -> RemoteAddr {
        RemoteAddr { addr: self.addr() + offset as u64, rkey: self.rkey() }
    }

    /// The whole region as a peer sees it.
    fn region(&self) -> RemoteRegion {
        RemoteRegion { addr: self.addr(), len: self.len() as u64, rkey: self.rkey() }
    }

    /// Copies `data` into the region at `offset`.
    fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(self.len(), offset, data.len())?;
        // SAFETY: the range is inside the region, which stays mapped while `self` lives; the
        // destination is never aliased by a Rust reference (the region hands out none).
        unsafe { std::ptr::copy(data.as_ptr(), self.as_ptr().add(offset), data.len()) };
        Ok(())
    }

    /// Copies bytes of the region at `offset` into `out`.
    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(self.len(), offset, out.len())?;
        // SAFETY: as in `write_at`, with source and destination swapped.
        unsafe { std::ptr::copy(self.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// The byte at `offset`, read atomically with acquire ordering: what a poller reads to
    /// see a peer's write land (its last byte, written last), as perftest's latency loop does.
    #[inline]
    fn read_u8(&self, offset: usize) -> Result<u8> {
        check_range(self.len(), offset, 1)?;
        // SAFETY: in range; a byte is always aligned, and a peer's or the device's writes
        // to it are never seen through a Rust reference (the region hands out none).
        let a = unsafe { std::sync::atomic::AtomicU8::from_ptr(self.as_ptr().add(offset)) };
        Ok(a.load(std::sync::atomic::Ordering::Acquire))
    }

    /// The little-endian (host order) 8-byte word at `offset`, read atomically.
    fn read_u64(&self, offset: usize) -> Result<u64> {
        check_range(self.len(), offset, 8)?;
        if (self.addr() + offset as u64) % 8 != 0 {
            return Err(Error::InvalidArgument(format!("offset {offset} is not 8-byte aligned")));
        }
        // SAFETY: in range and 8-byte aligned; device atomics use the same word atomically.
        let a = unsafe { std::sync::atomic::AtomicU64::from_ptr(self.as_ptr().add(offset).cast()) };
        Ok(a.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Stores an 8-byte word at `offset` atomically.
    fn write_u64(&self, offset: usize, v: u64) -> Result<()> {
        check_range(self.len(), offset, 8)?;
        if (self.addr() + offset as u64) % 8 != 0 {
            return Err(Error::InvalidArgument(format!("offset {offset} is not 8-byte aligned")));
        }
        // SAFETY: as in `read_u64`.
        let a = unsafe { std::sync::atomic::AtomicU64::from_ptr(self.as_ptr().add(offset).cast()) };
        a.store(v, std::sync::atomic::Ordering::Release);
        Ok(())
    }
}

#[inline]
fn check_range(total: usize, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(out_of_range(total, offset, len)),
    }
}

#[cold]
fn out_of_range(total: usize, offset: usize, len: usize) -> Error {
    Error::InvalidArgument(format!("range {offset}+{len} is outside the {total}-byte region"))
}

/// A type 2 memory window.
pub trait Mw: Send + Sync + Debug {
    /// The rkey of the window's current binding (it changes at each bind).
    fn rkey(&self) -> u32;
}

/// A completion queue.
pub trait Cq: Send + Sync + Debug {
    /// Moves up to `out.len()` completions into `out`; returns how many. Never blocks and never
    /// allocates.
    fn poll(&self, out: &mut [Wc]) -> Result<usize>;
    /// Completions it holds at most.
    fn depth(&self) -> u32;
    /// A handle naming this CQ in [`AsyncElement::Cq`].
    fn handle(&self) -> u64;
}

/// A shared receive queue.
pub trait Srq: Send + Sync + Debug {
    /// Posts receive requests; those before a refused one stay posted (see
    /// [`Error::PostSrqRecv`]).
    ///
    /// # Safety
    /// Every buffer named by the scatter lists must stay valid, and unread by Rust references,
    /// until its completion has been polled (or the SRQ destroyed).
    unsafe fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()>;
    /// A handle naming this SRQ in [`AsyncElement::Srq`].
    fn handle(&self) -> u64;
}

/// A queue pair.
pub trait Qp<P: Provider>: Send + Debug {
    /// QP number.
    fn qp_num(&self) -> u32;
    /// Transport.
    fn qp_type(&self) -> QpType;
    /// Current state (as last set or observed; a QP moved to ERR by the device reports it).
    fn state(&self) -> QpState;
    /// Sizes and limits it was created with.
    fn cap(&self) -> QpCap;
    /// Moves the QP to `attr.state`, taking from `attr` what that transition needs.
    fn modify(&mut self, attr: &QpAttr) -> Result<()>;

    /// Posts send requests as one batch (one doorbell). Those before a refused one stay
    /// posted ([`Error::PostSend`] gives its index). Inline payloads are copied now.
    ///
    /// A QP that has not reached RTS (RESET, INIT, RTR) refuses every request with
    /// [`Error::PostSend`] at index 0 and queues none of them, on every provider (rxe's own
    /// post answers `EINVAL` and yet keeps the request, to run once the QP is up: corelink
    /// refuses before the device sees it). In ERR requests are taken and flushed.
    ///
    /// # Safety
    /// Every buffer named by a non-inline gather/scatter list must stay valid, and free of Rust
    /// references that conflict with the device's access, until the request's completion has
    /// been polled (for an unsignalled request: until a later signalled one's completion).
    unsafe fn post_send(&mut self, wrs: &[SendWr<'_, P>]) -> Result<()>;

    /// Posts receive requests to this QP's own receive queue.
    ///
    /// # Safety
    /// As [`Srq::post_recv`].
    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()>;

    /// RESET → INIT → RTR → RTS towards `dest` (RC/UC) or RESET → INIT → RTR → RTS (UD), with
    /// `attr` for everything else.
    fn connect_to(&mut self, dest: Endpoint, attr: &QpAttr) -> Result<()> {
        for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
            self.modify(&QpAttr { state, dest, ..*attr })?;
        }
        Ok(())
    }
}

/// A connection-manager listener.
pub trait Listener<P: Provider>: Send + Debug {
    /// The address it listens on.
    fn local_addr(&self) -> SocketAddr;
    /// Waits up to `timeout` for the next connection request (zero: just look); returns
    /// early (with none) when its [`Waker`] is woken.
    fn get_request(&mut self, timeout: Duration) -> Result<Option<P::ConnRequest>>;
    /// What ends a [`Listener::get_request`] wait early, from any thread: so that a thread that
    /// waits for connection requests hears of other work at once.
    fn waker(&self) -> Waker;
    /// What a [`CmWaiter`] watches for its connection requests.
    fn watch(&self) -> Watch;
}

/// One thread's wait for the connection-manager events of many objects at once (a control
/// core's loop): it sleeps until one of the objects it watches may have something to look at
/// (a request, an answer, a disconnect), its [`Waker`] is woken, or the timeout passes, rather
/// than waking at a fixed pace to look at each in turn. After a wait, poll each watched object
/// with a zero timeout to see what came.
pub trait CmWaiter: Send + Debug {
    /// Ends the current wait early, or the next one at once, from any thread.
    fn waker(&self) -> Waker;
    /// Waits up to `timeout` until one of `watched` may have an event or the waker is woken;
    /// it may also return early for no reason (spuriously), never later. Zero: just looks.
    fn wait(&mut self, watched: &[Watch], timeout: Duration) -> Result<()>;
    /// Whether `w` (one of the last wait's) may have an event: it had one then, or the
    /// provider cannot tell (`soft`: always true). An object that did not may be skipped.
    fn ready(&self, w: Watch) -> bool;
}

/// What a [`CmWaiter`] watches of one connection-manager object (from `watch` on a
/// [`Listener`], [`Accepting`], [`Connecting`] or [`Connection`]): an event channel's
/// descriptor on `ibverbs`, nothing on `soft` (whose waiter hears every change of the fabric's
/// connection manager). Opaque; valid while its object lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watch {
    /// The descriptor a waiter sleeps on.
    pub(crate) fd: Option<std::os::raw::c_int>,
    /// Which object on that descriptor it is (`ibverbs`: its cm id, whose events the waiter
    /// sorts out of the process's one channel), 0 for none.
    pub(crate) key: usize,
}

impl Watch {
    /// A watch of no descriptor, as `soft`'s objects have: a [`CmWaiter`] cannot tell whether
    /// its object has an event, so [`CmWaiter::ready`] says it may. For providers built on
    /// others (a proxy's objects).
    pub const fn none() -> Watch {
        Watch { fd: None, key: 0 }
    }
}

/// Ends a wait early (see [`Listener::waker`]); cheap to clone, callable from any thread.
#[derive(Clone)]
pub struct Waker(std::sync::Arc<dyn Fn() + Send + Sync>);

impl Waker {
    /// A waker that calls `wake` (which must not block).
    pub fn new(wake: impl Fn() + Send + Sync + 'static) -> Waker {
        Waker(std::sync::Arc::new(wake))
    }

    /// Ends the wait it belongs to, now or (if none is under way) the next one at once.
    #[inline]
    pub fn wake(&self) {
        (self.0)()
    }
}

impl Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Waker")
    }
}

/// A connection request, to accept with a QP or to reject.
pub trait ConnRequest<P: Provider>: Send + Debug {
    /// The connector's private data.
    fn private_data(&self) -> &[u8];
    /// The connector's address.
    fn peer_addr(&self) -> SocketAddr;
    /// Accepts with `qp` (same transport as the connector's, on the listener's device, on any
    /// of its contexts, in RESET or INIT), answering `private_data`, and waits (up to the
    /// provider's accept timeout, 30 s) for the connector to confirm; the QP ends in RTS. A QP
    /// of another device is [`Error::WrongDevice`].
    fn accept(self, qp: &mut P::Qp, attr: &QpAttr, private_data: &[u8]) -> Result<P::Connection>
    where
        Self: Sized,
    {
        let deadline = Instant::now() + ACCEPT_WAIT;
        let mut a = self.accept_start(qp, attr, private_data)?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match a.poll(qp, left)? {
                Progress::Ready(c) => return Ok(c),
                Progress::Pending(p) if !left.is_zero() => a = p,
                Progress::Pending(p) => return Err(p.abandon(qp)),
            }
        }
    }
    /// Accepts as [`ConnRequest::accept`] does, without waiting for the connector's
    /// confirmation: the [`Accepting`] returned finishes it (or gives up), so that one slow or
    /// half-open connector delays no other.
    fn accept_start(
        self,
        qp: &mut P::Qp,
        attr: &QpAttr,
        private_data: &[u8],
    ) -> Result<P::Accepting>;
    /// Rejects, answering `private_data`.
    fn reject(self, private_data: &[u8]) -> Result<()>;
}

/// How long [`ConnRequest::accept`] waits for the connector's confirmation.
pub const ACCEPT_WAIT: Duration = Duration::from_secs(30);

/// An accept sent, waiting for the connector's confirmation (the RTU of the IB connection
/// protocol; on `soft`, the connector's answer).
pub trait Accepting<P: Provider>: Send + Debug + Sized {
    /// Waits up to `timeout` (zero: just looks) for the confirmation: the connection once it
    /// came, else the accept back, still pending. A connector that refused or went away is an
    /// error (its QP `qp`, the one accepted with, is moved to ERR).
    fn poll(self, qp: &mut P::Qp, timeout: Duration) -> Result<Progress<P, P::Accepting>>;
    /// Gives up (the QP `qp` moves to ERR); returns the error to report: a timeout.
    fn abandon(self, qp: &mut P::Qp) -> Error;
    /// What a [`CmWaiter`] watches for the confirmation.
    fn watch(&self) -> Watch;
}

/// A connect in progress (from [`Context::connect_start`]).
pub trait Connecting<P: Provider>: Send + Debug + Sized {
    /// Takes its next steps, waiting up to `timeout` (zero: just looks) for the events they
    /// need: the connection once established (the QP `qp`, the one it connects, in RTS),
    /// else the connect back, still in progress. A rejected, unreachable or timed-out connect
    /// is an error.
    fn poll(self, qp: &mut P::Qp, timeout: Duration) -> Result<Progress<P, P::Connecting>>;
    /// Takes the steps before the answer that need no QP, waiting up to `timeout` (zero: just
    /// looks) for their events, while the QP is elsewhere (lent to a worker that posts its
    /// receives: the peer cannot send before `poll` takes the last step, which needs it). The
    /// QP must come back to `poll` as it was at [`Context::connect_start`]. An error ends the
    /// connect as `poll`'s would; its deadline is `poll`'s to report. On `ibverbs`, a QP in
    /// INIT as the connection manager would set it (a pool's, on RoCE) needs nothing until the
    /// answer: address and route resolution and the connect go on; a provider whose steps all
    /// need the QP (or that has none before the answer, as `soft`) takes none.
    fn advance(self, timeout: Duration) -> Result<Self> {
        let _ = timeout;
        Ok(self)
    }
    /// What a [`CmWaiter`] watches for its next step.
    fn watch(&self) -> Watch;
}

/// What [`Accepting::poll`] or [`Connecting::poll`] found.
#[derive(Debug)]
pub enum Progress<P: Provider, T> {
    /// Done: the connection.
    Ready(P::Connection),
    /// Not yet: the accept or connect, to poll again.
    Pending(T),
}

/// The connection-manager side of an established connection.
pub trait Connection: Send + Debug {
    /// The peer's private data (from its connect or accept).
    fn peer_private_data(&self) -> &[u8];
    /// The next connection event ([`CmEvent::Disconnected`] when the peer disconnects), waiting
    /// up to `timeout`.
    fn poll_event(&mut self, timeout: Duration) -> Result<Option<CmEvent>>;
    /// Disconnects (the local QP moves to ERR and its outstanding requests flush).
    fn disconnect(&mut self) -> Result<()>;
    /// What a [`CmWaiter`] watches for its events.
    fn watch(&self) -> Watch;
}

/// A connection-manager event on an established connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum CmEvent {
    /// The connection is up (reported once, after connect or accept).
    Established,
    /// The peer (or this side) disconnected.
    Disconnected,
    /// The device was removed.
    DeviceRemoval,
}
