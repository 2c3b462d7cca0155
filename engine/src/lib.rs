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
//! # The contract under faults
//!
//! What the engine promises whatever the wire, the peer or the device does (tested on `soft`
//! under seeded fault plans, `engine/tests/contract_soft.rs`, `faults_soft.rs`,
//! `keepalive_soft.rs`, `early_soft.rs`, and on rxe in the guest batch):
//! - **Every request accepted ends exactly once**, for a handler ([`Handler::on_completion`])
//!   and for a [`Client`] ([`Event::Done`], or [`Event::Refused`] when the worker refuses it
//!   as it takes it): success or an error, never twice, never silently. A request refused at
//!   submission comes back at once with its operation and the reason, and never started.
//! - **The root cause reaches its requester as such**: the request that failed ends with its
//!   own status (`RetryExcErr`, `RnrRetryExcErr`, a protection error...), its connection closes
//!   with [`CloseReason::Error`] of it, and the requests flushed because of that close end with
//!   `WrFlushErr` and name it in [`Done::closed_by`]: consequences, not failures of their own.
//!   A request the peer's side refused (`RemAccessErr`...) is how a dying peer often shows
//!   first (its memory goes before its connections): its connection waits up to
//!   `worker.peer_grace_ms` for the peer's disconnect and then closes with
//!   [`CloseReason::PeerGone`] of the refusal. The other way round, a peer's disconnect
//!   leaves its connection's requests in flight up to as long for the answers the peer sent
//!   before it (an acknowledgement is a success, a refusal names the close), then flushes
//!   the rest.
//! - **A peer that dies is seen in bounded time**, on a busy connection within
//!   (`worker.retry_cnt` + 1) x 4.096 us x 2^`worker.timeout` (about 0.47 s by default), on an
//!   idle one within `worker.keepalive_ms` more (a zero-length write probes it;
//!   [`CloseReason::Unanswered`]).
//! - **A connection's receives are posted before its peer can send** (the worker posts them
//!   on its QPs before the connection manager's exchange), so a peer that sends at once meets
//!   no receiver-not-ready NAK; what arrives before the worker has the connection is delivered
//!   after [`Handler::on_connected`], in order ([`Metrics::early_receives`]).
//! - **Every message that completed at the receiver reaches its handler or client**, before
//!   the connection's close, however it closes.
//! - **Shutdown ends** with requests in flight under any fault: each ends (flushed at worst)
//!   within a grace period, and every connection closes.
//! - **The device's errors are heard**: each worker reads its device context's asynchronous
//!   events ([`Metrics::async_events`]); a QP's fatal error closes its connection, a CQ
//!   overrun or a failed device every connection of the worker
//!   ([`CloseReason::Device`]), and the fatal ones are said on stderr. Completions an overrun
//!   lost never come: what those connections still have posted
//!   [`tunables::UNTRUSTED_FLUSH_WAIT`] later, the worker ends itself, as flushed and naming
//!   the close ([`Metrics::completions_made_up`]), so that those requests end once too.
//!
//! A closed connection stays closed, unless its connect had a reconnect policy
//! ([`Cx::connect_with`], [`Client::connect_with`]): then the worker makes it again, with QPs
//! from its pool, after a backoff, telling the issuer of each step.
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
pub use worker::{Completions, Cx, Handler, On, Reconnect, Redial};

/// Internals that benchmarks and baselines measure directly (not part of the API): the SPSC
/// ring between threads and the registered buffer pool, and the guest counts' tail mark.
#[doc(hidden)]
pub mod bench_support {
    pub use crate::pool::Pool;
    pub use crate::ring::{ring, Consumer, Producer};

    /// A tail mark for `benches/guest-counts.sh`, in a build with the `guest-marks` feature (a
    /// no-op without it): the guest's plugin counts the distinct code run from here to the
    /// next entry into the kernel (from a receive's completion to the answer's doorbell; in
    /// corelink-perf's read_lat and atomic_lat, from the completion to the next request's).
    #[inline(always)]
    pub fn tail_mark() {
        #[cfg(all(feature = "guest-marks", target_arch = "x86_64"))]
        // SAFETY: `xchg cx, cx` exchanges a register with itself: no register, flag or memory
        // changes (the plugin knows it by its bytes, 66 87 c9).
        unsafe {
            std::arch::asm!("xchg cx, cx", options(nomem, nostack, preserves_flags));
        }
    }
}

/// Internals that the fuzz targets (`fuzz/`) drive directly (not part of the API): the engine's
/// private-data header and its reject reasons, through thin wrappers that keep the types
/// crate-private.
#[doc(hidden)]
pub mod fuzz_support {
    use crate::control::header::{self, Header};

    /// A header's fields: group nonce, lane index, lane count, the sender's receive size
    /// (`None`: unknown) and the application's part.
    pub type HeaderFields = (u64, u8, u8, Option<u32>, Vec<u8>);

    /// Bytes a reject's private data carries at most (its prefix included).
    pub const MAX_REJECT: usize = header::MAX_REJECT;
    /// What an engine's reject starts with, before its reason.
    pub const REJECT_PREFIX: &[u8] = header::REJECT_PREFIX;

    /// Parses connection private data as the control core does (`Ok(None)`: a foreign peer's).
    pub fn parse_header(pd: &[u8]) -> Result<Option<HeaderFields>, String> {
        Header::parse(pd).map(|h| h.map(|h| (h.nonce, h.lane, h.lanes, h.recv_size, h.app)))
    }

    /// The wire form of a header with these fields.
    pub fn header_bytes(fields: &HeaderFields) -> Vec<u8> {
        let (nonce, lane, lanes, recv_size, app) = fields.clone();
        Header { nonce, lane, lanes, recv_size, app }.to_bytes()
    }

    /// The private data of a reject saying `why`.
    pub fn reject_data(why: &str) -> Vec<u8> {
        header::reject_data(why)
    }

    /// The reason in a reject's private data (`None`: not an engine's reject).
    pub fn reject_reason(pd: &[u8]) -> Option<String> {
        header::reject_reason(pd)
    }
}
