//! The engine's limits on `soft`, each a defect found by using the engine as a new user would
//! (each test hung or lost a connection silently before): every limit is sized from the core
//! map and refused with its key when reached, and shutdown ends however many connections a
//! worker holds.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::{chain, soft::Soft, WcStatus};
use corelink_engine::*;

/// How long a step may take before the test calls it a hang (not a performance bound).
const HANG: Duration = Duration::from_secs(60);

/// Counts the messages each worker's handler receives.
#[derive(Default)]
struct Count {
    messages: Arc<Mutex<u64>>,
}

impl Handler<Soft> for Count {
    fn on_message(&mut self, _cx: &mut Cx<Soft>, _conn: ConnId, _msg: &Message<'_>) {
        *self.messages.lock().unwrap() += 1;
    }
}

fn engine(map: &str, messages: &Arc<Mutex<u64>>) -> Engine<Soft> {
    let v = parse(map).unwrap().validate(&MachineTopology::load().unwrap()).unwrap();
    let m = messages.clone();
    Engine::<Soft>::start(&v, Placement::RoundRobin, move |_| Count { messages: m.clone() })
        .unwrap()
}

fn map(listen: &str, worker: &str) -> String {
    format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000\n{worker}"
    )
}

/// What a client heard of a connect or a request, in one shape: its token, the connection,
/// the status (`GeneralErr` when refused before the device) and the error.
#[derive(Debug)]
struct Heard {
    token: u64,
    conn: Option<ConnId>,
    status: WcStatus,
    error: Option<EngineError>,
}

fn wait(c: &mut Client) -> Heard {
    let e = c.wait(HANG).expect("an event, not a hang");
    let refused = |token, conn, error| Heard { token, conn, status: WcStatus::GeneralErr, error };
    match e {
        Event::Connected { conn, info } => {
            Heard { token: info.token, conn: Some(conn), status: WcStatus::Success, error: None }
        }
        Event::ConnectFailed { token, error } => refused(token, None, Some(error)),
        Event::Done(d) => {
            Heard { token: d.token, conn: Some(d.conn), status: d.status, error: None }
        }
        Event::Refused { conn, token, error, .. } => refused(token, Some(conn), Some(error)),
        e => panic!("not a connect's or a request's outcome: {e:?}"),
    }
}

fn connect(c: &mut Client, addr: SocketAddr, token: u64) -> Heard {
    c.connect(addr, b"", token).unwrap();
    wait(c)
}

fn send(c: &mut Client, conn: ConnId, data: Vec<u8>, token: u64) {
    c.submit(conn, Op::Send { buf: data, imm: None }, token).map_err(|(_, e)| e).unwrap();
}

/// Drops the client and shuts the engine down on another thread; fails (rather than hangs)
/// unless shutdown returns within [`HANG`].
fn shutdown_within_hang(e: Engine<Soft>, c: Client) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(c);
        let _ = tx.send(e.shutdown().map(|_| ()).map_err(|e| chain(&e).to_string()));
    });
    rx.recv_timeout(HANG).expect("shutdown returns").unwrap();
}

fn text(e: &Option<EngineError>) -> String {
    e.as_ref().map(|e| chain(e).to_string()).unwrap_or_default()
}

/// Shutdown with more connection ends on a worker than the ring to the control core holds
/// (it hung for ever once a worker held more than about 140).
#[test]
fn shutdown_ends_with_three_hundred_connection_ends_on_a_worker() {
    let messages = Arc::default();
    let mut e = engine(
        &map(
            "10.99.7.1:0",
            "max_conns = 320\nrecvs_per_conn = 8\nrecv_size = 256\nsend_queue_depth = 16\n\
             cq_depth = 8192\n[worker.batching]\nsignal_every = 8\n[worker.qps]\nmax = 400",
        ),
        &messages,
    );
    let addr = e.listen_addr().unwrap();
    let mut c = e.client(0).unwrap();
    for t in 0..150 {
        let d = connect(&mut c, addr, t);
        assert_eq!((d.token, d.status), (t, WcStatus::Success), "{}", text(&d.error));
    }
    // (the accepting ends are counted as the control core hands them over: the last may come
    // just after its connector heard it was up)
    let deadline = std::time::Instant::now() + HANG;
    while e.control_metrics().workers[0].connections != 300 {
        assert!(std::time::Instant::now() < deadline, "{}", e.control_metrics());
        std::thread::yield_now();
    }
    shutdown_within_hang(e, c);
}

