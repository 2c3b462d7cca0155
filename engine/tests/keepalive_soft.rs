//! Keepalive on `soft` (`worker.keepalive_ms`): an idle connection whose wire is cut
//! (`soft::faults::cut`, a peer that died without a word) is closed on both sides with
//! `CloseReason::Unanswered`, where before it stayed open for ever; a healthy idle connection
//! is probed and stays open; with `keepalive_ms = 0` nothing is probed.

#[path = "common/echo.rs"]
mod echo;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use corelink_engine::verbs::soft::{faults, Soft};
use corelink_engine::verbs::WcStatus;
use corelink_engine::*;
use echo::{connect, echo_once, metric_when, HANG};

/// An echoing engine listening on `listen` with `worker.keepalive_ms = keepalive_ms`, and
/// the closes its handler tells.
fn engine(listen: &str, keepalive_ms: u32) -> (Engine<Soft>, mpsc::Receiver<CloseReason>) {
    echo::engine(listen, &format!("keepalive_ms = {keepalive_ms}"))
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
    echo_once(&mut client, conn, b"still here");
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
