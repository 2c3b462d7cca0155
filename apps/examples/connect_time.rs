//! How long connection set-up takes: the engine's connect (a `Client` on another thread, so the
//! time is what an application waits) against the verbs-level `Context::connect`, both to the
//! same engine server, each connection closed before the next.
//!
//! ```text
//! connect_time [both] [--count N] [--parallel P]                      # soft, one process
//! connect_time server ADDR --config MAP.toml                          # accept_foreign is set
//! connect_time client ADDR --config MAP.toml [--count N] [--parallel P]
//! ```
//!
//! The client alternates one verbs connect (`Context::connect` on a fresh QP) and one engine
//! connect (`Client::connect` until `Event::Connected`), `--count` of each, so that both see
//! the same machine; then, `--count` times (at most 5), alternating, `verbs xP` (P verbs-level
//! connects at once from one thread, `Context::connect_start` polled in turn: what the engine's
//! parallel connects stand on) and `engine xP` (P engine connects at once), each until the
//! last is up. It prints a line per kind and the median of the warm pairs' engine / verbs
//! ratios. Each line gives the first (cold) time and the median of the rest (warm) in
//! milliseconds. The server accepts plain rdma_cm peers (`accept_foreign = true`) so that the
//! verbs connects land on the same listener.
//! The client's measuring thread runs on its core map's control core (`client` only).
//! Exit status: 0 when every connect succeeded, 1 otherwise, 2 on bad usage.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use corelink_config::{parse, CoreMap, CoreSpec, MachineTopology, ProviderKind, Validated};
use corelink_engine::{ConnId, Engine, Event, Handler, Placement};
use corelink_verbs::{chain, Connection, Context, Pd, Provider, QpAttr, QpCap, QpInitAttr, QpType};

#[derive(Parser, Debug)]
#[command(name = "connect_time", about = "Connection set-up time: engine vs verbs")]
struct Cli {
    /// server, client or both (default: both, on soft)
    role: Option<String>,
    /// server: where to listen; client: where to connect (IP:PORT)
    addr: Option<SocketAddr>,
    /// core map (TOML): its provider, device and worker settings
    #[arg(long)]
    config: Option<PathBuf>,
    /// connections of each kind, one after the other
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(2..=10_000))]
    count: u32,
    /// connects at once, for the parallel measurement (0: none)
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1000))]
    parallel: u32,
}

/// A handler that only accepts.
struct Accept;
impl<P: Provider> Handler<P> for Accept {}

fn core_map(cli: &Cli, listen: Option<SocketAddr>, conns: u32) -> Result<Validated, String> {
    let mut map = match &cli.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            parse(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => CoreMap { control_core: 0, workers: vec![CoreSpec::One(1)], ..CoreMap::default() },
    };
    map.listen = listen.map(|a| a.to_string());
    map.accept_foreign = true;
    // Room for every connection of a run (both ends, on one worker in `both`; a closed one's
    // slot comes back only once its peer's close is seen).
    let want = (2 * conns + 2 * cli.count).max(map.worker.max_conns);
    map.worker.max_conns = want;
    map.worker.qps.max = map.worker.qps.max.max(want);
    // QPs ready for a burst of `conns` connects at once (both ends): a service expecting such
    // bursts sizes its pool so, and then no connect waits for a QP to be created.
    map.worker.qps.pool = map.worker.qps.pool.max(conns + 2).min(map.worker.qps.max);
    map.worker.recvs_per_conn = map.worker.recvs_per_conn.min(8);
    // Every connection's completions must fit the CQ (receives and its send queue).
    map.worker.send_queue_depth = map.worker.send_queue_depth.min(32);
    let per_conn = map.worker.recvs_per_conn + map.worker.send_queue_depth;
    map.worker.cq_depth = map.worker.cq_depth.max((want * per_conn).next_power_of_two());
    let topo = MachineTopology::load().map_err(|e| e.to_string())?;
    map.validate(&topo).map_err(|e| e.to_string())
}

/// "first (cold) / median of the rest (warm)" in milliseconds.
fn summary(name: &str, mut t: Vec<Duration>) -> String {
    let cold = t.remove(0);
    t.sort();
    let warm = t[t.len() / 2];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "{name:<12} cold {:8.3} ms   warm (median of {}) {:8.3} ms",
        ms(cold),
        t.len(),
        ms(warm)
    )
}

/// Verbs-level connects: a context, PD and CQ of their own, a fresh QP per connect.
struct Verbs<P: Provider> {
    ctx: P::Context,
    pd: P::Pd,
    cq: P::Cq,
}

impl<P: Provider> Verbs<P> {
    fn open(device: &str) -> Result<Self, String> {
        let ctx = P::open(device).map_err(|e| chain(&e).to_string())?;
        let pd = ctx.alloc_pd().map_err(|e| chain(&e).to_string())?;
        let cq = ctx.create_cq(64).map_err(|e| chain(&e).to_string())?;
        Ok(Verbs { ctx, pd, cq })
    }

