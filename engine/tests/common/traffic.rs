//! A run-to-completion traffic generator for steady-state tests: the worker's handler connects
//! its engine to itself (from its first `poll`), then keeps `writes` 8-byte RDMA writes to the
//! peer's region, `reads` 8-byte RDMA reads, `atomics` fetch-and-adds and compare-and-swaps and
//! `sends` 8-byte messages in flight, the accepting side echoing each message back. Every completion re-issues its request with the same buffer (a write's comes back in
//! `Done::buf`; a send's buffer waits for its echo), so the steady state takes buffers from the
//! pool only for the echoes and returns them at once.
//!
//! `probe(true)` is called on the worker thread at completion `window.0` and `probe(false)` at
//! completion `window.1`; what each returns is stored in the [`Report`]. The handler stops
//! issuing requests at completion `target` and says so in `Report::done`.
//!
//! Included (with `#[path]`) by `hot_path_alloc.rs` and `busy_worker_switches.rs`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::{Provider, RemoteRegion, WcStatus};
use corelink_engine::Buf;
use corelink_engine::{ConnId, ConnInfo, Cx, Done, Engine, Handler, Message, OpKind, Placement};

use crate::grant::{granted, Granter};

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// RDMA writes in flight.
    pub writes: usize,
    /// Messages in flight (each echoed by the peer).
    pub sends: usize,
    /// 8-byte RDMA reads in flight.
    pub reads: usize,
    /// Atomics in flight (fetch-and-adds and compare-and-swaps, alternately).
    pub atomics: usize,
    /// Completions after which no new request is issued.
    pub target: u64,
    /// The completions at which `probe(true)` and `probe(false)` are called.
    pub window: (u64, u64),
}

/// What the handler tells the test, from the worker's thread.
#[derive(Debug, Default)]
pub struct Report {
    /// The address to connect to (set by the test once the engine listens).
    pub addr: OnceLock<SocketAddr>,
    /// Set at completion `target` (or on a failure).
    pub done: AtomicBool,
    /// Completions of the handler's requests (writes, sends, echoes).
    pub completions: AtomicU64,
    /// Successful completions by kind: writes, sends, echoes.
    pub writes: AtomicU64,
    /// Sends completed.
    pub sends: AtomicU64,
    /// Echoes (the accepting side's sends) completed.
    pub echoes: AtomicU64,
    /// Reads completed.
    pub reads: AtomicU64,
    /// Atomics completed.
    pub atomics: AtomicU64,
    /// Echoes received by the connecting side.
    pub echoes_received: AtomicU64,
    /// Requests that failed before `target`.
    pub failures: AtomicU64,
    /// The first failure.
    pub first_failure: Mutex<Option<String>>,
    /// `probe(true)`'s values, at completion `window.0`.
    pub before: [AtomicU64; 2],
    /// `probe(false)`'s values, at completion `window.1`.
    pub after: [AtomicU64; 2],
    /// Set once `probe(false)` ran.
    pub window_closed: AtomicBool,
}

impl Report {
    fn fail(&self, what: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut f = self.first_failure.lock().unwrap();
        if f.is_none() {
            *f = Some(what);
        }
        self.done.store(true, Ordering::Release);
    }

    /// `after - before`, per probe value.
    pub fn window(&self) -> (u64, u64) {
        let d = |i: usize| {
            self.after[i]
                .load(Ordering::Acquire)
                .wrapping_sub(self.before[i].load(Ordering::Acquire))
        };
        (d(0), d(1))
    }
}

const WRITE: u64 = 1;
const SEND: u64 = 2;
const ECHO: u64 = 3;
const READ: u64 = 4;
const ATOMIC: u64 = 5;
/// Where in the peer's region reads and atomics go (writes go from offset 0).
const READS_AT: u64 = 64 << 10;
const ATOMICS_AT: u64 = 128 << 10;

/// The handler (see the module's documentation).
pub struct Traffic<P: Provider> {
    plan: Plan,
    report: Arc<Report>,
    probe: fn(bool) -> (u64, u64),
    connecting: bool,
    conn: Option<ConnId>,
    region: Option<RemoteRegion>,
    /// The accepting side's memory, granted to the initiating side.
    granter: Granter<P>,
    /// Send buffers whose send completed, waiting for a credit (an echo).
    send_bufs: Vec<Buf<P>>,
    /// Echoes received and not yet answered with a send.
    credits: usize,
    completions: u64,
}

