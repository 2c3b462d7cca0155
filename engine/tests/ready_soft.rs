//! A connection between engines is reported to its connecting side only once the accepting
//! worker has posted its receives (its ready message, `READY_IMM`): here the accepting
//! worker is slow to take new connections up (its handler sleeps in every poll until it has
//! one) and neither side retries a send that finds no receive (`rnr_retry = 0`). The
//! connector's first message, sent the moment it hears of the connection, arrives (before,
//! it met the accepting QP without receives and failed with `RnrRetryExcErr`).

use std::sync::mpsc;
use std::time::Duration;

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::soft::Soft;
use corelink_engine::verbs::WcStatus;
use corelink_engine::*;

const HANG: Duration = Duration::from_secs(30);

/// Slow until its first connection; tells the test each message.
struct Sleepy {
    connected: bool,
    tx: mpsc::Sender<Vec<u8>>,
}

impl Handler<Soft> for Sleepy {
    fn poll(&mut self, _cx: &mut Cx<Soft>) {
        if !self.connected {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn on_connected(&mut self, _cx: &mut Cx<Soft>, _conn: ConnId, _info: &ConnInfo) {
        self.connected = true;
    }

    fn on_message(&mut self, _cx: &mut Cx<Soft>, _conn: ConnId, msg: &Message<'_>) {
        let _ = self.tx.send(msg.data.to_vec());
    }
}

fn map(listen: &str) -> corelink_config::Validated {
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000\nrnr_retry = 0"
    );
    parse(&text).unwrap().validate(&MachineTopology::load().unwrap()).unwrap()
}

#[test]
fn the_first_message_finds_the_slow_acceptors_receives() {
    for round in 0..5 {
        let (tx, rx) = mpsc::channel();
        let server = Engine::<Soft>::start(&map("10.82.0.1:7000"), Placement::RoundRobin, {
            move |_| Sleepy { connected: false, tx: tx.clone() }
        })
        .unwrap();
        let (tx2, _rx2) = mpsc::channel();
        let mut client_engine =
            Engine::<Soft>::start(&map("10.82.0.2:7000"), Placement::RoundRobin, move |_| Sleepy {
                connected: true,
                tx: tx2.clone(),
            })
            .unwrap();
        let mut client = client_engine.client(0).unwrap();
        client.connect("10.82.0.1:7000".parse().unwrap(), b"", 1).unwrap();
        let conn = match client.wait(HANG) {
            Some(Event::Connected { conn, .. }) => conn,
            other => panic!("round {round}: no connection: {other:?}"),
        };
        client.submit(conn, Op::Send { buf: b"first".to_vec(), imm: None }, 2).unwrap();
        match client.wait(HANG) {
            Some(Event::Done(d)) => assert_eq!(d.status, WcStatus::Success, "round {round}"),
            other => panic!("round {round}: the first send: {other:?}"),
        }
        assert_eq!(rx.recv_timeout(HANG).unwrap(), b"first");
        drop(client);
        client_engine.shutdown().unwrap();
        server.shutdown().unwrap();
    }
}
