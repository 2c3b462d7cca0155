//! Peers that are not engines (plain rdma_cm programs), on `soft`: a connection request
//! without the engine's header is rejected by default, with the reason in the reject and
//! counted (before, it was taken for a one-lane engine connection with no data); with
//! `accept_foreign = true` it becomes a one-lane connection whose private data is the peer's
//! whole private data, on which sends work both ways. A plain peer that never disconnects
//! keeps a refused request's close waiting (`worker.peer_grace_ms`) until the engine's shutdown.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::soft::Soft;
use corelink_engine::verbs::{
    AccessFlags, Connection, Context, Cq, Error as VerbsError, Mr, Pd, Provider, Qp, QpAttr, QpCap,
    QpInitAttr, QpState, QpType, RecvWr, SendOp, SendWr, Wc, WcStatus,
};
use corelink_engine::*;

const HANG: Duration = Duration::from_secs(30);
/// What the plain peer puts in its request: anything but an engine header.
const HELLO: &[u8] = b"GET / HTTP/1.1\r\n";

/// Tells the test what it hears; echoes every message.
struct Echo(mpsc::Sender<String>);

impl Handler<Soft> for Echo {
    fn on_connected(&mut self, _cx: &mut Cx<Soft>, _conn: ConnId, info: &ConnInfo) {
        let data = String::from_utf8_lossy(&info.private_data).into_owned();
        let _ = self.0.send(format!("connected {data:?} recv_size={:?}", info.peer_recv_size));
    }

    fn on_message(&mut self, cx: &mut Cx<Soft>, conn: ConnId, msg: &Message<'_>) {
        let _ = self.0.send(format!("message {}", String::from_utf8_lossy(msg.data)));
        let mut b = cx.alloc(msg.data.len()).unwrap();
        b.fill(msg.data).unwrap();
        cx.send(conn, b, None, 1).map_err(|(_, e)| e).unwrap();
    }
}

/// An engine listening on `listen`, with `extra` lines at the map's top and `worker` lines in
/// its `[worker]` table.
fn engine(listen: &str, extra: &str, worker: &str) -> (Engine<Soft>, mpsc::Receiver<String>) {
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n{extra}\n\
         [worker]\nidle_after_us = 1000\n{worker}"
    );
    let v = parse(&text).unwrap().validate(&MachineTopology::load().unwrap()).unwrap();
    let (tx, rx) = mpsc::channel();
    (Engine::<Soft>::start(&v, Placement::RoundRobin, move |_| Echo(tx.clone())).unwrap(), rx)
}

/// A plain verbs program: a context, a CQ, an RC QP and a region.
struct Plain {
    ctx: <Soft as Provider>::Context,
    cq: <Soft as Provider>::Cq,
    qp: <Soft as Provider>::Qp,
    mr: <Soft as Provider>::Mr,
    _pd: <Soft as Provider>::Pd,
}

impl Plain {
    fn new() -> Plain {
        let ctx = Soft::open("soft0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let attr = QpInitAttr::<Soft> {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: true,
        };
        let qp = pd.create_qp(&attr).unwrap();
        Plain { ctx, cq, qp, mr, _pd: pd }
    }

    /// Listens at `at` and has client `c` connect to it: the listener, and the engine's
    /// connection request, not yet answered.
    fn dialed_by(
        &self,
        c: &mut Client,
        at: &str,
    ) -> (<Soft as Provider>::Listener, <Soft as Provider>::ConnRequest) {
        let mut l = self.ctx.listen(at.parse().unwrap()).unwrap();
        c.connect(corelink_engine::verbs::Listener::local_addr(&l), b"", 1).unwrap();
        let req = corelink_engine::verbs::Listener::get_request(&mut l, HANG)
            .unwrap()
            .expect("a request");
        (l, req)
    }

    /// Accepts `req` (the engine's, from [`Plain::dialed_by`]) with `data`, and waits for
    /// client `c` to hear its connection: the server's side, the connection and what the
    /// engine knows of it.
    fn accept(
        &mut self,
        c: &mut Client,
        req: <Soft as Provider>::ConnRequest,
        data: &[u8],
    ) -> (<Soft as Provider>::Connection, ConnId, ConnInfo) {
        let server = corelink_engine::verbs::ConnRequest::accept(
            req,
            &mut self.qp,
            &QpAttr::default(),
            data,
        )
        .unwrap();
        match c.wait(HANG) {
            Some(Event::Connected { conn, info }) => (server, conn, info),
            ev => panic!("{ev:?}"),
        }
    }

