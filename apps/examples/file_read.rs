//! A distributed file read on the RPC layer: a file split into blocks held by several servers;
//! reading it is one call on the reader's side, `read_file`, which sends every block request
//! to the servers in parallel and assembles the file. Several readers read the same file at
//! once, and the block request type is mergeable (`Endpoint::set_mergeable`): an identical
//! block request already in flight on the session is not sent again, and both callers get its
//! response.
//!
//! ```text
//! file_read [both] [--reads N]                             # one process, soft
//! file_read server ADDR [--provider soft|ibverbs] [--config MAP.toml] [--clients N]
//! file_read client ADDR [--reads N] [--provider soft|ibverbs]
//! ```
//!
//! The file is `FILE` bytes (generated, the same on every side), in blocks of `BLOCK` bytes on
//! `SERVERS` servers: block `b` is on server `b % SERVERS`, and an even block also on the next
//! one (a replica, which a reader asks when the first holder fails). A server is an engine of
//! its own (in one process: three, on three addresses; as two processes: the server process
//! runs all three, on ADDR's port and the two after it). A block's response (64 KiB) is beyond
//! a receive: it goes as a large message (`EndpointConfig::with_large`: the server's arena,
//! which the reader reads with one RDMA read).
//!
//! The reader process runs `READERS` threads with one `Handle` each into its worker, sharing
//! one session per server; each reads the whole file `--reads` times, all starting together,
//! and checks every byte. It prints the block calls, how many were merged
//! (`RpcMetrics::merged`) and sent, and each server's executions, and checks that the
//! servers executed exactly the calls sent. Exit status: 0 when every check held, 1 if not, 2
//! on bad usage.

#[allow(dead_code)] // its command line and core map; not its handler pair
mod engine_common;
#[allow(dead_code)] // each RPC example uses part of it
mod rpc_common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::Parser;
use corelink_config::{PoolClass, Validated};
use corelink_engine::verbs::Provider;
use corelink_rpc::{block_on, Endpoint, EndpointConfig, Handle, Reject, ReqType, SessionId};
use engine_common::{Common, Fail, Role};
use rpc_common::{rpc_fail, Ends, Example, NoServer, Started};

/// The file: its id, bytes, block size, servers.
const FILE_ID: u32 = 7;
const FILE: usize = 4 << 20;
const BLOCK: usize = 64 << 10;
const BLOCKS: usize = FILE / BLOCK;
const SERVERS: usize = 3;
/// Reader threads of a reader process.
const READERS: usize = 4;
/// A block request: the file id and the block number (little-endian `u32`s); the response is
/// the block's bytes.
const READ_BLOCK: ReqType = ReqType(1);
/// Large response slots of a server (a session's calls hold at most its credits).
const LARGE_SLOTS: u16 = 64;
/// 64 KiB buffers a reader's worker needs: every session's calls reading their response.
const READ_BUFFERS: usize = 160;
/// A deadline no call here reaches unless something is broken.
const CALL: Duration = Duration::from_secs(20);
/// Reject codes.
const BAD_REQUEST: u32 = 1;
const NOT_HERE: u32 = 2;

#[derive(Parser, Debug)]
#[command(name = "file_read", about = "A file read from blocks on several servers")]
struct Cli {
    #[command(flatten)]
    common: Common,
    /// reads of the whole file by each reader thread
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1000))]
    reads: u32,
}

