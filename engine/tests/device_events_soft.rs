//! The device's asynchronous events reach the engine: a fatal error on a connection's QPs
//! (`soft::faults::fail_qps`, which moves them to ERR and raises `IBV_EVENT_QP_FATAL`, as a
//! NIC reports an error it cannot put in a completion) closes the connection on both sides,
//! and each worker counts the event (`Metrics::async_events`). Before, the engine never read
//! its devices' events: nothing counted or said them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use corelink_engine::verbs::soft::{faults, Soft};
use corelink_engine::verbs::{AsyncEventKind, WcStatus};
use corelink_engine::*;

const HANG: Duration = Duration::from_secs(30);

#[path = "common/told.rs"]
mod told;

/// The sum of `f` over `engine`'s workers' metrics once it is at least `n`.
fn metric_at_least(engine: &Engine<Soft>, f: impl Fn(&Metrics) -> u64, n: u64) -> u64 {
    let deadline = Instant::now() + HANG;
    loop {
        let got = engine.metrics().iter().map(&f).sum();
        if got >= n {
            return got;
        }
        assert!(Instant::now() < deadline, "the metric stayed at {got}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_fatal_qp_error_closes_its_connection_and_is_counted_on_both_sides() {
    let addr: SocketAddr = "10.85.0.1:7000".parse().unwrap();
    let (server, closes) = told::engine("10.85.0.1:7000", "", "");
    let (mut client_engine, _) = told::engine("10.85.0.2:7000", "", "");
    let mut client = client_engine.client(0).unwrap();
    client.connect(addr, b"", 1).unwrap();
    let conn = match client.wait(HANG) {
        Some(Event::Connected { conn, .. }) => conn,
        other => panic!("no connection: {other:?}"),
    };
    assert_eq!(closes.recv_timeout(HANG).unwrap(), None, "the server has it too");
    assert_eq!(faults::fail_qps(addr), 2, "both ends' QPs");
    // Closed by the event, by the receives it flushed, or by the other side's disconnect,
    // whichever the worker met first.
    let closed_by_it = |r: &CloseReason| {
        matches!(
            r,
            CloseReason::Device(AsyncEventKind::QpFatal)
                | CloseReason::Error(WcStatus::WrFlushErr)
                | CloseReason::Peer
        )
    };
    match client.wait(HANG) {
        Some(Event::Closed { conn: c, reason }) => {
            assert_eq!(c, conn);
            assert!(closed_by_it(&reason), "{reason}");
        }
        other => panic!("the client never heard: {other:?}"),
    }
    let reason = closes.recv_timeout(HANG).unwrap().expect("a close");
    assert!(closed_by_it(&reason), "{reason}");
    assert!(metric_at_least(&client_engine, |m| m.async_events, 1) >= 1);
    assert!(metric_at_least(&server, |m| m.async_events, 1) >= 1);
    drop(client);
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
}

/// The control core reads its own context's events (a port's error here, raised on the
/// context its listener is on): counted in `ControlMetrics::async_events`. Its workers have
/// contexts of their own, so none of them is handed the event, and the engine keeps working:
/// a connection made after it comes up. Before, the control core never read its events.
#[test]
fn the_control_core_reads_its_own_contexts_events() {
    use corelink_engine::verbs::AsyncElement;
    let addr: SocketAddr = "10.85.0.3:7000".parse().unwrap();
    let (server, closes) = told::engine("10.85.0.3:7000", "", "");
    assert!(faults::raise_at(addr, AsyncEventKind::PortErr, AsyncElement::Port(1)));
    let deadline = Instant::now() + HANG;
    while server.control_metrics().async_events < 1 {
        assert!(Instant::now() < deadline, "the control core never read the event");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(server.metrics().iter().map(|m| m.async_events).sum::<u64>(), 0, "no worker's");
    let (mut client_engine, _) = told::engine("10.85.0.4:7000", "", "");
    let mut client = client_engine.client(0).unwrap();
    client.connect(addr, b"", 1).unwrap();
    assert!(matches!(client.wait(HANG), Some(Event::Connected { .. })), "a connection after it");
    assert_eq!(closes.recv_timeout(HANG).unwrap(), None, "the server has it too");
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
}

/// With `worker.own_context = false` a worker shares the control core's context, whose events
/// the control core reads: a fatal error of the worker's QP is handed to it, and closes its
/// connection as on a context of its own (the server side here; the client has its own).
#[test]
fn a_worker_sharing_the_control_cores_context_is_handed_its_events() {
    let addr: SocketAddr = "10.85.0.5:7000".parse().unwrap();
    let (server, closes) = told::engine("10.85.0.5:7000", "", "own_context = false");
    assert!(server.metrics().iter().all(|m| !m.own_context), "the worker shares the context");
    let (mut client_engine, _) = told::engine("10.85.0.6:7000", "", "");
    let mut client = client_engine.client(0).unwrap();
    client.connect(addr, b"", 1).unwrap();
    assert!(matches!(client.wait(HANG), Some(Event::Connected { .. })));
    assert_eq!(closes.recv_timeout(HANG).unwrap(), None, "the server has it too");
    assert_eq!(faults::fail_qps(addr), 2, "both ends' QPs");
    match closes.recv_timeout(HANG).unwrap() {
        Some(r) => assert!(
            matches!(
                r,
                CloseReason::Device(AsyncEventKind::QpFatal)
                    | CloseReason::Error(WcStatus::WrFlushErr)
                    | CloseReason::Peer
            ),
            "{r}"
        ),
        None => panic!("a second connection"),
    }
    let deadline = Instant::now() + HANG;
    while server.control_metrics().async_events < 1 {
        assert!(Instant::now() < deadline, "the control core never read the event");
        std::thread::sleep(Duration::from_millis(5));
    }
    metric_at_least(&server, |m| m.async_events, 1);
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
}
