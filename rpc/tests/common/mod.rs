//! What the RPC tests share, generic over the provider: where an engine listens and its core
//! map (a [`Site`]), an engine whose one worker runs an endpoint with the standard request
//! types and a scripted service, and the outcomes of its calls.
//!
//! The checks themselves are in the modules below, each a set of generic functions; the
//! `*_soft.rs` files run them on `soft` (the process-wide soft fabric, each test on addresses
//! of its own) and `rpc_ibverbs.rs` on `ibverbs` (one device, each test on ports of its own).

#![allow(dead_code)]

pub mod at_most_once;
pub mod balance;
pub mod calls;
pub mod handle;
pub mod large;
pub mod sched;
pub mod typed;

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corelink_config::{parse, StaticTopology, Validated};
use corelink_engine::verbs::Provider;
use corelink_engine::{Engine, Placement};
use corelink_rpc::{
    Endpoint, EndpointConfig, Reject, ReqType, Rpc, RpcError, RpcHandler, RpcMetrics, Service,
    SessionEnd, SessionEvent, SessionId,
};

/// How long a step may take before the test calls it a hang (not a performance bound).
pub const HANG: Duration = Duration::from_secs(30);
/// A deadline no call in these tests reaches unless its server never answers.
pub const LONG: Duration = Duration::from_secs(60);

/// Echoes the request.
pub const ECHO: ReqType = ReqType(1);
/// Answers how many times it ran (a little-endian `u64`).
pub const COUNT: ReqType = ReqType(2);
/// Rejects with code 7.
pub const REJECT: ReqType = ReqType(3);
/// Asks for one byte more than the response may have.
pub const TOO_BIG: ReqType = ReqType(4);

/// A typed type: answers its request plus one.
pub struct AddOne;

impl corelink_rpc::Method for AddOne {
    const TYPE: ReqType = ReqType(5);
    type Request<'a> = u64;
    type Response<'a> = u64;
}

/// A typed type whose request and response borrow: the request's text (and how many of its
/// bytes to answer) is read in place, and the response is a slice of it, decoded in place by
/// the caller.
pub struct Prefix;

impl corelink_rpc::Method for Prefix {
    const TYPE: ReqType = ReqType(6);
    type Request<'a> = (u8, &'a str);
    type Response<'a> = &'a str;
}

/// A call's outcome, as a test reads it: its tag and the response's bytes or the error.
pub type Outcome = (u64, Result<Vec<u8>, RpcError>);

/// Where a check's engine listens, with the core map's lines that come from the provider.
#[derive(Clone, Debug)]
pub struct Site {
    /// The provider's lines: `provider = "soft"`, or for `ibverbs` the provider, device, port
    /// and GID index.
    pub provider: String,
    /// `[worker]` lines the provider wants before the check's own (each ending in a newline).
    pub worker: &'static str,
    /// Top-level lines the provider wants where a check gives none of its own.
    pub top: &'static str,
    /// The address the engine listens on (and its sessions to itself connect to).
    pub listen: SocketAddr,
}

impl Site {
    /// A site on the soft fabric: `ip` with the tests' port.
    pub fn soft(ip: &str) -> Site {
        Site { provider: "provider = \"soft\"".into(), worker: "", top: "", listen: addr(ip) }
    }

    /// A one-worker core map listening here, with `worker` lines in its `[worker]`.
    pub fn map(&self, worker: &str) -> Validated {
        self.map_on("[1]", worker)
    }

    /// The same with two workers (cores 1 and 2).
    pub fn map2(&self, worker: &str) -> Validated {
        self.map_on("[1, 2]", worker)
    }

    /// A one-worker core map with `top` lines before its `[worker]` and `worker` lines in it.
    pub fn map_with(&self, top: &str, worker: &str) -> Validated {
        self.map_full("[1]", top, worker)
    }

    /// The core map with `workers` (the topology is four cores whatever the machine: a worker
    /// on a core the machine lacks runs unpinned, with a warning).
    fn map_on(&self, workers: &str, worker: &str) -> Validated {
        self.map_full(workers, "", worker)
    }

    fn map_full(&self, workers: &str, top: &str, worker: &str) -> Validated {
        let top = if top.is_empty() { self.top } else { top };
        let text = format!(
            "{}\ncontrol_core = 0\nworkers = {workers}\nlisten = \"{}\"\n{top}\n\
             [worker]\nidle_after_us = 1000\n{}{worker}",
            self.provider, self.listen, self.worker
        );
        parse(&text).unwrap().validate(&StaticTopology::uniform(4)).unwrap()
    }
}

/// Registers the standard types on `ep`.
pub fn serve<P: Provider>(ep: &mut Endpoint<P>) {
    ep.register(ECHO, |req, resp| resp.write(req.data).map_err(|_| Reject(1))).unwrap();
    let runs = Rc::new(Cell::new(0u64));
    ep.register(COUNT, move |_, resp| {
        runs.set(runs.get() + 1);
        resp.write(&runs.get().to_le_bytes()).map_err(|_| Reject(1))
    })
    .unwrap();
    ep.register(REJECT, |_, _| Err(Reject(7))).unwrap();
    ep.register(TOO_BIG, |_, resp| {
        let max = resp.max();
        resp.alloc(max + 1).map(|_| ()).map_err(|_| Reject(1))
    })
    .unwrap();
    ep.register_method::<AddOne>(|_, n| n.checked_add(1).ok_or(Reject(2))).unwrap();
    ep.register_method::<Prefix>(|_, (n, text)| text.get(..usize::from(n)).ok_or(Reject(3)))
        .unwrap();
}

/// What the scripted service hears.
pub enum Ev {
    /// The first loop iteration.
    Start,
    /// A session changed.
    Session(SessionId, SessionEvent),
}

