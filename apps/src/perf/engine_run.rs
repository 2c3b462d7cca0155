//! The eight tests on the engine (RC): the core map, the worker handler (a server part and a
//! client part, routed by `ConnInfo::initiated` so that a loopback run is one engine connected
//! to itself), and the main thread's start / collect / shut down.
//!
//! How each test runs (the client part, on its worker; latency samples read the time-stamp
//! counter there, as perftest does (`clock.rs`), bandwidth tests the worker loop's clock, read
//! once per iteration at most):
//! - `write_bw`, `read_bw`, `send_bw`, `atomic_bw`: a window of requests in flight (the TX
//!   depth, see [`PerfOpts::window`]); each completion re-issues its request with the same
//!   buffer until `-n` were issued (or `-D` passed). Average = all bytes / all time; peak = the
//!   best rate over intervals of at least [`PEAK_INTERVAL`] (at least the average).
//! - `read_lat`, `atomic_lat`: one read (fetch-and-add) at a time; each sample is its full round
//!   trip, reported as is (perftest's convention for reads and atomics).
//! - `send_lat`: a send ping-pong, the server echoing each message; `write_lat`: a ping-pong of
//!   RDMA writes, each side's handler polling the last byte of its region for the other's
//!   write, as perftest does (see [`POLL_SLOT`]; sizes over half the region fall back to writes
//!   with immediate, answered through the receive queue). Both report half the round trip
//!   (one-way), as perftest does.
//!
//! The server part is generic: it echoes sends carrying [`ECHO_IMM`], answers writes carrying
//! [`ECHO_IMM`] with a write of the same length into the client's region, and otherwise only
//! keeps its region and receives available; it refuses a client whose test or sizes it was not
//! started for.

use std::net::SocketAddr;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use corelink_config::{parse, CoreMap, CoreSpec, MachineTopology, PoolClass, ProviderKind};
use corelink_config::{Topology, Validated};
use corelink_engine::engine::REGION_BYTES;
use corelink_engine::pool::Buf;
use corelink_engine::verbs::{Provider, RemoteRegion, WcStatus};
use corelink_engine::{CloseReason, ConnId, ConnInfo, Cx, Done, Engine, Handler, Message, Op};
use corelink_engine::{EngineError, Placement};

use super::clock::Clock;
use super::opts::{PerfError, PerfOpts, Prov, Role, Test, Verb, DEFAULT_PORT};
use super::{Latency, Report};

/// The immediate that asks the server to answer (echo a send, write back a write).
pub const ECHO_IMM: u32 = 0x6563_686f;

/// The shortest interval a peak-bandwidth sample spans.
pub const PEAK_INTERVAL: Duration = Duration::from_millis(1);

const HELLO: &[u8; 7] = b"clperf1";

/// What the handlers tell the main thread.
#[derive(Debug)]
enum Event {
    /// A client part measured one size.
    Size(SizeResult),
    /// A client part finished (all sizes, then closed) or failed.
    ClientDone(Result<(), String>),
    /// A server part's client disconnected (`Ok(conns the client said it opens)`), or failed.
    ServerDone(Result<u16, String>),
}

/// One client part's measurement of one size.
#[derive(Debug)]
struct SizeResult {
    index: usize,
    bytes: usize,
    iterations: u64,
    elapsed: Duration,
    /// Best messages per second over an interval.
    peak_rate: f64,
    /// Latency samples (ns), for latency tests.
    samples: Vec<u64>,
}

/// What every handler part shares.
#[derive(Clone, Debug)]
struct Shared {
    target: Arc<OnceLock<SocketAddr>>,
    tx: Sender<Event>,
}

impl Shared {
    fn tell(&self, e: Event) {
        let _ = self.tx.send(e);
    }
}

/// The connection's private data: hello, test, largest size, connections the client opens.
fn hello(test: Test, max: usize, conns: u16) -> Vec<u8> {
    let mut v = HELLO.to_vec();
    v.push(test.code());
    v.extend_from_slice(&(max as u64).to_le_bytes());
    v.extend_from_slice(&conns.to_le_bytes());
    v
}

fn parse_hello(d: &[u8]) -> Option<(Test, usize, u16)> {
    if d.len() < 18 || &d[..7] != HELLO {
        return None;
    }
    let test = Test::from_code(d[7])?;
    let max = u64::from_le_bytes(d[8..16].try_into().ok()?) as usize;
    let conns = u16::from_le_bytes(d[16..18].try_into().ok()?);
    Some((test, max, conns))
}

// ---------------------------------------------------------------------------------------------
// The server part.

struct ServerPart {
    shared: Shared,
    test: Test,
    max_size: usize,
    /// The sizes, in order (`write_lat` in polling mode answers with the marker's size).
    sizes: Vec<usize>,
    /// The last marker seen (polling mode).
    last: u8,
    conn: Option<(ConnId, Option<RemoteRegion>, u16)>,
    error: Option<String>,
}

impl ServerPart {
    fn fail<P: Provider>(&mut self, cx: &mut Cx<P>, conn: ConnId, e: String) {
        self.error.get_or_insert(e);
        let _ = cx.close(conn);
    }

