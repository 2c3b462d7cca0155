//! The engine end to end, generic over the provider: one engine connects to itself through its
//! control core; the worker's handler echoes messages; an external client issues every request
//! kind; shutdown with requests in flight gives each exactly one completion; a connect to an
//! address where nothing listens fails cleanly.
//!
//! Included (with `#[path]`) by `engine_soft.rs` and `engine_ibverbs.rs`, which supply the core
//! map's provider lines and the addresses.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::{self, Provider, RemoteAddr, RemoteRegion, WcStatus};
use corelink_engine::*;

/// How long a step may take before the test calls it a hang (not a performance bound: rxe in
/// an emulated guest is slow).
const HANG: Duration = Duration::from_secs(30);

use crate::grant::{granted_event, Granter};

type Log = Arc<Mutex<Vec<String>>>;

/// A message the accepting handler closes its connection on.
const CLOSE_ME: &[u8] = b"close me";
/// Messages it only logs.
const AFTER: &[u8] = b"after";

/// The memory the accepting side granted (for the test's external client, on this worker).
type Region = Arc<Mutex<Option<RemoteRegion>>>;

struct Echo<P: Provider> {
    log: Log,
    granter: Granter<P>,
    granted: Region,
}

/// The accepting side (the tests' connections are their clients'): grants its memory to the
/// peer, echoes sends, logs the rest.
impl<P: Provider> Handler<P> for Echo<P> {
    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        let app = String::from_utf8_lossy(&info.private_data).into_owned();
        *self.granted.lock().unwrap() = Some(self.granter.grant(cx, conn));
        self.log.lock().unwrap().push(format!("connected initiated=false {app} region=true"));
    }

    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        let text = String::from_utf8_lossy(msg.data).into_owned();
        if msg.written.is_some() {
            self.log.lock().unwrap().push(format!("written {:?} imm={:?}", msg.written, msg.imm));
        } else if msg.data.starts_with(CLOSE_ME) {
            // The peer's requests behind this one are on their way (or delivered already).
            self.log.lock().unwrap().push(format!("message {text}"));
            cx.close(conn).unwrap();
        } else if msg.data.starts_with(AFTER) {
            self.log.lock().unwrap().push(format!("message {text}"));
        } else {
            let mut b = cx.alloc(msg.data.len()).unwrap();
            b.fill(msg.data).unwrap();
            cx.send(conn, b, msg.imm.map(|i| i + 1), 1).map_err(|(_, e)| e).unwrap();
        }
    }

    fn on_closed(&mut self, _cx: &mut Cx<P>, _conn: ConnId, reason: &CloseReason) {
        self.log.lock().unwrap().push(format!("closed {reason:?}"));
    }
}

