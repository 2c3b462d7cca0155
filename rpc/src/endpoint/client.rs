//! The client side of an endpoint: calls, their credits and deadlines, and their answers.

use std::cmp::Reverse;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use corelink_engine::verbs::{Provider, RemoteAddr, RemoteRegion};
use corelink_engine::{Buf, Cx, Done, EngineError};

use super::packer::Outgoing;
use super::{
    slot_token, token_slot, Ask, Call, Continuation, Endpoint, Phase, SlotUse, CLIENT_READ,
    TOKEN_SEQ_MASK,
};
use crate::config::EXPIRE_EVERY;
use crate::error::{Malformed, Result, RpcError};
use crate::ids::{CallId, ReqType, SessionId};
use crate::large::ArenaSlot;
use crate::wire::{self, Descriptor, Header, Kind, Status, DESCRIPTOR, HEADER};

/// Why [`Endpoint::request_buffer`] made no request ready to go.
enum NotMade<P: Provider> {
    /// The call is refused.
    Refused(RpcError),
    /// A large call while every arena slot is out: its header's buffer, and its payload in a
    /// vector until a slot is free (the call waits for one).
    NoSlot(Buf<P>, Box<[u8]>),
}

impl<P: Provider> From<RpcError> for NotMade<P> {
    fn from(e: RpcError) -> Self {
        NotMade::Refused(e)
    }
}

impl<P: Provider> Endpoint<P> {
    /// A call whose request payload is `len` bytes, written in place by `fill` (into the
    /// registered request buffer, or a large request's arena slot): the raw path copies the
    /// caller's bytes in, the typed path serializes straight into it. Refused: the error and
    /// `then`, unrun.
    #[inline(always)]
    pub(crate) fn call_with(
        &mut self,
        cx: &mut Cx<P>,
        ask: Ask,
        fill: impl FnOnce(&mut [u8]),
        then: Continuation<P>,
    ) -> Result<CallId, (RpcError, Continuation<P>)> {
        if self.mergeable.get(usize::from(ask.ty.0)).copied().unwrap_or(false) {
            return self.call_merging(cx, ask, fill, then);
        }
        self.call_plain(cx, ask, fill, then)
    }

    /// A call of a mergeable type: merged with an identical one of the session in flight or
    /// waiting (it is not sent, and ends with that one), else made, leading a new group.
    #[inline(never)]
    fn call_merging(
        &mut self,
        cx: &mut Cx<P>,
        ask: Ask,
        fill: impl FnOnce(&mut [u8]),
        then: Continuation<P>,
    ) -> Result<CallId, (RpcError, Continuation<P>)> {
        // The request's bytes, in the endpoint's reused vector (given back on every path).
        let mut bytes = std::mem::take(&mut self.merging.bytes);
        bytes.clear();
        bytes.resize(ask.len, 0);
        fill(&mut bytes);
        let made = self.merge_or_lead(cx, ask, &mut bytes, then);
        self.merging.bytes = bytes;
        made
    }

