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

/// What to do when a thread of the engine cannot be pinned to its core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PinPolicy {
    /// Say so on stderr and in the worker's metrics (`pinned = false`), and go on.
    #[default]
    Warn,
    /// Refuse to start.
    Require,
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
    /// Bytes per buffer (8 B..=1 GiB).
    pub size: usize,
    /// Buffers in the class (at most [`crate::limits::MAX_BUFFERS_PER_CLASS`]).
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
    /// worker with connections busy-polls unless `park_after_us` says otherwise). Words from
    /// the control core (a connection primed, handed over) are not work here: they do not
    /// predict completions, so they keep no worker polling.
    pub idle_after_us: u64,
    /// Microseconds without work (completions, posts, client submissions) before a worker with
    /// connections parks too, a slice (1 ms) at a time, until work comes (0, the default: a
    /// worker with connections busy-polls).
    /// For a worker whose connections carry traffic it does not take part in (the target of
    /// RDMA writes, reads and atomics) on a machine where the device's own work needs its
    /// core (Soft-RoCE), or to save the core: a completion that comes while it is parked waits
    /// for the slice's end (a control message, a client's submission or `Cx::waker` wakes it
    /// at once), and its timers and keepalive run when it wakes.
    pub park_after_us: u32,
    /// Empty polls in a row after which a worker with connections yields its core once per
    /// iteration (`sched_yield`) until a completion comes (0: never; pure busy-polling). For
    /// machines where the device's own work needs the worker's core (Soft-RoCE).
    pub yield_after_empty_polls: u32,
    /// Whether each worker opens a device context of its own (`true`, the default: its QPs
    /// have doorbell registers no other worker's lock; on ConnectX, QPs of one context share
    /// them under a lock), or every worker shares the control core's (`false`: for devices
    /// with few contexts or doorbell pages; the control core then reads the workers' device
    /// events and hands them over).
    pub own_context: bool,
    /// Registered buffer size classes, smallest first (at most
    /// [`crate::limits::MAX_POOL_CLASSES`]).
    pub pools: Vec<PoolClass>,
    /// Engine connections one worker holds at most (each end counts on its own worker); a
    /// connect or accept beyond is refused with this key's name.
    pub max_conns: u32,
    /// Receives each connection keeps posted, shared out over its lanes (each lane keeps at
    /// least 8, or this many if fewer): the messages a peer may have in flight towards it.
    pub recvs_per_conn: u32,
    /// Bytes of each receive buffer: the largest send a peer may make to this side (a larger
    /// one is refused at submit). The receive buffers are registered at start, apart from
    /// `pools`: `max_conns * recvs_per_conn` of them (at most
    /// [`crate::limits::MAX_BUFFERS_PER_CLASS`]).
    pub recv_size: u32,
    /// RNR retries of a send that finds no receive posted (0..=6; 7 retries for ever, which a
    /// peer that stopped posting receives then hangs).
    pub rnr_retry: u8,
    /// The RNR timer this side asks a sender to wait before retrying (the IB code: 1 is
    /// 10 us, 12 is 0.64 ms, 20 is 10.24 ms, 31 is 491 ms; 0 is 655 ms). The default, 20, with
    /// `rnr_retry` 6, lets a peer send for about 61 ms before its receives are posted: the time
    /// a new connection takes to reach its worker after the connection manager is done.
    pub min_rnr_timer: u8,
    /// The local ACK timeout of an RC lane (the IB code: 4.096 us x 2^timeout per try; 14 is
    /// 67 ms, 19 is 2.1 s; 0 waits for ever). With `retry_cnt`, a peer that stopped answering
    /// is detected after at most (retry_cnt + 1) tries: about 0.47 s with the defaults.
    pub timeout: u8,
    /// Transport retries of an RC lane before `RETRY_EXC_ERR` (0..=7; rxe retries for ever at
    /// 7, so a dead peer is never reported there).
    pub retry_cnt: u8,
    /// Milliseconds a connection may go without traffic before the worker probes it (a
    /// zero-length RDMA write, which needs no memory or receive at the peer and runs on its
    /// NIC alone); 0: never. A peer that died or whose wire went down is then seen on an idle
    /// connection too, which closes with `CloseReason::Unanswered` after at most
    /// keepalive_ms + (retry_cnt + 1) x timeout: about 1.5 s with the defaults. A busy
    /// connection is never probed (its own requests would fail first).
    pub keepalive_ms: u32,
    /// Milliseconds a connection whose request failed on the peer's side (`REM_ACCESS_ERR`,
    /// `REM_OP_ERR`, `REM_INV_REQ_ERR`) waits for the connection manager's word that the
    /// peer went away before it closes for that failure. A peer's process that dies tears
    /// down its memory before its connections, so its survivors often see a refused request
    /// first (and a refusal fails the peer's queue pair too, so a live peer disconnects as
    /// well); with the word, the close says the peer went away after the refusal
    /// (`CloseReason::PeerGone`). Such a close is reported at most this much later; 0: at
    /// once, for the failure. The same wait the other way round: after the peer's
    /// disconnect, requests in flight wait at most this long for the answers the peer sent
    /// before it (an acknowledgement, a refusal) before they flush.
    pub peer_grace_ms: u32,
    /// How queued requests become work requests: doorbells and completions.
    pub batching: Batching,
    /// Per-connection scheduling: priority classes, aging, outstanding limits, merging.
    pub scheduler: Scheduler,
    /// Queue pairs: pre-created pool, limit, QPs per connection.
    pub qps: Qps,
}

/// Doorbell batching and selective signalling (`[worker.batching]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Batching {
    /// Work requests posted with one doorbell at most (1: one doorbell per request).
    pub post_list: u32,
    /// One send-queue request in this many asks for a completion (1: every one). Errors
    /// always surface, and a run's last request is always signalled.
    pub signal_every: u32,
}

