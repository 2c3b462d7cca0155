//! What validation needs to know of the machine: its cores with their NUMA nodes, and the
//! NUMA node of an RDMA device.

use crate::ConfigError;

/// A logical core (what the OS schedules on and `sched_setaffinity` pins to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Core {
    /// The OS's index of the core.
    pub os_index: usize,
    /// Its NUMA node, if the machine reports one.
    pub numa_node: Option<u32>,
}

/// The machine as validation sees it.
pub trait Topology {
    /// Every core.
    fn cores(&self) -> Vec<Core>;
    /// The NUMA node of the RDMA device called `device`, if known.
    fn device_numa_node(&self, device: &str) -> Option<u32>;
}

/// A topology given by value (tests, dry runs).
#[derive(Debug, Clone, Default)]
pub struct StaticTopology {
    /// The cores.
    pub cores: Vec<Core>,
    /// Devices and their NUMA nodes.
    pub devices: Vec<(String, u32)>,
}

impl StaticTopology {
    /// `n` cores on NUMA node 0.
    pub fn uniform(n: usize) -> Self {
        StaticTopology {
            cores: (0..n).map(|i| Core { os_index: i, numa_node: Some(0) }).collect(),
            devices: Vec::new(),
        }
    }
}

impl Topology for StaticTopology {
    fn cores(&self) -> Vec<Core> {
        self.cores.clone()
    }

    fn device_numa_node(&self, device: &str) -> Option<u32> {
        self.devices.iter().find(|(d, _)| d == device).map(|(_, n)| *n)
    }
}

/// This machine's topology, read with hwloc.
#[derive(Debug, Clone)]
pub struct MachineTopology {
    cores: Vec<Core>,
}

impl MachineTopology {
    /// Reads the topology.
    pub fn load() -> Result<Self, ConfigError> {
        use hwlocality::object::types::ObjectType;
        let topo = hwlocality::Topology::new().map_err(|e| ConfigError::Topology(e.to_string()))?;
        let nodes: Vec<(u32, Vec<usize>)> = topo
            .objects_with_type(ObjectType::NUMANode)
            .filter_map(|n| {
                let id = u32::try_from(n.os_index()?).ok()?;
                Some((id, n.cpuset()?.iter_set().map(usize::from).collect()))
            })
            .collect();
        let cores = topo
            .objects_with_type(ObjectType::PU)
            .filter_map(|pu| pu.os_index())
            .map(|os_index| Core {
                os_index,
                numa_node: nodes.iter().find(|(_, cpus)| cpus.contains(&os_index)).map(|(n, _)| *n),
            })
            .collect();
        Ok(MachineTopology { cores })
    }
}

impl Topology for MachineTopology {
    fn cores(&self) -> Vec<Core> {
        self.cores.clone()
    }

    /// Read from sysfs (`/sys/class/infiniband/DEV/device/numa_node`; -1 means none).
    fn device_numa_node(&self, device: &str) -> Option<u32> {
        if device.contains('/') || device.contains("..") {
            return None;
        }
        let path = format!("/sys/class/infiniband/{device}/device/numa_node");
        std::fs::read_to_string(path)
            .ok()?
            .trim()
            .parse::<i64>()
            .ok()
            .and_then(|n| u32::try_from(n).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_has_cores() {
        let t = MachineTopology::load().unwrap();
        assert!(!t.cores().is_empty());
        assert_eq!(t.device_numa_node("../etc"), None);
    }
}
