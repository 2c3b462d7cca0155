//! The endpoint: one per worker, on its thread. Here its tables (sessions over engine
//! connections, calls with their deadlines, request handlers) and the engine's events; the
//! client side (calls, credits, deadlines, answers) is in `client.rs`, the server side
//! (requests, handlers, stored answers) in `server.rs`.

mod client;
mod group;
mod packer;
mod resume;
mod server;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use corelink_config::WorkerResources;
use corelink_engine::verbs::{Provider, RemoteRegion};
use corelink_engine::{Buf, CloseReason, ConnId, ConnInfo, Cx, Done, Op};

use crate::balance::Group;
use crate::config::{recvs_per_session, EndpointConfig, PACK_CONNS};
use crate::error::{Malformed, Result, RpcError};
use crate::ids::{CallId, GroupId, ReqType, SessionId, SlotMap};
use crate::large::{Arena, ArenaSlot};
use crate::metrics::RpcMetrics;
use crate::service::{Reject, Request, Response, SessionEvent};
use crate::wire::{self, Kind, Status, HEADER};

/// What runs when a call ends: on the worker, with the response's payload (in place in the
/// receive buffer) or why there is none.
pub type Continuation<P> = Box<dyn FnOnce(&mut Rpc<'_, P>, Result<&[u8], RpcError>)>;

/// An answer to send: its buffer (header room, then the payload or a large one's
/// descriptor), its status, and a large payload's arena slot.
type Reply<P> = (Buf<P>, Status, Option<ArenaSlot>);

/// A registered request handler.
type HandlerFn<P> = Box<dyn FnMut(&Request<'_>, &mut Response<'_, P>) -> Result<(), Reject>>;

/// Bits 62 and 63 of an engine token: what the request is. 0: a call's request (the rest is
/// its `CallId`); the others name a session's slot (bits 0..16 the slot, 16..48 the session,
/// 48..62 the low bits of the slot's sequence number).
const TOKEN_KIND: u64 = 3 << 62;
/// A server's answer.
const RESPONSE_TOKEN: u64 = 2 << 62;
/// A server's read of a large request's payload.
const SERVER_READ: u64 = 1 << 62;
/// A client's read of a large response's payload.
const CLIENT_READ: u64 = 3 << 62;
/// The sequence bits a slot's token keeps (enough to tell its slot's last from older).
const TOKEN_SEQ_MASK: u64 = 0x3fff;
/// Bit 61 with kind 0: a request the service made itself ([`Rpc::submit`]); the bits below
/// are its own token.
const SERVICE_TOKEN: u64 = 1 << 61;
/// The tokens a service's own requests may carry (bits 0..61).
pub const MAX_SERVICE_TOKEN: u64 = SERVICE_TOKEN - 1;

/// Kind 0, bit 60: a send of packed messages (`packer`); its completion frees its buffer.
const PACKED_TOKEN: u64 = 1 << 60;

// (A call's token, its `CallId`, stays below the packed send's and the service's bits.)
const _: () = assert!(((CallId::GENERATION_MASK as u64) << 32 | u32::MAX as u64) < PACKED_TOKEN);

/// The token of a request of kind `kind` for `session`'s `slot` at sequence number `seq`.
fn slot_token(kind: u64, session: SessionId, slot: u16, seq: u64) -> u64 {
    kind | (seq & TOKEN_SEQ_MASK) << 48 | u64::from(session.to_wire()) << 16 | u64::from(slot)
}

/// The session, slot and sequence bits of a slot's token.
fn token_slot(token: u64) -> (SessionId, u16, u64) {
    (SessionId::from_wire((token >> 16) as u32), token as u16, (token >> 48) & TOKEN_SEQ_MASK)
}

/// An endpoint and the worker's `Cx`, as services and continuations use them: make calls,
/// open and close sessions, reach the engine.
pub struct Rpc<'a, P: Provider> {
    pub(crate) ep: &'a mut Endpoint<P>,
    pub(crate) cx: &'a mut Cx<P>,
}

impl<P: Provider> std::fmt::Debug for Rpc<'_, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rpc").field("endpoint", &self.ep).finish()
    }
}

