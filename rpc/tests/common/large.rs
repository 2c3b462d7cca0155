//! Large messages, generic over the provider: payloads beyond a receive travel as a
//! descriptor and are read by the receiver with one RDMA read from the sender's arena
//! (requests and responses alike), checked byte for byte up to 8 MiB; the arena's slots are a
//! resource of their own (a large call waits for one); a session's requests run in order
//! across large ones.
//!
//! Run by `large_soft.rs` and `rpc_ibverbs.rs`.

use super::*;
use corelink_engine::verbs::Provider;
use corelink_rpc::{EndpointConfig, ReqType, RpcError, RpcMetrics};

/// A mebibyte.
pub const MIB: usize = 1 << 20;

/// Pools with classes for the reads of large payloads (up to 8 MiB).
pub const POOLS: &str = "[[worker.pools]]\nsize = 256\ncount = 1024\n\
                     [[worker.pools]]\nsize = 4096\ncount = 256\n\
                     [[worker.pools]]\nsize = 65536\ncount = 16\n\
                     [[worker.pools]]\nsize = 8388608\ncount = 6";

fn large(slots: u16) -> impl Fn(EndpointConfig) -> EndpointConfig + Send + Sync + 'static {
    move |cfg| cfg.with_large(8 * MIB, slots)
}

/// A one-worker engine (eight large slots) whose session to itself calls `ty` once with a
/// payload of each of `sizes`, in order, at its first loop iteration; the outcomes by call.
fn call_sizes<P: Provider>(site: &Site, ty: ReqType, sizes: &[usize]) -> (Rig<P>, Vec<Outcome>) {
    let at = site.listen;
    let (tx, rx) = outcomes();
    let list = sizes.to_vec();
    let rig = Rig::<P>::start_with(&site.map(POOLS), large(8), move || {
        let (tx, list) = (tx.clone(), list.clone());
        move |rpc, ev| {
            if let Ev::Start = ev {
                let s = rpc.connect(at).unwrap();
                for (i, n) in list.iter().enumerate() {
                    call(rpc, s, ty, &pattern(*n), i as u64, &tx);
                }
            }
        }
    });
    let mut got = take(&rx, sizes.len());
    got.sort_by_key(|(tag, _)| *tag);
    (rig, got)
}

/// Requests and responses of the largest small size, one byte more, 64 KiB, 1 MiB, 8 MiB and
/// 1 B on one session, each echoed byte for byte.
pub fn large_requests_and_responses_arrive_byte_for_byte<P: Provider>(site: &Site) {
    let max_small = 4096 - corelink_rpc::wire::HEADER;
    let sizes = [max_small, max_small + 1, 65536, MIB, 8 * MIB, 1];
    let (rig, got) = call_sizes::<P>(site, ECHO, &sizes);
    for (tag, r) in got {
        let want = pattern(sizes[tag as usize]);
        let r = r.unwrap_or_else(|e| panic!("{} B: {e}", want.len()));
        assert!(r == want, "{} B came back different ({} B)", want.len(), r.len());
    }
    let m = rig.metrics_when(|m| m.responses == sizes.len() as u64);
    assert_eq!((m.errors, m.invariant_misses), (0, 0), "{m:?}");
    rig.engine.shutdown().unwrap();
}

/// The requests of one session run in the order they were made, large or small: a request
/// made after a large one waits while the large one's payload is read, and runs after its
/// handler. `COUNT` answers how many times it ran, so its answers give the order the server
/// ran the calls in. Returns the endpoint's metrics (`held`: requests that waited so).
pub fn requests_run_in_session_order_across_large_ones<P: Provider>(site: &Site) -> RpcMetrics {
    let sizes = [1, MIB, 1, 1, MIB, 2 * MIB, 1, 8];
    let (rig, got) = call_sizes::<P>(site, COUNT, &sizes);
    for (tag, r) in got {
        let r = r.unwrap_or_else(|e| panic!("call {tag} ({} B): {e}", sizes[tag as usize]));
        let ran = u64::from_le_bytes(r[..8].try_into().unwrap());
        assert_eq!(ran, tag + 1, "call {tag} ({} B) ran as number {ran}", sizes[tag as usize]);
    }
    let m = rig.metrics_when(|m| m.responses == sizes.len() as u64);
    assert_eq!((m.errors, m.invariant_misses), (0, 0), "{m:?}");
    rig.engine.shutdown().unwrap();
    m
}

