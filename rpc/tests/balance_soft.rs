//! Load balancing on `soft`: a client engine's worker opens one session to each of three
//! server engines, groups them and calls the group. Equal servers share the calls, a slow one
//! gets fewer (its calls stay outstanding longer), a server shut down mid-run is taken out
//! (later calls go to the survivors, every call ends once), a group with no member up refuses
//! with `NoServer` until a session joins again, merging still works per session, and calls
//! on a group allocate nothing on the worker in steady state. Nothing
//! here asserts on time: timeouts are hang guards, and the slow server holds its answers
//! until the test lets it go (its calls stay outstanding, whatever the machine's speed).

mod counting;

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use corelink_config::{parse, StaticTopology, Validated};
use corelink_engine::verbs::soft::Soft;
use corelink_engine::{Engine, Placement};
use corelink_rpc::{
    Endpoint, EndpointConfig, GroupId, Reject, ReqType, Rpc, RpcError, RpcHandler, RpcMetrics,
    Serve, Service, SessionEvent, SessionId,
};
use counting::{COUNT, COUNTING};

/// How long a step may take before the test calls it a hang (not a performance bound).
const HANG: Duration = Duration::from_secs(60);
/// A deadline no call here reaches unless its server never answers.
const LONG: Duration = Duration::from_secs(120);

/// Echoes the request (the servers count how many times they ran it).
const ECHO: ReqType = ReqType(1);

/// A call's outcome: its tag and the response's bytes or the error.
type Outcome = (u64, Result<Vec<u8>, RpcError>);

/// A one-worker soft core map listening on `listen`.
fn map(listen: &str) -> Validated {
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000\n"
    );
    parse(&text).unwrap().validate(&StaticTopology::uniform(4)).unwrap()
}

fn addr(ip: &str) -> SocketAddr {
    format!("{ip}:7000").parse().unwrap()
}

/// A server: an engine whose worker serves ECHO (holding each request until `gate`, if any,
/// is open), and how many requests it ran.
struct Server {
    engine: Engine<Soft>,
    ran: Arc<AtomicU64>,
}

/// Shut until the test opens it: a held server's handler waits on it (blocking its worker).
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

fn server(ip: &str, gate: Option<Arc<Gate>>) -> Server {
    let map = map(&format!("{ip}:7000"));
    let res = map.map.worker.clone();
    let ran = Arc::new(AtomicU64::new(0));
    let count = ran.clone();
    let engine = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| {
        let mut ep = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
        let (count, gate) = (count.clone(), gate.clone());
        ep.register(ECHO, move |req, resp| {
            if let Some(g) = &gate {
                g.wait();
            }
            count.fetch_add(1, Ordering::Relaxed);
            resp.write(req.data).map_err(|_| Reject(1))
        })
        .unwrap();
        RpcHandler::new(ep, Serve)
    })
    .unwrap();
    Server { engine, ran }
}

/// What the client's worker publishes every loop iteration.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// Its session to each server, in the servers' order (once all are open).
    sessions: Vec<SessionId>,
    /// The group's members and their picks.
    members: Vec<(SessionId, u64)>,
    /// Sessions heard closed.
    closed: Vec<SessionId>,
    metrics: RpcMetrics,
}

/// Calls on the group, a fixed number in flight: each call's end makes the next until
/// `total` were made.
struct Loop {
    group: GroupId,
    total: u64,
    made: Cell<u64>,
    tx: Sender<Outcome>,
    /// Sessions heard closed (shared with the service).
    closed: Rc<RefCell<Vec<SessionId>>>,
    /// Calls placed on a session already heard closed (must stay 0).
    misplaced: Arc<AtomicU64>,
}