    /// `write_lat` in polling mode: answers a new marker at the end of the server's slot.
    fn poll<P: Provider>(&mut self, cx: &mut Cx<P>) {
        if self.test != Test::WriteLat || !write_lat_polls(&self.sizes) || self.error.is_some() {
            return;
        }
        let Some((conn, Some(region), _)) = self.conn else { return };
        let b = region_byte(cx, POLL_SLOT - 1);
        if b == 0 || b == self.last {
            return;
        }
        self.last = b;
        let Some(&size) = self.sizes.get(usize::from(b >> 3)) else {
            return self.fail(cx, conn, format!("marker {b:#x}: a size this server lacks"));
        };
        let r = cx.alloc(size).and_then(|mut buf| {
            buf.set_len(size)?;
            buf.as_mut_slice()[size - 1] = b;
            let at = region.at((2 * POLL_SLOT - size) as u64);
            cx.write(conn, buf, at, None, 0).map_err(|(_, e)| e)
        });
        if let Err(e) = r {
            if !matches!(e, EngineError::ConnectionClosing(_) | EngineError::ShuttingDown) {
                self.fail(cx, conn, format!("answering: {e}"));
            }
        }
    }
}

impl<P: Provider> Handler<P> for ServerPart {
    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        let Some((test, max, conns)) = parse_hello(&info.private_data) else {
            self.conn = Some((conn, None, 1));
            return self.fail(cx, conn, "a client that is not corelink-perf".into());
        };
        self.conn = Some((conn, info.peer_region, conns));
        if test != self.test {
            let (c, s) = (test.name(), self.test.name());
            return self.fail(cx, conn, format!("the client runs {c}, this server {s}"));
        }
        if max > self.max_size {
            let m = self.max_size;
            let e = format!(
                "the client sends up to {max} B, this server was started for {m} B (give both \
                 the same -s / -a)"
            );
            self.fail(cx, conn, e);
        }
    }

    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        if msg.imm != Some(ECHO_IMM) {
            return; // send_bw: receive and let the engine repost
        }
        let r = match msg.written {
            None => cx.alloc(msg.data.len()).and_then(|mut b| {
                b.fill(msg.data)?;
                cx.send(conn, b, Some(ECHO_IMM), 0).map_err(|(_, e)| e)
            }),
            Some(n) => {
                let Some(region) = self.conn.and_then(|c| c.1) else {
                    return self.fail(cx, conn, "the client exposes no region".into());
                };
                cx.alloc(n as usize).and_then(|b| {
                    cx.write(conn, b, region.at(0), Some(ECHO_IMM), 0).map_err(|(_, e)| e)
                })
            }
        };
        if let Err(e) = r {
            if !matches!(e, EngineError::ConnectionClosing(_) | EngineError::ShuttingDown) {
                self.fail(cx, conn, format!("answering: {e}"));
            }
        }
    }

    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<P>) {
        if !done.status.is_success() && done.status != WcStatus::WrFlushErr {
            self.fail(cx, done.conn, format!("answer: {}", done.status));
        }
    }

    fn on_closed(&mut self, _cx: &mut Cx<P>, _conn: ConnId, reason: &CloseReason) {
        let conns = self.conn.map_or(1, |c| c.2);
        self.shared.tell(Event::ServerDone(match (self.error.take(), reason) {
            (Some(e), _) => Err(e),
            (None, CloseReason::Error(s)) => Err(format!("the connection failed: {s}")),
            (None, _) => Ok(conns),
        }));
    }
}

// ---------------------------------------------------------------------------------------------
// The client part.

struct ClientPart<P: Provider> {
    shared: Shared,
    opts: Arc<PerfOpts>,
    conns: u16,
    asked: bool,
    conn: Option<ConnId>,
    region: Option<RemoteRegion>,
    /// The size being measured (index into `opts.sizes`).
    index: usize,
    finished: bool,
    error: Option<String>,
    // Per size:
    size: usize,
    posted: u64,
    completed: u64,
    started: Instant,
    deadline: Option<Instant>,
    mark: (Instant, u64),
    /// The loop clock of the last completion looked at.
    last_now: Instant,
    peak_rate: f64,
    /// A latency test's request in flight since.
    t0: u64,
    /// The latency samples' clock (the time-stamp counter where there is one).
    clock: Clock,
    /// `write_lat` polls memory for its answers (see [`POLL_SLOT`]).
    polls: bool,
    /// The marker whose answer is awaited (polling mode).
    expect: Option<u8>,
    samples: Vec<u64>,
    /// A bandwidth test's untimed first window is in flight.
    warming: bool,
    /// Buffers (None for atomics) waiting for the timed part.
    spare: Vec<Option<Buf<P>>>,
    /// Flat path: requests the QPs had no room for, to post again at the next poll.
    retry: Vec<Option<Buf<P>>>,
    /// Background writes started (`--bg-writes`).
    bg_started: bool,
    /// State of the record picker (`--hot-records`).
    rng: u64,
    _p: std::marker::PhantomData<fn() -> P>,
}

/// `write_lat` in memory-polling mode (perftest's way): the client writes into the server's
/// region so that the message ends at byte `POLL_SLOT - 1`, which the server's handler polls;
/// the server writes the same length back so that it ends at byte `2 * POLL_SLOT - 1` of the
/// client's region, which the client polls. No receive, no immediate. (In loopback the two
/// regions are one: the two slots keep the directions apart.) The last byte is a marker: the
/// size's index in `-s`/`-a` (so the server answers with the same length) and a sequence.
const POLL_SLOT: usize = REGION_BYTES / 2;

/// Whether `write_lat` runs in memory-polling mode for these sizes (else: writes with
/// immediate, answered through the receive queue).
pub fn write_lat_polls(sizes: &[usize]) -> bool {
    sizes.len() <= 32 && sizes.iter().all(|&s| s > 0 && s <= POLL_SLOT)
}

