//! # corelink-engine
//!
//! The thread-per-core engine of corelink, on top of [`corelink_verbs`] (layers call downward
//! only):
//! - a **control core** ([`control`]) owns connection management (listen, accept, connect,
//!   QP creation on the chosen worker's PD and CQ, region descriptors in private data,
//!   disconnects) and hands finished QPs to workers over SPSC [`ring`]s;
//! - pinned **workers** ([`worker`]) each own their CQ, QPs, registered buffer [`pool`] and
//!   requests, and busy-poll one fixed-order loop with no locks and no context switches; the
//!   application runs in them as a [`Handler`] (run-to-completion) or talks to them from its
//!   own threads through a [`Client`];
//! - per-worker [`metrics`], [`tunables`] in one place, and a graceful shutdown ([`Engine`]).

pub use corelink_verbs as verbs;

pub mod client;
pub mod control;
pub mod engine;
pub mod error;
pub mod handoff;
pub mod metrics;
pub mod pool;
pub mod request;
pub mod ring;
pub mod slab;
mod sync;
pub mod tunables;
pub mod worker;

pub use client::Client;
pub use control::Placement;
pub use engine::Engine;
pub use error::{EngineError, Result};
pub use handoff::{ExtCompletion, ExtOp, ExtRequest};
pub use request::{CloseReason, ConnId, ConnInfo, Done, Message, Op, OpKind};
pub use worker::{Cx, Handler};
