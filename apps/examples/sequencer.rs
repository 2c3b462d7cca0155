//! The atomic sequencer as a service, two ways side by side: a `next` RPC (the server's
//! handler increments its counter) and a one-sided fetch-and-add on an 8-byte word of the
//! server's registered memory, granted to each session (no server CPU on that path).
//!
//! ```text
//! sequencer [both] [--count N]                             # one process, soft
//! sequencer server ADDR [--provider soft|ibverbs] [--config MAP.toml] [--clients N]
//! sequencer client ADDR [--count N] [--provider soft|ibverbs]
//! ```
//!
//! A client process runs `CLIENTS` client threads at once, each with its own session (the
//! server's `--clients N` counts client processes: it exits after `N * CLIENTS` sessions
//! closed). Each thread takes `--count` numbers by RPC, then, once every thread is done,
//! `--count` by fetch-and-add, one at a time. The client checks that each way handed out
//! every number of a contiguous range exactly once (over all its threads), and prints the time
//! per number of each way, measured in the same run, and their ratio.
//!
//! The two ways use two counters: a NIC's atomics are atomic among themselves only (the
//! usual `IBV_ATOMIC_HCA`), not with the server CPU's, so an RPC handler that incremented the
//! word the NICs add to could lose or repeat numbers. Both paths here include the hand-over
//! from the client's thread to its worker (an RPC through a `Handle`, a fetch-and-add through
//! the worker's order channel, which its service submits with `Rpc::submit`). Exit status: 0
//! when every check held, 1 if not, 2 on bad usage.

#[allow(dead_code)] // its command line and core map; not its handler pair
mod engine_common;
#[allow(dead_code)] // each RPC example uses part of it
mod rpc_common;

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::Parser;
use corelink_engine::verbs::{AccessFlags, Provider, RemoteAddr, RemoteRegion};
use corelink_engine::Memory;
use corelink_rpc::{Endpoint, EndpointConfig, Method, Reject, ReqType, Rpc, SessionId};
use engine_common::{Common, Fail, Role};
use rpc_common::{rpc_fail, Example, Serving};
use serde::{Deserialize, Serialize};

/// Client threads (sessions) per client process.
const CLIENTS: usize = 4;
/// A deadline no call here reaches unless something is broken.
const CALL: Duration = Duration::from_secs(10);
/// Reject code: the session has no grant.
const NO_GRANT: u32 = 1;

/// Where the word is, as `hello` answers.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Word {
    addr: u64,
    rkey: u32,
}

struct Hello;
impl Method for Hello {
    const TYPE: ReqType = ReqType(1);
    type Request<'a> = ();
    type Response<'a> = Word;
}
struct Next;
impl Method for Next {
    const TYPE: ReqType = ReqType(2);
    type Request<'a> = ();
    type Response<'a> = u64;
}

#[derive(Parser, Debug)]
#[command(name = "sequencer", about = "An atomic sequencer by RPC and by fetch-and-add")]
struct Cli {
    #[command(flatten)]
    common: Common,
}

/// The server's counters, for its summary.
#[derive(Default)]
struct Counts {
    rpcs: AtomicU64,
    word: AtomicU64,
}

/// The server part: the word's memory and the sessions' grants.
struct Seq<P: Provider> {
    mem: Option<Memory<P>>,
    grants: Rc<RefCell<Vec<(SessionId, RemoteRegion)>>>,
    counts: Arc<Counts>,
}

impl<P: Provider> Serving<P> for Seq<P> {
    fn accepted(&mut self, rpc: &mut Rpc<'_, P>, session: SessionId) {
        if self.mem.is_none() {
            match rpc.cx().register_memory(64, false) {
                Ok(m) => self.mem = Some(m),
                Err(e) => return eprintln!("sequencer server: registering the word: {e}"),
            }
        }
        let (Some(mem), Some(conn)) = (&self.mem, rpc.conn(session)) else { return };
        let rights = AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_READ;
        match rpc.cx().grant(conn, mem, 0, 8, rights) {
            Ok(g) => self.grants.borrow_mut().push((session, g.region)),
            Err(e) => eprintln!("sequencer server: granting {conn} the word: {e}"),
        }
    }

