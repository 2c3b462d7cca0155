//! Calls from other threads: a [`Handle`] (`Send`, not `Clone`) pushes orders onto an SPSC
//! ring that the worker's [`RpcHandler`](crate::RpcHandler) drains once per loop iteration
//! (its [`Inbox`]); each order carries a one-shot channel the call's continuation answers on.
//! A blocking call parks its thread until the answer wakes it; [`CallFuture`] is a plain
//! `std::future::Future`, woken through whatever `Waker` its runtime gives it.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{Thread, ThreadId};
use std::time::Duration;

use corelink_engine::bench_support::{ring, Consumer, Producer};
use corelink_engine::verbs::Provider;
use futures_channel::oneshot;

use crate::config::HANDLE_BATCH;
use crate::endpoint::{Ask, GroupAsk, Rpc};
use crate::error::{Result, RpcError};
use crate::ids::{GroupId, ReqType, SessionId};

/// What a handle asks of its worker.
/// Where a handle's call goes: a session, or the least loaded member of a group.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target {
    Session(SessionId),
    Group(GroupId),
}

pub(crate) enum Order {
    Call {
        to: Target,
        ty: ReqType,
        request: Vec<u8>,
        timeout: Duration,
        reply: oneshot::Sender<Result<Vec<u8>>>,
    },
    Connect {
        addr: SocketAddr,
        reply: oneshot::Sender<Result<SessionId>>,
    },
    Close {
        session: SessionId,
        reply: oneshot::Sender<Result<()>>,
    },
    Group {
        members: Vec<SessionId>,
        reply: oneshot::Sender<Result<GroupId>>,
    },
    AddMember {
        group: GroupId,
        session: SessionId,
        reply: oneshot::Sender<Result<bool>>,
    },
    RemoveMember {
        group: GroupId,
        session: SessionId,
        reply: oneshot::Sender<Result<bool>>,
    },
}

/// The handle's end of the ring. It sits behind a mutex so that a [`CallFuture`] that found
/// the ring full can push its order later (the worker's end takes no lock).
type Outbox = Arc<Mutex<Producer<Order>>>;

/// A handle and the worker's end of its ring, which holds `capacity` orders (rounded up to a
/// power of two): give the [`Inbox`] to the worker's handler
/// ([`RpcHandler::with_inbox`](crate::RpcHandler::with_inbox)) and the [`Handle`] to the
/// thread that calls.
pub fn handle(capacity: usize) -> (Handle, Inbox) {
    let (tx, rx) = ring(capacity);
    let worker = Arc::new(OnceLock::new());
    let h = Handle { outbox: Arc::new(Mutex::new(tx)), waker: None, worker: worker.clone() };
    (h, Inbox { orders: rx, worker })
}

