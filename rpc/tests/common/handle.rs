//! Calls from other threads through a `Handle`, generic over the provider: blocking calls in
//! order, the errors of refused and failed calls, many `Future`s in flight at once under a
//! multi-threaded tokio runtime (more than the ring and the credits hold), and `WorkerGone`
//! once the worker stopped.
//!
//! Run by `handle_soft.rs` and `rpc_ibverbs.rs`.

use std::net::SocketAddr;
use std::sync::mpsc::channel;
use std::sync::Mutex;
use std::time::Duration;

use super::*;
use corelink_config::Validated;
use corelink_engine::verbs::Provider;
use corelink_engine::{Engine, Placement};
use corelink_rpc::{
    handle, Endpoint, EndpointConfig, Handle, ReqType, RpcError, RpcHandler, Serve, SessionId,
};

/// An engine whose one worker serves the standard types with `credits` per session, and a
/// handle into it whose ring holds `ring` orders.
fn start<P: Provider>(map: &Validated, credits: u16, ring: usize) -> (Engine<P>, Handle) {
    let res = map.map.worker.clone();
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    let engine = Engine::<P>::start(map, Placement::RoundRobin, move |_| {
        let cfg = EndpointConfig::for_worker(&res).with_credits(credits);
        let mut ep = Endpoint::new(cfg, &res).unwrap();
        serve(&mut ep);
        let (h, inbox) = handle(ring);
        tx.lock().unwrap().send(h).unwrap();
        RpcHandler::new(ep, Serve).with_inbox(inbox)
    })
    .unwrap();
    let h = rx.recv_timeout(HANG).unwrap();
    (engine, h)
}

/// Blocking calls from another thread end in order; refused and failed calls name why, a
/// session to `nowhere` ends its call closed, and a stopped worker is `WorkerGone`.
pub fn blocking_calls_from_another_thread_end_in_order_and_name_their_errors<P: Provider>(
    site: &Site,
    nowhere: SocketAddr,
) {
    let (engine, mut h) = start::<P>(&site.map(""), 8, 4);
    let s = h.connect(site.listen).unwrap();
    let worker = std::thread::spawn(move || {
        for i in 0..500u64 {
            let got = h.call(s, ECHO, &i.to_le_bytes(), LONG).unwrap();
            assert_eq!(got, i.to_le_bytes(), "call {i}");
        }
        // Calls counted by the server: each ran once, in order.
        let runs: Vec<u64> = (0..3)
            .map(|_| u64::from_le_bytes(h.call(s, COUNT, b"", LONG).unwrap().try_into().unwrap()))
            .collect();
        assert_eq!(runs, [1, 2, 3]);
        h
    });
    let mut h = worker.join().unwrap();
    let e = h.call(s, REJECT, b"", LONG).unwrap_err();
    assert!(matches!(e, RpcError::Rejected { code: 7 }), "{e}");
    let e = h.call(s, ReqType(200), b"", LONG).unwrap_err();
    assert!(matches!(e, RpcError::NoSuchType(ReqType(200))), "{e}");
    let e = h.call(s, TOO_BIG, b"", LONG).unwrap_err();
    assert!(matches!(e, RpcError::TooLarge { .. }), "{e}");
    // A call the endpoint refuses is answered at once with why.
    let e = h.call(s, ECHO, &vec![0; 1 << 20], LONG).unwrap_err();
    assert!(matches!(e, RpcError::TooLarge { len: 1048576, .. }), "{e}");
    h.close(s).unwrap();
    let e = h.call(s, ECHO, b"x", LONG).unwrap_err();
    assert!(matches!(e, RpcError::SessionClosed), "{e}");
    // Once the session is gone from the endpoint's table, a call on it still says closed
    // (whoever holds the id learns it ended, whenever it ended); an id it never gave is not
    // its.
    std::thread::sleep(Duration::from_millis(100));
    let e = h.call(s, ECHO, b"x", LONG).unwrap_err();
    assert!(matches!(e, RpcError::SessionClosed), "{e}");
    let e = h.call(SessionId::from_wire(0xffff), ECHO, b"x", LONG).unwrap_err();
    assert!(matches!(e, RpcError::NoSuchSession(_)), "{e}");
    // A connect to nowhere: the call ends closed, whether it was made before the connect
    // failed or after.
    let nowhere = h.connect(nowhere).unwrap();
    let e = h.call(nowhere, ECHO, b"x", LONG).unwrap_err();
    assert!(matches!(e, RpcError::SessionClosed), "{e}");
    engine.shutdown().unwrap();
    let e = h.call(s, ECHO, b"x", LONG).unwrap_err();
    assert!(matches!(e, RpcError::WorkerGone), "{e}");
}

/// 300 futures made before any is polled (more than the ring and the credits hold), awaited
/// under a multi-threaded tokio runtime, all end with their answer.
pub fn many_futures_in_flight_under_tokio_all_end_with_their_answer<P: Provider>(site: &Site) {
    let (engine, mut h) = start::<P>(&site.map(""), 4, 8);
    let s: SessionId = h.connect(site.listen).unwrap();
    const CALLS: u64 = 300;
    // Made before any is polled: the ring (8) fills and the rest go at their first poll.
    let futures: Vec<_> =
        (0..CALLS).map(|i| (i, h.call_async(s, ECHO, i.to_le_bytes().to_vec(), LONG))).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let answers = rt.block_on(async move {
        let tasks: Vec<_> =
            futures.into_iter().map(|(i, f)| tokio::spawn(async move { (i, f.await) })).collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        answers
    });
    for (i, r) in answers {
        assert_eq!(r.unwrap(), i.to_le_bytes(), "call {i}");
    }
    // A future dropped unpolled is fine; a timeout through the handle ends the call.
    drop(h.call_async(s, ECHO, b"dropped".to_vec(), LONG));
    let r = h.call(s, ECHO, b"after", Duration::from_secs(30)).unwrap();
    assert_eq!(r, b"after");
    engine.shutdown().unwrap();
    let r = corelink_rpc::block_on(h.call_async(s, ECHO, b"x".to_vec(), LONG));
    assert!(matches!(r, Err(RpcError::WorkerGone)), "{r:?}");
}
