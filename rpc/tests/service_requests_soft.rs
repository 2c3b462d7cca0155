//! A service's own one-sided requests on its sessions (`Rpc::conn`, `Rpc::submit`,
//! `Service::on_completion`), on `soft`: the server grants a range of its memory to a session's
//! connection and hands its address in an RPC; the client reads it with one RDMA read submitted
//! through the endpoint, and hears the completion with its own token (before, a service heard
//! no completion of its own requests: the endpoint took them all). A send, a token beyond
//! `MAX_SERVICE_TOKEN` and a session that does not exist are refused with typed errors.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::mpsc::{channel, Sender};
use std::time::Duration;

use corelink_config::{parse, StaticTopology, Validated};
use corelink_engine::verbs::soft::Soft;
use corelink_engine::verbs::{AccessFlags, RemoteAddr, RemoteRegion, WcStatus};
use corelink_engine::{Buf, Done, Engine, Memory, Op, Placement};
use corelink_rpc::{
    Endpoint, EndpointConfig, Reject, ReqType, Rpc, RpcError, RpcHandler, Service, SessionEnd,
    SessionEvent, SessionId, MAX_SERVICE_TOKEN,
};

const HANG: Duration = Duration::from_secs(30);
/// Answers the granted range's address, length and key (8 + 8 + 4 bytes, little-endian).
const WHERE: ReqType = ReqType(1);
const PATTERN: &[u8] = b"memory the server granted to this session only";

fn map(listen: &str) -> Validated {
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000\n"
    );
    parse(&text).unwrap().validate(&StaticTopology::uniform(4)).unwrap()
}

/// The server's service: grants its memory to each session it accepts.
struct Granting {
    mem: Option<Memory<Soft>>,
    region: Rc<Cell<Option<RemoteRegion>>>,
}

impl Service<Soft> for Granting {
    fn on_session(&mut self, rpc: &mut Rpc<'_, Soft>, session: SessionId, event: SessionEvent) {
        if event != SessionEvent::Accepted {
            return;
        }
        if self.mem.is_none() {
            let mem = rpc.cx().register_memory(4096, false).unwrap();
            mem.write_at(0, PATTERN).unwrap();
            self.mem = Some(mem);
        }
        let conn = rpc.conn(session).expect("an accepted session has its connection");
        let Some(mem) = &self.mem else { return };
        let grant = rpc.cx().grant(conn, mem, 0, PATTERN.len(), AccessFlags::REMOTE_READ).unwrap();
        self.region.set(Some(grant.region));
    }
}

/// What the client's service tells the test.
#[derive(Debug)]
enum Heard {
    Refusals(Vec<String>),
    Read { token: u64, status: WcStatus, bytes: Vec<u8> },
}

/// The client's service: connects, asks where the memory is, reads it.
struct Reading {
    target: SocketAddr,
    started: bool,
    tx: Sender<Heard>,
}

impl Service<Soft> for Reading {
    fn poll(&mut self, rpc: &mut Rpc<'_, Soft>) {
        if !std::mem::replace(&mut self.started, true) {
            rpc.connect(self.target).unwrap();
        }
    }

    fn on_session(&mut self, rpc: &mut Rpc<'_, Soft>, session: SessionId, event: SessionEvent) {
        if event != SessionEvent::Connected {
            return;
        }
        // Refusals first: a send, a token too large, a session that is not there.
        let mut refusals = Vec::new();
        let buf = rpc.cx().alloc(8).unwrap();
        match rpc.submit(session, Op::Send { buf, imm: None }, 1) {
            Err((_, e @ RpcError::SendOnSession(_))) => refusals.push(e.to_string()),
            other => panic!("a send was not refused: {:?}", other.err().map(|e| e.1)),
        }
        let buf = rpc.cx().alloc(8).unwrap();
        let remote = RemoteAddr::default();
        match rpc.submit(session, Op::Read { buf, remote }, MAX_SERVICE_TOKEN + 1) {
            Err((_, e @ RpcError::ServiceToken { .. })) => refusals.push(e.to_string()),
            other => panic!("a large token was not refused: {:?}", other.err().map(|e| e.1)),
        }
        let _ = self.tx.send(Heard::Refusals(refusals));
        rpc.call(session, WHERE, b"", HANG, move |rpc, r| {
            let r = r.expect("where is the memory");
            let (addr, rkey) = (
                u64::from_le_bytes(r[0..8].try_into().unwrap()),
                u32::from_le_bytes(r[16..20].try_into().unwrap()),
            );
            let buf = rpc.cx().alloc(PATTERN.len()).unwrap();
            let remote = RemoteAddr { addr, rkey };
            rpc.submit(session, Op::Read { buf, remote }, MAX_SERVICE_TOKEN)
                .map_err(|e| e.1)
                .unwrap();
        })
        .unwrap();
    }

