//! A handle for threads outside the engine. A client does what a handler does, from its own
//! thread: it connects, submits the same [`Op`]s (with vectors for buffers), receives the
//! messages of the connections it opened, and closes them. Requests go to one worker over an
//! SPSC ring and [`Event`]s come back over another; a full submission ring hands the request
//! back, and no event is ever dropped (one the ring cannot take waits on the worker, in order).
//! A connect goes to the control core directly, which tells the client of its new connection
//! itself as it hands the connection to the worker: the application hears of it without
//! waiting for the worker to wake, every event of the connection comes after, and a request
//! made on it at once waits in the worker for the handover.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;

use crate::error::{EngineError, Result};
use crate::request::{CloseReason, ConnId, ConnInfo, Done, Op};
use crate::ring::{Consumer, Producer};
use crate::tunables::{CLASSES, CLIENT_WAIT_SLICE, MAX_PRIVATE_DATA};

/// What a client hears from its worker.
#[derive(Debug)]
pub enum Event {
    /// A connect of this client finished: the connection is this client's (its messages and
    /// its close come here, not to the worker's handler).
    Connected {
        /// The connection.
        conn: ConnId,
        /// What the worker knows of it (`info.token` is the connect's token).
        info: ConnInfo,
    },
    /// A connect of this client failed.
    ConnectFailed {
        /// The connect's token.
        token: u64,
        /// Why.
        error: EngineError,
    },
    /// A message arrived on one of this client's connections (a send, or a write with
    /// immediate's notice), copied out of the receive buffer.
    Message {
        /// The connection.
        conn: ConnId,
        /// The payload of a send (empty for a write with immediate).
        data: Vec<u8>,
        /// The immediate, if one came.
        imm: Option<u32>,
        /// Bytes the peer wrote, for a write with immediate.
        written: Option<u32>,
    },
    /// A request of this client ended (on the device, or flushed by a close).
    Done(Done<Vec<u8>>),
    /// A request of this client was refused before it reached the device: it comes back whole.
    Refused {
        /// The connection it named.
        conn: ConnId,
        /// Its token.
        token: u64,
        /// The request.
        op: Op<Vec<u8>>,
        /// Why.
        error: EngineError,
    },
    /// A close this client asked for could not start (the connection is gone or closing).
    CloseFailed {
        /// The connection.
        conn: ConnId,
        /// Why.
        error: EngineError,
    },
    /// One of this client's connections closed; nothing more comes for it.
    Closed {
        /// The connection.
        conn: ConnId,
        /// Why.
        reason: CloseReason,
    },
    /// A connect under a reconnect policy ([`Client::connect_with`]) is tried again: after a
    /// close of its connection ([`Event::Closed`] came just before) or a failed try. Once the
    /// policy's tries are spent, [`Event::ConnectFailed`] ends it; a new connection comes as
    /// [`Event::Connected`] with the token.
    Redial {
        /// The connect's token.
        token: u64,
        /// This try's number, from 1 after each close.
        attempt: u32,
        /// How long until it goes.
        after: std::time::Duration,
        /// The last try's error (`None`: the connection closed).
        failed: Option<EngineError>,
    },
}

/// What travels on a client's submission ring.
#[derive(Debug)]
pub(crate) enum ClientRequest {
    Submit {
        conn: ConnId,
        op: Op<Vec<u8>>,
        token: u64,
        class: Option<u8>,
    },
    Close {
        conn: ConnId,
    },
    /// A connect under a reconnect policy (the worker keeps the policy).
    Dial {
        addr: SocketAddr,
        private_data: ArrayVec<u8, MAX_PRIVATE_DATA>,
        token: u64,
        policy: crate::Reconnect,
    },
    StopDial {
        token: u64,
    },
    /// A vector given back for the worker to copy a later message into.
    Spare(Vec<u8>),
}

impl ClientRequest {
    /// The connection it names, if any.
    pub(crate) fn conn(&self) -> Option<ConnId> {
        match self {
            ClientRequest::Submit { conn, .. } | ClientRequest::Close { conn } => Some(*conn),
            _ => None,
        }
    }
}

/// A client's connect, sent straight to the control core. Its connection is told to the client
/// by the control core itself, through `waiter` ([`Waiter::tell`]), as it hands the connection
/// to the client's worker (no wait for the worker to take it); a failure comes through the
/// worker.
#[derive(Debug)]
pub(crate) struct ConnectOrder {
    pub(crate) worker: usize,
    /// The client's number on its worker.
    pub(crate) client: u16,
    pub(crate) addr: SocketAddr,
    pub(crate) private_data: ArrayVec<u8, MAX_PRIVATE_DATA>,
    pub(crate) token: u64,
    pub(crate) waiter: Arc<Waiter>,
}