/// Calls into one worker's endpoint from another thread: a blocking [`Handle::call`] and a
/// runtime-neutral [`Handle::call_async`]. Calls end as the endpoint's do (exactly once, by
/// their deadline at the latest), or with [`RpcError::WorkerGone`] when the worker stopped.
///
/// It is `Send` (move it to the thread that uses it) but not `Clone`: its ring has one
/// producer. Make one handle per calling thread.
///
/// An order waits for the worker's next loop iteration: at once on a worker with connections
/// (it busy-polls); a worker parked between idle iterations (one without connections, or one
/// with them under `worker.park_after_us`) is woken ([`corelink_engine::Cx::waker`]) once its
/// inbox has been polled.
///
/// ```
/// fn is_send<T: Send>() {}
/// is_send::<corelink_rpc::Handle>();
/// ```
///
/// ```compile_fail,E0599
/// fn two(h: corelink_rpc::Handle) {
///     let _ = h.clone();
/// }
/// ```
///
/// # Examples
///
/// A worker serves an echo type; the test's thread connects the worker to itself through the
/// handle and calls, blocking, then with the `Future` (here polled by a minimal executor;
/// `rpc/examples/tokio_handle.rs` runs it under tokio):
///
/// ```
/// use std::sync::mpsc::channel;
/// use std::sync::Mutex;
/// use std::time::Duration;
/// use corelink_engine::verbs::soft::Soft;
/// use corelink_engine::{Engine, Placement};
/// use corelink_rpc::{Endpoint, EndpointConfig, ReqType, RpcHandler, Serve};
///
/// const ECHO: ReqType = ReqType(1);
///
/// let addr: std::net::SocketAddr = "10.98.12.2:7000".parse()?;
/// let map = corelink_config::parse(&format!(
///     "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{addr}\""
/// ))?
/// .validate(&corelink_config::MachineTopology::load()?)?;
/// let res = map.map.worker.clone();
/// let (tx, rx) = channel();
/// let tx = Mutex::new(tx);
/// let engine = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| {
///     let mut endpoint = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
///     endpoint.register(ECHO, |req, resp| {
///         resp.write(req.data).map_err(|_| corelink_rpc::Reject(1))
///     }).unwrap();
///     let (handle, inbox) = corelink_rpc::handle(64);
///     tx.lock().unwrap().send(handle).unwrap();
///     RpcHandler::new(endpoint, Serve).with_inbox(inbox)
/// })?;
/// let mut handle = rx.recv_timeout(Duration::from_secs(30))?;
/// let session = handle.connect(addr)?;
/// let timeout = Duration::from_secs(30);
/// assert_eq!(handle.call(session, ECHO, b"blocking", timeout)?, b"blocking");
/// let future = handle.call_async(session, ECHO, b"async".to_vec(), timeout);
/// assert_eq!(corelink_rpc::block_on(future)?, b"async");
/// drop(handle);
/// engine.shutdown()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Handle {
    outbox: Outbox,
    /// A waker that unparks the thread that last waited (made once per thread).
    waker: Option<(ThreadId, Waker)>,
    /// What wakes the worker after an order (set by its inbox at the worker's first loop
    /// iteration, from `Cx::waker`).
    worker: WorkerWake,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle").finish_non_exhaustive()
    }
}

impl Handle {
    /// Opens a session to the endpoint at `addr` from the worker's endpoint (as
    /// [`Rpc::connect`]); calls on it may be made at once (they wait until it is open).
    pub fn connect(&mut self, addr: SocketAddr) -> Result<SessionId> {
        let (reply, rx) = oneshot::channel();
        self.push_blocking(Order::Connect { addr, reply })?;
        self.wait(rx)
    }

