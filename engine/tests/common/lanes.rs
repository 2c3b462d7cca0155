//! QP pools and multi-QP connections end to end, generic over the provider: connections made
//! and closed many times more than the pool holds reuse its QPs (the number created stays
//! bounded); `worker.qps.max` refuses a connect (on the connecting or the accepting side)
//! with a message naming it, and a close makes room again; a connection of 4 lanes (the
//! connector's `per_conn`, accepted by a server whose own is 1) is one connection to both
//! handlers and to the control core's counts, and carries a send and a write.
//!
//! Included (with `#[path]`) by `qp_pool_soft.rs` and `qp_pool_ibverbs.rs`. The handler is a
//! driver: the test thread queues commands, the worker runs them in `poll`, and everything the
//! handler hears is logged for the test to wait on.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::{Provider, RemoteRegion, WcStatus};
use corelink_engine::WorkerCounts;

use crate::grant::{granted, Granter};
use corelink_engine::*;

/// How long a step may take before the test calls it a hang.
const HANG: Duration = Duration::from_secs(30);

enum Cmd {
    Connect(SocketAddr, u64),
    Close(ConnId),
    Send(ConnId, u64),
    Write(ConnId, u64),
}

#[derive(Clone, Debug)]
enum Ev {
    Connected {
        conn: ConnId,
        initiated: bool,
        token: u64,
        app: Vec<u8>,
        region: bool,
    },
    ConnectFailed(u64, String),
    Closed(ConnId),
    Done(u64, WcStatus),
    Message(Vec<u8>),
    /// The peer of this connection granted this side memory (and said where).
    Granted(ConnId),
}

#[derive(Default)]
struct Shared {
    cmds: Mutex<VecDeque<Cmd>>,
    log: Mutex<Vec<Ev>>,
}

struct Driver<P: Provider> {
    s: Arc<Shared>,
    /// Memory the accepting side grants its peers.
    granter: Granter<P>,
    /// The memory each connection's peer granted this side.
    peers: Vec<(ConnId, RemoteRegion)>,
}

impl<P: Provider> Driver<P> {
    fn log(&self, e: Ev) {
        self.s.log.lock().unwrap().push(e);
    }
}

impl<P: Provider> Handler<P> for Driver<P> {
    fn poll(&mut self, cx: &mut Cx<P>) {
        let Some(cmd) = self.s.cmds.lock().unwrap().pop_front() else { return };
        match cmd {
            Cmd::Connect(addr, token) => {
                if let Err(e) = cx.connect(addr, b"lanes", token) {
                    self.log(Ev::ConnectFailed(token, e.to_string()));
                }
            }
            Cmd::Close(conn) => cx.close(conn).unwrap(),
            Cmd::Send(conn, token) => {
                let mut b = cx.alloc(5).unwrap();
                b.fill(b"hello").unwrap();
                cx.send(conn, b, None, token).map_err(|(_, e)| e).unwrap();
            }
            Cmd::Write(conn, token) => {
                let region = self.peers.iter().find(|p| p.0 == conn).map(|p| p.1).unwrap();
                let mut b = cx.alloc(8).unwrap();
                b.fill(&[7; 8]).unwrap();
                cx.write(conn, b, region.at(64), None, token).map_err(|(_, e)| e).unwrap();
            }
        }
    }

    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        // The accepting side exposes memory to its peer (and says where).
        let granted = !info.initiated;
        if granted {
            self.granter.grant(cx, conn);
        }
        self.log(Ev::Connected {
            conn,
            initiated: info.initiated,
            token: info.token,
            app: info.private_data.clone(),
            region: granted,
        });
    }

    fn on_connect_failed(
        &mut self,
        _cx: &mut Cx<P>,
        token: u64,
        error: &corelink_engine::EngineError,
    ) {
        self.log(Ev::ConnectFailed(token, corelink_engine::verbs::chain(error).to_string()));
    }

    fn on_message(&mut self, _cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        match granted(msg) {
            Some(region) => {
                self.peers.push((conn, region));
                self.log(Ev::Granted(conn));
            }
            None => self.log(Ev::Message(msg.data.to_vec())),
        }
    }

    fn on_completion(&mut self, _cx: &mut Cx<P>, done: Done<Buf<P>>) {
        if done.token != crate::grant::TOKEN {
            self.log(Ev::Done(done.token, done.status));
        }
    }

    fn on_closed(&mut self, _cx: &mut Cx<P>, conn: ConnId, _reason: &CloseReason) {
        self.peers.retain(|p| p.0 != conn);
        self.log(Ev::Closed(conn));
    }
}

