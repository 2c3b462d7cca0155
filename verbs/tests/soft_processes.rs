//! `soft` across processes (`CORELINK_SOFT_FABRIC`): each test runs its peer as a second
//! process (this test binary again, running `peer` with the scenario in its environment),
//! connected by `soft`'s connection manager, and checks what both ends see.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corelink_verbs::soft::{faults, Soft};
use corelink_verbs::{
    AccessFlags, CmEvent, ConnRequest, Connection, Context, Cq, Error, Listener, Mr, Pd, Provider,
    Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType, RecvWr, RemoteRegion, SendOp, SendWr, Wc,
    WcOpcode, WcStatus,
};

const SCENARIO: &str = "CORELINK_TEST_PEER";
const ADDR: &str = "CORELINK_TEST_ADDR";
/// A guard against hangs only (nothing is timed): what a step may wait at most.
const WAIT: Duration = Duration::from_secs(20);
const REGION: usize = 64 * 1024;
/// The `wr_id` of every send request (receives are numbered from 0).
const SENT: u64 = 1000;

/// Puts this process on the fabric of this test run (its peers inherit the name).
fn on_fabric() {
    corelink_verbs::soft::default_fabric(&format!("test-{}", std::process::id()));
}

fn fabric() -> String {
    std::env::var(corelink_verbs::soft::FABRIC_ENV).expect("on a fabric")
}

/// An address no other test of this run uses.
fn addr(n: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 20000 + (std::process::id() % 20000) as u16 + n))
}

/// Starts this binary again as the peer running `scenario` at `addr`.
fn spawn_peer(scenario: &str, addr: SocketAddr) -> Child {
    on_fabric();
    Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "peer", "--nocapture", "--test-threads=1"])
        .env(SCENARIO, scenario)
        .env(ADDR, addr.to_string())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the peer")
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the peer did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct End {
    ctx: <Soft as Provider>::Context,
    mr: <Soft as Provider>::Mr,
    cq: <Soft as Provider>::Cq,
    qp: <Soft as Provider>::Qp,
    pd: <Soft as Provider>::Pd,
    /// Completions polled while waiting for another (a peer's answer may come before the
    /// acknowledgement of what it answers, as on a NIC).
    early: std::collections::VecDeque<Wc>,
}

impl End {
    fn new(access: AccessFlags) -> End {
        on_fabric();
        let ctx = Soft::open("soft0").expect("open");
        let pd = ctx.alloc_pd().expect("pd");
        let cq = ctx.create_cq(256).expect("cq");
        let mr = pd.register(REGION, access).expect("register");
        let attr = QpInitAttr::<Soft> {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: true,
        };
        let qp = pd.create_qp(&attr).expect("qp");
        End { ctx, mr, cq, qp, pd, early: Default::default() }
    }

    /// The next completion.
    fn next(&mut self) -> Wc {
        if let Some(wc) = self.early.pop_front() {
            return wc;
        }
        self.poll_one()
    }

    fn poll_one(&self) -> Wc {
        let deadline = Instant::now() + WAIT;
        let mut wc = [Wc::default()];
        loop {
            if self.cq.poll(&mut wc).expect("poll") == 1 {
                return wc[0];
            }
            assert!(Instant::now() < deadline, "no completion");
            std::thread::yield_now();
        }
    }

    fn post_recv(&mut self, i: u64) {
        let sge = self.mr.sge(32 * 1024 + i as usize * 1024, 1024).expect("sge");
        // SAFETY: the region outlives the QP's receives.
        unsafe { self.qp.post_recv(&[RecvWr { wr_id: i, sgl: &[sge] }]) }.expect("post_recv");
    }

    /// Posts one request and returns its completion.
    fn run(&mut self, op: SendOp<'_, Soft>, off: usize, len: u32) -> Wc {
        let sge = self.mr.sge(off, len).expect("sge");
        // SAFETY: the region outlives the request, whose completion is polled at once.
        unsafe { self.qp.post_send(&[SendWr::new(SENT, op, &[sge])]) }.expect("post_send");
        loop {
            let wc = self.poll_one();
            if wc.wr_id == SENT {
                return wc;
            }
            self.early.push_back(wc);
        }
    }

