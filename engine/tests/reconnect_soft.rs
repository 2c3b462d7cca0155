//! The engine's reconnect policy (`Cx::connect_with`, issue 15 item 2), on `soft`: a
//! connection whose QPs fail is made again after the policy's backoff, the handler told at
//! each step (`on_closed`, `on_redial`, `on_connected` with the same token); with the server
//! gone every try fails, each told with its error, until the policy's tries are spent and
//! `on_connect_failed` ends the connect once; a server that comes back during the tries is
//! reached; and a connection this side closes is not made again.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::soft::{faults, Soft};
use corelink_engine::*;

const HANG: Duration = Duration::from_secs(30);
const TOKEN: u64 = 42;

/// What the dialing handler hears.
#[derive(Debug, PartialEq)]
enum Heard {
    Connected(u64),
    Closed,
    Redial { attempt: u32, failed: bool },
    Failed(u64),
}

/// Connects to `to` with `policy` on its first iteration and closes its connection itself
/// after `close_after` connections (0: never).
struct Dialer {
    to: SocketAddr,
    policy: Reconnect,
    started: bool,
    connections: u32,
    close_after: u32,
    tx: mpsc::Sender<Heard>,
}

impl Handler<Soft> for Dialer {
    fn poll(&mut self, cx: &mut Cx<Soft>) {
        if !std::mem::replace(&mut self.started, true) {
            cx.connect_with(self.to, b"", TOKEN, self.policy).unwrap();
            let again = cx.connect_with(self.to, b"", TOKEN, self.policy);
            assert!(matches!(again, Err(EngineError::TokenInUse(TOKEN))), "{again:?}");
        }
    }

    fn on_connected(&mut self, cx: &mut Cx<Soft>, conn: ConnId, info: &ConnInfo) {
        let _ = self.tx.send(Heard::Connected(info.token));
        self.connections += 1;
        if self.connections == self.close_after {
            cx.close(conn).unwrap();
        }
    }

    fn on_closed(&mut self, _cx: &mut Cx<Soft>, _conn: ConnId, _reason: &CloseReason) {
        let _ = self.tx.send(Heard::Closed);
    }

    fn on_redial(&mut self, _cx: &mut Cx<Soft>, step: &Redial<'_>) {
        assert_eq!(step.token, TOKEN);
        let _ =
            self.tx.send(Heard::Redial { attempt: step.attempt, failed: step.failed.is_some() });
    }

    fn on_connect_failed(&mut self, _cx: &mut Cx<Soft>, token: u64, _error: &EngineError) {
        let _ = self.tx.send(Heard::Failed(token));
    }
}

/// A handler that only accepts.
struct Accept;
impl Handler<Soft> for Accept {}

fn map(listen: &str) -> corelink_config::Validated {
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000"
    );
    parse(&text).unwrap().validate(&MachineTopology::load().unwrap()).unwrap()
}

fn server(listen: &str) -> Engine<Soft> {
    Engine::<Soft>::start(&map(listen), Placement::RoundRobin, |_| Accept).unwrap()
}

fn dialer(
    listen: &str,
    to: SocketAddr,
    policy: Reconnect,
    close_after: u32,
) -> (Engine<Soft>, mpsc::Receiver<Heard>) {
    let (tx, rx) = mpsc::channel();
    let make =
        move |_| Dialer { to, policy, started: false, connections: 0, close_after, tx: tx.clone() };
    (Engine::<Soft>::start(&map(listen), Placement::RoundRobin, make).unwrap(), rx)
}

fn next(rx: &mpsc::Receiver<Heard>) -> Heard {
    rx.recv_timeout(HANG).expect("the handler heard nothing more")
}

fn policy(attempts: u32) -> Reconnect {
    Reconnect { attempts, backoff: Duration::from_millis(2), max_backoff: Duration::from_millis(8) }
}

#[test]
fn a_failed_connection_is_made_again_and_a_gone_server_spends_the_tries() {
    let at: SocketAddr = "10.87.0.1:7000".parse().unwrap();
    let srv = server("10.87.0.1:7000");
    let (d, rx) = dialer("10.87.0.2:7000", at, policy(3), 0);
    assert_eq!(next(&rx), Heard::Connected(TOKEN));
    // The connection's QPs fail: closed, then made again.
    assert!(faults::fail_qps(at) >= 1, "the client's QP at least");
    assert_eq!(next(&rx), Heard::Closed);
    assert_eq!(next(&rx), Heard::Redial { attempt: 1, failed: false });
    assert_eq!(next(&rx), Heard::Connected(TOKEN));
    // The server goes: the connection closes, and every try fails until the three are spent.
    srv.shutdown().unwrap();
    assert_eq!(next(&rx), Heard::Closed);
    assert_eq!(next(&rx), Heard::Redial { attempt: 1, failed: false });
    assert_eq!(next(&rx), Heard::Redial { attempt: 2, failed: true });
    assert_eq!(next(&rx), Heard::Redial { attempt: 3, failed: true });
    assert_eq!(next(&rx), Heard::Failed(TOKEN), "the connect ends once");
    assert!(rx.recv_timeout(Duration::from_millis(50)).is_err(), "and nothing follows");
    d.shutdown().unwrap();
}

