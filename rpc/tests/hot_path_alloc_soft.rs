//! No allocation on the RPC hot path: with a counting global allocator, one soft worker runs a
//! closed loop of echo calls on a session to itself (client and server on the same thread, 32
//! calls in flight), and the allocations the worker makes between call 10,000 and call 60,000
//! are counted (raw calls, typed ones and typed ones whose request and response borrow, by
//! turns: the typed layer encodes into and decodes from the registered buffers in place, a
//! borrowed `&str` pointing into them): request and response buffers come from the
//! registered pools, the tables were sized at start, and a continuation that captures nothing
//! (a function, as here) is boxed without an allocation. Start-up, session set-up and warm-up may allocate.
//!
//! On `soft` only (not in `rpc_ibverbs.rs`): the counting allocator is the whole process's
//! and its window's statics are one run's, so the check needs a binary of its own; an ibverbs
//! twin, as the engine's `hot_path_alloc.rs` has, would go here under `feature = "ibverbs"`.
//!
//! The same with merging on: echo calls of a mergeable type whose requests take four values,
//! so that most calls ride on an identical one in flight and merge groups begin and end all the
//! time (their vectors and the map's room are reused once warm).

mod common;
mod counting;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use common::*;
use corelink_engine::verbs::soft::Soft;
use corelink_rpc::{Rpc, RpcError, SessionEvent, SessionId};
use counting::{COUNT, COUNTING};

thread_local! {
    // Const-initialised and without destructors: using them never allocates.
    /// The worker's session and the calls ended so far (the continuation's state).
    static SESSION: Cell<Option<SessionId>> = const { Cell::new(None) };
    static ENDED: Cell<u64> = const { Cell::new(0) };
}

const WARM_UP: u64 = 10_000;
const MEASURED: u64 = 50_000;
const IN_FLIGHT: u64 = 32;

/// The worker's allocations in the measured window, once it closed (`u64::MAX` before).
static MEASURED_ALLOCATIONS: AtomicU64 = AtomicU64::new(u64::MAX);
/// Calls that did not end with their echo.
static FAILED: AtomicU64 = AtomicU64::new(0);
/// Whether the calls are the merging run's (`ECHO` mergeable, four distinct requests).
static MERGING: AtomicBool = AtomicBool::new(false);
/// One run at a time (the statics above are the run's).
static ONE_RUN: Mutex<()> = Mutex::new(());

/// The raw call's continuation: checks the echo, then as `next`.
fn again(rpc: &mut Rpc<'_, Soft>, outcome: Result<&[u8], RpcError>) {
    if outcome.map_or(true, |r| r != 8u64.to_le_bytes()) {
        FAILED.fetch_add(1, Ordering::Relaxed);
    }
    next(rpc);
}

/// The typed call's continuation (`AddOne`, encoded and decoded in place): checks the sum,
/// then as `next`.
fn again_typed(rpc: &mut Rpc<'_, Soft>, outcome: Result<u64, RpcError>) {
    if outcome.map_or(true, |n| n != 9) {
        FAILED.fetch_add(1, Ordering::Relaxed);
    }
    next(rpc);
}

/// The borrowed typed call's continuation (`Prefix`: request and response decoded in place):
/// checks the slice, then as `next`.
fn again_borrowed(rpc: &mut Rpc<'_, Soft>, outcome: Result<&str, RpcError>) {
    if outcome.map_or(true, |t| t != "hot") {
        FAILED.fetch_add(1, Ordering::Relaxed);
    }
    next(rpc);
}

/// The merging run's continuation: checks that the echo is one of the four requests, then
/// as `next`.
fn again_merged(rpc: &mut Rpc<'_, Soft>, outcome: Result<&[u8], RpcError>) {
    let echoed = outcome.ok().and_then(|r| r.try_into().ok()).map(u64::from_le_bytes);
    if echoed.is_none_or(|v| v >= 4) {
        FAILED.fetch_add(1, Ordering::Relaxed);
    }
    next(rpc);
}

