//! The core map's shape, as TOML gives it (serde), with the defaults that work on a 2-core
//! laptop: control plane on core 0, one worker on core 1, the `soft` provider.

use serde::Deserialize;

/// Which provider the engine runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// The in-process userspace provider.
    #[default]
    Soft,
    /// Real devices through libibverbs and librdmacm.
    Ibverbs,
}

/// What to do when a worker sits on another NUMA node than the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NumaPolicy {
    /// Warn and go on.
    #[default]
    Warn,
    /// Refuse the map.
    Require,
    /// Say nothing.
    Ignore,
}

/// A core, or an inclusive range of cores written `"2-5"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum CoreSpec {
    /// One core.
    One(usize),
    /// A range, `"first-last"`.
    Range(String),
}

/// One size class of a worker's registered buffer pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolClass {
    /// Bytes per buffer.
    pub size: usize,
    /// Buffers in the class.
    pub count: usize,
}

/// Resources of every worker.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerResources {
    /// Completions the worker's CQ holds.
    pub cq_depth: u32,
    /// Send-queue depth of each QP.
    pub send_queue_depth: u32,
    /// Receive-queue depth of each QP.
    pub recv_queue_depth: u32,
    /// Bytes a send may carry inline.
    pub max_inline: u32,
    /// Completions polled per loop iteration at most.
    pub poll_budget: u32,
    /// Microseconds without work before a worker with no connections parks (0: never park; a
    /// worker with connections always busy-polls).
    pub idle_after_us: u64,
    /// Registered buffer size classes, smallest first.
    pub pools: Vec<PoolClass>,
}

impl Default for WorkerResources {
    fn default() -> Self {
        WorkerResources {
            cq_depth: 4096,
            send_queue_depth: 256,
            recv_queue_depth: 256,
            max_inline: 64,
            poll_budget: 32,
            idle_after_us: 1000,
            pools: vec![
                PoolClass { size: 256, count: 1024 },
                PoolClass { size: 4096, count: 256 },
                PoolClass { size: 65536, count: 32 },
            ],
        }
    }
}

/// A core map.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CoreMap {
    /// Provider.
    pub provider: ProviderKind,
    /// Device name (default: `soft0` for `soft`; the first device for `ibverbs`).
    pub device: Option<String>,
    /// Port number.
    pub port: u8,
    /// GID index (RoCE: the index holding the address to use).
    pub gid_index: u32,
    /// The control-plane core.
    pub control_core: usize,
    /// Worker cores.
    pub workers: Vec<CoreSpec>,
    /// NUMA placement policy.
    pub numa: NumaPolicy,
    /// Address the control plane listens on (`ip:port`), if it accepts connections.
    pub listen: Option<String>,
    /// Every worker's resources.
    pub worker: WorkerResources,
}

impl Default for CoreMap {
    fn default() -> Self {
        CoreMap {
            provider: ProviderKind::Soft,
            device: None,
            port: 1,
            gid_index: 0,
            control_core: 0,
            workers: vec![CoreSpec::One(1)],
            numa: NumaPolicy::Warn,
            listen: None,
            worker: WorkerResources::default(),
        }
    }
}
