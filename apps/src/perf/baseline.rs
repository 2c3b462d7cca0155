//! Baselines measured in the same binary, so that every figure can be given as a ratio from
//! one run: `memcpy` (the copy bandwidth of the same buffers: the ceiling for a software
//! provider's one-sided write), `ring_pingpong` (two pinned threads bouncing a cache line
//! through an SPSC ring: the ceiling for any cross-core round trip; one-way latency, half the
//! round trip), `tcp_lat` and `tcp_bw` (the same sizes over TCP on the loopback or a given
//! address: the RDMA-versus-TCP comparison).
//!
//! How each is measured:
//! - `memcpy`: one thread pinned to `cores.0` copies page-aligned buffers of the message size
//!   into one destination, cycling through as many sources as `write_bw` keeps in flight at
//!   that size (its window: `-t`, at most 16 MiB; so the same working set as the test, in or out
//!   of cache alike), all allocated and touched before timing. The run is split into about ten
//!   intervals: the peak bandwidth is the best interval's, the average the whole run's.
//! - `ring_pingpong`: a thread on `cores.0` pushes a 64-byte payload (one cache line, a
//!   `[u8; 64]`) into one ring (the engine's SPSC ring), a thread on `cores.1` pops it and pushes it
//!   back through a second ring; both busy-poll. The first `min(size, 64)` bytes are written
//!   by the sender and read (and checked) on return; the ring slot always moves 64 bytes, so
//!   the report's `bytes` is `min(size, 64)`. Each round trip is timed; one-way is half.
//! - `tcp_lat`: `size`-byte ping-pong over one TCP connection per size (`TCP_NODELAY`), each
//!   round trip timed, one-way latency half of it.
//! - `tcp_bw`: `size`-byte writes streamed over one TCP connection per size into a sink; the
//!   clock stops when the sink acknowledges every byte (so socket buffers do not flatter it).
//!
//! Every baseline first runs a few untimed warm-up operations. With `server: None`, the TCP
//! baselines run both ends in this process over `127.0.0.1` (the server end pinned to
//! `cores.1`, the client to `cores.0`); with `Some(addr)` they connect to a [`serve`] there.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use corelink_engine::bench_support::{ring, Consumer, Producer};

use super::{Latency, Report};

/// Which baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaselineKind {
    /// Copy bandwidth of buffers of the message size.
    Memcpy,
    /// Cross-core round trip through the engine's SPSC ring.
    RingPingpong,
    /// TCP ping-pong latency.
    TcpLat,
    /// TCP streaming bandwidth.
    TcpBw,
}

/// How to run a baseline.
#[derive(Debug, Clone)]
pub struct BaselineOpts {
    /// Message sizes, one report each.
    pub sizes: Vec<usize>,
    /// Iterations per size (ignored when `duration` is set).
    pub iters: u64,
    /// Run each size for this long instead of `iters`.
    pub duration: Option<Duration>,
    /// TCP: with `Some`, connect to a `corelink-perf baseline` server there; with `None`, run
    /// both ends in this process over the loopback.
    pub server: Option<SocketAddr>,
    /// Cores to pin the two threads of `ring_pingpong` (and the TCP ends) to.
    pub cores: (usize, usize),
    /// `memcpy`: the write test's TX depth (`-t`): the copies cycle through as many source
    /// buffers as that test keeps in flight at the size (at most 16 MiB of them), into one
    /// destination, as a software provider's writes do.
    pub tx_depth: usize,
}

/// Intervals a bandwidth run is split into (the peak is the best of them).
const INTERVALS: u32 = 10;
/// Untimed operations before each measurement.
const WARMUP: u64 = 16;
/// Latency samples kept at most (8 bytes each): `iters` above it is refused, a `duration` run
/// stops there.
const MAX_SAMPLES: u64 = 10_000_000;
/// The largest TCP message (each end holds one buffer of it).
const MAX_TCP_SIZE: usize = 1 << 30;
/// The largest `memcpy` buffer (two of them are held).
const MAX_COPY_SIZE: usize = 1 << 30;
/// How long a TCP connect, read or write may block before the baseline gives up.
const TCP_TIMEOUT: Duration = Duration::from_secs(30);
/// The ring baseline's payload: one cache line.
const LINE: usize = 64;

