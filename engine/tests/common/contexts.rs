//! Workers on device contexts of their own: every worker of two engines reports one
//! (`Metrics::own_context`), and with them a connection between two workers of one engine and
//! one across the two engines carry messages and one-sided requests on granted memory.
//!
//! Included (with `#[path]`) by `contexts_soft.rs` and `engine_ibverbs.rs`, which supply the
//! provider's lines and the addresses.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corelink_config::{parse, StaticTopology};
use corelink_engine::verbs::{Provider, RemoteRegion, WcStatus};
use corelink_engine::*;

use crate::grant::Granter;

/// How long a step may take before the test calls it a hang (not a performance bound).
const HANG: Duration = Duration::from_secs(30);

type Log = Arc<Mutex<Vec<String>>>;

/// What the accepting handlers granted, by the connector's private data.
type Grants = Arc<Mutex<Vec<(Vec<u8>, RemoteRegion)>>>;

/// The accepting side grants its memory and echoes sends (the initiating sides are clients).
struct Side<P: Provider> {
    name: String,
    log: Log,
    granter: Granter<P>,
    grants: Grants,
}

impl<P: Provider> Handler<P> for Side<P> {
    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        if !info.initiated {
            let region = self.granter.grant(cx, conn);
            let from = String::from_utf8_lossy(&info.private_data).into_owned();
            self.log.lock().unwrap().push(format!("accepted {from} on {}", self.name));
            self.grants.lock().unwrap().push((info.private_data.clone(), region));
        }
    }

    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        let mut b = cx.alloc(msg.data.len()).unwrap();
        b.fill(msg.data).unwrap();
        cx.send(conn, b, None, 1).map_err(|(_, e)| e).unwrap();
    }
}

/// A core map of `workers` workers (control core 0, workers from core 1; a core the machine
/// lacks runs its worker unpinned), listening on `listen`, with `provider`'s lines first.
pub fn core_map(provider: &str, listen: SocketAddr, workers: usize) -> String {
    let cores: Vec<String> = (1..=workers).map(|c| c.to_string()).collect();
    format!(
        "{provider}\ncontrol_core = 0\nworkers = [{}]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000",
        cores.join(", ")
    )
}

fn engine<P: Provider>(tag: &str, map: &str, log: &Log, grants: &Grants) -> Engine<P> {
    let map = parse(map).unwrap();
    let v = map.validate(&StaticTopology::uniform(4)).unwrap();
    let (tag, log, grants) = (tag.to_owned(), log.clone(), grants.clone());
    Engine::<P>::start(&v, Placement::RoundRobin, move |w| Side {
        name: format!("{tag}/{w}"),
        log: log.clone(),
        granter: Granter::default(),
        grants: grants.clone(),
    })
    .unwrap()
}

fn wait_for(log: &Log, what: &str) {
    let deadline = Instant::now() + HANG;
    while Instant::now() < deadline {
        if log.lock().unwrap().iter().any(|l| l == what) {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no {what:?} in {:?}", log.lock().unwrap());
}

fn grant_for(grants: &Grants, from: &[u8]) -> RemoteRegion {
    let deadline = Instant::now() + HANG;
    loop {
        if let Some((_, r)) = grants.lock().unwrap().iter().find(|(f, _)| f == from) {
            return *r;
        }
        assert!(Instant::now() < deadline, "no grant for {from:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The next outcome of a request of `c` (a success), keeping the messages that come first.
fn done(c: &mut Client, heard: &mut Vec<Vec<u8>>) -> Done<Vec<u8>> {
    loop {
        match c.wait(HANG).expect("an event") {
            Event::Message { data, .. } => heard.push(data),
            Event::Done(d) => {
                assert_eq!(d.status, WcStatus::Success, "{d:?}");
                return d;
            }
            e => panic!("{e:?}"),
        }
    }
}

/// From `c`: connects to `addr` as `from`, then a send (echoed: the connection is the
/// client's, so the echo comes to it), a write, a read of it back and a fetch-and-add on the
/// memory the accepting side granted.
fn exchange(c: &mut Client, addr: SocketAddr, from: &str, grants: &Grants) {
    let data = from.as_bytes().to_vec();
    c.connect(addr, &data, 1).unwrap();
    let conn = match c.wait(HANG) {
        Some(Event::Connected { conn, .. }) => conn,
        e => panic!("not connected: {e:?}"),
    };
    let region = grant_for(grants, &data);
    let mut heard = Vec::new();
    let submit = |c: &mut Client, op: Op<Vec<u8>>, token| {
        c.submit(conn, op, token).map_err(|(_, e)| e).unwrap();
    };
    submit(c, Op::Send { buf: b"ping".to_vec(), imm: None }, 2);
    done(c, &mut heard);
    let payload = format!("{from} was here").into_bytes();
    submit(c, Op::Write { buf: payload.clone(), remote: region.at(0), imm: None }, 3);
    done(c, &mut heard);
    submit(c, Op::Read { buf: vec![0; payload.len()], remote: region.at(0) }, 4);
    assert_eq!(done(c, &mut heard).buf, Some(payload));
    submit(c, Op::FetchAdd { remote: region.at(64), add: 3 }, 5);
    assert_eq!(done(c, &mut heard).old_value, Some(0));
    submit(c, Op::FetchAdd { remote: region.at(64), add: 3 }, 6);
    assert_eq!(done(c, &mut heard).old_value, Some(3));
    let deadline = Instant::now() + HANG;
    while !heard.iter().any(|m| m == b"ping") {
        assert!(Instant::now() < deadline, "no echo of the ping");
        if let Some(Event::Message { data, .. }) = c.wait(Duration::from_millis(10)) {
            heard.push(data);
        }
    }
}

/// Engine `a` (two workers, listening on `map_a`'s address) and engine `b` (one worker): every
/// worker on a context of its own; `a`'s worker 0 connects to `a` (accepted on its worker 1),
/// then `b`'s worker 0 connects to `a` (accepted on `a`'s worker 0).
pub fn workers_have_contexts_of_their_own<P: Provider>(map_a: &str, map_b: &str) {
    let (log, grants) = (Log::default(), Grants::default());
    let mut a = engine::<P>("a", map_a, &log, &grants);
    let mut b = engine::<P>("b", map_b, &log, &grants);
    for (name, e) in [("a", &a), ("b", &b)] {
        for m in e.metrics() {
            assert!(m.own_context, "engine {name} worker {}: no context of its own", m.worker);
        }
    }
    assert_eq!((a.workers(), b.workers()), (2, 1));
    let addr = a.listen_addr().unwrap();

    let mut a0 = a.client(0).unwrap();
    exchange(&mut a0, addr, "a0", &grants);
    wait_for(&log, "accepted a0 on a/1");

    let mut b0 = b.client(0).unwrap();
    exchange(&mut b0, addr, "b0", &grants);
    wait_for(&log, "accepted b0 on a/0");

    let (ma, mb) = (a.shutdown().unwrap(), b.shutdown().unwrap());
    for m in ma.iter().chain(&mb) {
        assert!(m.own_context, "{m}");
    }
    // Each initiating worker did its five requests; each accepting one sent a grant and an echo.
    let ops = |m: &Metrics| m.ops.iter().sum::<u64>();
    assert!(ops(&ma[0]) >= 5 && ops(&ma[1]) >= 2 && ops(&mb[0]) >= 5, "{ma:?} {mb:?}");
}