impl<P: Provider> Rpc<'_, P> {
    /// Opens a session to the endpoint at `addr` (an engine connection). Calls on it may be
    /// made at once: they wait until it is open. The service hears
    /// [`SessionEvent::Connected`], or [`SessionEvent::Closed`] if the connect fails.
    pub fn connect(&mut self, addr: SocketAddr) -> Result<SessionId> {
        self.ep.connect(self.cx, addr, None)
    }

    /// [`Rpc::connect`] with a reconnect policy: when the session's connection closes for any
    /// reason but this side's [`Rpc::close`] (or the engine's shutdown), the engine connects
    /// again under `policy` ([`corelink_engine::Cx::connect_with`]) and the session carries
    /// on there. The service hears [`SessionEvent::Reconnecting`] at the close, then
    /// [`SessionEvent::Connected`] again, or [`SessionEvent::Closed`] once the policy's tries
    /// are spent. The session is resumable: its hello carries a key, the same on every
    /// connection, by which the server keeps the session's record (each slot's last sequence
    /// number and response) for [`EndpointConfig::resume`] after a connection is lost. On
    /// the new connection the calls that were in flight are sent again, on their slots with
    /// their sequence numbers: a request that already ran is answered from the record, one
    /// that did not runs, so each runs at most once; a server with no record of the session
    /// (restarted, or past its resume time) answers them [`RpcError::OutcomeUnknown`]. The
    /// calls waiting for a credit, and those made meanwhile, wait for the new connection (or
    /// their deadline). The record is the worker's that served the session: a reconnection
    /// the server's engine places on another worker finds none. The session leaves its
    /// groups while suspended and joins them again when it reconnects.
    pub fn connect_with(
        &mut self,
        addr: SocketAddr,
        policy: corelink_engine::Reconnect,
    ) -> Result<SessionId> {
        self.ep.connect(self.cx, addr, Some(policy))
    }

    /// Calls `ty` on `session` with `request`; `then` runs on this worker exactly once, with
    /// the response or why there is none, by `timeout` at the latest. A call beyond the
    /// session's credits waits in the endpoint for one. Refused here (and `then` dropped
    /// unrun) when the session is not open or connecting, the request cannot fit in one
    /// message, or the call table or the pools are full.
    ///
    /// Allocation: the request is copied into a registered buffer from the worker's pools,
    /// and `then` is boxed; a continuation that captures nothing (a function, or a closure
    /// without captures) is zero-sized and its box allocates nothing, so such calls are
    /// allocation-free in steady state (`rpc/tests/hot_path_alloc_soft.rs`); one that
    /// captures costs one small allocation per call.
    pub fn call(
        &mut self,
        session: SessionId,
        ty: ReqType,
        request: &[u8],
        timeout: Duration,
        then: impl FnOnce(&mut Rpc<'_, P>, Result<&[u8], RpcError>) + 'static,
    ) -> Result<CallId> {
        let fill = |b: &mut [u8]| b.copy_from_slice(request);
        let then = Box::new(then);
        let ask = Ask { session, ty, len: request.len(), timeout };
        self.ep.call_with(self.cx, ask, fill, then).map_err(|(e, _)| e)
    }

    /// Calls `ty` with `request` on the member of `group` with the fewest outstanding calls
    /// (in flight and waiting for a credit; ties round robin), as [`Rpc::call`] on that
    /// session: `then` runs exactly once, merging and request classes apply per session.
    /// Returns the session it went to and the call. Refused here (and `then` dropped unrun)
    /// with [`RpcError::NoServer`] when no member is up, [`RpcError::NoSuchGroup`] for an id
    /// not of this endpoint, or as [`Rpc::call`] refuses on the member picked (the pick is
    /// then not counted). The pick looks at each member once and allocates nothing.
    ///
    /// # Examples
    ///
    /// One worker opens three sessions to itself (three servers, as far as the group can
    /// tell), groups them and calls the group nine times at once: each session gets three.
    ///
    /// ```
    /// use std::sync::mpsc::{channel, Sender};
    /// use std::time::Duration;
    /// use corelink_engine::verbs::soft::Soft;
    /// use corelink_engine::{Engine, Placement};
    /// use corelink_rpc::{Endpoint, EndpointConfig, ReqType, Rpc, RpcHandler, Service};
    ///
    /// const ECHO: ReqType = ReqType(1);
    ///
    /// struct Caller { addr: std::net::SocketAddr, started: bool, told: Sender<Vec<u64>> }
    ///
    /// impl Service<Soft> for Caller {
    ///     fn poll(&mut self, rpc: &mut Rpc<'_, Soft>) {
    ///         if std::mem::replace(&mut self.started, true) {
    ///             return;
    ///         }
    ///         let servers: Vec<_> = (0..3).map(|_| rpc.connect(self.addr).unwrap()).collect();
    ///         let group = rpc.group(&servers).unwrap();
    ///         for i in 0..9u8 {
    ///             let told = self.told.clone();
    ///             rpc.call_group(group, ECHO, &[i], Duration::from_secs(30), move |rpc, r| {
    ///                 assert_eq!(r.unwrap(), [i]);
    ///                 if i == 8 {
    ///                     let m = rpc.endpoint().members(group).unwrap();
    ///                     told.send(m.iter().map(|m| m.picks()).collect()).unwrap();
    ///                 }
    ///             })
    ///             .unwrap();
    ///         }
    ///     }
    /// }
    ///
    /// let addr: std::net::SocketAddr = "10.98.12.3:7000".parse()?;
    /// let map = corelink_config::parse(&format!(
    ///     "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{addr}\""
    /// ))?
    /// .validate(&corelink_config::MachineTopology::load()?)?;
    /// let res = map.map.worker.clone();
    /// let (tx, rx) = channel();
    /// let engine = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| {
    ///     let mut endpoint = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
    ///     endpoint.register(ECHO, |req, resp| {
    ///         resp.write(req.data).map_err(|_| corelink_rpc::Reject(1))
    ///     }).unwrap();
    ///     RpcHandler::new(endpoint, Caller { addr, started: false, told: tx.clone() })
    /// })?;
    /// assert_eq!(rx.recv_timeout(Duration::from_secs(30))?, [3, 3, 3]);
    /// engine.shutdown()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_group(
        &mut self,
        group: GroupId,
        ty: ReqType,
        request: &[u8],
        timeout: Duration,
        then: impl FnOnce(&mut Rpc<'_, P>, Result<&[u8], RpcError>) + 'static,
    ) -> Result<(SessionId, CallId)> {
        let fill = |b: &mut [u8]| b.copy_from_slice(request);
        let then = Box::new(then);
        let ask = GroupAsk { group, ty, len: request.len(), timeout };
        self.ep.call_group_with(self.cx, ask, fill, then).map_err(|(e, _)| e)
    }

    /// A group of `members` to balance calls across (as [`Endpoint::group`]).
    pub fn group(&mut self, members: &[SessionId]) -> Result<GroupId> {
        self.ep.group(members)
    }

    /// Adds `session` to `group` (as [`Endpoint::add_member`]).
    pub fn add_member(&mut self, group: GroupId, session: SessionId) -> Result<bool> {
        self.ep.add_member(group, session)
    }

    /// Takes `session` out of `group` (as [`Endpoint::remove_member`]).
    pub fn remove_member(&mut self, group: GroupId, session: SessionId) -> Result<bool> {
        self.ep.remove_member(group, session)
    }

    /// The engine connection under `session` (while it has one): what `Cx::grant` exposes
    /// memory to, and what the session's peer is on the engine.
    pub fn conn(&self, session: SessionId) -> Option<ConnId> {
        self.ep.session(session)?.conn
    }

    /// Submits one of the service's own requests (a one-sided read, write or atomic, say on
    /// memory the peer granted) on `session`'s connection, through the engine's scheduler
    /// (`Cx::submit`); its completion goes to [`crate::Service::on_completion`] with `token`
    /// (at most [`MAX_SERVICE_TOKEN`]). A send is refused: messages on a session are the
    /// endpoint's. Refused: the request back, with why.
    #[allow(clippy::result_large_err)]
    pub fn submit(
        &mut self,
        session: SessionId,
        op: Op<Buf<P>>,
        token: u64,
    ) -> std::result::Result<(), (Op<Buf<P>>, RpcError)> {
        if token > MAX_SERVICE_TOKEN {
            return Err((op, RpcError::ServiceToken { token, max: MAX_SERVICE_TOKEN }));
        }
        if matches!(op, Op::Send { .. }) {
            return Err((op, RpcError::SendOnSession(session)));
        }
        let Some(conn) = self.conn(session) else {
            return Err((op, self.ep.gone(session)));
        };
        // (after the session's messages of this pass waiting in a pack: the order they came)
        self.ep.send_pack_of(self.cx, conn);
        self.cx.submit(conn, op, SERVICE_TOKEN | token).map_err(|(op, e)| (op, RpcError::Engine(e)))
    }

    /// Closes `session`: its calls end with [`RpcError::SessionClosed`] (those in flight once
    /// the connection is down).
    pub fn close(&mut self, session: SessionId) -> Result<()> {
        self.ep.close(self.cx, session)
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint<P> {
        self.ep
    }

    /// The worker's engine context (buffers, timers, metrics, other requests).
    pub fn cx(&mut self) -> &mut Cx<P> {
        self.cx
    }
}

/// An RPC endpoint: a worker's sessions, calls and request handlers. It lives in the worker's
/// handler ([`crate::RpcHandler`]) and never leaves the worker's thread (it is not `Send`):
///
/// ```compile_fail,E0277
/// fn is_send<T: Send>() {}
/// is_send::<corelink_rpc::Endpoint<corelink_engine::verbs::soft::Soft>>();
/// ```
pub struct Endpoint<P: Provider> {
    cfg: EndpointConfig,
    /// Receives a connection keeps posted per lane: the most credits a client may ask for.
    recvs: u32,
    sessions: Vec<SessionEntry<P>>,
    free_sessions: Vec<u16>,
    by_conn: SlotMap<ConnId, SessionId>,
    calls: Vec<CallEntry<P>>,
    free_calls: Vec<u32>,
    live_calls: usize,
    /// `(deadline, call)`, soonest first; entries of calls that ended stay until they come up
    /// or the heap is compacted (when it reaches twice `max_calls`).
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Calls made since the deadlines were last looked at, with their timeouts: a call reads
    /// no clock; the next look dates them (and drops those that already ended).
    fresh: Vec<(u64, Duration)>,
    /// Loop iterations until the deadlines are looked at again (every `EXPIRE_EVERY`).
    expire_in: u32,
    handlers: Vec<Option<HandlerFn<P>>>,
    /// Per request type: whether identical calls in flight merge (`Endpoint::set_mergeable`).
    mergeable: Vec<bool>,
    /// Per request type: the engine's request class its messages go in
    /// (`Endpoint::set_class`; none: the sends' default class).
    classes: Vec<Option<u8>>,
    /// Merge groups: calls of a mergeable type in flight or waiting, by session, type and
    /// the request's hash.
    merges: HashMap<(SessionId, ReqType, u64), MergeGroup>,
    /// The vectors merging reuses (none allocated once warm).
    merging: Merging<P>,
    /// Registered on first need when large messages are on (`EndpointConfig::large_max`).
    arena: Option<Arena<P>>,
    /// Groups of client sessions that calls are balanced across, by `GroupId` (never
    /// removed; at most `max_sessions`).
    groups: Vec<Group>,
    /// Server sessions by their resumable key (their clients' hellos).
    by_key: HashMap<u64, SessionId>,
    /// Client sessions that are resumable (their requests' buffers are kept until answered:
    /// with none, a request's completion looks nothing up).
    resumable: usize,
    /// Server sessions whose connection was lost, with when, oldest first: each ends once
    /// `EndpointConfig::resume` has passed unless its client came back (entries of sessions
    /// that did are skipped).
    parked: VecDeque<(Instant, SessionId)>,
    /// Server sessions that ended with no connection to close (a parked one's record
    /// expired, or a new session with its key superseded it), for the service to hear
    /// (`take_ended`).
    ended: Vec<(SessionId, CloseReason)>,
    /// Client sessions whose next waiting call waits for an arena slot (looked at each pass
    /// once one is free).
    want_slot: Vec<SessionId>,
    /// The payloads of large calls made while no arena slot was free (kept out of `Call`,
    /// which every call moves): each waits in its session's queue until a slot is, then it is
    /// copied in (`Endpoint::slot_freed`); those of calls that ended meanwhile are dropped.
    unslotted: Vec<(CallId, Box<[u8]>)>,
    /// Small messages waiting for the end of the pass, to go packed.
    packer: packer::Packer<Buf<P>>,
    /// A sent request's buffer, for the next call's request (a buffer of the worker's pools
    /// either way: this one saves the pool a round trip per call).
    spare: Option<Buf<P>>,
    metrics: RpcMetrics,
    _thread_bound: PhantomData<Rc<()>>,
}

impl<P: Provider> std::fmt::Debug for Endpoint<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("sessions", &self.by_conn.len())
            .field("calls", &self.live_calls)
            .field("groups", &self.groups.len())
            .field("metrics", &self.metrics)
            .finish()
    }
}

