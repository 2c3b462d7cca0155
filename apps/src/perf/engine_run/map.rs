//! The core map a run uses: the `--config` file's or one made for the run, with the options'
//! overrides (device, port, GID, inline, batching, scheduler, lanes) and pools sized for it. A
//! `--config` map keeps every value that suffices; each one the run changes is reported
//! ([`MapChange`], printed on stderr).

use std::net::SocketAddr;

use corelink_config::{parse, CoreMap, CoreSpec, MachineTopology, PoolClass, ProviderKind};
use corelink_config::{Topology, Validated};

use crate::perf::opts::{PerfError, PerfOpts, Prov, Role, Verb, DEFAULT_PORT};

/// Empty polls in a row after which a worker of corelink-perf's own core map yields its core,
/// where the run's threads (its workers, the control core and the main thread) outnumber the
/// machine's cores: set-up and tear-down, when the control core and the main thread work and
/// the workers wait for them, then cost the workers' spinning nothing (under valgrind, whose
/// threads take turns, a 20,000-write `write_bw`'s worker spun about 9 million instructions
/// there, what 13,000 of its timed writes cost). A run's steady state on soft's loopback polls
/// no empty CQ, so it never yields there.
pub const YIELD_AFTER_EMPTY_POLLS: u32 = 64;

fn env<T: std::str::FromStr>(name: &str) -> Result<Option<T>, PerfError> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => {
            v.parse().map(Some).map_err(|_| PerfError::Usage(format!("{name}={v:?} is not valid")))
        }
        _ => Ok(None),
    }
}

/// The registered pools a run needs: small buffers (atomics, small messages); one class per
/// power of two of the sizes, each holding a window of them. (The engine registers the
/// receives apart, [`recv_size`] each.)
///
/// The RPC tests' messages carry the RPC header ([`rpc_header`] bytes more), and each call
/// holds three buffers at most: its request, the server's response, and that response kept
/// until the slot's next request acknowledges it.
pub fn pools(o: &PerfOpts) -> Vec<PoolClass> {
    let w = o.workers;
    let mut classes: Vec<PoolClass> = vec![PoolClass { size: 256, count: 4096 }];
    let class_of = |s: usize| s.next_power_of_two().max(256);
    let header = rpc_header(o);
    let big = class_of(o.max_size() + header).max(4096);
    let per_call = if o.test.is_rpc() { 3 } else { 1 };
    for &s in &o.sizes {
        let mut c = class_of(s + header);
        if o.test.verb() == Verb::Send && c >= 4096 {
            c = big; // sends over 2 KiB use receive-sized buffers
        }
        let count = o.window(s) * w * per_call + 16;
        match classes.iter_mut().find(|k| k.size == c) {
            Some(k) => k.count = k.count.max(count),
            None => classes.push(PoolClass { size: c, count }),
        }
    }
    if o.test.is_rpc() {
        // Small messages of one pass go packed into one send of up to a receive's bytes
        // (`corelink_rpc::EndpointConfig::pack_max`): a window's worth, each way.
        let c = recv_size(o) as usize;
        let count = o.sizes.iter().map(|&s| o.window(s)).max().unwrap_or(1) * w * 2 + 16;
        match classes.iter_mut().find(|k| k.size == c) {
            Some(k) => k.count += count,
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
    classes
}

/// The receive size a run needs (`worker.recv_size`): for sends, the largest message's class.
pub fn recv_size(o: &PerfOpts) -> u32 {
    match o.test.verb() {
        Verb::Send => (o.max_size() + rpc_header(o)).next_power_of_two().max(4096) as u32,
        _ => 4096,
    }
}

/// Bytes a test's messages carry beyond its payload: the RPC header for the RPC tests.
pub fn rpc_header(o: &PerfOpts) -> usize {
    if o.test.is_rpc() {
        corelink_rpc::wire::HEADER
    } else {
        0
    }
}

/// One value of a `--config` core map that the run changed, and why; printed on stderr as a
/// note (`--config: worker.cq_depth 64 -> 1536 (needed for ...)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapChange {
    /// The key, as the core map spells it (`worker.cq_depth`; a pool class as
    /// `worker.pools[size=4096]`, its count as `worker.pools[size=4096].count`).
    pub key: String,
    /// The map's value (`absent` for a class the map lacks).
    pub from: String,
    /// The value the run uses (`removed` for a class it drops).
    pub to: String,
    /// Why: the flag that asks for it, or what the run needs.
    pub why: String,
}

impl std::fmt::Display for MapChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "--config: {} {} -> {} ({})", self.key, self.from, self.to, self.why)
    }
}

