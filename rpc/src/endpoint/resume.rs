//! Resumable sessions: a session under a reconnect policy carries its calls in flight to its
//! next connection, and its server carries the session's record (each slot's last sequence
//! number and response) over to it, so that a request sent again runs at most once.
//!
//! The client's hello names the session by a key, the same on each connection. A server
//! session with a key whose connection is lost is parked for `EndpointConfig::resume`; a
//! connection whose hello has its key takes it over (the lost connection, if the server has
//! not noticed yet, is closed). The client sends its calls in flight again on their slots,
//! with their sequence numbers and the `RESENT` flag: the server answers one it ran from the
//! record, runs one it never saw, and answers `Status::Lost` to one on a slot it has no
//! record of (a session new to it: a restart, or the record expired).

use std::hash::{BuildHasher, Hasher};
use std::time::{Instant, SystemTime};

use corelink_engine::verbs::{Provider, RemoteRegion};
use corelink_engine::{Buf, CloseReason, ConnId, Cx, Done};

use super::{Endpoint, Phase, SlotUse, TOKEN_SEQ_MASK};
use crate::error::RpcError;
use crate::ids::{CallId, SessionId};
use crate::wire::{Descriptor, DESCRIPTOR, HEADER, RESENT};

/// A new resumable session's key: random (the process's random hasher keys, the time, the
/// process and the session), never 0.
pub(super) fn fresh_key(id: SessionId) -> u64 {
    let mut h = std::hash::RandomState::new().build_hasher();
    h.write_u32(id.to_wire());
    h.write_u32(std::process::id());
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
    h.write_u128(now.map_or(0, |d| d.as_nanos()));
    h.finish() | 1
}

impl<P: Provider> Endpoint<P> {
    /// The server session a hello with `key` and `credits` resumes, if this endpoint has it
    /// (one with other credits is a different session: it ends, its connection closed and
    /// its `Closed` told as an expired one's, and a new one is made).
    pub(super) fn resumable(
        &mut self,
        cx: &mut Cx<P>,
        key: u64,
        credits: u16,
    ) -> Option<SessionId> {
        let id = *self.by_key.get(&key)?;
        let Some(s) = self.session(id) else {
            self.by_key.remove(&key);
            return None;
        };
        if s.served.len() == usize::from(credits) {
            return Some(id);
        }
        let reason = s.lost.map_or(CloseReason::Peer, |(_, r)| r);
        if let Some(conn) = self.remove_session(id).and_then(|s| s.conn) {
            let _ = cx.close(conn);
        }
        self.ended.push((id, reason));
        None
    }

    /// Server session `id` goes on on connection `conn` (its client came back): its record
    /// stays; a large response kept for a resend names the new connection's grant.
    pub(super) fn resume(
        &mut self,
        cx: &mut Cx<P>,
        id: SessionId,
        conn: ConnId,
        peer_max: usize,
        region: Option<RemoteRegion>,
    ) {
        let Endpoint { sessions, arena, by_conn, metrics, .. } = self;
        let Some(s) = sessions.get_mut(id.index()).and_then(|e| e.session.as_mut()) else {
            return;
        };
        if let Some(old) = s.conn.replace(conn) {
            // Lost, and not noticed here yet: its close is this session's no more.
            by_conn.remove(&old);
            let _ = cx.close(old);
        }
        s.phase = Phase::Open;
        s.peer_max = peer_max;
        s.region = region;
        s.lost = None;
        for ss in &mut s.served {
            // The session's whole history is here: every slot's.
            ss.known = true;
            let (Some(buf), Some(slot)) = (&mut ss.stored, &ss.arena) else { continue };
            // A large response's descriptor: the payload stays where it is, under the new grant.
            let (Some(region), Some(arena)) = (region, arena.as_ref()) else {
                // No grant to read it under: the request, if it comes again, may have run.
                ss.stored = None;
                ss.arena = None;
                ss.known = false;
                continue;
            };
            let m = buf.as_mut_slice();
            let Ok(d) = Descriptor::decode(&m[HEADER..]) else { continue };
            let d = arena.descriptor(slot, region, d.len);
            m[HEADER..HEADER + DESCRIPTOR].copy_from_slice(&d.encode());
        }
        by_conn.insert(conn, id);
        metrics.resumed += 1;
    }

    /// Server session `id` lost its connection (for `reason`): it keeps its record and waits
    /// `EndpointConfig::resume` for its client.
    pub(super) fn park(&mut self, id: SessionId, reason: CloseReason) {
        let now = Instant::now();
        let Some(s) = self.session_mut(id) else { return };
        s.conn = None;
        s.phase = Phase::Connecting;
        s.region = None;
        s.lost = Some((now, reason));
        s.forget_held();
        self.parked.push_back((now, id));
    }

