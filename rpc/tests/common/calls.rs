//! The RPC layer end to end, generic over the provider, in one process: each check's engine
//! has one worker (two in the last) whose endpoint opens sessions to itself (its client and
//! server sides on one worker), listening on the check's own [`Site`]. Nothing here reads the
//! clock for an assertion: timeouts are hang guards only.
//!
//! Run by `rpc_soft.rs` and `rpc_ibverbs.rs`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use corelink_engine::verbs::Provider;
use corelink_engine::{ConnId, ConnInfo, Cx, Engine, Handler, Message, Placement};
use corelink_rpc::{ReqType, RpcError, SessionEvent};

/// 300 calls on one session end in the order they were made, each with its echo.
pub fn calls_on_one_session_end_in_the_order_they_were_made<P: Provider>(site: &Site) {
    let at = site.listen;
    let (tx, rx) = outcomes();
    let rig = Rig::<P>::start(&site.map(""), 32, move || {
        let tx = tx.clone();
        move |rpc, ev| {
            if let Ev::Start = ev {
                let s = rpc.connect(at).unwrap();
                for i in 0..300u64 {
                    call(rpc, s, ECHO, &i.to_le_bytes(), i, &tx);
                }
            }
        }
    });
    let got = take(&rx, 300);
    for (i, (tag, r)) in got.into_iter().enumerate() {
        assert_eq!(tag, i as u64, "continuations run in call order");
        assert_eq!(r.unwrap(), (i as u64).to_le_bytes());
    }
    rig.engine.shutdown().unwrap();
}

/// 100 calls on a session of 4 credits: never more than 4 on the wire, all answered in order.
pub fn calls_beyond_the_credits_wait_and_all_succeed<P: Provider>(site: &Site) {
    let at = site.listen;
    let (tx, rx) = outcomes();
    let rig = Rig::<P>::start(&site.map(""), 4, move || {
        let tx = tx.clone();
        move |rpc, ev| {
            if let Ev::Start = ev {
                let s = rpc.connect(at).unwrap();
                for i in 0..100u64 {
                    let tx = tx.clone();
                    let req = i.to_le_bytes();
                    rpc.call(s, ECHO, &req, LONG, move |rpc, r| {
                        // Never more requests on the wire than credits, whatever is waiting.
                        let in_flight = rpc.endpoint().in_flight(s).unwrap();
                        assert!(in_flight <= 4, "{in_flight} in flight");
                        let _ = tx.send((i, r.map(<[u8]>::to_vec)));
                    })
                    .unwrap();
                }
                // Four went, the rest wait (the session is not even open yet).
                assert_eq!(rpc.endpoint().waiting(s), Some(100));
            }
        }
    });
    for (i, (tag, r)) in take(&rx, 100).into_iter().enumerate() {
        assert_eq!(tag, i as u64);
        assert_eq!(r.unwrap(), (i as u64).to_le_bytes(), "call {i}");
    }
    let m = rig.metrics_when(|m| m.responses == 100);
    assert_eq!((m.calls, m.waited, m.errors, m.invariant_misses), (100, 100, 0, 0), "{m:?}");
    rig.engine.shutdown().unwrap();
}

/// An engine handler that accepts connections and never answers, counting what arrives.
/// Counts the requests it receives (a receive may hold several, packed), and answers none.
pub struct BlackHole(pub Arc<AtomicU64>);

impl<P: Provider> Handler<P> for BlackHole {
    fn on_connected(&mut self, _cx: &mut Cx<P>, _conn: ConnId, _info: &ConnInfo) {}
    fn on_message(&mut self, _cx: &mut Cx<P>, _conn: ConnId, msg: &Message<'_>) {
        let requests = corelink_rpc::wire::unpack(msg.data).filter(Result::is_ok).count();
        self.0.fetch_add(requests as u64, Ordering::Relaxed);
    }
}

/// Calls to a server (`hole`) that never answers time out, and only the credits' worth of
/// them ever went; the calling engine listens on `site`.
pub fn a_server_that_never_answers_times_calls_out_and_gets_no_more_than_the_credits<
    P: Provider,
