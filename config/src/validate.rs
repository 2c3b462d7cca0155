//! Validation of a core map against a topology: cores that exist, used once, the control core
//! apart from the workers, NUMA placement, and resources in range.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

use crate::model::{CoreMap, CoreSpec, NumaPolicy, ProviderKind};
use crate::topology::Topology;
use crate::ConfigError;

/// Queue depths a map may ask for (device limits are checked when the QPs are made).
const MAX_DEPTH: u32 = 1 << 16;
/// Inline bytes a map may ask for.
const MAX_INLINE: u32 = 1024;
/// Completions per poll a map may ask for.
const MAX_POLL_BUDGET: u32 = 4096;
/// Registered bytes one worker may ask for.
const MAX_POOL_BYTES: u128 = 64 << 30;

/// Limits the engine sizes fixed structures by (its tunables are these values, checked at
/// compile time there).
pub mod limits {
    /// Work requests one doorbell posts at most (`worker.batching.post_list`).
    pub const MAX_POST_LIST: u32 = 32;
    /// QPs one connection stripes over at most (`worker.qps.per_conn`).
    pub const MAX_QPS_PER_CONN: u32 = 8;
    /// Request classes (`worker.scheduler.classes.*` name 0..this).
    pub const CLASSES: u8 = 4;
    /// Reads and atomics one QP may have outstanding at most (`worker.scheduler.max_rd_atomic`;
    /// the verbs attribute is one byte).
    pub const MAX_RD_ATOMIC: u32 = 255;
    /// QPs one worker may have at most (`worker.qps.max`).
    pub const MAX_QPS_PER_WORKER: u32 = 1 << 16;
    /// Connections one worker may hold at most (`worker.max_conns`).
    pub const MAX_CONNS_PER_WORKER: u32 = 1 << 16;
    /// Receives one connection may keep posted at most (`worker.recvs_per_conn`).
    pub const MAX_RECVS_PER_CONN: u32 = 1 << 13;
    /// Buffers one pool size class may have at most (`worker.pools[i].count`; the receive
    /// buffers, `worker.max_conns * worker.recvs_per_conn`, are one class too): a buffer's
    /// index in its class is 24 bits of the engine's buffer handle.
    pub const MAX_BUFFERS_PER_CLASS: u32 = 1 << 24;
    /// Size classes one worker's pool may have at most (`worker.pools`).
    pub const MAX_POOL_CLASSES: usize = 64;
    /// Receives each lane keeps posted at least (when `worker.recvs_per_conn` is this or more).
    pub const MIN_RECVS_PER_LANE: u32 = 8;
    /// The largest RNR retry count that is finite (`worker.rnr_retry`; 7 retries for ever).
    pub const RNR_RETRY_INFINITE: u8 = 7;
    /// The longest connect timeout (`connect_timeout_ms`): ten minutes.
    pub const MAX_CONNECT_TIMEOUT_MS: u32 = 600_000;
    /// The longest keepalive interval (`worker.keepalive_ms`): an hour.
    pub const MAX_KEEPALIVE_MS: u32 = 3_600_000;
    /// The longest wait before a worker with connections parks (`worker.park_after_us`): 10 s.
    pub const MAX_PARK_AFTER_US: u32 = 10_000_000;
    /// The longest wait for a peer's disconnect after a failure on its side
    /// (`worker.peer_grace_ms`): a minute.
    pub const MAX_PEER_GRACE_MS: u32 = 60_000;
}

/// Something worth saying that does not stop the map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning(pub String);

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A core map that passed validation, with what validation worked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validated {
    /// The map as written.
    pub map: CoreMap,
    /// Worker cores, ranges expanded, in the order written.
    pub workers: Vec<usize>,
    /// The device to open (`None`: the provider's first).
    pub device: Option<String>,
    /// The listen address, parsed.
    pub listen: Option<SocketAddr>,
    /// Warnings (NUMA placement).
    pub warnings: Vec<Warning>,
}

fn invalid(
    key: impl Into<String>,
    value: impl fmt::Display,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid { key: key.into(), value: value.to_string(), reason: reason.into() }
}

