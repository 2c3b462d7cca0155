//! The RPC layer's contract across a server restart, on `soft` (issue 15, item 3): a client
//! keeps calls in flight to a server whose host dies without a word (`faults::cut`, then the
//! engine goes) and which comes back as a new engine on the same address. Every call ends
//! exactly once: a response, or `SessionClosed` for the calls in flight or waiting when the
//! wire died (their outcome unknown to the client; the layer never sends a call again on
//! another session). No request runs twice across the two incarnations, counted by a service
//! that records executions per request id outside both. The client's new session then has
//! every call answered.

mod common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{outcomes, take, Outcome, Site, LONG};
use corelink_engine::verbs::soft::faults;
use corelink_engine::verbs::soft::Soft;
use corelink_engine::{Engine, Placement};
use corelink_rpc::{
    Endpoint, EndpointConfig, Reject, ReqType, Rpc, RpcError, RpcHandler, Serve, Service,
    SessionEnd, SessionEvent, SessionId,
};

/// Records that it ran for the request id in its request (a little-endian `u64`), and echoes.
const EXEC: ReqType = ReqType(40);
/// Calls per incarnation of the server.
const N: u64 = 300;
/// The call of round 1 whose answer cuts the wire.
const CUT_AT: u64 = 59;

type Runs = Arc<Mutex<HashMap<u64, u32>>>;

/// A server on `site` whose `EXEC` counts into `runs`.
fn server(site: &Site, runs: &Runs) -> Engine<Soft> {
    let map = site.map("");
    let res = map.map.worker.clone();
    let runs = runs.clone();
    Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| {
        let mut ep = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
        let runs = runs.clone();
        ep.register(EXEC, move |req, resp| {
            let id: [u8; 8] = req.data.try_into().map_err(|_| Reject(1))?;
            *runs.lock().unwrap().entry(u64::from_le_bytes(id)).or_default() += 1;
            resp.write(req.data).map_err(|_| Reject(1))
        })
        .unwrap();
        RpcHandler::new(ep, Serve)
    })
    .unwrap()
}

/// A client engine on `site` whose worker runs the service `make` makes (no request types of
/// its own).
fn client<S: Service<Soft> + 'static>(
    site: &Site,
    make: impl Fn() -> S + Send + Sync + 'static,
) -> Engine<Soft> {
    let map = site.map("");
    let res = map.map.worker.clone();
    Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| {
        let ep = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
        RpcHandler::new(ep, make())
    })
    .unwrap()
}

/// Connects to `at` each time the test raises `round`, and makes round k's `N` calls (ids
/// from (k - 1) x N) on the session that opens. In round 1 the answer to call `CUT_AT` cuts the
/// wire (from the client's worker, so that later calls are still in flight or waiting behind
/// the credits however the threads are scheduled).
struct Client {
    at: SocketAddr,
    round: Arc<AtomicU8>,
    asked: u8,
    tx: Sender<Outcome>,
}

impl Service<Soft> for Client {
    fn poll(&mut self, rpc: &mut Rpc<'_, Soft>) {
        let want = self.round.load(Ordering::Acquire);
        if want > self.asked {
            self.asked = want;
            rpc.connect(self.at).unwrap();
        }
    }

    fn on_session(&mut self, rpc: &mut Rpc<'_, Soft>, s: SessionId, event: SessionEvent) {
        if let SessionEvent::Connected = event {
            let base = u64::from(self.asked - 1) * N;
            for id in base..base + N {
                let (tx, cut) = (self.tx.clone(), (id == CUT_AT).then_some(self.at));
                rpc.call(s, EXEC, &id.to_le_bytes(), LONG, move |_, r| {
                    if let Some(at) = cut {
                        assert_eq!(faults::cut(at), 1, "the session's connection is cut");
                    }
                    let _ = tx.send((id, r.map(<[u8]>::to_vec)));
                })
                .unwrap();
            }
        }
    }
}

