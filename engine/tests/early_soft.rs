//! A connection's receives are posted before the connection manager's exchange, so a peer
//! that sends the moment its side is up never meets a receiver-not-ready NAK, however late
//! the accepting worker hears of the connection. Here the accepting control core learns late
//! that each connection is up (a soft plan's `cm_delay_us` on the listener: the connector's
//! confirmation reaches it 50 ms after the connector's side is up, as a busy control core in
//! an emulated guest is late to look) while eight connections' peers send at once, with
//! `rnr_retry = 0` (the first NAK would fail the send and close the connection): every message
//! arrives, in order, after its connection's `on_connected`, and the worker counts those that
//! came before it knew of their connection (`Metrics::early_receives`). Before, the accepting
//! worker posted a connection's receives when it took the connection over: this test's sends
//! failed with `IBV_WC_RNR_RETRY_EXC_ERR`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::soft::{faults, Soft};
use corelink_engine::verbs::{chain, WcStatus};
use corelink_engine::*;

const HANG: Duration = Duration::from_secs(30);
const CONNS: u64 = 8;
const MSGS: u8 = 3;

/// What the accepting side saw, in order.
#[derive(Debug)]
enum Seen {
    Connected(ConnId),
    Message(ConnId, Vec<u8>),
    Closed(ConnId, CloseReason),
}

/// Accepts; tells the test what it sees.
struct Watcher(mpsc::Sender<Seen>);

impl Handler<Soft> for Watcher {
    fn on_connected(&mut self, _cx: &mut Cx<Soft>, conn: ConnId, _info: &ConnInfo) {
        let _ = self.0.send(Seen::Connected(conn));
    }

    fn on_message(&mut self, _cx: &mut Cx<Soft>, conn: ConnId, msg: &Message<'_>) {
        let _ = self.0.send(Seen::Message(conn, msg.data.to_vec()));
    }

    fn on_closed(&mut self, _cx: &mut Cx<Soft>, conn: ConnId, reason: &CloseReason) {
        let _ = self.0.send(Seen::Closed(conn, *reason));
    }
}

/// Connects `CONNS` times at start; sends `MSGS` messages on each connection as it opens.
struct Eager {
    to: SocketAddr,
    failures: mpsc::Sender<String>,
}

impl Handler<Soft> for Eager {
    fn on_connected(&mut self, cx: &mut Cx<Soft>, conn: ConnId, info: &ConnInfo) {
        for m in 0..MSGS {
            let mut b = cx.alloc(2).unwrap();
            b.fill(&[info.token as u8, m]).unwrap();
            cx.send(conn, b, None, u64::from(m)).map_err(|(_, e)| e).unwrap();
        }
    }

    fn on_completion(&mut self, _cx: &mut Cx<Soft>, done: Done<Buf<Soft>>) {
        if done.status != WcStatus::Success {
            let _ = self.failures.send(format!("a send ended with {:?}", done.status));
        }
    }

    fn on_connect_failed(&mut self, _cx: &mut Cx<Soft>, token: u64, error: &EngineError) {
        let _ = self.failures.send(format!("connect {token}: {}", chain(error)));
    }

    fn on_closed(&mut self, _cx: &mut Cx<Soft>, conn: ConnId, reason: &CloseReason) {
        let _ = self.failures.send(format!("{conn} closed: {reason}"));
    }

    fn poll(&mut self, cx: &mut Cx<Soft>) {
        if cx.metrics().polls == 1 {
            for token in 0..CONNS {
                cx.connect(self.to, b"", token).unwrap();
            }
        }
    }
}

fn map(listen: Option<&str>) -> corelink_config::Validated {
    let listen = listen.map(|a| format!("listen = \"{a}\"\n")).unwrap_or_default();
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\n{listen}\
         [worker]\nidle_after_us = 1000\nrnr_retry = 0\nmin_rnr_timer = 1"
    );
    parse(&text).unwrap().validate(&MachineTopology::load().unwrap()).unwrap()
}