/// `key = v` must be `lo..=hi`.
fn range(key: &str, v: u32, lo: u32, hi: u32) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        Err(invalid(key, v, format!("must be {lo}..={hi}")))
    } else {
        Ok(())
    }
}

/// Cores as ranges (`0-3,6`).
fn ranges(cores: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let mut j = i;
        while j + 1 < cores.len() && cores[j + 1] == cores[j] + 1 {
            j += 1;
        }
        out.push(if i == j { cores[i].to_string() } else { format!("{}-{}", cores[i], cores[j]) });
        i = j + 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(",")
    }
}

impl CoreMap {
    /// Worker cores with the key that names each, ranges expanded.
    pub fn worker_cores(&self) -> Result<Vec<(String, usize)>, ConfigError> {
        let mut out = Vec::new();
        for (i, spec) in self.workers.iter().enumerate() {
            let key = format!("workers[{i}]");
            match spec {
                CoreSpec::One(c) => out.push((key, *c)),
                CoreSpec::Range(r) => {
                    let bad = || {
                        invalid(
                            &key,
                            format!("{r:?}"),
                            "a range is written \"FIRST-LAST\", e.g. \"1-3\"",
                        )
                    };
                    let (a, b) = r.split_once('-').ok_or_else(bad)?;
                    let a: usize = a.trim().parse().map_err(|_| bad())?;
                    let b: usize = b.trim().parse().map_err(|_| bad())?;
                    if a > b {
                        return Err(invalid(
                            &key,
                            format!("{r:?}"),
                            "the range's first core is after its last",
                        ));
                    }
                    if b - a >= 4096 {
                        return Err(invalid(
                            &key,
                            format!("{r:?}"),
                            "more than 4096 cores in one range",
                        ));
                    }
                    out.extend((a..=b).map(|c| (key.clone(), c)));
                }
            }
        }
        Ok(out)
    }

    /// Checks the map against `topo`.
    pub fn validate(&self, topo: &dyn Topology) -> Result<Validated, ConfigError> {
        let cores = topo.cores();
        let mut known: Vec<usize> = cores.iter().map(|c| c.os_index).collect();
        known.sort_unstable();
        let node_of =
            |core: usize| cores.iter().find(|c| c.os_index == core).and_then(|c| c.numa_node);
        let exists = |key: &str, core: usize| {
            if known.binary_search(&core).is_ok() {
                Ok(())
            } else {
                Err(ConfigError::NoSuchCore {
                    key: key.to_owned(),
                    core,
                    available: ranges(&known),
                })
            }
        };

        exists("control_core", self.control_core)?;
        let workers = self.worker_cores()?;
        if workers.is_empty() {
            return Err(invalid("workers", "[]", "at least one worker core is needed"));
        }
        let mut used: BTreeMap<usize, String> = BTreeMap::new();
        used.insert(self.control_core, "control_core".into());
        for (key, core) in &workers {
            exists(key, *core)?;
            if let Some(first) = used.get(core) {
                return Err(ConfigError::CoreUsedTwice {
                    core: *core,
                    first: first.clone(),
                    second: key.clone(),
                });
            }
            used.insert(*core, key.clone());
        }

        let device = match (&self.device, self.provider) {
            (Some(d), _) if d.is_empty() => {
                return Err(invalid("device", "\"\"", "a device name is needed"))
            }
            (Some(d), _) => Some(d.clone()),
            (None, ProviderKind::Soft) => Some("soft0".to_owned()),
            (None, ProviderKind::Ibverbs) => None,
        };
        if self.port == 0 {
            return Err(invalid("port", 0, "ports count from 1"));
        }

        let mut warnings = Vec::new();
        let device_node = device.as_deref().and_then(|d| topo.device_numa_node(d).map(|n| (d, n)));
        if let (Some((dev, dnode)), false) = (device_node, self.numa == NumaPolicy::Ignore) {
            for (key, core) in &workers {
                match node_of(*core) {
                    Some(cnode) if cnode != dnode => {
                        if self.numa == NumaPolicy::Require {
                            return Err(ConfigError::NumaMismatch {
                                key: key.clone(),
                                core: *core,
                                core_node: cnode,
                                device: dev.to_owned(),
                                device_node: dnode,
                            });
                        }
                        warnings.push(Warning(format!(
                            "`{key} = {core}` is on NUMA node {cnode} but device {dev} is on node {dnode}: \
                             its memory accesses cross the interconnect (set numa = \"require\" to refuse, \
                             \"ignore\" to silence)"
                        )));
                    }
                    _ => {}
                }
            }
        }

        self.check_resources()?;
        let listen = match &self.listen {
            None => None,
            Some(s) => Some(
                s.parse::<SocketAddr>()
                    .map_err(|e| invalid("listen", format!("{s:?}"), e.to_string()))?,
            ),
        };
        Ok(Validated {
            map: self.clone(),
            workers: workers.into_iter().map(|(_, c)| c).collect(),
            device,
            listen,
            warnings,
        })
    }