    /// [`Endpoint::call_merging`] once the request's bytes are in `bytes` (which a new group
    /// keeps, leaving a spare vector in their place).
    fn merge_or_lead(
        &mut self,
        cx: &mut Cx<P>,
        ask: Ask,
        bytes: &mut Vec<u8>,
        then: Continuation<P>,
    ) -> Result<CallId, (RpcError, Continuation<P>)> {
        let Ask { session, ty, len, timeout } = ask;
        let mut hasher = DefaultHasher::new();
        bytes.hash(&mut hasher);
        let key = (session, ty, hasher.finish());
        let leader = self.merges.get(&key).map(|g| (g.leader, g.bytes == *bytes));
        match leader {
            Some((leader, true)) if self.call_live(leader) => {
                if self.live_calls >= self.cfg.max_calls as usize {
                    let max = self.cfg.max_calls as usize;
                    return Err((RpcError::TooManyCalls { max }, then));
                }
                let call = Call {
                    session,
                    ty,
                    group: None,
                    slot: None,
                    request: None,
                    arena: None,
                    len: len as u32,
                    then,
                };
                let id = self.insert_call(call)?;
                self.metrics.calls += 1;
                self.metrics.merged += 1;
                self.push_deadline(cx, id, timeout);
                if let Some(g) = self.merges.get_mut(&key) {
                    g.followers.push(id);
                }
                Ok(id)
            }
            // Another request with the same hash leads: this one goes on its own.
            Some((leader, false)) if self.call_live(leader) => {
                self.call_plain(cx, ask, |b| b.copy_from_slice(bytes), then)
            }
            _ => {
                let id = self.call_plain(cx, ask, |b| b.copy_from_slice(bytes), then)?;
                // (A call that ended at once, refused by the engine, leads nothing.)
                let entry = self.calls.get_mut(id.index());
                let live = entry.filter(|e| e.generation == id.generation());
                if let Some(c) = live.and_then(|e| e.call.as_mut()) {
                    c.group = Some(key.2);
                    let mut group = self.merging.spare_group(id);
                    std::mem::swap(&mut group.bytes, bytes);
                    if let Some(stale) = self.merges.insert(key, group) {
                        self.merging.recycle(stale);
                    }
                }
                Ok(id)
            }
        }
    }

    /// A call as it is (not merged).
    fn call_plain(
        &mut self,
        cx: &mut Cx<P>,
        ask: Ask,
        fill: impl FnOnce(&mut [u8]),
        then: Continuation<P>,
    ) -> Result<CallId, (RpcError, Continuation<P>)> {
        let Ask { session, ty, len, timeout } = ask;
        let (mut buf, arena, large) = match self.request_buffer(cx, session, len, fill) {
            Ok(b) => b,
            Err(NotMade::Refused(e)) => return Err((e, then)),
            Err(NotMade::NoSlot(buf, bytes)) => {
                return self.call_without_slot(cx, ask, buf, bytes, then);
            }
        };
        let header = request_header(session, ty, len, large);
        let len = len as u32;
        // A small call on an open session with a credit free and none waiting (most calls)
        // takes its slot now and goes: no second look at the call or the session.
        let open = self
            .session_mut(session)
            .filter(|s| !large && s.phase == Phase::Open && s.waiting.is_empty());
        let ready = open.and_then(|s| {
            let conn = s.conn?;
            Some((s.free_slots.pop()?, conn, s.room()))
        });
        if let Some((slot, conn, room)) = ready {
            let call = Call {
                session,
                ty,
                group: None,
                slot: Some(slot),
                request: None,
                arena: None,
                len,
                then,
            };
            let id = match self.insert_call(call) {
                Ok(id) => id,
                Err(e) => {
                    if let Some(s) = self.session_mut(session) {
                        s.free_slots.push(slot);
                    }
                    return Err(e);
                }
            };
            self.metrics.calls += 1;
            self.push_deadline(cx, id, timeout);
            let Some(cs) =
                self.session_mut(session).and_then(|s| s.slots.get_mut(usize::from(slot)))
            else {
                self.missed(); // (the session was looked at above, on this thread)
                return Ok(id);
            };
            let header = Header { slot, seq: cs.occupy(id, None), ..header };
            header.write_to(buf.as_mut_slice());
            self.queue_send(cx, Outgoing { conn, ty, token: id.0, room, session, slot, buf });
            return Ok(id);
        }
        header.write_to(buf.as_mut_slice());
        let call =
            Call { session, ty, group: None, slot: None, request: Some(buf), arena, len, then };
        self.call_later(cx, call, None, timeout)
    }

    /// A large call made while every arena slot is out: its payload waits in `bytes`, and
    /// the call in its session's queue, until a slot is free.
    #[cold]
    #[inline(never)]
    fn call_without_slot(
        &mut self,
        cx: &mut Cx<P>,
        ask: Ask,
        mut buf: Buf<P>,
        bytes: Box<[u8]>,
        then: Continuation<P>,
    ) -> Result<CallId, (RpcError, Continuation<P>)> {
        let Ask { session, ty, len, timeout } = ask;
        request_header(session, ty, len, true).write_to(buf.as_mut_slice());
        let (request, len) = (Some(buf), len as u32);
        let call = Call { session, ty, group: None, slot: None, request, arena: None, len, then };
        self.call_later(cx, call, Some(bytes), timeout)
    }