    fn closed(&mut self, _rpc: &mut Rpc<'_, P>, session: SessionId) {
        self.grants.borrow_mut().retain(|g| g.0 != session);
        if let Some(w) = self.mem.as_ref().and_then(|m| m.read_u64(0).ok()) {
            self.counts.word.store(w, Relaxed);
        }
    }
}

fn server_endpoint<P: Provider>(
    res: &corelink_config::WorkerResources,
    counts: Arc<Counts>,
) -> corelink_rpc::Result<(Endpoint<P>, Seq<P>)> {
    let mut ep = Endpoint::new(EndpointConfig::for_worker(res), res)?;
    let grants: Rc<RefCell<Vec<(SessionId, RemoteRegion)>>> = Rc::default();
    let g = grants.clone();
    ep.register_method::<Hello>(move |req, ()| {
        let g = g.borrow();
        let (_, r) = g.iter().find(|g| g.0 == req.session).ok_or(Reject(NO_GRANT))?;
        Ok(Word { addr: r.addr, rkey: r.rkey })
    })?;
    let next = Cell::new(0u64);
    let c = counts.clone();
    ep.register_method::<Next>(move |_, ()| {
        c.rpcs.fetch_add(1, Relaxed);
        let n = next.get();
        next.set(n + 1);
        Ok(n)
    })?;
    Ok((ep, Seq { mem: None, grants, counts }))
}

/// What one way of taking numbers came to over every thread.
struct Way {
    numbers: Vec<u64>,
    wall: Duration,
    per_call: Duration,
}

impl Way {
    /// Checks that the numbers are a contiguous range, each once; says so.
    fn check(&mut self, what: &str) -> Result<String, Fail> {
        self.numbers.sort_unstable();
        let (first, n) = (self.numbers[0], self.numbers.len() as u64);
        if let Some(w) = self.numbers.windows(2).find(|w| w[1] != w[0] + 1) {
            let why = if w[0] == w[1] { "twice" } else { "then a gap" };
            return Err(Fail::Run(format!("{what}: number {} {why} ({})", w[0], w[1])));
        }
        let per = self.wall.as_secs_f64() * 1e6 / n as f64;
        Ok(format!(
            "{what}: {first}..={} each once, {per:.2} us per number ({:.1} us per call)",
            first + n - 1,
            self.per_call.as_secs_f64() * 1e6
        ))
    }

    fn per_number(&self) -> f64 {
        self.wall.as_secs_f64() / self.numbers.len() as f64
    }
}

/// `count` numbers from `next`, one at a time, and how long they took.
fn take(
    count: u64,
    mut next: impl FnMut() -> Result<u64, Fail>,
) -> Result<(Vec<u64>, Duration), Fail> {
    let start = Instant::now();
    let numbers = (0..count).map(|_| next()).collect::<Result<Vec<u64>, Fail>>()?;
    Ok((numbers, start.elapsed()))
}