    fn check_resources(&self) -> Result<(), ConfigError> {
        let w = &self.worker;
        for (key, v) in [
            ("worker.cq_depth", w.cq_depth),
            ("worker.send_queue_depth", w.send_queue_depth),
            ("worker.recv_queue_depth", w.recv_queue_depth),
        ] {
            if v == 0 || v > MAX_DEPTH {
                return Err(invalid(key, v, format!("must be 1..={MAX_DEPTH}")));
            }
        }
        self.check_conns()?;
        if w.max_inline > MAX_INLINE {
            return Err(invalid(
                "worker.max_inline",
                w.max_inline,
                format!("must be at most {MAX_INLINE}"),
            ));
        }
        if w.poll_budget == 0 || w.poll_budget > MAX_POLL_BUDGET {
            return Err(invalid(
                "worker.poll_budget",
                w.poll_budget,
                format!("must be 1..={MAX_POLL_BUDGET}"),
            ));
        }
        self.check_scheduling()?;
        if w.pools.is_empty() {
            return Err(invalid("worker.pools", "[]", "at least one size class is needed"));
        }
        if w.pools.len() > limits::MAX_POOL_CLASSES {
            return Err(invalid(
                "worker.pools",
                format!("{} classes", w.pools.len()),
                format!("at most {} size classes", limits::MAX_POOL_CLASSES),
            ));
        }
        let recv_buffers = u64::from(w.max_conns) * u64::from(w.recvs_per_conn);
        if recv_buffers > u64::from(limits::MAX_BUFFERS_PER_CLASS) {
            return Err(invalid(
                "worker.recvs_per_conn",
                w.recvs_per_conn,
                format!(
                    "the receive buffers (worker.max_conns * worker.recvs_per_conn = \
                     {recv_buffers}) are one class of at most {} buffers: lower either",
                    limits::MAX_BUFFERS_PER_CLASS
                ),
            ));
        }
        // The receive buffers are registered with the pools.
        let mut total: u128 =
            u128::from(w.max_conns) * u128::from(w.recvs_per_conn) * u128::from(w.recv_size);
        let mut prev = 0usize;
        for (i, p) in w.pools.iter().enumerate() {
            if p.size < 8 || p.size > 1 << 30 {
                return Err(invalid(
                    format!("worker.pools[{i}].size"),
                    p.size,
                    "must be 8 bytes..=1 GiB",
                ));
            }
            if p.size <= prev {
                return Err(invalid(
                    format!("worker.pools[{i}].size"),
                    p.size,
                    "size classes go smallest first, each larger",
                ));
            }
            if p.count == 0 || p.count > limits::MAX_BUFFERS_PER_CLASS as usize {
                return Err(invalid(
                    format!("worker.pools[{i}].count"),
                    p.count,
                    format!("must be 1..={}", limits::MAX_BUFFERS_PER_CLASS),
                ));
            }
            prev = p.size;
            total += p.size as u128 * p.count as u128;
        }
        if total > MAX_POOL_BYTES {
            return Err(invalid(
                "worker.pools",
                format!("{total} bytes"),
                "more than 64 GiB per worker (with the receive buffers: worker.max_conns * \
                 worker.recvs_per_conn * worker.recv_size)",
            ));
        }
        Ok(())
    }
}