impl<P: Provider> Traffic<P> {
    /// A handler that reports to `report` and calls `probe` at the window's ends.
    pub fn new(plan: Plan, report: Arc<Report>, probe: fn(bool) -> (u64, u64)) -> Self {
        Traffic {
            plan,
            report,
            probe,
            connecting: false,
            conn: None,
            region: None,
            granter: Granter::default(),
            send_bufs: Vec::new(),
            credits: 0,
            completions: 0,
        }
    }

    fn stopped(&self) -> bool {
        self.completions >= self.plan.target
    }

    fn write(&mut self, cx: &mut Cx<P>, buf: Buf<P>, i: u64) {
        let (Some(conn), Some(region)) = (self.conn, self.region) else { return };
        if let Err((_, e)) = cx.write(conn, buf, region.at(i * 8), None, WRITE | (i << 8)) {
            self.report.fail(format!("write {i}: {e}"));
        }
    }

    fn read(&mut self, cx: &mut Cx<P>, buf: Buf<P>, i: u64) {
        let (Some(conn), Some(region)) = (self.conn, self.region) else { return };
        if let Err((_, e)) = cx.read(conn, buf, region.at(READS_AT + i * 8), READ | (i << 8)) {
            self.report.fail(format!("read {i}: {e}"));
        }
    }

    /// Fetch-and-add on even rounds, compare-and-swap (of what is most likely there) on odd.
    fn atomic(&mut self, cx: &mut Cx<P>, i: u64, round: u64, last: u64) {
        let (Some(conn), Some(region)) = (self.conn, self.region) else { return };
        let (remote, token) =
            (region.at(ATOMICS_AT + i * 8), ATOMIC | (i << 8) | ((round + 1) << 32));
        let r = if round % 2 == 0 {
            cx.fetch_add(conn, remote, 1, token)
        } else {
            cx.compare_swap(conn, remote, last, last + 1, token)
        };
        if let Err((_, e)) = r {
            self.report.fail(format!("atomic {i}: {e}"));
        }
    }

    /// Sends while there are credits and buffers.
    fn pump(&mut self, cx: &mut Cx<P>) {
        let Some(conn) = self.conn else { return };
        while self.credits > 0 && !self.stopped() {
            let Some(buf) = self.send_bufs.pop() else { return };
            self.credits -= 1;
            if let Err((_, e)) = cx.send(conn, buf, None, SEND) {
                self.report.fail(format!("send: {e}"));
            }
        }
    }
}

impl<P: Provider> Handler<P> for Traffic<P> {
    fn on_start(&mut self, cx: &mut Cx<P>) {
        // (registered before the loop: its counts over the whole loop are the traffic's)
        let _ = self.granter.prepare(cx);
    }

    fn poll(&mut self, cx: &mut Cx<P>) {
        if self.connecting {
            return;
        }
        if let Some(&addr) = self.report.addr.get() {
            self.connecting = true;
            if let Err(e) = cx.connect(addr, b"traffic", 1) {
                self.report.fail(format!("connect: {e}"));
            }
        }
    }

    fn on_connect_failed(
        &mut self,
        _cx: &mut Cx<P>,
        _token: u64,
        error: &corelink_engine::EngineError,
    ) {
        self.report.fail(format!("connect: {}", corelink_engine::verbs::chain(error)));
    }

    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        if info.initiated {
            self.conn = Some(conn); // it starts once the peer's grant arrives
        } else {
            self.granter.grant(cx, conn); // the accepting side grants its memory and echoes
        }
    }

    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        if let (Some(region), Some(c)) = (granted(msg), self.conn) {
            if c == conn && self.region.is_none() {
                self.region = Some(region);
                self.start(cx);
            }
            return;
        }
        if Some(conn) == self.conn {
            self.report.echoes_received.fetch_add(1, Ordering::Relaxed);
            self.credits += 1;
            return self.pump(cx);
        }
        let mut buf = match cx.alloc(msg.data.len()) {
            Ok(b) => b,
            Err(e) => return self.report.fail(format!("echo buffer: {e}")),
        };
        buf.fill(msg.data).unwrap();
        if let Err((_, e)) = cx.send(conn, buf, None, ECHO) {
            if !self.stopped() {
                self.report.fail(format!("echo: {e}"));
            }
        }
    }

    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        if done.token == crate::grant::TOKEN {
            return; // the grant's message went
        }
        self.on_done(cx, done);
    }
}