/// A service run by a closure, publishing the endpoint's metrics every iteration.
pub struct Driver<F> {
    f: F,
    started: bool,
    metrics: Arc<Mutex<RpcMetrics>>,
}

impl<P: Provider, F: FnMut(&mut Rpc<'_, P>, Ev) + 'static> Service<P> for Driver<F> {
    fn poll(&mut self, rpc: &mut Rpc<'_, P>) {
        if !std::mem::replace(&mut self.started, true) {
            (self.f)(rpc, Ev::Start);
        }
        if let Ok(mut m) = self.metrics.try_lock() {
            m.clone_from(rpc.endpoint().metrics());
        }
    }

    fn on_session(&mut self, rpc: &mut Rpc<'_, P>, session: SessionId, event: SessionEvent) {
        (self.f)(rpc, Ev::Session(session, event));
    }

    /// (Said on stderr, which a failed test shows: why a session ended, unless this side
    /// closed it.)
    fn on_session_end(&mut self, _rpc: &mut Rpc<'_, P>, session: SessionId, end: SessionEnd<'_>) {
        if !matches!(end, SessionEnd::Closed(corelink_engine::CloseReason::Local)) {
            eprintln!("rpc test: {session} ended: {end}");
        }
    }
}

/// A running engine with the standard types on its worker, `script` (made by `make` on the
/// worker) driving its service, and the endpoint's metrics as last published.
pub struct Rig<P: Provider> {
    /// The engine.
    pub engine: Engine<P>,
    /// The endpoint's metrics, as its service last published them.
    pub metrics: Arc<Mutex<RpcMetrics>>,
}

impl<P: Provider> Rig<P> {
    /// Starts it on `map` with `credits` per session.
    pub fn start<F, M>(map: &Validated, credits: u16, make: M) -> Rig<P>
    where
        F: FnMut(&mut Rpc<'_, P>, Ev) + 'static,
        M: Fn() -> F + Send + Sync + 'static,
    {
        Rig::start_with(map, move |cfg| cfg.with_credits(credits), make)
    }

    /// Starts it on `map` with the worker's default endpoint settings as `tune` makes them.
    pub fn start_with<F, M>(
        map: &Validated,
        tune: impl Fn(EndpointConfig) -> EndpointConfig + Send + Sync + 'static,
        make: M,
    ) -> Rig<P>
    where
        F: FnMut(&mut Rpc<'_, P>, Ev) + 'static,
        M: Fn() -> F + Send + Sync + 'static,
    {
        Rig::start_setup(map, tune, |_| {}, make)
    }

    /// As [`Rig::start_with`], with `setup` run on each endpoint once its types are registered.
    pub fn start_setup<F, M>(
        map: &Validated,
        tune: impl Fn(EndpointConfig) -> EndpointConfig + Send + Sync + 'static,
        setup: impl Fn(&mut Endpoint<P>) + Send + Sync + 'static,
        make: M,
    ) -> Rig<P>
    where
        F: FnMut(&mut Rpc<'_, P>, Ev) + 'static,
        M: Fn() -> F + Send + Sync + 'static,
    {
        let res = map.map.worker.clone();
        let metrics = Arc::new(Mutex::new(RpcMetrics::default()));
        let published = metrics.clone();
        let engine = Engine::<P>::start(map, Placement::RoundRobin, move |_| {
            let cfg = tune(EndpointConfig::for_worker(&res));
            let mut ep = Endpoint::new(cfg, &res).unwrap();
            serve(&mut ep);
            setup(&mut ep);
            let driver = Driver { f: make(), started: false, metrics: published.clone() };
            RpcHandler::new(ep, driver)
        })
        .unwrap();
        Rig { engine, metrics }
    }

    /// The endpoint's metrics once `ready` holds of them.
    pub fn metrics_when(&self, ready: impl Fn(&RpcMetrics) -> bool) -> RpcMetrics {
        let deadline = std::time::Instant::now() + HANG;
        loop {
            let m = self.metrics.lock().unwrap().clone();
            if ready(&m) {
                return m;
            }
            assert!(std::time::Instant::now() < deadline, "metrics never got there: {m:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A channel for outcomes.
pub fn outcomes() -> (Sender<Outcome>, Receiver<Outcome>) {
    channel()
}

/// Calls `ty` with `request` on `session`, telling `tx` the outcome under `tag`.
pub fn call<P: Provider>(
    rpc: &mut Rpc<'_, P>,
    session: SessionId,
    ty: ReqType,
    request: &[u8],
    tag: u64,
    tx: &Sender<Outcome>,
) {
    call_within(rpc, session, ty, request, tag, tx, LONG);
}

/// The same with deadline `timeout`.
pub fn call_within<P: Provider>(
    rpc: &mut Rpc<'_, P>,
    session: SessionId,
    ty: ReqType,
    request: &[u8],
    tag: u64,
    tx: &Sender<Outcome>,
    timeout: Duration,
) {
    let tx = tx.clone();
    rpc.call(session, ty, request, timeout, move |_, r| {
        let _ = tx.send((tag, r.map(<[u8]>::to_vec)));
    })
    .unwrap();
}

/// The next `n` outcomes, in the order they came.
pub fn take(rx: &Receiver<Outcome>, n: usize) -> Vec<Outcome> {
    (0..n).map(|i| rx.recv_timeout(HANG).unwrap_or_else(|e| panic!("outcome {i}: {e}"))).collect()
}

/// A payload of `n` bytes where every byte says where it is.
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// The address `ip` with the soft tests' port.
pub fn addr(ip: &str) -> SocketAddr {
    format!("{ip}:7000").parse().unwrap()
}