/// A client with two large slots: small calls need none; a third large call while two are
/// out is not refused but waits until a slot is back (the calls made after it on its session
/// wait behind it), and every call ends byte for byte. The server listens on `server`, the
/// client on `client`.
pub fn a_large_call_waits_for_an_arena_slot_when_all_are_out<P: Provider>(
    server: &Site,
    client: &Site,
) {
    let at = server.listen;
    let server = Rig::<P>::start_with(&server.map(POOLS), large(4), || |_: &mut _, _| {});
    let (tx, rx) = outcomes();
    let sizes = [5, MIB, MIB, 2 * MIB, 5, MIB];
    let client = Rig::<P>::start_with(&client.map(POOLS), large(2), move || {
        let tx = tx.clone();
        move |rpc, ev| {
            if let Ev::Start = ev {
                let s = rpc.connect(at).unwrap();
                // Calls 1 and 2 take both slots; 3 and 5 wait for one, and 4 behind 3.
                for (i, n) in sizes.iter().enumerate() {
                    call(rpc, s, ECHO, &pattern(*n), i as u64, &tx);
                }
            }
        }
    });
    let mut got = take(&rx, sizes.len());
    got.sort_by_key(|(tag, _)| *tag);
    for (tag, r) in got {
        let want = pattern(sizes[tag as usize]);
        let r = r.unwrap_or_else(|e| panic!("call {tag} ({} B): {e}", want.len()));
        assert!(r == want, "call {tag} ({} B) came back different", want.len());
    }
    let m = client.metrics_when(|m| m.responses == sizes.len() as u64);
    assert_eq!((m.errors, m.slot_waits, m.invariant_misses), (0, 2, 0), "{m:?}");
    client.engine.shutdown().unwrap();
    server.engine.shutdown().unwrap();
}

/// A large call that waits for an arena slot ends once, with `Timeout`, when its deadline
/// passes first: the client's one slot is held by a call to a server (`hole`) that never
/// answers. The client listens on `client`.
pub fn a_large_call_waiting_for_a_slot_times_out_once<P: Provider>(hole: &Site, client: &Site) {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    let at = hole.listen;
    let seen = Arc::new(AtomicU64::new(0));
    let hole = corelink_engine::Engine::<P>::start(
        &hole.map(""),
        corelink_engine::Placement::RoundRobin,
        move |_| super::calls::BlackHole(seen.clone()),
    )
    .unwrap();
    let (tx, rx) = outcomes();
    let client = Rig::<P>::start_with(&client.map(POOLS), large(1), move || {
        let tx = tx.clone();
        move |rpc, ev| {
            if let Ev::Session(s, corelink_rpc::SessionEvent::Connected) = ev {
                let short = std::time::Duration::from_millis(20);
                call_within(rpc, s, ECHO, &pattern(MIB), 0, &tx, short);
                call_within(rpc, s, ECHO, &pattern(MIB), 1, &tx, short);
            } else if let Ev::Start = ev {
                rpc.connect(at).unwrap();
            }
        }
    });
    for (tag, r) in take(&rx, 2) {
        assert!(matches!(r, Err(RpcError::Timeout)), "call {tag}: {r:?}");
    }
    let m = client.metrics_when(|m| m.timeouts == 2);
    assert_eq!((m.calls, m.slot_waits, m.errors, m.responses), (2, 1, 2, 0), "{m:?}");
    assert!(rx.recv_timeout(std::time::Duration::from_millis(50)).is_err(), "a third outcome");
    client.engine.shutdown().unwrap();
    hole.shutdown().unwrap();
}

/// A server with one slot for large messages answers two large echoes: the first response
/// takes the slot (kept until the client's next request on that call's slot acknowledges
/// it), the second finds none. Its handler ran, and its client hears so:
/// `RpcError::Unanswered` (calling again would run it again), not `PeerBusy` (which says the
/// request did not run). The server listens on `server`, the client on `client`.
pub fn a_response_without_a_slot_says_its_request_ran<P: Provider>(server: &Site, client: &Site) {
    let at = server.listen;
    let server = Rig::<P>::start_with(&server.map(POOLS), large(1), || |_: &mut _, _| {});
    let (tx, rx) = outcomes();
    let client = Rig::<P>::start_with(&client.map(POOLS), large(4), move || {
        let tx = tx.clone();
        move |rpc, ev| {
            if let Ev::Start = ev {
                let s = rpc.connect(at).unwrap();
                // (a session's requests run in order: call 0's handler first)
                call(rpc, s, ECHO, &pattern(MIB), 0, &tx);
                call(rpc, s, ECHO, &pattern(MIB), 1, &tx);
            }
        }
    });
    let mut got = take(&rx, 2);
    got.sort_by_key(|(tag, _)| *tag);
    assert!(got[0].1.as_ref().is_ok_and(|r| *r == pattern(MIB)), "call 0: {:?}", got[0].1);
    assert!(matches!(got[1].1, Err(RpcError::Unanswered)), "call 1: {:?}", got[1].1);
    let m = server.metrics_when(|m| m.handled == 2);
    assert_eq!(m.handled, 2, "both handlers ran: {m:?}");
    client.engine.shutdown().unwrap();
    server.engine.shutdown().unwrap();
}