#[test]
fn across_a_server_restart_every_call_ends_once_and_none_runs_twice() {
    let at = Site::soft("10.98.32.1");
    let from = Site::soft("10.98.32.2");
    let runs = Runs::default();
    let first = server(&at, &runs);

    let (tx, rx) = outcomes();
    let round = Arc::new(AtomicU8::new(0));
    let (r, listen) = (round.clone(), at.listen);
    let client =
        client(&from, move || Client { at: listen, round: r.clone(), asked: 0, tx: tx.clone() });

    // Round 1: the server's host dies with calls in flight and waiting behind the credits.
    round.store(1, Ordering::Release);
    let mut got = take(&rx, N as usize);
    first.shutdown().unwrap();
    let closed = got.iter().filter(|(_, r)| matches!(r, Err(RpcError::SessionClosed))).count();
    let answered = got.iter().filter(|(id, r)| r.as_deref().ok() == Some(&id.to_le_bytes()[..]));
    let answered = answered.count();
    assert_eq!(answered + closed, N as usize, "each call answered or closed: {got:?}");
    assert!(answered > CUT_AT as usize && closed > 0, "{answered} answered, {closed} closed");

    // Round 2: a new server on the same address; the client connects again.
    let second = server(&at, &runs);
    round.store(2, Ordering::Release);
    got.extend(take(&rx, N as usize));
    let tail = &got[N as usize..];
    assert!(
        tail.iter().all(|(id, r)| r.as_deref().ok() == Some(&id.to_le_bytes()[..])),
        "the new server answers every call"
    );
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "no call ends twice");

    let ids: HashSet<u64> = got.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids.len(), 2 * N as usize, "every call ends, once");
    let runs = runs.lock().unwrap().clone();
    assert!(runs.values().all(|&n| n == 1), "a request ran twice: {runs:?}");
    for (id, r) in &got {
        if r.is_ok() {
            assert_eq!(runs.get(id), Some(&1), "answered call {id} ran once");
        }
    }
    // (A call closed unanswered may have run, its response lost with the wire: at most once.)
    client.shutdown().unwrap();
    second.shutdown().unwrap();
}

/// A session opened under a reconnect policy (`Rpc::connect_with`) makes `N` calls at once;
/// the answer to call `CUT_AT` fails its connection's QPs (both ends). The session is
/// suspended (`Reconnecting`), the engine connects again, and the session carries on
/// (`Connected`): the calls that were in flight go again (the server, which kept the
/// session's record, answers those it ran from it and runs the others), and those waiting
/// for a credit follow, so that every call is answered and none runs twice. The session is in a group: out of it while
/// suspended, in it again once reconnected (each event comes with whether it is a member).
struct Redialer {
    at: SocketAddr,
    /// The wire dies at `CUT_AT` without a word (`faults::cut`), rather than the QPs failing.
    cut: bool,
    started: bool,
    group: Option<corelink_rpc::GroupId>,
    events: Sender<(SessionEvent, bool)>,
    tx: Sender<Outcome>,
}

impl Service<Soft> for Redialer {
    fn poll(&mut self, rpc: &mut Rpc<'_, Soft>) {
        if !std::mem::replace(&mut self.started, true) {
            // (a dead server's restart takes a while: its tries wait longer)
            let backoff = Duration::from_millis(if self.cut { 100 } else { 2 });
            let policy = corelink_engine::Reconnect {
                attempts: 200,
                backoff,
                max_backoff: backoff.max(Duration::from_millis(20)),
            };
            let s = rpc.connect_with(self.at, policy).unwrap();
            self.group = Some(rpc.group(&[s]).unwrap());
            // Made at once: they wait for the connection, then for credits.
            for id in 1000..1000 + N {
                let (tx, fail) = (self.tx.clone(), (id == 1000 + CUT_AT).then_some(self.at));
                let cut = self.cut;
                rpc.call(s, EXEC, &id.to_le_bytes(), LONG, move |_, r| {
                    match fail {
                        Some(at) if cut => assert_eq!(faults::cut(at), 1, "the wire is cut"),
                        Some(at) => assert!(faults::fail_qps(at) >= 1, "the session's QPs fail"),
                        None => {}
                    }
                    let _ = tx.send((id, r.map(<[u8]>::to_vec)));
                })
                .unwrap();
            }
        }
    }

