//! # corelink-engine
//!
//! The thread-per-core engine of corelink. Its content arrives with the engine issue:
//! pinned worker cores, each owning its QPs, CQ and registered buffer pools and busy-polling
//! completions without locks; a control core that runs connection setup and hands finished
//! QPs to workers over SPSC rings; resource management (QP pools, multi-QP per peer) and
//! scheduling (reads before writes, request merging, doorbell batching, selective signalling,
//! inline sends, credits).
//!
//! It builds only on [`corelink_verbs`]: layers call downward only.
#![deny(missing_docs)]

pub use corelink_verbs as verbs;

pub mod error;
pub mod metrics;
pub mod pool;
pub mod ring;
mod sync;

pub use error::{EngineError, Result};
