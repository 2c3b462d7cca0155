//! The RPC layer end to end on the `soft` provider, in one process: each test's engine has one
//! worker whose endpoint opens sessions to itself (its client and server sides on one worker),
//! listening on its own address of the process-wide soft fabric. Nothing here reads the clock
//! for an assertion: timeouts are hang guards only.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use corelink_engine::verbs::soft::Soft;
use corelink_engine::{ConnId, ConnInfo, Cx, Engine, Handler, Message, Placement};
use corelink_rpc::{ReqType, RpcError, SessionEvent};

#[test]
fn calls_on_one_session_end_in_the_order_they_were_made() {
    let at = addr("10.98.13.1");
    let (tx, rx) = outcomes();
    let rig = Rig::start(&map("10.98.13.1:7000", ""), 32, move || {
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

#[test]
fn calls_beyond_the_credits_wait_and_all_succeed() {
    let at = addr("10.98.13.2");
    let (tx, rx) = outcomes();
    let rig = Rig::start(&map("10.98.13.2:7000", ""), 4, move || {
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
struct BlackHole(Arc<AtomicU64>);

impl Handler<Soft> for BlackHole {
    fn on_connected(&mut self, _cx: &mut Cx<Soft>, _conn: ConnId, _info: &ConnInfo) {}
    fn on_message(&mut self, _cx: &mut Cx<Soft>, _conn: ConnId, _msg: &Message<'_>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn a_server_that_never_answers_times_calls_out_and_gets_no_more_than_the_credits() {
    let hole_at = "10.98.13.3:7000";
    let heard = Arc::new(AtomicU64::new(0));
    let seen = heard.clone();
    let hole = Engine::<Soft>::start(&map(hole_at, ""), Placement::RoundRobin, move |_| {
        BlackHole(seen.clone())
    })
    .unwrap();
    let at = addr("10.98.13.3");
    let (tx, rx) = outcomes();
    let rig = Rig::start(&map("10.98.13.4:7000", ""), 4, move || {
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

#[test]
fn errors_name_why_no_response_came() {
    let at = addr("10.98.13.5");
    let (tx, rx) = outcomes();
    let rig = Rig::start(&map("10.98.13.5:7000", ""), 8, move || {
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

#[test]
fn closing_a_session_ends_each_of_its_calls_once() {
    let at = addr("10.98.13.6");
    let (tx, rx) = outcomes();
    let rig = Rig::start(&map("10.98.13.6:7000", ""), 4, move || {
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

#[test]
fn a_connect_to_nowhere_ends_its_calls_closed() {
    let nowhere = addr("10.98.13.99");
    let (tx, rx) = outcomes();
    let rig = Rig::start(&map("10.98.13.7:7000", ""), 4, move || {
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

/// A payload of `n` bytes where every byte says where it is.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn one_byte_and_four_kib_messages_arrive_byte_for_byte() {
    let worker = "recv_size = 8192\n\
                  [[worker.pools]]\nsize = 256\ncount = 256\n\
                  [[worker.pools]]\nsize = 8192\ncount = 256";
    let at = addr("10.98.13.8");
    let (tx, rx) = outcomes();
    let max = 8192 - corelink_rpc::wire::HEADER;
    let sizes = [1usize, 4096, 0, max];
    let rig = Rig::start(&map("10.98.13.8:7000", worker), 8, move || {
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

#[test]
fn a_hundred_sessions_on_one_server() {
    let worker = "max_conns = 256\nrecvs_per_conn = 8\nrecv_size = 256\nsend_queue_depth = 16\n\
                  cq_depth = 8192\n[worker.qps]\nmax = 400";
    let at = addr("10.98.13.9");
    let (tx, rx) = outcomes();
    let accepted = Arc::new(AtomicU64::new(0));
    let counted = accepted.clone();
    let rig = Rig::start(&map("10.98.13.9:7000", worker), 8, move || {
        let (tx, counted) = (tx.clone(), counted.clone());
        move |rpc, ev| match ev {
            Ev::Start => {
                for s in 0..100u64 {
                    let session = rpc.connect(at).unwrap();
                    for c in 0..3u64 {
                        let tag = s * 3 + c;
                        call(rpc, session, ECHO, &tag.to_le_bytes(), tag, &tx);
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

#[test]
fn a_full_call_table_refuses_and_its_deadlines_stay_bounded() {
    let at = addr("10.98.13.10");
    let (tx, rx) = outcomes();
    let rig = Rig::start_with(
        &map("10.98.13.10:7000", ""),
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
fn again(
    rpc: &mut corelink_rpc::Rpc<'_, Soft>,
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

#[test]
fn sessions_across_two_workers_keep_their_order_at_full_credit() {
    // Worker 0 opens four sessions; the engine places the accepted ends round robin, so some
    // are served by worker 1 on its own thread. Credits equal the connection's receives.
    let at = addr("10.98.13.11");
    let (tx, rx) = outcomes();
    let rig = Rig::start(&map2("10.98.13.11:7000", ""), 32, move || {
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
