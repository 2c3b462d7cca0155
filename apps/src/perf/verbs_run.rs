//! The eight tests measured directly on the verbs API, as perftest measures them: what
//! `corelink-perf` runs for `-c UC`, `-c UD` and `--use-srq` (the engine creates RC queue pairs
//! with per-connection receives only), and for `baseline raw_write` (`write_bw` on RC here: the
//! engine's floor on the same provider). Generic over the provider (`soft`, `ibverbs`). The
//! client thread's loop that posts and polls is `bw`'s `client` (not inlined).
//!
//! A run is a server side and a client side, each with its own device context, queue pairs
//! (`-q`, used round robin), CQs, regions and, with `--use-srq`, one shared receive queue. The
//! two exchange their endpoints (QP numbers, PSNs, LID, GID, and the region the peer writes,
//! reads and runs atomics on) over a plain TCP socket and connect their queue pairs by hand
//! (RESET -> INIT -> RTR -> RTS; UD: an address handle and the qkey); the client then starts
//! each size over that socket, measures it and ends it. In loopback (the default on `soft`,
//! `--loopback`) both sides are threads of this process, pinned to different cores where there
//! are two; otherwise the server is the process without SERVER_ADDR and the client the one with
//! it (`-p` is the socket's port). How each test is measured: `bw` and `lat` (modules of this one).

mod bw;
mod guard;
mod lat;
mod plan;
mod report;
mod roles;
mod setup;
mod wire;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use corelink_verbs::Provider;

use self::guard::{Guard, STALL};
use self::plan::Plan;
use self::report::report;
pub use self::report::{header_block, VerbsInfo};
use self::roles::{Event, Started};
use self::setup::{Dev, DevCfg};
use super::opts::{PerfError, PerfOpts, Prov, Role, Test, Transport, DEFAULT_PORT};
use super::Report;

/// Checks what the verbs runner cannot do or what makes no sense for it; returns notes.
pub fn check(o: &PerfOpts) -> Result<Vec<String>, PerfError> {
    let mut notes = Vec::new();
    if o.workers > 1 {
        return Err(PerfError::Unsupported(format!(
            "-T {}: -c UC/UD and --use-srq run on verbs with one client thread; -T applies to \
             the engine's RC runs",
            o.workers
        )));
    }
    if o.qps == 0 || o.post_list == 0 || o.cq_mod == 0 {
        return Err(PerfError::Usage("-q, -l and -Q: at least 1".into()));
    }
    if o.qps as usize > wire::MAX_QPS {
        return Err(PerfError::Usage(format!("-q {}: at most {}", o.qps, wire::MAX_QPS)));
    }
    if o.test.is_lat() && o.qps > 1 {
        return Err(PerfError::Unsupported(format!(
            "-q {}: latency tests keep one request in flight on one queue pair (as perftest's)",
            o.qps
        )));
    }
    if o.use_srq && !matches!(o.test, Test::SendBw | Test::SendLat) {
        notes.push(format!(
            "--use-srq: {} takes no receives; the SRQ is created and attached, unused",
            o.test.name()
        ));
    }
    if o.config.is_some() {
        notes.push("--config: only the core map's provider and device are used here".into());
    }
    Ok(notes)
}

/// Limits UD's sizes to the port MTU: an `-a` list loses the larger ones (with a note), a
/// single `-s` above it is refused; no size at all means one of the MTU.
fn ud_sizes(o: &PerfOpts, mtu: usize, notes: &mut Vec<String>) -> Result<Vec<usize>, PerfError> {
    let mut sizes = o.sizes.clone();
    if o.transport != Transport::Ud {
        if sizes.is_empty() {
            sizes = PerfOpts::new(o.test).sizes;
        }
        return Ok(sizes);
    }
    if sizes.is_empty() {
        notes.push(format!("UD: messages of the port MTU, {mtu} B (-s for another size)"));
        return Ok(vec![mtu]);
    }
    let too_big: Vec<usize> = sizes.iter().copied().filter(|&s| s > mtu).collect();
    if too_big.is_empty() {
        return Ok(sizes);
    }
    let why = format!("a UD message is at most the port MTU, {mtu} B");
    if sizes.len() == 1 {
        return Err(PerfError::Usage(format!("-s {}: {why}", too_big[0])));
    }
    sizes.retain(|&s| s <= mtu);
    notes.push(format!("sizes {too_big:?} skipped: {why}"));
    Ok(sizes)
}

fn env<T: std::str::FromStr>(name: &str) -> Result<Option<T>, PerfError> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => {
            v.parse().map(Some).map_err(|_| PerfError::Usage(format!("{name}={v:?} is not valid")))
        }
        _ => Ok(None),
    }
}