    /// Connects to `addr`, trying again while nobody listens there yet (the peer starting).
    fn connect(&mut self, addr: SocketAddr) -> <Soft as Provider>::Connection {
        let deadline = Instant::now() + WAIT;
        loop {
            match self.ctx.connect(addr, &mut self.qp, &QpAttr::default(), b"hi", WAIT) {
                Ok(c) => return c,
                Err(Error::Rejected { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("connect: {}", corelink_verbs::chain(&e)),
            }
        }
    }
}

/// Starts the peer running `scenario` at `at` and connects to it: the peer, this end (local
/// write only), the connection and the region the peer's accept told.
fn to_peer(
    scenario: &str,
    at: SocketAddr,
) -> (Child, End, <Soft as Provider>::Connection, RemoteRegion) {
    let child = spawn_peer(scenario, at);
    let mut e = End::new(AccessFlags::LOCAL_WRITE);
    let conn = e.connect(at);
    let peer = RemoteRegion::from_bytes(conn.peer_private_data()).expect("a region");
    (child, e, conn, peer)
}

/// The peer's side: what `CORELINK_TEST_PEER` names (nothing when it is unset: then this is
/// an ordinary run of the test binary).
#[test]
fn peer() {
    let Ok(scenario) = std::env::var(SCENARIO) else { return };
    let addr: SocketAddr = std::env::var(ADDR).expect("address").parse().expect("address");
    match scenario.as_str() {
        "echo" => echo_server(addr),
        "overrun" => {
            // The same server, its listener's plan losing every send completion to a CQ
            // overrun: the connections it accepts, both ends, have it.
            let plan = faults::FaultPlan { seed: 1, cq_overrun: 1.0, ..Default::default() };
            faults::plan_at(addr, plan);
            echo_server(addr)
        }
        "idle" => idle_server(addr),
        "ud" => ud_receiver(),
        "sender" => {
            // Connects and sends until it is killed.
            let mut e = End::new(AccessFlags::LOCAL_WRITE);
            let _conn = e.connect(addr);
            loop {
                let _ = e.run(SendOp::Send, 0, 8);
            }
        }
        "stranger" => {
            // (another user's process: the fabric's listener is not there for it)
            let mut e = End::new(AccessFlags::LOCAL_WRITE);
            match e.ctx.connect(addr, &mut e.qp, &QpAttr::default(), b"", WAIT) {
                Err(Error::Rejected { .. }) => std::process::exit(4),
                other => panic!("another user's connect: {:?}", other.map(|_| ())),
            }
        }
        "bind" => {
            let ctx = Soft::open("soft0").expect("open");
            match ctx.listen(addr) {
                Err(Error::Cm { source, .. })
                    if source.raw_os_error() == Some(libc::EADDRINUSE) =>
                {
                    std::process::exit(3)
                }
                other => panic!("listen at an address of another process: {other:?}"),
            }
        }
        s => panic!("unknown scenario {s}"),
    }
}

/// Accepts one connection and exposes its region (in the accept's private data); echoes each
/// message; after a write with an immediate, sends the 8 bytes written; ends at the disconnect.
fn echo_server(addr: SocketAddr) {
    let mut e = End::new(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ALL);
    let mut listener = e.ctx.listen(addr).expect("listen");
    let req = listener.get_request(WAIT).expect("get_request").expect("a request");
    assert_eq!(req.private_data(), b"hi");
    e.qp.modify(&QpAttr { state: QpState::Init, ..QpAttr::default() }).expect("init");
    for i in 0..16 {
        e.post_recv(i);
    }
    let mut conn =
        req.accept(&mut e.qp, &QpAttr::default(), &e.mr.region().to_bytes()).expect("accept");
    // A second region, told on request ("region?") and deregistered on request ("drop").
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ALL;
    let mut second = Some(e.pd.register(4096, rights).expect("a second region"));
    loop {
        let mut wc = [Wc::default()];
        let got = match e.early.pop_front() {
            Some(w) => Some(w),
            None => (e.cq.poll(&mut wc).expect("poll") == 1).then_some(wc[0]),
        };
        if let Some(wc) = got {
            match (wc.status, wc.opcode) {
                (WcStatus::Success, WcOpcode::Recv) => {
                    let off = 32 * 1024 + wc.wr_id as usize * 1024;
                    let len = wc.byte_len;
                    let msg = e.mr.read_vec(off, len as usize);
                    let answer = match &msg[..] {
                        b"region?" => {
                            second.as_ref().expect("the region").region().to_bytes().to_vec()
                        }
                        b"drop" => {
                            second = None;
                            b"dropped".to_vec()
                        }
                        _ => msg,
                    };
                    e.mr.write_at(48 * 1024, &answer).expect("copy");
                    let _ = e.run(SendOp::Send, 48 * 1024, answer.len() as u32);
                    e.post_recv(wc.wr_id);
                }
                (WcStatus::Success, WcOpcode::RecvRdmaWithImm) => {
                    let at = wc.imm.expect("an immediate") as usize;
                    e.mr.write_at(48 * 1024, &e.mr.read_vec(at, 8)).expect("copy");
                    let _ = e.run(SendOp::Send, 48 * 1024, 8);
                    e.post_recv(wc.wr_id);
                }
                _ => {} // (flushes after the client's bad access)
            }
        }
        if let Some(CmEvent::Disconnected) = conn.poll_event(Duration::ZERO).expect("event") {
            return;
        }
    }
}

/// Accepts one connection with one receive posted and polls no CQ until the disconnect:
/// requests reach it only through its port's thread (the mailbox's nudge), not its polls.
fn idle_server(addr: SocketAddr) {
    let mut e = End::new(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ALL);
    let mut listener = e.ctx.listen(addr).expect("listen");
    let req = listener.get_request(WAIT).expect("get_request").expect("a request");
    e.qp.modify(&QpAttr { state: QpState::Init, ..QpAttr::default() }).expect("init");
    e.post_recv(0);
    let mut conn =
        req.accept(&mut e.qp, &QpAttr::default(), &e.mr.region().to_bytes()).expect("accept");
    while conn.poll_event(WAIT).expect("event") != Some(CmEvent::Disconnected) {}
    let wc = e.next();
    assert_eq!((wc.status, wc.opcode, wc.byte_len), (WcStatus::Success, WcOpcode::Recv, 5));
    assert_eq!(e.mr.read_u64(8).unwrap(), 7, "the fetch-and-add landed");
}

#[test]
fn a_peer_that_does_not_poll_still_answers() {
    let at = addr(6);
    let (mut child, mut e, conn, peer) = to_peer("idle", at);
    let faa = SendOp::FetchAdd { remote: peer.at(8), add: 7 };
    assert_eq!(e.run(faa, 0, 8).status, WcStatus::Success);
    assert_eq!(e.mr.read_u64(0).unwrap(), 0);
    e.mr.write_at(64, b"quiet").unwrap();
    assert_eq!(e.run(SendOp::Send, 64, 5).status, WcStatus::Success);
    drop(conn);
    assert!(wait_exit(&mut child).success(), "the peer failed");
}

/// A UD QP in RTS with `qkey`, its CQ, a 4 KiB region, its PD and its context.
struct UdEnd {
    qp: <Soft as Provider>::Qp,
    cq: <Soft as Provider>::Cq,
    mr: <Soft as Provider>::Mr,
    pd: <Soft as Provider>::Pd,
    ctx: <Soft as Provider>::Context,
}

fn ud_end(qkey: u32) -> UdEnd {
    on_fabric();
    let ctx = Soft::open("soft0").expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(16).expect("cq");
    let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).expect("register");
    let attr = QpInitAttr::<Soft> {
        qp_type: QpType::Ud,
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        cap: QpCap::default(),
        sq_sig_all: true,
    };
    let mut qp = pd.create_qp(&attr).expect("qp");
    qp.connect_to(Default::default(), &QpAttr { qkey, ..QpAttr::default() }).expect("to RTS");
    UdEnd { qp, cq, mr, pd, ctx }
}

/// A UD QP's number and GID as a line on stdout, then its one datagram (checked).
fn ud_receiver() {
    let UdEnd { mut qp, cq, mr, ctx, .. } = ud_end(0x1111);
    let sge = mr.sge(0, 1024).expect("sge");
    // SAFETY: the region outlives the receive, polled below.
    unsafe { qp.post_recv(&[RecvWr { wr_id: 1, sgl: &[sge] }]) }.expect("post_recv");
    let gid = ctx.query_gid(1, 0).expect("gid");
    println!("ud {} {}", qp.qp_num(), gid.0.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let deadline = Instant::now() + WAIT;
    let mut wc = [Wc::default()];
    while cq.poll(&mut wc).expect("poll") == 0 {
        assert!(Instant::now() < deadline, "no datagram");
        std::thread::yield_now();
    }
    assert_eq!((wc[0].status, wc[0].byte_len, wc[0].imm), (WcStatus::Success, 40 + 5, Some(9)));
    let mut got = [0u8; 5];
    mr.read_at(40, &mut got).expect("read");
    assert_eq!(&got, b"dgram");
}

#[test]
fn a_datagram_crosses_to_another_process() {
    use std::io::BufRead;
    on_fabric();
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "peer", "--nocapture", "--test-threads=1", "-q"])
        .env(SCENARIO, "ud")
        .env(ADDR, addr(9).to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the peer");
    // (read to the end once the peer is done: it writes more there, and must not meet a
    // closed pipe)
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    while !line.starts_with("ud ") {
        line.clear();
        assert!(out.read_line(&mut line).expect("the peer's output") > 0, "no QP from the peer");
    }
    let mut words = line.split_whitespace().skip(1);
    let qpn: u32 = words.next().expect("qpn").parse().expect("qpn");
    let hex = words.next().expect("gid");
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex");
    }
    let UdEnd { mut qp, cq, mr, pd, .. } = ud_end(0x2222);
    let dgid = corelink_verbs::Gid(gid);
    let ah =
        pd.create_ah(&corelink_verbs::AhAttr { port: 1, dgid, ..Default::default() }).expect("ah");
    mr.write_at(0, b"dgram").unwrap();
    let sge = mr.sge(0, 5).expect("sge");
    let mut wr = SendWr::new(1, SendOp::SendWithImm(9), std::slice::from_ref(&sge));
    wr.ud = Some(corelink_verbs::UdDest { ah: &ah, qpn, qkey: 0x1111 });
    // SAFETY: the region outlives the request, polled below.
    unsafe { qp.post_send(&[wr]) }.expect("post_send");
    let deadline = Instant::now() + WAIT;
    let mut wc = [Wc::default()];
    while cq.poll(&mut wc).expect("poll") == 0 {
        assert!(Instant::now() < deadline, "no completion");
    }
    assert_eq!(wc[0].status, WcStatus::Success);
    std::io::copy(&mut out, &mut std::io::sink()).expect("the peer's output");
    assert!(wait_exit(&mut child).success(), "the peer did not get the datagram right");
}