/// A connect's private data as it travels (refused beyond [`crate::MAX_APP_PRIVATE_DATA`]).
fn connect_data(private_data: &[u8]) -> Result<ArrayVec<u8, MAX_PRIVATE_DATA>> {
    let max = crate::control::MAX_APP_PRIVATE_DATA;
    ArrayVec::try_from(private_data)
        .ok()
        .filter(|d: &ArrayVec<u8, MAX_PRIVATE_DATA>| d.len() <= max)
        .ok_or(EngineError::PrivateDataTooLong { len: private_data.len(), max })
}

/// Events that did not fit the ring when the worker stopped, handed over at its exit (read
/// only once the ring is empty and abandoned: they came after everything in it).
pub(crate) type Overflow = Arc<Mutex<VecDeque<Event>>>;

/// How a client waiting in [`Client::wait`] hears that an event came: it arms this before it
/// parks, and the worker unparks it after giving it an event (a worker pays one load per event
/// while nobody waits; a waiting client takes no core from the worker and the device). It
/// also carries the events the control core tells the client itself (its connects' new
/// connections), which the client reads before its ring's.
#[derive(Debug, Default)]
pub(crate) struct Waiter {
    armed: AtomicBool,
    thread: Mutex<Option<std::thread::Thread>>,
    /// Events from the control core, in order.
    told: Mutex<VecDeque<Event>>,
    /// Whether `told` holds any (set and cleared under its lock; read without it first).
    any_told: AtomicBool,
}

impl Waiter {
    /// Wakes the client if it waits (the worker calls it after each event it gives).
    #[inline]
    pub(crate) fn wake(&self) {
        if self.armed.load(Ordering::SeqCst) {
            if let Ok(t) = self.thread.lock() {
                if let Some(t) = &*t {
                    t.unpark();
                }
            }
        }
    }

    /// Gives the client `e` from the control core, which wakes it ([`Waiter::wake`]) once its
    /// pass is done (once for all it told in the pass). The control core tells a connection
    /// before it hands the connection to the worker, so the client has it before any event
    /// the worker gives about it ([`Client::poll`]).
    pub(crate) fn tell(&self, e: Event) {
        if let Ok(mut told) = self.told.lock() {
            told.push_back(e);
            // (SeqCst, as `armed`: either the client's last look sees this, or the wake that
            // follows sees it armed)
            self.any_told.store(true, Ordering::SeqCst);
        }
    }

    /// The oldest event told by the control core, if any (one load when there is none).
    #[inline]
    fn take_told(&self) -> Option<Event> {
        if !self.any_told.load(Ordering::SeqCst) {
            return None;
        }
        let mut told = self.told.lock().ok()?;
        let e = told.pop_front();
        if told.is_empty() {
            self.any_told.store(false, Ordering::Release);
        }
        e
    }
}