    fn on_completion(&mut self, _rpc: &mut Rpc<'_, Soft>, done: Done<Buf<Soft>>) {
        let bytes = done.buf.as_ref().map(|b| b.as_slice().to_vec()).unwrap_or_default();
        let _ = self.tx.send(Heard::Read { token: done.token, status: done.status, bytes });
    }
}

#[test]
fn a_service_reads_granted_memory_through_its_session_and_hears_the_completion() {
    let server_map = map("10.79.0.1:7000");
    let res = server_map.map.worker.clone();
    let server = Engine::<Soft>::start(&server_map, Placement::RoundRobin, move |_| {
        let mut ep = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
        let region = Rc::new(Cell::new(None));
        let seen = region.clone();
        ep.register(WHERE, move |_, resp| {
            let r: RemoteRegion = seen.get().ok_or(Reject(1))?;
            let mut out = [0u8; 20];
            out[0..8].copy_from_slice(&r.addr.to_le_bytes());
            out[8..16].copy_from_slice(&r.len.to_le_bytes());
            out[16..20].copy_from_slice(&r.rkey.to_le_bytes());
            resp.write(&out).map_err(|_| Reject(2))
        })
        .unwrap();
        RpcHandler::new(ep, Granting { mem: None, region })
    })
    .unwrap();
    let client_map = map("10.79.0.2:7000");
    let res = client_map.map.worker.clone();
    let (tx, rx) = channel();
    let target: SocketAddr = "10.79.0.1:7000".parse().unwrap();
    let client = Engine::<Soft>::start(&client_map, Placement::RoundRobin, move |_| {
        let ep = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
        RpcHandler::new(ep, Reading { target, started: false, tx: tx.clone() })
    })
    .unwrap();
    match rx.recv_timeout(HANG).unwrap() {
        Heard::Refusals(r) => {
            assert_eq!(r.len(), 2, "{r:?}");
            assert!(
                r[0].contains("sends go as calls") && r[1].contains("MAX_SERVICE_TOKEN"),
                "{r:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    match rx.recv_timeout(HANG).unwrap() {
        Heard::Read { token, status, bytes } => {
            assert_eq!((token, status), (MAX_SERVICE_TOKEN, WcStatus::Success));
            assert_eq!(bytes, PATTERN);
        }
        other => panic!("{other:?}"),
    }
    client.shutdown().unwrap();
    server.shutdown().unwrap();
}

/// Connects to nowhere, and tells the test why its session ended.
struct Nowhere {
    started: bool,
    tx: Sender<String>,
}

impl Service<Soft> for Nowhere {
    fn poll(&mut self, rpc: &mut Rpc<'_, Soft>) {
        if !std::mem::replace(&mut self.started, true) {
            rpc.connect("10.79.0.9:1".parse().unwrap()).unwrap();
        }
    }

    fn on_session_end(&mut self, _rpc: &mut Rpc<'_, Soft>, _s: SessionId, end: SessionEnd<'_>) {
        let kind = match end {
            SessionEnd::ConnectFailed(_) => "connect failed",
            SessionEnd::Closed(_) => "closed",
        };
        let _ = self.tx.send(format!("{kind}: {end}"));
    }
}

/// A session whose connect fails ends with `Closed` and then the engine's error, whole.
#[test]
fn a_failed_connect_tells_the_service_why() {
    let m = map("10.79.0.3:7000");
    let res = m.map.worker.clone();
    let (tx, rx) = channel();
    let engine = Engine::<Soft>::start(&m, Placement::RoundRobin, move |_| {
        let ep = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
        RpcHandler::new(ep, Nowhere { started: false, tx: tx.clone() })
    })
    .unwrap();
    let why = rx.recv_timeout(HANG).unwrap();
    assert!(why.starts_with("connect failed: its connect failed"), "{why}");
    assert!(why.contains("10.79.0.9:1"), "{why}");
    engine.shutdown().unwrap();
}