impl Loop {
    fn next(self: &Rc<Self>, rpc: &mut Rpc<'_, Soft>) {
        let tag = self.made.get();
        if tag >= self.total {
            return;
        }
        self.made.set(tag + 1);
        let me = self.clone();
        let placed = rpc.call_group(self.group, ECHO, &tag.to_le_bytes(), LONG, move |rpc, r| {
            let _ = me.tx.send((tag, r.map(<[u8]>::to_vec)));
            me.next(rpc);
        });
        match placed {
            Ok((session, _)) => {
                if self.closed.borrow().contains(&session) {
                    self.misplaced.fetch_add(1, Ordering::Relaxed);
                }
            }
            // A refusal is the call's one outcome.
            Err(e) => {
                let _ = self.tx.send((tag, Err(e)));
            }
        }
    }
}

/// What the client does once its sessions to every server are open and grouped.
type OnReady = Box<dyn FnOnce(&mut Rpc<'_, Soft>, GroupId, &Rc<RefCell<Vec<SessionId>>>)>;

/// The client's service: connects to `servers`, groups the sessions once all are open, runs
/// its script, and publishes what it sees.
struct Client {
    servers: Vec<SocketAddr>,
    sessions: Vec<SessionId>,
    open: usize,
    group: Option<GroupId>,
    ready: Option<OnReady>,
    closed: Rc<RefCell<Vec<SessionId>>>,
    seen: Arc<Mutex<Seen>>,
}

impl Service<Soft> for Client {
    fn poll(&mut self, rpc: &mut Rpc<'_, Soft>) {
        if self.sessions.is_empty() {
            self.sessions = self.servers.iter().map(|&a| rpc.connect(a).unwrap()).collect();
        }
        if let Ok(mut seen) = self.seen.try_lock() {
            seen.metrics.clone_from(rpc.endpoint().metrics());
            if let Some(g) = self.group {
                seen.sessions.clone_from(&self.sessions);
                let members = rpc.endpoint().members(g).unwrap();
                // Into the vector's room (no allocation once it has it: the allocation test
                // below counts the worker's).
                seen.members.clear();
                seen.members.extend(members.iter().map(|m| (m.session(), m.picks())));
            }
            seen.closed.clone_from(&self.closed.borrow());
        }
    }

    fn on_session(&mut self, rpc: &mut Rpc<'_, Soft>, s: SessionId, e: SessionEvent) {
        match e {
            SessionEvent::Connected => {
                self.open += 1;
                if self.open == self.servers.len() {
                    let g = rpc.group(&self.sessions).unwrap();
                    self.group = Some(g);
                    if let Some(f) = self.ready.take() {
                        f(rpc, g, &self.closed);
                    }
                }
            }
            SessionEvent::Closed => self.closed.borrow_mut().push(s),
            SessionEvent::Accepted | SessionEvent::Reconnecting => {}
        }
    }
}

/// A client engine on `ip` for `servers`, with `setup` applied to its endpoint and `ready`
/// (made on the worker) run once its group is made.
fn client(
    ip: &str,
    servers: Vec<SocketAddr>,
    setup: impl Fn(&mut Endpoint<Soft>) + Send + Sync + 'static,
    ready: impl Fn() -> OnReady + Send + Sync + 'static,
) -> (Engine<Soft>, Arc<Mutex<Seen>>) {
    let map = map(&format!("{ip}:7000"));
    let res = map.map.worker.clone();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let published = seen.clone();
    let engine = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| {
        let mut ep = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
        setup(&mut ep);
        let svc = Client {
            servers: servers.clone(),
            sessions: Vec::new(),
            open: 0,
            group: None,
            ready: Some(ready()),
            closed: Rc::default(),
            seen: published.clone(),
        };
        RpcHandler::new(ep, svc)
    })
    .unwrap();
    (engine, seen)
}

/// A client that runs a [`Loop`] of `total` calls, `window` in flight, on the group of its
/// sessions to `servers`; its outcomes and its count of misplaced calls.
fn looping_client(
    ip: &str,
    servers: Vec<SocketAddr>,
    total: u64,
    window: u64,
) -> (Engine<Soft>, Arc<Mutex<Seen>>, Receiver<Outcome>, Arc<AtomicU64>) {
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    let misplaced = Arc::new(AtomicU64::new(0));
    let counted = misplaced.clone();
    let (engine, seen) = client(
        ip,
        servers,
        |_| {},
        move || {
            let tx = tx.lock().unwrap().clone();
            let misplaced = counted.clone();
            Box::new(move |rpc, group, closed| {
                let l = Rc::new(Loop {
                    group,
                    total,
                    made: Cell::new(0),
                    tx,
                    closed: closed.clone(),
                    misplaced,
                });
                for _ in 0..window {
                    l.next(rpc);
                }
            })
        },
    );
    (engine, seen, rx, misplaced)
}