fn wait_for(log: &Log, what: &str) {
    let deadline = Instant::now() + HANG;
    while Instant::now() < deadline {
        if log.lock().unwrap().iter().any(|l| l.contains(what)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no {what:?} in {:?}", log.lock().unwrap());
}

/// A core map: control core 0, one worker on core 1, listening on `listen`, with `provider`'s
/// lines (provider, device, port, GID index) first.
pub fn core_map(provider: &str, listen: SocketAddr) -> String {
    format!(
        "{provider}\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000"
    )
}

fn engine<P: Provider>(log: &Log, map: &str) -> (Engine<P>, Region) {
    let map = parse(map).unwrap();
    let v = map.validate(&MachineTopology::load().unwrap()).unwrap();
    let log = log.clone();
    let region = Region::default();
    let r = region.clone();
    let e = Engine::<P>::start(&v, Placement::RoundRobin, move |_| Echo {
        log: log.clone(),
        granter: Granter::default(),
        granted: r.clone(),
    })
    .unwrap();
    (e, region)
}

/// The region the accepting side granted, once it has.
fn granted_region(r: &Region) -> RemoteRegion {
    let deadline = Instant::now() + HANG;
    loop {
        if let Some(g) = *r.lock().unwrap() {
            return g;
        }
        assert!(Instant::now() < deadline, "no grant");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A client's events, taken in the order the test asks for them (those it does not want yet
/// wait: a request's completion and a peer's message may come in either order).
struct Inbox {
    c: Client,
    seen: Vec<Event>,
}

impl Inbox {
    fn new(c: Client) -> Self {
        Inbox { c, seen: Vec::new() }
    }

    /// The first event `pick` accepts, waiting up to [`HANG`] for it.
    fn take(&mut self, what: &str, pick: impl Fn(&Event) -> bool) -> Event {
        let deadline = Instant::now() + HANG;
        loop {
            if let Some(i) = self.seen.iter().position(&pick) {
                return self.seen.remove(i);
            }
            assert!(Instant::now() < deadline, "no {what} in {:?}", self.seen);
            if let Some(e) = self.c.wait(Duration::from_millis(10)) {
                self.seen.push(e);
            }
        }
    }

    /// How request `token` ended: its completion, or `None` when the worker refused it (its
    /// connection was closing, or closed, when the request reached the worker: it never went
    /// out).
    fn ended(&mut self, token: u64) -> Option<Done<Vec<u8>>> {
        let pick = |e: &Event| match e {
            Event::Done(d) => d.token == token,
            Event::Refused { token: t, error, .. } => {
                let closed = matches!(
                    error,
                    EngineError::ConnectionClosing(_) | EngineError::NoSuchConnection(_)
                );
                *t == token && closed
            }
            _ => false,
        };
        match self.take("an end", pick) {
            Event::Done(d) => Some(d),
            _ => None,
        }
    }

    /// The outcome of request `token`.
    fn done(&mut self, token: u64) -> Done<Vec<u8>> {
        match self.take("completion", |e| matches!(e, Event::Done(d) if d.token == token)) {
            Event::Done(d) => d,
            _ => unreachable!(),
        }
    }

    /// Connects to `addr` with `data`; the connection and what the worker knows of it.
    fn connect(&mut self, addr: SocketAddr, data: &[u8], token: u64) -> (ConnId, ConnInfo) {
        self.c.connect(addr, data, token).unwrap();
        match self.take("connect", |e| !matches!(e, Event::Message { .. })) {
            Event::Connected { conn, info } => (conn, info),
            e => panic!("{e:?}"),
        }
    }

    /// Submits `op` on `conn` (the ring has room: the test waits for each).
    fn submit(&mut self, conn: ConnId, op: Op<Vec<u8>>, token: u64) {
        self.c.submit(conn, op, token).map_err(|(_, e)| e).unwrap();
    }
}

/// Every request kind from an external client, through the engine connected to itself. The
/// connection is the client's: the grant, the echoes and the close come to it.
pub fn every_request_kind_through_the_engine<P: Provider>(map: &str) {
    let log: Log = Arc::default();
    // (`core_map`'s text ends in its `[worker]` table; a long `worker.peer_grace_ms`: nothing
    // but the peer's disconnect ends a close's wait for it)
    let (mut e, granted) = engine::<P>(&log, &format!("{map}\npeer_grace_ms = 60000"));
    let addr = e.listen_addr().unwrap();
    let mut c = Inbox::new(e.client(0).unwrap());
    let (conn, info) = c.connect(addr, b"hi there", 1);
    assert_eq!((info.token, info.initiated), (1, true));
    // (one lane by default, with the map's receives: 32)
    assert_eq!((info.lanes, info.recvs_per_lane), (1, 32), "{info:?}");
    let region = granted_region(&granted);
    wait_for(&log, "connected initiated=false hi there region=true");
    let ev = c.take("the grant", |e| granted_event(e).is_some());
    assert_eq!(granted_event(&ev), Some(region));

    c.submit(conn, Op::Send { buf: b"hello".to_vec(), imm: Some(7) }, 2);
    assert_eq!(c.done(2).status, WcStatus::Success);
    let echo = c.take("the echo", |e| matches!(e, Event::Message { .. }));
    assert!(
        matches!(&echo, Event::Message { data, imm: Some(8), .. } if data == b"hello"),
        "{echo:?}"
    );

    let data = b"sixteen bytes!!!".to_vec();
    c.submit(conn, Op::Write { buf: data.clone(), remote: region.at(0), imm: None }, 3);
    assert_eq!(c.done(3).status, WcStatus::Success);
    c.submit(conn, Op::Write { buf: data.clone(), remote: region.at(32), imm: Some(9) }, 4);
    assert_eq!(c.done(4).status, WcStatus::Success);
    wait_for(&log, "written Some(16) imm=Some(9)");
    c.submit(conn, Op::Read { buf: vec![0; 16], remote: region.at(0) }, 5);
    let d = c.done(5);
    assert_eq!((d.status, d.buf), (WcStatus::Success, Some(data)));
    c.submit(conn, Op::FetchAdd { remote: region.at(64), add: 5 }, 6);
    assert_eq!(c.done(6).old_value, Some(0));
    c.submit(conn, Op::CompareSwap { remote: region.at(64), compare: 5, swap: 9 }, 7);
    assert_eq!(c.done(7).old_value, Some(5));
    c.submit(conn, Op::CompareSwap { remote: region.at(64), compare: 5, swap: 1 }, 8);
    assert_eq!(c.done(8).old_value, Some(9), "compare fails: the word stays 9");

    // A bad rkey fails the request with the device's status and closes the connection, named
    // for the refusal after the peer's disconnect (its QP failed too).
    let bad = RemoteAddr { addr: region.addr, rkey: region.rkey ^ 0x100 };
    c.submit(conn, Op::Write { buf: vec![1; 8], remote: bad, imm: None }, 9);
    assert_eq!(c.done(9).status, WcStatus::RemAccessErr);
    let closed = c.take("the close", |e| matches!(e, Event::Closed { .. }));
    assert!(
        matches!(closed, Event::Closed {
            conn: c,
            reason: CloseReason::PeerGone(WcStatus::RemAccessErr),
        } if c == conn),
        "{closed:?}"
    );
    // The responder's QP went to ERR too (rxe's semantics): its side closes with the flush
    // of its receives, or with the peer's disconnect, whichever it sees first.
    wait_for(&log, "closed");
    c.submit(conn, Op::Send { buf: vec![1], imm: None }, 10);
    let refused = c.take("the refusal", |e| matches!(e, Event::Refused { .. }));
    assert!(
        matches!(&refused, Event::Refused { token: 10, op: Op::Send { buf, .. }, .. } if buf == &[1]),
        "a closed connection refuses requests and gives them back: {refused:?}"
    );

    let m = e.shutdown().unwrap();
    assert!(m[0].ops.iter().sum::<u64>() >= 9, "{}", m[0]);
}

/// Shutdown with writes in flight: each request completes exactly once (done or flushed).
pub fn shutdown_with_requests_in_flight_completes_each_once<P: Provider>(map: &str) {
    let log: Log = Arc::default();
    let (mut e, granted) = engine::<P>(&log, map);
    let addr = e.listen_addr().unwrap();
    let mut c = e.client(0).unwrap();
    c.connect(addr, b"", 0).unwrap();
    let conn = match c.wait(HANG) {
        Some(Event::Connected { conn, .. }) => conn,
        e => panic!("{e:?}"),
    };
    let region = granted_region(&granted);
    const N: u64 = 200;
    for t in 1..=N {
        let mut op = Op::Write { buf: vec![7; 8], remote: region.at(t * 8), imm: None };
        loop {
            match c.submit(conn, op, t) {
                Ok(()) => break,
                Err((back, _)) => op = back, // backpressure: the request came back
            }
        }
    }
    let metrics = e.shutdown().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let (mut flushed, mut refused, mut closed) = (0, 0, 0);
    while let Some(ev) = c.poll() {
        let token = match ev {
            Event::Done(d) if d.status == WcStatus::Success => d.token,
            Event::Done(d) if d.status == WcStatus::WrFlushErr => {
                flushed += 1;
                d.token
            }
            // Still in the client's ring when the shutdown began (a slow device, a busy host):
            // refused before reaching the device, with the reason.
            Event::Refused { token, .. } => {
                refused += 1;
                token
            }
            Event::Message { .. } => continue, // the grant
            Event::Closed { .. } => {
                closed += 1;
                continue;
            }
            e => panic!("{e:?}"),
        };
        assert!(seen.insert(token), "token {token} completed twice");
    }
    println!("{N} writes at shutdown: {flushed} flushed, {refused} refused, the rest done");
    assert_eq!(seen.len() as u64, N, "every request completed exactly once");
    let accepted = log.lock().unwrap().iter().filter(|l| l.starts_with("closed")).count();
    assert_eq!((closed, accepted), (1, 1), "{:?}", log.lock().unwrap());
    assert_eq!(metrics.len(), 1);
}

/// A connect to `nowhere` (nothing listens there) fails with an error containing `expect`.
pub fn connect_to_nowhere_fails_cleanly<P: Provider>(map: &str, nowhere: SocketAddr, expect: &str) {
    let log: Log = Arc::default();
    let (mut e, _) = engine::<P>(&log, map);
    let mut c = e.client(0).unwrap();
    c.connect(nowhere, b"", 4).unwrap();
    let error = match c.wait(HANG) {
        Some(Event::ConnectFailed { token: 4, error }) => verbs::chain(&error).to_string(),
        e => panic!("{e:?}"),
    };
    assert!(error.contains(expect), "{error:?} should say {expect:?}");
    e.shutdown().unwrap();
}

/// A client closes the connection it opened: what it sent arrived, it hears `Closed` with
/// `Local`, the handler's end closes with `Peer`, and the connection takes nothing more.
pub fn a_client_closes_its_connection<P: Provider>(map: &str) {
    let log: Log = Arc::default();
    let (mut e, _) = engine::<P>(&log, map);
    let addr = e.listen_addr().unwrap();
    let mut c = Inbox::new(e.client(0).unwrap());
    let (conn, _) = c.connect(addr, b"", 1);
    c.submit(conn, Op::Send { buf: b"bye".to_vec(), imm: None }, 2);
    assert_eq!(c.done(2).status, WcStatus::Success);
    c.take("the echo", |e| matches!(e, Event::Message { data, .. } if data == b"bye"));
    c.c.close(conn).unwrap();
    let closed = c.take("the close", |e| matches!(e, Event::Closed { .. }));
    assert!(
        matches!(closed, Event::Closed { conn: c, reason: CloseReason::Local } if c == conn),
        "{closed:?}"
    );
    wait_for(&log, "closed Peer");
    c.c.close(conn).unwrap();
    let again = c.take("the second close's refusal", |e| matches!(e, Event::CloseFailed { .. }));
    assert!(matches!(again, Event::CloseFailed { conn: c, .. } if c == conn), "{again:?}");
    e.shutdown().unwrap();
}

/// Every message whose send the sender saw succeed reaches the receiving handler, before its
/// `on_closed`, even when the receiver closed the connection first (before, a receive that
/// completed once the connection was closing was counted and dropped: the application lost
/// data the sender had an acknowledgement for).
pub fn every_acknowledged_message_reaches_the_handler_before_its_close<P: Provider>(map: &str) {
    let log: Log = Arc::default();
    let (mut e, _) = engine::<P>(&log, map);
    let addr = e.listen_addr().unwrap();
    let mut c = Inbox::new(e.client(0).unwrap());
    acknowledged_before_close(&mut c, &log, addr);
    e.shutdown().unwrap();
}

/// The same between two engines (`server_map` accepts, `client_map` connects), `runs` times
/// in a row: across a real wire the race between the last receives and the disconnect is a
/// race between two machines' stacks.
pub fn every_acknowledged_message_reaches_the_handler_across<P: Provider>(
    server_map: &str,
    client_map: &str,
    runs: u32,
) {
    let (log, client_log): (Log, Log) = (Arc::default(), Arc::default());
    let (server, _) = engine::<P>(&log, server_map);
    let (mut client, _) = engine::<P>(&client_log, client_map);
    let addr = server.listen_addr().unwrap();
    let mut c = Inbox::new(client.client(0).unwrap());
    let mut delivered = 0;
    for _ in 0..runs {
        delivered += acknowledged_before_close(&mut c, &log, addr);
        log.lock().unwrap().clear();
    }
    println!("{runs} runs: {delivered} sends acknowledged after the close request, each delivered");
    drop(c);
    client.shutdown().unwrap();
    server.shutdown().unwrap();
}

/// One run: a connection to `addr` whose first message makes the accepting handler (logging to
/// `log`) close it, with sends behind it; every send that succeeded must be in the log before
/// the close. Returns how many succeeded.
fn acknowledged_before_close(c: &mut Inbox, log: &Log, addr: SocketAddr) -> usize {
    let (conn, _) = c.connect(addr, b"", 1);
    const N: u64 = 8;
    c.submit(conn, Op::Send { buf: CLOSE_ME.to_vec(), imm: None }, 100);
    for t in 1..=N {
        c.submit(conn, Op::Send { buf: format!("after {t}").into_bytes(), imm: None }, t);
    }
    // (a send the close beat to the worker is refused there: it ends so, and was not sent)
    let mut acked = Vec::new();
    for t in 1..=N {
        if c.ended(t).is_some_and(|d| d.status == WcStatus::Success) {
            acked.push(t);
        }
    }
    assert!(c.done(100).status.is_success());
    c.take("the close", |e| matches!(e, Event::Closed { .. }));
    wait_for(log, "closed");
    let log = log.lock().unwrap().clone();
    let closed_at = log.iter().position(|l| l.starts_with("closed")).unwrap();
    for t in &acked {
        let at = log.iter().position(|l| *l == format!("message after {t}"));
        assert!(
            at.is_some_and(|i| i < closed_at),
            "message {t} was acknowledged but did not reach the handler before its close: {log:?}"
        );
    }
    acked.len()
}
