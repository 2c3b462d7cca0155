//! What a service registers and runs: request handlers (each gets the request in place and
//! writes its response into a registered buffer), and the [`Service`] that runs on the worker
//! beside its endpoint.

use corelink_engine::verbs::Provider;
use std::fmt;

use corelink_engine::{Buf, CloseReason, Cx, Done, EngineError};

use crate::endpoint::Rpc;
use crate::error::{Result, RpcError};
use crate::ids::{ReqType, SessionId};
use crate::large::{Arena, ArenaSlot};
use crate::wire::HEADER;

/// A request, as its handler sees it: the bytes in place in the receive buffer.
#[derive(Debug)]
pub struct Request<'a> {
    /// Its type.
    pub ty: ReqType,
    /// The server's session it came on.
    pub session: SessionId,
    /// The request's payload (borrowed from the receive buffer: no copy).
    pub data: &'a [u8],
}

/// Where a handler writes its response: a registered buffer, taken with [`Response::alloc`]
/// (no response taken: an empty one goes).
pub struct Response<'a, P: Provider> {
    pub(crate) cx: &'a Cx<P>,
    pub(crate) buf: Option<Buf<P>>,
    pub(crate) max: usize,
    /// A response asked for that did not fit, or a pool that had no buffer.
    pub(crate) refused: Option<RpcError>,
    /// The endpoint's arena, when large responses can go to this session's client.
    pub(crate) arena: Option<&'a Arena<P>>,
    /// A large response: its arena slot and length.
    pub(crate) large: Option<(ArenaSlot, usize)>,
}

impl<P: Provider> std::fmt::Debug for Response<'_, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response").field("len", &self.len()).field("max", &self.max).finish()
    }
}

impl<'a, P: Provider> Response<'a, P> {
    pub(crate) fn new(cx: &'a Cx<P>, max: usize, arena: Option<&'a Arena<P>>) -> Self {
        Response { cx, buf: None, max, refused: None, arena, large: None }
    }

    /// Payload bytes the response may have: what fits in the client's receive, or a large
    /// message's most (`EndpointConfig::large_max`) when large messages are on.
    pub fn max(&self) -> usize {
        self.arena.map_or(self.max, |a| a.size().max(self.max))
    }

    /// Payload bytes taken so far.
    pub fn len(&self) -> usize {
        match (&self.large, &self.buf) {
            (Some((_, len)), _) => *len,
            (None, b) => b.as_ref().map_or(0, |b| b.len() - HEADER),
        }
    }

    /// Whether no payload was taken.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `len` bytes of response payload in registered memory, to write in place (it goes as
    /// it is when the handler returns): a buffer of the worker's pools, or beyond the
    /// client's receive a slot of the endpoint's arena for large messages, which the client
    /// reads. Refused when `len` exceeds [`Response::max`] or no buffer or slot is free; the
    /// client then gets that error, whatever the handler returns.
    #[inline(always)]
    pub fn alloc(&mut self, len: usize) -> Result<&mut [u8]> {
        // (the common case, a first small response that a buffer is free for, in a few
        // instructions; the rest out of line)
        if len <= self.max && self.buf.is_none() && self.large.is_none() && self.refused.is_none() {
            if let Ok(b) = self.cx.alloc(HEADER + len) {
                return Ok(&mut self.buf.insert(b).as_mut_slice()[HEADER..]);
            }
        }
        self.alloc_slow(len)
    }