/// The marker of round trip `seq` of size number `idx` (never 0, never the previous one).
fn marker(idx: usize, seq: u64) -> u8 {
    ((idx as u8 & 0x1f) << 3) | ((seq % 7) as u8 + 1)
}

/// The byte at `offset` of this worker's region.
fn region_byte<P: Provider>(cx: &Cx<P>, offset: usize) -> u8 {
    let mut b = [0u8; 1];
    let _ = corelink_engine::verbs::Mr::read_at(cx.region(), offset, &mut b);
    b[0]
}

/// The token of background writes (`--bg-writes`).
const BG_TOKEN: u64 = u64::MAX - 1;

/// An operation's buffer, back (none for atomics).
fn op_buf<P: Provider>(op: Op<P>) -> Option<Buf<P>> {
    match op {
        Op::Send { buf, .. } | Op::Write { buf, .. } | Op::Read { buf, .. } => Some(buf),
        Op::FetchAdd { .. } | Op::CompareSwap { .. } => None,
    }
}

impl<P: Provider> ClientPart<P> {
    fn new(shared: Shared, opts: Arc<PerfOpts>, conns: u16) -> Self {
        let polls = opts.test == Test::WriteLat && write_lat_polls(&opts.sizes);
        let now = Instant::now();
        ClientPart {
            shared,
            opts,
            conns,
            asked: false,
            conn: None,
            region: None,
            index: 0,
            finished: false,
            error: None,
            size: 0,
            posted: 0,
            completed: 0,
            started: now,
            deadline: None,
            mark: (now, 0),
            last_now: now,
            peak_rate: 0.0,
            t0: 0,
            clock: Clock::new(),
            polls,
            expect: None,
            samples: Vec::new(),
            warming: false,
            spare: Vec::new(),
            retry: Vec::new(),
            bg_started: false,
            rng: 0x9e37_79b9_7f4a_7c15,
            _p: std::marker::PhantomData,
        }
    }

    fn fail(&mut self, cx: &mut Cx<P>, e: String) {
        self.error.get_or_insert(e);
        if let Some(c) = self.conn {
            let _ = cx.close(c);
        }
    }

    fn token(&self) -> u64 {
        self.index as u64
    }

    /// Whether to issue one more request.
    fn more(&self, now: Instant) -> bool {
        match self.deadline {
            Some(d) => now < d,
            None => self.posted < self.opts.iters,
        }
    }

    /// Starts measuring the next size; a bandwidth test first runs one untimed window (it
    /// touches the buffers and the peer's region, as perftest's own set-up does).
    fn start_size(&mut self, cx: &mut Cx<P>) {
        let o = self.opts.clone();
        self.size = o.sizes[self.index];
        self.posted = 0;
        self.spare.clear();
        let mut bufs = Vec::new();
        for _ in 0..o.window(self.size) {
            bufs.push(match o.test.verb() {
                Verb::Atomic => None,
                _ => match cx.alloc(self.size) {
                    Ok(b) => Some(b),
                    Err(e) => return self.fail(cx, format!("a {} B buffer: {e}", self.size)),
                },
            });
        }
        if o.test.is_lat() {
            self.warming = false;
            self.spare = bufs;
            return self.measure(cx);
        }
        self.warming = true;
        for b in bufs {
            self.issue(cx, b);
            if self.error.is_some() {
                return;
            }
        }
    }

    /// Starts the timed part of a size, with the buffers in `spare`.
    fn measure(&mut self, cx: &mut Cx<P>) {
        let o = self.opts.clone();
        self.posted = 0;
        self.completed = 0;
        self.peak_rate = 0.0;
        self.samples.clear();
        if o.test.is_lat() {
            let want = if o.duration.is_some() { 1 << 20 } else { o.iters as usize };
            self.samples.reserve(want.min(1 << 24));
        }
        let now = if o.test.is_lat() { Instant::now() } else { cx.now() };
        self.started = now;
        self.mark = (now, 0);
        self.deadline = o.duration.map(|d| now + d);
        self.start_background(cx);
        for b in std::mem::take(&mut self.spare) {
            if !self.more(now) {
                break;
            }
            self.issue(cx, b);
            if self.error.is_some() {
                return;
            }
        }
    }

