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

use crate::grant::{granted, Granter};

type Log = Arc<Mutex<Vec<String>>>;

/// The memory the accepting side granted (for the test's external client, on this worker).
type Region = Arc<Mutex<Option<RemoteRegion>>>;

struct Echo<P: Provider> {
    log: Log,
    granter: Granter<P>,
    granted: Region,
}

impl<P: Provider> Handler<P> for Echo<P> {
    /// The accepting side grants its memory to the peer; a side is connected "with a region"
    /// once it knows the memory it may use (the initiating side: when the grant arrives).
    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        let app = String::from_utf8_lossy(&info.private_data).into_owned();
        if !info.initiated {
            *self.granted.lock().unwrap() = Some(self.granter.grant(cx, conn));
            self.log.lock().unwrap().push(format!("connected initiated=false {app} region=true"));
        }
    }

    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        let initiated = cx.conn_info(conn).map(|i| i.initiated).unwrap_or(false);
        if let (true, Some(_)) = (initiated, granted(msg)) {
            let app = cx.conn_info(conn).map(|i| i.private_data.clone()).unwrap_or_default();
            let app = String::from_utf8_lossy(&app).into_owned();
            self.log.lock().unwrap().push(format!("connected initiated=true {app} region=true"));
            return;
        }
        let text = String::from_utf8_lossy(msg.data).into_owned();
        if initiated {
            self.log.lock().unwrap().push(format!("echo {text} imm={:?}", msg.imm));
        } else if msg.written.is_some() {
            self.log.lock().unwrap().push(format!("written {:?} imm={:?}", msg.written, msg.imm));
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

fn req(conn: Option<ConnId>, op: ExtOp, data: Vec<u8>, token: u64) -> ExtRequest {
    ExtRequest { conn, op, data, token }
}

fn done(c: &mut Client) -> ExtCompletion {
    c.wait(HANG).expect("a completion")
}

/// Every request kind from an external client, through the engine connected to itself.
pub fn every_request_kind_through_the_engine<P: Provider>(map: &str) {
    let log: Log = Arc::default();
    let (mut e, granted) = engine::<P>(&log, map);
    let addr = e.listen_addr().unwrap();
    let mut c = e.client(0).unwrap();
    c.submit(req(None, ExtOp::Connect { addr }, b"hi there".to_vec(), 1)).unwrap();
    let d = done(&mut c);
    let region = granted_region(&granted);
    let error = d.error.as_ref().map(|e| verbs::chain(e).to_string());
    assert_eq!((d.token, d.status, error.as_deref()), (1, WcStatus::Success, None));
    let conn = d.conn.unwrap();
    wait_for(&log, "connected initiated=false hi there region=true");
    wait_for(&log, "connected initiated=true  region=true");

    c.submit(req(Some(conn), ExtOp::Send { imm: Some(7) }, b"hello".to_vec(), 2)).unwrap();
    assert_eq!(done(&mut c).status, WcStatus::Success);
    wait_for(&log, "echo hello imm=Some(8)");

    let data = b"sixteen bytes!!!".to_vec();
    c.submit(req(Some(conn), ExtOp::Write { remote: region.at(0), imm: None }, data.clone(), 3))
        .unwrap();
    assert_eq!(done(&mut c).status, WcStatus::Success);
    c.submit(req(
        Some(conn),
        ExtOp::Write { remote: region.at(32), imm: Some(9) },
        data.clone(),
        4,
    ))
    .unwrap();
    assert_eq!(done(&mut c).status, WcStatus::Success);
    wait_for(&log, "written Some(16) imm=Some(9)");
    c.submit(req(
        Some(conn),
        ExtOp::Read { remote: region.at(0), len: 16 },
        Vec::with_capacity(16),
        5,
    ))
    .unwrap();
    let d = done(&mut c);
    assert_eq!((d.status, d.data), (WcStatus::Success, data));
    c.submit(req(Some(conn), ExtOp::FetchAdd { remote: region.at(64), add: 5 }, vec![], 6))
        .unwrap();
    assert_eq!(done(&mut c).old_value, Some(0));
    c.submit(req(
        Some(conn),
        ExtOp::CompareSwap { remote: region.at(64), compare: 5, swap: 9 },
        vec![],
        7,
    ))
    .unwrap();
    assert_eq!(done(&mut c).old_value, Some(5));
    c.submit(req(
        Some(conn),
        ExtOp::CompareSwap { remote: region.at(64), compare: 5, swap: 1 },
        vec![],
        8,
    ))
    .unwrap();
    assert_eq!(done(&mut c).old_value, Some(9), "compare fails: the word stays 9");

    // A bad rkey fails the request with the device's status and closes the connection.
    let bad = RemoteAddr { addr: region.addr, rkey: region.rkey ^ 0x100 };
    c.submit(req(Some(conn), ExtOp::Write { remote: bad, imm: None }, vec![1; 8], 9)).unwrap();
    assert_eq!(done(&mut c).status, WcStatus::RemAccessErr);
    wait_for(&log, "closed Error(RemAccessErr)");
    // The responder's QP went to ERR too (rxe's semantics): its side closes with the flush
    // of its receives, or with the peer's disconnect, whichever it sees first.
    let deadline = Instant::now() + HANG;
    while log.lock().unwrap().iter().filter(|l| l.starts_with("closed")).count() < 2 {
        assert!(Instant::now() < deadline, "{:?}", log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(1));
    }
    c.submit(req(Some(conn), ExtOp::Send { imm: None }, vec![1], 10)).unwrap();
    let d = done(&mut c);
    assert!(d.error.is_some(), "a closed connection refuses requests: {d:?}");

    let m = e.shutdown().unwrap();
    assert!(m[0].ops.iter().sum::<u64>() >= 9, "{}", m[0]);
}

/// Shutdown with writes in flight: each request completes exactly once (done or flushed).
pub fn shutdown_with_requests_in_flight_completes_each_once<P: Provider>(map: &str) {
    let log: Log = Arc::default();
    let (mut e, granted) = engine::<P>(&log, map);
    let addr = e.listen_addr().unwrap();
    let mut c = e.client(0).unwrap();
    c.submit(req(None, ExtOp::Connect { addr }, vec![], 0)).unwrap();
    let conn = done(&mut c).conn.unwrap();
    let region = granted_region(&granted);
    const N: u64 = 200;
    for t in 1..=N {
        let mut r =
            req(Some(conn), ExtOp::Write { remote: region.at(t * 8), imm: None }, vec![7; 8], t);
        loop {
            match c.submit(r) {
                Ok(()) => break,
                Err(back) => r = back, // backpressure: the request came back
            }
        }
    }
    let metrics = e.shutdown().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let (mut flushed, mut refused) = (0, 0);
    while let Some(d) = c.poll() {
        match (d.status, &d.error) {
            (WcStatus::Success, None) => {}
            (WcStatus::WrFlushErr, None) => flushed += 1,
            // Still in the client's ring when the shutdown began (a slow device, a busy host):
            // refused before reaching the device, with the reason.
            (WcStatus::GeneralErr, Some(_)) => refused += 1,
            _ => panic!("{d:?}"),
        }
        assert!(seen.insert(d.token), "token {} completed twice", d.token);
    }
    println!("{N} writes at shutdown: {flushed} flushed, {refused} refused, the rest done");
    assert_eq!(seen.len() as u64, N, "every request completed exactly once");
    let closed = log.lock().unwrap().iter().filter(|l| l.starts_with("closed")).count();
    assert_eq!(closed, 2, "{:?}", log.lock().unwrap());
    assert_eq!(metrics.len(), 1);
}

/// A connect to `nowhere` (nothing listens there) fails with an error containing `expect`.
pub fn connect_to_nowhere_fails_cleanly<P: Provider>(map: &str, nowhere: SocketAddr, expect: &str) {
    let log: Log = Arc::default();
    let (mut e, _) = engine::<P>(&log, map);
    let mut c = e.client(0).unwrap();
    c.submit(req(None, ExtOp::Connect { addr: nowhere }, vec![], 4)).unwrap();
    let d = done(&mut c);
    assert_eq!((d.token, d.conn), (4, None));
    let error = verbs::chain(&d.error.unwrap()).to_string();
    assert!(error.contains(expect), "{error:?} should say {expect:?}");
    e.shutdown().unwrap();
}