#[test]
fn a_peer_that_sends_at_once_finds_receives_posted_while_the_control_core_is_late() {
    let at: SocketAddr = "10.79.0.1:7000".parse().unwrap();
    faults::plan_at(at, faults::FaultPlan { cm_delay_us: 50_000, ..Default::default() });
    let (tx, seen) = mpsc::channel();
    let listen = map(Some("10.79.0.1:7000"));
    let server =
        Engine::<Soft>::start(&listen, Placement::RoundRobin, move |_| Watcher(tx.clone()))
            .unwrap();
    let (ftx, failures) = mpsc::channel();
    let client = Engine::<Soft>::start(&map(None), Placement::RoundRobin, move |_| Eager {
        to: at,
        failures: ftx.clone(),
    })
    .unwrap();
    let mut connected = Vec::new();
    let mut got: HashMap<ConnId, Vec<Vec<u8>>> = HashMap::new();
    let deadline = Instant::now() + HANG;
    while got.values().map(Vec::len).sum::<usize>() < (CONNS * u64::from(MSGS)) as usize {
        if let Ok(f) = failures.try_recv() {
            panic!("the connecting side failed: {f}");
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match seen.recv_timeout(left.min(Duration::from_millis(50))) {
            Ok(Seen::Connected(c)) => connected.push(c),
            Ok(Seen::Message(c, data)) => {
                assert!(connected.contains(&c), "{c}'s message came before its on_connected");
                got.entry(c).or_default().push(data);
            }
            Ok(Seen::Closed(c, why)) => panic!("{c} closed: {why}"),
            Err(_) => assert!(Instant::now() < deadline, "only {got:?} arrived"),
        }
    }
    assert_eq!(got.len() as u64, CONNS);
    for msgs in got.values() {
        let order: Vec<u8> = msgs.iter().map(|m| m[1]).collect();
        assert_eq!(order, (0..MSGS).collect::<Vec<_>>(), "in order on each connection");
    }
    // (the metrics are published every few thousand iterations)
    let early = || server.metrics().iter().map(|m| m.early_receives).sum::<u64>();
    while early() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(early() >= 1, "messages came while the control core was slow to hand over");
    assert!(failures.try_recv().is_err());
    client.shutdown().unwrap();
    server.shutdown().unwrap();
}

/// The worker's answer to connects that fail after their receives were posted (nobody
/// listens): each fails once, and its slot and QPs come back (a worker of two slots then
/// makes two connections; every QP is back in the pool).
#[test]
fn connects_that_fail_after_their_receives_were_posted_give_back_slot_and_qps() {
    let text = "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\n\
                [worker]\nidle_after_us = 1000\nmax_conns = 2\n[worker.qps]\npool = 2";
    let v = parse(text).unwrap().validate(&MachineTopology::load().unwrap()).unwrap();
    let mut client_engine = Engine::<Soft>::start(&v, Placement::RoundRobin, |_| Nothing).unwrap();
    let (tx, _seen) = mpsc::channel();
    let server = Engine::<Soft>::start(&map(Some("10.79.0.2:7000")), Placement::RoundRobin, {
        move |_| Watcher(tx.clone())
    });
    let server = server.unwrap();
    let mut client = client_engine.client(0).unwrap();
    let nobody: SocketAddr = "10.79.0.3:7000".parse().unwrap();
    for token in 0..20 {
        client.connect(nobody, b"", token).unwrap();
        match client.wait(HANG) {
            Some(Event::ConnectFailed { token: t, .. }) => assert_eq!(t, token),
            other => panic!("connect {token}: {other:?}"),
        }
    }
    let to = server.listen_addr().unwrap();
    for token in 100..102 {
        client.connect(to, b"", token).unwrap();
        match client.wait(HANG) {
            Some(Event::Connected { info, .. }) => assert_eq!(info.token, token),
            other => panic!("connect {token}: {other:?}"),
        }
    }
    let deadline = Instant::now() + HANG;
    loop {
        let w = client_engine.control_metrics().workers[0];
        if w.connections == 2 && w.qps_live == w.qps_pooled + 2 {
            break;
        }
        assert!(Instant::now() < deadline, "QPs not back: {w:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let misses: u64 = client_engine.metrics().iter().map(|m| m.invariant_misses).sum();
    assert_eq!(misses, 0);
    drop(client);
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
}

/// Does nothing.
struct Nothing;

impl Handler<Soft> for Nothing {}

/// Greets each connection it accepts with `MSGS` messages at once, and echoes what comes.
struct Greeter;

impl Handler<Soft> for Greeter {
    fn on_connected(&mut self, cx: &mut Cx<Soft>, conn: ConnId, _info: &ConnInfo) {
        for m in 0..MSGS {
            let mut b = cx.alloc(1).unwrap();
            b.fill(&[m]).unwrap();
            cx.send(conn, b, None, 0).map_err(|(_, e)| e).unwrap();
        }
    }

    fn on_message(&mut self, cx: &mut Cx<Soft>, conn: ConnId, msg: &Message<'_>) {
        let mut b = cx.alloc(msg.data.len()).unwrap();
        b.fill(msg.data).unwrap();
        cx.send(conn, b, None, 0).map_err(|(_, e)| e).unwrap();
    }
}

/// An external client hears of its connection from the control core, before the worker takes
/// it over: the connection's events still all come after `Event::Connected` (the accepting
/// side sends at once), and a request submitted the moment it is told of the connection is
/// taken (it waits in the worker for the handover), never refused.
#[test]
fn a_client_told_of_its_connection_first_hears_its_events_after_and_submits_at_once() {
    let server =
        Engine::<Soft>::start(&map(Some("10.79.0.4:7000")), Placement::RoundRobin, |_| Greeter)
            .unwrap();
    let client_map = map(None);
    // (what the worker posts on a one-lane connection, which the control core tells)
    let recvs_per_lane = client_map.map.worker.recvs_per_lane(1);
    let mut client_engine =
        Engine::<Soft>::start(&client_map, Placement::RoundRobin, |_| Nothing).unwrap();
    let mut client = client_engine.client(0).unwrap();
    let to = server.listen_addr().unwrap();
    const ROUNDS: u64 = 4;
    let (mut connected, mut messages, mut done) = (Vec::new(), HashMap::new(), 0);
    for round in 0..ROUNDS {
        for token in 0..CONNS {
            client.connect(to, b"", round * CONNS + token).unwrap();
        }
        let want = (round + 1) * CONNS;
        let deadline = Instant::now() + HANG;
        while done < want || messages.values().sum::<u64>() < want * (u64::from(MSGS) + 1) {
            match client.wait(deadline.saturating_duration_since(Instant::now())) {
                Some(Event::Connected { conn, info }) => {
                    assert_eq!((info.lanes, info.recvs_per_lane), (1, recvs_per_lane));
                    assert!(info.initiated, "{info:?}");
                    connected.push(conn);
                    let echo = Op::Send { buf: b"echo".to_vec(), imm: None };
                    client.submit(conn, echo, 0).map_err(|(_, e)| e).unwrap();
                }
                Some(Event::Message { conn, .. }) => {
                    assert!(connected.contains(&conn), "{conn}'s message came before Connected");
                    *messages.entry(conn).or_insert(0u64) += 1;
                }
                Some(Event::Done(d)) => {
                    assert!(d.status.is_success(), "{d:?}");
                    done += 1;
                }
                other => panic!("round {round}: {other:?}"),
            }
        }
    }
    assert_eq!(connected.len() as u64, ROUNDS * CONNS);
    assert!(messages.values().all(|&n| n == u64::from(MSGS) + 1), "{messages:?}");
    for conn in connected {
        client.close(conn).unwrap();
    }
    let misses: u64 = client_engine.metrics().iter().map(|m| m.invariant_misses).sum();
    assert_eq!(misses, 0);
    drop(client);
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
}