/// Counts the call, opens or closes the window, calls again: raw calls, typed ones and typed
/// ones that borrow, by turns.
fn next(rpc: &mut Rpc<'_, Soft>) {
    let ended = ENDED.get() + 1;
    ENDED.set(ended);
    if ended == WARM_UP {
        COUNT.set(0);
        COUNTING.set(true);
    }
    if ended == WARM_UP + MEASURED {
        COUNTING.set(false);
        MEASURED_ALLOCATIONS.store(COUNT.get(), Ordering::Release);
    }
    if ended + IN_FLIGHT <= WARM_UP + MEASURED {
        let Some(s) = SESSION.get() else { return };
        let made = match ended % 3 {
            _ if MERGING.load(Ordering::Relaxed) => {
                rpc.call(s, ECHO, &(ended % 4).to_le_bytes(), LONG, again_merged)
            }
            0 => rpc.call(s, ECHO, &8u64.to_le_bytes(), LONG, again),
            1 => rpc.call_method::<AddOne>(s, &8, LONG, again_typed),
            _ => rpc.call_method::<Prefix>(s, &(3, "hot path"), LONG, again_borrowed),
        };
        if made.is_err() {
            FAILED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[test]
fn steady_state_calls_allocate_nothing_on_the_worker() {
    let m = steady_state(false, "10.98.15.1");
    assert_eq!(m.merged, 0, "{m:?}");
}

#[test]
fn steady_state_merged_calls_allocate_nothing_on_the_worker() {
    let m = steady_state(true, "10.98.15.2");
    // (most calls ride on an identical one: four requests, 32 calls in flight)
    assert!(m.merged > MEASURED / 2, "{m:?}");
}

/// Runs the closed loop (merging or not) and checks that its measured window allocated
/// nothing and every call got its echo; returns the endpoint's metrics.
fn steady_state(merging: bool, ip: &str) -> corelink_rpc::RpcMetrics {
    let _one = ONE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    MEASURED_ALLOCATIONS.store(u64::MAX, Ordering::Release);
    FAILED.store(0, Ordering::Relaxed);
    MERGING.store(merging, Ordering::Relaxed);
    // The counter counts.
    COUNTING.set(true);
    let b = std::hint::black_box(Box::new(7u64));
    COUNTING.set(false);
    drop(b);
    assert_eq!(COUNT.get(), 1, "the counter counts");
    let site = Site::soft(ip);
    let at = site.listen;
    let credits = move |cfg: corelink_rpc::EndpointConfig| cfg.with_credits(IN_FLIGHT as u16);
    let mergeable = move |ep: &mut corelink_rpc::Endpoint<Soft>| {
        ep.set_mergeable(ECHO, merging).unwrap();
    };
    let rig = Rig::<Soft>::start_setup(&site.map(""), credits, mergeable, move || {
        move |rpc: &mut Rpc<'_, Soft>, ev| match ev {
            Ev::Start => {
                rpc.connect(at).unwrap();
            }
            Ev::Session(s, SessionEvent::Connected) => {
                SESSION.set(Some(s));
                for _ in 0..IN_FLIGHT {
                    rpc.call(s, ECHO, &8u64.to_le_bytes(), LONG, again).unwrap();
                }
            }
            Ev::Session(..) => {}
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while MEASURED_ALLOCATIONS.load(Ordering::Acquire) == u64::MAX {
        assert!(std::time::Instant::now() < deadline, "the loop never got through");
        std::thread::sleep(Duration::from_millis(5));
    }
    let m = rig.metrics_when(|m| m.responses >= WARM_UP + MEASURED);
    rig.engine.shutdown().unwrap();
    assert_eq!(FAILED.load(Ordering::Relaxed), 0, "{m:?}");
    let allocations = MEASURED_ALLOCATIONS.load(Ordering::Relaxed);
    println!("{MEASURED} calls after {WARM_UP} to warm up: {allocations} allocations; {m:?}");
    assert_eq!(allocations, 0, "allocations on the worker in steady state");
    m
}
