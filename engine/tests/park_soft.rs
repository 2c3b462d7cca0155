//! A worker with connections that parks when idle (`worker.park_after_us`) on `soft`: it
//! parks (and so gives its core up), a message sent to it while it is parked still reaches its
//! handler, whose answer comes back, and its keepalive still probes an idle connection; by
//! default a worker with connections never parks.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::soft::Soft;
use corelink_engine::verbs::WcStatus;
use corelink_engine::*;

const HANG: Duration = Duration::from_secs(30);

/// Echoes every message.
struct Echo;

impl Handler<Soft> for Echo {
    fn on_message(&mut self, cx: &mut Cx<Soft>, conn: ConnId, msg: &Message<'_>) {
        let mut b = cx.alloc(msg.data.len()).unwrap();
        b.fill(msg.data).unwrap();
        cx.send(conn, b, None, 1).map_err(|(_, e)| e).unwrap();
    }
}

/// An engine of one worker listening on `listen`, with `worker` lines added.
fn engine(listen: &str, worker: &str) -> Engine<Soft> {
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000\n{worker}"
    );
    let v = parse(&text).unwrap().validate(&MachineTopology::load().unwrap()).unwrap();
    Engine::<Soft>::start(&v, Placement::RoundRobin, |_| Echo).unwrap()
}

/// A client of `engine` connected to `addr`, and its connection.
fn connect(engine: &mut Engine<Soft>, addr: SocketAddr) -> (Client, ConnId) {
    let mut client = engine.client(0).unwrap();
    client.connect(addr, b"", 1).unwrap();
    match client.wait(HANG) {
        Some(Event::Connected { conn, .. }) => (client, conn),
        other => panic!("no connection: {other:?}"),
    }
}

/// `f` of `engine`'s worker once `ready` holds of it.
fn metric_when(engine: &Engine<Soft>, f: impl Fn(&Metrics) -> u64, ready: impl Fn(u64) -> bool) {
    let deadline = Instant::now() + HANG;
    loop {
        let n: u64 = engine.metrics().iter().map(&f).sum();
        if ready(n) {
            return;
        }
        assert!(Instant::now() < deadline, "the metric stayed at {n}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_idle_worker_with_connections_parks_and_still_hears_its_messages() {
    let addr: SocketAddr = "10.97.0.1:7000".parse().unwrap();
    let server = engine("10.97.0.1:7000", "park_after_us = 200\nkeepalive_ms = 40");
    let mut client_engine = engine("10.97.0.2:7000", "park_after_us = 200\nkeepalive_ms = 40");
    let (mut client, conn) = connect(&mut client_engine, addr);
    // Idle: both park, a slice at a time, and their keepalive probes go on.
    for e in [&server, &client_engine] {
        metric_when(e, |m| m.parks, |n| n >= 20);
        metric_when(e, |m| m.keepalive_probes, |n| n >= 3);
    }
    let before: u64 = server.metrics().iter().map(|m| m.voluntary_switches).sum();
    assert!(before >= 20, "a parked worker gives its core up: {before} voluntary switches");
    // A message to the parked server is heard and answered (within a slice of each park).
    for round in 0..3u8 {
        let data = vec![round; 64];
        client.submit(conn, Op::Send { buf: data.clone(), imm: None }, 7).unwrap();
        let deadline = Instant::now() + HANG;
        loop {
            assert!(Instant::now() < deadline, "no echo in round {round}");
            match client.wait(HANG) {
                Some(Event::Message { data: got, .. }) => {
                    assert_eq!(got, data);
                    break;
                }
                Some(Event::Done(d)) => assert_eq!(d.status, WcStatus::Success),
                other => panic!("unexpected: {other:?}"),
            }
        }
        std::thread::sleep(Duration::from_millis(20)); // (parked again)
    }
    let failed: u64 =
        client_engine.metrics().iter().chain(&server.metrics()).map(|m| m.keepalive_failures).sum();
    assert_eq!(failed, 0, "parking made no probe fail");
    drop(client);
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn a_worker_with_connections_never_parks_by_default() {
    let addr: SocketAddr = "10.97.0.3:7000".parse().unwrap();
    let server = engine("10.97.0.3:7000", "");
    let mut client_engine = engine("10.97.0.4:7000", "");
    let (client, _conn) = connect(&mut client_engine, addr);
    std::thread::sleep(Duration::from_millis(100));
    let metrics = client_engine.shutdown().unwrap().into_iter().chain(server.shutdown().unwrap());
    assert_eq!(metrics.map(|m| m.parks).sum::<u64>(), 0);
    drop(client);
}
