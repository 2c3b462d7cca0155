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
//! - `send_lat`: a ping-pong of plain sends (no immediate, as perftest's), the server echoing
//!   each message; `write_lat`: a ping-pong of
//!   RDMA writes, each side's handler polling the last byte of its memory for the other's
//!   write, as perftest does (see `POLL_SLOT`; sizes over half the region fall back to writes
//!   with immediate, answered through the receive queue). Both report half the round trip
//!   (one-way), as perftest does.
//!
//! The server part is generic: it echoes sends carrying [`ECHO_IMM`] (and, in `send_lat`,
//! sends carrying none), answers writes carrying
//! [`ECHO_IMM`] with a write of the same length into the client's region, and otherwise only
//! keeps its region and receives available; it refuses a client whose test or sizes it was not
//! started for.

use std::net::SocketAddr;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use corelink_config::{ProviderKind, Validated};
use corelink_engine::verbs::{AccessFlags, Provider, RemoteRegion};
use corelink_engine::{ConnId, Cx, Engine, EngineError, Memory, Message, Placement};

use super::opts::{PerfError, PerfOpts, Prov, Role, Test, MAX_ONE_SIDED};
use super::{Latency, Report};
use crate::pair::Pair;
use client::ClientPart;
use map::{core_map, listen_addr};
use server::ServerPart;

mod client;
mod map;
mod rpc;
mod server;

pub use map::{fit_map, pools, recv_size, rpc_header, MapChange};

/// The immediate that asks the server to answer (echo a send, write back a write).
pub const ECHO_IMM: u32 = 0x6563_686f;

/// The immediate of the client's last message: its run is complete (a connection that closes
/// without it ended early: the server fails).
pub const BYE_IMM: u32 = 0x6279_6521;

/// The token of that message's send.
pub(super) const BYE_TOKEN: u64 = u64::MAX - 3;

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
    /// A server part took a client's connection (told when progress lines are on: several
    /// sizes, or `-D`).
    ServerConnected,
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

/// Each side registers `MAX_ONE_SIDED` bytes and grants them whole to its peer once connected
/// (telling it where in a message, `GRANT_IMM`); the client starts once it has the server's.
///
/// `write_lat` in memory-polling mode (perftest's way): the client writes into the server's
/// memory so that the message ends at byte `POLL_SLOT - 1`, which the server's handler polls;
/// the server writes the same length back so that it ends at byte `2 * POLL_SLOT - 1` of the
/// client's memory, which the client polls. No receive, no immediate. The last byte is a marker: the
/// size's index in `-s`/`-a` (so the server answers with the same length) and a sequence.
const POLL_SLOT: usize = MAX_ONE_SIDED / 2;

/// Whether `write_lat` runs in memory-polling mode for these sizes (else: writes with
/// immediate, answered through the receive queue).
pub fn write_lat_polls(sizes: &[usize]) -> bool {
    sizes.len() <= 32 && sizes.iter().all(|&s| s > 0 && s <= POLL_SLOT)
}

/// The marker of round trip `seq` of size number `idx` (never 0, never the previous one).
fn marker(idx: usize, seq: u64) -> u8 {
    ((idx as u8 & 0x1f) << 3) | ((seq % 7) as u8 + 1)
}

/// The byte at `offset` of this side's memory (0 before it is registered).
#[inline]
fn region_byte<P: Provider>(mem: &Option<Memory<P>>, offset: usize) -> u8 {
    mem.as_ref().and_then(|m| m.read_u8(offset).ok()).unwrap_or(0)
}

/// The immediate of the message that tells a peer where the memory granted to it is.
const GRANT_IMM: u32 = 0x6772_6e74;
/// The token of that message's send.
const GRANT_TOKEN: u64 = u64::MAX - 2;

/// Registers this side's memory (once: `MAX_ONE_SIDED` bytes), grants it whole to `conn`'s
/// peer (read, write, atomics), and tells the peer where in a message (immediate `GRANT_IMM`,
/// the region's 20 bytes): no peer reaches a worker's memory unless it is granted.
fn grant_memory<P: Provider>(
    cx: &mut Cx<P>,
    mem: &mut Option<Memory<P>>,
    conn: ConnId,
) -> Result<(), EngineError> {
    let m = match mem {
        Some(m) => m,
        None => mem.insert(cx.register_memory(MAX_ONE_SIDED, false)?),
    };
    let g = cx.grant(conn, m, 0, MAX_ONE_SIDED, AccessFlags::REMOTE_ALL)?;
    let mut b = cx.alloc(RemoteRegion::WIRE_BYTES)?;
    b.fill(&g.region.to_bytes())?;
    cx.send(conn, b, Some(GRANT_IMM), GRANT_TOKEN).map_err(|(_, e)| e)
}