trait ReadVec {
    fn read_vec(&self, off: usize, len: usize) -> Vec<u8>;
}

impl<M: Mr> ReadVec for M {
    fn read_vec(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.read_at(off, &mut v).expect("read");
        v
    }
}

#[test]
fn every_primitive_between_two_processes() {
    let at = addr(1);
    let (mut child, mut e, conn, peer) = to_peer("echo", at);
    assert_eq!(peer.len as usize, REGION);
    e.post_recv(0);
    e.post_recv(1);

    // Send, and its echo.
    e.mr.write_at(0, b"ping across").unwrap();
    assert_eq!(e.run(SendOp::Send, 0, 11).status, WcStatus::Success);
    let wc = e.next();
    assert_eq!((wc.status, wc.opcode, wc.byte_len), (WcStatus::Success, WcOpcode::Recv, 11));
    assert_eq!(e.mr.read_vec(32 * 1024, 11), b"ping across");

    // A write of 4 KiB and a read of it back, both on the direct path (the peer's region is
    // in a shared segment: no message, no work in the peer).
    let direct = corelink_verbs::soft::direct_accesses();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    e.mr.write_at(4096, &data).unwrap();
    let wc = e.run(SendOp::Write(peer.at(8192)), 4096, 4096);
    assert_eq!((wc.status, wc.opcode, wc.byte_len), (WcStatus::Success, WcOpcode::RdmaWrite, 4096));
    let wc = e.run(SendOp::Read(peer.at(8192)), 12288, 4096);
    assert_eq!((wc.status, wc.opcode, wc.byte_len), (WcStatus::Success, WcOpcode::RdmaRead, 4096));
    assert_eq!(e.mr.read_vec(12288, 4096), data);
    assert!(corelink_verbs::soft::direct_accesses() >= direct + 2, "not on the direct path");

    // Atomics on the peer's word at 0 (zeroed at registration).
    let faa = SendOp::FetchAdd { remote: peer.at(0), add: 5 };
    assert_eq!(e.run(faa, 24576, 8).status, WcStatus::Success);
    assert_eq!(e.mr.read_u64(24576).unwrap(), 0);
    let cas = SendOp::CompareSwap { remote: peer.at(0), compare: 5, swap: 42 };
    assert_eq!(e.run(cas, 24576, 8).opcode, WcOpcode::CompSwap);
    assert_eq!(e.mr.read_u64(24576).unwrap(), 5);
    let faa = SendOp::FetchAdd { remote: peer.at(0), add: 1 };
    e.run(faa, 24576, 8);
    assert_eq!(e.mr.read_u64(24576).unwrap(), 42);

    // A write with an immediate: the peer hears it and sends back what landed.
    e.mr.write_at(64, &0x1122_3344_5566_7788u64.to_ne_bytes()).unwrap();
    let wc = e.run(SendOp::WriteWithImm(peer.at(16384), 16384), 64, 8);
    assert_eq!(wc.status, WcStatus::Success);
    let wc = e.next();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 8));
    assert_eq!(e.mr.read_u64(33 * 1024).unwrap(), 0x1122_3344_5566_7788);

    // A second region of the peer: written and read; once the peer deregistered it, an access
    // fails with a remote access error (the QP goes to ERR).
    let ask = |e: &mut End, what: &[u8]| -> Vec<u8> {
        e.mr.write_at(0, what).unwrap();
        e.post_recv(2);
        assert_eq!(e.run(SendOp::Send, 0, what.len() as u32).status, WcStatus::Success);
        let wc = e.next();
        assert_eq!(wc.status, WcStatus::Success);
        e.mr.read_vec(34 * 1024, wc.byte_len as usize)
    };
    let second = RemoteRegion::from_bytes(&ask(&mut e, b"region?")).expect("a region");
    e.mr.write_at(4096, b"second region").unwrap();
    assert_eq!(e.run(SendOp::Write(second.at(100)), 4096, 13).status, WcStatus::Success);
    assert_eq!(e.run(SendOp::Read(second.at(100)), 12288, 13).status, WcStatus::Success);
    assert_eq!(e.mr.read_vec(12288, 13), b"second region");
    assert_eq!(ask(&mut e, b"drop"), b"dropped");
    let wc = e.run(SendOp::Read(second.at(100)), 12288, 13);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(e.qp.state(), QpState::Err);
    return_after_error(conn, &mut child);
}

