//! Keepalive on `soft` (`worker.keepalive_ms`): an idle connection whose wire is cut
//! (`soft::faults::cut`, a peer that died without a word) is closed on both sides with
//! `CloseReason::Unanswered`, where before it stayed open for ever; a healthy idle connection
//! is probed and stays open; with `keepalive_ms = 0` nothing is probed.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::soft::{faults, Soft};
use corelink_engine::verbs::WcStatus;
use corelink_engine::*;

const HANG: Duration = Duration::from_secs(30);

/// Tells the test of its closes; echoes every message.
struct Server(mpsc::Sender<CloseReason>);

impl Handler<Soft> for Server {
    fn on_message(&mut self, cx: &mut Cx<Soft>, conn: ConnId, msg: &Message<'_>) {
        let mut b = cx.alloc(msg.data.len()).unwrap();
        b.fill(msg.data).unwrap();
        cx.send(conn, b, None, 1).map_err(|(_, e)| e).unwrap();
    }

    fn on_closed(&mut self, _cx: &mut Cx<Soft>, _conn: ConnId, reason: &CloseReason) {
        let _ = self.0.send(*reason);
    }
}

fn engine(listen: &str, keepalive_ms: u32) -> (Engine<Soft>, mpsc::Receiver<CloseReason>) {
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000\nkeepalive_ms = {keepalive_ms}"
    );
    let v = parse(&text).unwrap().validate(&MachineTopology::load().unwrap()).unwrap();
    let (tx, rx) = mpsc::channel();
    (Engine::<Soft>::start(&v, Placement::RoundRobin, move |_| Server(tx.clone())).unwrap(), rx)
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

/// The sum of `f` over `engine`'s workers' metrics, once `ready` holds of it.
fn metric_when(
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

#[test]
fn an_idle_connection_whose_wire_is_cut_closes_on_both_sides_as_unanswered() {
    let addr: SocketAddr = "10.77.0.1:7000".parse().unwrap();
    let (server, closes) = engine("10.77.0.1:7000", 100);
    let (mut client_engine, _) = engine("10.77.0.2:7000", 100);
    let (mut client, conn) = connect(&mut client_engine, addr);
    // Idle and healthy: probed, and still open.
    metric_when(&client_engine, |m| m.keepalive_probes, |n| n >= 2);
    assert_eq!(faults::cut(addr), 1);
    let unanswered = CloseReason::Unanswered(WcStatus::RetryExcErr);
    match client.wait(HANG) {
        Some(Event::Closed { conn: c, reason }) => {
            assert_eq!((c, &reason), (conn, &unanswered));
            assert!(reason.to_string().contains("keepalive"), "{reason}");
        }
        other => panic!("the client never heard: {other:?}"),
    }
    assert_eq!(closes.recv_timeout(HANG).unwrap(), unanswered);
    assert!(metric_when(&client_engine, |m| m.keepalive_failures, |n| n >= 1) >= 1);
    assert!(metric_when(&server, |m| m.keepalive_failures, |n| n >= 1) >= 1);
    drop(client);
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn a_healthy_idle_connection_is_probed_and_stays_open() {
    let addr: SocketAddr = "10.77.0.3:7000".parse().unwrap();
    let (server, closes) = engine("10.77.0.3:7000", 40);
    let (mut client_engine, _) = engine("10.77.0.4:7000", 40);
    let (mut client, conn) = connect(&mut client_engine, addr);
    metric_when(&client_engine, |m| m.keepalive_probes, |n| n >= 5);
    metric_when(&server, |m| m.keepalive_probes, |n| n >= 5);
    client.submit(conn, Op::Send { buf: b"still here".to_vec(), imm: None }, 7).unwrap();
    let mut echoed = false;
    let deadline = Instant::now() + HANG;
    while !echoed {
        assert!(Instant::now() < deadline, "no echo");
        match client.wait(HANG) {
            Some(Event::Message { data, .. }) => {
                assert_eq!(data, b"still here");
                echoed = true;
            }
            Some(Event::Done(d)) => assert_eq!(d.status, WcStatus::Success),
            other => panic!("unexpected: {other:?}"),
        }
    }
    let failed: u64 =
        client_engine.metrics().iter().chain(&server.metrics()).map(|m| m.keepalive_failures).sum();
    assert_eq!(failed, 0);
    assert!(closes.try_recv().is_err(), "the server closed a healthy connection");
    drop(client);
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn with_keepalive_off_nothing_is_probed() {
    let addr: SocketAddr = "10.77.0.5:7000".parse().unwrap();
    let (server, _closes) = engine("10.77.0.5:7000", 0);
    let (mut client_engine, _) = engine("10.77.0.6:7000", 0);
    let (client, _conn) = connect(&mut client_engine, addr);
    // Long enough for several passes of a 40 ms keepalive, had it been on.
    std::thread::sleep(Duration::from_millis(300));
    let probes: u64 =
        client_engine.metrics().iter().chain(&server.metrics()).map(|m| m.keepalive_probes).sum();
    assert_eq!(probes, 0);
    drop(client);
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
}

/// A peer's disconnect that the connection manager loses (`cm_drop`): the far end never hears
/// of it, and its keepalive finds out (the probe is not answered), closing it as unanswered
/// instead of leaving it open for ever.
#[test]
fn a_disconnect_the_connection_manager_loses_is_found_by_the_keepalive() {
    let addr: SocketAddr = "10.77.0.7:7000".parse().unwrap();
    let before = faults::counts().cm_events_lost;
    faults::plan_at(addr, faults::FaultPlan { seed: 1, cm_drop: 1.0, ..Default::default() });
    let (server, closes) = engine("10.77.0.7:7000", 100);
    let (mut client_engine, _) = engine("10.77.0.8:7000", 100);
    let (mut client, conn) = connect(&mut client_engine, addr);
    client.close(conn).unwrap();
    match client.wait(HANG) {
        Some(Event::Closed { reason, .. }) => assert_eq!(reason, CloseReason::Local),
        other => panic!("the client's close: {other:?}"),
    }
    let unanswered = CloseReason::Unanswered(WcStatus::RetryExcErr);
    assert_eq!(closes.recv_timeout(HANG).unwrap(), unanswered, "found by the keepalive");
    assert!(faults::counts().cm_events_lost > before);
    faults::clear_at(addr);
    drop(client);
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
}
