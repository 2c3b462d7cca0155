//! `rpc_lat` and `rpc_bw`: `send_lat` and `send_bw` through corelink-rpc, on the same core
//! map, pools and receives (less the RPC header's room), so that the two compare.
//!
//! Each worker runs an [`RpcHandler`]: its endpoint serves [`ECHO`] (answers the request's
//! bytes, for `rpc_lat`) and [`SINK`] (answers an empty response, for `rpc_bw`), and its
//! service is the client part, which opens one session to the server and runs the test:
//! - `rpc_lat`: one untimed call, then one call at a time; a sample is the time-stamp counter from just before the
//!   call to its continuation, halved (one-way, as `send_lat` reports its ping-pong);
//! - `rpc_bw`: a window of calls in flight (`PerfOpts::window`, as `send_bw`'s: at most the
//!   32 receives per connection, which are also the session's credits); each continuation
//!   makes the next call; an untimed window first. The message rate counts calls.
//!
//! The continuations capture nothing (their state is the worker thread's, in a
//! thread-local), so a call allocates nothing on the worker, as on the RPC layer's hot path.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corelink_engine::verbs::Provider;
use corelink_rpc::{
    Endpoint, EndpointConfig, Reject, ReqType, Rpc, RpcError, RpcHandler, Service, SessionEvent,
    SessionId,
};

use super::{Event, Shared, SizeResult};
use crate::perf::clock::{Clock, Peak};
use crate::perf::opts::{PerfOpts, Test};
use crate::perf::phase;

/// `rpc_lat`'s type: the response is the request's bytes.
pub const ECHO: ReqType = ReqType(1);
/// `rpc_bw`'s type: the response is empty.
pub const SINK: ReqType = ReqType(2);
/// A client's first call on each session, untimed: how many sessions its run opens (`-T`, a
/// little-endian `u16`), so that a server process knows how many to wait for.
pub const HELLO: ReqType = ReqType(3);

/// Sessions the clients of this (server) process said their runs open (1 until one says).
static SESSIONS: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(1);

/// A deadline no call of a healthy run reaches.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The endpoint settings of every worker: the defaults, packing off with `--no-pack`.
fn config(res: &corelink_config::WorkerResources, opts: &PerfOpts) -> EndpointConfig {
    let cfg = EndpointConfig::for_worker(res);
    if opts.no_pack {
        cfg.with_pack(0)
    } else {
        cfg
    }
}

/// Checks the endpoint settings every worker will use (before the engine starts).
pub(super) fn check(
    res: &corelink_config::WorkerResources,
    opts: &PerfOpts,
) -> Result<(), RpcError> {
    config(res, opts).check(res)
}

/// A worker's handler for the RPC tests: the endpoint with both types, and the client part
/// when this process connects.
pub(super) fn handler<P: Provider>(
    res: &corelink_config::WorkerResources,
    shared: Shared,
    opts: Arc<PerfOpts>,
    connect: bool,
) -> RpcHandler<P, Bench> {
    // `check` ran on these settings before the engine started (`run_on`).
    let mut ep = Endpoint::new(config(res, &opts), res)
        .expect("the endpoint's settings were checked before the engine started");
    let registered = ep
        .register(ECHO, |req, resp| resp.write(req.data).map_err(|_| Reject(1)))
        .and_then(|()| ep.register(SINK, |_, _| Ok(())))
        .and_then(|()| {
            ep.register(HELLO, |req, _| {
                let n: [u8; 2] = req.data.try_into().map_err(|_| Reject(1))?;
                SESSIONS.store(u16::from_le_bytes(n).max(1), std::sync::atomic::Ordering::Relaxed);
                Ok(())
            })
        });
    if let Err(e) = registered {
        shared.tell(Event::ClientDone(Err(format!("registering the RPC types: {e}"))));
    }
    let payload = payload_of(opts.max_size());
    STATE.with(|s| *s.borrow_mut() = connect.then(|| State::new(shared.clone(), opts, payload)));
    RpcHandler::new(ep, Bench { shared, asked: !connect })
}

/// The service: opens the client's session, starts the test once it is open, and tells the
/// main thread when a session closes.
#[derive(Debug)]
pub(super) struct Bench {
    shared: Shared,
    /// The session was asked for (or this worker only serves).
    asked: bool,
}