/// Runs a baseline; one report per size.
pub fn run(kind: BaselineKind, o: &BaselineOpts) -> Result<Vec<Report>, String> {
    if o.sizes.is_empty() {
        return Err("no message sizes".into());
    }
    if o.duration.is_none() && o.iters == 0 {
        return Err("0 iterations".into());
    }
    let max = match kind {
        BaselineKind::Memcpy => MAX_COPY_SIZE,
        BaselineKind::RingPingpong => usize::MAX,
        BaselineKind::TcpLat | BaselineKind::TcpBw => MAX_TCP_SIZE,
    };
    if let Some(&bad) = o.sizes.iter().find(|&&s| s == 0 || s > max) {
        return Err(format!("message size {bad}: {kind:?} takes 1..={max} bytes"));
    }
    if matches!(kind, BaselineKind::RingPingpong | BaselineKind::TcpLat)
        && o.duration.is_none()
        && o.iters > MAX_SAMPLES
    {
        return Err(format!(
            "{} iterations: a latency baseline keeps at most {MAX_SAMPLES}",
            o.iters
        ));
    }
    check_core(o.cores.0)?;
    check_core(o.cores.1)?;
    match kind {
        BaselineKind::Memcpy => o.sizes.iter().map(|&s| memcpy(s, o)).collect(),
        BaselineKind::RingPingpong => o.sizes.iter().map(|&s| ring_pingpong(s, o)).collect(),
        BaselineKind::TcpLat | BaselineKind::TcpBw => tcp(kind, o),
    }
}

/// Runs the server end of `tcp_lat` or `tcp_bw` on `addr`, on the calling thread (unpinned):
/// it serves the connections of one client at a time (one per size: echoing for `tcp_lat`,
/// a sink for `tcp_bw`) and returns when a client says it is done, which [`run`] with
/// `server: Some(addr)` does after its last size. Stray connections (a wrong greeting) are
/// dropped; a client asking for the other kind is an error.
///
/// How `corelink-perf` should use it: `corelink-perf baseline tcp_lat` given a server
/// address runs [`run`] as the client; given none but told to serve (e.g. a listen address)
/// it calls `serve(kind, addr)` and exits when it returns, like perftest's server side. Run
/// the server first, then the client with `server: Some(<server's address>)` and the same
/// kind.
pub fn serve(kind: BaselineKind, addr: SocketAddr) -> Result<(), String> {
    let wire = wire_kind(kind)?;
    let listener = TcpListener::bind(addr).map_err(io_err(&format!("listen on {addr}")))?;
    serve_on(&listener, wire)
}

// ---------------------------------------------------------------------------------------------
// Timing helpers.

/// Runs `op` for `o.iters` operations (in about [`INTERVALS`] equal parts) or for `o.duration`
/// (in [`INTERVALS`] slices, reading the clock every `check` operations); returns each
/// interval's operations and time.
fn intervals(
    o: &BaselineOpts,
    check: u64,
    mut op: impl FnMut() -> Result<(), String>,
) -> Result<Vec<(u64, Duration)>, String> {
    for _ in 0..WARMUP.min(o.iters.max(1)) {
        op()?;
    }
    let mut out = Vec::with_capacity(INTERVALS as usize + 1);
    match o.duration {
        Some(d) => {
            let slice = d / INTERVALS;
            for _ in 0..INTERVALS {
                let (start, mut n) = (Instant::now(), 0u64);
                loop {
                    for _ in 0..check {
                        op()?;
                    }
                    n += check;
                    let t = start.elapsed();
                    if t >= slice {
                        out.push((n, t));
                        break;
                    }
                }
            }
        }
        None => {
            let per = o.iters.div_ceil(u64::from(INTERVALS)).max(1);
            let mut left = o.iters;
            while left > 0 {
                let n = per.min(left);
                let start = Instant::now();
                for _ in 0..n {
                    op()?;
                }
                out.push((n, start.elapsed()));
                left -= n;
            }
        }
    }
    Ok(out)
}