struct SessionEntry<P: Provider> {
    generation: u16,
    session: Option<Session<P>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Connecting,
    Open,
    /// Closed by this side, or its connection found closing (the peer went away): the
    /// connection is going down, and the session's calls end when it is down.
    Closing,
}

struct Session<P: Provider> {
    conn: Option<ConnId>,
    phase: Phase,
    /// Payload bytes a message to the peer may carry (its receive size less the header).
    peer_max: usize,
    /// The endpoint's arena as this session's peer addresses it (a read-only grant), when
    /// large messages are on.
    region: Option<RemoteRegion>,
    /// A client's slots (empty on a server session).
    slots: Vec<ClientSlot>,
    free_slots: Vec<u16>,
    /// Calls waiting for a credit, oldest first (ids of calls that ended meanwhile are
    /// skipped).
    waiting: VecDeque<CallId>,
    /// The live calls in `waiting` (those that timed out there are not).
    queued: usize,
    /// A server's slots (empty on a client session).
    served: Vec<ServedSlot<P>>,
    /// A server's requests that wait to run in the session's order, oldest first: while a
    /// large request's payload is being read, it and every request after it are here.
    held: VecDeque<server::Held<P>>,
    /// Opened with a reconnect policy ([`Rpc::connect_with`]): a close the peer or the
    /// connection caused suspends it until the engine has made the connection again.
    redial: bool,
    /// The groups it left when it was suspended, joined again when it reconnects.
    rejoin: Vec<GroupId>,
    /// A resumable session's key: a client's, sent in each connect's hello (with a
    /// reconnect policy); a server's, from its client's hello (when records are kept).
    key: Option<u64>,
    /// A server session whose connection was lost: when, and why (it waits for its client).
    lost: Option<(Instant, CloseReason)>,
}

