//! No allocation on a worker's hot path: with a counting global allocator, a worker runs
//! steady-state traffic through its handler (run to completion, on `soft`: the engine connected
//! to itself, 8-byte RDMA writes and reads, atomics and echoed 8-byte sends in flight) and the allocations its
//! thread makes between request 10,000 and request 110,000 are counted. Start-up, connection
//! set-up and warm-up may allocate; the steady state may not.
//!
//! The counts are per thread, so the `soft` test and the `ibverbs` one (which runs only where
//! `CORELINK_IBV_DEVICE` names a device, e.g. in `tests/rxe-guest/run`) may run at once.
//!
//! To find an allocation, run with `CORELINK_ALLOC_TRAP=1`: the first few counted allocations
//! print a backtrace.

#[cfg(feature = "ibverbs")]
#[path = "common/grant.rs"]
mod grant;
#[path = "common/ibverbs_env.rs"]
mod ibverbs_env;
#[path = "common/traffic.rs"]
mod traffic;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use corelink_verbs::soft::Soft;
use corelink_verbs::Provider;

/// The system allocator, counting the allocations of threads that turned `COUNTING` on.
struct Counting;

thread_local! {
    // Const-initialised and without destructors: using them never allocates.
    /// Whether this thread's allocations are counted.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// This thread's counted allocations and their bytes.
    static COUNTS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Set from `CORELINK_ALLOC_TRAP`: print a backtrace for each of the first `TRAPS` counted
/// allocations.
static TRAP: AtomicBool = AtomicBool::new(false);
static TRAPS: AtomicU64 = AtomicU64::new(5);

fn note(size: usize) {
    if !COUNTING.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    let _ = COUNTS.try_with(|c| {
        let (n, bytes) = c.get();
        c.set((n + 1, bytes + size as u64));
    });
    if TRAP.load(Ordering::Relaxed) && TRAPS.fetch_sub(1, Ordering::Relaxed) > 0 {
        // Not counted (nor trapped) while the backtrace allocates.
        COUNTING.set(false);
        let bt = std::backtrace::Backtrace::force_capture();
        eprintln!("allocation of {size} bytes on the worker's hot path:\n{bt}");
        COUNTING.set(true);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees are ours; the counting beside it allocates nothing (const thread-local `Cell`s and
// atomics), except the opt-in backtrace, made with counting off so that it does not recurse.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract for `alloc` (a layout of non-zero size) is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` was allocated by this allocator, i.e. by `System`, with `layout`; the
        // caller's contract for `new_size` is `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator, i.e. by `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Turns counting on (`true`) or off for the calling thread (the worker), and reads its counts
/// (allocations, bytes).
fn probe(start: bool) -> (u64, u64) {
    COUNTING.set(false);
    let counts = COUNTS.get();
    COUNTING.set(start);
    counts
}

const WARM_UP: u64 = 10_000;
const MEASURED: u64 = 100_000;

/// Runs the traffic on `P` and asserts that the measured requests allocated nothing.
fn steady_state<P: Provider>(provider: &str, listen: &str) {
    // The counter counts: one allocation by a counting thread.
    let before = probe(true);
    let b = std::hint::black_box(Box::new(7u64));
    let after = probe(false);
    drop(b);
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 8), "the counter counts");
    TRAP.store(std::env::var_os("CORELINK_ALLOC_TRAP").is_some(), Ordering::Relaxed);
    let plan = traffic::Plan {
        writes: 32,
        sends: 8,
        reads: 8,
        atomics: 8,
        target: WARM_UP + MEASURED,
        window: (WARM_UP, WARM_UP + MEASURED),
    };
    let (e, report) = traffic::start::<P>(provider, listen, plan, probe);
    traffic::wait_done(&report, Duration::from_secs(300));
    assert!(report.window_closed.load(Ordering::Acquire));
    let metrics = e.shutdown().unwrap();
    let (allocations, bytes) = report.window();
    let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "{}: requests {MEASURED} (after {WARM_UP} to warm up): {allocations} allocations \
         ({bytes} bytes) on the worker, {:.4} per request; writes {}, reads {}, atomics {}, \
         sends {}, echoes {} (received {})",
        P::NAME,
        allocations as f64 / MEASURED as f64,
        r(&report.writes),
        r(&report.reads),
        r(&report.atomics),
        r(&report.sends),
        r(&report.echoes),
        r(&report.echoes_received),
    );
    println!("{}", metrics[0]);
    for (what, c) in [
        ("writes", &report.writes),
        ("reads", &report.reads),
        ("atomics", &report.atomics),
        ("sends", &report.sends),
        ("echoes", &report.echoes),
    ] {
        assert!(r(c) > 0, "no {what}");
    }
    assert_eq!(allocations, 0, "allocations on the worker in steady state ({bytes} bytes)");
}

#[test]
fn steady_state_requests_allocate_nothing_on_the_worker() {
    steady_state::<Soft>("provider = \"soft\"", "10.99.1.1:0");
}

/// The same on the `ibverbs` device named by `CORELINK_IBV_DEVICE` (skipped without one).
#[cfg(feature = "ibverbs")]
#[test]
fn steady_state_requests_allocate_nothing_on_the_worker_on_ibverbs() {
    let Some((provider, ip)) = ibverbs_env::target() else { return };
    let listen = std::net::SocketAddr::new(ip, 0).to_string();
    steady_state::<corelink_verbs::ibverbs::Ibverbs>(&provider, &listen);
}

/// Where the client test's count window is: asked (by the test) and started, stopped (by the
/// worker's handler).
static CLIENT_START: AtomicBool = AtomicBool::new(false);
static CLIENT_STARTED: AtomicBool = AtomicBool::new(false);
static CLIENT_STOP: AtomicBool = AtomicBool::new(false);
/// The window's allocations on the worker, once it closed (`u64::MAX` before).
static CLIENT_ALLOCATIONS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Echoes every message, and opens and closes the worker's count window as the test asks.
struct Echo {
    counting: bool,
}

impl corelink_engine::Handler<Soft> for Echo {
    fn on_message(
        &mut self,
        cx: &mut corelink_engine::Cx<Soft>,
        conn: corelink_engine::ConnId,
        msg: &corelink_engine::Message<'_>,
    ) {
        let mut b = cx.alloc(msg.data.len()).unwrap();
        b.fill(msg.data).unwrap();
        cx.send(conn, b, None, 0).map_err(|(_, e)| e).unwrap();
    }

    fn poll(&mut self, _cx: &mut corelink_engine::Cx<Soft>) {
        if !self.counting && CLIENT_START.load(Ordering::Acquire) {
            self.counting = true;
            probe(true);
            CLIENT_STARTED.store(true, Ordering::Release);
        } else if self.counting && CLIENT_STOP.load(Ordering::Acquire) {
            self.counting = false;
            let (allocations, _) = probe(false);
            CLIENT_ALLOCATIONS.store(allocations, Ordering::Release);
        }
    }
}

/// A `Client`'s messages: the engine connects to itself through a client (the connection and
/// its messages are the client's), the handler echoes each message, and the client keeps 16
/// in flight, giving each echo's vector back (`Client::recycle`) and reusing each send's. The
/// worker's allocations between echo 10,000 and echo 60,000 are counted.
#[test]
fn steady_state_client_messages_allocate_nothing_on_the_worker() {
    use corelink_engine::{Engine, Event, Op, Placement};
    const IN_FLIGHT: usize = 16;
    const WARM: u64 = 10_000;
    const COUNTED: u64 = 50_000;
    let text = "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\n\
                listen = \"10.99.1.2:0\"\n[worker]\nidle_after_us = 0";
    let map = corelink_config::parse(text).unwrap();
    let map = map.validate(&corelink_config::MachineTopology::load().unwrap()).unwrap();
    let mut engine =
        Engine::<Soft>::start(&map, Placement::RoundRobin, |_| Echo { counting: false }).unwrap();
    let mut client = engine.client(0).unwrap();
    client.connect(engine.listen_addr().unwrap(), b"", 1).unwrap();
    let wait = Duration::from_secs(30);
    let Some(Event::Connected { conn, .. }) = client.wait(wait) else { panic!("no connection") };
    let mut free: Vec<Vec<u8>> = (0..IN_FLIGHT).map(|_| vec![7u8; 8]).collect();
    let (mut owed, mut echoes) = (IN_FLIGHT, 0u64);
    while echoes < WARM + COUNTED {
        while owed > 0 {
            let Some(buf) = free.pop() else { break };
            client.submit(conn, Op::Send { buf, imm: None }, 2).map_err(|(_, e)| e).unwrap();
            owed -= 1;
        }
        match client.wait(wait).expect("an event") {
            Event::Message { data, .. } => {
                assert_eq!(data, [7u8; 8], "the echo");
                client.recycle(data);
                echoes += 1;
                owed += 1;
                if echoes == WARM {
                    CLIENT_START.store(true, Ordering::Release);
                    while !CLIENT_STARTED.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                }
            }
            Event::Done(d) => {
                assert!(d.status.is_success(), "{d:?}");
                free.extend(d.buf);
            }
            e => panic!("{e:?}"),
        }
    }
    CLIENT_STOP.store(true, Ordering::Release);
    let deadline = std::time::Instant::now() + wait;
    while CLIENT_ALLOCATIONS.load(Ordering::Acquire) == u64::MAX {
        assert!(std::time::Instant::now() < deadline, "the window never closed");
        std::thread::sleep(Duration::from_millis(1));
    }
    let metrics = engine.shutdown().unwrap();
    let allocations = CLIENT_ALLOCATIONS.load(Ordering::Relaxed);
    println!("client echoes {COUNTED} (after {WARM}): {allocations} allocations on the worker");
    println!("{}", metrics[0]);
    assert_eq!(allocations, 0, "allocations on the worker for a client's messages");
}