    /// A fresh RC QP on the PD and CQ.
    fn qp(&self) -> Result<P::Qp, String> {
        let attr = QpInitAttr::<P> {
            qp_type: QpType::Rc,
            send_cq: &self.cq,
            recv_cq: &self.cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: true,
        };
        self.pd.create_qp(&attr).map_err(|e| chain(&e).to_string())
    }

    /// One connect to `addr` on a fresh QP (created before the clock starts), disconnected
    /// after it.
    fn connect(&self, addr: SocketAddr) -> Result<Duration, String> {
        let mut qp = self.qp()?;
        let t0 = Instant::now();
        let mut c = self
            .ctx
            .connect(addr, &mut qp, &QpAttr::default(), b"", Duration::from_secs(10))
            .map_err(|e| format!("verbs connect: {}", chain(&e)))?;
        let t = t0.elapsed();
        let _ = c.disconnect();
        Ok(t)
    }

    /// `n` connects at once from this thread (`Context::connect_start`, each polled in turn),
    /// on fresh QPs created before the clock starts: the time until the last is up.
    fn parallel(&self, addr: SocketAddr, n: u32) -> Result<Duration, String> {
        use corelink_verbs::{Connecting as _, Progress};
        let mut qps = Vec::new();
        for _ in 0..n {
            qps.push(self.qp()?);
        }
        let t0 = Instant::now();
        let timeout = Duration::from_secs(30);
        let mut pending = Vec::new();
        for (i, qp) in qps.iter_mut().enumerate() {
            let c = self.ctx.connect_start(addr, qp, &QpAttr::default(), b"", timeout);
            pending.push((i, c.map_err(|e| format!("verbs connect: {}", chain(&e)))?));
        }
        let mut up = Vec::new();
        while !pending.is_empty() {
            let mut next = Vec::new();
            for (i, c) in pending {
                match c.poll(&mut qps[i], Duration::ZERO) {
                    Ok(Progress::Ready(conn)) => up.push(conn),
                    Ok(Progress::Pending(c)) => next.push((i, c)),
                    Err(e) => return Err(format!("verbs connect: {}", chain(&e))),
                }
            }
            pending = next;
            if !pending.is_empty() {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        let t = t0.elapsed();
        for c in &mut up {
            let _ = c.disconnect();
        }
        Ok(t)
    }
}

/// Waits for the event `pick` accepts (others are skipped), up to 30 s.
fn wait(c: &mut corelink_engine::Client, pick: impl Fn(&Event) -> bool) -> Result<Event, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match c.wait(deadline.saturating_duration_since(Instant::now())) {
            Some(Event::ConnectFailed { error, .. }) => {
                return Err(format!("engine connect: {}", chain(&error)))
            }
            Some(e) if pick(&e) => return Ok(e),
            Some(_) => {}
            None => return Err("no event within 30 s".into()),
        }
    }
}

fn connected(e: &Event) -> Option<ConnId> {
    match e {
        Event::Connected { conn, .. } => Some(*conn),
        _ => None,
    }
}

/// Engine connects through a `Client` on this thread.
struct Engines<P: Provider> {
    e: Engine<P>,
    c: corelink_engine::Client,
    token: u64,
}

impl<P: Provider> Engines<P> {
    fn start(map: &Validated) -> Result<Self, String> {
        let mut e = Engine::<P>::start(map, Placement::RoundRobin, |_| Accept)
            .map_err(|e| chain(&e).to_string())?;
        let c = e.client(0).map_err(|e| chain(&e).to_string())?;
        Ok(Engines { e, c, token: 0 })
    }

    /// One connect to `addr` until `Event::Connected`, closed after it.
    fn connect(&mut self, addr: SocketAddr) -> Result<Duration, String> {
        self.token += 1;
        let t0 = Instant::now();
        self.c.connect(addr, b"", self.token).map_err(|e| chain(&e).to_string())?;
        let ev = wait(&mut self.c, |e| connected(e).is_some())?;
        let conn = connected(&ev).ok_or_else(|| format!("not a connection: {ev:?}"))?;
        let t = t0.elapsed();
        self.c.close(conn).map_err(|e| chain(&e).to_string())?;
        wait(&mut self.c, |e| matches!(e, Event::Closed { conn: x, .. } if *x == conn))?;
        Ok(t)
    }

    /// `n` connects at once: the time until the last is up (all closed after).
    fn parallel(&mut self, addr: SocketAddr, n: u32) -> Result<Duration, String> {
        let t0 = Instant::now();
        for _ in 0..n {
            self.token += 1;
            self.c.connect(addr, b"", self.token).map_err(|e| chain(&e).to_string())?;
        }
        let mut conns = Vec::new();
        while conns.len() < n as usize {
            conns.extend(connected(&wait(&mut self.c, |e| connected(e).is_some())?));
        }
        let t = t0.elapsed();
        for &conn in &conns {
            self.c.close(conn).map_err(|e| chain(&e).to_string())?;
        }
        for _ in &conns {
            wait(&mut self.c, |e| matches!(e, Event::Closed { .. }))?;
        }
        Ok(t)
    }