impl<P: Provider> Session<P> {
    /// Bytes one send to the peer may carry: its receive (the header and `peer_max`).
    #[inline]
    fn room(&self) -> usize {
        self.peer_max + HEADER
    }

    /// Frees client slot `slot` (its credit back): what it was used for (`Free`: nothing,
    /// or no such slot).
    #[inline(always)]
    fn free_slot(&mut self, slot: u16) -> SlotUse {
        match self.slots.get_mut(usize::from(slot)) {
            Some(cs) if cs.used != SlotUse::Free => {
                let used = std::mem::replace(&mut cs.used, SlotUse::Free);
                cs.arena = None;
                cs.reading = false;
                self.free_slots.push(slot);
                used
            }
            _ => SlotUse::Free,
        }
    }

    /// Its calls in flight (on a slot), in slot order.
    fn in_flight(&self) -> impl Iterator<Item = CallId> + '_ {
        self.slots.iter().filter_map(|cs| match cs.used {
            SlotUse::Call(c) => Some(c),
            _ => None,
        })
    }
}

/// A client session's `n` slots, all free (popped from the back: slot 0 goes first).
fn all_free(n: usize) -> Vec<u16> {
    (0..n as u16).rev().collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotUse {
    Free,
    Call(CallId),
    /// Its call timed out; the slot is held until the response comes (the credit stays spent
    /// until then: the request may still be in the server's receive queue).
    Abandoned,
}

struct ClientSlot {
    seq: u64,
    used: SlotUse,
    /// A large request's payload, held until its response comes.
    arena: Option<ArenaSlot>,
    /// A large response's payload is being read.
    reading: bool,
}

impl ClientSlot {
    /// Call `id` takes the slot (with a large request's payload): its next sequence number.
    #[inline]
    fn occupy(&mut self, id: CallId, arena: Option<ArenaSlot>) -> u64 {
        self.seq += 1;
        self.used = SlotUse::Call(id);
        self.arena = arena;
        self.seq
    }
}

struct ServedSlot<P: Provider> {
    /// The last request's sequence number executed (0: none yet).
    seq: u64,
    /// Its response, kept until the client's next request on the slot acknowledges it (none
    /// while its send is on the device).
    stored: Option<Buf<P>>,
    /// The request came again while its response's send was on the device: that response
    /// goes again when its buffer is back.
    resend: bool,
    /// A large response's payload, held until the client acknowledges the response.
    arena: Option<ArenaSlot>,
    /// A large request's payload is being read (the request waits in the session's `held`).
    reading: bool,
    /// The session has seen a request on the slot: it knows what ran there (a request sent
    /// again after a reconnect to a slot it does not know may have run: `Status::Lost`).
    known: bool,
}

impl<P: Provider> ServedSlot<P> {
    /// A new request, sequence number `seq`, is the slot's (it acknowledges the last one's
    /// response: nothing of it is kept).
    fn begin(&mut self, seq: u64) {
        self.seq = seq;
        self.stored = None;
        self.resend = false;
        self.arena = None;
        self.reading = false;
    }
}

/// What a call asks, before it is made: its session, type, payload length and timeout.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ask {
    pub(crate) session: SessionId,
    pub(crate) ty: ReqType,
    /// Payload bytes.
    pub(crate) len: usize,
    pub(crate) timeout: Duration,
}

/// What a call on a group asks: as an [`Ask`], with the group in place of the session (the
/// session is the group's pick).
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupAsk {
    pub(crate) group: GroupId,
    pub(crate) ty: ReqType,
    /// Payload bytes.
    pub(crate) len: usize,
    pub(crate) timeout: Duration,
}

struct Call<P: Provider> {
    session: SessionId,
    ty: ReqType,
    /// It leads a merge group (the request's hash: the group's key with session and type).
    group: Option<u64>,
    slot: Option<u16>,
    /// The request (header and payload, or a large one's descriptor) until it goes.
    request: Option<Buf<P>>,
    /// A large request's payload (until it goes; then its slot holds it).
    arena: Option<ArenaSlot>,
    /// Payload bytes.
    len: u32,
    then: Continuation<P>,
}

/// What merging reuses from call to call, so that once warm it allocates nothing: the bytes
/// of the request being looked at, the vectors of groups that ended, and the calls a leader's
/// end takes with it.
struct Merging<P: Provider> {
    bytes: Vec<u8>,
    spare: Vec<MergeGroup>,
    ended: Vec<Call<P>>,
}

impl<P: Provider> Merging<P> {
    fn new() -> Self {
        Merging { bytes: Vec::new(), spare: Vec::new(), ended: Vec::new() }
    }

    /// An empty group led by `leader` (with a spare group's vectors, if any).
    fn spare_group(&mut self, leader: CallId) -> MergeGroup {
        let (bytes, followers) =
            self.spare.pop().map_or_else(Default::default, |g| (g.bytes, g.followers));
        MergeGroup { leader, bytes, followers }
    }

    /// Keeps an ended group's vectors for the next group.
    fn recycle(&mut self, mut g: MergeGroup) {
        g.bytes.clear();
        g.followers.clear();
        self.spare.push(g);
    }
}

/// A call of a mergeable type and the identical calls merged with it since it was made.
struct MergeGroup {
    leader: CallId,
    /// The request's bytes (identical calls have the same; a hash match with other bytes
    /// goes on its own).
    bytes: Vec<u8>,
    followers: Vec<CallId>,
}

struct CallEntry<P: Provider> {
    generation: u32,
    call: Option<Call<P>>,
}

