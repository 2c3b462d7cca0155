//! A busy worker does not sleep: it runs 1,000,000 8-byte RDMA writes (run to completion
//! through its handler, on `soft`, the engine connected to itself, 64 in flight), and its
//! metrics show no voluntary context switch, neither over the whole life of its loop (the
//! counts `Engine::shutdown` returns, from getrusage(RUSAGE_THREAD)) nor in the steady state
//! (completion 10,000 to the last, read the same way by the handler). The worker never parks
//! (`idle_after_us = 0`), and registers the memory it grants in `Handler::on_start`, before
//! the loop (registered at the first connection, inside the loop, its 257 page faults once
//! cost a voluntary switch in CI). Involuntary switches (preemption by other threads on its
//! core) are printed, not asserted.
//!
//! Meant for a real host: in the emulated Soft-RoCE guest (`tests/rxe-guest/run`: TCG, the
//! binary on 9p) the worker shows a few voluntary switches (about 20 over its loop, 2-3 in the
//! steady state, with no major page fault), so it is not among the guest's checks.

#[path = "common/grant.rs"]
mod grant;
#[path = "common/traffic.rs"]
mod traffic;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use corelink_engine::thread_context_switches;
use corelink_verbs::soft::Soft;

const REQUESTS: u64 = 1_000_000;
/// Completions before the steady-state window opens.
const WARM_UP: u64 = 10_000;

#[test]
fn a_busy_worker_makes_no_voluntary_context_switch() {
    let plan = traffic::Plan {
        writes: 64,
        sends: 0,
        reads: 0,
        atomics: 0,
        target: REQUESTS,
        window: (WARM_UP, REQUESTS),
    };
    let t = Instant::now();
    let (e, report) = traffic::start::<Soft>("provider = \"soft\"", "10.99.2.1:0", plan, |_| {
        thread_context_switches()
    });
    traffic::wait_done(&report, Duration::from_secs(600));
    let elapsed = t.elapsed();
    let metrics = e.shutdown().unwrap();
    let m = &metrics[0];
    let (voluntary, involuntary) = report.window();
    let writes = report.writes.load(Ordering::Relaxed);
    println!(
        "{writes} writes in {elapsed:?}; worker context switches over its loop: voluntary {}, \
         involuntary {}; in the steady state (completion {WARM_UP} to {REQUESTS}): voluntary \
         {voluntary}, involuntary {involuntary}; ops {:?}",
        m.voluntary_switches, m.involuntary_switches, m.ops
    );
    println!("{m}");
    assert!(writes >= REQUESTS, "{writes} writes");
    assert!(m.ops[1] >= REQUESTS, "RDMA writes counted by the worker: {}", m.ops[1]);
    assert_eq!(voluntary, 0, "voluntary switches in the steady state");
    assert_eq!(m.voluntary_switches, 0, "voluntary switches over the worker's loop");
}