    /// Where a read goes: offset 0 (perftest), or with `--hot-records N` one of N hot records
    /// 9 times in 10, else any record of the region's first half (xorshift; no allocation).
    fn read_offset(&mut self) -> u64 {
        let hot = u64::from(self.opts.sched.hot_records);
        if hot == 0 {
            return 0;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let records = ((REGION_BYTES / 2) / self.size.max(1)).max(1) as u64;
        let r = self.rng;
        let rec = if r % 10 < 9 { (r >> 8) % hot.min(records) } else { (r >> 8) % records };
        rec * self.size as u64
    }

    /// Starts `--bg-writes` writes, once, kept in flight until the run ends.
    fn start_background(&mut self, cx: &mut Cx<P>) {
        let (n, size) = (self.opts.sched.bg_writes, self.opts.sched.bg_size);
        if self.bg_started || n == 0 {
            return;
        }
        self.bg_started = true;
        for _ in 0..n {
            match cx.alloc(size) {
                Ok(b) => self.background(cx, b),
                Err(e) => return self.fail(cx, format!("a background write buffer: {e}")),
            }
        }
    }

    /// One background write (into the region's second half).
    fn background(&mut self, cx: &mut Cx<P>, buf: Buf<P>) {
        let (Some(conn), Some(rg)) = (self.conn, self.region) else { return };
        let at = rg.at((REGION_BYTES / 2) as u64);
        if let Err((_, e)) = cx.write(conn, buf, at, None, BG_TOKEN) {
            self.fail(cx, format!("a background write: {e}"));
        }
    }

    /// Issues one request of the test (with `buf` for sends, writes and reads).
    fn issue(&mut self, cx: &mut Cx<P>, buf: Option<Buf<P>>) {
        let (Some(conn), token) = (self.conn, self.token()) else { return };
        let lat = self.opts.test.is_lat();
        let imm = lat.then_some(ECHO_IMM);
        let region = self.region;
        let op = match (self.opts.test.verb(), buf, region) {
            (Verb::Send, Some(buf), _) => Op::Send { buf, imm },
            (Verb::Write, Some(mut buf), Some(rg)) if self.polls => {
                let m = marker(self.index, self.posted);
                if let Err(e) = buf.set_len(self.size) {
                    return self.fail(cx, format!("a {} B write: {e}", self.size));
                }
                buf.as_mut_slice()[self.size - 1] = m;
                self.expect = Some(m);
                Op::Write { buf, remote: rg.at((POLL_SLOT - self.size) as u64), imm: None }
            }
            (Verb::Write, Some(buf), Some(rg)) => Op::Write { buf, remote: rg.at(0), imm },
            (Verb::Read, Some(buf), Some(rg)) => {
                let off = self.read_offset();
                Op::Read { buf, remote: rg.at(off) }
            }
            (Verb::Atomic, _, Some(rg)) => Op::FetchAdd { remote: rg.at(0), add: 1 },
            (_, None, _) => return self.fail(cx, "no buffer for the request".into()),
            (_, _, None) => return self.fail(cx, "the server exposes no region".into()),
        };
        // A sample runs from the request to its answer: the clock starts before the request
        // goes in (the flat path posts, and soft executes, inside the call).
        let t0 = if lat { self.clock.ticks() } else { self.t0 };
        let r = if self.opts.sched.flat {
            cx.post_now(conn, op, token)
        } else {
            cx.submit(conn, op, token)
        };
        match r {
            Ok(()) => {}
            Err((op, EngineError::QueueFull(_))) => return self.retry.push(op_buf(op)),
            Err((_, e)) => {
                return self.fail(cx, format!("{} of {} B: {e}", self.opts.test.name(), self.size))
            }
        }
        self.posted += 1;
        self.t0 = t0;
    }

    /// A round trip of a latency test ended (a completion, or an echo).
    fn lat_sample(&mut self, cx: &mut Cx<P>, buf: Option<Buf<P>>) {
        let end = self.clock.ticks();
        self.samples.push(self.clock.ns_between(self.t0, end));
        self.completed += 1;
        // The loop's clock, for -D (read once per iteration at most).
        let now = cx.now();
        if !self.more(now) {
            return self.finish_size(cx, now);
        }
        let buf = match (self.opts.test.verb(), buf) {
            (Verb::Atomic, _) => None,
            (_, Some(b)) => Some(b),
            (_, None) => match cx.alloc(self.size) {
                Ok(b) => Some(b),
                Err(e) => return self.fail(cx, format!("a {} B buffer: {e}", self.size)),
            },
        };
        self.issue(cx, buf);
    }

    fn finish_size(&mut self, cx: &mut Cx<P>, now: Instant) {
        let elapsed = now.duration_since(self.started);
        let samples = std::mem::take(&mut self.samples);
        self.shared.tell(Event::Size(SizeResult {
            index: self.index,
            bytes: self.size,
            iterations: self.completed,
            elapsed,
            peak_rate: self.peak_rate,
            samples,
        }));
        self.index += 1;
        if self.index < self.opts.sizes.len() {
            self.start_size(cx);
        } else {
            self.finished = true;
            if let Some(c) = self.conn {
                let _ = cx.close(c);
            }
        }
    }
}

impl<P: Provider> Handler<P> for ClientPart<P> {
    fn poll(&mut self, cx: &mut Cx<P>) {
        if let Some(m) = self.expect {
            if region_byte(cx, 2 * POLL_SLOT - 1) == m && self.error.is_none() {
                self.expect = None;
                self.lat_sample(cx, None);
            }
        }
        while let Some(b) = self.retry.pop() {
            let before = self.retry.len();
            self.issue(cx, b);
            if self.retry.len() > before || self.error.is_some() {
                break; // still full: next iteration
            }
        }
        if let (false, Some(&addr)) = (self.asked, self.shared.target.get()) {
            self.asked = true;
            let h = hello(self.opts.test, self.opts.max_size(), self.conns);
            if let Err(e) = cx.connect(addr, &h, 1) {
                self.shared.tell(Event::ClientDone(Err(format!("connect to {addr}: {e}"))));
            }
        }
    }

    fn on_connect_failed(&mut self, _cx: &mut Cx<P>, _token: u64, error: &str) {
        self.shared.tell(Event::ClientDone(Err(format!("connect failed: {error}"))));
    }

    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        self.conn = Some(conn);
        self.region = info.peer_region;
        self.start_size(cx);
    }

