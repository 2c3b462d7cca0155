//! Baselines measured in the same binary, so that every figure can be given as a ratio from
//! one run: `memcpy` (the copy bandwidth of the same buffers: the ceiling for a software
//! provider's one-sided write), `ring_pingpong` (two pinned threads bouncing a cache line
//! through an SPSC ring: the ceiling for any cross-core round trip; one-way latency, half the
//! round trip), `tcp_lat` and `tcp_bw` (the same sizes over TCP on the loopback or a given
//! address: the RDMA-versus-TCP comparison).

use std::net::SocketAddr;
use std::time::Duration;

use super::Report;

/// Which baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaselineKind {
    /// Copy bandwidth of buffers of the message size.
    Memcpy,
    /// Cross-core round trip through the engine's SPSC ring.
    RingPingpong,
    /// TCP ping-pong latency.
    TcpLat,
    /// TCP streaming bandwidth.
    TcpBw,
}

/// How to run a baseline.
#[derive(Debug, Clone)]
pub struct BaselineOpts {
    /// Message sizes, one report each.
    pub sizes: Vec<usize>,
    /// Iterations per size (ignored when `duration` is set).
    pub iters: u64,
    /// Run each size for this long instead of `iters`.
    pub duration: Option<Duration>,
    /// TCP: with `Some`, connect to a `corelink-perf baseline` server there; with `None`, run
    /// both ends in this process over the loopback.
    pub server: Option<SocketAddr>,
    /// Cores to pin the two threads of `ring_pingpong` (and the TCP ends) to.
    pub cores: (usize, usize),
}

/// Runs a baseline; one report per size.
pub fn run(kind: BaselineKind, _o: &BaselineOpts) -> Result<Vec<Report>, String> {
    Err(format!("baseline {kind:?} is not implemented yet"))
}