    /// Closes `session` (as [`Rpc::close`]).
    pub fn close(&mut self, session: SessionId) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.push_blocking(Order::Close { session, reply })?;
        self.wait(rx)
    }

    /// Makes a group of the worker's sessions `members` (as [`Rpc::group`]).
    pub fn group(&mut self, members: &[SessionId]) -> Result<GroupId> {
        let (reply, rx) = oneshot::channel();
        self.push_blocking(Order::Group { members: members.to_vec(), reply })?;
        self.wait(rx)
    }

    /// Adds the worker's `session` to `group` (as [`Rpc::add_member`]).
    pub fn add_member(&mut self, group: GroupId, session: SessionId) -> Result<bool> {
        let (reply, rx) = oneshot::channel();
        self.push_blocking(Order::AddMember { group, session, reply })?;
        self.wait(rx)
    }

    /// Takes the worker's `session` out of `group` (as [`Rpc::remove_member`]).
    pub fn remove_member(&mut self, group: GroupId, session: SessionId) -> Result<bool> {
        let (reply, rx) = oneshot::channel();
        self.push_blocking(Order::RemoveMember { group, session, reply })?;
        self.wait(rx)
    }

    /// Calls `ty` on the worker's `group` (on its member with the fewest outstanding calls,
    /// as [`Rpc::call_group`]) and waits for the answer, as [`Handle::call`].
    pub fn call_group(
        &mut self,
        group: GroupId,
        ty: ReqType,
        request: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        self.call_to(Target::Group(group), ty, request.to_vec(), timeout)
    }

    /// The same call on a group as a `Future` (as [`Handle::call_async`]).
    pub fn call_group_async(
        &mut self,
        group: GroupId,
        ty: ReqType,
        request: Vec<u8>,
        timeout: Duration,
    ) -> CallFuture {
        self.call_to_async(Target::Group(group), ty, request, timeout)
    }

    /// Calls `ty` on the worker's `session` with `request` and waits for the answer, which
    /// comes by `timeout` at the latest ([`RpcError::Timeout`]). The request is copied into a
    /// registered buffer on the worker, the response out of the receive buffer.
    ///
    /// The thread parks while it waits (a full ring, which the worker drains once per loop
    /// iteration, is retried after a yield).
    pub fn call(
        &mut self,
        session: SessionId,
        ty: ReqType,
        request: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        self.call_to(Target::Session(session), ty, request.to_vec(), timeout)
    }

    /// The same call as a `Future`, for any async runtime (it needs nothing of one but its
    /// `Waker`); it is `Send`. The order goes to the worker now, or, when the ring is full,
    /// at the future's next poll (it wakes itself to be polled again). Calls from one handle
    /// reach the worker in the order they were made, but for such a retried one.
    pub fn call_async(
        &mut self,
        session: SessionId,
        ty: ReqType,
        request: Vec<u8>,
        timeout: Duration,
    ) -> CallFuture {
        self.call_to_async(Target::Session(session), ty, request, timeout)
    }

    /// A call to `to`, waited for.
    fn call_to(
        &mut self,
        to: Target,
        ty: ReqType,
        request: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        let (reply, rx) = oneshot::channel();
        self.push_blocking(Order::Call { to, ty, request, timeout, reply })?;
        self.wait(rx)
    }

    /// A call to `to`, as a `Future`.
    fn call_to_async(
        &mut self,
        to: Target,
        ty: ReqType,
        request: Vec<u8>,
        timeout: Duration,
    ) -> CallFuture {
        let (reply, rx) = oneshot::channel();
        self.future(Order::Call { to, ty, request, timeout, reply }, rx)
    }

    /// A call's future: its order pushed now, or at the future's first poll if the ring is
    /// full.
    fn future(&mut self, order: Order, rx: oneshot::Receiver<Result<Vec<u8>>>) -> CallFuture {
        let unsent = match push(&self.outbox, &self.worker, order) {
            Ok(()) => None,
            Err(Pushed::Full(order)) => Some((order, self.outbox.clone(), self.worker.clone())),
            Err(Pushed::Gone) => return CallFuture { unsent: None, rx: None },
        };
        CallFuture { unsent, rx: Some(rx) }
    }

    fn push_blocking(&mut self, mut order: Order) -> Result<()> {
        loop {
            match push(&self.outbox, &self.worker, order) {
                Ok(()) => return Ok(()),
                Err(Pushed::Full(o)) => {
                    order = o;
                    std::thread::yield_now();
                }
                Err(Pushed::Gone) => return Err(RpcError::WorkerGone),
            }
        }
    }

    fn wait<T>(&mut self, mut rx: oneshot::Receiver<Result<T>>) -> Result<T> {
        let me = std::thread::current();
        let waker = match &self.waker {
            Some((id, w)) if *id == me.id() => w.clone(),
            _ => {
                let w = Waker::from(Arc::new(Unpark(me.clone())));
                self.waker = Some((me.id(), w.clone()));
                w
            }
        };
        let mut cx = Context::from_waker(&waker);
        loop {
            match Pin::new(&mut rx).poll(&mut cx) {
                Poll::Ready(Ok(outcome)) => return outcome,
                Poll::Ready(Err(oneshot::Canceled)) => return Err(RpcError::WorkerGone),
                Poll::Pending => std::thread::park(),
            }
        }
    }
}

enum Pushed {
    Full(Order),
    Gone,
}

fn lock(outbox: &Outbox) -> MutexGuard<'_, Producer<Order>> {
    // A panic while the lock was held cannot leave the ring's end half-changed (a push is
    // one store after the write), so a poisoned lock is taken as it is.
    outbox.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn push(outbox: &Outbox, worker: &WorkerWake, order: Order) -> Result<(), Pushed> {
    let mut tx = lock(outbox);
    if tx.is_abandoned() {
        return Err(Pushed::Gone);
    }
    tx.push(order).map_err(Pushed::Full)?;
    drop(tx);
    if let Some(w) = worker.get() {
        w.wake();
    }
    Ok(())
}