    fn on_message(&mut self, cx: &mut Cx<P>, _conn: ConnId, msg: &Message<'_>) {
        if self.finished || self.error.is_some() {
            return;
        }
        let t = self.opts.test;
        if !matches!(t, Test::SendLat | Test::WriteLat) || msg.imm != Some(ECHO_IMM) {
            return self.fail(cx, format!("an unexpected message (immediate {:?})", msg.imm));
        }
        self.lat_sample(cx, None);
    }

    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<P>) {
        if self.error.is_some() {
            return;
        }
        if done.token == BG_TOKEN && done.status.is_success() {
            if let (false, Some(b)) = (self.finished, done.buf) {
                self.background(cx, b);
            }
            return;
        }
        if !done.status.is_success() {
            if self.finished && done.status == WcStatus::WrFlushErr {
                return;
            }
            let (t, s) = (self.opts.test.name(), self.size);
            return self.fail(cx, format!("{t} of {s} B: {}", done.status));
        }
        if self.finished || done.token != self.token() {
            return; // a ping-pong's request of a size already measured
        }
        let t = self.opts.test;
        if self.warming {
            self.spare.push(if t.verb() == Verb::Atomic { None } else { done.buf });
            if self.spare.len() as u64 == self.posted {
                self.warming = false;
                self.measure(cx);
            }
            return;
        }
        if t.is_lat() {
            // Ping-pongs time the echo; reads and atomics their completion.
            if matches!(t, Test::ReadLat | Test::AtomicLat) {
                self.lat_sample(cx, done.buf);
            }
            return;
        }
        self.completed += 1;
        // The loop's own clock (read once per iteration): no clock read per request.
        let now = cx.now();
        if now != self.last_now {
            // Once per iteration (completions of one iteration share its clock).
            self.last_now = now;
            let dt = now.saturating_duration_since(self.mark.0);
            if dt >= PEAK_INTERVAL {
                let rate = (self.completed - self.mark.1) as f64 / dt.as_secs_f64();
                self.peak_rate = self.peak_rate.max(rate);
                self.mark = (now, self.completed);
            }
        }
        if self.more(now) {
            let buf = match t.verb() {
                Verb::Atomic => None,
                _ => done.buf,
            };
            self.issue(cx, buf);
        } else if self.completed == self.posted {
            self.finish_size(cx, now);
        }
    }

    fn on_closed(&mut self, _cx: &mut Cx<P>, _conn: ConnId, reason: &CloseReason) {
        let r = match (self.error.take(), self.finished) {
            (Some(e), _) => Err(e),
            (None, true) => Ok(()),
            (None, false) => Err(format!(
                "the connection closed ({reason:?}) during size {} (does the server run the \
                 same test with the same -s / -a?)",
                self.opts.sizes.get(self.index).copied().unwrap_or(0)
            )),
        };
        self.shared.tell(Event::ClientDone(r));
    }
}

// ---------------------------------------------------------------------------------------------
// A worker's handler: the two parts, routed.

struct PerfHandler<P: Provider> {
    server: Option<ServerPart>,
    client: Option<ClientPart<P>>,
    client_conn: Option<ConnId>,
}

impl<P: Provider> PerfHandler<P> {
    fn is_client(&self, conn: ConnId) -> bool {
        self.client_conn == Some(conn)
    }
}

impl<P: Provider> Handler<P> for PerfHandler<P> {
    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        if info.initiated {
            self.client_conn = Some(conn);
            if let Some(c) = &mut self.client {
                c.on_connected(cx, conn, info);
            }
        } else if let Some(s) = &mut self.server {
            s.on_connected(cx, conn, info);
        } else {
            let _ = cx.close(conn);
        }
    }
    fn on_connect_failed(&mut self, cx: &mut Cx<P>, token: u64, error: &str) {
        if let Some(c) = &mut self.client {
            c.on_connect_failed(cx, token, error);
        }
    }
    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        if self.is_client(conn) {
            if let Some(c) = &mut self.client {
                c.on_message(cx, conn, msg);
            }
        } else if let Some(s) = &mut self.server {
            s.on_message(cx, conn, msg);
        }
    }
    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<P>) {
        if self.is_client(done.conn) {
            if let Some(c) = &mut self.client {
                c.on_completion(cx, done);
            }
        } else if let Some(s) = &mut self.server {
            s.on_completion(cx, done);
        }
    }
    fn on_closed(&mut self, cx: &mut Cx<P>, conn: ConnId, reason: &CloseReason) {
        if self.is_client(conn) {
            if let Some(c) = &mut self.client {
                c.on_closed(cx, conn, reason);
            }
        } else if let Some(s) = &mut self.server {
            s.on_closed(cx, conn, reason);
        }
    }
    fn poll(&mut self, cx: &mut Cx<P>) {
        if let Some(s) = &mut self.server {
            s.poll(cx);
        }
        if let Some(c) = &mut self.client {
            c.poll(cx);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The core map.

fn env<T: std::str::FromStr>(name: &str) -> Result<Option<T>, PerfError> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => {
            v.parse().map(Some).map_err(|_| PerfError::Usage(format!("{name}={v:?} is not valid")))
        }
        _ => Ok(None),
    }
}

