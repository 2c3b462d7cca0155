//! The engine's one error type.

/// What went wrong in the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A verbs call failed.
    #[error(transparent)]
    Verbs(#[from] corelink_verbs::Error),
    /// The configuration asks for something the engine cannot do.
    #[error("engine configuration: {0}")]
    Config(String),
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
    NoSuchConnection(crate::request::ConnId),
    /// The connection is closing and takes no new requests.
    #[error("connection {0} is closing")]
    ConnectionClosing(crate::request::ConnId),
    /// The engine is shutting down and takes no new requests.
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// A ring to another thread is full: the request comes back.
    #[error("the {0} ring is full")]
    RingFull(&'static str),
    /// A thread of the engine could not be started or pinned.
    #[error("{what}: {detail}")]
    Thread {
        /// Which thread.
        what: String,
        /// What went wrong.
        detail: String,
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
    QueueFull(crate::request::ConnId),
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
}

/// Result of an engine call.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