/// An external client of one worker (from [`crate::Engine::client`]). It is `Send` (move it
/// to the thread that uses it) but not `Clone`: its rings have one producer and one consumer.
///
/// ```compile_fail,E0599
/// fn two(c: corelink_engine::Client) {
///     let _ = c.clone();
/// }
/// ```
///
/// # Examples
///
/// A client connects an engine to itself, sends a message the handler echoes, hears the echo
/// (the connection is the client's), and closes:
///
/// ```
/// use corelink_engine::verbs::soft::Soft;
/// use corelink_engine::{ConnId, Cx, Engine, Event, Handler, Message, Placement};
/// use std::time::Duration;
///
/// struct Echo;
/// impl Handler<Soft> for Echo {
///     fn on_message(&mut self, cx: &mut Cx<Soft>, conn: ConnId, msg: &Message<'_>) {
///         let mut b = cx.alloc(msg.data.len()).unwrap();
///         b.fill(msg.data).unwrap();
///         cx.send(conn, b, None, 0).map_err(|(_, e)| e).unwrap();
///     }
/// }
///
/// let map = corelink_config::parse(
///     "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"10.98.0.2:0\"",
/// )?;
/// let map = map.validate(&corelink_config::MachineTopology::load()?)?;
/// let mut engine = Engine::<Soft>::start(&map, Placement::RoundRobin, |_| Echo)?;
/// let mut client = engine.client(0)?;
/// client.connect(engine.listen_addr().unwrap(), b"", 1)?;
/// let wait = Duration::from_secs(30);
/// let Some(Event::Connected { conn, .. }) = client.wait(wait) else { panic!("no connection") };
/// client.submit(conn, corelink_engine::Op::Send { buf: b"ping".to_vec(), imm: None }, 2)
///     .map_err(|(_, e)| e)?;
/// let mut echoed = false;
/// while !echoed {
///     match client.wait(wait).expect("an event") {
///         Event::Message { data, .. } => echoed = data == b"ping",
///         Event::Done(d) => assert!(d.status.is_success()),
///         e => panic!("{e:?}"),
///     }
/// }
/// client.close(conn)?;
/// loop {
///     if let Some(Event::Closed { conn: c, .. }) = client.wait(wait) {
///         assert_eq!(c, conn);
///         break;
///     }
/// }
/// engine.shutdown()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Client {
    pub(crate) worker: usize,
    pub(crate) submit: Producer<ClientRequest>,
    pub(crate) events: Consumer<Event>,
    pub(crate) overflow: Overflow,
    pub(crate) thread: std::thread::Thread,
    pub(crate) waiter: Arc<Waiter>,
    /// Its number on its worker (its requests' origin).
    pub(crate) number: u16,
    /// Connects go to the control core directly (no hop through the worker), which `wake`
    /// wakes.
    pub(crate) connects: std::sync::mpsc::Sender<ConnectOrder>,
    pub(crate) wake: corelink_verbs::Waker,
    /// An event from the worker's ring, set aside for one the control core told meanwhile
    /// (which comes first: see [`Client::poll`]).
    pub(crate) held: Option<Event>,
}

impl Client {
    /// The worker it talks to.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// Connects to `addr` with `private_data` (the peer's `ConnInfo::private_data`); the
    /// outcome comes as [`Event::Connected`] or [`Event::ConnectFailed`] with `token`.
    pub fn connect(&mut self, addr: SocketAddr, private_data: &[u8], token: u64) -> Result<()> {
        let data = connect_data(private_data)?;
        let order = ConnectOrder {
            worker: self.worker,
            client: self.number,
            addr,
            private_data: data,
            token,
            waiter: self.waiter.clone(),
        };
        self.connects.send(order).map_err(|_| EngineError::ShuttingDown)?;
        self.wake.wake();
        Ok(())
    }

    /// Queues `op` on `conn` in its kind's default class, as [`crate::Cx::submit`] does; its
    /// outcome comes as [`Event::Done`] (or [`Event::Refused`]) with `token`. A read reads
    /// `buf.len()` bytes. When the submission ring is full the request comes back at once.
    #[allow(clippy::result_large_err)]
    pub fn submit(
        &mut self,
        conn: ConnId,
        op: Op<Vec<u8>>,
        token: u64,
    ) -> std::result::Result<(), (Op<Vec<u8>>, EngineError)> {
        self.submit_request(conn, op, token, None)
    }

    /// Queues `op` in request class `class`, as [`crate::Cx::submit_as`] does.
    #[allow(clippy::result_large_err)]
    pub fn submit_as(
        &mut self,
        conn: ConnId,
        op: Op<Vec<u8>>,
        token: u64,
        class: u8,
    ) -> std::result::Result<(), (Op<Vec<u8>>, EngineError)> {
        if usize::from(class) >= CLASSES {
            return Err((op, EngineError::NoSuchClass { class, classes: CLASSES }));
        }
        self.submit_request(conn, op, token, Some(class))
    }

    #[allow(clippy::result_large_err)]
    fn submit_request(
        &mut self,
        conn: ConnId,
        op: Op<Vec<u8>>,
        token: u64,
        class: Option<u8>,
    ) -> std::result::Result<(), (Op<Vec<u8>>, EngineError)> {
        match self.send(ClientRequest::Submit { conn, op, token, class }) {
            Ok(()) => Ok(()),
            Err((ClientRequest::Submit { op, .. }, e)) => Err((op, e)),
            Err(_) => unreachable!("the ring gives back what it was given: a submission"),
        }
    }

    /// [`Client::connect`] with a reconnect policy, as [`crate::Cx::connect_with`] gives a
    /// handler: when the connection closes for any reason but this client's own
    /// [`Client::close`], or when a try fails, its worker connects again after `policy`'s
    /// backoff, until the tries are spent; each step comes as [`Event::Redial`], each new
    /// connection as [`Event::Connected`] with `token`, the end of the tries as
    /// [`Event::ConnectFailed`] (so does a token already under a policy of this client:
    /// [`EngineError::TokenInUse`]). A policy ends at a local close, at
    /// [`Client::stop_reconnecting`] and at shutdown.
    pub fn connect_with(
        &mut self,
        addr: SocketAddr,
        private_data: &[u8],
        token: u64,
        policy: crate::Reconnect,
    ) -> Result<()> {
        let private_data = connect_data(private_data)?;
        self.send(ClientRequest::Dial { addr, private_data, token, policy }).map_err(|(_, e)| e)
    }