thread_local! {
    /// The client part's state on this worker (none: it only serves).
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

/// The requests' bytes (0x5a), as many as the largest size asked for so far (each worker's
/// state keeps the slice).
static PAYLOAD: std::sync::RwLock<&'static [u8]> = std::sync::RwLock::new(&[]);

/// The requests' bytes, at least `len` of them (made once per larger size and kept: a run's
/// sizes are few).
fn payload_of(len: usize) -> &'static [u8] {
    let have = *PAYLOAD.read().unwrap_or_else(|e| e.into_inner());
    if have.len() >= len {
        return have;
    }
    let mut w = PAYLOAD.write().unwrap_or_else(|e| e.into_inner());
    if w.len() < len {
        *w = Vec::leak(vec![0x5a; len]);
    }
    *w
}

#[derive(Debug)]
struct State {
    shared: Shared,
    opts: Arc<PerfOpts>,
    /// The requests' bytes, as many as the largest size ([`payload_of`]).
    payload: &'static [u8],
    session: Option<SessionId>,
    /// The size being measured (index into `opts.sizes`), and its bytes.
    index: usize,
    size: usize,
    posted: u64,
    completed: u64,
    /// Calls of the untimed window still out (bandwidth).
    warming: u64,
    started: Instant,
    deadline: Option<Instant>,
    /// The loop clock the peak rate was last sampled at.
    last_now: Instant,
    /// A bandwidth test's peak rate.
    peak: Peak,
    t0: u64,
    clock: Clock,
    /// Round trips in ticks of `clock` (nanoseconds once the size ends, as `send_lat`'s).
    samples: Vec<u64>,
    finished: bool,
    error: Option<String>,
    /// A size's timed part started (before it, a closed session is opened again).
    timed: bool,
    /// Sessions opened again so far.
    reconnects: u32,
}

/// Times the client opens its session again when it closes before the first timed call: an
/// initiator may send before its peer's end has posted receives (the engine's RNR retries
/// cover about 61 ms, which a run under valgrind can exceed); the untimed first calls find
/// out, and the run starts over on a new session.
const RECONNECTS: u32 = 3;

/// What to do after a call ended (decided with the state borrowed, done without).
enum Next {
    Nothing,
    /// Make this many calls of the current size.
    Call(u64),
    /// The run is over: close the session.
    Close(SessionId),
}

impl State {
    fn new(shared: Shared, opts: Arc<PerfOpts>, payload: &'static [u8]) -> State {
        let now = Instant::now();
        State {
            shared,
            opts,
            payload,
            session: None,
            index: 0,
            size: 0,
            posted: 0,
            completed: 0,
            warming: 0,
            started: now,
            deadline: None,
            last_now: now,
            peak: Peak::new(Clock::new(), 0),
            t0: 0,
            clock: Clock::new(),
            samples: Vec::new(),
            finished: false,
            error: None,
            timed: false,
            reconnects: 0,
        }
    }

    fn lat(&self) -> bool {
        self.opts.test == Test::RpcLat
    }

    fn ty(&self) -> ReqType {
        if self.lat() {
            ECHO
        } else {
            SINK
        }
    }

    /// The next call's session, type and request bytes, counted as made (its start stamped,
    /// for a latency run); none without a session.
    fn next_call(&mut self) -> Option<(SessionId, ReqType, &'static [u8])> {
        let session = self.session?;
        self.posted += 1;
        if self.lat() {
            self.t0 = self.clock.ticks();
        }
        Some((session, self.ty(), &self.payload[..self.size]))
    }

    fn more(&self, now: Instant) -> bool {
        match self.deadline {
            Some(d) => now < d,
            None => self.posted < self.opts.iters,
        }
    }

    /// Starts size `index` with an untimed window (one call for a latency test): it touches
    /// the buffers, and the first size's also waits for the server's end of the session.
    /// Returns the calls to make.
    fn start_size(&mut self) -> u64 {
        self.size = self.opts.sizes[self.index];
        self.warming = self.opts.window(self.size) as u64;
        self.warming
    }

