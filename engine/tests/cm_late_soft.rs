//! Connection-manager messages that arrive late (a soft plan's `cm_delay_us` on the listener:
//! the request, the accept, the connector's confirmation and a disconnect each reach the far
//! end 30 ms after they were sent): the engine still connects and closes, with the close
//! told on both sides; and a connect whose `connect_timeout_ms` is shorter than the delayed
//! exchange fails with a timeout, told to whoever asked, instead of hanging.

use std::net::SocketAddr;
use std::time::Duration;

use corelink_engine::verbs::soft::faults;
use corelink_engine::*;

const HANG: Duration = Duration::from_secs(30);

#[path = "common/told.rs"]
mod told;

#[test]
fn late_connection_manager_messages_slow_connects_and_closes_and_lose_nothing() {
    let addr: SocketAddr = "10.86.0.1:7000".parse().unwrap();
    faults::plan_at(addr, faults::FaultPlan { cm_delay_us: 30_000, ..Default::default() });
    let before = faults::counts().cm_events_delayed;
    let (server, closes) = told::engine("10.86.0.1:7000", "", "");
    let (mut client_engine, _) = told::engine("10.86.0.2:7000", "", "");
    let mut client = client_engine.client(0).unwrap();
    client.connect(addr, b"", 1).unwrap();
    let conn = match client.wait(HANG) {
        Some(Event::Connected { conn, .. }) => conn,
        other => panic!("no connection: {other:?}"),
    };
    assert_eq!(closes.recv_timeout(HANG).unwrap(), None, "the server has it too");
    client.close(conn).unwrap();
    match client.wait(HANG) {
        Some(Event::Closed { conn: c, reason }) => {
            assert_eq!((c, reason), (conn, CloseReason::Local))
        }
        other => panic!("no close: {other:?}"),
    }
    let told = closes.recv_timeout(HANG).unwrap();
    assert!(told.is_some(), "the server is told of the close, late: {told:?}");
    assert!(faults::counts().cm_events_delayed >= before + 4, "request, accept, ready, close");

    // 10 ms for an exchange that takes at least 60: the connect times out, and says so.
    let (mut hasty_engine, _) = told::engine("10.86.0.3:7000", "connect_timeout_ms = 10", "");
    let mut hasty = hasty_engine.client(0).unwrap();
    hasty.connect(addr, b"", 2).unwrap();
    match hasty.wait(HANG) {
        Some(Event::ConnectFailed { token: 2, error }) => {
            let timed_out = matches!(&error, EngineError::Connect { source, .. }
                if matches!(**source, EngineError::Verbs(verbs::Error::CmTimeout { .. })));
            assert!(timed_out, "{}", verbs::chain(&error));
        }
        other => panic!("not a failed connect: {other:?}"),
    }
    faults::clear_at(addr);
    hasty_engine.shutdown().unwrap();
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
}
