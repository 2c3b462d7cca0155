//! The client part of a worker's handler: connects, issues a test's requests, times them.

use std::sync::Arc;
use std::time::Instant;

use corelink_engine::verbs::{Provider, RemoteRegion, WcStatus};
use corelink_engine::{Buf, Memory};
use corelink_engine::{
    CloseReason, Completions, ConnId, ConnInfo, Cx, Done, EngineError, Handler, Message, Op,
};

use super::{
    grant_memory, granted, hello, marker, region_byte, write_lat_polls, Event, Shared, SizeResult,
    BYE_IMM, BYE_TOKEN, ECHO_IMM, GRANT_TOKEN, POLL_SLOT,
};
use crate::perf::clock::{Clock, Peak};
use crate::perf::opts::{PerfOpts, Test, Verb, MAX_ONE_SIDED};
use crate::perf::phase;

pub(super) struct ClientPart<P: Provider> {
    shared: Shared,
    opts: Arc<PerfOpts>,
    conns: u16,
    asked: bool,
    conn: Option<ConnId>,
    /// The memory the server granted this side (the test starts once it is known).
    region: Option<RemoteRegion>,
    /// The memory this side grants the server (its answers land there).
    mem: Option<Memory<P>>,
    /// The size being measured (index into `opts.sizes`).
    index: usize,
    finished: bool,
    error: Option<String>,
    // Per size:
    size: usize,
    posted: u64,
    completed: u64,
    started: Instant,
    /// A timed run's end (`-D`) in ticks of `clock` (no OS clock read on the loop's path: in
    /// the Soft-RoCE guest, whose clock source is the HPET, one costs about 2.8 us).
    deadline: Option<u64>,
    /// A bandwidth test's peak rate.
    peak: Peak,
    /// A latency test's request in flight since.
    t0: u64,
    /// Where the last sample ended, while its size goes on: the next request's sample starts
    /// there, so that a round trip reads the clock once (as perftest's samples, the times
    /// between consecutive posts; in the Soft-RoCE guest a counter read is emulated).
    next_t0: Option<u64>,
    /// The latency samples' clock (the time-stamp counter where there is one).
    clock: Clock,
    /// `write_lat` polls memory for its answers (see [`POLL_SLOT`]).
    polls: bool,
    /// The marker whose answer is awaited (polling mode).
    expect: Option<u8>,
    /// Round trips in ticks of `clock` (made nanoseconds once the size ends: no floating
    /// point on the loop's path, which an emulated guest runs slowly).
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
    /// A bandwidth test's timed part, once it runs: what each completion posts again.
    steady: Option<Steady>,
    /// A ping-pong's last request buffer, back from its completion: the next one's (a
    /// ping-pong's sample ends with the echo, which may come first).
    reuse: Option<Buf<P>>,
    _p: std::marker::PhantomData<fn() -> P>,
}

/// A bandwidth test's steady state, or `read_lat`'s, `atomic_lat`'s and `send_lat`'s, decided
/// as its timed part starts: each completion of the size's token (send_lat: each pong) posts
/// the same request again with its buffer (a latency test's after taking its sample), nothing
/// else to decide (the lean loop a perftest-style benchmark runs, so that what it measures is
/// the engine's cost).
#[derive(Clone, Copy, Debug)]
struct Steady {
    conn: ConnId,
    token: u64,
    how: How,
    remote: corelink_engine::verbs::RemoteAddr,
    /// Requests to post in all (lowered to those posted once a timed run's deadline passed).
    until: u64,
    /// A latency test's: each completion is a sample, and the size's end is looked at then
    /// (`ClientPart::sample`; not once per loop iteration, and no peak rate).
    lat: bool,
}

/// How a bandwidth test's steady state posts (its verb, flat or scheduled): one decision for
/// each request to branch on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    Write,
    Send,
    Read,
    Atomic,
    /// send_lat's pings, scheduled: each pong takes its sample and sends the next (quiet with
    /// `--quiet`); a ping's own completion only gives its buffer back for the next.
    Ping {
        quiet: bool,
    },
    /// `--flat` (`Cx::post_now`) with this verb.
    Flat(Verb),
}

/// The token of background writes (`--bg-writes`).
const BG_TOKEN: u64 = u64::MAX - 1;