impl<P: Provider> Endpoint<P> {
    /// An endpoint for a worker with resources `res` (the core map's `worker` table), with
    /// `cfg` checked against them.
    pub fn new(cfg: EndpointConfig, res: &WorkerResources) -> Result<Self> {
        cfg.check(res)?;
        let sessions = usize::from(cfg.max_sessions);
        let calls = cfg.max_calls as usize;
        Ok(Endpoint {
            recvs: recvs_per_session(res),
            sessions: Vec::with_capacity(sessions),
            free_sessions: Vec::with_capacity(sessions),
            by_conn: SlotMap::with_capacity(sessions),
            calls: Vec::with_capacity(calls),
            free_calls: Vec::with_capacity(calls),
            live_calls: 0,
            deadlines: BinaryHeap::with_capacity(2 * calls + 1),
            fresh: Vec::with_capacity(2 * calls + 1),
            expire_in: 0,
            handlers: (0..cfg.max_types).map(|_| None).collect(),
            mergeable: vec![false; usize::from(cfg.max_types)],
            classes: vec![None; usize::from(cfg.max_types)],
            merges: HashMap::new(),
            merging: Merging::new(),
            arena: None,
            groups: Vec::new(),
            by_key: HashMap::new(),
            resumable: 0,
            parked: VecDeque::new(),
            ended: Vec::new(),
            want_slot: Vec::new(),
            unslotted: Vec::new(),
            spare: None,
            packer: packer::Packer::new(
                cfg.pack_max,
                PACK_CONNS,
                res.pools.iter().map(|c| c.size).max().unwrap_or(0),
                res.max_conns as usize,
            ),
            metrics: RpcMetrics::default(),
            cfg,
            _thread_bound: PhantomData,
        })
    }

    /// Registers `handler` for requests of type `ty`: it gets each request in place and writes
    /// its response into a registered buffer ([`Response::alloc`]), or rejects it.
    pub fn register(
        &mut self,
        ty: ReqType,
        handler: impl FnMut(&Request<'_>, &mut Response<'_, P>) -> Result<(), Reject> + 'static,
    ) -> Result<()> {
        match self.handlers.get_mut(usize::from(ty.0)) {
            Some(h @ None) => {
                *h = Some(Box::new(handler));
                Ok(())
            }
            _ => Err(RpcError::BadType { ty }),
        }
    }

    /// Marks request type `ty` mergeable on this endpoint's calls: a call of it whose session
    /// already has an identical one (same type and bytes) in flight or waiting for a credit
    /// is not sent; it ends with that call's outcome ([`RpcMetrics::merged`]), or by its own
    /// deadline if that comes first. The server executes the request once. For requests
    /// whose answer does not depend on how many times they are asked (reads), not for ones
    /// with effects each caller expects. A mergeable call copies its request once more (the
    /// group keeps it to compare), and allocates its group's entry.
    ///
    /// # Examples
    ///
    /// ```
    /// # use corelink_rpc::{Endpoint, EndpointConfig, ReqType};
    /// # let res = corelink_config::WorkerResources::default();
    /// let mut ep = Endpoint::<corelink_engine::verbs::soft::Soft>::new(
    ///     EndpointConfig::for_worker(&res), &res)?;
    /// ep.set_mergeable(ReqType(5), true)?;
    /// assert!(ep.set_mergeable(ReqType(9999), true).is_err()); // beyond max_types
    /// # Ok::<(), corelink_rpc::RpcError>(())
    /// ```
    pub fn set_mergeable(&mut self, ty: ReqType, mergeable: bool) -> Result<()> {
        let m = self.mergeable.get_mut(usize::from(ty.0)).ok_or(RpcError::BadType { ty })?;
        *m = mergeable;
        Ok(())
    }

    /// Puts request type `ty`'s messages (this endpoint's requests of it, and its responses
    /// to them) in the engine's request class `class` (`Cx::submit_as`: 0 goes first; at most
    /// `corelink_engine::tunables::CLASSES` - 1); `None`: the sends' default class. With the
    /// engine's priorities on, a message of a lower class submitted in the same loop
    /// iteration goes to the device first, so per session calls of different classes may
    /// end out of the order they were made (within a class the order holds).
    ///
    /// # Examples
    ///
    /// ```
    /// # use corelink_rpc::{Endpoint, EndpointConfig, ReqType};
    /// # let res = corelink_config::WorkerResources::default();
    /// let mut ep = Endpoint::<corelink_engine::verbs::soft::Soft>::new(
    ///     EndpointConfig::for_worker(&res), &res)?;
    /// ep.set_class(ReqType(1), Some(0))?; // urgent
    /// ep.set_class(ReqType(2), Some(3))?; // bulk
    /// assert!(ep.set_class(ReqType(3), Some(200)).is_err());
    /// assert_eq!(ep.class(ReqType(2)), Some(3));
    /// # Ok::<(), corelink_rpc::RpcError>(())
    /// ```
    pub fn set_class(&mut self, ty: ReqType, class: Option<u8>) -> Result<()> {
        let classes = corelink_engine::tunables::CLASSES;
        if let Some(c) = class.filter(|&c| usize::from(c) >= classes) {
            return Err(RpcError::NoSuchClass { class: c, classes });
        }
        let slot = self.classes.get_mut(usize::from(ty.0)).ok_or(RpcError::BadType { ty })?;
        *slot = class;
        Ok(())
    }

    /// The class request type `ty`'s messages go in, if one was set.
    pub fn class(&self, ty: ReqType) -> Option<u8> {
        self.classes.get(usize::from(ty.0)).copied().flatten()
    }

    /// Sends `buf` (a message of type `ty`) on `conn` in `ty`'s class, if it has one.
    #[inline(always)]
    fn send_typed(
        &self,
        cx: &mut Cx<P>,
        conn: ConnId,
        ty: ReqType,
        buf: Buf<P>,
        token: u64,
    ) -> Result<(), (corelink_engine::Op<Buf<P>>, corelink_engine::EngineError)> {
        match self.class(ty) {
            Some(class) => {
                cx.submit_as(conn, corelink_engine::Op::Send { buf, imm: None }, token, class)
            }
            None => cx.send(conn, buf, None, token),
        }
    }

    /// The settings.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// The counters so far.
    pub fn metrics(&self) -> &RpcMetrics {
        &self.metrics
    }

    /// Calls in flight and waiting.
    pub fn calls(&self) -> usize {
        self.live_calls
    }

    /// Requests of client session `session` on the wire (credits spent), if it exists.
    pub fn in_flight(&self, session: SessionId) -> Option<usize> {
        let s = self.session(session)?;
        Some(s.slots.len() - s.free_slots.len())
    }