/// Starts an engine (`provider`'s lines first; control core 0, one worker on core 1, never parking) whose worker
/// runs `Traffic` to its own listen address `listen`.
pub fn start<P: Provider>(
    provider: &str,
    listen: &str,
    plan: Plan,
    probe: fn(bool) -> (u64, u64),
) -> (Engine<P>, Arc<Report>) {
    let text = format!(
        "{provider}\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 0"
    );
    let map = parse(&text).unwrap();
    let v = map.validate(&MachineTopology::load().unwrap()).unwrap();
    let report = Arc::new(Report::default());
    let r = report.clone();
    let e = Engine::<P>::start(&v, Placement::RoundRobin, move |_| {
        Traffic::<P>::new(plan, r.clone(), probe)
    })
    .unwrap();
    report.addr.set(e.listen_addr().unwrap()).unwrap();
    (e, report)
}

/// Waits until the handler says it is done (`hang` only guards against a hang).
pub fn wait_done(report: &Report, hang: Duration) {
    let deadline = Instant::now() + hang;
    while !report.done.load(Ordering::Acquire) {
        assert!(
            Instant::now() < deadline,
            "no progress: {} completions after {hang:?}",
            report.completions.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        report.failures.load(Ordering::Relaxed),
        0,
        "{:?}",
        report.first_failure.lock().unwrap()
    );
}

impl<P: Provider> Traffic<P> {
    /// The initiating side's traffic, once the peer's memory is known.
    fn start(&mut self, cx: &mut Cx<P>) {
        for i in 0..self.plan.writes as u64 {
            let mut buf = cx.alloc(8).expect("a write buffer");
            buf.fill(&i.to_ne_bytes()).unwrap();
            self.write(cx, buf, i);
        }
        for i in 0..self.plan.reads as u64 {
            let buf = cx.alloc(8).expect("a read buffer");
            self.read(cx, buf, i);
        }
        for i in 0..self.plan.atomics as u64 {
            self.atomic(cx, i, 0, 0);
        }
        self.send_bufs.reserve_exact(self.plan.sends);
        for i in 0..self.plan.sends as u64 {
            let mut buf = cx.alloc(8).expect("a send buffer");
            buf.fill(&i.to_ne_bytes()).unwrap();
            self.send_bufs.push(buf);
        }
        self.credits = self.plan.sends;
        self.pump(cx);
    }

    /// A completion of this handler's traffic.
    fn on_done(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        self.completions += 1;
        let n = self.completions;
        self.report.completions.store(n, Ordering::Relaxed);
        if n == self.plan.window.0 {
            let (a, b) = (self.probe)(true);
            self.report.before[0].store(a, Ordering::Release);
            self.report.before[1].store(b, Ordering::Release);
        }
        if n == self.plan.window.1 {
            let (a, b) = (self.probe)(false);
            self.report.after[0].store(a, Ordering::Release);
            self.report.after[1].store(b, Ordering::Release);
            self.report.window_closed.store(true, Ordering::Release);
        }
        if n == self.plan.target {
            self.report.done.store(true, Ordering::Release);
        }
        if done.status != WcStatus::Success {
            if n <= self.plan.target {
                self.report.fail(format!("{:?} {:?} token {}", done.kind, done.status, done.token));
            }
            return;
        }
        let counter = match done.kind {
            OpKind::Write => &self.report.writes,
            OpKind::Read => &self.report.reads,
            OpKind::FetchAdd | OpKind::CompareSwap => &self.report.atomics,
            OpKind::Send if done.token == ECHO => &self.report.echoes,
            OpKind::Send => &self.report.sends,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if self.stopped() {
            return; // buffers go back to the pool
        }
        let i = (done.token >> 8) & 0xff_ffff;
        match (done.token & 0xff, done.buf) {
            (WRITE, Some(buf)) => self.write(cx, buf, i),
            (READ, Some(buf)) => self.read(cx, buf, i),
            (ATOMIC, buf) => {
                drop(buf); // the engine's 8-byte result buffer, back to the pool
                let last = done.old_value.unwrap_or(0);
                let last = if done.kind == OpKind::FetchAdd { last + 1 } else { last };
                self.atomic(cx, i, done.token >> 32, last);
            }
            (SEND, Some(buf)) => {
                self.send_bufs.push(buf);
                self.pump(cx);
            }
            _ => {} // an echo's buffer goes back to the pool
        }
    }
}