/// Drops `conn` (the peer ends at the disconnect) and checks the peer's exit.
fn return_after_error(conn: <Soft as Provider>::Connection, child: &mut Child) {
    drop(conn);
    assert!(wait_exit(child).success(), "the peer failed");
}

/// A listener's fault plan (`soft::faults::plan_at`) is its connections' both ends' across
/// processes too, as in one: the connector's QP, in this process, draws from the plan the
/// peer's listener has (it comes with the accept). Here the plan loses every send completion
/// to a CQ overrun: this side's write completes unseen, and its CQ raises the error. Before,
/// only the acceptor's end had the plan.
#[test]
fn a_listeners_fault_plan_reaches_a_connector_in_another_process() {
    let at = addr(11);
    let (mut child, mut e, conn, peer) = to_peer("overrun", at);
    let before = faults::counts().cq_overruns;
    let sgl = [e.mr.sge(0, 8).expect("sge")];
    let wr = SendWr::new(SENT, SendOp::Write(peer.at(0)), &sgl);
    // SAFETY: the region outlives the request (the QP is dropped first).
    unsafe { e.qp.post_send(&[wr]) }.expect("post_send");
    let deadline = Instant::now() + WAIT;
    let ev = loop {
        let mut wc = [Wc::default()];
        assert_eq!(e.cq.poll(&mut wc).expect("poll"), 0, "the completion was to be lost");
        if let Some(ev) = e.ctx.poll_async_event().expect("events") {
            break ev;
        }
        assert!(Instant::now() < deadline, "no CQ error");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(ev.kind, corelink_verbs::AsyncEventKind::CqErr);
    assert_eq!(faults::counts().cq_overruns, before + 1);
    return_after_error(conn, &mut child);
}

#[test]
fn an_access_outside_a_region_of_another_process_fails() {
    let at = addr(5);
    let (mut child, mut e, conn, peer) = to_peer("echo", at);
    // Outside the peer's region: a remote access error, and the QP in ERR.
    let wc = e.run(SendOp::Write(peer.at(REGION as u64)), 0, 8);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(e.qp.state(), QpState::Err);
    return_after_error(conn, &mut child);
}

#[test]
fn a_killed_peer_is_noticed_and_leaves_nothing() {
    let at = addr(2);
    let mut child = spawn_peer("echo", at);
    let mut e = End::new(AccessFlags::LOCAL_WRITE);
    let mut conn = e.connect(at);
    e.post_recv(0);
    e.mr.write_at(0, b"one").unwrap();
    assert_eq!(e.run(SendOp::Send, 0, 3).status, WcStatus::Success);
    assert_eq!(e.next().status, WcStatus::Success);

    let pid = child.id();
    child.kill().expect("kill -9");
    child.wait().expect("reaped");
    // The connection hears the disconnect; a send finds nobody to answer it.
    let deadline = Instant::now() + WAIT;
    loop {
        match conn.poll_event(Duration::from_millis(50)).expect("event") {
            Some(CmEvent::Disconnected) => break,
            _ => assert!(Instant::now() < deadline, "no disconnect after the peer died"),
        }
    }
    assert_eq!(e.run(SendOp::Send, 0, 3).status, WcStatus::RetryExcErr);
    // Its port and listener names went with it (abstract sockets: nothing on any file system).
    let names = std::fs::read_to_string("/proc/net/unix").expect("/proc/net/unix");
    let mine = format!("@corelink-soft/{}/{pid}", fabric());
    assert!(!names.lines().any(|l| l.ends_with(&mine)), "{mine} is left");
    let listener = format!("@corelink-soft/{}/listen/{at}", fabric());
    assert!(!names.lines().any(|l| l.ends_with(&listener)), "{listener} is left");
}

/// A post to a peer that is stopped returns at once (the request waits on the send queue, as
/// on a NIC), and completes once the peer runs again.
#[test]
fn a_post_to_a_stopped_peer_does_not_wait() {
    let at = addr(10);
    let mut child = spawn_peer("echo", at);
    let mut e = End::new(AccessFlags::LOCAL_WRITE);
    let conn = e.connect(at);
    e.post_recv(0);
    e.mr.write_at(0, b"stop").unwrap();
    let pid = child.id() as libc::pid_t;
    // SAFETY: signals to the peer this test spawned (and reaps).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // kill() returns before the stop takes hold: wait until every thread of the peer is stopped,
    // or it may still answer the send below.
    let mut st = 0;
    // SAFETY: the child is this test's; WUNTRACED reports its stop and reaps nothing.
    assert_eq!(unsafe { libc::waitpid(pid, &mut st, libc::WUNTRACED) }, pid);
    assert!(libc::WIFSTOPPED(st), "the peer did not stop: status {st:#x}");
    let sge = e.mr.sge(0, 4).expect("sge");
    // SAFETY: the region outlives the request, polled below.
    unsafe { e.qp.post_send(&[SendWr::new(SENT, SendOp::Send, &[sge])]) }.expect("post_send");
    let mut wc = [Wc::default()];
    assert_eq!(e.cq.poll(&mut wc).expect("poll"), 0, "a stopped peer answered");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let mut seen = [e.next(), e.next()];
    seen.sort_by_key(|w| w.wr_id);
    assert_eq!((seen[0].wr_id, seen[0].status), (0, WcStatus::Success), "the echo");
    assert_eq!((seen[1].wr_id, seen[1].status), (SENT, WcStatus::Success), "the send");
    return_after_error(conn, &mut child);
}

#[test]
fn a_killed_requester_is_noticed() {
    let at = addr(7);
    let mut e = End::new(AccessFlags::LOCAL_WRITE);
    let mut listener = e.ctx.listen(at).expect("listen");
    let mut child = spawn_peer("sender", at);
    let req = listener.get_request(WAIT).expect("get_request").expect("a request");
    e.qp.modify(&QpAttr { state: QpState::Init, ..QpAttr::default() }).expect("init");
    for i in 0..8 {
        e.post_recv(i);
    }
    let mut conn = req.accept(&mut e.qp, &QpAttr::default(), b"").expect("accept");
    for i in 0..8 {
        assert_eq!(e.next().status, WcStatus::Success, "message {i}");
    }
    child.kill().expect("kill -9");
    child.wait().expect("reaped");
    let deadline = Instant::now() + WAIT;
    while conn.poll_event(Duration::from_millis(50)).expect("event") != Some(CmEvent::Disconnected)
    {
        assert!(Instant::now() < deadline, "no disconnect after the requester died");
    }
    assert_eq!(e.run(SendOp::Send, 0, 8).status, WcStatus::RetryExcErr);
}

/// A process of another user cannot reach this user's fabric: run as root, the peer runs as
/// `nobody` (skipped when this test does not run as root).
#[test]
fn another_user_cannot_join() {
    use std::os::unix::process::CommandExt;
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("another_user_cannot_join: skipped (not root)");
        return;
    }
    on_fabric();
    let at = addr(8);
    let ctx = Soft::open("soft0").expect("open");
    let _listener = ctx.listen(at).expect("listen");
    let st = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "peer", "--nocapture", "--test-threads=1"])
        .env(SCENARIO, "stranger")
        .env(ADDR, at.to_string())
        .uid(65534)
        .gid(65534)
        .stdout(Stdio::null())
        .status()
        .expect("the peer runs");
    assert_eq!(st.code(), Some(4), "another user's process reached the listener: {st}");
}

#[test]
fn an_address_is_one_process_s_on_the_fabric() {
    on_fabric();
    let at = addr(3);
    let ctx = Soft::open("soft0").expect("open");
    let _listener = ctx.listen(at).expect("listen");
    let mut child = spawn_peer("bind", at);
    assert_eq!(wait_exit(&mut child).code(), Some(3), "the peer could listen at {at} too");
}

#[test]
fn a_connect_to_an_address_nobody_holds_is_rejected() {
    let mut e = End::new(AccessFlags::LOCAL_WRITE);
    let r = e.ctx.connect(addr(4), &mut e.qp, &QpAttr::default(), b"", WAIT);
    assert!(matches!(r, Err(Error::Rejected { .. })), "{r:?}");
}
