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
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{outcomes, take, Outcome, Site, LONG};
use corelink_engine::verbs::soft::faults;
use corelink_engine::verbs::soft::Soft;
use corelink_engine::{Engine, Placement};
use corelink_rpc::{
    Endpoint, EndpointConfig, Reject, ReqType, Rpc, RpcError, RpcHandler, Serve, Service,
    SessionEvent, SessionId,
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
    let map = from.map("");
    let res = map.map.worker.clone();
    let (r, listen) = (round.clone(), at.listen);
    let client = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| {
        let ep = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
        let c = Client { at: listen, round: r.clone(), asked: 0, tx: tx.clone() };
        RpcHandler::new(ep, c)
    })
    .unwrap();

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
