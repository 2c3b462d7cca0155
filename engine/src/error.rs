//! The engine's one error type. Print one with its causes with [`corelink_verbs::chain`].

use std::net::SocketAddr;

use crate::request::ConnId;

/// A limit of a worker that a connection, a request or a timer ran into: which one, and the
/// core-map key (or tunable) that raises it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    /// Engine connections one worker holds (`worker.max_conns`).
    Connections,
    /// Receive buffers of a worker's connections (`worker.max_conns` * `worker.recvs_per_conn`).
    ReceiveBuffers,
    /// Completions the worker's CQ can hold for its connections (`worker.cq_depth`).
    CompletionQueue,
    /// Timers one worker holds (the tunable `MAX_TIMERS`).
    Timers,
    /// External clients one worker serves (the tunable `MAX_CLIENTS_PER_WORKER`).
    Clients,
}

impl Limit {
    /// The core-map key (or tunable) that raises it.
    pub fn key(self) -> &'static str {
        match self {
            Limit::Connections => "worker.max_conns",
            Limit::ReceiveBuffers => "worker.max_conns or worker.recvs_per_conn",
            Limit::CompletionQueue => "worker.cq_depth",
            Limit::Timers => "tunables::MAX_TIMERS",
            Limit::Clients => "tunables::MAX_CLIENTS_PER_WORKER",
        }
    }

    /// What it counts.
    pub fn what(self) -> &'static str {
        match self {
            Limit::Connections => "connections",
            Limit::ReceiveBuffers => "receive buffers",
            Limit::CompletionQueue => "CQ entries",
            Limit::Timers => "timers",
            Limit::Clients => "clients",
        }
    }
}