    fn wait(&self) -> Wc {
        let deadline = Instant::now() + HANG;
        let mut wc = [Wc::default()];
        while self.cq.poll(&mut wc).unwrap() == 0 {
            assert!(Instant::now() < deadline, "no completion");
            std::thread::yield_now();
        }
        wc[0]
    }
}

fn heard(rx: &mpsc::Receiver<String>) -> String {
    rx.recv_timeout(HANG).expect("the handler heard something")
}

#[test]
fn a_request_without_the_engine_header_is_rejected_with_the_reason() {
    let (e, rx) = engine("10.99.8.1:0", "", "");
    let addr: SocketAddr = e.listen_addr().unwrap();
    let mut p = Plain::new();
    let err = p.ctx.connect(addr, &mut p.qp, &QpAttr::default(), HELLO, HANG).unwrap_err();
    let VerbsError::Rejected { private_data, .. } = &err else { panic!("{err}") };
    let why = String::from_utf8_lossy(private_data);
    assert!(why.contains("no corelink engine header") && why.contains("accept_foreign"), "{why}");
    let deadline = Instant::now() + HANG;
    while e.control_metrics().foreign_refused != 1 {
        assert!(Instant::now() < deadline, "{}", e.control_metrics());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(rx.try_recv().is_err(), "the handler heard nothing of it");
    e.shutdown().unwrap();
}

#[test]
fn accept_foreign_makes_a_plain_peer_a_one_lane_connection() {
    let (e, rx) = engine("10.99.8.2:0", "accept_foreign = true", "");
    let addr: SocketAddr = e.listen_addr().unwrap();
    let mut p = Plain::new();
    // The echo's receive, posted in INIT (before the connection can carry anything).
    p.qp.modify(&QpAttr { state: QpState::Init, ..QpAttr::default() }).unwrap();
    let into = p.mr.sge(1024, 64).unwrap();
    // SAFETY: the region outlives the QP's receive (both live to the end of the test).
    unsafe { p.qp.post_recv(&[RecvWr { wr_id: 2, sgl: std::slice::from_ref(&into) }]) }.unwrap();
    let conn = p.ctx.connect(addr, &mut p.qp, &QpAttr::default(), HELLO, HANG).unwrap();
    assert_eq!(conn.peer_private_data(), b"", "answered with no engine header");
    assert_eq!(
        heard(&rx),
        format!("connected {:?} recv_size=None", String::from_utf8_lossy(HELLO))
    );
    p.mr.write_at(0, b"hello").unwrap();
    let hello = p.mr.sge(0, 5).unwrap();
    // SAFETY: the region outlives the send, whose completion is polled below.
    unsafe { p.qp.post_send(&[SendWr::new(1, SendOp::Send, std::slice::from_ref(&hello))]) }
        .unwrap();
    assert_eq!(heard(&rx), "message hello");
    let mut wcs = [p.wait(), p.wait()];
    wcs.sort_by_key(|w| w.wr_id);
    assert_eq!(
        wcs.map(|w| (w.wr_id, w.status, w.byte_len)),
        [(1, WcStatus::Success, 5), (2, WcStatus::Success, 5)]
    );
    let mut echo = [0u8; 5];
    p.mr.read_at(1024, &mut echo).unwrap();
    assert_eq!(&echo, b"hello", "the echo");
    drop(conn);
    e.shutdown().unwrap();
}

/// A peer that sends its connection request and never confirms the accept (stalled, or
/// stopped after its request) delays nobody: another connect is accepted and up while the
/// half-open one still waits (before, the control core waited for it inside the accept, up to
/// the accept timeout, and every other connection waited behind it); when the peer gives up,
/// its lane is dropped and the handler never hears of it.
#[test]
fn a_half_open_peer_delays_no_other_connect() {
    let (mut e, rx) = engine("10.99.8.3:0", "accept_foreign = true", "");
    let addr: SocketAddr = e.listen_addr().unwrap();
    let stalled = Soft::open("soft0").unwrap().request_only(addr, b"stalled").unwrap();
    let deadline = Instant::now() + HANG;
    while e.control_metrics().accepts_waiting != 1 {
        assert!(Instant::now() < deadline, "{}", e.control_metrics());
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut c = e.client(0).unwrap();
    c.connect(addr, b"", 1).unwrap();
    assert!(matches!(c.wait(HANG), Some(Event::Connected { .. })));
    assert_eq!(heard(&rx), "connected \"\" recv_size=Some(4096)");
    // (the control core's own count of the client's accept may lag the handler's word)
    while e.control_metrics().accepts_waiting > 1 {
        assert!(Instant::now() < deadline, "{}", e.control_metrics());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(e.control_metrics().accepts_waiting, 1, "the half-open peer still waits");
    drop(stalled);
    while e.control_metrics().accepts_waiting != 0 {
        assert!(Instant::now() < deadline, "{}", e.control_metrics());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(rx.try_recv().is_err(), "the handler heard nothing of the half-open peer");
    e.shutdown().unwrap();
}

/// The engine connecting to a plain rdma_cm server (no engine header in its accept): a
/// one-lane connection with the server's private data and no receive size, on which a send
/// arrives.
#[test]
fn an_engine_connects_to_a_plain_server() {
    let (mut e, _rx) = engine("10.99.8.4:0", "", "");
    let mut p = Plain::new();
    let mut c = e.client(0).unwrap();
    let (_l, req) = p.dialed_by(&mut c, "10.99.8.5:0");
    // The server's receive for the client's send, posted in INIT before the accept.
    p.qp.modify(&QpAttr { state: QpState::Init, ..QpAttr::default() }).unwrap();
    let into = p.mr.sge(0, 64).unwrap();
    // SAFETY: the region outlives the QP's receive (both live to the end of the test).
    unsafe { p.qp.post_recv(&[RecvWr { wr_id: 7, sgl: std::slice::from_ref(&into) }]) }.unwrap();
    let (_server, conn, info) = p.accept(&mut c, req, b"plain");
    assert_eq!(&info.private_data[..5], b"plain");
    assert_eq!(info.peer_recv_size, None, "a plain server says nothing of its receives");
    c.submit(conn, Op::Send { buf: b"to a plain server".to_vec(), imm: None }, 2)
        .map_err(|(_, e)| e)
        .unwrap();
    assert!(matches!(c.wait(HANG), Some(Event::Done(d)) if d.status == WcStatus::Success));
    let wc = p.wait();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (7, WcStatus::Success, 17));
    let mut got = [0u8; 17];
    p.mr.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"to a plain server");
    drop(c);
    e.shutdown().unwrap();
}

/// A write a plain server refuses (no memory of its own is exposed: any key is bad) closes the
/// engine's connection; with a long `worker.peer_grace_ms` the close waits for the server's
/// disconnect, which a plain program that does not react never sends: the engine's shutdown
/// ends the wait (well before the grace), and the close is named for the refusal.
#[test]
fn a_shutdown_ends_a_close_waiting_for_a_peer_that_never_disconnects() {
    let (mut e, _rx) = engine("10.99.8.6:0", "", "peer_grace_ms = 60000");
    let mut p = Plain::new();
    let mut c = e.client(0).unwrap();
    let (_l, req) = p.dialed_by(&mut c, "10.99.8.7:0");
    let (_server, conn, _) = p.accept(&mut c, req, b"");
    let remote = corelink_engine::verbs::RemoteAddr { addr: 4096, rkey: 77 };
    c.submit(conn, Op::Write { buf: vec![1; 8], remote, imm: None }, 2)
        .map_err(|(_, e)| e)
        .unwrap();
    match c.wait(HANG) {
        Some(Event::Done(d)) => assert_eq!((d.token, d.status), (2, WcStatus::RemAccessErr)),
        ev => panic!("{ev:?}"),
    }
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || done_tx.send(e.shutdown().map(|_| ())));
    let closed = loop {
        match c.wait(HANG) {
            Some(Event::Closed { conn: id, reason }) if id == conn => break reason,
            Some(_) => {}
            None => panic!("no close"),
        }
    };
    assert_eq!(closed, CloseReason::Error(WcStatus::RemAccessErr), "{closed}");
    let shut = done_rx.recv_timeout(HANG).expect("the shutdown did not wait out the grace");
    shut.unwrap();
}
