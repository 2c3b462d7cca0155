//! The core map a run uses: the `--config` file's or one made for the run, with the options'
//! overrides (device, port, GID, inline, batching, scheduler, lanes) and pools sized for it.

use std::net::SocketAddr;

use corelink_config::{parse, CoreMap, CoreSpec, MachineTopology, PoolClass, ProviderKind};
use corelink_config::{Topology, Validated};

use crate::perf::opts::{PerfError, PerfOpts, Prov, Role, Verb, DEFAULT_PORT};

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
pub fn pools(o: &PerfOpts) -> Vec<PoolClass> {
    let w = o.workers;
    let mut classes: Vec<PoolClass> = vec![PoolClass { size: 256, count: 4096 }];
    let class_of = |s: usize| s.next_power_of_two().max(256);
    let big = class_of(o.max_size()).max(4096);
    for &s in &o.sizes {
        let mut c = class_of(s);
        if o.test.verb() == Verb::Send && c >= 4096 {
            c = big; // sends over 2 KiB use receive-sized buffers
        }
        let count = o.window(s) * w + 16;
        match classes.iter_mut().find(|k| k.size == c) {
            Some(k) => k.count = k.count.max(count),
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
        Verb::Send => o.max_size().next_power_of_two().max(4096) as u32,
        _ => 4096,
    }
}

pub(super) fn core_map(o: &PerfOpts, listen: Option<SocketAddr>) -> Result<Validated, PerfError> {
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
    if let Some(d) = &o.device {
        map.device = Some(d.clone());
    }
    if let Some(p) = o.port {
        map.port = p;
    }
    if let Some(x) = o.gid_index {
        map.gid_index = x;
    }
    if let Some(i) = o.inline {
        map.worker.max_inline = i;
    }
    let conns = if o.role == Role::Loopback { 2 } else { 1 };
    map.worker.pools = pools(o);
    map.worker.recv_size = recv_size(o);
    // Each worker holds its pair's ends (the receives are registered for this many).
    map.worker.max_conns = conns as u32;
    let s = &o.sched;
    let depth = o.sizes.iter().map(|&s| o.window(s)).max().unwrap_or(1) as u32;
    let depth = depth + s.bg_writes as u32;
    map.worker.send_queue_depth = map.worker.send_queue_depth.max(depth + 16);
    let w = &mut map.worker;
    w.batching.post_list = o.post_list;
    w.batching.signal_every = o.cq_mod.min(w.send_queue_depth);
    w.qps.per_conn = o.qps;
    w.scheduler.priorities = !s.no_priority;
    w.scheduler.merge_reads = s.hot_records > 0 && !s.no_merge;
    if let Some(n) = s.max_outstanding {
        w.scheduler.max_outstanding = n.min(w.send_queue_depth);
    }
    let cqes = map.worker.cqes_per_conn(o.qps) * conns as u64;
    map.worker.cq_depth = map.worker.cq_depth.max(4 * (depth + 64) * conns as u32).max(cqes as u32);
    map.listen = listen.map(|a| a.to_string());
    let topo = MachineTopology::load().map_err(|e| PerfError::Run(e.to_string()))?;
    let cores = topo.cores().len();
    if o.config.is_none() && o.workers + 1 > cores {
        return Err(PerfError::Usage(format!(
            "-T {}: needs {} worker cores besides the control core (core 0); this machine has \
             {cores} core(s), so -T {} at most (or give a --config core map)",
            o.workers,
            o.workers,
            cores.saturating_sub(1).max(1)
        )));
    }
    let mut v = map.validate(&topo).map_err(|e| PerfError::Usage(e.to_string()))?;
    if v.workers.len() < o.workers {
        return Err(PerfError::Usage(format!(
            "-T {}: the core map has {} worker(s)",
            o.workers,
            v.workers.len()
        )));
    }
    v.workers.truncate(o.workers);
    Ok(v)
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