/// Records the changes made to a `--config` map (a map made for the run records none).
struct Fit {
    from_config: bool,
    changes: Vec<MapChange>,
}

impl Fit {
    /// Sets `slot` to `to`, noting the change when the map is the user's and the value differs.
    fn set<T: PartialEq + std::fmt::Display>(
        &mut self,
        key: &str,
        slot: &mut T,
        to: T,
        why: impl FnOnce() -> String,
    ) {
        if *slot != to {
            self.note(key, slot.to_string(), to.to_string(), why());
            *slot = to;
        }
    }

    /// Raises `slot` to `need` if it is below it.
    fn at_least(&mut self, key: &str, slot: &mut u32, need: u32, why: impl FnOnce() -> String) {
        if *slot < need {
            self.set(key, slot, need, why);
        }
    }

    fn note(&mut self, key: &str, from: String, to: String, why: String) {
        if self.from_config {
            self.changes.push(MapChange { key: key.into(), from, to, why });
        }
    }
}

/// Fits `map` to the run `o` (`conns`: connections per worker, 2 in loopback). A map made for
/// the run (`from_config` false) gets the run's values outright: pools sized by [`pools`], the
/// options' batching, lanes and scheduler switches. A `--config` map (`from_config` true) keeps
/// every value that suffices: only what the run needs more of (depths, pool classes and counts,
/// read merging for plain read tests) and what a flag given on the command line asks for (`-l`,
/// `-Q`, `-q`, `-I`, `-d`, `-i`, `-x`, `--no-priority`, `--max-outstanding`) changes, and each
/// change is returned, one per key. The listen address is the run's either way (noted when the
/// map named another one).
pub fn fit_map(
    map: &mut CoreMap,
    o: &PerfOpts,
    conns: usize,
    listen: Option<SocketAddr>,
    from_config: bool,
) -> Vec<MapChange> {
    let mut fit = Fit { from_config, changes: Vec::new() };
    let f = &mut fit;
    if let Some(d) = &o.device {
        let (from, to) = (map.device.clone().unwrap_or_else(|| "(first)".into()), d.clone());
        if map.device.as_ref() != Some(d) {
            f.note("device", from, to, "-d".into());
            map.device = Some(d.clone());
        }
    }
    if let Some(p) = o.port {
        f.set("port", &mut map.port, p, || "-i".into());
    }
    if let Some(x) = o.gid_index {
        f.set("gid_index", &mut map.gid_index, x, || "-x".into());
    }
    let w = &mut map.worker;
    if let Some(i) = o.inline {
        f.set("worker.max_inline", &mut w.max_inline, i, || format!("-I {i}"));
    }
    if from_config {
        fit_pools(&mut w.pools, o, f);
    } else {
        w.pools = pools(o);
    }
    // Sends arrive in receive buffers (registered apart from the pools); each worker holds its
    // pair's ends.
    let rs = recv_size(o);
    if o.test.verb() == Verb::Send || !from_config {
        f.at_least("worker.recv_size", &mut w.recv_size, rs, || {
            format!("{} of {} B arrive in receive buffers", o.test.name(), o.max_size())
        });
    }
    if from_config {
        f.at_least("worker.max_conns", &mut w.max_conns, conns as u32, || {
            format!("{conns} connection end(s) per worker")
        });
    } else {
        w.max_conns = conns as u32;
    }
    let s = &o.sched;
    let window = o.sizes.iter().map(|&s| o.window(s)).max().unwrap_or(1) as u32;
    let depth = window + s.bg_writes as u32;
    let in_flight = || match s.bg_writes {
        0 => format!("-t {}: {window} requests in flight", o.tx_depth),
        n => format!("-t {}: {window} requests in flight, {n} background writes", o.tx_depth),
    };
    f.at_least("worker.send_queue_depth", &mut w.send_queue_depth, depth + 16, || {
        format!("needed for {} + 16", in_flight())
    });
    if o.explicit.post_list || !from_config {
        let l = o.post_list;
        f.set("worker.batching.post_list", &mut w.batching.post_list, l, || format!("-l {l}"));
    }
    if o.explicit.cq_mod || !from_config {
        let q = o.cq_mod.min(w.send_queue_depth);
        let why = || match q == o.cq_mod {
            true => format!("-Q {q}"),
            false => format!("-Q {}, at most the send-queue depth", o.cq_mod),
        };
        f.set("worker.batching.signal_every", &mut w.batching.signal_every, q, why);
    }
    if o.explicit.qps || !from_config {
        let q = o.qps;
        f.set("worker.qps.per_conn", &mut w.qps.per_conn, q, || format!("-q {q}"));
        f.at_least("worker.qps.max", &mut w.qps.max, q, || format!("needed for -q {q}"));
    }
    if s.no_priority || !from_config {
        let on = !s.no_priority;
        f.set("worker.scheduler.priorities", &mut w.scheduler.priorities, on, || {
            "--no-priority".into()
        });
    }
    // Merging applies only with --hot-records: a plain read test keeps one work request per
    // read. Other tests issue no reads, so their map's setting stays.
    if o.test.verb() == Verb::Read || !from_config {
        let merge = s.hot_records > 0 && !s.no_merge;
        let why = || match (s.hot_records, s.no_merge) {
            (0, _) => format!("{} without --hot-records: one work request per read", o.test.name()),
            (_, true) => "--no-merge".into(),
            (n, false) => format!("--hot-records {n}: merging on"),
        };
        f.set("worker.scheduler.merge_reads", &mut w.scheduler.merge_reads, merge, why);
    }
    if let Some(n) = s.max_outstanding {
        let n = n.min(w.send_queue_depth);
        f.set("worker.scheduler.max_outstanding", &mut w.scheduler.max_outstanding, n, || {
            "--max-outstanding".into()
        });
    }
    let need = 4 * (depth + 64) * conns as u32;
    f.at_least("worker.cq_depth", &mut w.cq_depth, need, || {
        format!(
            "needed for {} over {conns} connection(s): 4 x ({depth} + 64) x {conns}",
            in_flight()
        )
    });
    // What the engine admits against it, once the send queue may have grown: every receive
    // and every request on the device of each connection's lanes.
    let per_conn = w.cqes_per_conn(w.qps.per_conn);
    let cqes = u32::try_from(per_conn * conns as u64).unwrap_or(u32::MAX);
    f.at_least("worker.cq_depth", &mut w.cq_depth, cqes, || {
        format!("{conns} connection(s) of {per_conn} completions each (receives + requests)")
    });
    let to = listen.map(|a| a.to_string());
    if map.listen.is_some() && map.listen != to {
        let from = map.listen.clone().unwrap_or_default();
        let why = "the run listens on --bind and -p (loopback: a free port on 127.0.0.1)";
        f.note("listen", from, to.clone().unwrap_or_else(|| "(none)".into()), why.into());
    }
    map.listen = to;
    fit.changes
}