/// A bandwidth report from per-interval samples of `size`-byte operations.
fn bw_report(test: &str, size: usize, samples: &[(u64, Duration)]) -> Report {
    let mbps = |n: u64, t: Duration| n as f64 * size as f64 / t.as_secs_f64().max(1e-9) / 1e6;
    let ops: u64 = samples.iter().map(|s| s.0).sum();
    let time: Duration = samples.iter().map(|s| s.1).sum();
    let peak = samples.iter().map(|&(n, t)| mbps(n, t)).fold(0.0, f64::max);
    Report {
        test: test.into(),
        bytes: size,
        iterations: ops,
        bw_peak_mbps: Some(peak),
        bw_avg_mbps: Some(mbps(ops, time)),
        msg_rate_mpps: Some(ops as f64 / time.as_secs_f64().max(1e-9) / 1e6),
        ..Report::default()
    }
}

/// Round-trip times (ns) of `rt`, after a warm-up: `o.iters` of them, or as many as fit in
/// `o.duration` (at most [`MAX_SAMPLES`]).
fn round_trips(
    o: &BaselineOpts,
    mut rt: impl FnMut() -> Result<(), String>,
) -> Result<Vec<u64>, String> {
    for _ in 0..WARMUP.min(o.iters.max(1)) {
        rt()?;
    }
    let mut samples = Vec::new();
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    match o.duration {
        None => {
            let n = usize::try_from(o.iters.min(MAX_SAMPLES)).unwrap_or(0);
            samples.try_reserve_exact(n).map_err(|e| format!("{n} samples: {e}"))?;
            for _ in 0..n {
                let t = Instant::now();
                rt()?;
                samples.push(ns(t.elapsed()));
            }
        }
        Some(d) => {
            samples.try_reserve(1 << 16).map_err(|e| format!("samples: {e}"))?;
            let end = Instant::now() + d;
            while (samples.len() as u64) < MAX_SAMPLES {
                let t0 = Instant::now();
                rt()?;
                let t1 = Instant::now();
                samples.push(ns(t1 - t0));
                if t1 >= end {
                    break;
                }
            }
        }
    }
    Ok(samples)
}

/// A latency report (one-way: half the round trip) from round-trip samples.
fn lat_report(test: &str, bytes: usize, mut samples: Vec<u64>) -> Report {
    Report {
        test: test.into(),
        bytes,
        iterations: samples.len() as u64,
        lat: Latency::from_ns(&mut samples, 2.0),
        ..Report::default()
    }
}

/// A zeroed buffer of `size` bytes starting on a page boundary (`Err` rather than an abort
/// when the memory is not there).
struct Aligned {
    mem: Vec<u8>,
    at: usize,
    len: usize,
}

impl Aligned {
    const PAGE: usize = 4096;

    fn new(len: usize) -> Result<Self, String> {
        let mut mem = Vec::new();
        let total = len.checked_add(Self::PAGE).ok_or("buffer size overflows")?;
        mem.try_reserve_exact(total).map_err(|e| format!("a {len}-byte buffer: {e}"))?;
        mem.resize(total, 0);
        let at = mem.as_ptr().align_offset(Self::PAGE).min(Self::PAGE);
        Ok(Aligned { mem, at, len })
    }

    fn get(&self) -> &[u8] {
        &self.mem[self.at..self.at + self.len]
    }

    fn get_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.at..self.at + self.len]
    }
}

/// Busy-waiting that stays correct when both threads share a core: it yields now and then.
struct Spin(u32);