/// The registered pools a run needs: small buffers (atomics, small messages); one class per
/// power of two of the sizes, each holding a window of them; and receives (the first class of
/// 4096 B or more is the engine's receive size, so for sends it must hold the largest message).
pub fn pools(o: &PerfOpts, conns_per_worker: usize) -> Vec<PoolClass> {
    let w = o.workers;
    let recvs = corelink_engine::tunables::RECVS_PER_CONN * conns_per_worker * w + 16;
    let mut classes: Vec<PoolClass> = vec![PoolClass { size: 256, count: 4096 }];
    let class_of = |s: usize| s.next_power_of_two().max(256);
    let big = class_of(o.max_size()).max(4096);
    for &s in &o.sizes {
        let mut c = class_of(s);
        if o.test.verb() == Verb::Send && c >= 4096 {
            c = big; // sends over 2 KiB use receive-sized buffers
        }
        let count = o.window(s) * w + 16;
        match classes.iter_mut().find(|k| k.size == c) {
            Some(k) => k.count = k.count.max(count),
            None => classes.push(PoolClass { size: c, count }),
        }
    }
    if o.sched.bg_writes > 0 {
        let c = class_of(o.sched.bg_size);
        let count = o.sched.bg_writes * w + 16;
        match classes.iter_mut().find(|k| k.size == c) {
            Some(k) => k.count += count,
            None => classes.push(PoolClass { size: c, count }),
        }
    }
    classes.sort_by_key(|k| k.size);
    let recv_size = if o.test.verb() == Verb::Send { big } else { 4096 };
    match classes.iter_mut().find(|k| k.size == recv_size) {
        Some(k) => k.count += recvs,
        None => {
            classes.push(PoolClass { size: recv_size, count: recvs });
            classes.sort_by_key(|k| k.size);
        }
    }
    classes
}

fn core_map(o: &PerfOpts, listen: Option<SocketAddr>) -> Result<Validated, PerfError> {
    let mut map = match &o.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| PerfError::Usage(format!("{}: {e}", path.display())))?;
            parse(&text).map_err(|e| PerfError::Usage(format!("{}: {e}", path.display())))?
        }
        None => {
            let mut m = CoreMap {
                control_core: 0,
                workers: (1..=o.workers).map(CoreSpec::One).collect(),
                ..CoreMap::default()
            };
            m.worker.idle_after_us = 100;
            if o.provider == Some(Prov::Ibverbs) {
                m.provider = ProviderKind::Ibverbs;
                m.device = env("CORELINK_IBV_DEVICE")?;
                m.gid_index = env("CORELINK_IBV_GID_INDEX")?.unwrap_or(0);
                m.port = env("CORELINK_IBV_PORT")?.unwrap_or(1);
            }
            m
        }
    };
    if let Some(p) = o.provider {
        let want = match p {
            Prov::Soft => ProviderKind::Soft,
            Prov::Ibverbs => ProviderKind::Ibverbs,
        };
        if want != map.provider {
            let says = format!("{:?}", map.provider).to_lowercase();
            return Err(PerfError::Usage(format!(
                "--provider {}, but the core map says {says}",
                p.name()
            )));
        }
    }
    if let Some(d) = &o.device {
        map.device = Some(d.clone());
    }
    if let Some(p) = o.port {
        map.port = p;
    }
    if let Some(x) = o.gid_index {
        map.gid_index = x;
    }
    if let Some(i) = o.inline {
        map.worker.max_inline = i;
    }
    let conns = if o.role == Role::Loopback { 2 } else { 1 };
    map.worker.pools = pools(o, conns);
    let s = &o.sched;
    let depth = o.sizes.iter().map(|&s| o.window(s)).max().unwrap_or(1) as u32;
    let depth = depth + s.bg_writes as u32;
    map.worker.send_queue_depth = map.worker.send_queue_depth.max(depth + 16);
    let w = &mut map.worker;
    w.batching.post_list = o.post_list;
    w.batching.signal_every = o.cq_mod.min(w.send_queue_depth);
    w.qps.per_conn = o.qps;
    w.scheduler.priorities = !s.no_priority;
    w.scheduler.merge_reads = s.hot_records > 0 && !s.no_merge;
    if let Some(n) = s.max_outstanding {
        w.scheduler.max_outstanding = n.min(w.send_queue_depth);
    }
    map.worker.cq_depth = map.worker.cq_depth.max(4 * (depth + 64) * conns as u32);
    map.listen = listen.map(|a| a.to_string());
    let topo = MachineTopology::load().map_err(|e| PerfError::Run(e.to_string()))?;
    let cores = topo.cores().len();
    if o.config.is_none() && o.workers + 1 > cores {
        return Err(PerfError::Usage(format!(
            "-T {}: needs {} worker cores besides the control core (core 0); this machine has \
             {cores} core(s), so -T {} at most (or give a --config core map)",
            o.workers,
            o.workers,
            cores.saturating_sub(1).max(1)
        )));
    }
    let mut v = map.validate(&topo).map_err(|e| PerfError::Usage(e.to_string()))?;
    if v.workers.len() < o.workers {
        return Err(PerfError::Usage(format!(
            "-T {}: the core map has {} worker(s)",
            o.workers,
            v.workers.len()
        )));
    }
    v.workers.truncate(o.workers);
    Ok(v)
}

/// What the header block says about a run (before the table).
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// `soft` or `ibverbs`.
    pub provider: &'static str,
    /// Device name.
    pub device: String,
    /// Worker cores.
    pub worker_cores: Vec<usize>,
    /// The control core.
    pub control_core: usize,
    /// Inline bytes.
    pub max_inline: u32,
    /// Where the server listens / the client connects.
    pub addr: Option<SocketAddr>,
}