/// A worker's connection limit is `worker.max_conns`: a connect beyond is refused with the key,
/// on the connecting side when it is full, and by the accepting side (which counts the
/// refusal) when that one is; a refused connect leaves nothing behind.
#[test]
fn the_connection_limit_refuses_naming_its_key() {
    let messages = Arc::default();
    // Both ends on this one worker: the first connection takes two of its three slots; the
    // second one's connecting end takes the third, and its accepting end is refused.
    let mut e = engine(&map("10.99.7.2:0", "max_conns = 3"), &messages);
    let addr = e.listen_addr().unwrap();
    let mut c = e.client(0).unwrap();
    let d = connect(&mut c, addr, 1);
    assert_eq!(d.status, WcStatus::Success, "{}", text(&d.error));
    let first = d.conn.unwrap();
    let d = connect(&mut c, addr, 2);
    let why = text(&d.error);
    assert_eq!((d.token, d.conn, d.status), (2, None, WcStatus::GeneralErr), "{why}");
    assert!(why.contains("rejected by the peer") && why.contains("worker.max_conns"), "{why}");
    let deadline = Instant::now() + HANG;
    while e.control_metrics().workers[0].conns_refused < 1
        || e.control_metrics().workers[0].connections != 2
    {
        assert!(Instant::now() < deadline, "{:?}", e.control_metrics());
        std::thread::sleep(Duration::from_millis(1));
    }
    // The first connection still works.
    send(&mut c, first, b"still here".to_vec(), 3);
    let d = wait(&mut c);
    assert_eq!((d.token, d.status), (3, WcStatus::Success), "{}", text(&d.error));
    e.shutdown().unwrap();

    // A connecting side that is full itself refuses before anything goes out.
    let mut e = engine(&map("10.99.7.3:0", "max_conns = 2"), &messages);
    let addr = e.listen_addr().unwrap();
    let mut c = e.client(0).unwrap();
    assert_eq!(connect(&mut c, addr, 1).status, WcStatus::Success);
    let d = connect(&mut c, addr, 2);
    let why = text(&d.error);
    assert!(why.contains("connections limit reached: 2 in use of 2"), "{why}");
    assert!(why.contains("worker.max_conns") && !why.contains("rejected"), "{why}");
    e.shutdown().unwrap();
}

/// Every connection keeps all its receives, however many there are: a burst of
/// `recvs_per_conn` sends to the last of 24 connection ends all arrive (before, the default
/// pools covered about 9 ends, later ones got no receives, and a send to them retried for
/// ever).
#[test]
fn every_connection_gets_its_receives() {
    let messages = Arc::default();
    let mut e = engine(&map("10.99.7.4:0", ""), &messages);
    let addr = e.listen_addr().unwrap();
    let mut c = e.client(0).unwrap();
    let mut last = None;
    for t in 0..12 {
        let d = connect(&mut c, addr, t);
        assert_eq!(d.status, WcStatus::Success, "{}", text(&d.error));
        last = d.conn;
    }
    let conn = last.unwrap();
    for t in 0..tunables::RECVS_PER_CONN as u64 {
        send(&mut c, conn, vec![t as u8; 100], 100 + t);
    }
    for _ in 0..tunables::RECVS_PER_CONN {
        let d = wait(&mut c);
        assert_eq!(d.status, WcStatus::Success, "{}: {}", d.token, text(&d.error));
    }
    let deadline = Instant::now() + HANG;
    while *messages.lock().unwrap() < tunables::RECVS_PER_CONN as u64 {
        assert!(Instant::now() < deadline, "{} messages", messages.lock().unwrap());
        std::thread::sleep(Duration::from_millis(1));
    }
    e.shutdown().unwrap();
}

/// A send larger than the peer's receive buffers is refused at submit, naming the peer's
/// `worker.recv_size`, and the connection goes on (before, it reached the device and the
/// peer's length error killed the connection). The peer's receive size is in `ConnInfo`.
#[test]
fn a_send_larger_than_the_peers_receives_is_refused_at_submit() {
    let messages = Arc::default();
    let mut e = engine(&map("10.99.7.5:0", "recv_size = 1000"), &messages);
    let addr = e.listen_addr().unwrap();
    let mut c = e.client(0).unwrap();
    let conn = connect(&mut c, addr, 1).conn.unwrap();
    send(&mut c, conn, vec![1; 1001], 2);
    let d = wait(&mut c);
    assert_eq!((d.token, d.status), (2, WcStatus::GeneralErr));
    assert!(
        matches!(d.error, Some(EngineError::MessageTooLarge { len: 1001, max: 1000, .. })),
        "{}",
        text(&d.error)
    );
    assert!(text(&d.error).contains("worker.recv_size"), "{}", text(&d.error));
    send(&mut c, conn, vec![1; 1000], 3);
    let d = wait(&mut c);
    assert_eq!((d.token, d.status), (3, WcStatus::Success), "{}", text(&d.error));
    e.shutdown().unwrap();
}