>(
    hole: &Site,
    site: &Site,
) {
    let heard = Arc::new(AtomicU64::new(0));
    let seen = heard.clone();
    let at = hole.listen;
    let hole =
        Engine::<P>::start(&hole.map(""), Placement::RoundRobin, move |_| BlackHole(seen.clone()))
            .unwrap();
    let (tx, rx) = outcomes();
    let rig = Rig::<P>::start(&site.map(""), 4, move || {
        let tx = tx.clone();
        move |rpc, ev| match ev {
            Ev::Start => {
                rpc.connect(at).unwrap();
            }
            Ev::Session(s, SessionEvent::Connected) => {
                // Four go now, six wait for a credit.
                for i in 0..10u64 {
                    call_within(rpc, s, ECHO, b"anyone?", i, &tx, Duration::from_millis(20));
                }
            }
            Ev::Session(..) => {}
        }
    });
    for (tag, r) in take(&rx, 10) {
        assert!(matches!(r, Err(RpcError::Timeout)), "call {tag}: {r:?}");
    }
    let m = rig.metrics_when(|m| m.timeouts == 10);
    assert_eq!((m.calls, m.errors, m.responses), (10, 10, 0), "{m:?}");
    // The timed-out calls kept their slots (their requests may still hold the server's
    // receives): only the first four ever went.
    let deadline = std::time::Instant::now() + HANG;
    while heard.load(Ordering::Relaxed) < 4 {
        assert!(std::time::Instant::now() < deadline, "the four requests never arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(heard.load(Ordering::Relaxed), 4);
    rig.engine.shutdown().unwrap();
    hole.shutdown().unwrap();
}

/// An unknown type, a rejection, a response too large and a request too large each end
/// with their own error; the session goes on.
pub fn errors_name_why_no_response_came<P: Provider>(site: &Site) {
    let at = site.listen;
    let (tx, rx) = outcomes();
    let rig = Rig::<P>::start(&site.map(""), 8, move || {
        let tx = tx.clone();
        move |rpc, ev| match ev {
            Ev::Start => {
                let s = rpc.connect(at).unwrap();
                call(rpc, s, ReqType(99), b"?", 0, &tx);
                call(rpc, s, REJECT, b"no", 1, &tx);
                call(rpc, s, TOO_BIG, b"", 2, &tx);
                call(rpc, s, ECHO, b"still fine", 3, &tx);
                // Too large for a receive (the peer's is taken to be this worker's while
                // connecting), and large messages are off: refused at the call.
                let r = rpc.call(s, ECHO, &[0u8; 4096], LONG, |_, _| unreachable!());
                assert!(matches!(r, Err(RpcError::TooLarge { len: 4096, max: 4068 })), "{r:?}");
            }
            Ev::Session(s, SessionEvent::Connected) => {
                // Open now: a request that cannot fit in one message is refused at the call.
                let big = vec![0u8; 4096];
                let r = rpc.call(s, ECHO, &big, LONG, |_, _| unreachable!());
                assert!(matches!(r, Err(RpcError::TooLarge { len: 4096, max: 4068 })), "{r:?}");
            }
            Ev::Session(..) => {}
        }
    });
    let mut got = take(&rx, 4);
    got.sort_by_key(|(tag, _)| *tag);
    assert!(matches!(got[0].1, Err(RpcError::NoSuchType(ReqType(99)))), "{:?}", got[0]);
    assert!(matches!(got[1].1, Err(RpcError::Rejected { code: 7 })), "{:?}", got[1]);
    assert!(matches!(got[2].1, Err(RpcError::TooLarge { len: 4069, max: 4068 })), "{:?}", got[2]);
    assert_eq!(got[3].1.as_ref().unwrap(), b"still fine");
    rig.engine.shutdown().unwrap();
}

/// Closing a session with calls on the wire and waiting ends each of them exactly once.
pub fn closing_a_session_ends_each_of_its_calls_once<P: Provider>(site: &Site) {
    let at = site.listen;
    let (tx, rx) = outcomes();
    let rig = Rig::<P>::start(&site.map(""), 4, move || {
        let tx = tx.clone();
        move |rpc, ev| match ev {
            Ev::Start => {
                let s = rpc.connect(at).unwrap();
                for i in 0..8u64 {
                    call(rpc, s, ECHO, b"x", i, &tx);
                }
            }
            Ev::Session(s, SessionEvent::Connected) => {
                // Four went when the session opened; four wait. Twelve more, then the close.
                for i in 8..20u64 {
                    call(rpc, s, ECHO, b"x", i, &tx);
                }
                rpc.close(s).unwrap();
                let r = rpc.call(s, ECHO, b"late", LONG, |_, _| unreachable!());
                assert!(matches!(r, Err(RpcError::SessionClosed)), "{r:?}");
            }
            Ev::Session(..) => {}
        }
    });
    let mut got = take(&rx, 20);
    got.sort_by_key(|(tag, _)| *tag);
    let tags: Vec<u64> = got.iter().map(|(t, _)| *t).collect();
    assert_eq!(tags, (0..20).collect::<Vec<_>>(), "each call ended once");
    let closed = got.iter().filter(|(_, r)| matches!(r, Err(RpcError::SessionClosed))).count();
    let answered = got.iter().filter(|(_, r)| r.is_ok()).count();
    assert_eq!(closed + answered, 20, "{got:?}");
    assert!(closed >= 16, "the waiting calls end closed: {got:?}");
    assert!(rx.recv_timeout(Duration::from_millis(50)).is_err(), "no call ends twice");
    rig.engine.shutdown().unwrap();
}

/// A session to `nowhere` (nothing listens there) closes, ending its calls closed.
pub fn a_connect_to_nowhere_ends_its_calls_closed<P: Provider>(site: &Site, nowhere: SocketAddr) {
    let (tx, rx) = outcomes();
    let rig = Rig::<P>::start(&site.map(""), 4, move || {
        let tx = tx.clone();
        move |rpc, ev| match ev {
            Ev::Start => {
                let s = rpc.connect(nowhere).unwrap();
                for i in 0..6u64 {
                    call(rpc, s, ECHO, b"x", i, &tx);
                }
            }
            Ev::Session(_, e) => assert_eq!(e, SessionEvent::Closed),
        }
    });
    for (tag, r) in take(&rx, 6) {
        assert!(matches!(r, Err(RpcError::SessionClosed)), "call {tag}: {r:?}");
    }
    rig.engine.shutdown().unwrap();
}

/// 1 B, 4 KiB, empty and the largest small messages of 8 KiB receives come back byte for byte.
pub fn one_byte_and_four_kib_messages_arrive_byte_for_byte<P: Provider>(site: &Site) {
    let worker = "recv_size = 8192\n\
                  [[worker.pools]]\nsize = 256\ncount = 256\n\
                  [[worker.pools]]\nsize = 8192\ncount = 256";
    let at = site.listen;
    let (tx, rx) = outcomes();
    let max = 8192 - corelink_rpc::wire::HEADER;
    let sizes = [1usize, 4096, 0, max];
    let rig = Rig::<P>::start(&site.map(worker), 8, move || {
        let tx = tx.clone();
        move |rpc, ev| {
            if let Ev::Start = ev {
                let s = rpc.connect(at).unwrap();
                for (i, n) in sizes.iter().enumerate() {
                    call(rpc, s, ECHO, &pattern(*n), i as u64, &tx);
                }
            }
        }
    });
    for (tag, r) in take(&rx, sizes.len()) {
        let want = pattern(sizes[tag as usize]);
        assert!(r.as_ref().is_ok_and(|got| *got == want), "{} B: {r:?}", want.len());
    }
    rig.engine.shutdown().unwrap();
}

/// Calls made in one pass go packed: the first request alone, the small ones after it in one
/// send (and their responses likewise), a large one alone after the pack before it (the
/// session's order); every call ends in order with its bytes. With packing off, none packs.
pub fn small_calls_of_one_pass_go_packed_in_order<P: Provider>(site: &Site) {
    let worker = "recv_size = 4096
                  [[worker.pools]]
size = 256
count = 512
                  [[worker.pools]]
size = 4096
count = 256";
    // 32 calls: 8-byte ones, and at 10 and 20 one of 2,000 bytes (beyond `pack_max`).
    let size = |i: u64| if i % 10 == 0 && i > 0 { 2000 } else { 8 };
    for pack_max in [corelink_rpc::DEFAULT_PACK_MAX, 0] {
        let at = site.listen;
        let (tx, rx) = outcomes();
        let map = site.map(worker);
        let rig = Rig::<P>::start_with(&map, move |c| c.with_credits(32).with_pack(pack_max), {
            move || {
                let tx = tx.clone();
                move |rpc, ev| {
                    if let Ev::Session(s, SessionEvent::Connected) = ev {
                        for i in 0..32u64 {
                            call(rpc, s, ECHO, &pattern(size(i) as usize), i, &tx);
                        }
                    }
                    if let Ev::Start = ev {
                        rpc.connect(at).unwrap();
                    }
                }
            }
        });
        for (i, (tag, r)) in take(&rx, 32).into_iter().enumerate() {
            assert_eq!(tag, i as u64, "continuations run in call order");
            let want = pattern(size(tag) as usize);
            assert!(r.as_ref().is_ok_and(|got| *got == want), "call {tag}: {r:?}");
        }
        let m = rig.metrics_when(|m| m.responses == 32);
        if pack_max == 0 {
            assert_eq!((m.packs, m.packed), (0, 0), "{m:?}");
        } else {
            // The requests: the first alone, then packs around the two large ones (which go
            // alone): 29 small requests packed at least, in 3 packs at most.
            assert!(m.packed >= 29 && m.packs >= 3, "{m:?}");
        }
        rig.engine.shutdown().unwrap();
    }
}

/// A hundred sessions from the worker to itself, three calls each.
pub fn a_hundred_sessions_on_one_server<P: Provider>(site: &Site) {
    let worker = "max_conns = 256\nrecvs_per_conn = 8\nrecv_size = 256\nsend_queue_depth = 16\n\
                  cq_depth = 8192\n[worker.qps]\nmax = 400";
    let at = site.listen;
    let (tx, rx) = outcomes();
    let accepted = Arc::new(AtomicU64::new(0));
    let counted = accepted.clone();
    let rig = Rig::<P>::start(&site.map(worker), 8, move || {
        let (tx, counted) = (tx.clone(), counted.clone());
        move |rpc, ev| match ev {
            Ev::Start => {
                for s in 0..100u64 {
                    let session = rpc.connect(at).unwrap();
                    for c in 0..3u64 {
                        let tag = s * 3 + c;
                        // (a call waits for its session: its deadline outlasts the connect's)
                        let within = MANY_WAIT;
                        call_within(rpc, session, ECHO, &tag.to_le_bytes(), tag, &tx, within);
                    }
                }
            }
            Ev::Session(_, SessionEvent::Accepted) => {
                counted.fetch_add(1, Ordering::Relaxed);
            }
            Ev::Session(..) => {}
        }
    });
    let mut got = take(&rx, 300);
    got.sort_by_key(|(tag, _)| *tag);
    for (i, (tag, r)) in got.into_iter().enumerate() {
        assert_eq!(tag, i as u64);
        assert_eq!(r.unwrap(), tag.to_le_bytes());
    }
    assert_eq!(accepted.load(Ordering::Relaxed), 100);
    rig.engine.shutdown().unwrap();
}

/// A call table of 8 refuses a ninth call; 2,008 calls one after another keep the deadline
/// heap compacted.
pub fn a_full_call_table_refuses_and_its_deadlines_stay_bounded<P: Provider>(site: &Site) {
    let at = site.listen;
    let (tx, rx) = outcomes();
    let rig = Rig::<P>::start_with(
        &site.map(""),
        |cfg| corelink_rpc::EndpointConfig { max_calls: 8, ..cfg.with_credits(4) },
        move || {
            let tx = tx.clone();
            move |rpc, ev| {
                if let Ev::Start = ev {
                    let s = rpc.connect(at).unwrap();
                    // The first call's end starts 2,000 more, one after another: each call's
                    // deadline entry outlives the call, and the heap of them is compacted (it
                    // holds at most 17).
                    let first = tx.clone();
                    rpc.call(s, ECHO, b"x", LONG, move |rpc, r| {
                        let _ = first.send((0, r.map(<[u8]>::to_vec)));
                        again(rpc, s, 8, first);
                    })
                    .unwrap();
                    for i in 1..8u64 {
                        call(rpc, s, ECHO, b"x", i, &tx);
                    }
                    let r = rpc.call(s, ECHO, b"one too many", LONG, |_, _| unreachable!());
                    assert!(matches!(r, Err(RpcError::TooManyCalls { max: 8 })), "{r:?}");
                }
            }
        },
    );
    let got = take(&rx, 2008);
    assert!(got.iter().all(|(_, r)| r.as_ref().is_ok_and(|b| b == b"x")));
    rig.engine.shutdown().unwrap();
}

/// Calls ECHO on `s` under tag `tag`, and again from its continuation up to tag 2,007.
fn again<P: Provider>(
    rpc: &mut corelink_rpc::Rpc<'_, P>,
    s: corelink_rpc::SessionId,
    tag: u64,
    tx: std::sync::mpsc::Sender<Outcome>,
) {
    rpc.call(s, ECHO, b"x", LONG, move |rpc, r| {
        assert!(rpc.endpoint().deadlines_held() <= 17, "{}", rpc.endpoint().deadlines_held());
        let _ = tx.send((tag, r.map(<[u8]>::to_vec)));
        if tag < 2007 {
            again(rpc, s, tag + 1, tx);
        }
    })
    .unwrap();
}

/// Four sessions served by two workers keep their order at full credit; both workers send.
pub fn sessions_across_two_workers_keep_their_order_at_full_credit<P: Provider>(site: &Site) {
    // Worker 0 opens four sessions; the engine places the accepted ends round robin, so some
    // are served by worker 1 on its own thread. Credits equal the connection's receives.
    let at = site.listen;
    let (tx, rx) = outcomes();
    let rig = Rig::<P>::start(&site.map2(""), 32, move || {
        let tx = tx.clone();
        move |rpc, ev| {
            if let (Ev::Start, 0) = (ev, rpc.cx().worker_index()) {
                for s in 0..4u64 {
                    let session = rpc.connect(at).unwrap();
                    for c in 0..250u64 {
                        call(rpc, session, ECHO, &c.to_le_bytes(), s << 32 | c, &tx);
                    }
                }
            }
        }
    });
    let mut next = [0u64; 4];
    for (tag, r) in take(&rx, 1000) {
        let (s, c) = ((tag >> 32) as usize, tag & 0xffff_ffff);
        assert_eq!(c, next[s], "session {s}'s calls end in order");
        next[s] += 1;
        assert_eq!(r.unwrap(), c.to_le_bytes());
    }
    let metrics = rig.engine.shutdown().unwrap();
    let posted: Vec<u64> = metrics.iter().map(|m| m.posted).collect();
    assert!(posted.iter().all(|&n| n > 0), "both workers sent: {posted:?}");
}

/// The worker resources for [`many_sessions_on_one_server`]'s two engines, up to 1,000
/// sessions (connections) each: `max_conns` for the connections (the endpoint's
/// `max_sessions` follows it); `qps.max` for their QPs and the pool of 8 kept ready; the CQ
/// admits a connection only while it holds every completion the connection can have, 8
/// receives and 8 requests on the device (`cqes_per_conn` = 16, so 16,384 hold 1,024); the
/// receive queue holds the 8 receives, the send queue's 8 a signalled one in every 8 at least
/// (`batching.signal_every`); the receive buffers, 1,024 x 8 x 256 B = 2 MiB; and buffers for
/// the 3,000 requests the client makes before any session is open, each holding one until it
/// is sent (4,096 of 256 B, 1 MiB; the default pools have 1,024). On rxe the same fits its
/// device limits (65,536 QPs, CQs of up to 32 K entries).
pub const MANY_SESSIONS: &str = "max_conns = 1024\nrecvs_per_conn = 8\nrecv_size = 256\n\
                                 send_queue_depth = 8\nrecv_queue_depth = 8\ncq_depth = 16384\n\
                                 [[worker.pools]]\nsize = 256\ncount = 4096\n\
                                 [[worker.pools]]\nsize = 4096\ncount = 64\n\
                                 [worker.batching]\nsignal_every = 8\n\
                                 [worker.qps]\nmax = 1100";

/// The thousand connects start at once and queue behind each other on both control cores:
/// in the emulated Soft-RoCE guest the last of them came after more than the default 10 s.
pub const MANY_TOP: &str = "connect_timeout_ms = 120000";
/// How long a call of those sessions may wait (for its session, then its answer): past the
/// connect timeout. (In a slower guest the thousand connects took over a minute: calls with
/// the tests' usual 60 s deadline, made as their sessions were asked for, timed out.)
pub const MANY_WAIT: Duration = Duration::from_secs(150);

/// `sessions` sessions (at most 1,000) from one engine's worker (listening on `client`) to
/// another's (the server, on `server`), opened together, three calls on each, every one
/// answered with its echo; the server accepts each session once and holds them all at once.
pub fn many_sessions_on_one_server<P: Provider>(server: &Site, client: &Site, sessions: u64) {
    assert!(sessions <= 1000, "MANY_SESSIONS is sized for 1,000");
    // Sessions accepted, and the most the server's endpoint held at once.
    let (accepted, peak) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (counted, peaked) = (accepted.clone(), peak.clone());
    let server_rig = Rig::<P>::start(&server.map_with(MANY_TOP, MANY_SESSIONS), 8, move || {
        let (counted, peaked) = (counted.clone(), peaked.clone());
        move |rpc, ev| {
            if let Ev::Session(_, SessionEvent::Accepted) = ev {
                counted.fetch_add(1, Ordering::Relaxed);
                peaked.fetch_max(rpc.endpoint().sessions() as u64, Ordering::Relaxed);
            }
        }
    });
    let at = server.listen;
    let (tx, rx) = outcomes();
    let client_rig = Rig::<P>::start(&client.map_with(MANY_TOP, MANY_SESSIONS), 8, move || {
        let tx = tx.clone();
        move |rpc, ev| {
            if let Ev::Start = ev {
                for s in 0..sessions {
                    let session = rpc.connect(at).unwrap();
                    for c in 0..3u64 {
                        let tag = s * 3 + c;
                        // (a call waits for its session: its deadline outlasts the connect's)
                        let within = MANY_WAIT;
                        call_within(rpc, session, ECHO, &tag.to_le_bytes(), tag, &tx, within);
                    }
                }
            }
        }
    });
    let mut got: Vec<Outcome> = (0..3 * sessions)
        .map(|i| rx.recv_timeout(MANY_WAIT).unwrap_or_else(|e| panic!("outcome {i}: {e}")))
        .collect();
    got.sort_by_key(|(tag, _)| *tag);
    for (i, (tag, r)) in got.into_iter().enumerate() {
        assert_eq!(tag, i as u64);
        assert_eq!(r.unwrap(), tag.to_le_bytes(), "call {tag}");
    }
    assert_eq!(accepted.load(Ordering::Relaxed), sessions);
    // No session closed before the last was accepted: the server's worker held them all.
    assert_eq!(peak.load(Ordering::Relaxed), sessions);
    let m = server_rig.metrics_when(|m| m.handled == 3 * sessions);
    assert_eq!((m.refused, m.invariant_misses), (0, 0), "{m:?}");
    client_rig.engine.shutdown().unwrap();
    server_rig.engine.shutdown().unwrap();
}