/// What went wrong in the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A verbs call failed.
    #[error(transparent)]
    Verbs(#[from] corelink_verbs::Error),
    /// The core map asks for one provider, the engine was started with another.
    #[error("the core map asks for provider {map}, the engine runs {engine}")]
    WrongProvider {
        /// The map's provider.
        map: &'static str,
        /// The engine's.
        engine: &'static str,
    },
    /// The provider has no device to open.
    #[error("no {provider} device on this host")]
    NoDevice {
        /// The provider.
        provider: &'static str,
    },
    /// The engine has no worker of this index.
    #[error("no worker {worker} (the engine has {workers})")]
    NoSuchWorker {
        /// The index asked for.
        worker: usize,
        /// Workers there are.
        workers: usize,
    },
    /// A buffer pool size class cannot be made.
    #[error("buffer pool class of {count} buffers of {size} bytes: {why}")]
    PoolClass {
        /// Bytes per buffer.
        size: usize,
        /// Buffers.
        count: usize,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Every buffer of the fitting size classes is in use.
    #[error("buffer pool exhausted: all {count} buffers of {size} bytes (and larger) are in use")]
    PoolExhausted {
        /// The smallest fitting class's buffer size.
        size: usize,
        /// Buffers in that class.
        count: usize,
    },
    /// The connection does not exist (any more) on this worker.
    #[error("no connection {0} on this worker")]
    NoSuchConnection(ConnId),
    /// The connection is closing and takes no new requests.
    #[error("connection {0} is closing")]
    ConnectionClosing(ConnId),
    /// The engine is shutting down and takes no new requests.
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// A ring to another thread is full: the request comes back.
    #[error("the {0} ring is full")]
    RingFull(&'static str),
    /// A thread of the engine could not be started.
    #[error("cannot start the {what} thread")]
    Spawn {
        /// Which thread.
        what: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A thread of the engine ended by panicking (or before it said it was ready).
    #[error("the {what} thread panicked")]
    Panicked {
        /// Which thread.
        what: String,
    },
    /// A thread could not be pinned to its core and the core map says `pin = "require"`.
    #[error(
        "{what} cannot be pinned to core {core} (pin = \"require\"; \"warn\" runs it unpinned)"
    )]
    Pin {
        /// Which thread.
        what: String,
        /// Its core.
        core: usize,
    },
    /// A request named a class the scheduler does not have.
    #[error("request class {class}: classes are 0..{classes}")]
    NoSuchClass {
        /// The class asked for.
        class: u8,
        /// Classes there are.
        classes: usize,
    },
    /// The flat path found every QP of the connection full: nothing was posted.
    #[error("connection {0}: every QP has its send queue (or its reads and atomics) full")]
    QueueFull(ConnId),
    /// The worker holds as many requests (waiting and in flight) as it can.
    #[error("{limit} requests are waiting or in flight on this worker: the most it holds")]
    TooManyRequests {
        /// Requests held.
        limit: usize,
    },
    /// No size class is large enough.
    #[error("no buffer holds {len} bytes (largest: {largest})")]
    BufferTooLarge {
        /// Bytes asked for.
        len: usize,
        /// The largest buffer there is.
        largest: usize,
    },
    /// A send is larger than the receive buffers the peer posts (its `worker.recv_size`).
    #[error(
        "connection {conn}: a send of {len} bytes is larger than the peer's receive buffers \
         ({max} bytes: the peer's worker.recv_size)"
    )]
    MessageTooLarge {
        /// The connection.
        conn: ConnId,
        /// Bytes of the send.
        len: usize,
        /// The peer's receive size.
        max: u32,
    },
    /// Private data longer than a connect carries.
    #[error("{len} bytes of private data; a connect carries at most {max} of the application's")]
    PrivateDataTooLong {
        /// Bytes given.
        len: usize,
        /// Bytes allowed.
        max: usize,
    },
    /// A limit of a worker was reached.
    #[error(
        "worker {worker}: {} limit reached: {in_use} in use of {max}, {need} more needed \
         (raise {})",
        limit.what(),
        limit.key()
    )]
    Limit {
        /// The worker.
        worker: usize,
        /// Which limit.
        limit: Limit,
        /// Its value.
        max: u64,
        /// In use now.
        in_use: u64,
        /// Asked for.
        need: u64,
    },
    /// A connection's lanes would take a worker beyond `worker.qps.max` QPs.
    #[error(
        "worker.qps.max reached on worker {worker}: {in_use} QPs in use and {pooled} pooled of \
         at most {max}, {need} more needed"
    )]
    QpLimit {
        /// The worker.
        worker: usize,
        /// `worker.qps.max`.
        max: usize,
        /// Its QPs in use (connecting, connected, closing).
        in_use: usize,
        /// Its QPs ready in the pool.
        pooled: usize,
        /// QPs the connection needed.
        need: usize,
    },
    /// A connect (one of its lanes) failed.
    #[error("connect to {addr}{}", lane_text(*lane, *lanes))]
    Connect {
        /// Where.
        addr: SocketAddr,
        /// The lane that failed first.
        lane: usize,
        /// Lanes of the connection.
        lanes: usize,
        /// Cause.
        #[source]
        source: Box<EngineError>,
    },
    /// A connect with a reconnect policy already uses this token ([`crate::Cx::connect_with`]).
    #[error("a connect with a reconnect policy already uses token {0}")]
    TokenInUse(u64),
    /// The peer refused the connection and said why (its engine's reason).
    #[error("rejected by the peer: {0}")]
    PeerRefused(String),
    /// Huge pages could not be mapped (none reserved: set `vm.nr_hugepages`).
    #[error("cannot map {len} bytes of huge pages (reserve some with vm.nr_hugepages)")]
    HugePages {
        /// Bytes asked for (rounded up to huge pages).
        len: usize,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A grant asked for rights a peer cannot be given.
    #[error("bad grant: {why}")]
    BadGrant {
        /// What is wrong.
        why: &'static str,
    },
    /// A grant's range is not inside its memory.
    #[error("a grant of {len} bytes at offset {offset} is not inside the memory's {memory} bytes")]
    GrantOutOfRange {
        /// Offset asked for.
        offset: usize,
        /// Bytes asked for.
        len: usize,
        /// The memory's length.
        memory: usize,
    },
    /// No such grant (revoked already, or its connection closed).
    #[error("no grant {} on connection {} (revoked, or its connection closed)", .0.n, .0.conn)]
    NoSuchGrant(crate::memory::GrantId),
    /// A connection's lanes did not all come up.
    #[error("{0}")]
    Lanes(&'static str),
}

fn lane_text(lane: usize, lanes: usize) -> String {
    if lanes > 1 {
        format!(" (lane {lane} of {lanes})")
    } else {
        String::new()
    }
}

/// Result of an engine call.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_names_its_key_and_a_chain_prints_every_cause() {
        let e =
            EngineError::Limit { worker: 0, limit: Limit::Connections, max: 4, in_use: 4, need: 1 };
        let text = e.to_string();
        assert!(text.contains("worker.max_conns") && text.contains("4 in use of 4"), "{text}");
        let e = EngineError::Connect {
            addr: "10.0.0.1:1".parse().unwrap(),
            lane: 1,
            lanes: 2,
            source: Box::new(e),
        };
        let text = corelink_verbs::chain(&e).to_string();
        assert!(text.starts_with("connect to 10.0.0.1:1 (lane 1 of 2): worker 0:"), "{text}");
    }
}
