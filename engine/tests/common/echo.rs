#![allow(dead_code)] // (each test crate uses a part of it)
//! A `soft` engine of one worker whose handler echoes every message (with its immediate) and
//! tells the test of each close; a client connected to it; a metric waited for; a message
//! echoed. What the keepalive, parking and fault tests drive their engines with.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::soft::Soft;
use corelink_engine::verbs::WcStatus;
use corelink_engine::*;

/// How long a step may take before the test calls it a hang (not a performance bound).
pub const HANG: Duration = Duration::from_secs(60);

/// Echoes every message with its immediate (a refused send is left to the test to notice),
/// and tells the test of its closes.
pub struct Echo(mpsc::Sender<CloseReason>);

impl Handler<Soft> for Echo {
    fn on_message(&mut self, cx: &mut Cx<Soft>, conn: ConnId, msg: &Message<'_>) {
        let mut b = cx.alloc(msg.data.len()).unwrap();
        b.fill(msg.data).unwrap();
        let _ = cx.send(conn, b, msg.imm, 0);
    }

    fn on_closed(&mut self, _cx: &mut Cx<Soft>, _conn: ConnId, reason: &CloseReason) {
        let _ = self.0.send(*reason);
    }
}

/// An echoing engine listening on `listen`, with `worker` lines added to its `[worker]`
/// table, and the closes its handler tells.
pub fn engine(listen: &str, worker: &str) -> (Engine<Soft>, mpsc::Receiver<CloseReason>) {
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000\n{worker}"
    );
    let v = parse(&text).unwrap().validate(&MachineTopology::load().unwrap()).unwrap();
    let (tx, rx) = mpsc::channel();
    (Engine::<Soft>::start(&v, Placement::RoundRobin, move |_| Echo(tx.clone())).unwrap(), rx)
}

/// A client of `engine` connected to `addr`, and its connection.
pub fn connect(engine: &mut Engine<Soft>, addr: SocketAddr) -> (Client, ConnId) {
    let mut client = engine.client(0).unwrap();
    client.connect(addr, b"", 1).unwrap();
    match client.wait(HANG) {
        Some(Event::Connected { conn, .. }) => (client, conn),
        other => panic!("no connection: {other:?}"),
    }
}

/// The sum of `f` over `engine`'s workers' metrics, once `ready` holds of it.
pub fn metric_when(
    engine: &Engine<Soft>,
    f: impl Fn(&Metrics) -> u64,
    ready: impl Fn(u64) -> bool,
) -> u64 {
    let deadline = Instant::now() + HANG;
    loop {
        let n = engine.metrics().iter().map(&f).sum();
        if ready(n) {
            return n;
        }
        assert!(Instant::now() < deadline, "the metric stayed at {n}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sends `data` on `conn` and waits for its echo (the send's own completion a success).
pub fn echo_once(client: &mut Client, conn: ConnId, data: &[u8]) {
    client.submit(conn, Op::Send { buf: data.to_vec(), imm: None }, 7).unwrap();
    let deadline = Instant::now() + HANG;
    loop {
        assert!(Instant::now() < deadline, "no echo");
        match client.wait(HANG) {
            Some(Event::Message { data: got, .. }) => {
                assert_eq!(got, data);
                return;
            }
            Some(Event::Done(d)) => assert_eq!(d.status, WcStatus::Success),
            other => panic!("unexpected: {other:?}"),
        }
    }
}