#[test]
fn a_server_back_during_the_tries_is_reached_and_a_local_close_ends_the_policy() {
    let at: SocketAddr = "10.87.0.3:7000".parse().unwrap();
    // Nobody listens yet: the first connect fails, and the tries go on (backoff to 8 ms).
    let (d, rx) = dialer("10.87.0.4:7000", at, policy(1000), 1);
    assert_eq!(next(&rx), Heard::Redial { attempt: 1, failed: true });
    let srv = server("10.87.0.3:7000");
    loop {
        match next(&rx) {
            Heard::Redial { failed: true, .. } => continue,
            Heard::Connected(t) => {
                assert_eq!(t, TOKEN);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    // The dialer closes it itself (close_after = 1): not made again.
    assert_eq!(next(&rx), Heard::Closed);
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "no redial after a local close");
    d.shutdown().unwrap();
    srv.shutdown().unwrap();
}

/// What a client hears, as `Heard` (events it does not expect fail the test).
fn client_next(c: &mut Client) -> Heard {
    match c.wait(HANG) {
        Some(Event::Connected { info, .. }) => Heard::Connected(info.token),
        Some(Event::Closed { .. }) => Heard::Closed,
        Some(Event::Redial { token, attempt, failed, .. }) => {
            assert_eq!(token, TOKEN);
            Heard::Redial { attempt, failed: failed.is_some() }
        }
        Some(Event::ConnectFailed { token, .. }) => Heard::Failed(token),
        other => panic!("the client heard {other:?}"),
    }
}

/// A `Client` has the handler's policy (`Client::connect_with`): its connection made again
/// after its QPs fail, each step an `Event::Redial`, the tries spent once its server is gone
/// (one `ConnectFailed`), a token already under a policy refused, and the policy ended by
/// `stop_reconnecting`. Before, a client's connect was never made again.
#[test]
fn a_clients_connect_under_a_policy_is_made_again_and_ends_once() {
    let at: SocketAddr = "10.87.0.5:7000".parse().unwrap();
    let srv = server("10.87.0.5:7000");
    // (an engine whose handler only accepts: its client dials)
    let mut d = server("10.87.0.6:7000");
    let mut c = d.client(0).unwrap();
    c.connect_with(at, b"", TOKEN, policy(3)).unwrap();
    assert_eq!(client_next(&mut c), Heard::Connected(TOKEN));
    c.connect_with(at, b"", TOKEN, policy(3)).unwrap();
    match c.wait(HANG) {
        Some(Event::ConnectFailed { token, error: EngineError::TokenInUse(t) }) => {
            assert_eq!((token, t), (TOKEN, TOKEN))
        }
        other => panic!("a second connect with the token: {other:?}"),
    }
    assert!(faults::fail_qps(at) >= 1);
    assert_eq!(client_next(&mut c), Heard::Closed);
    assert_eq!(client_next(&mut c), Heard::Redial { attempt: 1, failed: false });
    assert_eq!(client_next(&mut c), Heard::Connected(TOKEN));
    srv.shutdown().unwrap();
    assert_eq!(client_next(&mut c), Heard::Closed);
    assert_eq!(client_next(&mut c), Heard::Redial { attempt: 1, failed: false });
    assert_eq!(client_next(&mut c), Heard::Redial { attempt: 2, failed: true });
    assert_eq!(client_next(&mut c), Heard::Redial { attempt: 3, failed: true });
    assert_eq!(client_next(&mut c), Heard::Failed(TOKEN), "the connect ends once");
    assert!(c.wait(Duration::from_millis(50)).is_none(), "and nothing follows");
    // A policy stopped before its connection closes: the close is the end.
    let srv = server("10.87.0.5:7000");
    c.connect_with(at, b"", TOKEN, policy(3)).unwrap();
    assert_eq!(client_next(&mut c), Heard::Connected(TOKEN));
    c.stop_reconnecting(TOKEN).unwrap();
    assert!(faults::fail_qps(at) >= 1);
    assert_eq!(client_next(&mut c), Heard::Closed);
    assert!(c.wait(Duration::from_millis(100)).is_none(), "not made again");
    drop(c);
    d.shutdown().unwrap();
    srv.shutdown().unwrap();
}
