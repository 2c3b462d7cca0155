//! # corelink-rpc
//!
//! RPC over the engine of corelink (layers call downward only: this crate uses
//! `corelink-engine`'s public API and nothing else of it). One [`Endpoint`] per worker,
//! living in the worker's handler ([`RpcHandler`]) and never leaving its thread (it is not
//! `Send`); **sessions** to peers, each one engine connection (made by [`Rpc::connect`],
//! accepted by the server's endpoint); **request types** registered with handlers that read
//! the request in place from the receive buffer and write the response into a registered
//! buffer; **calls** that name a session, a type, the request's bytes, a timeout and a
//! continuation run on the worker with the response (in place) or an [`RpcError`].
//!
//! # Flow control and guarantees
//! - A client session has `credits` slots ([`EndpointConfig::credits`], 32 by default and
//!   never more than the receives the engine keeps posted per connection lane,
//!   `worker.recvs_per_conn`): at most that many requests are on the wire, so the server
//!   always has a receive for each. Calls beyond wait in the endpoint, in order, and go as
//!   responses free slots (backpressure: a call never fails for lack of a credit). The
//!   session's connect carries its credits; a server with fewer receives refuses the session.
//!   (The engine posts a request's receive again in the loop iteration that handled it: after
//!   that iteration's responses go out, or before them once fewer than half of the lane's
//!   receives are left posted, so that a client at full credit, answered at once, finds
//!   receives for its next requests.)
//! - Every call accepted (`call` returned `Ok`) ends exactly once: its response, or
//!   [`RpcError::Timeout`] (the deadline, checked every [`EXPIRE_EVERY`] loop iterations on
//!   the worker's clock, and counted from the first check after the call was made, so that
//!   making a call reads no clock: a call times out no sooner than its timeout, and at most
//!   about two checks' periods later), [`RpcError::SessionClosed`],
//!   [`RpcError::OutcomeUnknown`], [`RpcError::Rejected`] (the handler said no),
//!   [`RpcError::TooLarge`], [`RpcError::NoSuchType`], [`RpcError::PeerBusy`] (the server had
//!   no buffer for the request: it did not run) or [`RpcError::Unanswered`] (it ran, but its
//!   response found no buffer: calling again runs it again). A call that
//!   timed out keeps its slot until its response comes (the request may still hold one of the
//!   server's receives), so its credit is not spent twice.
//! - At most once: each slot's requests carry increasing sequence numbers; the server keeps a
//!   slot's last response until the client's next request on that slot (which acknowledges
//!   it), answers a request seen again (same slot and sequence number) from that response
//!   without running the handler, and drops older ones ([`RpcMetrics::duplicates`],
//!   [`RpcMetrics::stale`]). Across connections too, for a session opened with
//!   [`Rpc::connect_with`]: its server keeps the session's record for
//!   [`EndpointConfig::resume`] after a connection is lost, and the calls in flight go again
//!   on the next connection with their slots and sequence numbers; a server with no record
//!   of the session (restarted) answers them [`RpcError::OutcomeUnknown`] without running
//!   them ([`RpcMetrics::resent`], [`RpcMetrics::resumed`], [`RpcMetrics::lost`]).
//! - Per session, responses come in the order of the calls (one connection, one lane, and a
//!   server that answers in arrival order; packing keeps it, a connection's pack going before
//!   anything later on the connection, the service's own requests included), and
//!   continuations run in that order; a large request (below) is answered once its payload
//!   is read, so small calls made after it may end first; calls of different request classes
//!   (below) may overtake each other, and a merged call ends right after the identical call
//!   it joined.
//!
//! # Wire format
//! Every message is a fixed 28-byte little-endian header ([`wire::Header`]), then the
//! payload. A send carries one message, or several small ones packed back to back (each but
//! the last flagged [`wire::PACKED`]; [`EndpointConfig::pack_max`]).
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 2 | magic, the bytes `RC` ([`wire::MAGIC`]) |
//! | 2 | 1 | version, 1 ([`wire::VERSION`]) |
//! | 3 | 1 | kind: 1 request, 2 response, 3 error ([`wire::Kind`]) |
//! | 4 | 2 | request type ([`ReqType`]) |
//! | 6 | 2 | slot of the client's session |
//! | 8 | 4 | the client's session id (a response echoes it) |
//! | 12 | 8 | sequence number of the slot, from 1 (a response echoes it) |
//! | 20 | 4 | payload length: exactly the bytes after the header |
//! | 24 | 2 | status: 0 in requests and responses; an error's reason ([`wire::Status`]) |
//! | 26 | 2 | flags: bit 0 ([`wire::LARGE`]) the payload is a [`wire::Descriptor`]; bit 1 ([`wire::RESENT`], requests only) sent again after a reconnect; bit 2 ([`wire::PACKED`]) another message follows in the same send; others 0 |
//!
//! An error message's payload is two `u32` arguments (the unknown type; a response's length
//! and the most that fits; the handler's code; for a server without a buffer, [`wire::RAN`]
//! when the request ran and its response found none). [`wire::decode`] refuses every message that is
//! not exactly such a header and payload with a [`Malformed`] reason (never a panic), and
//! [`wire::unpack`] likewise each message of a receive, in order (the first malformed one
//! ends the receive: what follows cannot be framed); the endpoint drops it and counts it
//! ([`RpcMetrics::malformed`]), as it does a message whose
//! slot or session field is not its session's. The connect's private data carries a hello
//! ([`wire::Hello`]: magic, version, credits, a flags byte; 6 bytes, or 14 with a resumable
//! session's key, flag [`wire::RESUME`]).
//!
//! # Large messages
//! A payload that fits in the peer's receive (`worker.recv_size` less the header) goes in the
//! send. A larger one, up to [`EndpointConfig::large_max`] (0, off, by default), goes in a
//! slot of the endpoint's arena (registered memory, [`EndpointConfig::large_slots`] slots of
//! `large_max` bytes, granted read-only to each session's peer), and the send carries its
//! 16-byte [`wire::Descriptor`] (address, key, length) with the [`wire::LARGE`] flag; the
//! receiver reads the payload with one RDMA read into a buffer of its pools (a pool class
//! must hold `large_max` bytes) and hands it to the handler or continuation in place. The
//! receiver reads, rather than the sender writing into memory the receiver granted: the
//! receiver decides when it has a buffer for the payload, no round trip asks for one, and
//! the sender's memory is exposed for reads only. A large request holds its slot until its
//! response comes; a large response until the client's next request on that slot
//! acknowledges it (a client reuses its most recently freed slot first, so that comes soon
//! when it keeps calling). A large call made with every slot out waits (its payload kept in
//! a vector, [`RpcMetrics::slot_waits`]) until a slot is back, and the calls made after it on
//! its session wait behind it; a handler's large response with every slot out is answered
//! [`RpcError::Unanswered`] ([`Response::alloc`] says [`RpcError::LargeSlotsBusy`]). Beyond
//! `large_max`, or with large messages off, a call is refused with [`RpcError::TooLarge`],
//! and a response is answered with it.
//!
//! A session's requests run in the order they were made, large or small: while a large
//! request's payload is read, the requests after it on its session wait (a small one's
//! payload copied out of its receive, [`RpcMetrics::held`]) and run after its handler. Should
//! the connection go first, none of them ran, and each runs when its client sends it again.
//!
//! Limits of this first version: the whole arena is granted to every session's peer (the
//! engine's grant is a registration of its own; one per message would cost a registration
//! each), so a peer could read other sessions' large payloads while they are there; and a
//! large call takes its slot when it is made (its payload is copied in then), so calls
//! waiting for a credit hold slots too.
//!
//! # A service's own requests, and why sessions end
//! A session is an engine connection: [`Rpc::conn`] names it (what `Cx::grant` exposes memory
//! to), and [`Rpc::submit`] puts the service's own one-sided requests on it (reads, writes and
//! atomics on memory the peer granted; not sends, which are the endpoint's), their completions
//! coming to [`Service::on_completion`] with the service's token (at most
//! [`MAX_SERVICE_TOKEN`]). After a session's [`SessionEvent::Closed`],
//! [`Service::on_session_end`] says why ([`SessionEnd`]: the connect's engine error, or the
//! connection's close reason).
//!
//! # Calls from other threads
//! [`handle`] makes a [`Handle`] (`Send`, not `Clone`: one per calling thread) and the
//! [`Inbox`] its worker's [`RpcHandler::with_inbox`] drains: up to [`HANDLE_BATCH`] orders
//! per loop iteration off an SPSC ring (no lock on the worker), each a call made on the
//! endpoint with a continuation that answers on a one-shot channel. [`Handle::call`] blocks
//! (parks) until the answer; [`Handle::call_async`] is a [`CallFuture`], a plain
//! `std::future::Future` woken through any runtime's `Waker` (`rpc/examples/tokio_handle.rs`
//! runs a thousand under tokio). Each copies the request in and the response out.
//!
//! # Typed calls
//! A [`Method`] names a request type and the Rust types of its request and response, encoded
//! with `postcard` (serde's compact binary format). [`Endpoint::register_method`] and
//! [`Rpc::call_method`] encode straight into the registered buffers and decode from the
//! receive buffer in place, on top of the raw path, which they leave as it was; a request or
//! response type may borrow (`type Request<'a> = (u64, &'a [u8])`): its `&[u8]` and `&str`
//! fields point into the receive buffer, with no copy and no allocation.
//! [`Handle::call_method`] and [`Handle::call_method_async`] do the same from other threads
//! (encoding and decoding on the calling thread; their responses own their data).
//!
//! # Service-level scheduling
//! - **Merging** ([`Endpoint::set_mergeable`]): a call of a mergeable type whose session
//!   already has an identical call (same type, same bytes) in flight or waiting for a credit
//!   is not sent; it joins that call's group and ends with its outcome (or by its own
//!   deadline, if sooner), so the server executes the request once and every caller gets the
//!   response ([`RpcMetrics::merged`] counts the calls merged). The group is keyed by
//!   session, type and a hash of the bytes, and compares the bytes themselves; it lasts until
//!   its first call ends, so a later identical call is a new request.
//! - **Priority classes** ([`Endpoint::set_class`]): a type's requests and the responses to
//!   them go in an engine request class (`Cx::submit_as`), so that with the engine's
//!   priorities on an urgent call made after a burst of bulk ones reaches the device, the
//!   server and the answer first.
//!
//! # Load balancing
//! A service with several servers (peers, or a peer's workers: its engine places each
//! session it accepts on one of them), one client session to each, puts those sessions in a
//! **group** ([`Rpc::group`] or [`Endpoint::group`], a [`GroupId`]; members join and leave
//! with [`Rpc::add_member`] and [`Rpc::remove_member`]) and calls the group
//! ([`Rpc::call_group`], [`Rpc::call_method_group`]) instead of a session:
//! - Each call goes to the member with the fewest **outstanding** calls
//!   ([`Endpoint::outstanding`]: requests on the wire, timed-out ones still holding their
//!   credit, and calls waiting for a credit), ties broken round robin (the scan starts after
//!   the member picked last), so equal servers get equal shares and a slow one, whose calls
//!   stay outstanding longer, gets fewer. The pick looks at each member once and allocates
//!   nothing; from there the call is an ordinary call on that session (its credits, order,
//!   merging and request class are the session's) and `call_group` says which session it
//!   went to.
//! - Members are client sessions that are up (connecting or open). A session that closes
//!   (this side's [`Rpc::close`]) or fails (its connect, the connection going down, or a send
//!   that finds the connection closing: a peer that went away) leaves every group at once,
//!   before its calls end with [`RpcError::SessionClosed`], so no new call goes to it, none
//!   made from those calls' continuations either (a session whose calls fail at once would
//!   otherwise look the least loaded and draw every call). A server reached again is a new
//!   session, added back with [`Rpc::add_member`].
//! - A call on a group with no member up is refused at once with [`RpcError::NoServer`] (the
//!   continuation dropped unrun, as for `call`'s other refusals; [`RpcMetrics::no_server`]).
//! - [`Endpoint::members`] shows each member's picks ([`Member::picks`]: calls placed on it
//!   since it joined); [`RpcMetrics::balanced`] counts the calls placed through groups.
//!
//! - From other threads: [`Handle::group`], [`Handle::add_member`],
//!   [`Handle::remove_member`], [`Handle::call_group`] and [`Handle::call_group_async`] do the
//!   same on the handle's worker.
//!
//! # Examples
//!
//! One worker on the in-process `soft` provider that opens a session to itself, serves an
//! echo type and calls it:
//!
//! ```
//! use std::sync::mpsc::{channel, Sender};
//! use std::time::Duration;
//! use corelink_engine::verbs::soft::Soft;
//! use corelink_engine::{Engine, Placement};
//! use corelink_rpc::{Endpoint, EndpointConfig, ReqType, Rpc, RpcHandler, Service};
//!
//! const ECHO: ReqType = ReqType(1);
//!
//! struct Caller { addr: std::net::SocketAddr, started: bool, told: Sender<Vec<u8>> }
//!
//! impl Service<Soft> for Caller {
//!     fn poll(&mut self, rpc: &mut Rpc<'_, Soft>) {
//!         if std::mem::replace(&mut self.started, true) {
//!             return;
//!         }
//!         let session = rpc.connect(self.addr).unwrap();
//!         let told = self.told.clone();
//!         rpc.call(session, ECHO, b"hello", Duration::from_secs(30), move |_, answer| {
//!             told.send(answer.unwrap().to_vec()).unwrap();
//!         })
//!         .unwrap();
//!     }
//! }
//!
//! let addr: std::net::SocketAddr = "10.98.12.1:7000".parse()?;
//! let map = corelink_config::parse(&format!(
//!     "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{addr}\""
//! ))?
//! .validate(&corelink_config::MachineTopology::load()?)?;
//! let res = map.map.worker.clone();
//! let (tx, rx) = channel();
//! let engine = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| {
//!     let mut endpoint = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
//!     endpoint.register(ECHO, |req, resp| {
//!         resp.write(req.data).map_err(|_| corelink_rpc::Reject(1))
//!     }).unwrap();
//!     RpcHandler::new(endpoint, Caller { addr, started: false, told: tx.clone() })
//! })?;
//! assert_eq!(rx.recv_timeout(Duration::from_secs(30))?, b"hello");
//! engine.shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod balance;
mod config;
mod endpoint;
mod error;
mod handle;
mod handler;
mod ids;
mod large;
mod metrics;
mod service;
mod typed;
pub mod wire;

pub use balance::Member;
pub use config::{
    recvs_per_session, EndpointConfig, DEFAULT_CREDITS, DEFAULT_PACK_MAX, DEFAULT_RESUME,
    EXPIRE_EVERY, HANDLE_BATCH, PACK_CONNS,
};
pub use endpoint::{Continuation, Endpoint, Rpc, MAX_SERVICE_TOKEN};
pub use error::{Malformed, Result, RpcError};
pub use handle::{block_on, handle, CallFuture, Handle, Inbox};
pub use handler::RpcHandler;
pub use ids::{CallId, GroupId, ReqType, SessionId};
pub use metrics::RpcMetrics;
pub use service::{Reject, Request, Response, Serve, Service, SessionEnd, SessionEvent};
pub use typed::{decode, encode, encoded_len, Method, MethodFuture, UNDECODABLE};
