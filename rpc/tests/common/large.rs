//! Large messages, generic over the provider: payloads beyond a receive travel as a
//! descriptor and are read by the receiver with one RDMA read from the sender's arena
//! (requests and responses alike), checked byte for byte up to 8 MiB; the arena's slots are a
//! resource of their own.
//!
//! Run by `large_soft.rs` and `rpc_ibverbs.rs`.

use super::*;
use corelink_engine::verbs::Provider;
use corelink_rpc::{EndpointConfig, RpcError};

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

/// Requests and responses of the largest small size, one byte more, 64 KiB, 1 MiB, 8 MiB and
/// 1 B on one session, each echoed byte for byte.
pub fn large_requests_and_responses_arrive_byte_for_byte<P: Provider>(site: &Site) {
    let at = site.listen;
    let (tx, rx) = outcomes();
    let max_small = 4096 - corelink_rpc::wire::HEADER;
    let sizes = [max_small, max_small + 1, 65536, MIB, 8 * MIB, 1];
    let rig = Rig::<P>::start_with(&site.map(POOLS), large(8), move || {
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
    let mut got = take(&rx, sizes.len());
    got.sort_by_key(|(tag, _)| *tag);
    for (tag, r) in got {
        let want = pattern(sizes[tag as usize]);
        let r = r.unwrap_or_else(|e| panic!("{} B: {e}", want.len()));
        assert!(r == want, "{} B came back different ({} B)", want.len(), r.len());
    }
    let m = rig.metrics_when(|m| m.responses == sizes.len() as u64);
    assert_eq!((m.errors, m.invariant_misses), (0, 0), "{m:?}");
    rig.engine.shutdown().unwrap();
}

/// A client with two large slots: a third large call while two are out is refused, small
/// calls need none, and a slot is back once its call ended; the server listens on `server`,
/// the client on `client`.
pub fn large_slots_are_refused_when_all_are_out_and_come_back<P: Provider>(
    server: &Site,
    client: &Site,
) {
    let at = server.listen;
    let server = Rig::<P>::start_with(&server.map(POOLS), large(4), || |_: &mut _, _| {});
    let (tx, rx) = outcomes();
    let client = Rig::<P>::start_with(&client.map(POOLS), large(2), move || {
        let tx = tx.clone();
        move |rpc, ev| {
            if let Ev::Start = ev {
                let s = rpc.connect(at).unwrap();
                let big = pattern(MIB);
                // Once the first large call ended, its slot is back: a 2 MiB call follows.
                let first = tx.clone();
                rpc.call(s, ECHO, &big, LONG, move |rpc, r| {
                    let _ = first.send((0, r.map(<[u8]>::to_vec)));
                    call(rpc, s, ECHO, &pattern(2 * MIB), 4, &first);
                })
                .unwrap();
                call(rpc, s, ECHO, &big, 1, &tx);
                let r = rpc.call(s, ECHO, &big, LONG, |_, _| unreachable!());
                assert!(matches!(r, Err(RpcError::LargeSlotsBusy { slots: 2 })), "{r:?}");
                // Small calls need no slot (and may end before the large ones: a large
                // request's handler runs once its payload is read).
                call(rpc, s, ECHO, b"small", 2, &tx);
                call(rpc, s, COUNT, b"", 3, &tx);
            }
        }
    });
    let mut got = take(&rx, 5);
    got.sort_by_key(|(tag, _)| *tag);
    assert_eq!(got[0].1.as_ref().unwrap(), &pattern(MIB));
    assert_eq!(got[1].1.as_ref().unwrap(), &pattern(MIB));
    assert_eq!(got[2].1.as_ref().unwrap(), b"small");
    assert!(got[3].1.is_ok(), "{:?}", got[3]);
    assert_eq!(got[4].1.as_ref().unwrap(), &pattern(2 * MIB));
    client.engine.shutdown().unwrap();
    server.engine.shutdown().unwrap();
}
