//! # corelink-engine
//!
//! The thread-per-core engine of corelink, on top of [`corelink_verbs`] (layers call downward
//! only):
//! - a **control core** owns connection management (listen, accept, connect, QP creation on
//!   the chosen worker's PD and CQ, admission against each worker's limits, disconnects) and
//!   hands finished connections to workers over SPSC rings;
//! - pinned **workers** each own their CQ, QPs, registered buffers ([`Buf`]) and requests, and
//!   busy-poll one fixed-order loop with no locks and no context switches; the application runs
//!   in them as a [`Handler`] (run-to-completion, through its [`Cx`]) or talks to them from its
//!   own threads through a [`Client`];
//! - per-worker [`Metrics`], [`tunables`] in one place, and a graceful shutdown ([`Engine`]).
//!
//! # Examples
//!
//! An engine on the in-process `soft` provider that connects to itself: a [`Client`] on the
//! application's thread connects and sends a message; the worker's handler, which accepted
//! the connection, counts what arrives:
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//! use corelink_engine::verbs::soft::Soft;
//! use corelink_engine::{ConnId, Cx, Engine, Event, Handler, Message, Op, Placement};
//!
//! struct Hello(Arc<AtomicU64>);
//!
//! impl Handler<Soft> for Hello {
//!     fn on_message(&mut self, _cx: &mut Cx<Soft>, _conn: ConnId, msg: &Message<'_>) {
//!         assert_eq!(msg.data, b"hello");
//!         self.0.fetch_add(1, Ordering::Relaxed);
//!     }
//! }
//!
//! let map = corelink_config::parse(
//!     "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"10.98.0.1:0\"",
//! )?;
//! let map = map.validate(&corelink_config::MachineTopology::load()?)?;
//! let got = Arc::new(AtomicU64::new(0));
//! let seen = got.clone();
//! let mut engine = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| Hello(seen.clone()))?;
//! let addr = engine.listen_addr().unwrap();
//! let mut client = engine.client(0)?;
//! client.connect(addr, b"", 7)?;
//! let event = client.wait(std::time::Duration::from_secs(30)).expect("connected");
//! let Event::Connected { conn, .. } = event else { panic!("{event:?}") };
//! // The connection is the client's (its messages and close come to it).
//! let hello = Op::Send { buf: b"hello".to_vec(), imm: None };
//! client.submit(conn, hello, 8).map_err(|(_, e)| e)?;
//! while got.load(Ordering::Relaxed) == 0 {
//!     std::thread::yield_now();
//! }
//! engine.shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use corelink_verbs as verbs;

mod client;
mod control;
mod device;
mod engine;
mod error;
mod handoff;
mod memory;
mod metrics;
mod pool;
mod request;
mod ring;
mod slab;
mod sync;
pub mod tunables;
mod worker;

pub use client::{Client, Event};
pub use control::{PlaceFn, Placement, HEADER, MAX_APP_PRIVATE_DATA};
pub use engine::Engine;
pub use error::{EngineError, Limit, Result};
pub use memory::{Grant, GrantId, Memory};
pub use metrics::{thread_context_switches, ControlMetrics, Metrics, WorkerCounts, OPCODES};
pub use pool::Buf;
pub use request::{CloseReason, ConnId, ConnInfo, Done, Message, Op, OpKind};
pub use worker::{Cx, Handler};

/// Internals that benchmarks and baselines measure directly (not part of the API): the SPSC
/// ring between threads and the registered buffer pool.
#[doc(hidden)]
pub mod bench_support {
    pub use crate::pool::Pool;
    pub use crate::ring::{ring, Consumer, Producer};
}
