//! The RPC layer's accounting under faults, as two processes (the guest's wire under `tc
//! netem`, `kill -9`): every call ends exactly once, within its deadline, and no request runs
//! twice.
//!
//! ```text
//! rpc_faults [both] [--count N] [--window W]                      # one process, soft
//! rpc_faults server ADDR [--provider soft|ibverbs] [--config MAP.toml] [--clients N]
//! rpc_faults client ADDR [--count N] [--window W] [--provider ...] [--config ...]
//! ```
//!
//! The server answers `exec` (it records each request id it runs, and counts an id run twice)
//! and `stats` (how many it ran, and how many twice). A client process runs `--window` threads,
//! each with its own session, each making `--count` calls one after the other with a
//! deadline of `CALL_MS`; a call that ends with its session closed (the server died, the wire
//! gave up) is not made again (its outcome is unknown: at most once), and the thread connects
//! again, retrying for up to `--timeout` seconds (a server restarted on the same address is
//! reached). At the end it asks the server for its counts and prints one line:
//! `rpc_faults client: calls C ended E ok O timeout T closed S other X late L
//! (max over deadline M ms) reconnects R; server ran N, twice D`. Exit status 0 when every
//! call ended exactly once (E = C), none ended later than its deadline plus `GRACE_MS`, every
//! answer was the call's own, and the last server ran no request twice; 1 if not; 2 on bad
//! usage.

#[allow(dead_code)] // its command line and core map; not its handler pair
mod engine_common;
#[allow(dead_code)] // each RPC example uses part of it
mod rpc_common;

use std::cell::RefCell;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use corelink_engine::verbs::Provider;
use corelink_rpc::{Endpoint, EndpointConfig, Method, Reject, ReqType, RpcError, SessionId};
use engine_common::{Common, Fail, Role};
use rpc_common::{rpc_fail, Example};

/// A call's deadline.
const CALL_MS: u64 = 10_000;
/// How far past its deadline a call may end before it counts as late (the endpoint dates a
/// deadline at its next look, and the guest is emulated).
const GRACE_MS: u64 = 1_000;
/// Runs the request (an 8-byte id) and answers it.
const EXEC: ReqType = ReqType(1);

/// The server's counts: requests run, and ids run twice; a `true` request says that the
/// client process is done (the server exits once `--clients` have said so).
struct Stats;
impl Method for Stats {
    const TYPE: ReqType = ReqType(2);
    type Request<'a> = bool;
    type Response<'a> = (u64, u64);
}

#[derive(Parser, Debug)]
#[command(name = "rpc_faults", about = "RPC accounting under faults: each call ends once")]
struct Cli {
    #[command(flatten)]
    common: Common,
}

/// The server's counters, for its summary.
#[derive(Default)]
struct Counts {
    ran: AtomicU64,
    twice: AtomicU64,
    done: AtomicU64,
}

fn server_endpoint<P: Provider>(
    res: &corelink_config::WorkerResources,
    counts: Arc<Counts>,
) -> corelink_rpc::Result<(Endpoint<P>, rpc_common::NoServer)> {
    let mut ep = Endpoint::new(EndpointConfig::for_worker(res), res)?;
    let seen: Rc<RefCell<HashSet<u64>>> = Rc::default();
    let c = counts.clone();
    ep.register(EXEC, move |req, resp| {
        let id: [u8; 8] = req.data.try_into().map_err(|_| Reject(1))?;
        c.ran.fetch_add(1, Relaxed);
        if !seen.borrow_mut().insert(u64::from_le_bytes(id)) {
            c.twice.fetch_add(1, Relaxed);
        }
        resp.write(req.data).map_err(|_| Reject(2))
    })?;
    let c = counts.clone();
    ep.register_method::<Stats>(move |_, done| {
        if done {
            c.done.fetch_add(1, Relaxed);
        }
        Ok((c.ran.load(Relaxed), c.twice.load(Relaxed)))
    })?;
    Ok((ep, rpc_common::NoServer))
}

