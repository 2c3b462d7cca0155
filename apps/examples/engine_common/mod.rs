//! What the engine examples (`echo`, `one_sided`) share: the command line, the core map, a
//! handler that routes between a server part and a client part (so that `both` runs the two in
//! one engine connected to itself), and the main thread's start / wait / shut down.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use corelink_apps::pair::Pair;
use corelink_config::{parse, CoreMap, CoreSpec, MachineTopology, ProviderKind, Validated};
use corelink_engine::{Cx, Engine, Handler, Placement};
use corelink_verbs::Provider;

/// Timer tokens from here on are the client part's; below, the server part's.
pub const CLIENT_TIMERS: u64 = 1 << 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Accept connections and serve them.
    Server,
    /// Connect to ADDR and run the exchange.
    Client,
    /// Both in one process: one engine (soft) listens and connects to itself.
    Both,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Prov {
    Soft,
    Ibverbs,
}

pub fn role_name(r: Role) -> &'static str {
    match r {
        Role::Server => "server",
        Role::Client => "client",
        Role::Both => "both",
    }
}

/// Flags every engine example takes.
#[derive(Args, Debug)]
pub struct Common {
    /// server, client or both (default: both)
    pub role: Option<Role>,
    /// server: where to listen; client: where to connect (IP:PORT)
    pub addr: Option<SocketAddr>,
    /// provider, when no --config gives one (default soft)
    #[arg(long)]
    pub provider: Option<Prov>,
    /// core map (TOML); its `listen` is replaced by ADDR for a server
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// round trips / operations of each kind
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000_000))]
    pub count: u32,
    /// requests the client keeps in flight
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub window: u32,
    /// server: exit after this many client connections have closed
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub clients: u32,
    /// give up after this many seconds
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout: u64,
}

/// What a part of a handler tells the main thread when it is done: a report, or what went wrong.
pub type Outcome = Result<String, String>;

/// A handler part's line to the main thread, and where a client is to connect.
#[derive(Clone, Debug)]
pub struct Link {
    pub target: Arc<OnceLock<SocketAddr>>,
    tx: Sender<Outcome>,
}

/// A link that reports nowhere (until the engine's is put in its place).
impl Default for Link {
    fn default() -> Self {
        Link { target: Arc::default(), tx: mpsc::channel().0 }
    }
}

impl Link {
    pub fn report(&self, outcome: Outcome) {
        let _ = self.tx.send(outcome);
    }

    /// A client part's connect failed: reports it with its causes.
    pub fn connect_failed(&self, error: &corelink_engine::EngineError) {
        self.report(Err(format!("connect failed: {}", corelink_engine::verbs::chain(error))));
    }

    /// A client part's connect, from its `poll`: once, as soon as the main thread said where.
    pub fn connect_once<P: Provider>(&self, asked: &mut bool, cx: &mut Cx<P>, hello: &[u8]) {
        if let (false, Some(&addr)) = (*asked, self.target.get()) {
            *asked = true;
            if let Err(e) = cx.connect(addr, hello, 1) {
                self.report(Err(format!("connect to {addr}: {e}")));
            }
        }
    }
}

/// How a run fails: bad usage (exit 2) or something at run time (exit 1).
#[derive(Debug)]
pub enum Fail {
    Usage(String),
    Run(String),
}

fn env<T: std::str::FromStr>(name: &str) -> Result<Option<T>, Fail> {
    match std::env::var(name) {
        Ok(v) => v.parse().map(Some).map_err(|_| Fail::Usage(format!("{name}={v:?} is not valid"))),
        Err(_) => Ok(None),
    }
}

/// The core map: `--config`, or control on core 0 and one worker on core 1 (parking when idle),
/// with `ibverbs`'s device, port and GID index from `CORELINK_IBV_*` when set.
pub fn core_map(a: &Common, listen: Option<SocketAddr>) -> Result<Validated, Fail> {
    let mut map = match &a.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Fail::Usage(format!("{}: {e}", path.display())))?;
            parse(&text).map_err(|e| Fail::Usage(format!("{}: {e}", path.display())))?
        }
        None => {
            let mut m =
                CoreMap { control_core: 0, workers: vec![CoreSpec::One(1)], ..CoreMap::default() };
            m.worker.idle_after_us = 100;
            if a.provider == Some(Prov::Ibverbs) {
                m.provider = ProviderKind::Ibverbs;
                m.device = env("CORELINK_IBV_DEVICE")?;
                m.gid_index = env("CORELINK_IBV_GID_INDEX")?.unwrap_or(0);
                m.port = env("CORELINK_IBV_PORT")?.unwrap_or(1);
            }
            m
        }
    };
    let want = a.provider.map(|p| match p {
        Prov::Soft => ProviderKind::Soft,
        Prov::Ibverbs => ProviderKind::Ibverbs,
    });
    if let Some(p) = want.filter(|&p| p != map.provider) {
        let map_says = format!("{:?}", map.provider).to_lowercase();
        let p = format!("{p:?}").to_lowercase();
        return Err(Fail::Usage(format!("--provider {p}, but the core map says {map_says}")));
    }
    map.listen = listen.map(|a| a.to_string());
    let topo = MachineTopology::load().map_err(|e| Fail::Run(e.to_string()))?;
    let v = map.validate(&topo).map_err(|e| Fail::Usage(e.to_string()))?;
    for w in &v.warnings {
        eprintln!("warning: {w}");
    }
    Ok(v)
}