    /// A call that does not go at once (no credit free, others waiting, the session not open
    /// yet, or a large one): made, and sent now if it can go after all, else queued; one
    /// whose payload waits for an arena slot (`unslotted`) is queued behind the others.
    #[inline(never)]
    fn call_later(
        &mut self,
        cx: &mut Cx<P>,
        call: Call<P>,
        unslotted: Option<Box<[u8]>>,
        timeout: Duration,
    ) -> Result<CallId, (RpcError, Continuation<P>)> {
        let session = call.session;
        let id = self.insert_call(call)?;
        self.metrics.calls += 1;
        self.push_deadline(cx, id, timeout);
        let waits_for_slot = unslotted.is_some();
        if let Some(bytes) = unslotted {
            self.unslotted.push((id, bytes));
        }
        let Some(s) = self.session_mut(session) else { return Ok(id) };
        if waits_for_slot {
            // (after the session's waiting calls; it goes once a slot is free, and the calls
            // made after it wait behind it)
            s.waiting.push_back(id);
            s.queued += 1;
            self.metrics.waited += 1;
            self.metrics.slot_waits += 1;
            self.dispatch_waiting(cx, session);
        } else if s.phase == Phase::Open && s.waiting.is_empty() && !s.free_slots.is_empty() {
            self.send_call(cx, session, id);
        } else {
            s.waiting.push_back(id);
            s.queued += 1;
            self.metrics.waited += 1;
        }
        Ok(id)
    }