/// The provider and device: `--provider`/`-d`/`-i`/`-x`, else the core map's, else (ibverbs)
/// `CORELINK_IBV_DEVICE`, `CORELINK_IBV_PORT`, `CORELINK_IBV_GID_INDEX`, else the first device,
/// port 1 and its first IPv4-mapped GID.
fn device(o: &PerfOpts) -> Result<(Prov, DevCfg), PerfError> {
    let map = match &o.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| PerfError::Usage(format!("{}: {e}", path.display())))?;
            let m = corelink_config::parse(&text)
                .map_err(|e| PerfError::Usage(format!("{}: {e}", path.display())))?;
            Some(m)
        }
        None => None,
    };
    let prov = match (o.provider, &map) {
        (Some(p), _) => p,
        (None, Some(m)) if m.provider == corelink_config::ProviderKind::Ibverbs => Prov::Ibverbs,
        _ => Prov::Soft,
    };
    if prov == Prov::Soft {
        let name = corelink_verbs::soft::DEVICE_NAME.to_string();
        return Ok((prov, DevCfg { name, port: 1, gid_index: Some(0) }));
    }
    let name = match (&o.device, map.as_ref().and_then(|m| m.device.clone())) {
        (Some(d), _) => d.clone(),
        (None, Some(d)) => d,
        (None, None) => match env::<String>("CORELINK_IBV_DEVICE")? {
            Some(d) => d,
            None => first_device()?,
        },
    };
    let port = match (o.port, &map) {
        (Some(p), _) => p,
        (None, Some(m)) => m.port,
        (None, None) => env("CORELINK_IBV_PORT")?.unwrap_or(1),
    };
    let gid_index = match (o.gid_index, &map) {
        (Some(x), _) => Some(x),
        (None, Some(m)) => Some(m.gid_index),
        (None, None) => env("CORELINK_IBV_GID_INDEX")?,
    };
    Ok((prov, DevCfg { name, port, gid_index }))
}

#[cfg(feature = "ibverbs")]
fn first_device() -> Result<String, PerfError> {
    use corelink_verbs::ibverbs::Ibverbs;
    let devs = Ibverbs::devices().map_err(|e| PerfError::Run(format!("listing devices: {e}")))?;
    devs.into_iter().next().map(|d| d.name).ok_or_else(|| {
        PerfError::Run("no RDMA device on this host (set -d or CORELINK_IBV_DEVICE)".into())
    })
}

#[cfg(not(feature = "ibverbs"))]
fn first_device() -> Result<String, PerfError> {
    Err(PerfError::Usage("built without the ibverbs feature".into()))
}

/// The cores of the client's and the server's threads: the last two, when there are two.
fn cores() -> (Option<usize>, Option<usize>) {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    match ids.len() {
        0 | 1 => (None, None),
        n => (Some(ids[n - 1].id), Some(ids[n - 2].id)),
    }
}

/// Runs a test on verbs: `on_start` once the client (a server: the listening server) has
/// opened its device, `on_report` with each size's report as it is measured (a server has
/// none). Returns the reports.
pub fn run(
    o: &PerfOpts,
    on_start: &mut dyn FnMut(&VerbsInfo),
    on_report: &mut dyn FnMut(&Report),
) -> Result<Vec<Report>, PerfError> {
    let notes = check(o)?;
    // The tick clock's calibration, here rather than on the client's thread.
    crate::perf::clock::Clock::new();
    let (prov, cfg) = device(o)?;
    if prov == Prov::Soft && matches!(o.role, Role::Client(_) | Role::Server) {
        super::join_soft_fabric();
    }
    match prov {
        Prov::Soft => run_on::<corelink_verbs::soft::Soft>(o, &cfg, notes, on_start, on_report),
        #[cfg(feature = "ibverbs")]
        Prov::Ibverbs => {
            run_on::<corelink_verbs::ibverbs::Ibverbs>(o, &cfg, notes, on_start, on_report)
        }
        #[cfg(not(feature = "ibverbs"))]
        Prov::Ibverbs => Err(PerfError::Usage("built without the ibverbs feature".into())),
    }
}

