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
    /// No size class is large enough.
    #[error("no buffer holds {len} bytes (largest: {largest})")]
    BufferTooLarge {
        /// Bytes asked for.
        len: usize,
        /// The largest buffer there is.
        largest: usize,
    },
}

/// Result of an engine call.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