    /// Calls of client session `session` waiting for a credit, if it exists (ended ones still
    /// queued included).
    pub fn waiting(&self, session: SessionId) -> Option<usize> {
        Some(self.session(session)?.waiting.len())
    }

    /// Deadline entries held: one per live call, and those of ended calls not yet dropped
    /// (at most twice [`EndpointConfig::max_calls`] and one).
    pub fn deadlines_held(&self) -> usize {
        self.deadlines.len() + self.fresh.len()
    }

    /// Open sessions (client and server).
    pub fn sessions(&self) -> usize {
        self.by_conn.len()
    }

    fn session(&self, id: SessionId) -> Option<&Session<P>> {
        let e = self.sessions.get(id.index())?;
        (e.generation == id.generation()).then_some(())?;
        e.session.as_ref()
    }

    fn session_mut(&mut self, id: SessionId) -> Option<&mut Session<P>> {
        let e = self.sessions.get_mut(id.index())?;
        (e.generation == id.generation()).then_some(())?;
        e.session.as_mut()
    }

    fn new_session(&mut self, s: Session<P>) -> Result<SessionId> {
        let index = match self.free_sessions.pop() {
            Some(i) => i,
            None if self.sessions.len() < usize::from(self.cfg.max_sessions) => {
                self.sessions.push(SessionEntry { generation: 0, session: None });
                (self.sessions.len() - 1) as u16
            }
            None => {
                return Err(RpcError::TooManySessions { max: usize::from(self.cfg.max_sessions) })
            }
        };
        let e = &mut self.sessions[usize::from(index)];
        e.session = Some(s);
        Ok(SessionId::new(index, e.generation))
    }

    /// Why `id` names no session: [`RpcError::SessionClosed`] when it named one of this
    /// endpoint's that has since ended (its entry's generation moved on: a peer that went
    /// away, say, while no call was in flight), else [`RpcError::NoSuchSession`].
    fn gone(&self, id: SessionId) -> RpcError {
        match self.sessions.get(id.index()) {
            Some(e) if e.generation != id.generation() => RpcError::SessionClosed,
            _ => RpcError::NoSuchSession(id),
        }
    }

    /// Takes session `id` out of the table (its entry's next session gets a new generation).
    fn remove_session(&mut self, id: SessionId) -> Option<Session<P>> {
        let e = self.sessions.get_mut(id.index())?;
        if e.generation != id.generation() {
            return None;
        }
        let s = e.session.take()?;
        e.generation = e.generation.wrapping_add(1);
        self.free_sessions.push(id.index() as u16);
        if let Some(conn) = s.conn {
            self.by_conn.remove(&conn);
        }
        if let Some(key) = s.key {
            if s.served.is_empty() {
                self.resumable -= 1; // (a client's)
            } else if self.by_key.get(&key) == Some(&id) {
                self.by_key.remove(&key);
            }
        }
        Some(s)
    }

    fn call_live(&self, id: CallId) -> bool {
        self.calls
            .get(id.index())
            .is_some_and(|e| e.generation == id.generation() && e.call.is_some())
    }

    fn take_call(&mut self, id: CallId) -> Option<Call<P>> {
        let e = self.calls.get_mut(id.index())?;
        if e.generation != id.generation() {
            return None;
        }
        let c = e.call.take()?;
        e.generation = e.generation.wrapping_add(1) & CallId::GENERATION_MASK;
        self.free_calls.push(id.index() as u32);
        self.live_calls -= 1;
        Some(c)
    }

    #[inline(always)]
    fn insert_call(&mut self, call: Call<P>) -> Result<CallId, (RpcError, Continuation<P>)> {
        let max = self.cfg.max_calls as usize;
        let index = match self.free_calls.pop() {
            Some(i) => i,
            None if self.calls.len() < max => {
                self.calls.push(CallEntry { generation: 0, call: None });
                (self.calls.len() - 1) as u32
            }
            None => return Err((RpcError::TooManyCalls { max }, call.then)),
        };
        let e = &mut self.calls[index as usize];
        e.call = Some(call);
        self.live_calls += 1;
        Ok(CallId::new(index, e.generation))
    }

    /// Ends `call` with `outcome`: runs its continuation, counting it, and, when it led a
    /// merge group, the continuations of the calls merged with it (still live), with the same
    /// outcome.
    fn finish(&mut self, cx: &mut Cx<P>, call: Call<P>, outcome: Result<&[u8], RpcError>) {
        match call.group {
            // (most calls: no merge group to end with it)
            None => self.run(cx, call.then, outcome),
            Some(h) => self.finish_group(cx, call, h, outcome),
        }
    }

    /// [`Endpoint::finish`] of a call that leads merge group `h`.
    #[inline(never)]
    fn finish_group(
        &mut self,
        cx: &mut Cx<P>,
        call: Call<P>,
        h: u64,
        outcome: Result<&[u8], RpcError>,
    ) {
        // The followers still live are taken out before any continuation runs (in vectors
        // kept from earlier groups: no allocation once warm).
        let mut ended = std::mem::take(&mut self.merging.ended);
        if let Some(mut g) = self.merges.remove(&(call.session, call.ty, h)) {
            for id in g.followers.drain(..) {
                ended.extend(self.take_call(id));
            }
            self.merging.recycle(g);
        }
        let again = outcome.as_ref().map(|r| *r).map_err(RpcError::again);
        self.run(cx, call.then, outcome);
        for f in ended.drain(..) {
            self.run(cx, f.then, again.as_ref().map(|r| *r).map_err(RpcError::again));
        }
        // (a continuation that ended another group meanwhile used a vector of its own)
        if ended.capacity() > self.merging.ended.capacity() {
            self.merging.ended = ended;
        }
    }

    /// Runs a continuation with its outcome, counting it.
    fn run(&mut self, cx: &mut Cx<P>, then: Continuation<P>, outcome: Result<&[u8], RpcError>) {
        match &outcome {
            Ok(_) => self.metrics.responses += 1,
            Err(e) => {
                self.metrics.errors += 1;
                if matches!(e, RpcError::Timeout) {
                    self.metrics.timeouts += 1;
                }
            }
        }
        then(&mut Rpc { ep: self, cx }, outcome);
    }