/// An example's main, after clap: checks the role and address, builds the core map, runs on
/// the map's provider, and turns the result into the exit status (2: bad usage, 1: failure).
pub fn main<S, C, MS, MC>(name: &str, a: &Common, ms: MS, mc: MC) -> std::process::ExitCode
where
    S: Runs,
    C: Runs,
    MS: Fn(Link) -> S + Send + Sync + 'static,
    MC: Fn(Link) -> C + Send + Sync + 'static,
{
    let role = a.role.unwrap_or(Role::Both);
    let res = (|| {
        let listen = match (role, a.addr) {
            (Role::Client, None) | (Role::Server, None) => {
                return Err(Fail::Usage(format!(
                    "{name} {}: ADDR (IP:PORT) is needed",
                    role_name(role)
                )))
            }
            (Role::Client, Some(_)) => None,
            (_, addr) => Some(addr.unwrap_or(SocketAddr::from(([10, 99, 0, 7], 7471)))),
        };
        let cfg = core_map(a, listen)?;
        match cfg.map.provider {
            ProviderKind::Soft => run::<corelink_verbs::soft::Soft, _, _>(name, a, &cfg, ms, mc),
            #[cfg(feature = "ibverbs")]
            ProviderKind::Ibverbs => {
                run::<corelink_verbs::ibverbs::Ibverbs, _, _>(name, a, &cfg, ms, mc)
            }
            #[cfg(not(feature = "ibverbs"))]
            ProviderKind::Ibverbs => Err(Fail::Usage("built without the ibverbs feature".into())),
        }
    })();
    exit_code(name, role, res)
}

/// A run's exit status, its failure said on stderr: 0, 1 (it failed), 2 (bad usage).
pub fn exit_code(name: &str, role: Role, res: Result<(), Fail>) -> std::process::ExitCode {
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(Fail::Usage(e)) => {
            eprintln!("{name}: {e} (see --help)");
            std::process::ExitCode::from(2)
        }
        Err(Fail::Run(e)) => {
            eprintln!("{name} {}: FAILED: {e}", role_name(role));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Handlers that run on every provider this build has.
#[cfg(feature = "ibverbs")]
pub trait Runs:
    Handler<corelink_verbs::soft::Soft> + Handler<corelink_verbs::ibverbs::Ibverbs>
{
}
#[cfg(feature = "ibverbs")]
impl<T: Handler<corelink_verbs::soft::Soft> + Handler<corelink_verbs::ibverbs::Ibverbs>> Runs
    for T
{
}
/// Handlers that run on every provider this build has.
#[cfg(not(feature = "ibverbs"))]
pub trait Runs: Handler<corelink_verbs::soft::Soft> {}
#[cfg(not(feature = "ibverbs"))]
impl<T: Handler<corelink_verbs::soft::Soft>> Runs for T {}

/// Starts the engine, tells the client part where to connect, waits for every part's outcome,
/// shuts the engine down and prints the workers' metrics.
fn run<P, S, C>(
    name: &str,
    a: &Common,
    cfg: &Validated,
    ms: impl Fn(Link) -> S + Send + Sync + 'static,
    mc: impl Fn(Link) -> C + Send + Sync + 'static,
) -> Result<(), Fail>
where
    P: Provider,
    S: Handler<P>,
    C: Handler<P>,
{
    let role = a.role.unwrap_or(Role::Both);
    let (tx, rx) = mpsc::channel();
    let link = Link { target: Arc::new(OnceLock::new()), tx };
    let l = link.clone();
    let (serve, connect) = (role != Role::Client, role != Role::Server);
    let engine = Engine::<P>::start(cfg, Placement::RoundRobin, move |_| {
        Pair::new(serve.then(|| ms(l.clone())), connect.then(|| mc(l.clone())), CLIENT_TIMERS)
    })
    .map_err(|e| Fail::Run(format!("starting the engine: {e}")))?;
    let mut expected = 0;
    if let Some(addr) = engine.listen_addr() {
        println!("{name} server: listening on {addr} ({})", P::NAME);
        expected += if role == Role::Both { 1 } else { a.clients };
    }
    if connect {
        let to = a.addr.filter(|_| role == Role::Client).or(engine.listen_addr());
        let to = to.ok_or_else(|| Fail::Run("nowhere to connect".into()))?;
        println!("{name} client: connecting to {to} ({})", P::NAME);
        let _ = link.target.set(to);
        expected += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    let mut errors = Vec::new();
    for _ in 0..expected {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok(report)) => println!("{report}"),
            Ok(Err(e)) => errors.push(e),
            Err(_) => {
                errors.push(format!("timed out after {} s", a.timeout));
                break;
            }
        }
    }
    let metrics = engine.shutdown().map_err(|e| Fail::Run(format!("shutdown: {e}")))?;
    for m in metrics {
        println!("{m}");
    }
    match errors.is_empty() {
        true => Ok(()),
        false => Err(Fail::Run(errors.join("; "))),
    }
}

/// `min / avg / p99` of some latencies, in microseconds.
pub fn latency(samples: &mut [Duration]) -> String {
    if samples.is_empty() {
        return "no samples".into();
    }
    samples.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let avg = samples.iter().sum::<Duration>() / samples.len() as u32;
    let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
    format!("min {:.1} us, avg {:.1} us, p99 {:.1} us", us(samples[0]), us(avg), us(p99))
}