    /// The registered buffer of a request of `len` payload bytes on `session`, its payload
    /// written by `fill` (a large one's into an arena slot, the buffer left for its
    /// descriptor; with every slot out, into a vector it keeps until one is free), and
    /// whether it is large.
    fn request_buffer(
        &mut self,
        cx: &mut Cx<P>,
        session: SessionId,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> std::result::Result<(Buf<P>, Option<ArenaSlot>, bool), NotMade<P>> {
        let Some(s) = self.session(session) else { return Err(self.gone(session).into()) };
        if !s.served.is_empty() {
            return Err(RpcError::NoSuchSession(session).into());
        }
        if s.phase == Phase::Closing {
            return Err(RpcError::SessionClosed.into());
        }
        // While connecting, the peer's receive is taken to be this worker's (the engine
        // refuses the send if it is smaller).
        let small = match s.phase {
            Phase::Open => s.peer_max,
            _ => cx.recv_size().saturating_sub(HEADER),
        };
        let large = len > small;
        if large && len > self.cfg.large_max {
            return Err(RpcError::TooLarge { len, max: small.max(self.cfg.large_max) }.into());
        }
        if self.live_calls >= self.cfg.max_calls as usize {
            return Err(RpcError::TooManyCalls { max: self.cfg.max_calls as usize }.into());
        }
        if !large {
            let mut buf = self.request_buf(cx, HEADER + len).map_err(RpcError::from)?;
            fill(&mut buf.as_mut_slice()[HEADER..]);
            return Ok((buf, None, false));
        }
        self.ensure_arena(cx)?;
        let Some(arena) = &self.arena else {
            return Err(RpcError::NoLargeBuffers { len }.into());
        };
        let buf = cx.alloc(HEADER + DESCRIPTOR).map_err(RpcError::from)?;
        let Some(mut slot) = arena.take() else {
            let mut bytes = vec![0; len];
            fill(&mut bytes);
            return Err(NotMade::NoSlot(buf, bytes.into_boxed_slice()));
        };
        fill(arena.bytes_mut(&mut slot, len));
        Ok((buf, Some(slot), true))
    }

    /// A buffer of `len` bytes for a request: the spare one when it holds them, else the
    /// pool's.
    #[inline(always)]
    fn request_buf(&mut self, cx: &Cx<P>, len: usize) -> Result<Buf<P>, EngineError> {
        match self.spare.take() {
            Some(mut b) if len <= b.capacity() => b.set_len(len).map(|()| b),
            _ => cx.alloc(len),
        }
    }

    /// Gives call `id` (waiting at the head of its session's queue) an arena slot for its
    /// large payload, if it waits for one: false when none is free (it stays waiting).
    fn slot_for(&mut self, id: CallId) -> bool {
        let Some(at) = self.unslotted.iter().position(|(c, _)| *c == id) else { return true };
        let Endpoint { calls, arena, unslotted, .. } = self;
        let Some(c) = calls.get_mut(id.index()).and_then(|e| e.call.as_mut()) else { return true };
        let Some((arena, mut slot)) = arena.as_ref().and_then(|a| Some((a, a.take()?))) else {
            return false;
        };
        let (_, bytes) = unslotted.swap_remove(at);
        arena.bytes_mut(&mut slot, bytes.len()).copy_from_slice(&bytes);
        c.arena = Some(slot);
        true
    }

    /// An arena slot may have come back: the sessions whose next call waits for one send
    /// what they can (each pass; nothing to do unless one waits and a slot is free).
    #[inline]
    pub(crate) fn slot_freed(&mut self, cx: &mut Cx<P>) {
        if self.want_slot.is_empty() || !self.arena.as_ref().is_some_and(|a| a.has_free()) {
            return;
        }
        // (the payloads of calls that ended while they waited go)
        let mut unslotted = std::mem::take(&mut self.unslotted);
        unslotted.retain(|(id, _)| self.call_live(*id));
        self.unslotted = unslotted;
        for session in std::mem::take(&mut self.want_slot) {
            self.dispatch_waiting(cx, session);
        }
    }

    /// Notes call `id`'s timeout; its deadline is dated at the next look at the deadlines
    /// (`expire`), so that making a call reads no clock (a system call in some guests). A
    /// call therefore times out between `timeout` and `timeout` plus one look's period after
    /// it was made, never before.
    fn push_deadline(&mut self, cx: &Cx<P>, id: CallId, timeout: Duration) {
        if self.fresh.len() + self.deadlines.len() >= 2 * self.cfg.max_calls as usize {
            // Within the capacity reserved at start (the live calls are at most half).
            self.settle(cx.now());
        }
        self.fresh.push((id.0, timeout));
    }

    /// Dates the calls made since the last look (`now` + their timeouts), those still live.
    fn settle(&mut self, now: Instant) {
        if self.fresh.is_empty() {
            return;
        }
        let mut fresh = std::mem::take(&mut self.fresh);
        for &(id, timeout) in &fresh {
            if !self.call_live(CallId(id)) {
                continue; // (answered already: most calls of a busy session)
            }
            if self.deadlines.len() >= 2 * self.cfg.max_calls as usize {
                self.compact_deadlines();
            }
            self.deadlines.push(Reverse((now + timeout, id)));
        }
        fresh.clear();
        self.fresh = fresh;
    }

    /// Keeps only the deadlines of calls still live (each has one).
    fn compact_deadlines(&mut self) {
        let mut heap = std::mem::take(&mut self.deadlines);
        heap.retain(|Reverse((_, id))| self.call_live(CallId(*id)));
        self.deadlines = heap;
    }

    /// Sends call `id` on a free slot of open session `session` (both checked by the caller).
    fn send_call(&mut self, cx: &mut Cx<P>, session: SessionId, id: CallId) {
        let taken = self.calls.get_mut(id.index()).and_then(|e| match &mut e.call {
            Some(c) if e.generation == id.generation() => {
                c.request.take().map(|buf| (buf, c.arena.take(), c.len, c.ty))
            }
            _ => None,
        });
        let Some((mut buf, arena_slot, len, ty)) = taken else { return self.missed() };
        let Some(region) = self.session(session).map(|s| s.region) else { return };
        if let Some(a) = &arena_slot {
            if !self.describe(region, a, len, &mut buf) {
                if let Some(call) = self.take_call(id) {
                    let why = RpcError::NoLargeBuffers { len: len as usize };
                    self.finish(cx, call, Err(why));
                }
                return;
            }
        }
        let Some(s) = self.session_mut(session) else { return };
        let Some(slot) = s.free_slots.pop() else { return self.missed() };
        let seq = s.slots[usize::from(slot)].occupy(id, arena_slot);
        if let Some(call) = self.calls.get_mut(id.index()).and_then(|e| e.call.as_mut()) {
            call.slot = Some(slot);
        }
        let m = buf.as_mut_slice();
        // The slot and sequence number, now known (header bytes 6..8 and 12..20).
        m[6..8].copy_from_slice(&slot.to_le_bytes());
        m[12..20].copy_from_slice(&seq.to_le_bytes());
        self.post_request(cx, session, slot, id, ty, buf);
    }

    /// Writes into a large request's buffer its descriptor: where `session`'s peer (granted
    /// `region`) reads the payload of `len` bytes in arena slot `a`. False without a region.
    pub(super) fn describe(
        &self,
        region: Option<RemoteRegion>,
        a: &ArenaSlot,
        len: u32,
        buf: &mut Buf<P>,
    ) -> bool {
        let (Some(region), Some(arena)) = (region, &self.arena) else { return false };
        let d = arena.descriptor(a, region, len);
        buf.as_mut_slice()[HEADER..HEADER + DESCRIPTOR].copy_from_slice(&d.encode());
        true
    }

    /// Sends call `id`'s request `buf` (its header complete) on `slot` of open session
    /// `session` (now, or packed at the end of the pass); a refusal ends the call with why
    /// (and frees the slot).
    pub(super) fn post_request(
        &mut self,
        cx: &mut Cx<P>,
        session: SessionId,
        slot: u16,
        id: CallId,
        ty: ReqType,
        buf: Buf<P>,
    ) {
        let Some((conn, room)) = self.session(session).and_then(|s| Some((s.conn?, s.room())))
        else {
            return self.missed();
        };
        self.queue_send(cx, Outgoing { conn, ty, token: id.0, room, session, slot, buf });
    }

    /// The engine refused to send call `id`'s request (on `session`'s `slot`) for `e`: the
    /// call ends with why, and its slot is free again.
    pub(super) fn request_refused(
        &mut self,
        cx: &mut Cx<P>,
        session: SessionId,
        slot: u16,
        id: CallId,
        e: EngineError,
    ) {
        let down =
            matches!(e, EngineError::ConnectionClosing(_) | EngineError::NoSuchConnection(_));
        let why = match e {
            EngineError::MessageTooLarge { len, max, .. } => {
                let (len, max) =
                    (len.saturating_sub(HEADER), (max as usize).saturating_sub(HEADER));
                RpcError::TooLarge { len, max }
            }
            EngineError::ConnectionClosing(_) | EngineError::NoSuchConnection(_) => {
                RpcError::SessionClosed
            }
            e => RpcError::Engine(e),
        };
        // (the call may have timed out while its request waited to be packed: its slot is
        // abandoned then, and freed all the same, as no answer comes)
        let held = self
            .session(session)
            .and_then(|s| s.slots.get(usize::from(slot)))
            .is_some_and(|cs| cs.used == SlotUse::Call(id) || cs.used == SlotUse::Abandoned);
        if held {
            self.free_slot(session, slot);
        }
        if down {
            self.going_down(session);
        }
        if let Some(call) = self.take_call(id) {
            self.finish(cx, call, Err(why));
        }
    }

    pub(super) fn free_slot(&mut self, session: SessionId, slot: u16) {
        if let Some(s) = self.session_mut(session) {
            s.free_slot(slot);
        }
    }

    /// Sends waiting calls of `session` while it has credits.
    pub(super) fn dispatch_waiting(&mut self, cx: &mut Cx<P>, session: SessionId) {
        loop {
            let Some(s) = self.session_mut(session) else { return };
            if s.phase != Phase::Open || s.free_slots.is_empty() {
                return;
            }
            let Some(&id) = s.waiting.front() else { return };
            let live = self.call_live(id);
            if live && !self.slot_for(id) {
                // (its payload waits for an arena slot, and the calls behind it wait too)
                if !self.want_slot.contains(&session) {
                    self.want_slot.push(session);
                }
                return;
            }
            let Some(s) = self.session_mut(session) else { return };
            s.waiting.pop_front();
            if live {
                s.queued = s.queued.saturating_sub(1);
                self.send_call(cx, session, id);
            }
        }
    }

    /// Ends the calls whose deadline passed (looked at every [`EXPIRE_EVERY`] loop
    /// iterations: it reads the clock, which the loop otherwise reads only when it needs to).
    /// The loop's look (every iteration) is the countdown alone, inline; the pass that reads
    /// the clock is a function of its own.
    #[inline]
    pub(crate) fn expire(&mut self, cx: &mut Cx<P>) {
        if self.expire_in > 0 {
            self.expire_in -= 1;
            return;
        }
        if self.deadlines.is_empty() && self.fresh.is_empty() && self.parked.is_empty() {
            return;
        }
        self.expire_due(cx);
    }

    /// [`Endpoint::expire`]'s pass over the deadlines.
    #[inline(never)]
    fn expire_due(&mut self, cx: &mut Cx<P>) {
        self.expire_in = EXPIRE_EVERY - 1;
        let now = cx.now();
        self.expire_parked(now);
        self.settle(now);
        while let Some(&Reverse((due, id))) = self.deadlines.peek() {
            if due > now {
                return;
            }
            self.deadlines.pop();
            let id = CallId(id);
            let Some(call) = self.take_call(id) else { continue };
            if call.slot.is_none() && call.request.is_some() {
                // It was waiting for a credit (its id stays queued, skipped when it comes up).
                if let Some(s) = self.session_mut(call.session) {
                    s.queued = s.queued.saturating_sub(1);
                }
            }
            if let Some(slot) = call.slot {
                if let Some(cs) =
                    self.session_mut(call.session).and_then(|s| s.slots.get_mut(usize::from(slot)))
                {
                    if cs.used == SlotUse::Call(id) {
                        cs.used = SlotUse::Abandoned;
                    }
                }
            }
            self.finish(cx, call, Err(RpcError::Timeout));
        }
    }

    /// A large response's payload is here: its call ends.
    #[inline(never)]
    pub(super) fn response_read(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        let (session, slot, seq) = token_slot(done.token);
        let Some(cs) = self.session_mut(session).and_then(|s| s.slots.get_mut(usize::from(slot)))
        else {
            return;
        };
        if cs.seq & TOKEN_SEQ_MASK != seq || !cs.reading {
            return;
        }
        cs.reading = false;
        let Some(buf) = done.buf else { return self.missed() };
        self.end_slot(cx, session, slot, Ok(buf.as_slice()));
    }

    pub(super) fn on_response(
        &mut self,
        cx: &mut Cx<P>,
        session: SessionId,
        h: &Header,
        payload: &[u8],
    ) -> Result<(), Malformed> {
        if h.session != session {
            return Err(Malformed::Session(h.session.to_wire()));
        }
        let large_max = self.cfg.large_max;
        let Some(s) = self.session_mut(session) else { return Ok(()) };
        let conn = s.conn;
        let cs = s.slots.get_mut(usize::from(h.slot)).ok_or(Malformed::Slot(h.slot))?;
        if cs.seq != h.seq || cs.used == SlotUse::Free || cs.reading {
            self.metrics.stale += 1;
            return Ok(());
        }
        if h.large && cs.used == SlotUse::Abandoned {
            // Its call timed out: nothing to read for; the slot is free again.
            Descriptor::decode(payload)?;
            self.end_slot(cx, session, h.slot, Err(RpcError::Timeout));
            return Ok(());
        }
        if h.large {
            // The payload is the server's to read: the call ends when it is here.
            let d = Descriptor::decode(payload)?;
            let (len, Some(conn)) = (d.len as usize, conn) else { return Ok(()) };
            if len > large_max {
                let why = RpcError::TooLarge { len, max: large_max };
                self.end_slot(cx, session, h.slot, Err(why));
                return Ok(());
            }
            let buf = match cx.alloc(len) {
                Ok(b) => b,
                Err(e) => {
                    self.end_slot(cx, session, h.slot, Err(e.into()));
                    return Ok(());
                }
            };
            cs.reading = true;
            let remote = RemoteAddr { addr: d.addr, rkey: d.rkey };
            let token = slot_token(CLIENT_READ, session, h.slot, h.seq);
            if let Err((_, e)) = cx.read(conn, buf, remote, token) {
                self.end_slot(cx, session, h.slot, Err(e.into()));
            }
            return Ok(());
        }
        let outcome = match h.kind {
            Kind::Error => Err(error_of(h.status, payload)),
            _ => Ok(payload),
        };
        self.end_slot(cx, session, h.slot, outcome);
        Ok(())
    }

    /// The answer to `session`'s `slot` is here: the slot is free again, the waiting calls go,
    /// and the slot's call (if it did not time out) ends with `outcome`.
    fn end_slot(
        &mut self,
        cx: &mut Cx<P>,
        session: SessionId,
        slot: u16,
        outcome: Result<&[u8], RpcError>,
    ) {
        let Some(s) = self.session_mut(session) else { return };
        let used = s.free_slot(slot);
        // Waiting calls go before anything the continuation calls (the session's order).
        if !s.waiting.is_empty() {
            self.dispatch_waiting(cx, session);
        }
        let SlotUse::Call(id) = used else {
            // The answer to a call that timed out: its credit is back.
            self.metrics.stale += 1;
            return;
        };
        if let Some(call) = self.take_call(id) {
            self.finish(cx, call, outcome);
        }
    }
}

/// The header of a request of `len` payload bytes (a large one's carries its descriptor),
/// before its slot and sequence number are known.
#[inline(always)]
fn request_header(session: SessionId, ty: ReqType, len: usize, large: bool) -> Header {
    Header {
        kind: Kind::Request,
        ty,
        slot: 0,
        session,
        seq: 1,
        len: if large { DESCRIPTOR as u32 } else { len as u32 },
        status: Status::Ok,
        large,
        resent: false,
    }
}

/// The error an error message names.
fn error_of(status: Status, payload: &[u8]) -> RpcError {
    let (a, b) = wire::error_args(payload);
    match status {
        Status::NoSuchType => RpcError::NoSuchType(ReqType(a as u16)),
        Status::TooLarge => RpcError::TooLarge { len: a as usize, max: b as usize },
        Status::Rejected => RpcError::Rejected { code: a },
        Status::Lost => RpcError::OutcomeUnknown,
        Status::Busy if a == wire::RAN => RpcError::Unanswered,
        Status::Busy | Status::Ok => RpcError::PeerBusy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: u32, b: u32) -> Vec<u8> {
        [a.to_le_bytes(), b.to_le_bytes()].concat()
    }

    #[test]
    fn a_busy_answer_says_whether_its_request_ran() {
        assert!(matches!(error_of(Status::Busy, &args(0, 0)), RpcError::PeerBusy));
        assert!(matches!(error_of(Status::Busy, &args(wire::RAN, 0)), RpcError::Unanswered));
        // (a short payload reads as no arguments: not run)
        assert!(matches!(error_of(Status::Busy, &[]), RpcError::PeerBusy));
        let e = error_of(Status::TooLarge, &args(9, 4));
        assert!(matches!(e, RpcError::TooLarge { len: 9, max: 4 }), "{e:?}");
    }
}