    /// Ends the parked sessions whose client did not come back in time (at `now`): their
    /// `Closed` is the service's to hear ([`Endpoint::take_ended`]).
    pub(super) fn expire_parked(&mut self, now: Instant) {
        while let Some(&(since, id)) = self.parked.front() {
            if now.saturating_duration_since(since) < self.cfg.resume {
                return;
            }
            self.parked.pop_front();
            // (Skipped: one that came back, or was parked again later.)
            let Some((at, reason)) = self.session(id).and_then(|s| s.lost) else { continue };
            if at != since {
                continue;
            }
            self.remove_session(id);
            self.metrics.expired += 1;
            self.ended.push((id, reason));
        }
    }

    /// Whether a server session ended since the last look ([`Endpoint::take_ended`]).
    #[inline]
    pub(crate) fn any_ended(&self) -> bool {
        !self.ended.is_empty()
    }

    /// The server sessions that ended since the last look because their client did not come
    /// back within `EndpointConfig::resume`, with why their connection was lost.
    pub(crate) fn take_ended(&mut self) -> Vec<(SessionId, CloseReason)> {
        std::mem::take(&mut self.ended)
    }

    /// A call's request went (or failed, its connection going down): on a resumable session,
    /// while the call waits for its answer, its buffer is kept to send again.
    #[inline(always)]
    pub(super) fn request_sent(&mut self, token: u64, buf: Option<Buf<P>>) {
        if self.resumable == 0 {
            // (the next call's request buffer, or back to the pool when one is kept)
            if self.spare.is_none() {
                self.spare = buf;
            }
            return;
        }
        let id = CallId(token);
        let Some(e) = self.calls.get(id.index()) else { return };
        let Some(c) = e.call.as_ref().filter(|_| e.generation == id.generation()) else {
            return; // answered already
        };
        let resumable = self.session(c.session).is_some_and(|s| s.key.is_some());
        if let (true, Some(buf)) = (resumable, buf) {
            if let Some(c) = self.calls[id.index()].call.as_mut() {
                c.request = Some(buf);
            }
        }
    }

    /// A large request's payload could not be read (the connection is going down): the
    /// request did not run, nor did those held behind it; each runs when it comes again.
    #[inline(never)]
    pub(super) fn request_unread(&mut self, done: Done<Buf<P>>) {
        let (session, slot, seq) = super::token_slot(done.token);
        let Some(s) = self.session_mut(session) else { return };
        let Some(ss) = s.served.get(usize::from(slot)) else { return };
        if ss.seq & TOKEN_SEQ_MASK == seq && ss.reading {
            s.forget_held();
        }
    }

    /// Session `id` reconnected: its calls that were in flight go again, on their slots with
    /// their sequence numbers, flagged as sent again; slots whose calls timed out meanwhile
    /// are free. A call whose request is not at hand ends with `OutcomeUnknown`.
    pub(super) fn resend_in_flight(&mut self, cx: &mut Cx<P>, id: SessionId) {
        let Some(s) = self.session(id) else { return };
        let (region, n) = (s.region, s.slots.len());
        for slot in 0..n as u16 {
            let Some(cs) = self.session(id).and_then(|s| s.slots.get(usize::from(slot))) else {
                return;
            };
            let call = match cs.used {
                SlotUse::Call(c) => c,
                SlotUse::Abandoned => {
                    self.free_slot(id, slot);
                    continue;
                }
                SlotUse::Free => continue,
            };
            let large = cs.arena.is_some();
            let taken = self.calls.get_mut(call.index()).and_then(|e| match &mut e.call {
                Some(c) if e.generation == call.generation() => {
                    Some((c.request.take(), c.len, c.ty))
                }
                _ => None,
            });
            let Some((request, len, ty)) = taken else {
                self.free_slot(id, slot);
                self.missed();
                continue;
            };
            // A large request's descriptor names the new connection's grant.
            let described = match request {
                Some(buf) if !large => Some(buf),
                Some(mut buf) => {
                    let cs = self.session(id).and_then(|s| s.slots.get(usize::from(slot)));
                    let a = cs.and_then(|cs| cs.arena.as_ref());
                    a.is_some_and(|a| self.describe(region, a, len, &mut buf)).then_some(buf)
                }
                None => None,
            };
            let Some(mut buf) = described else {
                self.free_slot(id, slot);
                if let Some(c) = self.take_call(call) {
                    self.finish(cx, c, Err(RpcError::OutcomeUnknown));
                }
                continue;
            };
            let m = buf.as_mut_slice();
            let flags = u16::from_le_bytes([m[26], m[27]]) | RESENT;
            m[26..28].copy_from_slice(&flags.to_le_bytes());
            self.metrics.resent += 1;
            self.post_request(cx, id, slot, call, ty, buf);
        }
    }
}