    fn on_session(&mut self, rpc: &mut Rpc<'_, Soft>, s: SessionId, event: SessionEvent) {
        let g = self.group.expect("made at the start");
        let member = rpc.endpoint().members(g).unwrap().iter().any(|m| m.session() == s);
        let _ = self.events.send((event, member));
    }
}

/// A client engine on `from` whose `Redialer` calls `at` (`cut`: the wire dies at `CUT_AT`);
/// the calls' outcomes and the session's events (with whether it was in its group).
fn redialer(
    from: &Site,
    at: SocketAddr,
    cut: bool,
) -> (Engine<Soft>, Receiver<Outcome>, Receiver<(SessionEvent, bool)>) {
    let (tx, rx) = outcomes();
    let (etx, erx) = std::sync::mpsc::channel();
    let client = client(from, move || Redialer {
        at,
        cut,
        started: false,
        group: None,
        events: etx.clone(),
        tx: tx.clone(),
    });
    (client, rx, erx)
}

#[test]
fn a_session_under_a_reconnect_policy_carries_its_waiting_calls_to_the_new_connection() {
    let at = Site::soft("10.98.33.1");
    let from = Site::soft("10.98.33.2");
    let runs = Runs::default();
    let srv = server(&at, &runs);
    let (client, rx, erx) = redialer(&from, at.listen, false);
    let got = take(&rx, N as usize);
    let events: Vec<(SessionEvent, bool)> = erx.try_iter().collect();
    assert_eq!(
        events,
        [
            (SessionEvent::Connected, true),
            (SessionEvent::Reconnecting, false),
            (SessionEvent::Connected, true)
        ],
        "suspended once (out of its group), then open again (back in it)"
    );
    let answered = got.iter().filter(|(id, r)| r.as_deref().ok() == Some(&id.to_le_bytes()[..]));
    assert_eq!(answered.count(), N as usize, "every call answered, none lost: {got:?}");
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "no call ends twice");
    let runs = runs.lock().unwrap().clone();
    assert!(runs.values().all(|&n| n == 1), "a request ran twice: {runs:?}");
    client.shutdown().unwrap();
    srv.shutdown().unwrap();
}

/// As above, but the server's host dies at `CUT_AT` (the wire cut without a word, then its
/// engine gone) and a new server comes up on the same address: the session reconnects to it
/// and sends its calls in flight again, which the new server, with no record of the session,
/// answers `OutcomeUnknown` without running them; the calls that were waiting are answered.
/// Every call ends once, and no request runs twice across the two servers.
#[test]
fn a_resumable_sessions_calls_in_flight_at_a_server_restart_end_unknown_and_never_run_twice() {
    let at = Site::soft("10.98.33.5");
    let from = Site::soft("10.98.33.6");
    let runs = Runs::default();
    let first = server(&at, &runs);
    let (client, rx, erx) = redialer(&from, at.listen, true);
    assert_eq!(erx.recv_timeout(LONG).unwrap(), (SessionEvent::Connected, true));
    assert_eq!(erx.recv_timeout(LONG).unwrap(), (SessionEvent::Reconnecting, false));
    first.shutdown().unwrap();
    let second = server(&at, &runs);
    let got = take(&rx, N as usize);
    // (Connected on the new server; had a try reached the first one before it went, the
    // session was resumed there first: Connected, Reconnecting, then the new server's)
    let events: Vec<(SessionEvent, bool)> = erx.try_iter().collect();
    assert_eq!(events.last(), Some(&(SessionEvent::Connected, true)), "{events:?}");
    let unknown = got.iter().filter(|(_, r)| matches!(r, Err(RpcError::OutcomeUnknown))).count();
    let answered = got.iter().filter(|(id, r)| r.as_deref().ok() == Some(&id.to_le_bytes()[..]));
    let answered = answered.count();
    assert_eq!(answered + unknown, N as usize, "each call answered or unknown: {got:?}");
    let credits = usize::from(EndpointConfig::for_worker(&from.map("").map.worker).credits);
    assert!(unknown <= credits, "only calls in flight: {unknown} unknown");
    if events.len() == 1 {
        assert!(unknown >= 1, "the new server knew nothing of the calls in flight");
    }
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "no call ends twice");
    let runs = runs.lock().unwrap().clone();
    assert!(runs.values().all(|&n| n == 1), "a request ran twice: {runs:?}");
    for (id, r) in &got {
        if r.is_ok() {
            assert_eq!(runs.get(id), Some(&1), "answered call {id} ran once");
        }
    }
    client.shutdown().unwrap();
    second.shutdown().unwrap();
}