/// Wakes a thread parked in a blocking call.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// A call from [`Handle::call_async`]: its output is the response's payload (copied out of
/// the receive buffer), or why there is none.
#[must_use = "a future does nothing until polled (its order may not have gone yet)"]
pub struct CallFuture {
    /// The order, when the ring was full as the call was made (with where it goes).
    unsent: Option<(Order, Outbox, WorkerWake)>,
    /// The answer's channel (none: the worker was gone when the call was made).
    rx: Option<oneshot::Receiver<Result<Vec<u8>>>>,
}

impl std::fmt::Debug for CallFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallFuture").field("sent", &self.unsent.is_none()).finish()
    }
}

impl Future for CallFuture {
    type Output = Result<Vec<u8>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some((order, outbox, worker)) = this.unsent.take() {
            match push(&outbox, &worker, order) {
                Ok(()) => {}
                Err(Pushed::Full(order)) => {
                    this.unsent = Some((order, outbox, worker));
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Err(Pushed::Gone) => this.rx = None,
            }
        }
        let Some(rx) = &mut this.rx else { return Poll::Ready(Err(RpcError::WorkerGone)) };
        match Pin::new(rx).poll(cx) {
            Poll::Ready(Ok(outcome)) => Poll::Ready(outcome),
            Poll::Ready(Err(oneshot::Canceled)) => Poll::Ready(Err(RpcError::WorkerGone)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Runs `future` to its end on this thread, parking between polls: the least executor, for
/// a thread with no async runtime (and the crate's examples).
///
/// # Examples
///
/// ```
/// assert_eq!(corelink_rpc::block_on(async { 7 }), 7);
/// ```
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// The worker's end of a [`Handle`]'s ring: given to its handler
/// ([`RpcHandler::with_inbox`](crate::RpcHandler::with_inbox)), which takes up to
/// [`HANDLE_BATCH`] orders off it each loop iteration (no lock: the ring is SPSC).
pub struct Inbox {
    orders: Consumer<Order>,
    worker: WorkerWake,
}

/// The worker's waker, shared by a handle and its inbox.
type WorkerWake = Arc<OnceLock<corelink_engine::verbs::Waker>>;

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").field("queued", &self.orders.len()).finish()
    }
}

impl Inbox {
    /// Carries out up to [`HANDLE_BATCH`] orders: each call is made on the endpoint with a
    /// continuation that answers the handle (a refused one is answered with why at once).
    pub(crate) fn drain<P: Provider>(&mut self, rpc: &mut Rpc<'_, P>) {
        if self.worker.get().is_none() {
            let _ = self.worker.set(rpc.cx.waker());
        }
        if !self.orders.ready() {
            return;
        }
        for _ in 0..HANDLE_BATCH {
            let Some(order) = self.orders.pop() else { return };
            match order {
                Order::Call { to, ty, request, timeout, reply } => {
                    let then = Box::new(move |_: &mut Rpc<'_, P>, out: Result<&[u8]>| {
                        // A handle that stopped waiting dropped its end: nothing to tell.
                        let _ = reply.send(out.map(<[u8]>::to_vec));
                    });
                    let fill = |b: &mut [u8]| b.copy_from_slice(&request);
                    let (ep, cx, len) = (&mut *rpc.ep, &mut *rpc.cx, request.len());
                    let made = match to {
                        Target::Session(session) => {
                            let ask = Ask { session, ty, len, timeout };
                            ep.call_with(cx, ask, fill, then).map(|_| ())
                        }
                        Target::Group(group) => {
                            let ask = GroupAsk { group, ty, len, timeout };
                            ep.call_group_with(cx, ask, fill, then).map(|_| ())
                        }
                    };
                    if let Err((e, then)) = made {
                        then(rpc, Err(e));
                    }
                }
                Order::Group { members, reply } => {
                    let _ = reply.send(rpc.group(&members));
                }
                Order::AddMember { group, session, reply } => {
                    let _ = reply.send(rpc.add_member(group, session));
                }
                Order::RemoveMember { group, session, reply } => {
                    let _ = reply.send(rpc.remove_member(group, session));
                }
                Order::Connect { addr, reply } => {
                    let _ = reply.send(rpc.connect(addr));
                }
                Order::Close { session, reply } => {
                    let _ = reply.send(rpc.close(session));
                }
            }
        }
    }
}
