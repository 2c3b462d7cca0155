//! Large messages on `soft`: payloads beyond a receive travel as a descriptor and are read by
//! the receiver with one RDMA read from the sender's arena (requests and responses alike),
//! checked byte for byte up to 8 MiB; the arena's slots are a resource of their own.

mod common;

use common::*;
use corelink_rpc::{EndpointConfig, RpcError};

const MIB: usize = 1 << 20;

/// Pools with classes for the reads of large payloads (up to 8 MiB).
const POOLS: &str = "[[worker.pools]]\nsize = 256\ncount = 1024\n\
                     [[worker.pools]]\nsize = 4096\ncount = 256\n\
                     [[worker.pools]]\nsize = 65536\ncount = 16\n\
                     [[worker.pools]]\nsize = 8388608\ncount = 6";

/// A payload of `n` bytes where every byte says where it is.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

fn large(slots: u16) -> impl Fn(EndpointConfig) -> EndpointConfig + Send + Sync + 'static {
    move |cfg| cfg.with_large(8 * MIB, slots)
}

#[test]
fn large_requests_and_responses_arrive_byte_for_byte() {
    let at = addr("10.98.16.1");
    let (tx, rx) = outcomes();
    let max_small = 4096 - corelink_rpc::wire::HEADER;
    let sizes = [max_small, max_small + 1, 65536, MIB, 8 * MIB, 1];
    let rig = Rig::start_with(&map("10.98.16.1:7000", POOLS), large(8), move || {
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

#[test]
fn large_slots_are_refused_when_all_are_out_and_come_back() {
    let server = Rig::start_with(&map("10.98.16.2:7000", POOLS), large(4), || |_: &mut _, _| {});
    let at = addr("10.98.16.2");
    let (tx, rx) = outcomes();
    let client = Rig::start_with(&map("10.98.16.3:7000", POOLS), large(2), move || {
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
