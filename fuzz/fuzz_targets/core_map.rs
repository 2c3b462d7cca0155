//! Core maps from arbitrary text: `corelink_config::parse` and, when it parses,
//! `CoreMap::validate` against a fixed four-core, two-node topology with one device. Neither
//! may panic or hang. An accepted map keeps the limits the validator documents: its workers
//! are cores of the topology, non-empty, distinct and apart from the control core; queue
//! depths, `recv_size` and `qps.per_conn` are in their ranges, and one connection's receives
//! and completions fit the receive queue and the CQ. Every error displays a non-empty
//! message naming the core map.
#![no_main]

use corelink_config::{limits, Core, NumaPolicy, ProviderKind, StaticTopology};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // Cores 0-3 on nodes 0 and 1, the device on node 1: the NUMA checks have something to say.
    let topo = StaticTopology {
        cores: (0..4).map(|i| Core { os_index: i, numa_node: Some((i / 2) as u32) }).collect(),
        devices: vec![("mlx5_0".into(), 1)],
    };
    let map = match corelink_config::parse(text) {
        Ok(map) => map,
        Err(e) => return check_error(&e),
    };
    let v = match map.validate(&topo) {
        Ok(v) => v,
        Err(e) => return check_error(&e),
    };
    assert_eq!(v.map, map);

    // Workers: known cores, at least one, each once, none the control core.
    assert!(!v.workers.is_empty());
    let mut seen = vec![false; topo.cores.len()];
    assert!(map.control_core < seen.len(), "control core {}", map.control_core);
    seen[map.control_core] = true;
    for &w in &v.workers {
        assert!(w < seen.len(), "worker core {w} is not in the topology");
        assert!(!seen[w], "core {w} used twice in {:?}", v.workers);
        seen[w] = true;
    }

    let w = &map.worker;
    for depth in [w.cq_depth, w.send_queue_depth, w.recv_queue_depth] {
        assert!((1..=1 << 16).contains(&depth), "queue depth {depth}");
    }
    assert!((1..=1 << 30).contains(&w.recv_size), "recv_size {}", w.recv_size);
    assert!((1..=limits::MAX_QPS_PER_CONN).contains(&w.qps.per_conn));
    assert!(w.qps.per_conn <= w.qps.max && w.qps.pool <= w.qps.max);
    assert!(w.recvs_per_lane(w.qps.per_conn) <= w.recv_queue_depth);
    assert!(u64::from(w.cq_depth) >= w.cqes_per_conn(w.qps.per_conn));
    assert!(!w.pools.is_empty() && w.pools.windows(2).all(|p| p[0].size < p[1].size));
    assert!(map.port != 0);

    // The device: soft's default when unnamed; NUMA warnings only when they are not ignored.
    match (&map.device, map.provider) {
        (Some(d), _) => assert_eq!(v.device.as_deref(), Some(d.as_str())),
        (None, ProviderKind::Soft) => assert_eq!(v.device.as_deref(), Some("soft0")),
        (None, ProviderKind::Ibverbs) => assert_eq!(v.device, None),
    }
    if map.numa == NumaPolicy::Ignore {
        assert!(v.warnings.is_empty());
    }
    assert_eq!(v.listen.is_some(), map.listen.is_some());
});

fn check_error(e: &corelink_config::ConfigError) {
    let shown = e.to_string();
    assert!(!shown.is_empty());
    assert!(shown.starts_with("core map"), "{shown}");
}