impl Spin {
    fn wait(&mut self) {
        self.0 = self.0.wrapping_add(1);
        if self.0 % 4096 == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

fn check_core(core: usize) -> Result<(), String> {
    let cores = core_affinity::get_core_ids().ok_or("cannot read this process's cores")?;
    if cores.iter().any(|c| c.id == core) {
        Ok(())
    } else {
        let ids: Vec<usize> = cores.iter().map(|c| c.id).collect();
        Err(format!("core {core} is not available (cores: {ids:?})"))
    }
}

/// Runs `f` on a new thread pinned to `core`.
fn spawn_pinned<T: Send + 'static>(
    name: &str,
    core: usize,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<JoinHandle<Result<T, String>>, String> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
                return Err(format!("cannot pin to core {core}"));
            }
            f()
        })
        .map_err(|e| format!("spawn {name}: {e}"))
}

fn join<T>(name: &str, h: JoinHandle<Result<T, String>>) -> Result<T, String> {
    h.join().map_err(|_| format!("{name} panicked"))?
}

fn io_err(what: &str) -> impl Fn(io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

// ---------------------------------------------------------------------------------------------
// memcpy.

fn memcpy(size: usize, o: &BaselineOpts) -> Result<Report, String> {
    let o2 = o.clone();
    let h = spawn_pinned("memcpy", o.cores.0, move || {
        let n = o2.tx_depth.min(super::opts::MAX_BYTES_IN_FLIGHT / size).max(1);
        let mut srcs = Vec::with_capacity(n);
        for k in 0..n {
            let mut src = Aligned::new(size)?;
            for (i, b) in src.get_mut().iter_mut().enumerate() {
                *b = (i + k) as u8;
            }
            srcs.push(src);
        }
        let mut dst = Aligned::new(size)?;
        dst.get_mut().fill(1);
        let check = (64 << 10) / size as u64 + 1;
        let mut next = 0;
        let samples = intervals(&o2, check, || {
            let src = &srcs[next];
            next = (next + 1) % n;
            std::hint::black_box(dst.get_mut()).copy_from_slice(std::hint::black_box(src.get()));
            std::hint::black_box(dst.get());
            Ok(())
        })?;
        let last = &srcs[(next + n - 1) % n];
        if dst.get() != last.get() {
            return Err("memcpy: the copy differs".into());
        }
        Ok(bw_report("baseline_memcpy", size, &samples))
    })?;
    join("memcpy", h)
}

// ---------------------------------------------------------------------------------------------
// ring_pingpong.

fn push_spin(tx: &mut Producer<[u8; LINE]>, mut m: [u8; LINE]) -> Result<(), String> {
    let mut spin = Spin(0);
    while let Err(back) = tx.push(m) {
        if tx.is_abandoned() {
            return Err("ring_pingpong: the other thread is gone".into());
        }
        m = back;
        spin.wait();
    }
    Ok(())
}

fn ring_pingpong(size: usize, o: &BaselineOpts) -> Result<Report, String> {
    let bytes = size.min(LINE);
    let (mut ping_tx, mut ping_rx) = ring::<[u8; LINE]>(2);
    let (mut pong_tx, mut pong_rx): (Producer<[u8; LINE]>, Consumer<[u8; LINE]>) = ring(2);
    let pong = spawn_pinned("ring-pong", o.cores.1, move || {
        let mut spin = Spin(0);
        loop {
            match ping_rx.pop() {
                Some(m) => {
                    std::hint::black_box(&m[..bytes]);
                    push_spin(&mut pong_tx, m)?;
                }
                None if ping_rx.is_abandoned() && ping_rx.is_empty() => return Ok(()),
                None => spin.wait(),
            }
        }
    })?;
    let o2 = o.clone();
    let ping = spawn_pinned("ring-ping", o.cores.0, move || {
        let mut seq = 0u8;
        let samples = round_trips(&o2, || {
            seq = seq.wrapping_add(1);
            let mut m = [0u8; LINE];
            m[..bytes].fill(seq);
            push_spin(&mut ping_tx, m)?;
            let mut spin = Spin(0);
            let back = loop {
                match pong_rx.pop() {
                    Some(b) => break b,
                    None if pong_rx.is_abandoned() => {
                        return Err("ring_pingpong: the pong thread is gone".into())
                    }
                    None => spin.wait(),
                }
            };
            if back[..bytes].iter().any(|&b| b != seq) {
                return Err("ring_pingpong: the payload came back changed".into());
            }
            Ok(())
        });
        drop(ping_tx); // tells the pong thread to stop
        samples
    })?;
    let samples = join("ring-ping", ping);
    let stopped = join("ring-pong", pong);
    let samples = samples?;
    stopped?;
    Ok(lat_report("baseline_ring_pingpong", bytes, samples))
}

// ---------------------------------------------------------------------------------------------
// TCP.
//
// Wire protocol, one connection per size: the client sends a 13-byte greeting (`MAGIC`, a kind
// byte, the size as a little-endian u64). `LAT`: `size`-byte messages echoed until the client
// closes. `BW`: `size`-byte messages sunk until the client shuts its side down, then the
// server answers with the byte count (u64 LE) and closes. `BYE` (size 0): the client is done,
// the server returns.

const MAGIC: [u8; 4] = *b"CLB1";
const LAT: u8 = 1;
const BW: u8 = 2;
const BYE: u8 = 0xff;

fn wire_kind(kind: BaselineKind) -> Result<u8, String> {
    match kind {
        BaselineKind::TcpLat => Ok(LAT),
        BaselineKind::TcpBw => Ok(BW),
        k => Err(format!("{k:?} has no server end (only tcp_lat and tcp_bw)")),
    }
}

fn greeting(kind: u8, size: usize) -> [u8; 13] {
    let mut g = [0u8; 13];
    g[..4].copy_from_slice(&MAGIC);
    g[4] = kind;
    g[5..].copy_from_slice(&(size as u64).to_le_bytes());
    g
}

fn setup(s: &TcpStream) -> Result<(), String> {
    s.set_nodelay(true).map_err(io_err("TCP_NODELAY"))?;
    s.set_read_timeout(Some(TCP_TIMEOUT)).map_err(io_err("read timeout"))?;
    s.set_write_timeout(Some(TCP_TIMEOUT)).map_err(io_err("write timeout"))
}

fn connect(addr: SocketAddr) -> Result<TcpStream, String> {
    let s = TcpStream::connect_timeout(&addr, TCP_TIMEOUT)
        .map_err(io_err(&format!("connect to {addr}")))?;
    setup(&s)?;
    Ok(s)
}

/// Reads one whole message; `Ok(false)` on a clean end of stream before its first byte.
fn read_msg(s: &mut TcpStream, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Serves connections on `listener` until a client says `BYE`.
fn serve_on(listener: &TcpListener, want: u8) -> Result<(), String> {
    loop {
        let (mut s, peer) = listener.accept().map_err(io_err("accept"))?;
        setup(&s)?;
        let mut g = [0u8; 13];
        if !matches!(read_msg(&mut s, &mut g), Ok(true)) || g[..4] != MAGIC {
            continue; // not one of ours
        }
        let mut size = [0u8; 8];
        size.copy_from_slice(&g[5..]);
        let size = u64::from_le_bytes(size);
        let kind = g[4];
        if kind == BYE {
            return Ok(());
        }
        if kind != want {
            return Err(format!("{peer} asks for kind {kind}, this server serves kind {want}"));
        }
        let size = usize::try_from(size)
            .ok()
            .filter(|&s| (1..=MAX_TCP_SIZE).contains(&s))
            .ok_or_else(|| format!("{peer} asks for {size}-byte messages"))?;
        let what = format!("serving {peer}");
        if kind == LAT {
            let mut buf = Aligned::new(size)?;
            while read_msg(&mut s, buf.get_mut()).map_err(io_err(&what))? {
                s.write_all(buf.get()).map_err(io_err(&what))?;
            }
        } else {
            let mut buf = Aligned::new(size.clamp(64 << 10, 1 << 20))?;
            let mut total = 0u64;
            loop {
                match s.read(buf.get_mut()) {
                    Ok(0) => break,
                    Ok(n) => total += n as u64,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(io_err(&what)(e)),
                }
            }
            s.write_all(&total.to_le_bytes()).map_err(io_err(&what))?;
        }
    }
}

/// The client end of every size, against `addr`.
fn tcp_client(wire: u8, addr: SocketAddr, o: &BaselineOpts) -> Result<Vec<Report>, String> {
    let mut out = Vec::with_capacity(o.sizes.len());
    for &size in &o.sizes {
        let mut s = connect(addr)?;
        s.write_all(&greeting(wire, size)).map_err(io_err("greeting"))?;
        let mut buf = Aligned::new(size)?;
        for (i, b) in buf.get_mut().iter_mut().enumerate() {
            *b = i as u8;
        }
        if wire == LAT {
            let samples = round_trips(o, || {
                s.write_all(buf.get()).map_err(io_err("tcp_lat send"))?;
                match read_msg(&mut s, buf.get_mut()) {
                    Ok(true) => Ok(()),
                    Ok(false) => Err("tcp_lat: the server closed the connection".into()),
                    Err(e) => Err(format!("tcp_lat receive: {e}")),
                }
            })?;
            out.push(lat_report("baseline_tcp_lat", size, samples));
        } else {
            let check = (1 << 20) / size as u64 + 1;
            let mut sent = 0u64;
            let mut samples = intervals(o, check, || {
                sent += size as u64;
                s.write_all(buf.get()).map_err(io_err("tcp_bw send"))
            })?;
            // The clock runs until the sink has every byte.
            let t = Instant::now();
            s.shutdown(Shutdown::Write).map_err(io_err("tcp_bw shutdown"))?;
            let mut ack = [0u8; 8];
            s.read_exact(&mut ack).map_err(io_err("tcp_bw acknowledgement"))?;
            if let Some(last) = samples.last_mut() {
                last.1 += t.elapsed();
            }
            let got = u64::from_le_bytes(ack);
            if got != sent {
                return Err(format!("tcp_bw: sent {sent} bytes, the server got {got}"));
            }
            out.push(bw_report("baseline_tcp_bw", size, &samples));
        }
    }
    Ok(out)
}

fn bye(addr: SocketAddr) -> Result<(), String> {
    connect(addr)?.write_all(&greeting(BYE, 0)).map_err(io_err("goodbye"))
}

fn tcp(kind: BaselineKind, o: &BaselineOpts) -> Result<Vec<Report>, String> {
    let wire = wire_kind(kind)?;
    if let Some(addr) = o.server {
        let o2 = o.clone();
        let h = spawn_pinned("tcp-client", o.cores.0, move || {
            let r = tcp_client(wire, addr, &o2);
            let b = bye(addr);
            let r = r?;
            b?;
            Ok(r)
        })?;
        return join("tcp-client", h);
    }
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io_err("listen on 127.0.0.1"))?;
    let addr = listener.local_addr().map_err(io_err("listen address"))?;
    let server = spawn_pinned("tcp-server", o.cores.1, move || serve_on(&listener, wire))?;
    let o2 = o.clone();
    let client = spawn_pinned("tcp-client", o.cores.0, move || tcp_client(wire, addr, &o2));
    let reports = client.and_then(|c| join("tcp-client", c));
    // Always release the server thread, whatever happened to the client (if it has stopped
    // already, its listener is gone and the connect fails, which is fine).
    let _ = bye(addr);
    let served = join("tcp-server", server);
    let reports = reports?;
    served?;
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(sizes: &[usize], iters: u64) -> BaselineOpts {
        let cores = core_affinity::get_core_ids().unwrap();
        BaselineOpts {
            sizes: sizes.to_vec(),
            iters,
            tx_depth: 4,
            duration: None,
            server: None,
            cores: (cores[0].id, cores[cores.len() - 1].id),
        }
    }

    fn check_bw(r: &[Report], test: &str, sizes: &[usize]) {
        assert_eq!(r.len(), sizes.len());
        for (r, &s) in r.iter().zip(sizes) {
            assert_eq!((r.test.as_str(), r.bytes), (test, s));
            assert!(r.iterations > 0);
            assert!(r.bw_peak_mbps.unwrap() >= r.bw_avg_mbps.unwrap() * 0.999, "{r:?}");
            assert!(r.bw_avg_mbps.unwrap() > 0.0 && r.msg_rate_mpps.unwrap() > 0.0);
            assert!(r.lat.is_none() && r.transport.is_none() && r.provider.is_none());
            assert!(r.to_json().contains(&format!("\"test\":\"{test}\"")));
        }
    }

    fn check_lat(r: &[Report], test: &str, bytes: &[usize], iters: u64) {
        assert_eq!(r.len(), bytes.len());
        for (r, &b) in r.iter().zip(bytes) {
            assert_eq!((r.test.as_str(), r.bytes, r.iterations), (test, b, iters));
            let l = r.lat.unwrap();
            assert!(
                l.t_min_us > 0.0 && l.t_min_us <= l.t_typical_us && l.t_typical_us <= l.t_max_us
            );
            assert!(r.bw_avg_mbps.is_none());
        }
    }

    #[test]
    fn memcpy_reports_each_size() {
        let r = run(BaselineKind::Memcpy, &opts(&[8, 4096, 65536], 50)).unwrap();
        check_bw(&r, "baseline_memcpy", &[8, 4096, 65536]);
        assert_eq!(r[0].iterations, 50);
    }

    #[test]
    fn ring_pingpong_caps_the_payload_at_a_cache_line() {
        let r = run(BaselineKind::RingPingpong, &opts(&[8, 4096], 200)).unwrap();
        check_lat(&r, "baseline_ring_pingpong", &[8, 64], 200);
    }

    #[test]
    fn tcp_on_the_loopback() {
        let r = run(BaselineKind::TcpLat, &opts(&[1, 8, 70_000], 20)).unwrap();
        check_lat(&r, "baseline_tcp_lat", &[1, 8, 70_000], 20);
        let r = run(BaselineKind::TcpBw, &opts(&[8, 65536], 30)).unwrap();
        check_bw(&r, "baseline_tcp_bw", &[8, 65536]);
    }

    #[test]
    fn tcp_against_a_separate_server() {
        for kind in [BaselineKind::TcpLat, BaselineKind::TcpBw] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let wire = wire_kind(kind).unwrap();
            let server = std::thread::spawn(move || {
                // A stray connection first: dropped, the server keeps serving.
                serve_on(&listener, wire)
            });
            drop(TcpStream::connect(addr).unwrap());
            let o = BaselineOpts { server: Some(addr), ..opts(&[8, 1024], 10) };
            let r = run(kind, &o).unwrap();
            assert_eq!(r.len(), 2);
            server.join().unwrap().unwrap();
        }
    }

    #[test]
    fn a_duration_bounds_the_run() {
        let o = BaselineOpts { duration: Some(Duration::from_millis(20)), ..opts(&[4096], 0) };
        let t = Instant::now();
        for kind in [BaselineKind::Memcpy, BaselineKind::RingPingpong, BaselineKind::TcpBw] {
            let r = run(kind, &o).unwrap();
            assert!(r[0].iterations > 0, "{kind:?}");
        }
        assert!(t.elapsed() < Duration::from_secs(30));
    }

    #[test]
    fn bad_input_is_an_error() {
        let o = opts(&[8], 10);
        assert!(run(BaselineKind::Memcpy, &BaselineOpts { sizes: vec![], ..o.clone() }).is_err());
        assert!(run(BaselineKind::TcpLat, &BaselineOpts { sizes: vec![0], ..o.clone() }).is_err());
        assert!(run(BaselineKind::Memcpy, &BaselineOpts { iters: 0, ..o.clone() }).is_err());
        assert!(run(BaselineKind::RingPingpong, &BaselineOpts { iters: u64::MAX, ..o.clone() })
            .is_err());
        assert!(run(BaselineKind::Memcpy, &BaselineOpts { cores: (0, 100_000), ..o }).is_err());
        assert!(serve(BaselineKind::Memcpy, "127.0.0.1:0".parse().unwrap()).is_err());
    }
}