/// The region a peer's grant message names (`None`: not a grant message).
fn granted(msg: &Message<'_>) -> Option<RemoteRegion> {
    (msg.imm == Some(GRANT_IMM)).then(|| RemoteRegion::from_bytes(msg.data)).flatten()
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
    /// Empty polls after which an idle worker yields its core (0: never).
    pub yield_after: u32,
    /// Inline bytes.
    pub max_inline: u32,
    /// Work requests per doorbell at most (the core map's, after `-l`).
    pub post_list: u32,
    /// One request in this many asks for a completion (the core map's, after `-Q`).
    pub signal_every: u32,
    /// QPs per connection (the core map's, after `-q`).
    pub lanes: u32,
    /// Where the server listens / the client connects.
    pub addr: Option<SocketAddr>,
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
        (Some(_), None) => core_map(o, None)?.0.map.provider,
    };
    if provider == ProviderKind::Soft && matches!(o.role, Role::Client(_) | Role::Server) {
        crate::perf::join_soft_fabric();
    }
    let (cfg, changes) = core_map(o, listen_addr(o, provider)?)?;
    for c in &changes {
        eprintln!("corelink-perf: note: {c}");
    }
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
    // The tick clock's calibration, here rather than on a worker (its handlers copy it).
    crate::perf::clock::Clock::new();
    let (tx, rx) = mpsc::channel();
    let shared = Shared { target: Arc::new(OnceLock::new()), tx };
    let serve = !matches!(o.role, Role::Client(_));
    let connect = o.role != Role::Server;
    let opts = Arc::new(o.clone());
    let conns = o.workers as u16;
    let (s2, o2) = (shared.clone(), opts.clone());
    let engine = if o.test.is_rpc() {
        // The RPC tests: an endpoint on each worker that serves, and connects when this
        // process runs the client.
        let res = cfg.map.worker.clone();
        rpc::check(&res, o).map_err(|e| PerfError::Run(format!("the RPC endpoint: {e}")))?;
        Engine::<P>::start(cfg, Placement::RoundRobin, move |_| {
            rpc::handler::<P>(&res, s2.clone(), o2.clone(), connect)
        })
    } else {
        Engine::<P>::start(cfg, Placement::RoundRobin, move |_| {
            let server = serve.then(|| ServerPart::new(s2.clone(), &o2));
            let client = connect.then(|| ClientPart::<P>::new(s2.clone(), o2.clone(), conns));
            Pair::new(server, client, 0)
        })
    }
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
        yield_after: cfg.map.worker.yield_after_empty_polls,
        max_inline: cfg.map.worker.max_inline,
        post_list: cfg.map.worker.batching.post_list,
        signal_every: cfg.map.worker.batching.signal_every,
        lanes: cfg.map.worker.qps.per_conn,
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
            Event::ServerConnected => {
                if o.progress {
                    eprintln!("corelink-perf: a {} client connected", o.test.name());
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
pub fn engine_summary(metrics: &[corelink_engine::Metrics]) -> String {
    let sum = |f: fn(&corelink_engine::Metrics) -> u64| -> u64 { metrics.iter().map(f).sum() };
    // Requests: successful sends, writes, reads and atomics (not receives).
    let requests = sum(|m| m.ops[..5].iter().sum());
    let (wrs, bells, sig) = (sum(|m| m.posted), sum(|m| m.doorbells), sum(|m| m.signalled));
    let (merged, coalesced) = (sum(|m| m.merged_reads), sum(|m| m.coalesced_writes));
    let (polls, empty) = (sum(|m| m.polls), sum(|m| m.empty_polls));
    let per = |n: u64| n as f64 / requests.max(1) as f64;
    format!(
        "engine: {requests} requests, {wrs} work requests ({:.3} per request), {bells} doorbells \
         ({:.3}), {sig} signalled ({:.3}), {merged} reads merged, {coalesced} writes coalesced, \
         {polls} polls ({:.3}), {empty} of them empty ({:.3})",
        per(wrs),
        per(bells),
        per(sig),
        per(polls),
        per(empty)
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
    fn receives_hold_the_largest_send() {
        let mut o = PerfOpts::new(Test::SendBw);
        o.sizes = super::super::all_sizes();
        let p = pools(&o);
        assert_eq!(recv_size(&o), 8 << 20);
        assert!(p.windows(2).all(|w| w[0].size < w[1].size));
        let mut o = PerfOpts::new(Test::WriteBw);
        o.sizes = vec![64, 65536];
        let p = pools(&o);
        assert!(p.windows(2).all(|w| w[0].size < w[1].size));
        assert_eq!(recv_size(&o), 4096);
    }
}