    /// Ends the reconnect policy of this client's connect `token` (its connection, if up,
    /// stays; nothing more is told of the policy), as [`crate::Cx::stop_reconnecting`] does.
    pub fn stop_reconnecting(&mut self, token: u64) -> Result<()> {
        self.send(ClientRequest::StopDial { token }).map_err(|(_, e)| e)
    }

    /// Closes `conn` (one of this client's connections, or any of the worker's): what is in
    /// flight completes or flushes, then [`Event::Closed`] comes (to the connection's owner).
    pub fn close(&mut self, conn: ConnId) -> Result<()> {
        self.send(ClientRequest::Close { conn }).map_err(|(_, e)| e)
    }

    /// Gives back a vector (an [`Event::Message`]'s `data`, once read, or any other) for the
    /// worker to copy a later message of this client's connections into: a client that gives
    /// back what it receives costs its worker no allocation per message once the worker holds
    /// enough vectors of the messages' size. Dropped when the submission ring is full or the
    /// worker already keeps [`crate::tunables::CLIENT_RING`] of them (optional: the worker
    /// allocates a vector for a message when it has none).
    pub fn recycle(&mut self, data: Vec<u8>) {
        let _ = self.send(ClientRequest::Spare(data));
    }

    /// Puts `r` on the submission ring, or gives it back with why: the ring is full, or the
    /// worker is gone (the engine shut down). (Unboxed: a refusal allocates nothing.)
    #[allow(clippy::result_large_err)]
    fn send(&mut self, r: ClientRequest) -> std::result::Result<(), (ClientRequest, EngineError)> {
        if self.submit.is_abandoned() {
            return Err((r, EngineError::ShuttingDown));
        }
        self.submit.push(r).map_err(|r| (r, EngineError::RingFull("client submission")))?;
        // In case the worker parked (idle: `worker.idle_after_us`, `worker.park_after_us`).
        self.thread.unpark();
        Ok(())
    }

    /// The next event, if one is there.
    pub fn poll(&mut self) -> Option<Event> {
        // The control core tells a connection before its worker has it, so an event of the
        // worker about it was given after: one read from the ring is returned after any
        // told meanwhile.
        if let Some(e) = self.waiter.take_told() {
            return Some(e);
        }
        if let Some(e) = self.held.take() {
            return Some(e);
        }
        let e = self.worker_event()?;
        match self.waiter.take_told() {
            Some(told) => {
                self.held = Some(e);
                Some(told)
            }
            None => Some(e),
        }
    }