    /// Starts the timed part of the size; returns the calls to make.
    fn measure(&mut self, now: Instant) -> u64 {
        self.timed = true;
        phase::timed_phase_begin(self.size);
        self.posted = 0;
        self.completed = 0;
        self.samples.clear();
        if self.lat() {
            let want = if self.opts.duration.is_some() { 1 << 20 } else { self.opts.iters };
            self.samples.reserve(want.min(1 << 24) as usize);
        }
        self.started = now;
        self.peak = Peak::new(self.clock, self.clock.ticks());
        self.deadline = self.opts.duration.map(|d| now + d);
        if self.lat() {
            1
        } else {
            (self.opts.window(self.size) as u64).min(self.opts.iters.max(1))
        }
    }

    /// A call ended with `ok` (or why not, and whether its session closed); `now` is the
    /// worker loop's clock.
    fn ended(&mut self, ok: Result<(), (String, bool)>, now: Instant) -> Next {
        if self.finished || self.error.is_some() {
            return Next::Nothing;
        }
        match ok {
            // The session's close follows: it is opened again (`Bench::on_session`).
            Err((_, true)) if self.may_reconnect() => return Next::Nothing,
            Err((e, _)) => return self.fail(e),
            Ok(()) => {}
        }
        if self.warming > 0 {
            self.warming -= 1;
            return match self.warming {
                0 if self.lat() => Next::Call(self.measure(Instant::now())),
                0 => Next::Call(self.measure(now)),
                _ => Next::Nothing,
            };
        }
        self.completed += 1;
        if self.lat() {
            let end = self.clock.ticks();
            self.samples.push(end.wrapping_sub(self.t0));
        } else if now != self.last_now {
            // The peak rate, sampled once per loop iteration (the calls ended in one share
            // its clock), as send_bw's client samples it.
            self.last_now = now;
            self.peak.sample(self.clock.ticks(), self.completed);
        }
        if self.more(now) {
            return Next::Call(1);
        }
        if self.completed < self.posted {
            return Next::Nothing; // the window drains
        }
        self.finish_size(now)
    }

    fn finish_size(&mut self, now: Instant) -> Next {
        phase::timed_phase_end(self.size);
        let end = if self.lat() { Instant::now() } else { now };
        let mut samples = std::mem::take(&mut self.samples);
        self.clock.to_ns(&mut samples);
        self.shared.tell(Event::Size(SizeResult {
            index: self.index,
            bytes: self.size,
            iterations: self.completed,
            elapsed: end.duration_since(self.started),
            peak_rate: self.peak.rate(),
            samples,
        }));
        self.index += 1;
        if self.index < self.opts.sizes.len() {
            return Next::Call(self.start_size());
        }
        self.finished = true;
        self.session.map_or(Next::Nothing, Next::Close)
    }

    fn may_reconnect(&self) -> bool {
        !self.timed && self.reconnects < RECONNECTS
    }

    /// The session closed before the first timed call: the run starts over on a new one.
    fn reconnect(&mut self) {
        self.reconnects += 1;
        self.session = None;
        self.index = 0;
        self.warming = 0;
        self.posted = 0;
    }

    fn fail(&mut self, e: String) -> Next {
        self.error.get_or_insert(e);
        self.session.map_or(Next::Nothing, Next::Close)
    }
}

/// A call's continuation: counts it and makes the next (it captures nothing).
fn ended<P: Provider>(rpc: &mut Rpc<'_, P>, out: Result<&[u8], RpcError>) {
    let step = STATE.with(|s| {
        let mut s = s.borrow_mut();
        let Some(st) = s.as_mut() else { return Err(Next::Nothing) };
        // A latency run of a count of calls reads no clock per call (as send_lat does not):
        // its samples are the time-stamp counter's.
        let now = if st.lat() && st.deadline.is_none() { st.started } else { rpc.cx().now() };
        let ok = match out {
            Ok(r) if st.lat() && r.len() != st.size => {
                Err((format!("an echo of {} B for a call of {} B", r.len(), st.size), false))
            }
            Ok(_) => Ok(()),
            Err(e) => {
                let closed = matches!(e, RpcError::SessionClosed);
                Err((format!("{} of {} B: {e}", st.opts.test.name(), st.size), closed))
            }
        };
        // (the next call, most often, taken in the same look at the state)
        match st.ended(ok, now) {
            Next::Call(1) => st.next_call().ok_or(Next::Nothing),
            next => Err(next),
        }
    });
    match step {
        Ok(call) => make(rpc, call),
        Err(next) => act(rpc, next),
    }
}