    fn shutdown(self) -> Result<(), String> {
        drop(self.c);
        self.e.shutdown().map(|_| ()).map_err(|e| chain(&e).to_string())
    }
}

/// The median of `x` (sorted here).
fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(f64::total_cmp);
    x.get(x.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `count` verbs connects and `count` engine connects, alternating (one of each in turn, so
/// that both see the same machine), then `parallel` engine connects at once, `count.min(5)`
/// times. Returns the lines to print.
fn measure<P: Provider>(
    device: &str,
    map: &Validated,
    addr: SocketAddr,
    count: u32,
    parallel: u32,
) -> Result<Vec<String>, String> {
    let verbs = Verbs::<P>::open(device)?;
    let mut engine = Engines::<P>::start(map)?;
    let (mut v, mut e) = (Vec::new(), Vec::new());
    for _ in 0..count {
        v.push(verbs.connect(addr)?);
        e.push(engine.connect(addr)?);
    }
    // Warm pairs only: engine / verbs of each pair, and the median of those ratios.
    let ratios = v.iter().zip(&e).skip(1).map(|(v, e)| e.as_secs_f64() / v.as_secs_f64());
    let ratio = median(ratios.collect());
    let mut lines = vec![summary("verbs", v), summary("engine", e)];
    lines.push(format!("engine / verbs, warm: median of the pairs' ratios {ratio:.2}"));
    if parallel > 0 {
        let (mut vr, mut er) = (Vec::new(), Vec::new());
        for _ in 0..count.min(5) {
            vr.push(verbs.parallel(addr, parallel)?);
            er.push(engine.parallel(addr, parallel)?);
        }
        lines.push(summary(&format!("verbs x{parallel}"), vr));
        lines.push(summary(&format!("engine x{parallel}"), er));
    }
    engine.shutdown()?;
    Ok(lines)
}

fn run<P: Provider>(cli: &Cli) -> Result<(), String> {
    let role = cli.role.as_deref().unwrap_or("both");
    let conns = cli.parallel.max(1);
    match role {
        "server" => {
            let addr = cli.addr.ok_or("server: ADDR is missing")?;
            let map = core_map(cli, Some(addr), conns)?;
            let e = Engine::<P>::start(&map, Placement::RoundRobin, |_| Accept)
                .map_err(|e| chain(&e).to_string())?;
            println!("connect_time server: listening on {}", e.listen_addr().unwrap_or(addr));
            // Serves until killed (the guest script stops it).
            loop {
                std::thread::park();
            }
        }
        "client" | "both" => {
            let (server, addr) = if role == "both" {
                let map =
                    core_map(cli, Some("10.97.0.1:0".parse().map_err(|_| "address")?), conns)?;
                let e = Engine::<P>::start(&map, Placement::RoundRobin, |_| Accept)
                    .map_err(|e| chain(&e).to_string())?;
                let a = e.listen_addr().ok_or("no listen address")?;
                (Some(e), a)
            } else {
                (None, cli.addr.ok_or("client: ADDR is missing")?)
            };
            let map = core_map(cli, None, conns)?;
            // The measuring thread (an application thread) on the control core's CPU, off the
            // worker's: a thread woken onto the CPU of a worker that is still polling waits
            // for that worker to park (on the guest's two vCPUs, a few hundred microseconds).
            // (not in `both`, where both engines' control cores share that CPU)
            let control = map.map.control_core;
            let pin = || core_affinity::set_for_current(core_affinity::CoreId { id: control });
            if role == "client" && !pin() {
                eprintln!("connect_time: could not pin to core {}", map.map.control_core);
            }
            let device = match &map.device {
                Some(d) => d.clone(),
                None => P::devices()
                    .map_err(|e| chain(&e).to_string())?
                    .first()
                    .map(|d| d.name.clone())
                    .ok_or("no device")?,
            };
            for l in measure::<P>(&device, &map, addr, cli.count, cli.parallel)? {
                println!("{l}");
            }
            if let Some(e) = server {
                e.shutdown().map_err(|e| chain(&e).to_string())?;
            }
            Ok(())
        }
        r => Err(format!("unknown role {r:?}: server, client or both")),
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let provider = match &cli.config {
        Some(path) => match std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| parse(&t).map_err(|e| e.to_string()))
        {
            Ok(m) => m.provider,
            Err(e) => {
                eprintln!("connect_time: {}: {e}", path.display());
                return std::process::ExitCode::from(2);
            }
        },
        None => ProviderKind::Soft,
    };
    let r = match provider {
        ProviderKind::Soft => run::<corelink_verbs::soft::Soft>(&cli),
        #[cfg(feature = "ibverbs")]
        ProviderKind::Ibverbs => run::<corelink_verbs::ibverbs::Ibverbs>(&cli),
        #[cfg(not(feature = "ibverbs"))]
        ProviderKind::Ibverbs => Err("built without the ibverbs feature".into()),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("connect_time: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