    /// [`Response::alloc`] in every other case.
    #[inline(never)]
    fn alloc_slow(&mut self, len: usize) -> Result<&mut [u8]> {
        self.buf = None;
        self.large = None;
        if len > self.max() {
            self.refused = Some(RpcError::TooLarge { len, max: self.max() });
            return Err(RpcError::TooLarge { len, max: self.max() });
        }
        if len > self.max {
            let Some(arena) = self.arena else {
                return Err(RpcError::TooLarge { len, max: self.max });
            };
            let Some(slot) = arena.take() else {
                self.refused = Some(RpcError::Unanswered);
                return Err(RpcError::LargeSlotsBusy { slots: arena.slots() });
            };
            self.refused = None;
            let (slot, _) = self.large.insert((slot, len));
            return Ok(arena.bytes_mut(slot, len));
        }
        match self.cx.alloc(HEADER + len) {
            Ok(b) => {
                self.refused = None;
                let b = self.buf.insert(b);
                Ok(&mut b.as_mut_slice()[HEADER..])
            }
            Err(e) => {
                self.refused = Some(RpcError::Unanswered);
                Err(RpcError::Engine(e))
            }
        }
    }

    /// Copies `data` in as the response's payload.
    #[inline(always)]
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        self.alloc(data.len())?.copy_from_slice(data);
        Ok(())
    }
}

/// A handler's refusal of a request, with a code for the caller ([`RpcError::Rejected`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reject(pub u32);

/// How a session changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    /// A session this endpoint asked for ([`Rpc::connect`]) is open.
    Connected,
    /// A peer opened a session to this endpoint (it serves the peer's calls).
    Accepted,
    /// The session closed (or its connect failed): its calls ended with
    /// [`RpcError::SessionClosed`].
    Closed,
    /// A session under a reconnect policy ([`Rpc::connect_with`]) lost its connection: its
    /// calls wait (those in flight go again on the new connection), and the engine is
    /// connecting again ([`SessionEvent::Connected`] or [`SessionEvent::Closed`] comes
    /// next). On a server: a resumable session's connection was lost, and the session's
    /// record waits `EndpointConfig::resume` for its client ([`SessionEvent::Accepted`]
    /// again when it comes back, else [`SessionEvent::Closed`]).
    Reconnecting,
}

/// Why a session ended (after [`SessionEvent::Closed`], [`Service::on_session_end`] tells).
#[derive(Clone, Copy, Debug)]
pub enum SessionEnd<'a> {
    /// Its connect failed (refused, timed out, a limit of the engine reached...).
    ConnectFailed(&'a EngineError),
    /// Its connection closed, for this reason (this side closed it, the peer went away...).
    Closed(&'a CloseReason),
}

impl fmt::Display for SessionEnd<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionEnd::ConnectFailed(e) => {
                write!(f, "its connect failed: {}", corelink_engine::verbs::chain(*e))
            }
            SessionEnd::Closed(r) => write!(f, "its connection closed: {r}"),
        }
    }
}

/// What runs on each worker beside its endpoint: it makes calls (from [`Service::poll`], from
/// continuations) and hears of sessions and timers. Request handlers are registered on the
/// endpoint ([`crate::Endpoint::register`]).
#[allow(unused_variables)]
pub trait Service<P: Provider>: 'static {
    /// Once per loop iteration, after the completions.
    fn poll(&mut self, rpc: &mut Rpc<'_, P>) {}
    /// A session opened or closed.
    fn on_session(&mut self, rpc: &mut Rpc<'_, P>, session: SessionId, event: SessionEvent) {}
    /// Why a session ended, right after its [`SessionEvent::Closed`].
    fn on_session_end(&mut self, rpc: &mut Rpc<'_, P>, session: SessionId, end: SessionEnd<'_>) {}
    /// A timer set with the engine's `Cx::set_timer` (through [`Rpc::cx`]) fired.
    fn on_timer(&mut self, rpc: &mut Rpc<'_, P>, token: u64) {}
    /// One of the service's own requests ([`Rpc::submit`]) ended, with the token it was
    /// submitted with (a failure closes the session's connection, as any failed request does).
    fn on_completion(&mut self, rpc: &mut Rpc<'_, P>, done: Done<Buf<P>>) {}
}

/// A service that only serves (its endpoint's handlers do the work).
#[derive(Debug, Default)]
pub struct Serve;

impl<P: Provider> Service<P> for Serve {}