fn client<P: Provider>(a: &Common, addr: SocketAddr) -> Result<(), Fail> {
    let cfg = rpc_common::map(a, None)?;
    let mut c = rpc_common::start::<P, _>("sequencer client", &cfg, CLIENTS, |res| {
        Ok((Endpoint::new(EndpointConfig::for_worker(res), res)?, rpc_common::NoServer))
    })?;
    println!("sequencer client: {CLIENTS} clients connecting to {addr} ({})", P::NAME);
    let count = u64::from(a.count);
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let threads: Vec<_> = c
        .handles
        .drain(..)
        .map(|mut h| {
            let mut os = c.one_sided.another();
            let (ends, barrier) = (c.ends.clone(), barrier.clone());
            std::thread::spawn(move || -> Result<[(Vec<u64>, Duration); 2], Fail> {
                let setup = h.connect(addr).map_err(rpc_fail("connect")).and_then(|s| {
                    let w = h.call_method::<Hello>(s, &(), CALL).map_err(ends.fail("hello", s))?;
                    Ok((s, RemoteAddr { addr: w.addr, rkey: w.rkey }))
                });
                // Every client waits for the others at each step, whatever its own came to
                // (so that none waits for ever for one that failed).
                barrier.wait(); // every client connected
                let by_rpc = match &setup {
                    Ok((s, _)) => take(count, || {
                        h.call_method::<Next>(*s, &(), CALL).map_err(ends.fail("next", *s))
                    }),
                    Err(_) => Ok((Vec::new(), Duration::ZERO)),
                };
                barrier.wait(); // every client took its numbers by RPC
                let one_sided = match &setup {
                    Ok((s, remote)) => take(count, || {
                        let n = os.fetch_add(*s, *remote, 1);
                        n.map_err(|e| Fail::Run(format!("fetch-and-add: {e}")))
                    }),
                    Err(_) => Ok((Vec::new(), Duration::ZERO)),
                };
                barrier.wait(); // every client took its numbers one-sided
                let (session, _) = setup?;
                h.close(session).map_err(ends.fail("close", session))?;
                Ok([by_rpc?, one_sided?])
            })
        })
        .collect();
    // The main thread times the phases (from every client connected to every client done).
    let mut walls = [Duration::ZERO; 2];
    barrier.wait();
    for wall in &mut walls {
        let start = Instant::now();
        barrier.wait();
        *wall = start.elapsed();
    }
    let mut ways =
        [0, 1].map(|i| Way { numbers: Vec::new(), wall: walls[i], per_call: Duration::ZERO });
    let mut errors = Vec::new();
    for t in threads {
        match t.join() {
            Ok(Ok(got)) => {
                for (way, (numbers, took)) in ways.iter_mut().zip(got) {
                    way.numbers.extend(numbers);
                    way.per_call += took / (count as u32 * CLIENTS as u32);
                }
            }
            Ok(Err(Fail::Run(e) | Fail::Usage(e))) => errors.push(e),
            Err(_) => errors.push("a client panicked".into()),
        }
    }
    let res = match errors.is_empty() {
        false => Err(Fail::Run(errors.join("; "))),
        true => (|| {
            let [rpc, os] = &mut ways;
            let lines = [rpc.check("by the next RPC")?, os.check("by fetch-and-add")?];
            println!(
                "sequencer client: {CLIENTS} clients x {count} numbers each way\n\
                 sequencer client: {}\nsequencer client: {}\n\
                 sequencer client: time per number, rpc / one-sided = {:.2}",
                lines[0],
                lines[1],
                rpc.per_number() / os.per_number()
            );
            Ok(())
        })(),
    };
    c.shutdown()?;
    res
}

fn finish_server<P: Provider>(
    s: rpc_common::Started<P>,
    counts: &Counts,
    sessions: u32,
    timeout: Duration,
) -> Result<(), Fail> {
    let waited = s.wait_closed(sessions, timeout);
    println!(
        "sequencer server: {} next RPCs served; the one-sided word holds {} (fetch-and-adds, \
         no server CPU)",
        counts.rpcs.load(Relaxed),
        counts.word.load(Relaxed)
    );
    s.shutdown()?;
    waited
}

struct Sequencer;

impl Example for Sequencer {
    fn run<P: Provider>(&self, role: Role, a: &Common, addr: SocketAddr) -> Result<(), Fail> {
        let timeout = Duration::from_secs(a.timeout);
        let sessions = CLIENTS as u32;
        match role {
            Role::Server => {
                let (s, counts) =
                    rpc_common::start_server("sequencer server", a, addr, server_endpoint::<P>)?;
                finish_server(s, &counts, a.clients * sessions, timeout)
            }
            Role::Client => client::<P>(a, addr),
            Role::Both => {
                let (s, counts) =
                    rpc_common::start_server("sequencer server", a, addr, server_endpoint::<P>)?;
                let c = client::<P>(a, addr);
                let wait = if c.is_ok() { timeout } else { Duration::ZERO };
                c.and(finish_server(s, &counts, sessions, wait))
            }
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let addr = SocketAddr::from(([10, 99, 22, 1], 7000));
    rpc_common::main("sequencer", &cli.common, addr, &Sequencer)
}