/// A `--config` map's pools, fitted to the run: the class a message of each size is taken from
/// (the smallest class that holds it, as the engine's pool picks) must hold the size's window.
/// A size no class holds gets a class of its own. (Receives are registered apart:
/// `worker.recv_size`.)
fn fit_pools(classes: &mut Vec<PoolClass>, o: &PerfOpts, f: &mut Fit) {
    let w = o.workers;
    let class_of = |s: usize| s.next_power_of_two().max(256);
    let key = |size: usize| format!("worker.pools[size={size}]");
    let show = |c: &PoolClass| format!("{} x {} B", c.count, c.size);
    // Classes the map lacks, with why (noted once, with their final count).
    let mut added: Vec<(usize, String)> = Vec::new();
    // Each size's class, added where none holds it.
    // (class size, count, why, whether it adds to the class's other needs)
    let mut needs: Vec<(usize, usize, String, bool)> = Vec::new();
    let mut need = |classes: &mut Vec<PoolClass>, size: usize, count: usize, why, adds| {
        let at = match classes.iter().find(|c| c.size >= size) {
            Some(c) => c.size,
            None => {
                let c = PoolClass { size: class_of(size), count: 1 };
                added.push((c.size, format!("no class holds {size} B")));
                classes.push(c);
                c.size
            }
        };
        classes.sort_by_key(|c| c.size);
        needs.push((at, count, why, adds));
    };
    for &s in &o.sizes {
        let size = if o.test.verb() == Verb::Atomic { 8 } else { s };
        let why = format!("{} B: a window of {} x {w} worker(s) + 16", s, o.window(s));
        need(classes, size, o.window(s) * w + 16, why, false);
    }
    if o.sched.bg_writes > 0 {
        let (n, b) = (o.sched.bg_writes, o.sched.bg_size);
        need(classes, b, n * w + 16, format!("--bg-writes {n} of {b} B"), true);
    }
    // Sizes run one after another (the largest window of a class counts); background writes
    // come on top.
    let mut counts: Vec<(usize, usize, Vec<String>)> = Vec::new();
    for (size, count, why, adds) in needs {
        match counts.iter_mut().find(|k| k.0 == size) {
            Some(k) if adds => {
                k.1 += count;
                k.2.push(why);
            }
            Some(k) if count > k.1 => {
                k.1 = count;
                k.2 = vec![why];
            }
            Some(_) => {}
            None => counts.push((size, count, vec![why])),
        }
    }
    for (size, count, why) in counts {
        let Some(c) = classes.iter_mut().find(|c| c.size == size) else { continue };
        let why = format!("needed for {}", why.join(" + "));
        match added.iter().find(|a| a.0 == size) {
            Some((_, first)) => {
                c.count = count;
                f.note(&key(size), "absent".into(), show(c), format!("{first}; {why}"));
            }
            None if c.count < count => {
                let k = format!("{}.count", key(size));
                f.note(&k, c.count.to_string(), count.to_string(), why);
                c.count = count;
            }
            None => {}
        }
    }
}