    pub(crate) fn connect(
        &mut self,
        cx: &mut Cx<P>,
        addr: SocketAddr,
        policy: Option<corelink_engine::Reconnect>,
    ) -> Result<SessionId> {
        let credits = self.cfg.credits;
        let s = Session {
            conn: None,
            phase: Phase::Connecting,
            peer_max: 0,
            region: None,
            slots: (0..credits)
                .map(|_| ClientSlot { seq: 0, used: SlotUse::Free, arena: None, reading: false })
                .collect(),
            free_slots: all_free(usize::from(credits)),
            waiting: VecDeque::with_capacity(usize::from(credits)),
            queued: 0,
            served: Vec::new(),
            held: VecDeque::new(),
            redial: policy.is_some(),
            rejoin: Vec::new(),
            key: None,
            lost: None,
        };
        let id = self.new_session(s)?;
        let key = policy.is_some().then(|| resume::fresh_key(id));
        if let Some(s) = self.session_mut(id) {
            s.key = key;
        }
        self.resumable += usize::from(key.is_some());
        let hello = wire::Hello { credits, resume: key }.encode();
        let token = u64::from(id.to_wire());
        let asked = match policy {
            Some(p) => cx.connect_with(addr, &hello, token, p),
            None => cx.connect(addr, &hello, token),
        };
        if let Err(e) = asked {
            self.remove_session(id);
            return Err(e.into());
        }
        Ok(id)
    }

    pub(crate) fn close(&mut self, cx: &mut Cx<P>, id: SessionId) -> Result<()> {
        let s = self.session_mut(id).ok_or(RpcError::NoSuchSession(id))?;
        let (conn, redial) = (s.conn, s.redial);
        s.phase = Phase::Closing;
        // No call on a group goes to it from now on.
        self.leave_groups(id);
        match conn {
            Some(conn) => {
                // Its calls end when the connection is down (`on_closed`); what waits in its
                // pack goes first, as it would have gone unpacked.
                self.send_pack_of(cx, conn);
                let _ = cx.close(conn);
            }
            // Still connecting: its calls end now; the connection, when it comes, is closed
            // (and a reconnect policy tries no more).
            None => {
                if redial {
                    cx.stop_reconnecting(u64::from(id.to_wire()));
                }
                self.end_session(cx, id)
            }
        }
        Ok(())
    }

    /// The engine refused a send on `session` because its connection is closing or gone (the
    /// peer went away; the session ends when the engine says the connection is down): no
    /// call goes to it from now on, on a group (it leaves its groups: a session whose calls
    /// fail at once would look like the least loaded member and draw every call) or on the
    /// session itself (refused with [`RpcError::SessionClosed`], as after [`Rpc::close`]);
    /// its calls waiting for a credit end with the session.
    fn going_down(&mut self, session: SessionId) {
        if let Some(s) = self.session_mut(session) {
            s.phase = Phase::Closing;
        }
        self.leave_groups(session);
    }

    /// What the endpoint registers ahead, on the worker's thread before its loop starts: the
    /// arena for large messages, if they are on.
    pub(crate) fn prepare(&mut self, cx: &mut Cx<P>) -> Result<()> {
        self.ensure_arena(cx)
    }

    /// Registers the arena for large messages, if they are on and it is not there yet.
    fn ensure_arena(&mut self, cx: &mut Cx<P>) -> Result<()> {
        if self.cfg.large_max > 0 && self.arena.is_none() {
            self.arena = Some(Arena::new(cx, self.cfg.large_max, self.cfg.large_slots)?);
        }
        Ok(())
    }

    /// A state the endpoint's own bookkeeping rules out was met: counted (and a debug
    /// assertion).
    #[cold]
    fn missed(&mut self) {
        self.metrics.invariant_misses += 1;
        debug_assert!(false, "the endpoint's bookkeeping missed");
    }

    /// A connection of this worker opened: a client session's, or a peer's new session.
    pub(crate) fn on_connected(
        &mut self,
        cx: &mut Cx<P>,
        conn: ConnId,
        info: &ConnInfo,
    ) -> Option<(SessionId, SessionEvent)> {
        let peer_recv = info.peer_recv_size.map_or(cx.recv_size(), |n| n as usize);
        let peer_max = peer_recv.saturating_sub(HEADER);
        // Large messages: the arena, readable by this session's peer (without it, large
        // messages on the session fail with `NoLargeBuffers`).
        let region = match self.ensure_arena(cx) {
            Ok(()) => self.arena.as_ref().and_then(|a| a.grant(cx, conn).ok()),
            Err(_) => None,
        };
        if info.initiated {
            let id = SessionId::from_wire(info.token as u32);
            let Some(s) = self.session_mut(id).filter(|s| s.phase == Phase::Connecting) else {
                // Closed while connecting.
                let _ = cx.close(conn);
                return None;
            };
            s.conn = Some(conn);
            s.phase = Phase::Open;
            s.peer_max = peer_max;
            s.region = region;
            let rejoin = std::mem::take(&mut s.rejoin);
            self.by_conn.insert(conn, id);
            self.rejoin_groups(id, &rejoin);
            // The calls in flight when the last connection was lost go first, as they were.
            self.resend_in_flight(cx, id);
            self.dispatch_waiting(cx, id);
            return Some((id, SessionEvent::Connected));
        }
        let hello = match wire::Hello::decode(&info.private_data) {
            Ok(h) if h.credits >= 1 && u32::from(h.credits) <= self.recvs => h,
            _ => {
                self.metrics.refused += 1;
                let _ = cx.close(conn);
                return None;
            }
        };
        let (credits, key) = (hello.credits, hello.resume.filter(|_| !self.cfg.resume.is_zero()));
        if let Some(id) = key.and_then(|k| self.resumable(cx, k, credits)) {
            self.resume(cx, id, conn, peer_max, region);
            return Some((id, SessionEvent::Accepted));
        }
        let s = Session {
            conn: Some(conn),
            phase: Phase::Open,
            peer_max,
            region,
            slots: Vec::new(),
            free_slots: Vec::new(),
            waiting: VecDeque::new(),
            queued: 0,
            served: (0..credits)
                .map(|_| ServedSlot {
                    seq: 0,
                    stored: None,
                    resend: false,
                    arena: None,
                    reading: false,
                    known: false,
                })
                .collect(),
            held: VecDeque::new(),
            redial: false,
            rejoin: Vec::new(),
            key,
            lost: None,
        };
        match self.new_session(s) {
            Ok(id) => {
                self.by_conn.insert(conn, id);
                if let Some(key) = key {
                    self.by_key.insert(key, id);
                }
                Some((id, SessionEvent::Accepted))
            }
            Err(_) => {
                self.metrics.refused += 1;
                let _ = cx.close(conn);
                None
            }
        }
    }