fn act<P: Provider>(rpc: &mut Rpc<'_, P>, next: Next) {
    match next {
        Next::Nothing => {}
        Next::Call(n) => (0..n).for_each(|_| call(rpc)),
        Next::Close(s) => {
            let _ = rpc.close(s);
        }
    }
}

/// Makes one call of the current size.
fn call<P: Provider>(rpc: &mut Rpc<'_, P>) {
    if let Some(c) = STATE.with(|s| s.borrow_mut().as_mut()?.next_call()) {
        make(rpc, c);
    }
}

/// Makes call `c` (its session, type and request bytes).
fn make<P: Provider>(rpc: &mut Rpc<'_, P>, c: (SessionId, ReqType, &'static [u8])) {
    let (session, ty, bytes) = c;
    let made = rpc.call(session, ty, bytes, CALL_TIMEOUT, ended::<P>).map(|_| ());
    if let Err(e) = made {
        let next = STATE.with(|s| match s.borrow_mut().as_mut() {
            Some(st) => st.fail(format!("a call of {} B: {e}", bytes.len())),
            None => Next::Nothing,
        });
        act(rpc, next);
    }
}

impl<P: Provider> Service<P> for Bench {
    fn poll(&mut self, rpc: &mut Rpc<'_, P>) {
        if self.asked {
            return;
        }
        let Some(&addr) = self.shared.target.get() else { return };
        self.asked = true;
        match rpc.connect(addr) {
            Ok(s) => STATE.with(|st| {
                if let Some(st) = st.borrow_mut().as_mut() {
                    st.session = Some(s);
                }
            }),
            Err(e) => self.shared.tell(Event::ClientDone(Err(format!("connect to {addr}: {e}")))),
        }
    }

    fn on_session(&mut self, rpc: &mut Rpc<'_, P>, session: SessionId, event: SessionEvent) {
        let mine = STATE.with(|s| s.borrow().as_ref().and_then(|st| st.session) == Some(session));
        match (event, mine) {
            (SessionEvent::Connected, true) => {
                // The hello first (untimed; it may allocate), then the size's calls.
                let sessions = STATE.with(|s| s.borrow().as_ref().map_or(1, |st| st.opts.workers));
                let hello = (sessions.min(usize::from(u16::MAX)) as u16).to_le_bytes();
                let made = rpc.call(session, HELLO, &hello, CALL_TIMEOUT, |rpc, r| {
                    let next = STATE.with(|s| match (s.borrow_mut().as_mut(), r) {
                        (Some(st), Ok(_)) => Next::Call(st.start_size()),
                        (Some(st), Err(e)) => st.fail(format!("the hello call: {e}")),
                        (None, _) => Next::Nothing,
                    });
                    act(rpc, next);
                });
                if let Err(e) = made {
                    let next = STATE.with(|s| match s.borrow_mut().as_mut() {
                        Some(st) => st.fail(format!("the hello call: {e}")),
                        None => Next::Nothing,
                    });
                    act(rpc, next);
                }
            }
            (SessionEvent::Closed, true) => {
                let again = STATE.with(|s| match s.borrow_mut().as_mut() {
                    Some(st) if st.error.is_none() && !st.finished && st.may_reconnect() => {
                        st.reconnect();
                        true
                    }
                    _ => false,
                });
                if again {
                    self.asked = false; // `poll` connects again
                    return;
                }
                let m = rpc.endpoint().metrics().clone();
                let r = STATE.with(|s| match s.borrow_mut().as_mut() {
                    Some(st) => match (st.error.take(), st.finished) {
                        (Some(e), _) => Err(format!("{e} (the endpoint counted {m:?})")),
                        (None, true) => Ok(()),
                        (None, false) => Err(format!(
                            "the session closed during size {}",
                            st.opts.sizes.get(st.index).copied().unwrap_or(0)
                        )),
                    },
                    None => Ok(()),
                });
                self.shared.tell(Event::ClientDone(r));
            }
            // A server's session: its client's run is over when it closes (a server process
            // waits for as many as its clients' hellos said their runs open).
            (SessionEvent::Closed, false) => {
                let n = SESSIONS.load(std::sync::atomic::Ordering::Relaxed);
                self.shared.tell(Event::ServerDone(Ok(n)))
            }
            _ => {}
        }
    }
}