/// Byte `i` of the file.
fn file_byte(i: usize) -> u8 {
    ((i as u64 ^ 0x5bd1_e995).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
}

fn block_bytes(b: usize) -> Vec<u8> {
    (b * BLOCK..(b + 1) * BLOCK).map(file_byte).collect()
}

/// The servers that hold block `b`, the first holder first.
fn holders(b: usize) -> Vec<usize> {
    let first = b % SERVERS;
    match b % 2 {
        0 => vec![first, (first + 1) % SERVERS],
        _ => vec![first],
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn request(b: usize) -> [u8; 8] {
    let mut r = [0u8; 8];
    r[..4].copy_from_slice(&FILE_ID.to_le_bytes());
    r[4..].copy_from_slice(&(b as u32).to_le_bytes());
    r
}

/// Server `index`'s endpoint: the blocks it holds, served as large responses.
fn server_endpoint<P: Provider>(
    res: &corelink_config::WorkerResources,
    index: usize,
    executed: Arc<AtomicU64>,
) -> corelink_rpc::Result<(Endpoint<P>, NoServer)> {
    let cfg = EndpointConfig::for_worker(res).with_large(BLOCK, LARGE_SLOTS);
    let mut ep = Endpoint::new(cfg, res)?;
    let blocks: HashMap<u32, Vec<u8>> = (0..BLOCKS)
        .filter(|&b| holders(b).contains(&index))
        .map(|b| (b as u32, block_bytes(b)))
        .collect();
    ep.register(READ_BLOCK, move |req, resp| {
        let Ok(r) = <[u8; 8]>::try_from(req.data) else { return Err(Reject(BAD_REQUEST)) };
        let (file, b) = (u32_at(&r, 0), u32_at(&r, 4));
        if file != FILE_ID {
            return Err(Reject(BAD_REQUEST));
        }
        let data = blocks.get(&b).ok_or(Reject(NOT_HERE))?;
        executed.fetch_add(1, Relaxed);
        // Refused only when every large slot is out: the reader hears `Unanswered`.
        resp.write(data).map_err(|_| Reject(BAD_REQUEST))
    })?;
    Ok((ep, NoServer))
}

/// A server's engine and the count of block requests it executed.
type Server<P> = (Started<P>, Arc<AtomicU64>);

/// The servers' engines, listening on `addr`'s port and the ones after it.
fn start_servers<P: Provider>(a: &Common, addr: SocketAddr) -> Result<Vec<Server<P>>, Fail> {
    (0..SERVERS)
        .map(|i| {
            let at = SocketAddr::new(addr.ip(), addr.port() + i as u16);
            let cfg = rpc_common::map(a, Some(at))?;
            let executed = Arc::new(AtomicU64::new(0));
            let e = executed.clone();
            let name = format!("file_read server {i}");
            let s = rpc_common::start::<P, _>(&name, &cfg, 0, move |res| {
                server_endpoint(res, i, e.clone())
            })?;
            let blocks = (0..BLOCKS).filter(|&b| holders(b).contains(&i)).count();
            let on = s.engine.listen_addr().map_or("?".into(), |a| a.to_string());
            println!("{name}: on {on} ({}), {blocks} blocks", P::NAME);
            Ok((s, executed))
        })
        .collect::<Result<Vec<_>, Fail>>()
        .inspect(|_| println!("file_read servers: listening")) // all of them
}

/// Waits for `clients` sessions to close on each server; says what each executed.
fn finish_servers<P: Provider>(
    servers: Vec<Server<P>>,
    clients: u32,
    timeout: Duration,
) -> Result<u64, Fail> {
    let mut total = 0;
    let mut res = Ok(());
    for (i, (s, executed)) in servers.into_iter().enumerate() {
        let waited = s.wait_closed(clients, timeout);
        let n = executed.load(Relaxed);
        total += n;
        println!("file_read server {i}: {n} block requests executed");
        res = res.and(waited).and(s.shutdown());
    }
    res.map(|()| total)
}

/// What the readers did.
struct Reads {
    calls: u64,
    merged: u64,
    retries: u64,
}

/// Reads the whole file: every block request at once (to its first holder), then the answers
/// in order; a block whose call failed is asked again of its holders in turn. A failure says
/// why the session of the last try ended, if it did.
fn read_file(
    h: &mut Handle,
    sessions: &[SessionId],
    ends: &Ends,
    retries: &mut u64,
) -> Result<Vec<u8>, Fail> {
    let calls: Vec<_> = (0..BLOCKS)
        .map(|b| h.call_async(sessions[holders(b)[0]], READ_BLOCK, request(b).to_vec(), CALL))
        .collect();
    let mut file = vec![0u8; FILE];
    for (b, call) in calls.into_iter().enumerate() {
        let mut got = block_on(call);
        let mut on = sessions[holders(b)[0]];
        for &s in holders(b).iter().cycle().skip(1).take(3) {
            if got.is_ok() {
                break;
            }
            *retries += 1;
            on = sessions[s];
            got = h.call(on, READ_BLOCK, &request(b), CALL);
        }
        let bytes = got.map_err(ends.fail(&format!("block {b}"), on))?;
        if bytes.len() != BLOCK {
            return Err(Fail::Run(format!("block {b}: {} bytes, {BLOCK} expected", bytes.len())));
        }
        file[b * BLOCK..(b + 1) * BLOCK].copy_from_slice(&bytes);
    }
    Ok(file)
}

/// The reader's core map: enough 64 KiB buffers for every session's responses.
fn reader_map(a: &Common) -> Result<Validated, Fail> {
    let mut cfg = rpc_common::map(a, None)?;
    let pools = &mut cfg.map.worker.pools;
    match pools.iter_mut().find(|c| c.size >= BLOCK) {
        Some(c) => c.count = c.count.max(READ_BUFFERS),
        None => pools.push(PoolClass { size: BLOCK, count: READ_BUFFERS }),
    }
    Ok(cfg)
}

fn client<P: Provider>(a: &Common, addr: SocketAddr, reads: u32) -> Result<Reads, Fail> {
    let cfg = reader_map(a)?;
    let mut c = rpc_common::start::<P, _>("file_read client", &cfg, READERS + 1, |res| {
        let cfg = EndpointConfig::for_worker(res).with_large(BLOCK, 1);
        let mut ep = Endpoint::new(cfg, res)?;
        ep.set_mergeable(READ_BLOCK, true)?;
        Ok((ep, NoServer))
    })?;
    let res = (|| {
        // One handle opens and closes the sessions; the readers share them.
        let mut control = c.handles.remove(0);
        let sessions = (0..SERVERS)
            .map(|i| {
                let at = SocketAddr::new(addr.ip(), addr.port() + i as u16);
                control.connect(at).map_err(rpc_fail("connect"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        println!(
            "file_read client: {READERS} readers x {reads} reads of a {} MiB file in {BLOCKS} \
             blocks of {} KiB from {SERVERS} servers at {addr} and the next ports ({})",
            FILE >> 20,
            BLOCK >> 10,
            P::NAME
        );
        let want: Arc<Vec<u8>> = Arc::new((0..FILE).map(file_byte).collect());
        let barrier = Arc::new(Barrier::new(READERS));
        let start = Instant::now();
        let threads: Vec<_> = c
            .handles
            .drain(..)
            .map(|mut h| {
                let (sessions, want, barrier) = (sessions.clone(), want.clone(), barrier.clone());
                let ends = c.ends.clone();
                std::thread::spawn(move || -> Result<(u64, Duration), Fail> {
                    let (mut retries, mut took) = (0, Duration::ZERO);
                    for r in 0..reads {
                        barrier.wait();
                        let t = Instant::now();
                        let file = read_file(&mut h, &sessions, &ends, &mut retries);
                        took += t.elapsed();
                        match file {
                            Ok(f) if f == *want => {}
                            Ok(f) => {
                                let at = f.iter().zip(want.iter()).position(|(x, y)| x != y);
                                return Err(Fail::Run(format!("read {r}: byte {at:?} differs")));
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    Ok((retries, took))
                })
            })
            .collect();
        let mut errors = Vec::new();
        let (mut retries, mut took) = (0, Duration::ZERO);
        for t in threads {
            match t.join() {
                Ok(Ok((r, d))) => (retries, took) = (retries + r, took + d),
                Ok(Err(Fail::Run(e) | Fail::Usage(e))) => errors.push(e),
                Err(_) => errors.push("a reader panicked".into()),
            }
        }
        let wall = start.elapsed();
        if !errors.is_empty() {
            return Err(Fail::Run(errors.join("; ")));
        }
        let n = u64::from(reads) * READERS as u64;
        let expect = n * BLOCKS as u64 + retries;
        let m = c.metrics_when(|m| m.calls >= expect && m.responses + m.errors >= m.calls);
        let per_read = took.as_secs_f64() * 1e3 / n as f64;
        let mib_s = (n as usize * FILE) as f64 / (1 << 20) as f64 / wall.as_secs_f64();
        println!(
            "file_read client: {n} reads of the file, every byte equal; {per_read:.1} ms per \
             read, {mib_s:.0} MiB/s together; {} block calls, {} merged with an identical one \
             in flight (RpcMetrics::merged), {} sent, {retries} asked again of another holder",
            m.calls,
            m.merged,
            m.calls - m.merged
        );
        for &s in &sessions {
            control.close(s).map_err(c.ends.fail("close", s))?;
        }
        Ok(Reads { calls: m.calls, merged: m.merged, retries })
    })();
    c.shutdown()?;
    res
}

struct FileRead {
    reads: u32,
}

impl FileRead {
    /// The servers executed exactly the calls the reader sent (the others were merged).
    fn check(r: &Reads, executed: u64) -> Result<(), Fail> {
        let sent = r.calls - r.merged;
        if r.retries == 0 && executed != sent {
            return Err(Fail::Run(format!(
                "the servers executed {executed} block requests, the reader sent {sent}"
            )));
        }
        println!(
            "file_read: the servers executed {executed} block requests, the reader sent {sent}"
        );
        Ok(())
    }
}

impl Example for FileRead {
    fn run<P: Provider>(&self, role: Role, a: &Common, addr: SocketAddr) -> Result<(), Fail> {
        let timeout = Duration::from_secs(a.timeout);
        match role {
            Role::Server => {
                let servers = start_servers::<P>(a, addr)?;
                finish_servers(servers, a.clients, timeout).map(|_| ())
            }
            Role::Client => client::<P>(a, addr, self.reads).map(|_| ()),
            Role::Both => {
                let servers = start_servers::<P>(a, addr)?;
                let c = client::<P>(a, addr, self.reads);
                let wait = if c.is_ok() { timeout } else { Duration::ZERO };
                let executed = finish_servers(servers, 1, wait);
                let (r, executed) = (c?, executed?);
                FileRead::check(&r, executed)
            }
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let addr = SocketAddr::from(([10, 99, 23, 1], 7000));
    rpc_common::main("file_read", &cli.common, addr, &FileRead { reads: cli.reads })
}