/// The run's core map, validated, with the changes made to a `--config` map (see [`fit_map`]).
pub(super) fn core_map(
    o: &PerfOpts,
    listen: Option<SocketAddr>,
) -> Result<(Validated, Vec<MapChange>), PerfError> {
    let topo = MachineTopology::load().map_err(|e| PerfError::Run(e.to_string()))?;
    let cores = topo.cores().len();
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
            if o.workers + 2 > cores {
                m.worker.yield_after_empty_polls = YIELD_AFTER_EMPTY_POLLS;
            }
            if o.role == Role::Server && o.provider != Some(Prov::Ibverbs) && cores >= 2 {
                // A soft server's client is a process on the same host, its workers from core
                // 1 up: the server's workers take the highest cores (on two cores: the worker
                // on core 0, the control core on 1), so that no two busy-polling workers share
                // a core.
                let first = cores.saturating_sub(o.workers).max(1);
                m.workers = (first..first + o.workers).map(CoreSpec::One).collect();
                if cores == 2 && o.workers == 1 {
                    (m.control_core, m.workers) = (1, vec![CoreSpec::One(0)]);
                }
            }
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
    let conns = if o.role == Role::Loopback { 2 } else { 1 };
    let changes = fit_map(&mut map, o, conns, listen, o.config.is_some());
    if o.config.is_none() && o.workers + 1 > cores {
        return Err(PerfError::Usage(format!(
            "-T {}: needs {} worker cores besides the control core (core 0); this machine has \
             {cores} core(s), so -T {} at most (or give a --config core map)",
            o.workers,
            o.workers,
            cores.saturating_sub(1).max(1)
        )));
    }
    let mut v = map.validate(&topo).map_err(|e| {
        // A key the user never set may be one corelink-perf changed: say which it changed.
        let changed: Vec<&str> = changes.iter().map(|c| c.key.as_str()).collect();
        match changed.is_empty() {
            true => PerfError::Usage(e.to_string()),
            false => PerfError::Usage(format!(
                "{e} (corelink-perf changed these --config keys for the run: {})",
                changed.join(", ")
            )),
        }
    })?;
    if v.workers.len() < o.workers {
        return Err(PerfError::Usage(format!(
            "-T {}: the core map has {} worker(s)",
            o.workers,
            v.workers.len()
        )));
    }
    v.workers.truncate(o.workers);
    Ok((v, changes))
}

/// The address to listen on: `bind`, else `CORELINK_IP` (ibverbs) or 127.0.0.1, with `-p`'s port
/// (0 in loopback: any free port).
pub(super) fn listen_addr(
    o: &PerfOpts,
    provider: ProviderKind,
) -> Result<Option<SocketAddr>, PerfError> {
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
