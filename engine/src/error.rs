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