/// One client thread's tally.
#[derive(Debug, Default)]
struct Tally {
    calls: u64,
    ok: u64,
    timeout: u64,
    closed: u64,
    other: u64,
    late: u64,
    max_over: Duration,
    reconnects: u64,
}

impl Tally {
    fn ended(&self) -> u64 {
        self.ok + self.timeout + self.closed + self.other
    }

    fn add(&mut self, t: &Tally) {
        self.calls += t.calls;
        self.ok += t.ok;
        self.timeout += t.timeout;
        self.closed += t.closed;
        self.other += t.other;
        self.late += t.late;
        self.max_over = self.max_over.max(t.max_over);
        self.reconnects += t.reconnects;
    }
}

/// A session to `addr`, retried until `until` (a server being restarted refuses meanwhile).
fn connect(
    h: &mut corelink_rpc::Handle,
    addr: SocketAddr,
    until: Instant,
) -> Result<SessionId, Fail> {
    loop {
        let s = h.connect(addr).map_err(rpc_fail("connect"))?;
        // (a session is open once a call on it is answered; a stats call tells)
        match h.call_method::<Stats>(s, &false, Duration::from_millis(CALL_MS)) {
            Ok(_) => return Ok(s),
            Err(e) if Instant::now() >= until => {
                return Err(Fail::Run(format!(
                    "no session to {addr}: {}",
                    corelink_verbs::chain(&e)
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn client<P: Provider>(a: &Common, addr: SocketAddr) -> Result<(), Fail> {
    let cfg = rpc_common::map(a, None)?;
    let threads = a.window as usize;
    let mut c = rpc_common::start::<P, _>("rpc_faults client", &cfg, threads, |res| {
        Ok((Endpoint::new(EndpointConfig::for_worker(res), res)?, rpc_common::NoServer))
    })?;
    println!("rpc_faults client: {threads} sessions to {addr} ({})", P::NAME);
    let (count, until) = (u64::from(a.count), Instant::now() + Duration::from_secs(a.timeout));
    if count >= 1 << 32 || threads > 255 {
        return Err(Fail::Usage("--count below 2^32 and --window below 256".into()));
    }
    let deadline = Duration::from_millis(CALL_MS);
    let workers: Vec<_> = c
        .handles
        .drain(..)
        .enumerate()
        .map(|(t, mut h)| {
            std::thread::spawn(move || -> Result<(Tally, corelink_rpc::Handle), Fail> {
                let mut tally = Tally::default();
                let mut s = connect(&mut h, addr, until)?;
                for i in 0..count {
                    // (unique across client processes too: the server counts ids run twice)
                    let id = u64::from(std::process::id()) << 40 | (t as u64) << 32 | i;
                    let start = Instant::now();
                    let r = h.call(s, EXEC, &id.to_le_bytes(), deadline);
                    let over = start.elapsed().saturating_sub(deadline);
                    tally.calls += 1;
                    tally.max_over = tally.max_over.max(over);
                    if over > Duration::from_millis(GRACE_MS) {
                        tally.late += 1;
                    }
                    match r {
                        Ok(b) if b == id.to_le_bytes() => tally.ok += 1,
                        Ok(_) => tally.other += 1,
                        Err(RpcError::Timeout) => {
                            tally.timeout += 1;
                            if tally.timeout <= 3 {
                                eprintln!("rpc_faults client: thread {t}: call {i} on {s} timed out");
                            }
                        }
                        Err(RpcError::SessionClosed) => {
                            tally.closed += 1;
                            tally.reconnects += 1;
                            eprintln!("rpc_faults client: thread {t}: call {i}: session {s} closed; connecting again");
                            s = connect(&mut h, addr, until)?;
                            eprintln!("rpc_faults client: thread {t}: session {s} open");
                        }
                        Err(e) => {
                            tally.other += 1;
                            if tally.other <= 3 {
                                let e = corelink_verbs::chain(&e);
                                eprintln!("rpc_faults client: thread {t}: call {i} on {s}: {e}");
                            }
                        }
                    }
                }
                let _ = h.close(s);
                Ok((tally, h))
            })
        })
        .collect();
    let mut all = Tally::default();
    let mut errors = Vec::new();
    let mut last = None;
    for w in workers {
        match w.join() {
            Ok(Ok((t, h))) => {
                all.add(&t);
                last = Some(h);
            }
            Ok(Err(Fail::Run(e) | Fail::Usage(e))) => errors.push(e),
            Err(_) => errors.push("a client thread panicked".into()),
        }
    }
    // The server's counts, on a session of their own (which tells it this client is done).
    let stats = last.as_mut().map(|h| {
        let s = connect(h, addr, until)?;
        let st = h.call_method::<Stats>(s, &true, deadline);
        let _ = h.close(s);
        st.map_err(|e| Fail::Run(format!("stats: {}", corelink_verbs::chain(&e))))
    });
    let (ran, twice) = match stats {
        Some(Ok(st)) => st,
        Some(Err(Fail::Run(e) | Fail::Usage(e))) => {
            errors.push(e);
            (0, 0)
        }
        None => (0, 0),
    };
    println!(
        "rpc_faults client: calls {} ended {} ok {} timeout {} closed {} other {} late {} (max over \
         deadline {} ms) reconnects {}; server ran {ran}, twice {twice}",
        all.calls,
        all.ended(),
        all.ok,
        all.timeout,
        all.closed,
        all.other,
        all.late,
        all.max_over.as_millis(),
        all.reconnects,
    );
    if all.ended() != all.calls || all.calls != count * threads as u64 {
        errors.push(format!("{} calls ended of {} made", all.ended(), all.calls));
    }
    if all.late > 0 || all.other > 0 || twice > 0 {
        errors.push(format!(
            "{} late, {} wrong or failed otherwise, {twice} run twice",
            all.late, all.other
        ));
    }
    c.shutdown()?;
    match errors.is_empty() {
        true => Ok(()),
        false => Err(Fail::Run(errors.join("; "))),
    }
}

/// Waits for `clients` client processes to say they are done (`timeout` at most), then stops.
fn finish_server<P: Provider>(
    s: rpc_common::Started<P>,
    counts: &Counts,
    clients: u32,
    timeout: Duration,
) -> Result<(), Fail> {
    let deadline = Instant::now() + timeout;
    while counts.done.load(Relaxed) < u64::from(clients) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let done = counts.done.load(Relaxed);
    let waited = match done >= u64::from(clients) {
        true => Ok(()),
        false => Err(Fail::Run(format!("{done} of {clients} clients said they were done"))),
    };
    println!(
        "rpc_faults server: ran {} requests, {} twice",
        counts.ran.load(Relaxed),
        counts.twice.load(Relaxed)
    );
    s.shutdown()?;
    waited
}

struct RpcFaults;

impl Example for RpcFaults {
    fn run<P: Provider>(&self, role: Role, a: &Common, addr: SocketAddr) -> Result<(), Fail> {
        let timeout = Duration::from_secs(a.timeout);
        match role {
            Role::Server => {
                let (s, counts) =
                    rpc_common::start_server("rpc_faults server", a, addr, server_endpoint::<P>)?;
                finish_server(s, &counts, a.clients, timeout)
            }
            Role::Client => client::<P>(a, addr),
            Role::Both => {
                let (s, counts) =
                    rpc_common::start_server("rpc_faults server", a, addr, server_endpoint::<P>)?;
                let c = client::<P>(a, addr);
                let wait = if c.is_ok() { timeout } else { Duration::ZERO };
                c.and(finish_server(s, &counts, 1, wait))
            }
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let addr = SocketAddr::from(([10, 99, 23, 1], 7000));
    rpc_common::main("rpc_faults", &cli.common, addr, &RpcFaults)
}