fn take(rx: &Receiver<Outcome>, n: usize) -> Vec<Outcome> {
    (0..n).map(|i| rx.recv_timeout(HANG).unwrap_or_else(|e| panic!("outcome {i}: {e}"))).collect()
}

/// What the client publishes, once `ready` holds of it.
fn seen_when(seen: &Mutex<Seen>, ready: impl Fn(&Seen) -> bool) -> Seen {
    let deadline = Instant::now() + HANG;
    loop {
        let s = seen.lock().unwrap().clone();
        if ready(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "the client never got there: {s:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The picks of each of `sessions` (0 for one that is no member).
fn picks(seen: &Seen) -> Vec<u64> {
    let of = |s: &SessionId| seen.members.iter().find(|(m, _)| m == s).map_or(0, |(_, p)| *p);
    seen.sessions.iter().map(of).collect()
}

#[test]
fn equal_servers_share_the_calls() {
    let ips = ["10.98.41.1", "10.98.41.2", "10.98.41.3"];
    let servers: Vec<Server> = ips.iter().map(|ip| server(ip, None)).collect();
    let total = 900u64;
    let (engine, seen, rx, misplaced) =
        looping_client("10.98.41.9", ips.iter().map(|ip| addr(ip)).collect(), total, 12);
    let mut got = take(&rx, total as usize);
    got.sort_by_key(|(t, _)| *t);
    for (i, (tag, r)) in got.iter().enumerate() {
        assert_eq!(*tag, i as u64, "each call ends once");
        assert_eq!(r.as_ref().unwrap(), &tag.to_le_bytes(), "call {tag}");
    }
    let s = seen_when(&seen, |s| s.metrics.responses == total);
    let ran: Vec<u64> = servers.iter().map(|s| s.ran.load(Ordering::Relaxed)).collect();
    assert_eq!(picks(&s), ran, "each server ran what the group placed on it: {s:?}");
    assert_eq!(ran.iter().sum::<u64>(), total);
    for (i, &n) in ran.iter().enumerate() {
        assert!(n * 5 >= total, "server {i} ran {n} of {total}: {ran:?}");
    }
    assert_eq!((s.metrics.calls, s.metrics.balanced, s.metrics.errors), (total, total, 0));
    assert_eq!(misplaced.load(Ordering::Relaxed), 0);
    engine.shutdown().unwrap();
    for s in servers {
        s.engine.shutdown().unwrap();
    }
}

#[test]
fn a_slow_server_gets_fewer_calls() {
    let ips = ["10.98.41.11", "10.98.41.12", "10.98.41.13"];
    // The third holds its answers until the test lets it go.
    let gate = Arc::new(Gate::default());
    let servers = [server(ips[0], None), server(ips[1], None), server(ips[2], Some(gate.clone()))];
    let total = 300u64;
    let (engine, seen, rx, _) =
        looping_client("10.98.41.19", ips.iter().map(|ip| addr(ip)).collect(), total, 12);
    // The first twelve calls, made at once, go four to each server. From then on, at each
    // pick 11 calls are outstanding: 4 held by the slow server, so at most 3 by the least
    // loaded of the other two, which gets the call. All but the held four end.
    let mut got = take(&rx, total as usize - 4);
    let s = seen_when(&seen, |s| s.metrics.responses == total - 4);
    let p = picks(&s);
    assert_eq!(p[2], 4, "the slow server got only its first share: {s:?}");
    assert_eq!(p[0] + p[1], total - 4, "{s:?}");
    assert!(p[0] * 5 >= total && p[1] * 5 >= total, "the fast ones share the rest: {p:?}");
    assert_eq!(servers[2].ran.load(Ordering::Relaxed), 0, "it held them");
    gate.open();
    got.extend(take(&rx, 4));
    got.sort_by_key(|(t, _)| *t);
    for (i, (tag, r)) in got.iter().enumerate() {
        assert_eq!(*tag, i as u64, "each call ends once");
        assert_eq!(r.as_ref().unwrap(), &tag.to_le_bytes(), "call {tag}");
    }
    let s = seen_when(&seen, |s| s.metrics.responses == total);
    let ran: Vec<u64> = servers.iter().map(|s| s.ran.load(Ordering::Relaxed)).collect();
    assert_eq!(picks(&s), ran, "{s:?}");
    engine.shutdown().unwrap();
    for s in servers {
        s.engine.shutdown().unwrap();
    }
}

#[test]
fn a_server_shut_down_mid_run_is_taken_out_and_every_call_ends_once() {
    let ips = ["10.98.41.21", "10.98.41.22", "10.98.41.23"];
    let mut servers: Vec<Server> = ips.iter().map(|ip| server(ip, None)).collect();
    let total = 1500u64;
    let (engine, seen, rx, misplaced) =
        looping_client("10.98.41.29", ips.iter().map(|ip| addr(ip)).collect(), total, 12);
    let mut got = take(&rx, 300);
    // The third server goes away while calls are on it. Its connection is closing before it
    // is down: a call sent meanwhile fails at once, and takes the session out of the group
    // (else, failing fast, it would look the least loaded and draw every call, each one's
    // continuation making the next on the worker's stack).
    let gone = servers.pop().unwrap();
    gone.engine.shutdown().unwrap();
    let ran_gone = gone.ran.load(Ordering::Relaxed);
    got.extend(take(&rx, total as usize - 300));
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "no call ends twice");
    got.sort_by_key(|(t, _)| *t);
    let tags: Vec<u64> = got.iter().map(|(t, _)| *t).collect();
    assert_eq!(tags, (0..total).collect::<Vec<_>>(), "each call ended once");
    let ok = got.iter().filter(|(_, r)| r.is_ok()).count() as u64;
    let closed = got.iter().filter(|(_, r)| matches!(r, Err(RpcError::SessionClosed))).count();
    assert_eq!(ok + closed as u64, total, "only the gone server's calls fail, closed");
    let s = seen_when(&seen, |s| s.closed.len() == 1 && s.metrics.responses == ok);
    assert_eq!(s.closed, [s.sessions[2]], "{s:?}");
    // The gone server left the group; no call was placed on it once it was heard closed.
    let members: Vec<SessionId> = s.members.iter().map(|(m, _)| *m).collect();
    assert_eq!(members, s.sessions[..2], "{s:?}");
    assert_eq!(misplaced.load(Ordering::Relaxed), 0);
    // The survivors ran every call placed on them, the later ones included.
    let ran: Vec<u64> = servers.iter().map(|s| s.ran.load(Ordering::Relaxed)).collect();
    assert_eq!(picks(&s)[..2], ran, "{s:?}");
    assert!(ran[0] + ran[1] + ran_gone >= ok, "{ran:?} {ran_gone} {ok}");
    assert!(ran[0] + ran[1] >= total - 300 - ran_gone - closed as u64, "{ran:?} {ran_gone}");
    assert_eq!(s.metrics.balanced, total, "{s:?}");
    engine.shutdown().unwrap();
    for s in servers {
        s.engine.shutdown().unwrap();
    }
}

/// A client whose group's members are sessions to nowhere: once both have failed it tries
/// the group, then a live server joins and is closed again. Each step's result goes to `tx`
/// under its tag.
struct Refusals {
    nowhere: Vec<SocketAddr>,
    live: SocketAddr,
    dead: Vec<SessionId>,
    group: Option<GroupId>,
    closed: usize,
    tx: Sender<Outcome>,
}

impl Service<Soft> for Refusals {
    fn poll(&mut self, rpc: &mut Rpc<'_, Soft>) {
        if self.group.is_none() {
            self.dead = self.nowhere.iter().map(|&a| rpc.connect(a).unwrap()).collect();
            // Connecting sessions are up: they may be members.
            self.group = Some(rpc.group(&self.dead).unwrap());
        }
    }

    fn on_session(&mut self, rpc: &mut Rpc<'_, Soft>, s: SessionId, e: SessionEvent) {
        let (Some(g), SessionEvent::Closed) = (self.group, e) else { return };
        if !self.dead.contains(&s) {
            return;
        }
        self.closed += 1;
        if self.closed < self.dead.len() {
            return;
        }
        let tx = self.tx.clone();
        let members = rpc.endpoint().members(g).unwrap().len();
        let _ = tx.send((0, Ok(vec![members as u8])));
        let r = rpc.call_group(g, ECHO, b"anyone?", LONG, |_, _| unreachable!("refused"));
        let _ = tx.send((1, r.map(|_| Vec::new())));
        let r = rpc.add_member(g, self.dead[0]);
        let _ = tx.send((2, r.map(|_| Vec::new())));
        let r = rpc.group(&self.dead[1..]);
        let _ = tx.send((3, r.map(|_| Vec::new())));
        // A live server joins (while it connects: its calls wait for the session to open).
        let back = rpc.connect(self.live).unwrap();
        assert!(rpc.add_member(g, back).unwrap());
        assert!(!rpc.add_member(g, back).unwrap(), "a member joins once");
        let r = rpc.call_group(g, ECHO, b"back", LONG, move |rpc, r| {
            let _ = tx.send((5, r.map(<[u8]>::to_vec)));
            // Closed by this side: it leaves the group at once.
            rpc.close(back).unwrap();
            let r = rpc.call_group(g, ECHO, b"again?", LONG, |_, _| unreachable!("refused"));
            let _ = tx.send((6, r.map(|_| Vec::new())));
            let no_server = rpc.endpoint().metrics().no_server;
            let _ = tx.send((7, Ok(no_server.to_le_bytes().to_vec())));
            let r = rpc.add_member(g, back);
            let _ = tx.send((9, r.map(|_| Vec::new())));
        });
        let _ = self.tx.send((4, r.map(|(s, _)| s.to_wire().to_le_bytes().to_vec())));
        let _ = self.tx.send((8, Ok(back.to_wire().to_le_bytes().to_vec())));
    }
}

#[test]
fn a_group_with_no_member_up_refuses_until_one_joins() {
    let live = server("10.98.41.31", None);
    let map = map("10.98.41.39:7000");
    let res = map.map.worker.clone();
    let (tx, rx) = channel::<Outcome>();
    let tx = Mutex::new(tx);
    let engine = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| {
        let ep = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
        let svc = Refusals {
            nowhere: vec![addr("10.98.41.98"), addr("10.98.41.99")],
            live: addr("10.98.41.31"),
            dead: Vec::new(),
            group: None,
            closed: 0,
            tx: tx.lock().unwrap().clone(),
        };
        RpcHandler::new(ep, svc)
    })
    .unwrap();
    let mut got = take(&rx, 10);
    got.sort_by_key(|(t, _)| *t);
    let r = |i: usize| &got[i].1;
    assert_eq!(r(0).as_ref().unwrap(), &[0], "both failed sessions left the group");
    assert!(matches!(r(1), Err(RpcError::NoServer { .. })), "{:?}", r(1));
    assert!(matches!(r(2), Err(RpcError::NoSuchSession(_))), "a gone session joins nothing");
    assert!(matches!(r(3), Err(RpcError::NoSuchSession(_))), "nor makes a group");
    assert_eq!(r(4).as_ref().unwrap(), r(8).as_ref().unwrap(), "the call went to the new member");
    assert_eq!(r(5).as_ref().unwrap(), b"back");
    assert!(matches!(r(6), Err(RpcError::NoServer { .. })), "{:?}", r(6));
    assert_eq!(r(7).as_ref().unwrap(), &2u64.to_le_bytes(), "two refusals counted");
    assert!(matches!(r(9), Err(RpcError::SessionClosed)), "a closing one joins nothing");
    assert!(rx.recv_timeout(Duration::from_millis(50)).is_err(), "refused calls never end");
    assert_eq!(live.ran.load(Ordering::Relaxed), 1);
    engine.shutdown().unwrap();
    live.engine.shutdown().unwrap();
}

#[test]
fn a_handle_calls_a_group_from_another_thread() {
    // One worker serves ECHO; this thread's handle opens three sessions from it to itself.
    let map = map("10.98.41.61:7000");
    let res = map.map.worker.clone();
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    let engine = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| {
        let mut ep = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
        ep.register(ECHO, |req, resp| resp.write(req.data).map_err(|_| Reject(1))).unwrap();
        let (handle, inbox) = corelink_rpc::handle(64);
        tx.lock().unwrap().send(handle).unwrap();
        RpcHandler::new(ep, Serve).with_inbox(inbox)
    })
    .unwrap();
    let mut h = rx.recv_timeout(HANG).unwrap();
    let sessions: Vec<SessionId> =
        (0..3).map(|_| h.connect(addr("10.98.41.61")).unwrap()).collect();
    let g = h.group(&sessions).unwrap();
    for i in 0..30u64 {
        assert_eq!(h.call_group(g, ECHO, &i.to_le_bytes(), LONG).unwrap(), i.to_le_bytes());
    }
    let f = h.call_group_async(g, ECHO, b"async".to_vec(), LONG);
    assert_eq!(corelink_rpc::block_on(f).unwrap(), b"async");
    assert!(!h.add_member(g, sessions[0]).unwrap(), "a member already");
    assert!(h.remove_member(g, sessions[0]).unwrap());
    assert_eq!(h.call_group(g, ECHO, b"two left", LONG).unwrap(), b"two left");
    for &s in &sessions[1..] {
        h.close(s).unwrap();
    }
    let r = h.call_group(g, ECHO, b"anyone?", LONG);
    assert!(matches!(r, Err(RpcError::NoServer { group }) if group == g), "{r:?}");
    drop(h);
    engine.shutdown().unwrap();
}

