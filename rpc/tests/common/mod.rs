//! What the RPC tests on `soft` share: an engine whose one worker runs an endpoint with the
//! standard request types and a scripted service, and the outcomes of its calls.

#![allow(dead_code)]

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corelink_config::{parse, StaticTopology, Validated};
use corelink_engine::verbs::soft::Soft;
use corelink_engine::{Engine, Placement};
use corelink_rpc::{
    Endpoint, EndpointConfig, Reject, ReqType, Rpc, RpcError, RpcHandler, RpcMetrics, Service,
    SessionEvent, SessionId,
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
    type Request = u64;
    type Response = u64;
}

/// A call's outcome, as a test reads it: its tag and the response's bytes or the error.
pub type Outcome = (u64, Result<Vec<u8>, RpcError>);

/// A one-worker soft core map listening on `listen`, with `worker` lines in its `[worker]`.
pub fn map(listen: &str, worker: &str) -> Validated {
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000\n{worker}"
    );
    parse(&text).unwrap().validate(&StaticTopology::uniform(4)).unwrap()
}

/// The same with two workers (cores 1 and 2).
pub fn map2(listen: &str, worker: &str) -> Validated {
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1, 2]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000\n{worker}"
    );
    parse(&text).unwrap().validate(&StaticTopology::uniform(4)).unwrap()
}

/// Registers the standard types on `ep`.
pub fn serve(ep: &mut Endpoint<Soft>) {
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

impl<F: FnMut(&mut Rpc<'_, Soft>, Ev) + 'static> Service<Soft> for Driver<F> {
    fn poll(&mut self, rpc: &mut Rpc<'_, Soft>) {
        if !std::mem::replace(&mut self.started, true) {
            (self.f)(rpc, Ev::Start);
        }
        if let Ok(mut m) = self.metrics.try_lock() {
            m.clone_from(rpc.endpoint().metrics());
        }
    }

    fn on_session(&mut self, rpc: &mut Rpc<'_, Soft>, session: SessionId, event: SessionEvent) {
        (self.f)(rpc, Ev::Session(session, event));
    }
}

/// A running engine with the standard types on its worker, `script` (made by `make` on the
/// worker) driving its service, and the endpoint's metrics as last published.
pub struct Rig {
    pub engine: Engine<Soft>,
    pub metrics: Arc<Mutex<RpcMetrics>>,
}

impl Rig {
    /// Starts it on `map` with `credits` per session.
    pub fn start<F, M>(map: &Validated, credits: u16, make: M) -> Rig
    where
        F: FnMut(&mut Rpc<'_, Soft>, Ev) + 'static,
        M: Fn() -> F + Send + Sync + 'static,
    {
        Rig::start_with(map, move |cfg| cfg.with_credits(credits), make)
    }

    /// Starts it on `map` with the worker's default endpoint settings as `tune` makes them.
    pub fn start_with<F, M>(
        map: &Validated,
        tune: impl Fn(EndpointConfig) -> EndpointConfig + Send + Sync + 'static,
        make: M,
    ) -> Rig
    where
        F: FnMut(&mut Rpc<'_, Soft>, Ev) + 'static,
        M: Fn() -> F + Send + Sync + 'static,
    {
        let res = map.map.worker.clone();
        let metrics = Arc::new(Mutex::new(RpcMetrics::default()));
        let published = metrics.clone();
        let engine = Engine::<Soft>::start(map, Placement::RoundRobin, move |_| {
            let cfg = tune(EndpointConfig::for_worker(&res));
            let mut ep = Endpoint::new(cfg, &res).unwrap();
            serve(&mut ep);
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
pub fn call(
    rpc: &mut Rpc<'_, Soft>,
    session: SessionId,
    ty: ReqType,
    request: &[u8],
    tag: u64,
    tx: &Sender<Outcome>,
) {
    call_within(rpc, session, ty, request, tag, tx, LONG);
}

/// The same with deadline `timeout`.
pub fn call_within(
    rpc: &mut Rpc<'_, Soft>,
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

/// The address `ip` with the tests' port.
pub fn addr(ip: &str) -> SocketAddr {
    format!("{ip}:7000").parse().unwrap()
}