    /// The next event from the worker (its ring, then, once it stopped, what it handed over).
    fn worker_event(&mut self) -> Option<Event> {
        if let Some(e) = self.events.pop() {
            return Some(e);
        }
        if !self.events.is_abandoned() {
            return None;
        }
        // The worker stopped (its ring end's drop is seen before what it wrote last): first
        // what it pushed last, then what its ring could not take, handed over at its exit.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        if let Some(e) = self.events.pop() {
            return Some(e);
        }
        self.overflow.lock().ok()?.pop_front()
    }

    /// The next event, waiting up to `timeout` for one (parked: the worker wakes this thread
    /// when it gives the client an event).
    pub fn wait(&mut self, timeout: Duration) -> Option<Event> {
        if let Some(e) = self.poll() {
            return Some(e);
        }
        let deadline = Instant::now() + timeout;
        if let Ok(mut t) = self.waiter.thread.lock() {
            *t = Some(std::thread::current());
        }
        let got = loop {
            // Armed before the last look: an event pushed after it finds the flag set.
            self.waiter.armed.store(true, Ordering::SeqCst);
            if let Some(e) = self.poll() {
                break Some(e);
            }
            let now = Instant::now();
            if now > deadline {
                break None;
            }
            // (bounded, so that a wake that cannot come, a worker gone, costs one slice)
            std::thread::park_timeout((deadline - now).min(CLIENT_WAIT_SLICE));
        };
        self.waiter.armed.store(false, Ordering::SeqCst);
        got
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::ring::ring;

    fn client(n: usize) -> (Client, Consumer<ClientRequest>, Producer<Event>) {
        let (submit, worker_end) = ring(n);
        let (worker_events, events) = ring(n);
        let c = Client {
            worker: 0,
            submit,
            events,
            overflow: Overflow::default(),
            thread: std::thread::current(),
            waiter: Arc::default(),
            number: 0,
            connects: std::sync::mpsc::channel().0,
            wake: corelink_verbs::Waker::new(|| {}),
            held: None,
        };
        (c, worker_end, worker_events)
    }

    fn conn() -> ConnId {
        ConnId { worker: 0, slot: 1, generation: 1 }
    }

    #[test]
    fn a_full_submission_ring_hands_the_request_back() {
        let (mut c, _w, _e) = client(2);
        let send = |t: u8| Op::Send { buf: vec![t], imm: None };
        c.submit(conn(), send(1), 1).unwrap();
        c.submit(conn(), send(2), 2).unwrap();
        let (back, e) = c.submit(conn(), send(3), 3).unwrap_err();
        assert!(matches!(back, Op::Send { buf, .. } if buf == [3]));
        assert!(matches!(e, EngineError::RingFull(_)));
        assert!(c.connect("10.0.0.1:1".parse().unwrap(), b"", 4).is_err());
        assert!(c.poll().is_none());
    }

    #[test]
    fn too_much_private_data_is_refused_before_the_ring() {
        let (mut c, mut w, _e) = client(4);
        let long = vec![0; crate::control::MAX_APP_PRIVATE_DATA + 1];
        let e = c.connect("10.0.0.1:1".parse().unwrap(), &long, 1).unwrap_err();
        assert!(matches!(e, EngineError::PrivateDataTooLong { .. }), "{e}");
        assert!(w.pop().is_none());
        assert!(matches!(
            c.submit_as(
                conn(),
                Op::FetchAdd { remote: Default::default(), add: 1 },
                2,
                CLASSES as u8
            ),
            Err((_, EngineError::NoSuchClass { .. }))
        ));
    }

    #[test]
    fn events_the_ring_could_not_take_come_after_it_once_the_worker_is_gone() {
        let (mut c, _w, mut e) = client(2);
        let closed = |slot| Event::Closed {
            conn: ConnId { worker: 0, slot, generation: 1 },
            reason: CloseReason::Local,
        };
        e.push(closed(1)).unwrap();
        c.overflow.lock().unwrap().push_back(closed(2));
        assert!(matches!(c.poll(), Some(Event::Closed { conn, .. }) if conn.slot == 1));
        assert!(c.poll().is_none(), "the worker still runs: its backlog is not handed over");
        drop(e);
        assert!(matches!(c.poll(), Some(Event::Closed { conn, .. }) if conn.slot == 2));
        assert!(c.poll().is_none());
    }

    #[test]
    fn a_connection_the_control_core_told_comes_before_the_workers_events() {
        let (mut c, _w, mut e) = client(4);
        let connected = |slot| Event::Connected {
            conn: ConnId { worker: 0, slot, generation: 1 },
            info: ConnInfo {
                private_data: Vec::new(),
                peer_recv_size: None,
                initiated: true,
                token: 7,
                lanes: 1,
                recvs_per_lane: 1,
            },
        };
        let message = |slot| Event::Message {
            conn: ConnId { worker: 0, slot, generation: 1 },
            data: vec![1],
            imm: None,
            written: None,
        };
        // Told first, then the worker's message: in that order.
        c.waiter.tell(connected(1));
        e.push(message(1)).unwrap();
        assert!(matches!(c.poll(), Some(Event::Connected { conn, .. }) if conn.slot == 1));
        assert!(matches!(c.poll(), Some(Event::Message { conn, .. }) if conn.slot == 1));
        // A message read from the ring while a connection was being told waits for it: the
        // told one comes first, then the message, then nothing.
        e.push(message(2)).unwrap();
        let from_ring = c.worker_event().unwrap();
        c.waiter.tell(connected(2));
        c.held = Some(from_ring);
        assert!(matches!(c.poll(), Some(Event::Connected { conn, .. }) if conn.slot == 2));
        assert!(matches!(c.poll(), Some(Event::Message { conn, .. }) if conn.slot == 2));
        e.push(message(3)).unwrap();
        c.waiter.tell(connected(3));
        assert!(matches!(c.poll(), Some(Event::Connected { conn, .. }) if conn.slot == 3));
        assert!(matches!(c.poll(), Some(Event::Message { conn, .. }) if conn.slot == 3));
        assert!(c.poll().is_none());
        assert!(!c.waiter.any_told.load(Ordering::Acquire));
    }
}