#[test]
fn identical_calls_on_a_group_merge_per_session() {
    let ips = ["10.98.41.41", "10.98.41.42", "10.98.41.43"];
    let servers: Vec<Server> = ips.iter().map(|ip| server(ip, None)).collect();
    let (tx, rx) = channel::<Outcome>();
    let tx = Mutex::new(tx);
    let (engine, seen) = client(
        "10.98.41.49",
        ips.iter().map(|ip| addr(ip)).collect(),
        |ep| ep.set_mergeable(ECHO, true).unwrap(),
        move || {
            let tx = tx.lock().unwrap().clone();
            Box::new(move |rpc, group, _| {
                // Thirty identical calls at once: round robin puts ten on each session, where
                // the first leads and nine merge with it.
                for i in 0..30u64 {
                    let tx = tx.clone();
                    rpc.call_group(group, ECHO, b"same", LONG, move |_, r| {
                        let _ = tx.send((i, r.map(<[u8]>::to_vec)));
                    })
                    .unwrap();
                }
            })
        },
    );
    let got = take(&rx, 30);
    assert!(got.iter().all(|(_, r)| r.as_ref().is_ok_and(|b| b == b"same")), "{got:?}");
    let s = seen_when(&seen, |s| s.metrics.responses == 30);
    assert_eq!(picks(&s), [10, 10, 10], "{s:?}");
    assert_eq!((s.metrics.merged, s.metrics.balanced), (27, 30), "{s:?}");
    let ran: Vec<u64> = servers.iter().map(|s| s.ran.load(Ordering::Relaxed)).collect();
    assert_eq!(ran, [1, 1, 1], "each server ran the request once");
    engine.shutdown().unwrap();
    for s in servers {
        s.engine.shutdown().unwrap();
    }
}

