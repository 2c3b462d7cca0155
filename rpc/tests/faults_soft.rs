//! The RPC layer under `soft`'s injected faults (`soft::faults::plan_at` on the endpoint's
//! own listener, so that both ends of its session to itself draw them): with 20 % of packets
//! dropped, 20 % duplicated, 10 % reordered and every one held 200 us, every one of 500 calls
//! ends exactly once, and no request runs twice (RC resends what was lost or came out of
//! order and throws duplicates away; the endpoint's sequence numbers would catch any that came
//! through).

mod common;

use std::collections::HashSet;

use common::{call, outcomes, take, Ev, Rig, Site, ECHO};
use corelink_engine::verbs::soft::faults::{self, FaultPlan};
use corelink_engine::verbs::soft::Soft;
use corelink_rpc::SessionEvent;

#[test]
fn every_call_ends_once_and_runs_at_most_once_under_drops_duplicates_reordering_and_delay() {
    let site = Site::soft("10.98.31.1");
    let plan = FaultPlan {
        seed: 9,
        drop: 0.2,
        dup: 0.2,
        reorder: 0.1,
        delay_us: 200,
        ..Default::default()
    };
    faults::plan_at(site.listen, plan);
    const N: u64 = 500;
    let (tx, rx) = outcomes();
    let at = site.listen;
    let rig = Rig::<Soft>::start(&site.map(""), 8, move || {
        let tx = tx.clone();
        move |rpc, ev| match ev {
            Ev::Start => {
                rpc.connect(at).unwrap();
            }
            Ev::Session(s, SessionEvent::Connected) => {
                for tag in 0..N {
                    call(rpc, s, ECHO, &tag.to_le_bytes(), tag, &tx);
                }
            }
            Ev::Session(..) => {}
        }
    });
    let got = take(&rx, N as usize);
    let tags: HashSet<u64> = got.iter().map(|(t, _)| *t).collect();
    assert_eq!(tags.len(), N as usize, "every call ends, once");
    let ok =
        got.iter().filter(|(tag, r)| r.as_deref().ok() == Some(&tag.to_le_bytes()[..])).count();
    let m = rig.metrics_when(|m| m.handled >= ok as u64);
    assert!(m.handled <= N, "no request ran twice: {m:?}");
    assert_eq!(ok as u64, N, "RC hid every drop (seed 9): {m:?}");
    let counted = faults::counts();
    assert!(counted.retransmitted > 0 && counted.duplicates_discarded > 0, "{counted:?}");
    faults::clear_at(site.listen);
    rig.engine.shutdown().unwrap();
}
