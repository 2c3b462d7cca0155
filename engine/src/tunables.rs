//! The engine's tunables, in one place: compile-time constants that size fixed structures,
//! tied together by compile-time checks. Per-deployment values (queue depths, pool classes,
//! polling budget) come from the core map (`corelink-config`) instead.

/// Completions one loop iteration polls at most (the stack array `poll` fills); the core map's
/// `poll_budget` is clamped to it.
pub const MAX_POLL_BATCH: usize = 64;

/// Completions a handler is told in one [`crate::Handler::on_completions`] call at most: one
/// send-queue completion retires up to `worker.batching.signal_every` requests, told in
/// batches of this many.
pub const COMPLETION_BATCH: usize = 64;

/// Work requests posted with one doorbell at most (the core map's `batching.post_list` is at
/// most this).
pub const MAX_POST_LIST: usize = corelink_config::limits::MAX_POST_LIST as usize;

/// QPs one connection stripes over at most (`qps.per_conn`).
pub const MAX_QPS_PER_CONN: usize = corelink_config::limits::MAX_QPS_PER_CONN as usize;

/// Request classes (class 0 goes first).
pub const CLASSES: usize = corelink_config::limits::CLASSES as usize;

/// Scatter/gather entries one work request carries at most (a coalesced write gathers its
/// requests' buffers).
pub const MAX_SGE: usize = 8;

/// Receives a connection keeps posted by default (`worker.recvs_per_conn`): the messages a
/// sender may have in flight towards one peer without waiting for its answers.
pub const RECVS_PER_CONN: usize = 32;

/// Connections one worker may own at most (`worker.max_conns` is at most this; the worker
/// holds exactly as many slots as the key says).
pub const MAX_CONNS_PER_WORKER: usize = corelink_config::limits::MAX_CONNS_PER_WORKER as usize;

/// Bits of a receive's work-request id that number it within its lane (the lane's index takes
/// the 3 above them, the connection slot the 16 above those).
pub const RECV_INDEX_BITS: u32 = 13;

/// Requests one worker holds at most, waiting and in flight (its request slab); beyond, a
/// submission fails with `TooManyRequests`.
pub const MAX_REQUESTS_PER_WORKER: usize = 1 << 16;

/// Reads in flight the merge table holds without growing (sized once, at start).
pub const MERGE_TABLE: usize = 8192;

/// Capacity of the rings between the control core and each worker (both directions).
pub const CONTROL_RING: usize = 256;

/// Capacity of an external client's submission and completion rings.
pub const CLIENT_RING: usize = 1024;

/// Longest one park of [`crate::Client::wait`] (the worker wakes a waiting client as it
/// gives it an event; this bounds the wait for a wake that cannot come, e.g. a stopped worker).
pub const CLIENT_WAIT_SLICE: std::time::Duration = std::time::Duration::from_millis(10);

/// External clients one worker serves at most.
pub const MAX_CLIENTS_PER_WORKER: usize = 64;

/// Submissions taken from one client per loop iteration at most (fairness between clients and
/// the worker's own handler).
pub const CLIENT_BATCH: usize = 32;

/// Timers one worker holds at most.
pub const MAX_TIMERS: usize = 1024;

/// How long an idle worker parks at a time (with no connections after `worker.idle_after_us`,
/// with connections after `worker.park_after_us`): what a completion that comes meanwhile
/// waits at most.
pub const PARK_SLICE: std::time::Duration = std::time::Duration::from_millis(1);

/// Empty polls in a row before an idle worker looks at the clock (one read per iteration from
/// then on, until work comes): one with connections and `worker.park_after_us`, or one
/// without connections and `worker.idle_after_us` (in the Soft-RoCE guest a read of its
/// clock, the HPET, costs about 2.8 us).
pub const PARK_LOOK_AFTER: u32 = 64;

/// Loop iterations between two publications of a worker's metrics.
pub const METRICS_EVERY: u64 = 4096;

/// How long connections closed because their completions cannot be trusted (the worker's CQ
/// overran, its device failed) wait for their device's flushes before the worker ends what is
/// still posted on them itself (`Metrics::completions_made_up`; `worker/untrusted.rs`).
pub const UNTRUSTED_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_millis(100);
/// Loop iterations between checks of whether a keepalive pass is due (a read of the coarse
/// clock each, `CLOCK_MONOTONIC_COARSE`; a pass runs every half `worker.keepalive_ms`): a few
/// milliseconds at most of a busy loop.
pub const KEEPALIVE_EVERY: u64 = 1024;

/// How often at most a worker makes the looks that are system calls on `ibverbs` (its
/// device's asynchronous events, its thread's context switches for the metrics), at the
/// metrics' pace: every `METRICS_EVERY` iterations, once this much time of the coarse clock
/// has passed. (A busy worker in the Soft-RoCE guest makes `METRICS_EVERY` iterations in
/// about 0.3 ms.)
pub const SLOW_LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

// (The metrics' check runs inside the keepalive's: its period must be a multiple.)
const _: () = assert!(KEEPALIVE_EVERY.is_power_of_two() && METRICS_EVERY.is_power_of_two());
const _: () = assert!(METRICS_EVERY % KEEPALIVE_EVERY == 0);

/// Private data a connect request carries at most (rdma_cm over the TCP port space: 56 bytes).
/// The engine's own header (`control::HEADER`: region, lane group, lengths) comes first; the
/// application gets the rest (`control::MAX_APP_PRIVATE_DATA`).
pub const MAX_PRIVATE_DATA: usize = 56;

/// Bits of a work-request id that number the request slot (the rest is its generation).
pub const SLOT_BITS: u32 = 24;

/// The top bit of a work-request id marks a receive; below it, the connection slot and the
/// receive's index within the connection.
pub const RECV_FLAG: u64 = 1 << 63;

const _: () = {
    assert!(MAX_POLL_BATCH > 0 && MAX_POST_LIST > 0 && COMPLETION_BATCH > 0);
    // A receive's id holds a connection slot (below 2^16), its lane (below 2^3) and its index
    // in the lane (below 2^RECV_INDEX_BITS: every lane of `worker.recvs_per_conn`).
    assert!(MAX_CONNS_PER_WORKER <= 1 << 16);
    assert!(MAX_QPS_PER_CONN <= 1 << (16 - RECV_INDEX_BITS));
    assert!(corelink_config::limits::MAX_RECVS_PER_CONN as usize <= 1 << RECV_INDEX_BITS);
    assert!(RECVS_PER_CONN <= corelink_config::limits::MAX_RECVS_PER_CONN as usize);
    assert!(CONTROL_RING.is_power_of_two() && CLIENT_RING.is_power_of_two());
    assert!(MAX_REQUESTS_PER_WORKER <= 1 << SLOT_BITS);
    assert!(CLIENT_BATCH <= CLIENT_RING);
    assert!(CLASSES > 0 && CLASSES <= 8 && MAX_SGE >= 1);
};