// No allocation on the path of a call on a group: a counting global allocator (it counts only
// on a thread that turned counting on: the allocation test's worker) and a closed loop of
// calls on a group of three sessions of one worker to itself, raw and typed by turns.

thread_local! {
    // Const-initialised and without destructors: using them never allocates.
    /// The worker's group and the calls ended so far (the continuations' state).
    static GROUP: Cell<Option<GroupId>> = const { Cell::new(None) };
    static ENDED: Cell<u64> = const { Cell::new(0) };
}

const WARM_UP: u64 = 5_000;
const MEASURED: u64 = 20_000;
const IN_FLIGHT: u64 = 24;

/// The worker's allocations in the measured window, once it closed (`u64::MAX` before).
static MEASURED_ALLOCATIONS: AtomicU64 = AtomicU64::new(u64::MAX);
/// Calls that did not end with their answer.
static FAILED: AtomicU64 = AtomicU64::new(0);

/// A typed type: answers its request plus one.
struct AddOne;

impl corelink_rpc::Method for AddOne {
    const TYPE: ReqType = ReqType(5);
    type Request<'a> = u64;
    type Response<'a> = u64;
}

fn again(rpc: &mut Rpc<'_, Soft>, outcome: Result<&[u8], RpcError>) {
    if outcome.map_or(true, |r| r != 8u64.to_le_bytes()) {
        FAILED.fetch_add(1, Ordering::Relaxed);
    }
    next(rpc);
}