/// A server's session events and, after `Closed`, why it ended.
struct Watch {
    tx: Sender<(SessionEvent, Option<String>)>,
}

impl Service<Soft> for Watch {
    fn on_session(&mut self, _: &mut Rpc<'_, Soft>, _: SessionId, event: SessionEvent) {
        let _ = self.tx.send((event, None));
    }

    fn on_session_end(&mut self, _: &mut Rpc<'_, Soft>, _: SessionId, end: SessionEnd<'_>) {
        let _ = self.tx.send((SessionEvent::Closed, Some(end.to_string())));
    }
}

/// A resumable session's client goes away for good (its engine shuts down): its server
/// keeps the session's record for `EndpointConfig::resume` (`Reconnecting`), then ends it
/// (`Closed`, naming how the connection was lost).
#[test]
fn a_resumable_sessions_record_ends_when_its_client_does_not_come_back_in_time() {
    let at = Site::soft("10.98.33.8");
    let from = Site::soft("10.98.33.9");
    let (etx, erx) = std::sync::mpsc::channel();
    let map = at.map("");
    let res = map.map.worker.clone();
    let srv = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| {
        let cfg = EndpointConfig::for_worker(&res).with_resume(Duration::from_millis(30));
        let mut ep = Endpoint::new(cfg, &res).unwrap();
        ep.register(EXEC, |req, resp| resp.write(req.data).map_err(|_| Reject(1))).unwrap();
        RpcHandler::new(ep, Watch { tx: etx.clone() })
    })
    .unwrap();
    let (client, rx, _crx) = redialer(&from, at.listen, false);
    // (its calls' answers; the answer to `CUT_AT` fails the QPs once, and it reconnects)
    take(&rx, N as usize);
    client.shutdown().unwrap();
    // Until the session's end is told (its `Closed`, then why).
    let mut events = Vec::new();
    while events.last().is_none_or(|(_, why): &(SessionEvent, Option<String>)| why.is_none()) {
        events.push(erx.recv_timeout(LONG).unwrap());
    }
    let kinds: Vec<SessionEvent> = events.iter().map(|(e, _)| *e).collect();
    use SessionEvent::{Accepted, Closed, Reconnecting};
    // (the second `Accepted` may come before the first connection's loss is seen here: the
    // new connection then takes the session over at once)
    assert_eq!(kinds.iter().filter(|&&k| k == Accepted).count(), 2, "resumed once: {events:?}");
    assert_eq!(kinds.first(), Some(&Accepted));
    assert_eq!(kinds[kinds.len() - 3..], [Reconnecting, Closed, Closed], "{events:?}");
    let why = events[events.len() - 1].1.as_deref().unwrap_or_default();
    assert!(why.contains("connection closed"), "{why}");
    assert!(erx.recv_timeout(Duration::from_millis(100)).is_err(), "nothing more");
    srv.shutdown().unwrap();
}