    /// A client session's connect failed.
    pub(crate) fn on_connect_failed(
        &mut self,
        cx: &mut Cx<P>,
        token: u64,
    ) -> Option<(SessionId, SessionEvent)> {
        let id = SessionId::from_wire(token as u32);
        self.session(id)?;
        self.end_session(cx, id);
        Some((id, SessionEvent::Closed))
    }

    /// A connection closed (for `reason`): its session's calls end, or, for a session under
    /// a reconnect policy that this side did not close, its calls in flight end and it waits
    /// for the engine's new connection.
    pub(crate) fn on_closed(
        &mut self,
        cx: &mut Cx<P>,
        conn: ConnId,
        reason: &corelink_engine::CloseReason,
    ) -> Option<(SessionId, SessionEvent)> {
        let id = self.by_conn.remove(&conn)?;
        let final_close = matches!(reason, CloseReason::Local | CloseReason::Shutdown);
        if !final_close && self.session(id).is_some_and(|s| s.redial) {
            self.suspend(id);
            return Some((id, SessionEvent::Reconnecting));
        }
        if !final_close && self.session(id).is_some_and(|s| s.key.is_some() && s.conn == Some(conn))
        {
            self.park(id, *reason);
            return Some((id, SessionEvent::Reconnecting));
        }
        self.end_session(cx, id);
        Some((id, SessionEvent::Closed))
    }

    /// Session `id`'s connection is gone and will be made again: its calls in flight stay on
    /// their slots, to go again on the new connection (`resend_in_flight`); a slot whose call
    /// timed out is free (its answer, if any, was lost with the connection); its waiting
    /// calls stay.
    fn suspend(&mut self, id: SessionId) {
        let rejoin = self.groups_of(id);
        self.leave_groups(id);
        let Some(s) = self.session_mut(id) else { return };
        s.rejoin = rejoin;
        s.conn = None;
        s.phase = Phase::Connecting;
        s.region = None;
        for cs in &mut s.slots {
            cs.reading = false;
            if cs.used == SlotUse::Abandoned {
                cs.used = SlotUse::Free;
                cs.arena = None;
            }
        }
        let free = (0..s.slots.len() as u16).rev();
        s.free_slots = free.filter(|&i| s.slots[usize::from(i)].used == SlotUse::Free).collect();
    }

    /// Takes session `id` out and ends every call of it with `SessionClosed`.
    fn end_session(&mut self, cx: &mut Cx<P>, id: SessionId) {
        let Some(s) = self.remove_session(id) else { return };
        // Out of its groups before its calls end: calls their continuations make on a group
        // go to the members still up.
        self.leave_groups(id);
        // In flight first (they were made first), then the waiting ones in order.
        self.close_calls(cx, s.in_flight().chain(s.waiting.iter().copied()));
    }

    /// Ends each of `calls` still live with `SessionClosed`.
    fn close_calls(&mut self, cx: &mut Cx<P>, calls: impl IntoIterator<Item = CallId>) {
        for c in calls {
            if let Some(call) = self.take_call(c) {
                self.finish(cx, call, Err(RpcError::SessionClosed));
            }
        }
    }

    /// A request of this worker completed: a response's buffer is kept for its slot (or sent
    /// again, when its request came again meanwhile); a large payload read is handled.
    /// A completion of the endpoint's own requests; one of the service's ([`Rpc::submit`])
    /// comes back, with its own token.
    #[inline(always)]
    pub(crate) fn on_completion(
        &mut self,
        cx: &mut Cx<P>,
        mut done: Done<Buf<P>>,
    ) -> Option<Done<Buf<P>>> {
        if done.token & (TOKEN_KIND | SERVICE_TOKEN) == SERVICE_TOKEN {
            done.token &= MAX_SERVICE_TOKEN;
            return Some(done);
        }
        self.own_completion(cx, done);
        None
    }

    #[inline(always)]
    fn own_completion(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        match done.token & TOKEN_KIND {
            // (kept for a resend even when it failed: the connection is going down)
            RESPONSE_TOKEN => self.answer_sent(cx, done.token, done.buf),
            // Packed messages went (each was done with when it was packed).
            0 if done.token == PACKED_TOKEN => {}
            // A request went: a resumable session's is kept until its answer (sent again
            // if the connection is lost first); others' go back to the pool.
            0 => self.request_sent(done.token, done.buf),
            // A failed read: the connection closes, and its calls end then (or, on a
            // resumable session, the request comes again).
            SERVER_READ if !done.status.is_success() => self.request_unread(done),
            _ if !done.status.is_success() => {}
            SERVER_READ => self.request_read(cx, done),
            _ => self.response_read(cx, done),
        }
    }

    /// A message arrived on `conn`.
    pub(crate) fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, data: &[u8]) {
        let Some(&session) = self.by_conn.get(&conn) else {
            self.metrics.stale += 1;
            return;
        };
        // The receive's messages in order (as `wire::unpack` reads them, without an
        // iterator's state: the first malformed one ends the receive).
        let mut rest = data;
        loop {
            let Ok((h, payload, after)) = wire::split_first(rest) else {
                self.metrics.malformed += 1;
                return;
            };
            // (a message may end its session: those after it are stale)
            let Some(s) = self.session(session) else {
                self.metrics.stale += 1;
                return;
            };
            let checked = match (s.served.is_empty(), h.kind) {
                (true, Kind::Response | Kind::Error) => self.on_response(cx, session, &h, payload),
                (false, Kind::Request) => self.on_request(cx, session, &h, payload),
                _ => Err(Malformed::Direction),
            };
            if checked.is_err() {
                self.metrics.malformed += 1;
            }
            if after.is_empty() {
                return;
            }
            rest = after;
        }
    }
}
