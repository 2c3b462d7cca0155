//! Service-level scheduling, generic over the provider: identical in-flight calls of a
//! mergeable type execute once and every caller gets the response (counted), other bytes and
//! other types are not merged, a merged call ends with its leader (closed session included);
//! request classes per type reach the engine's scheduler: an urgent call made after a burst of
//! bulk ones on the same session ends first, where without classes it ends last.
//!
//! Run by `sched_soft.rs` and `rpc_ibverbs.rs`.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};

use super::*;
use corelink_config::Validated;
use corelink_engine::verbs::Provider;
use corelink_engine::{Engine, Placement};
use corelink_rpc::{
    Endpoint, EndpointConfig, Rpc, RpcError, RpcHandler, RpcMetrics, Service, SessionEvent,
    SessionId,
};

/// A service that runs `script` once its session to `to` is open (or at once, for a session
/// to nowhere), and publishes the endpoint's metrics every iteration.
struct Script<F> {
    to: std::net::SocketAddr,
    wait_open: bool,
    session: Option<SessionId>,
    script: Option<F>,
    metrics: Arc<Mutex<RpcMetrics>>,
}

impl<P: Provider, F: FnOnce(&mut Rpc<'_, P>, SessionId) + 'static> Service<P> for Script<F> {
    fn poll(&mut self, rpc: &mut Rpc<'_, P>) {
        if self.session.is_none() {
            let s = rpc.connect(self.to).unwrap();
            self.session = Some(s);
            if !self.wait_open {
                if let Some(f) = self.script.take() {
                    f(rpc, s);
                }
            }
        }
        if let Ok(mut m) = self.metrics.try_lock() {
            m.clone_from(rpc.endpoint().metrics());
        }
    }

    fn on_session(&mut self, rpc: &mut Rpc<'_, P>, s: SessionId, e: SessionEvent) {
        if e == SessionEvent::Connected && Some(s) == self.session {
            if let Some(f) = self.script.take() {
                f(rpc, s);
            }
        }
    }
}

fn start<P: Provider, F>(
    map: &Validated,
    to: std::net::SocketAddr,
    wait_open: bool,
    setup: impl Fn(&mut Endpoint<P>) + Send + Sync + 'static,
    script: impl Fn() -> F + Send + Sync + 'static,
) -> (Engine<P>, Arc<Mutex<RpcMetrics>>)
where
    F: FnOnce(&mut Rpc<'_, P>, SessionId) + 'static,
{
    let res = map.map.worker.clone();
    let metrics = Arc::new(Mutex::new(RpcMetrics::default()));
    let m2 = metrics.clone();
    let engine = Engine::<P>::start(map, Placement::RoundRobin, move |_| {
        let mut ep = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
        serve(&mut ep);
        setup(&mut ep);
        let svc =
            Script { to, wait_open, session: None, script: Some(script()), metrics: m2.clone() };
        RpcHandler::new(ep, svc)
    })
    .unwrap();
    (engine, metrics)
}

fn tell<P: Provider>(
    tx: &Sender<Outcome>,
    tag: u64,
) -> impl FnOnce(&mut Rpc<'_, P>, Result<&[u8], RpcError>) {
    let tx = tx.clone();
    move |_, r| {
        let _ = tx.send((tag, r.map(<[u8]>::to_vec)));
    }
}

fn metrics_when(m: &Mutex<RpcMetrics>, ready: impl Fn(&RpcMetrics) -> bool) -> RpcMetrics {
    let deadline = std::time::Instant::now() + HANG;
    loop {
        let got = m.lock().unwrap().clone();
        if ready(&got) {
            return got;
        }
        assert!(std::time::Instant::now() < deadline, "metrics never got there: {got:?}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Identical in-flight calls of a mergeable type execute once and every caller gets the
/// response; other bytes and a type not mergeable are not merged.
pub fn identical_calls_in_flight_execute_once_and_all_get_the_response<P: Provider>(site: &Site) {
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    let (engine, metrics) = start::<P, _>(
        &site.map(""),
        site.listen,
        true,
        |ep| ep.set_mergeable(COUNT, true).unwrap(),
        move || {
            let tx = tx.lock().unwrap().clone();
            move |rpc: &mut Rpc<'_, P>, s| {
                // Ten identical calls, ten with other bytes, interleaved; five identical
                // echoes (not mergeable).
                for i in 0..20u64 {
                    let bytes: &[u8] = if i % 2 == 0 { b"a" } else { b"b" };
                    rpc.call(s, COUNT, bytes, LONG, tell(&tx, i)).unwrap();
                }
                for i in 20..25u64 {
                    rpc.call(s, ECHO, b"same", LONG, tell(&tx, i)).unwrap();
                }
            }
        },
    );
    let mut got = take(&rx, 25);
    got.sort_by_key(|(t, _)| *t);
    let count = |r: &Result<Vec<u8>, RpcError>| {
        u64::from_le_bytes(r.as_ref().unwrap().as_slice().try_into().unwrap())
    };
    let a: Vec<u64> =
        got.iter().filter(|(t, _)| *t < 20 && t % 2 == 0).map(|(_, r)| count(r)).collect();
    let b: Vec<u64> =
        got.iter().filter(|(t, _)| *t < 20 && t % 2 == 1).map(|(_, r)| count(r)).collect();
    assert!(a.iter().all(|&v| v == a[0]) && a.len() == 10, "{a:?}");
    assert!(b.iter().all(|&v| v == b[0]) && b.len() == 10, "{b:?}");
    assert_ne!(a[0], b[0], "other bytes are another request");
    for (t, r) in &got[20..] {
        assert_eq!(r.as_ref().unwrap(), b"same", "echo {t}");
    }
    let m = metrics_when(&metrics, |m| m.responses == 25);
    // COUNT ran twice (once per distinct request), ECHO five times.
    assert_eq!((m.merged, m.handled, m.calls), (18, 7, 25), "{m:?}");
    engine.shutdown().unwrap();
}

/// Merged calls on a session to `nowhere` end, closed, with their leader, each once.
pub fn merged_calls_end_with_their_leader_when_the_session_closes<P: Provider>(
    site: &Site,
    nowhere: std::net::SocketAddr,
) {
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    let (engine, metrics) = start::<P, _>(
        &site.map(""),
        nowhere,
        false,
        |ep| ep.set_mergeable(ECHO, true).unwrap(),
        move || {
            let tx = tx.lock().unwrap().clone();
            move |rpc: &mut Rpc<'_, P>, s| {
                for i in 0..5u64 {
                    rpc.call(s, ECHO, b"x", LONG, tell(&tx, i)).unwrap();
                }
            }
        },
    );
    for (t, r) in take(&rx, 5) {
        assert!(matches!(r, Err(RpcError::SessionClosed)), "call {t}: {r:?}");
    }
    let m = metrics_when(&metrics, |m| m.errors == 5);
    assert_eq!(m.merged, 4, "{m:?}");
    assert!(rx.recv_timeout(std::time::Duration::from_millis(50)).is_err(), "each ends once");
    engine.shutdown().unwrap();
}

/// The order in which 20 bulk echoes and then one urgent COUNT call, made in one loop
/// iteration on one session, end: the urgent call's place (0: first).
fn urgent_place<P: Provider>(site: &Site, classes: bool) -> usize {
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    let (engine, _) = start::<P, _>(
        &site.map(""),
        site.listen,
        true,
        move |ep| {
            if classes {
                ep.set_class(ECHO, Some(3)).unwrap();
                ep.set_class(COUNT, Some(0)).unwrap();
            }
        },
        move || {
            let tx = tx.lock().unwrap().clone();
            move |rpc: &mut Rpc<'_, P>, s| {
                for i in 0..20u64 {
                    rpc.call(s, ECHO, &[7; 64], LONG, tell(&tx, i)).unwrap();
                }
                rpc.call(s, COUNT, b"", LONG, tell(&tx, 99)).unwrap();
            }
        },
    );
    let got = take(&rx, 21);
    engine.shutdown().unwrap();
    assert!(got.iter().all(|(_, r)| r.is_ok()), "{got:?}");
    got.iter().position(|(t, _)| *t == 99).unwrap()
}

/// Request classes per type reach the engine's scheduler: the urgent call ends last without
/// classes (on `plain`), first with them (on `classed`).
pub fn request_classes_reach_the_engines_scheduler<P: Provider>(plain: &Site, classed: &Site) {
    assert_eq!(urgent_place::<P>(plain, false), 20, "one class: the order of the calls");
    assert_eq!(urgent_place::<P>(classed, true), 0, "class 0 before class 3");
}