impl Default for Batching {
    fn default() -> Self {
        Batching { post_list: 16, signal_every: 16 }
    }
}

/// The request class a kind of request goes to by default (`[worker.scheduler.classes]`):
/// class 0 goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Classes {
    /// RDMA reads.
    pub read: u8,
    /// Atomics.
    pub atomic: u8,
    /// Sends.
    pub send: u8,
    /// RDMA writes.
    pub write: u8,
}

impl Default for Classes {
    fn default() -> Self {
        Classes { read: 0, atomic: 0, send: 1, write: 2 }
    }
}

/// Per-connection scheduling (`[worker.scheduler]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scheduler {
    /// Serve waiting requests by class (false: in arrival order).
    pub priorities: bool,
    /// Flushes a waiting class may be passed over before it goes first (no starvation).
    pub aging_rounds: u32,
    /// Default class of each kind of request (the application may name another per request).
    pub classes: Classes,
    /// Requests one QP has on the device at most (0: its send-queue depth); beyond, they wait.
    pub max_outstanding: u32,
    /// Reads and atomics one QP has on the device at most (the QP's `max_rd_atomic`).
    pub max_rd_atomic: u32,
    /// Identical reads in flight (same remote address, length and key) share one RDMA read.
    pub merge_reads: bool,
    /// Writes to adjacent remote ranges queued together may go as one write (gather list).
    pub coalesce_writes: bool,
    /// Bytes a coalesced write carries at most.
    pub coalesce_max_bytes: u32,
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler {
            priorities: true,
            aging_rounds: 8,
            classes: Classes::default(),
            max_outstanding: 0,
            max_rd_atomic: 16,
            merge_reads: true,
            coalesce_writes: false,
            coalesce_max_bytes: 4096,
        }
    }
}

/// Queue pairs (`[worker.qps]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Qps {
    /// QPs a connection stripes its requests over.
    pub per_conn: u32,
    /// QPs the control core keeps created (in RESET) per worker, so a connection takes a ready one.
    pub pool: u32,
    /// QPs a worker may have at most, in use and pooled; a connection beyond fails with this cause.
    pub max: u32,
}

impl Default for Qps {
    fn default() -> Self {
        Qps { per_conn: 1, pool: 8, max: 1024 }
    }
}

impl WorkerResources {
    /// Receives each lane of a connection of `lanes` lanes keeps posted: `recvs_per_conn`
    /// shared out, at least [`crate::limits::MIN_RECVS_PER_LANE`] (or `recvs_per_conn`, if
    /// fewer).
    pub fn recvs_per_lane(&self, lanes: u32) -> u32 {
        let floor = crate::limits::MIN_RECVS_PER_LANE.min(self.recvs_per_conn);
        (self.recvs_per_conn / lanes.max(1)).max(floor)
    }

    /// Requests one QP has on the device at most (`scheduler.max_outstanding`, 0 meaning the
    /// send-queue depth).
    pub fn max_outstanding(&self) -> u32 {
        match self.scheduler.max_outstanding {
            0 => self.send_queue_depth,
            n => n.min(self.send_queue_depth),
        }
        .max(1)
    }

    /// Completions a connection of `lanes` lanes can have on the worker's CQ at once: every
    /// receive and every request on the device (a QP in error flushes them all, signalled or
    /// not). The engine admits a connection only while its CQ has room for this.
    pub fn cqes_per_conn(&self, lanes: u32) -> u64 {
        u64::from(lanes) * u64::from(self.recvs_per_lane(lanes) + self.max_outstanding())
    }
}

impl Default for WorkerResources {
    fn default() -> Self {
        WorkerResources {
            cq_depth: 16384,
            send_queue_depth: 256,
            recv_queue_depth: 256,
            max_inline: 64,
            poll_budget: 32,
            idle_after_us: 1000,
            park_after_us: 0,
            yield_after_empty_polls: 0,
            own_context: true,
            pools: vec![
                PoolClass { size: 256, count: 1024 },
                PoolClass { size: 4096, count: 256 },
                PoolClass { size: 65536, count: 32 },
            ],
            max_conns: 32,
            recvs_per_conn: 32,
            recv_size: 4096,
            rnr_retry: 6,
            min_rnr_timer: 20,
            timeout: 14,
            retry_cnt: 6,
            keepalive_ms: 1000,
            peer_grace_ms: 100,
            batching: Batching::default(),
            scheduler: Scheduler::default(),
            qps: Qps::default(),
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
    /// Pinning policy: what a worker (or the control core) that cannot be pinned does.
    pub pin: PinPolicy,
    /// Address the control plane listens on (`ip:port`), if it accepts connections.
    pub listen: Option<String>,
    /// Whether the listener accepts peers that send no engine header (plain rdma_cm programs,
    /// e.g. librdmacm's `rdma_client`): each becomes a one-lane connection whose
    /// `ConnInfo::private_data` is the peer's whole private data, answered with none. Off by
    /// default: such a request is rejected, with the reason in the reject.
    pub accept_foreign: bool,
    /// Milliseconds a connect may take, from `Cx::connect` to the connection (address, route,
    /// the peer's answer), queueing behind the control core's other connects included;
    /// beyond, it fails with a timeout. An accepting side waits twice this long for a
    /// connection's last lane. Raise it where many connects start at once on a slow host.
    pub connect_timeout_ms: u32,
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
            pin: PinPolicy::Warn,
            listen: None,
            accept_foreign: false,
            connect_timeout_ms: 10_000,
            worker: WorkerResources::default(),
        }
    }
}