impl CoreMap {
    /// Connections, their receives and the CQ they share: what one worker needs for one
    /// connection must fit (the engine admits more only while they fit, see
    /// [`crate::WorkerResources::cqes_per_conn`]).
    fn check_conns(&self) -> Result<(), ConfigError> {
        use limits::*;
        let w = &self.worker;
        range("worker.max_conns", w.max_conns, 1, MAX_CONNS_PER_WORKER)?;
        range("connect_timeout_ms", self.connect_timeout_ms, 1, MAX_CONNECT_TIMEOUT_MS)?;
        range("worker.recvs_per_conn", w.recvs_per_conn, 1, MAX_RECVS_PER_CONN)?;
        range("worker.recv_size", w.recv_size, 1, 1 << 30)?;
        range("worker.rnr_retry", u32::from(w.rnr_retry), 0, u32::from(RNR_RETRY_INFINITE))?;
        range("worker.min_rnr_timer", u32::from(w.min_rnr_timer), 0, 31)?;
        range("worker.timeout", u32::from(w.timeout), 1, 31)?;
        range("worker.retry_cnt", u32::from(w.retry_cnt), 0, 7)?;
        range("worker.keepalive_ms", w.keepalive_ms, 0, MAX_KEEPALIVE_MS)?;
        range("worker.park_after_us", w.park_after_us, 0, MAX_PARK_AFTER_US)?;
        range("worker.peer_grace_ms", w.peer_grace_ms, 0, MAX_PEER_GRACE_MS)?;
        let lanes = self.worker.qps.per_conn.max(1);
        let per_lane = w.recvs_per_lane(1).max(w.recvs_per_lane(lanes));
        if per_lane > w.recv_queue_depth {
            return Err(invalid(
                "worker.recv_queue_depth",
                w.recv_queue_depth,
                format!(
                    "a lane keeps {per_lane} receives posted (worker.recvs_per_conn = {}, at \
                     least {} per lane): raise it to {per_lane} or lower worker.recvs_per_conn",
                    w.recvs_per_conn,
                    MIN_RECVS_PER_LANE.min(w.recvs_per_conn)
                ),
            ));
        }
        let need = w.cqes_per_conn(1).max(w.cqes_per_conn(lanes));
        if u64::from(w.cq_depth) < need {
            return Err(invalid(
                "worker.cq_depth",
                w.cq_depth,
                format!(
                    "must hold one connection's completions: {need} (worker.qps.per_conn = \
                     {lanes} lanes, each with its receives and up to {} requests on the device)",
                    w.max_outstanding()
                ),
            ));
        }
        if self.gid_index > u32::from(u8::MAX) {
            return Err(invalid("gid_index", self.gid_index, "must be 0..=255"));
        }
        Ok(())
    }