fn again_typed(rpc: &mut Rpc<'_, Soft>, outcome: Result<u64, RpcError>) {
    if outcome.map_or(true, |n| n != 9) {
        FAILED.fetch_add(1, Ordering::Relaxed);
    }
    next(rpc);
}

/// Counts the call, opens or closes the window, calls the group again.
fn next(rpc: &mut Rpc<'_, Soft>) {
    let ended = ENDED.get() + 1;
    ENDED.set(ended);
    if ended == WARM_UP {
        COUNT.set(0);
        COUNTING.set(true);
    }
    if ended == WARM_UP + MEASURED {
        COUNTING.set(false);
        MEASURED_ALLOCATIONS.store(COUNT.get(), Ordering::Release);
    }
    if ended + IN_FLIGHT <= WARM_UP + MEASURED {
        let Some(g) = GROUP.get() else { return };
        let made = match ended % 2 {
            0 => rpc.call_group(g, ECHO, &8u64.to_le_bytes(), LONG, again).map(|_| ()),
            _ => rpc.call_method_group::<AddOne>(g, &8, LONG, again_typed).map(|_| ()),
        };
        if made.is_err() {
            FAILED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[test]
fn steady_state_calls_on_a_group_allocate_nothing_on_the_worker() {
    COUNTING.set(true);
    let b = std::hint::black_box(Box::new(7u64));
    COUNTING.set(false);
    drop(b);
    assert_eq!(COUNT.get(), 1, "the counter counts");
    COUNT.set(0);
    let me = addr("10.98.41.51");
    let (engine, seen) = client(
        "10.98.41.51",
        vec![me; 3],
        |ep| {
            ep.register(ECHO, |req, resp| resp.write(req.data).map_err(|_| Reject(1))).unwrap();
            ep.register_method::<AddOne>(|_, n| n.checked_add(1).ok_or(Reject(2))).unwrap();
        },
        || {
            Box::new(|rpc, group, _| {
                GROUP.set(Some(group));
                for _ in 0..IN_FLIGHT {
                    rpc.call_group(group, ECHO, &8u64.to_le_bytes(), LONG, again).unwrap();
                }
            })
        },
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    while MEASURED_ALLOCATIONS.load(Ordering::Acquire) == u64::MAX {
        assert!(Instant::now() < deadline, "the loop never got through");
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = seen_when(&seen, |s| s.metrics.responses >= WARM_UP + MEASURED);
    engine.shutdown().unwrap();
    assert_eq!(FAILED.load(Ordering::Relaxed), 0, "{s:?}");
    let p = picks(&s);
    assert!(p.iter().all(|&n| n * 5 >= WARM_UP + MEASURED), "spread: {p:?}");
    let allocations = MEASURED_ALLOCATIONS.load(Ordering::Relaxed);
    assert_eq!(allocations, 0, "allocations on the worker in steady state");
}