/// A core map: `provider`'s lines, control core 0, one worker on core 1, listening on
/// `listen` if given, and the `[worker.qps]` keys `qps`.
pub fn core_map(provider: &str, listen: Option<SocketAddr>, qps: &str) -> String {
    let listen = listen.map(|a| format!("listen = \"{a}\"\n")).unwrap_or_default();
    format!(
        "{provider}\ncontrol_core = 0\nworkers = [1]\n{listen}\
         [worker]\nidle_after_us = 1000\n[worker.qps]\n{qps}"
    )
}

struct Node<P: Provider> {
    e: Engine<P>,
    s: Arc<Shared>,
}

impl<P: Provider> Node<P> {
    fn start(map: &str) -> Self {
        let v = parse(map).unwrap().validate(&MachineTopology::load().unwrap()).unwrap();
        let s: Arc<Shared> = Arc::default();
        let s2 = s.clone();
        let e = Engine::<P>::start(&v, Placement::RoundRobin, move |_| Driver {
            s: s2.clone(),
            granter: crate::grant::Granter::default(),
            peers: Vec::new(),
        })
        .unwrap();
        Node { e, s }
    }

    fn cmd(&self, c: Cmd) {
        self.s.cmds.lock().unwrap().push_back(c);
    }

    /// Waits until `f` finds something in the log.
    fn wait<T>(&self, what: &str, f: impl Fn(&[Ev]) -> Option<T>) -> T {
        let deadline = Instant::now() + HANG;
        loop {
            if let Some(t) = f(&self.s.log.lock().unwrap()) {
                return t;
            }
            assert!(Instant::now() < deadline, "no {what} in {:?}", self.s.log.lock().unwrap());
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn count(&self, f: impl Fn(&Ev) -> bool) -> usize {
        self.s.log.lock().unwrap().iter().filter(|e| f(e)).count()
    }

    /// Waits until `n` events satisfy `f`.
    fn wait_count(&self, what: &str, n: usize, f: impl Fn(&Ev) -> bool) {
        self.wait(what, |log| (log.iter().filter(|e| f(e)).count() >= n).then_some(()));
    }

    /// The connection this side made with `token`, once connected.
    fn connected(&self, token: u64) -> ConnId {
        self.wait(&format!("connection {token}"), |log| {
            log.iter().find_map(|e| match e {
                Ev::Connected { conn, initiated: true, token: t, .. } if *t == token => Some(*conn),
                _ => None,
            })
        })
    }

    /// Worker 0's control-core counts, once `f` holds for them.
    fn counts_when(&self, what: &str, f: impl Fn(&WorkerCounts) -> bool) -> WorkerCounts {
        let deadline = Instant::now() + HANG;
        loop {
            let m = self.e.control_metrics();
            if let Some(w) = m.workers.first().filter(|w| f(w)) {
                return *w;
            }
            assert!(Instant::now() < deadline, "{what}: never; now\n{m}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until every connection is gone and every QP back in the pool.
    fn settled(&self) -> WorkerCounts {
        self.counts_when("no connections, every QP pooled", |w| {
            w.connections == 0 && w.qps_live == w.qps_pooled
        })
    }
}

fn is_connected(e: &Ev) -> bool {
    matches!(e, Ev::Connected { .. })
}

fn is_closed(e: &Ev) -> bool {
    matches!(e, Ev::Closed(_))
}

/// Connects (to itself) and closes 3x as many times as the pool holds QPs: the QPs given back
/// are reset and reused, so the number ever created stays at the pool's size.
pub fn connections_reuse_pooled_qps<P: Provider>(provider: &str, listen: SocketAddr) {
    const POOL: u64 = 4;
    const ROUNDS: u64 = 3 * POOL;
    let n = Node::<P>::start(&core_map(provider, Some(listen), "pool = 4\nmax = 16"));
    let addr = n.e.listen_addr().unwrap();
    assert_eq!(n.counts_when("the pool made at start", |w| w.qps_pooled == POOL).qps_created, POOL);
    for round in 1..=ROUNDS {
        n.cmd(Cmd::Connect(addr, round));
        let conn = n.connected(round);
        n.wait_count("both sides connected", 2 * round as usize, is_connected);
        // Its two ends, both on worker 0.
        n.counts_when("the connection's two ends", |w| w.connections == 2);
        n.cmd(Cmd::Close(conn));
        n.wait_count("both sides closed", 2 * round as usize, is_closed);
        n.settled();
    }
    let w = n.settled();
    println!(
        "after {ROUNDS} connections (2 QPs each) with a pool of {POOL}:\n{}",
        n.e.control_metrics()
    );
    // Two QPs a round out of a pool of four never drain it below half: no refill, no create.
    assert!(w.qps_created <= POOL + 2, "{w:?}");
    assert!(w.qps_reused >= ROUNDS, "{w:?}");
    assert_eq!((w.qps_live, w.qps_refused), (w.qps_pooled, 0), "{w:?}");
    n.e.shutdown().unwrap();
}

/// With `worker.qps.max = max` (one connection to itself takes 2 QPs of the worker: 2 refuses
/// on the connecting side, 3 on the accepting side, whose reject carries the reason), a second
/// connect fails naming the limit; once the first is closed, a connect works again.
pub fn the_qp_limit_refuses_then_makes_room<P: Provider>(
    provider: &str,
    listen: SocketAddr,
    max: u32,
) {
    let n = Node::<P>::start(&core_map(provider, Some(listen), &format!("pool = 2\nmax = {max}")));
    let addr = n.e.listen_addr().unwrap();
    n.cmd(Cmd::Connect(addr, 1));
    let first = n.connected(1);
    n.wait_count("both sides connected", 2, is_connected);

    n.cmd(Cmd::Connect(addr, 2));
    let error = n.wait("the second connect's failure", |log| {
        log.iter().find_map(|e| match e {
            Ev::ConnectFailed(2, error) => Some(error.clone()),
            _ => None,
        })
    });
    println!("max = {max}: {error}");
    assert!(error.contains("worker.qps.max"), "{error}");
    assert!(error.contains(&format!("at most {max}")), "{error}");
    if max > 2 {
        assert!(error.contains("rejected"), "the accepting side refuses: {error}");
    }
    let w = n.counts_when("a refusal counted", |w| w.qps_refused >= 1);
    assert!(w.qps_live <= u64::from(max), "{w:?}");
    // Both ends of the first connection are on worker 0; the refused one left nothing behind.
    n.counts_when("the first connection alone", |w| w.connections == 2);
    assert_eq!(n.count(is_connected), 2, "the refused connect reached no handler");

    n.cmd(Cmd::Close(first));
    n.wait_count("both sides closed", 2, is_closed);
    n.settled();
    n.cmd(Cmd::Connect(addr, 3));
    let third = n.connected(3);
    n.wait_count("both sides connected again", 4, is_connected);
    n.cmd(Cmd::Send(third, 30));
    n.wait("the send's completion", |log| {
        log.iter().any(|e| matches!(e, Ev::Done(30, WcStatus::Success))).then_some(())
    });
    n.e.shutdown().unwrap();
}

/// A client with `per_conn = 4` connects to a server whose own `per_conn` is 1: one
/// connection of 4 lanes on each side (one `on_connected` each, one connection in the control
/// core's counts), which carries a send and a write; closing it releases every lane.
pub fn a_connection_of_four_lanes<P: Provider>(
    provider: &str,
    server_listen: SocketAddr,
    client_listen: SocketAddr,
) {
    let server = Node::<P>::start(&core_map(provider, Some(server_listen), "per_conn = 1"));
    let client = Node::<P>::start(&core_map(provider, Some(client_listen), "per_conn = 4"));
    let addr = server.e.listen_addr().unwrap();
    client.cmd(Cmd::Connect(addr, 1));
    let conn = client.connected(1);
    let accepted = server.wait("the accepted connection", |log| {
        log.iter().find_map(|e| match e {
            Ev::Connected { initiated: false, app, region, .. } => Some((app.clone(), *region)),
            _ => None,
        })
    });
    assert_eq!(accepted, (b"lanes".to_vec(), true));
    for n in [&server, &client] {
        let w = n.counts_when("the connection counted once", |w| w.connections == 1);
        assert_eq!(w.lanes, 4, "{w:?}");
    }

    client.cmd(Cmd::Send(conn, 10));
    client.wait("the send's completion", |log| {
        log.iter().any(|e| matches!(e, Ev::Done(10, WcStatus::Success))).then_some(())
    });
    server.wait("the message", |log| {
        log.iter().any(|e| matches!(e, Ev::Message(m) if m == b"hello")).then_some(())
    });
    // A write needs the memory the server granted (its message may come after the send's
    // completion: it left when the server's end came up, possibly before the client's
    // receives were posted, and was retried after the RNR wait).
    client.wait("the server's grant", |log| {
        log.iter().any(|e| matches!(e, Ev::Granted(c) if *c == conn)).then_some(())
    });
    client.cmd(Cmd::Write(conn, 11));
    client.wait("the write's completion", |log| {
        log.iter().any(|e| matches!(e, Ev::Done(11, WcStatus::Success))).then_some(())
    });
    assert_eq!(server.count(is_connected), 1, "one connection, whatever its lanes");
    assert_eq!(client.count(is_connected), 1, "one connection, whatever its lanes");

    client.cmd(Cmd::Close(conn));
    client.wait("the client's close", |log| {
        log.iter().any(|e| matches!(e, Ev::Closed(c) if *c == conn)).then_some(())
    });
    server.wait_count("the server's close", 1, is_closed);
    for n in [&server, &client] {
        n.settled();
    }
    assert_eq!(server.count(is_closed) + client.count(is_closed), 2);
    server.e.shutdown().unwrap();
    client.e.shutdown().unwrap();
}

/// A server with room for 2 QPs gets a client's 4 lanes: the lane beyond its limit is
/// rejected, the lanes it accepted are dropped, and the client's connect fails naming the
/// limit; neither handler hears of a connection, and both sides get every QP back.
pub fn a_refused_lane_fails_the_whole_connection<P: Provider>(
    provider: &str,
    server_listen: SocketAddr,
    client_listen: SocketAddr,
) {
    let server = Node::<P>::start(&core_map(provider, Some(server_listen), "pool = 2\nmax = 2"));
    let client = Node::<P>::start(&core_map(provider, Some(client_listen), "per_conn = 4"));
    let addr = server.e.listen_addr().unwrap();
    client.cmd(Cmd::Connect(addr, 1));
    let error = client.wait("the connect's failure", |log| {
        log.iter().find_map(|e| match e {
            Ev::ConnectFailed(1, error) => Some(error.clone()),
            _ => None,
        })
    });
    println!("4 lanes to a server with room for 2: {error}");
    assert!(error.contains("of 4") && error.contains("worker.qps.max"), "{error}");
    let w = server.counts_when("everything back on the server", |w| {
        w.connections == 0 && w.qps_live == w.qps_pooled && w.qps_refused >= 1
    });
    assert_eq!(w.lanes, 0, "{w:?}");
    let w = client.settled();
    assert_eq!(w.lanes, 0, "{w:?}");
    assert_eq!(server.count(is_connected) + client.count(is_connected), 0);
    server.e.shutdown().unwrap();
    client.e.shutdown().unwrap();
}