    fn check_scheduling(&self) -> Result<(), ConfigError> {
        use limits::*;
        let w = &self.worker;
        let (b, s, q) = (&w.batching, &w.scheduler, &w.qps);
        range("worker.batching.post_list", b.post_list, 1, MAX_POST_LIST)?;
        range("worker.batching.signal_every", b.signal_every, 1, w.send_queue_depth)?;
        range("worker.scheduler.aging_rounds", s.aging_rounds, 1, 1 << 20)?;
        range("worker.scheduler.max_outstanding", s.max_outstanding, 0, w.send_queue_depth)?;
        range("worker.scheduler.max_rd_atomic", s.max_rd_atomic, 1, MAX_RD_ATOMIC)?;
        range("worker.scheduler.coalesce_max_bytes", s.coalesce_max_bytes, 1, 1 << 30)?;
        for (key, v) in [
            ("worker.scheduler.classes.read", s.classes.read),
            ("worker.scheduler.classes.atomic", s.classes.atomic),
            ("worker.scheduler.classes.send", s.classes.send),
            ("worker.scheduler.classes.write", s.classes.write),
        ] {
            range(key, u32::from(v), 0, u32::from(CLASSES) - 1)?;
        }
        range("worker.qps.per_conn", q.per_conn, 1, MAX_QPS_PER_CONN)?;
        range("worker.qps.max", q.max, q.per_conn, MAX_QPS_PER_WORKER)?;
        range("worker.qps.pool", q.pool, 0, q.max)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{Core, StaticTopology};
    use crate::{parse, ConfigError};

    fn two_nodes() -> StaticTopology {
        StaticTopology {
            cores: (0..8).map(|i| Core { os_index: i, numa_node: Some((i / 4) as u32) }).collect(),
            devices: vec![("mlx5_0".into(), 1)],
        }
    }

    #[test]
    fn defaults_fit_a_two_core_laptop() {
        let v = parse("").unwrap().validate(&StaticTopology::uniform(2)).unwrap();
        assert_eq!(v.workers, vec![1]);
        assert_eq!(v.device.as_deref(), Some("soft0"));
        assert!(v.warnings.is_empty());
    }

    #[test]
    fn ranges_expand() {
        let m = parse("control_core = 0\nworkers = [\"1-3\", 6]").unwrap();
        assert_eq!(m.validate(&two_nodes()).unwrap().workers, vec![1, 2, 3, 6]);
        let e = parse("workers = [\"3-1\"]").unwrap().validate(&two_nodes()).unwrap_err();
        assert!(matches!(&e, ConfigError::Invalid { key, .. } if key == "workers[0]"), "{e}");
        let e = parse("workers = [\"x\"]").unwrap().validate(&two_nodes()).unwrap_err();
        assert!(e.to_string().contains("workers[0]"), "{e}");
    }

    #[test]
    fn missing_core_named_with_its_key() {
        let e = parse("workers = [1, 9]").unwrap().validate(&two_nodes()).unwrap_err();
        assert_eq!(
            e,
            ConfigError::NoSuchCore { key: "workers[1]".into(), core: 9, available: "0-7".into() }
        );
        let e = parse("control_core = 12").unwrap().validate(&two_nodes()).unwrap_err();
        assert!(e.to_string().contains("control_core = 12"), "{e}");
    }

    #[test]
    fn core_used_twice_and_control_among_workers() {
        let e = parse("workers = [1, \"0-2\"]").unwrap().validate(&two_nodes()).unwrap_err();
        assert_eq!(
            e,
            ConfigError::CoreUsedTwice {
                core: 0,
                first: "control_core".into(),
                second: "workers[1]".into()
            }
        );
        let e = parse("workers = [2, 2]").unwrap().validate(&two_nodes()).unwrap_err();
        assert!(matches!(e, ConfigError::CoreUsedTwice { core: 2, .. }));
    }

    #[test]
    fn numa_policy() {
        let base = "provider = \"ibverbs\"\ndevice = \"mlx5_0\"\nworkers = [1, 5]\n";
        let v = parse(base).unwrap().validate(&two_nodes()).unwrap();
        assert_eq!(v.warnings.len(), 1);
        assert!(v.warnings[0].0.contains("workers[0] = 1"), "{}", v.warnings[0]);
        let e = parse(&format!("{base}numa = \"require\""))
            .unwrap()
            .validate(&two_nodes())
            .unwrap_err();
        assert!(matches!(
            e,
            ConfigError::NumaMismatch { core: 1, core_node: 0, device_node: 1, .. }
        ));
        let v = parse(&format!("{base}numa = \"ignore\"")).unwrap().validate(&two_nodes()).unwrap();
        assert!(v.warnings.is_empty());
    }

    #[test]
    fn resources_in_range() {
        let t = StaticTopology::uniform(2);
        for (text, key) in [
            ("[worker]\ncq_depth = 0", "worker.cq_depth"),
            ("[worker]\ncq_depth = 16", "worker.cq_depth"),
            ("[worker]\nmax_conns = 0", "worker.max_conns"),
            ("[worker]\nrecvs_per_conn = 0", "worker.recvs_per_conn"),
            ("[worker]\nrecvs_per_conn = 300", "worker.recv_queue_depth"),
            ("[worker]\nrnr_retry = 8", "worker.rnr_retry"),
            ("[worker]\nmin_rnr_timer = 32", "worker.min_rnr_timer"),
            ("[worker]\nkeepalive_ms = 3600001", "worker.keepalive_ms"),
            ("[worker]\npark_after_us = 10000001", "worker.park_after_us"),
            ("[worker]\npeer_grace_ms = 60001", "worker.peer_grace_ms"),
            ("connect_timeout_ms = 0", "connect_timeout_ms"),
            ("[worker]\ntimeout = 0", "worker.timeout"),
            ("[worker]\ntimeout = 32", "worker.timeout"),
            ("[worker]\nretry_cnt = 8", "worker.retry_cnt"),
            ("[worker]\nrecv_size = 0", "worker.recv_size"),
            ("gid_index = 256", "gid_index"),
            (
                "[worker]\ncq_depth = 3\nsend_queue_depth = 2\nrecv_queue_depth = 2\n\
                 recvs_per_conn = 2",
                "worker.cq_depth",
            ),
            ("[worker]\nmax_inline = 5000", "worker.max_inline"),
            ("[worker]\npoll_budget = 0", "worker.poll_budget"),
            ("[worker]\npools = []", "worker.pools"),
            ("[[worker.pools]]\nsize = 64\ncount = 0", "worker.pools[0].count"),
            ("[[worker.pools]]\nsize = 64\ncount = 16777217", "worker.pools[0].count"),
            (
                "[worker]\nmax_conns = 65536\nrecvs_per_conn = 512\nrecv_queue_depth = 512\n\
                 recv_size = 64\ncq_depth = 4096",
                "worker.recvs_per_conn",
            ),
            (
                "[[worker.pools]]\nsize = 64\ncount = 1\n[[worker.pools]]\nsize = 32\ncount = 1",
                "worker.pools[1].size",
            ),
            ("[worker.batching]\npost_list = 0", "worker.batching.post_list"),
            ("[worker.batching]\npost_list = 33", "worker.batching.post_list"),
            ("[worker.batching]\nsignal_every = 999", "worker.batching.signal_every"),
            ("[worker.scheduler.classes]\nread = 4", "worker.scheduler.classes.read"),
            ("[worker.scheduler]\nmax_rd_atomic = 0", "worker.scheduler.max_rd_atomic"),
            ("[worker.qps]\nper_conn = 9", "worker.qps.per_conn"),
            ("[worker.qps]\npool = 20\nmax = 10", "worker.qps.pool"),
            ("listen = \"nowhere\"", "listen"),
            ("port = 0", "port"),
        ] {
            let e = parse(text).unwrap().validate(&t).unwrap_err();
            assert!(matches!(&e, ConfigError::Invalid { key: k, .. } if k == key), "{text}: {e}");
        }
        let v = parse("listen = \"10.0.0.1:7471\"").unwrap().validate(&t).unwrap();
        assert_eq!(v.listen, Some("10.0.0.1:7471".parse().unwrap()));
    }

    #[test]
    fn ranges_text() {
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(ranges(&[]), "none");
    }
}

#[cfg(test)]
mod example_files {
    use crate::topology::{Core, StaticTopology};

    #[test]
    fn examples_validate() {
        let laptop = crate::parse(include_str!("../examples/laptop.toml")).unwrap();
        assert_eq!(laptop, crate::CoreMap::default(), "the laptop example spells out the defaults");
        laptop.validate(&StaticTopology::uniform(2)).unwrap();
        let server = StaticTopology {
            cores: (0..16).map(|i| Core { os_index: i, numa_node: Some((i / 8) as u32) }).collect(),
            devices: vec![("mlx5_0".into(), 0)],
        };
        let v = crate::parse(include_str!("../examples/two-socket.toml"))
            .unwrap()
            .validate(&server)
            .unwrap();
        assert_eq!(v.workers, vec![1, 2, 3, 4]);
        assert!(v.warnings.is_empty());
    }
}