/// An operation's buffer, back (none for atomics).
fn op_buf<P: Provider>(op: Op<Buf<P>>) -> Option<Buf<P>> {
    match op {
        Op::Send { buf, .. } | Op::Write { buf, .. } | Op::Read { buf, .. } => Some(buf),
        Op::FetchAdd { .. } | Op::CompareSwap { .. } => None,
    }
}

impl<P: Provider> ClientPart<P> {
    pub(super) fn new(shared: Shared, opts: Arc<PerfOpts>, conns: u16) -> Self {
        let polls = opts.test == Test::WriteLat && write_lat_polls(&opts.sizes);
        let now = Instant::now();
        let clock = Clock::new();
        ClientPart {
            shared,
            opts,
            conns,
            asked: false,
            conn: None,
            region: None,
            mem: None,
            index: 0,
            finished: false,
            error: None,
            size: 0,
            posted: 0,
            completed: 0,
            started: now,
            deadline: None,
            peak: Peak::new(clock, 0),
            t0: 0,
            next_t0: None,
            clock,
            polls,
            expect: None,
            samples: Vec::new(),
            warming: false,
            spare: Vec::new(),
            retry: Vec::new(),
            bg_started: false,
            rng: 0x9e37_79b9_7f4a_7c15,
            steady: None,
            reuse: None,
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
    fn more(&self) -> bool {
        self.more_at(self.clock.ticks())
    }

    /// Whether the size wants another request at tick `t` (its iterations, or `-D`'s end).
    #[inline(always)]
    fn more_at(&self, t: u64) -> bool {
        match self.deadline {
            Some(d) => t < d,
            None => self.posted < self.opts.iters,
        }
    }

    /// Starts measuring the next size; a bandwidth test first runs one untimed window (it
    /// touches the buffers and the peer's region, as perftest's own set-up does).
    fn start_size(&mut self, cx: &mut Cx<P>) {
        let o = self.opts.clone();
        self.size = o.sizes[self.index];
        self.reuse = None;
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
        phase::timed_phase_begin(self.size);
        let o = self.opts.clone();
        self.posted = 0;
        self.completed = 0;
        self.samples.clear();
        if o.test.is_lat() {
            let want = if o.duration.is_some() { 1 << 20 } else { o.iters as usize };
            self.samples.reserve(want.min(1 << 24));
        }
        let now = if o.test.is_lat() { Instant::now() } else { cx.now() };
        self.started = now;
        let t = self.clock.ticks();
        self.peak = Peak::new(self.clock, t);
        self.deadline = o.duration.map(|d| t.wrapping_add(self.clock.ticks_for(d)));
        // (read_lat and atomic_lat too: the ping-pongs' samples end with the echo)
        let lat = o.test.is_lat();
        self.steady = match (self.conn, self.region) {
            (Some(conn), Some(rg))
                if (!lat
                    || matches!(o.test, Test::ReadLat | Test::AtomicLat)
                    || (o.test == Test::SendLat && !o.sched.flat))
                    && (o.test.verb() != Verb::Read || o.sched.hot_records == 0) =>
            {
                let how = match (o.sched.flat, o.test.verb()) {
                    (false, _) if o.test == Test::SendLat => How::Ping { quiet: o.sched.quiet },
                    (true, verb) => How::Flat(verb),
                    (false, Verb::Write) => How::Write,
                    (false, Verb::Send) => How::Send,
                    (false, Verb::Read) => How::Read,
                    (false, Verb::Atomic) => How::Atomic,
                };
                // A timed run posts until `poll` sees its deadline pass.
                let until = if o.duration.is_some() { u64::MAX } else { o.iters };
                Some(Steady { conn, token: self.token(), how, remote: rg.at(0), until, lat })
            }
            _ => None,
        };
        self.start_background(cx);
        for b in std::mem::take(&mut self.spare) {
            if !self.more() {
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
        let records = ((MAX_ONE_SIDED / 2) / self.size.max(1)).max(1) as u64;
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
        let at = rg.at((MAX_ONE_SIDED / 2) as u64);
        if let Err((_, e)) = cx.write(conn, buf, at, None, BG_TOKEN) {
            self.fail(cx, format!("a background write: {e}"));
        }
    }

    /// Issues one request of the test (with `buf` for sends, writes and reads).
    fn issue(&mut self, cx: &mut Cx<P>, buf: Option<Buf<P>>) {
        let (Some(conn), token) = (self.conn, self.token()) else { return };
        let lat = self.opts.test.is_lat();
        let quiet = self.opts.sched.quiet;
        // (send_lat's pings are plain sends, as perftest's; write_lat's writes, where the
        // server does not poll, carry an immediate, unless quiet: `Cx::write_quiet` has none)
        let imm = (lat && !quiet && self.opts.test != Test::SendLat).then_some(ECHO_IMM);
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
        let t0 = if lat { self.sample_start() } else { self.t0 };
        // With --quiet a ping goes quiet (`Cx::send_quiet`, `Cx::write_quiet`): the pong says
        // it arrived, so it asks for no completion of its own unless one is due.
        let flat = self.opts.sched.flat;
        let r = match op {
            // (write_lat's ping, inlined: every other way out of line, so that its path's code
            // stays together, as `lat_round_trip`'s)
            Op::Write { buf, remote, imm: None } if quiet && !flat => {
                cx.write_quiet(conn, buf, remote, None, token)
            }
            op => post_other(cx, conn, op, token, quiet, flat),
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

    /// Takes the sample of a latency test's round trip, ending now; returns whether the size
    /// wants another (its iterations, or `-D`'s deadline, on the time-stamp counter).
    #[inline(always)]
    fn sample(&mut self) -> bool {
        let end = self.clock.ticks();
        self.samples.push(end.wrapping_sub(self.t0));
        self.completed += 1;
        let more = self.more_at(end);
        self.next_t0 = more.then_some(end);
        more
    }

    /// Where the next latency sample starts: the last one's end while its size goes on, else
    /// now.
    #[inline(always)]
    fn sample_start(&mut self) -> u64 {
        self.next_t0.take().unwrap_or_else(|| self.clock.ticks())
    }

    /// A round trip of a latency test ended (a completion, or an echo).
    fn lat_sample(&mut self, cx: &mut Cx<P>, buf: Option<Buf<P>>) {
        if !self.sample() {
            return self.finish_size(cx, cx.now());
        }
        let buf = match (self.opts.test.verb(), buf) {
            (Verb::Atomic, _) => None,
            (_, Some(b)) => Some(b),
            (_, None) => match self.ping_buf(cx) {
                Ok(b) => Some(b),
                Err(e) => return self.fail(cx, format!("a {} B buffer: {e}", self.size)),
            },
        };
        self.issue(cx, buf);
    }

    /// A ping's buffer: the last ping's, back from its completion, else a new one.
    #[inline(always)]
    fn ping_buf(&mut self, cx: &mut Cx<P>) -> corelink_engine::Result<Buf<P>> {
        self.reuse.take().map_or_else(|| cx.alloc(self.size), Ok)
    }

    /// Posts a steady test's request again (its buffer back from the completion).
    #[inline(always)]
    fn reissue(&mut self, cx: &mut Cx<P>, buf: Option<Buf<P>>) {
        let Some(s) = &self.steady else { return };
        let (conn, remote, token) = (s.conn, s.remote, s.token);
        let r = match (s.how, buf) {
            // Scheduled: each verb's own call, so that the request's kind is known where its
            // record is built (a runtime `Op` costs a match and a copy of it per request).
            (How::Write, Some(buf)) => cx.write(conn, buf, remote, None, token),
            (How::Send, Some(buf)) => cx.send(conn, buf, None, token),
            (How::Ping { quiet: false }, Some(buf)) => cx.send(conn, buf, None, token),
            (How::Ping { quiet: true }, Some(buf)) => cx.send_quiet(conn, buf, token),
            (How::Read, Some(buf)) => cx.read(conn, buf, remote, token),
            (How::Atomic, _) => cx.fetch_add(conn, remote, 1, token),
            (How::Flat(verb), buf) => {
                let op = match (verb, buf) {
                    (Verb::Write, Some(buf)) => Op::Write { buf, remote, imm: None },
                    (Verb::Send, Some(buf)) => Op::Send { buf, imm: None },
                    (Verb::Read, Some(buf)) => Op::Read { buf, remote },
                    (Verb::Atomic, _) => Op::FetchAdd { remote, add: 1 },
                    (_, None) => return self.fail(cx, "no buffer for the request".into()),
                };
                cx.post_now(conn, op, token)
            }
            (_, None) => return self.fail(cx, "no buffer for the request".into()),
        };
        self.counted(cx, r);
    }

    /// A steady test's request submitted with result `r`: counted, or (out of line) kept to
    /// post again when the QPs were full, or the test's failure.
    #[inline(always)]
    fn counted(&mut self, cx: &mut Cx<P>, r: Result<(), (Op<Buf<P>>, EngineError)>) {
        match r {
            Ok(()) => self.posted += 1,
            Err((op, e)) => self.refused(cx, op, e),
        }
    }

    /// [`ClientPart::counted`]'s refusal.
    #[cold]
    #[inline(never)]
    fn refused(&mut self, cx: &mut Cx<P>, op: Op<Buf<P>>, e: EngineError) {
        match e {
            EngineError::QueueFull(_) => self.retry.push(op_buf(op)),
            e => self.fail(cx, format!("{} of {} B: {e}", self.opts.test.name(), self.size)),
        }
    }

    /// [`Handler::on_completion`], out of line: what a bandwidth test's batch does not post
    /// again (its loop stays small; the latency tests' path has it inlined).
    #[inline(never)]
    fn completion(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        self.on_completion(cx, done);
    }

    /// A read's or an atomic's round trip ended: its sample, and the next at once. Out of
    /// line and small, so that its code is together (in the guest a jump onto another page of
    /// code costs a look-up of the translated code, as a return does).
    #[inline(never)]
    fn lat_round_trip(&mut self, cx: &mut Cx<P>, buf: Option<Buf<P>>) {
        corelink_engine::bench_support::tail_mark();
        if self.sample() {
            self.t0 = self.sample_start();
            self.reissue_lat(cx, buf);
        } else {
            self.finish_size(cx, cx.now());
        }
    }

    /// A read's or an atomic's latency round trip posts the next (`reissue`'s work without its
    /// match over every kind of steady test: in the emulated guest a jump table's jump costs a
    /// look-up of the translated code).
    #[inline(always)]
    fn reissue_lat(&mut self, cx: &mut Cx<P>, buf: Option<Buf<P>>) {
        let Some(s) = &self.steady else { return };
        let (conn, remote, token) = (s.conn, s.remote, s.token);
        let r = match (s.how == How::Atomic, s.how == How::Read, buf) {
            (true, _, _) => cx.fetch_add(conn, remote, 1, token),
            (_, true, Some(buf)) => cx.read(conn, buf, remote, token),
            (_, _, buf) => return self.reissue_cold(cx, buf),
        };
        self.counted(cx, r);
    }

    /// send_lat's pong came: its sample, and the next ping with the last one's buffer. Out of
    /// line and small, as [`ClientPart::lat_round_trip`].
    #[inline(never)]
    fn pong(&mut self, cx: &mut Cx<P>) {
        if !self.sample() {
            return self.finish_size(cx, cx.now());
        }
        let b = match self.ping_buf(cx) {
            Ok(b) => b,
            Err(e) => return self.fail(cx, format!("a {} B buffer: {e}", self.size)),
        };
        self.t0 = self.sample_start();
        let Some(s) = &self.steady else { return };
        let (conn, token) = (s.conn, s.token);
        let r = match s.how {
            How::Ping { quiet: false } => cx.send(conn, b, None, token),
            How::Ping { quiet: true } => cx.send_quiet(conn, b, token),
            _ => return self.reissue_cold(cx, Some(b)),
        };
        self.counted(cx, r);
    }

    /// [`ClientPart::reissue`] out of line, for a latency test's request that the paths above
    /// do not make (none today).
    #[cold]
    #[inline(never)]
    fn reissue_cold(&mut self, cx: &mut Cx<P>, buf: Option<Buf<P>>) {
        self.reissue(cx, buf);
    }

    /// Writes again, through one `Cx::on` for the batch, each completion of `steady` at the
    /// front of `done`; the first that is not one goes to `on_completion`, and the rest stay
    /// in `done`.
    #[inline(always)]
    fn write_again(
        &mut self,
        cx: &mut Cx<P>,
        steady: Steady,
        done: &mut Completions<'_, P>,
    ) -> Result<(), EngineError> {
        let mut on = cx.on(steady.conn)?;
        for d in done {
            let again = d.token == steady.token
                && d.status.is_success()
                && self.posted < steady.until
                && d.buf.is_some();
            if !again {
                self.completion(cx, d);
                return Ok(());
            }
            let Some(buf) = d.buf else { continue }; // (never: `again` saw it)
            self.completed += 1;
            match on.write(buf, steady.remote, None, steady.token) {
                Ok(()) => self.posted += 1,
                Err((op, EngineError::QueueFull(_))) => self.retry.push(op_buf(op)),
                Err((_, e)) => return Err(e),
            }
        }
        Ok(())
    }

    /// The peak rate, sampled at tick `t` of the time-stamp counter (no OS clock read on the
    /// loop's path: in a guest whose clock source is the HPET each costs microseconds).
    #[inline(never)]
    fn sample_peak(&mut self, t: u64) {
        self.peak.sample(t, self.completed);
    }

    fn finish_size(&mut self, cx: &mut Cx<P>, now: Instant) {
        self.steady = None;
        phase::timed_phase_end(self.size);
        let elapsed = now.duration_since(self.started);
        let mut samples = std::mem::take(&mut self.samples);
        self.clock.to_ns(&mut samples);
        self.shared.tell(Event::Size(SizeResult {
            index: self.index,
            bytes: self.size,
            iterations: self.completed,
            elapsed,
            peak_rate: self.peak.rate(),
            samples,
        }));
        self.index += 1;
        if self.index < self.opts.sizes.len() {
            self.start_size(cx);
        } else {
            self.finished = true;
            // The server hears that the run is complete, then the connection closes (once
            // that send is done: a close would flush it).
            let Some(c) = self.conn else { return };
            let bye = cx
                .alloc(1)
                .and_then(|b| cx.send(c, b, Some(BYE_IMM), BYE_TOKEN).map_err(|(_, e)| e));
            if bye.is_err() {
                let _ = cx.close(c);
            }
        }
    }
}

impl<P: Provider> Handler<P> for ClientPart<P> {
    /// Inlined into the engine's loop: most of a latency run's iterations have nothing here
    /// to look at, and cost one test (`one_test`: in the guest each branch on the path is a
    /// block to find).
    #[inline]
    fn poll(&mut self, cx: &mut Cx<P>) {
        let bw = self.steady.is_some_and(|s| !s.lat);
        // (write_lat's watched byte is looked at here: while it waits, no call each iteration)
        let arrived = self.expect.is_some_and(|m| region_byte(&self.mem, 2 * POLL_SLOT - 1) == m);
        let any = bw | arrived | !self.retry.is_empty() | !self.asked;
        if corelink_engine::verbs::one_test(any) {
            self.poll_rest(cx);
        }
    }

    fn on_connect_failed(
        &mut self,
        _cx: &mut Cx<P>,
        _token: u64,
        error: &corelink_engine::EngineError,
    ) {
        self.shared.tell(Event::ClientDone(Err(format!(
            "connect failed: {}",
            corelink_engine::verbs::chain(error)
        ))));
    }

    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, _info: &ConnInfo) {
        self.conn = Some(conn);
        if let Err(e) = grant_memory(cx, &mut self.mem, conn) {
            self.fail(cx, format!("granting memory: {e}"));
        }
        // The test starts once the server's grant arrives (`on_message`).
    }

    fn on_message(&mut self, cx: &mut Cx<P>, _conn: ConnId, msg: &Message<'_>) {
        if self.finished || self.error.is_some() {
            return;
        }
        if let Some(Steady { how: How::Ping { .. }, .. }) = self.steady {
            // send_lat's steady state: a pong (a plain send, as the ping) ends a sample, and
            // the next ping goes with the last one's buffer.
            if msg.imm.is_none() {
                return self.pong(cx);
            }
        }
        if let Some(region) = granted(msg) {
            if self.region.replace(region).is_none() {
                self.start_size(cx);
            }
            return;
        }
        // (send_lat's pongs are plain sends)
        let pong = match self.opts.test {
            Test::SendLat => msg.imm.is_none(),
            Test::WriteLat => msg.imm == Some(ECHO_IMM),
            _ => false,
        };
        if !pong {
            return self.fail(cx, format!("an unexpected message (immediate {:?})", msg.imm));
        }
        self.lat_sample(cx, None);
    }

    /// A bandwidth test's steady state writes again in one loop over the batch (the loop
    /// perftest runs); anything else goes to `on_completion` one by one.
    fn on_completions(&mut self, cx: &mut Cx<P>, mut done: Completions<'_, P>) {
        if let Some(s) = self.steady.filter(|s| s.how == How::Write && self.error.is_none()) {
            if let Err(e) = self.write_again(cx, s, &mut done) {
                self.fail(cx, format!("{} of {} B: {e}", self.opts.test.name(), self.size));
            }
        }
        // (what the steady loop left: the size ended, another request, or a failure)
        for d in done {
            self.completion(cx, d);
        }
    }
    /// Inlined into the engine's completion path (a latency test's round trip goes through it;
    /// a bandwidth test's batch calls it out of line, `completion`).
    #[inline(always)]
    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        if self.error.is_some() {
            return;
        }
        if let Some(s) = &self.steady {
            let ok = done.token == s.token && done.status.is_success();
            if let (How::Ping { .. }, true) = (s.how, ok) {
                // A ping's own completion: its buffer serves the next (its pong is the sample).
                if let Some(b) = done.buf.filter(|b| b.capacity() >= self.size) {
                    self.reuse = Some(b);
                }
                return;
            }
            if s.lat && ok {
                return self.lat_round_trip(cx, done.buf);
            }
            if ok {
                // The clock is looked at once per loop iteration, in `poll` (peak rate and a
                // timed run's end): nothing here but counting and posting again.
                self.completed += 1;
                if self.posted < s.until {
                    self.reissue(cx, done.buf);
                } else if self.completed == self.posted {
                    self.finish_size(cx, cx.now());
                }
                return;
            }
        }
        if done.token == GRANT_TOKEN && done.status.is_success() {
            return; // this side's grant reached the server
        }
        if done.token == BYE_TOKEN {
            let _ = cx.close(done.conn);
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
            } else if let Some(b) = done.buf.filter(|b| b.capacity() >= self.size) {
                self.reuse = Some(b);
            }
            return;
        }
        self.completed += 1;
        self.sample_peak(self.clock.ticks());
        if self.more() {
            let buf = match t.verb() {
                Verb::Atomic => None,
                _ => done.buf,
            };
            self.issue(cx, buf);
        } else if self.completed == self.posted {
            self.finish_size(cx, cx.now());
        }
    }

    fn on_closed(&mut self, _cx: &mut Cx<P>, _conn: ConnId, reason: &CloseReason) {
        let r = match (self.error.take(), self.finished) {
            // The first symptom, and what ended the connection.
            (Some(e), _) => Err(format!("{e}; the connection closed: {reason}")),
            (None, true) => Ok(()),
            (None, false) => Err(format!(
                "the connection closed during size {}: {reason} (does the server run the same \
                 test with the same -s / -a?)",
                self.opts.sizes.get(self.index).copied().unwrap_or(0)
            )),
        };
        self.shared.tell(Event::ClientDone(r));
    }
}

/// [`ClientPart::issue`]'s request posted on the flat path (`flat`), as a quiet send
/// (`quiet`), or submitted.
#[inline(never)]
#[allow(clippy::result_large_err)]
fn post_other<P: Provider>(
    cx: &mut Cx<P>,
    conn: ConnId,
    op: Op<Buf<P>>,
    token: u64,
    quiet: bool,
    flat: bool,
) -> Result<(), (Op<Buf<P>>, EngineError)> {
    match op {
        op if flat => cx.post_now(conn, op, token),
        Op::Send { buf, imm: None } if quiet => cx.send_quiet(conn, buf, token),
        op => cx.submit(conn, op, token),
    }
}

impl<P: Provider> ClientPart<P> {
    /// [`Handler::poll`]'s work, when there is any: a bandwidth run's peak-rate sample and
    /// end, write_lat's watched byte, requests to retry, and the connect.
    #[inline(never)]
    fn poll_rest(&mut self, cx: &mut Cx<P>) {
        if self.steady.is_some_and(|s| !s.lat) {
            // Once per loop iteration: the peak rate's sample, and a timed run's end.
            let t = self.clock.ticks();
            self.sample_peak(t);
            let over = !self.more_at(t);
            if let (Some(s), true) = (&mut self.steady, over) {
                s.until = s.until.min(self.posted);
            }
        }
        if let Some(m) = self.expect {
            if region_byte(&self.mem, 2 * POLL_SLOT - 1) == m && self.error.is_none() {
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
}