/// A queue the device refuses says why: the capacities asked for and the provider's reason
/// (before: only "cannot create a rc queue pair").
#[test]
fn a_refused_queue_pair_says_what_was_asked_and_why() {
    let v = parse(&map(
        "10.99.7.6:0",
        "send_queue_depth = 32768\ncq_depth = 65536\nmax_conns = 1\n\
         [worker.qps]\npool = 1",
    ))
    .unwrap()
    .validate(&MachineTopology::load().unwrap())
    .unwrap();
    let e = Engine::<Soft>::start(&v, Placement::RoundRobin, |_| Count::default()).unwrap_err();
    let why = chain(&e).to_string();
    assert!(why.contains("send queue 32768") && why.contains("queue depths must be"), "{why}");
}

/// A request that fails on one lane of a connection of four closes the whole connection: its
/// issuer hears the error, every lane flushes, the connection ends (`on_closed` with the
/// error, to the client whose connection it is) and shutdown returns (before, the other lanes stayed up with their receives posted,
/// so the connection never finished closing and shutdown waited for ever).
#[test]
fn a_failed_request_closes_every_lane_of_its_connection() {
    let messages = Arc::default();
    // (a long `worker.peer_grace_ms`: nothing but the peer's disconnect ends the wait for it)
    let worker = "peer_grace_ms = 60000\n[worker.qps]\nper_conn = 4";
    let mut e = engine(&map("10.99.7.7:0", worker), &messages);
    let addr = e.listen_addr().unwrap();
    let mut c = e.client(0).unwrap();
    let d = connect(&mut c, addr, 1);
    let conn = d.conn.unwrap_or_else(|| panic!("{}", text(&d.error)));
    // No memory is granted: any key is a bad one.
    let remote = corelink_engine::verbs::RemoteAddr { addr: 4096, rkey: 77 };
    c.submit(conn, Op::Write { buf: vec![1; 8], remote, imm: None }, 2)
        .map_err(|(_, e)| e)
        .unwrap();
    let d = wait(&mut c);
    assert_eq!((d.token, d.status), (2, WcStatus::RemAccessErr), "{}", text(&d.error));
    // The connection is the client's: its close comes to the client.
    let deadline = Instant::now() + HANG;
    loop {
        if let Some(Event::Closed { conn: closed, reason }) = c.wait(Duration::from_millis(10)) {
            assert_eq!(closed, conn);
            // (named for the refusal, after the peer's disconnect: its QP failed too)
            assert_eq!(reason, CloseReason::PeerGone(WcStatus::RemAccessErr));
            break;
        }
        assert!(Instant::now() < deadline, "the connection never finished closing");
    }
    shutdown_within_hang(e, c);
}

/// A connect to a listener that never answers fails after `connect_timeout_ms` with a timeout
/// (the engine's connects waited a fixed 10 s; the key makes it the map's).
#[test]
fn a_connect_nobody_answers_fails_after_connect_timeout_ms() {
    use corelink_engine::verbs::{Context, Provider};
    // A plain listener that never takes its requests.
    let ctx = Soft::open("soft0").unwrap();
    let addr: SocketAddr = "10.81.0.9:7000".parse().unwrap();
    let _silent = ctx.listen(addr).unwrap();
    let text =
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"10.81.0.1:7000\"\n\
                connect_timeout_ms = 200\n[worker]\nidle_after_us = 1000";
    let mut e = engine(text, &Arc::default());
    let mut c = e.client(0).unwrap();
    c.connect(addr, b"", 5).unwrap();
    let h = wait(&mut c);
    assert_eq!((h.token, h.conn), (5, None));
    let why = chain(h.error.as_ref().expect("a reason")).to_string();
    assert!(why.contains("timed out") && why.contains("10.81.0.9:7000"), "{why}");
    e.shutdown().unwrap();
}