/// The address to listen on: `bind`, else `CORELINK_IP` (ibverbs) or 127.0.0.1, with `-p`'s port
/// (0 in loopback: any free port).
fn listen_addr(o: &PerfOpts, provider: ProviderKind) -> Result<Option<SocketAddr>, PerfError> {
    Ok(match o.role {
        Role::Client(_) => None,
        Role::Server | Role::Loopback => {
            let port = if o.role == Role::Loopback { 0 } else { DEFAULT_PORT };
            Some(match o.bind {
                Some(a) => a,
                None => {
                    let ip = match provider {
                        ProviderKind::Ibverbs => env::<std::net::IpAddr>("CORELINK_IP")?
                            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()),
                        ProviderKind::Soft => std::net::Ipv4Addr::LOCALHOST.into(),
                    };
                    SocketAddr::new(ip, port)
                }
            })
        }
    })
}

/// Runs a test: builds the core map, starts the engine on its provider, runs the server part,
/// the client part or both, and calls `on_start` once the engine runs and `on_report` with each
/// size's report as it is measured (a server has none). Returns the reports.
pub fn run(
    o: &PerfOpts,
    on_start: &mut dyn FnMut(&RunInfo),
    on_report: &mut dyn FnMut(&Report),
) -> Result<Vec<Report>, PerfError> {
    let provider = match (&o.config, o.provider) {
        (_, Some(Prov::Ibverbs)) => ProviderKind::Ibverbs,
        (_, Some(Prov::Soft)) | (None, None) => ProviderKind::Soft,
        (Some(_), None) => core_map(o, None)?.map.provider,
    };
    if provider == ProviderKind::Soft && matches!(o.role, Role::Client(_) | Role::Server) {
        return Err(PerfError::Usage(
            "soft is an in-process provider: its server and client run in one process \
             (--loopback, the default for soft); use --provider ibverbs for two processes"
                .into(),
        ));
    }
    let cfg = core_map(o, listen_addr(o, provider)?)?;
    for w in &cfg.warnings {
        eprintln!("corelink-perf: warning: {w}");
    }
    match provider {
        ProviderKind::Soft => {
            run_on::<corelink_engine::verbs::soft::Soft>(o, &cfg, on_start, on_report)
        }
        #[cfg(feature = "ibverbs")]
        ProviderKind::Ibverbs => {
            run_on::<corelink_engine::verbs::ibverbs::Ibverbs>(o, &cfg, on_start, on_report)
        }
        #[cfg(not(feature = "ibverbs"))]
        ProviderKind::Ibverbs => Err(PerfError::Usage("built without the ibverbs feature".into())),
    }
}

fn run_on<P: Provider>(
    o: &PerfOpts,
    cfg: &Validated,
    on_start: &mut dyn FnMut(&RunInfo),
    on_report: &mut dyn FnMut(&Report),
) -> Result<Vec<Report>, PerfError> {
    let (tx, rx) = mpsc::channel();
    let shared = Shared { target: Arc::new(OnceLock::new()), tx };
    let serve = !matches!(o.role, Role::Client(_));
    let connect = o.role != Role::Server;
    let opts = Arc::new(o.clone());
    let conns = o.workers as u16;
    let (s2, o2) = (shared.clone(), opts.clone());
    let engine = Engine::<P>::start(cfg, Placement::RoundRobin, move |_| PerfHandler {
        server: serve.then(|| ServerPart {
            shared: s2.clone(),
            test: o2.test,
            max_size: o2.max_size(),
            sizes: o2.sizes.clone(),
            last: 0,
            conn: None,
            error: None,
        }),
        client: connect.then(|| ClientPart::new(s2.clone(), o2.clone(), conns)),
        client_conn: None,
    })
    .map_err(|e| PerfError::Run(format!("starting the engine: {e}")))?;
    let target = match o.role {
        Role::Client(a) => Some(a),
        Role::Loopback => engine.listen_addr(),
        Role::Server => None,
    };
    let info = RunInfo {
        provider: P::NAME,
        device: cfg.device.clone().unwrap_or_else(|| "(first)".into()),
        worker_cores: cfg.workers.clone(),
        control_core: cfg.map.control_core,
        max_inline: cfg.map.worker.max_inline,
        addr: if o.role == Role::Server { engine.listen_addr() } else { target },
    };
    on_start(&info);
    if let Some(t) = target {
        let _ = shared.target.set(t);
    }
    drop(shared);
    let result = collect(o, &info, &rx, on_report);
    let shut = engine.shutdown();
    let reports = result?;
    let metrics = shut.map_err(|e| PerfError::Run(format!("shutting the engine down: {e}")))?;
    eprintln!("{}", engine_summary(&metrics));
    Ok(reports)
}