fn run_on<P: Provider>(
    o: &PerfOpts,
    cfg: &DevCfg,
    mut notes: Vec<String>,
    on_start: &mut dyn FnMut(&VerbsInfo),
    on_report: &mut dyn FnMut(&Report),
) -> Result<Vec<Report>, PerfError> {
    let mtu = Dev::<P>::open(cfg).map_err(PerfError::Run)?.mtu.bytes() as usize;
    let plan = Arc::new(Plan {
        test: o.test,
        transport: o.transport,
        qps: o.qps as usize,
        use_srq: o.use_srq,
        sizes: ud_sizes(o, mtu, &mut notes)?,
        iters: o.iters,
        duration: o.duration,
        tx_depth: o.tx_depth,
        // Latency tests signal each request and post one at a time (-l and -Q do not apply).
        post_list: if o.test.is_lat() { 1 } else { o.post_list as usize },
        cq_mod: if o.test.is_lat() { 1 } else { o.cq_mod as usize },
        inline: o.inline.unwrap_or(0),
    });
    let (client_core, server_core) = cores();
    let stop = Arc::new(AtomicBool::new(false));
    let guard = |stall| Guard {
        deadline: o.timeout.map(|t| Instant::now() + t),
        stop: stop.clone(),
        stall,
        unreliable: o.transport != Transport::Rc,
    };
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    let listen = match o.role {
        Role::Loopback => Some(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0)),
        Role::Server => {
            Some(o.bind.unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), DEFAULT_PORT)))
        }
        Role::Client(_) => None,
    };
    let mut target = match o.role {
        Role::Client(a) => Some(a),
        _ => None,
    };
    if let Some(at) = listen {
        let l =
            TcpListener::bind(at).map_err(|e| PerfError::Run(format!("listening on {at}: {e}")))?;
        let local = l.local_addr().map_err(|e| PerfError::Run(e.to_string()))?;
        target = Some(local);
        let (p, c, tx, g) = (plan.clone(), cfg.clone(), tx.clone(), guard(None));
        let announce = o.role == Role::Server;
        threads.push(std::thread::spawn(move || {
            roles::pin(server_core);
            let r = roles::server::<P>(l, &p, &c, &tx, announce, &g);
            let _ = tx.send(Event::ServerDone(r));
        }));
    }
    if o.role != Role::Server {
        let addr = target.ok_or_else(|| PerfError::Run("no server address".into()))?;
        let (p, c, tx, g) = (plan.clone(), cfg.clone(), tx.clone(), guard(Some(STALL)));
        threads.push(std::thread::spawn(move || {
            roles::pin(client_core);
            let r = roles::client::<P>(addr, &p, &c, &tx, &g);
            let _ = tx.send(Event::ClientDone(r));
        }));
    }
    drop(tx);
    let cores = match o.role {
        Role::Loopback => (client_core, server_core),
        Role::Server => (None, server_core),
        Role::Client(_) => (client_core, None),
    };
    let info = |s: Started| VerbsInfo {
        provider: P::NAME,
        device: s.device,
        port: s.port,
        gid_index: s.gid_index,
        gid: s.gid.to_string(),
        mtu: s.mtu,
        sizes: plan.sizes.clone(),
        cores,
        addr: target,
        notes: notes.clone(),
    };
    let mut left = threads.len();
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    let deadline = o.timeout.map(|t| Instant::now() + t);
    let mut started = false;
    while left > 0 {
        let ev = match deadline {
            Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                Ok(ev) => ev,
                Err(_) => {
                    let t = o.timeout.unwrap_or_default().as_secs();
                    errors.push(format!("timed out after {t} s"));
                    stop.store(true, Ordering::Relaxed);
                    return Err(PerfError::Run(errors.join("; ")));
                }
            },
            None => match rx.recv() {
                Ok(ev) => ev,
                Err(_) => break,
            },
        };
        match ev {
            Event::Started(s) if !started => {
                started = true;
                on_start(&info(s));
            }
            Event::Started(_) => {}
            Event::Size { index, bytes, m, received } => {
                let rep = report(o, P::NAME, bytes, m);
                if o.test == Test::SendBw && received < rep.iterations {
                    let (sent, lost) = (rep.iterations, rep.iterations - received);
                    let pct = 100.0 * lost as f64 / sent as f64;
                    eprintln!(
                        "corelink-perf: send_bw {bytes} B: {lost} of {sent} messages lost \
                         ({pct:.1} %; the receiver got {received}): {}",
                        match o.transport {
                            Transport::Rc => "RC retransmits, so this is unexpected",
                            _ =>
                                "UC and UD do not retransmit: a message dropped on the wire, \
                                  or arriving when no receive was posted, is gone",
                        }
                    );
                }
                if o.progress {
                    eprintln!(
                        "corelink-perf: {} {bytes} B done: {} iterations ({}/{} sizes)",
                        o.test.name(),
                        rep.iterations,
                        index + 1,
                        plan.sizes.len()
                    );
                }
                on_report(&rep);
                reports.push(rep);
            }
            Event::ClientDone(r) | Event::ServerDone(r) => {
                left -= 1;
                if let Err(e) = r {
                    errors.push(e);
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }
    }
    for t in threads {
        if t.join().is_err() {
            errors.push("a side's thread panicked".into());
        }
    }
    match errors.is_empty() {
        true => Ok(reports),
        false => Err(PerfError::Run(errors.join("; "))),
    }
}