/// Waits for the handlers' events: builds each size's report once every client part measured
/// it, and returns when every client part (and server part) is done.
fn collect(
    o: &PerfOpts,
    info: &RunInfo,
    rx: &mpsc::Receiver<Event>,
    on_report: &mut dyn FnMut(&Report),
) -> Result<Vec<Report>, PerfError> {
    let clients = if o.role == Role::Server { 0 } else { o.workers };
    // A loopback run's server parts close with their clients; a server waits for as many
    // connections as its client said it opens.
    let mut servers_left: Option<usize> = match o.role {
        Role::Client(_) => Some(0),
        Role::Loopback => Some(o.workers),
        Role::Server => None,
    };
    let mut clients_left = clients;
    let mut pending: Vec<Vec<SizeResult>> = (0..o.sizes.len()).map(|_| Vec::new()).collect();
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    let deadline = o.timeout.map(|t| Instant::now() + t);
    let started = Instant::now();
    while clients_left > 0 || servers_left != Some(0) {
        let ev = match deadline {
            Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                Ok(ev) => ev,
                Err(_) => {
                    errors.push(format!(
                        "timed out after {} s",
                        o.timeout.unwrap_or_default().as_secs()
                    ));
                    break;
                }
            },
            None => match rx.recv() {
                Ok(ev) => ev,
                Err(_) => break,
            },
        };
        match ev {
            Event::Size(r) => {
                let i = r.index;
                pending[i].push(r);
                if pending[i].len() == clients {
                    let rs = std::mem::take(&mut pending[i]);
                    let rep = report(o, info, rs);
                    if o.progress {
                        eprintln!(
                            "corelink-perf: {} {} B done: {} iterations ({}/{} sizes, {:.1} s)",
                            o.test.name(),
                            rep.bytes,
                            rep.iterations,
                            i + 1,
                            o.sizes.len(),
                            started.elapsed().as_secs_f64()
                        );
                    }
                    on_report(&rep);
                    reports.push(rep);
                }
            }
            Event::ClientDone(r) => {
                clients_left = clients_left.saturating_sub(1);
                if let Err(e) = r {
                    errors.push(format!("client: {e}"));
                    if o.role == Role::Loopback {
                        break;
                    }
                }
            }
            Event::ServerDone(r) => {
                let left = servers_left.get_or_insert(match &r {
                    Ok(n) => (*n).max(1) as usize,
                    Err(_) => 1,
                });
                *left = left.saturating_sub(1);
                if let Err(e) = r {
                    errors.push(format!("server: {e}"));
                    if o.role == Role::Server {
                        break;
                    }
                }
            }
        }
    }
    match errors.is_empty() {
        true => Ok(reports),
        false => Err(PerfError::Run(errors.join("; "))),
    }
}

/// One line on how requests became work requests, over the whole run (both ends in loopback).
pub fn engine_summary(metrics: &[corelink_engine::metrics::Metrics]) -> String {
    let sum =
        |f: fn(&corelink_engine::metrics::Metrics) -> u64| -> u64 { metrics.iter().map(f).sum() };
    // Requests: successful sends, writes, reads and atomics (not receives).
    let requests = sum(|m| m.ops[..5].iter().sum());
    let (wrs, bells, sig) = (sum(|m| m.posted), sum(|m| m.doorbells), sum(|m| m.signalled));
    let (merged, coalesced) = (sum(|m| m.merged_reads), sum(|m| m.coalesced_writes));
    let per = |n: u64| n as f64 / requests.max(1) as f64;
    format!(
        "engine: {requests} requests, {wrs} work requests ({:.3} per request), {bells} doorbells \
         ({:.3}), {sig} signalled ({:.3}), {merged} reads merged, {coalesced} writes coalesced",
        per(wrs),
        per(bells),
        per(sig)
    )
}

/// One size's report from every client part's measurement of it.
fn report(o: &PerfOpts, info: &RunInfo, rs: Vec<SizeResult>) -> Report {
    let bytes = rs.first().map_or(0, |r| r.bytes);
    let iterations: u64 = rs.iter().map(|r| r.iterations).sum();
    let mut rep = Report {
        test: o.test.name().into(),
        transport: Some(o.transport.name().into()),
        provider: Some(info.provider.into()),
        workers: Some(rs.len()),
        bytes,
        iterations,
        ..Report::default()
    };
    if o.test.is_lat() {
        let mut samples: Vec<u64> = rs.into_iter().flat_map(|r| r.samples).collect();
        rep.lat = Latency::from_ns(&mut samples, o.test.lat_divisor());
    } else {
        // Workers run at once: their rates add up.
        let rate: f64 =
            rs.iter().map(|r| r.iterations as f64 / r.elapsed.as_secs_f64().max(1e-9)).sum();
        let peak: f64 = rs
            .iter()
            .map(|r| r.peak_rate.max(r.iterations as f64 / r.elapsed.as_secs_f64().max(1e-9)))
            .sum();
        rep.bw_avg_mbps = Some(rate * bytes as f64 / 1e6);
        rep.bw_peak_mbps = Some(peak * bytes as f64 / 1e6);
        rep.msg_rate_mpps = Some(rate / 1e6);
    }
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips() {
        let h = hello(Test::SendLat, 1 << 20, 3);
        assert!(h.len() <= 36);
        assert_eq!(parse_hello(&h), Some((Test::SendLat, 1 << 20, 3)));
        assert_eq!(parse_hello(b"echo client"), None);
    }

    #[test]
    fn pools_hold_receives_of_the_largest_send() {
        let mut o = PerfOpts::new(Test::SendBw);
        o.sizes = super::super::all_sizes();
        let p = pools(&o, 2);
        let first_recv = p.iter().find(|k| k.size >= 4096).unwrap();
        assert_eq!(first_recv.size, 8 << 20);
        assert!(p.windows(2).all(|w| w[0].size < w[1].size));
        let mut o = PerfOpts::new(Test::WriteBw);
        o.sizes = vec![64, 65536];
        let p = pools(&o, 1);
        assert!(p.windows(2).all(|w| w[0].size < w[1].size));
        assert_eq!(p.iter().find(|k| k.size >= 4096).unwrap().size, 4096);
    }
}
