//! The server side of an endpoint: requests, their handlers, and the answers kept for
//! at-most-once execution.

use corelink_engine::verbs::{Provider, RemoteAddr, RemoteRegion};
use corelink_engine::{Buf, ConnId, Cx, Done};

use super::packer::Outgoing;
use super::{
    slot_token, token_slot, Endpoint, Reply, Session, RESPONSE_TOKEN, SERVER_READ, TOKEN_SEQ_MASK,
};
use crate::error::{Malformed, RpcError};
use crate::ids::{ReqType, SessionId};
use crate::large::{Arena, ArenaSlot};
use crate::service::{Reject, Request, Response};
use crate::wire::{Descriptor, Header, Kind, Status, DESCRIPTOR, ERROR_PAYLOAD, HEADER, RAN};

/// The request an answer goes to: its type, the client's slot and session, its sequence
/// number (what the answer's header repeats).
#[derive(Clone, Copy, Debug)]
struct Asked {
    ty: ReqType,
    slot: u16,
    client: SessionId,
    seq: u64,
}

impl Asked {
    /// The request `h` heads.
    fn of(h: &Header) -> Asked {
        Asked { ty: h.ty, slot: h.slot, client: h.session, seq: h.seq }
    }
}

/// A request that waits for its turn in its session's order: a large one while its payload is
/// read, and every request after it until it ran (a small one's payload copied out of its
/// receive, which goes back to the device).
pub(super) struct Held<P: Provider> {
    asked: Asked,
    payload: HeldPayload<P>,
}

enum HeldPayload<P: Provider> {
    /// A small request's payload.
    Bytes(Vec<u8>),
    /// A large request's payload, being read.
    Reading,
    /// A large request's payload, read.
    Read(Buf<P>),
}

impl<P: Provider> Session<P> {
    /// The connection is lost with requests held: none of them ran, so each slot forgets it
    /// (its sequence number back by one, a read in flight no longer awaited), and the request
    /// runs when the client sends it again.
    pub(super) fn forget_held(&mut self) {
        for h in std::mem::take(&mut self.held) {
            let Some(ss) = self.served.get_mut(usize::from(h.asked.slot)) else { continue };
            if ss.seq == h.asked.seq {
                ss.seq -= 1;
                ss.reading = false;
            }
        }
    }
}

impl<P: Provider> Endpoint<P> {
    /// The answer with `token` went (its send completed, or it was packed): its buffer is
    /// kept for its slot, or sent again when its request came again meanwhile.
    #[inline(always)]
    pub(super) fn answer_sent(&mut self, cx: &mut Cx<P>, token: u64, buf: Option<Buf<P>>) {
        let (session, slot, seq) = token_slot(token);
        let Some(s) = self.session_mut(session) else { return };
        let (conn, room) = (s.conn, s.room());
        let Some(ss) = s.served.get_mut(usize::from(slot)) else { return };
        if ss.seq & TOKEN_SEQ_MASK != seq || ss.stored.is_some() {
            return; // an older response (acknowledged since), or a second copy
        }
        match (std::mem::take(&mut ss.resend), conn, buf) {
            (true, Some(conn), Some(buf)) => {
                let ty = header_type(&buf);
                self.queue_send_apart(cx, Outgoing { conn, ty, token, room, session, slot, buf });
            }
            (_, _, buf) => ss.stored = buf,
        }
    }

    /// A large request's payload is here: its handler runs.
    #[inline(never)]
    pub(super) fn request_read(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        let (session, slot, seq) = token_slot(done.token);
        let Some(ss) = self.session_mut(session).and_then(|s| s.served.get_mut(usize::from(slot)))
        else {
            return;
        };
        if ss.seq & TOKEN_SEQ_MASK != seq {
            return;
        }
        let (true, Some(buf)) = (std::mem::take(&mut ss.reading), done.buf) else { return };
        // Its place in the session's order (held since it came), now ready to run.
        let held = self.session_mut(session).and_then(|s| {
            s.held
                .iter_mut()
                .find(|h| h.asked.slot == slot && matches!(h.payload, HeldPayload::Reading))
        });
        let Some(h) = held else { return self.missed() };
        h.payload = HeldPayload::Read(buf);
        self.run_held(cx, session);
    }

    /// Runs `session`'s held requests that are ready, in order, up to the first whose payload
    /// is still being read.
    #[inline(never)]
    fn run_held(&mut self, cx: &mut Cx<P>, session: SessionId) {
        loop {
            let Some(s) = self.session_mut(session) else { return };
            if s.held.front().is_none_or(|h| matches!(h.payload, HeldPayload::Reading)) {
                return;
            }
            let Some(Held { asked, payload }) = s.held.pop_front() else { return };
            match payload {
                HeldPayload::Bytes(b) => self.answer(cx, session, asked, &b),
                HeldPayload::Read(buf) => self.answer(cx, session, asked, buf.as_slice()),
                HeldPayload::Reading => {}
            }
        }
    }

    /// Holds small request `asked` (its payload copied) behind the session's held ones.
    #[cold]
    #[inline(never)]
    fn hold_small(&mut self, session: SessionId, asked: Asked, payload: &[u8]) {
        self.metrics.held += 1;
        self.hold(session, asked, HeldPayload::Bytes(payload.to_vec()));
    }

    /// Holds request `asked` behind the session's held ones (its order).
    fn hold(&mut self, session: SessionId, asked: Asked, payload: HeldPayload<P>) {
        if let Some(s) = self.session_mut(session) {
            s.held.push_back(Held { asked, payload });
        }
    }

    pub(super) fn on_request(
        &mut self,
        cx: &mut Cx<P>,
        session: SessionId,
        h: &Header,
        payload: &[u8],
    ) -> Result<(), Malformed> {
        let large_max = self.cfg.large_max;
        let Some(s) = self.session_mut(session) else { return Ok(()) };
        let (conn, room, behind) = (s.conn, s.room(), !s.held.is_empty());
        let (peer_max, region) = (s.peer_max, s.region);
        let ss = s.served.get_mut(usize::from(h.slot)).ok_or(Malformed::Slot(h.slot))?;
        let Some(conn) = conn else { return Ok(()) };
        // Sent before, to a server that kept no record of the session (a restart, or its
        // resume time passed): it may have run. Answered so, as a new request would be.
        let lost = h.resent && !ss.known;
        ss.known = true;
        if !lost && h.seq < ss.seq {
            self.metrics.stale += 1;
            return Ok(());
        }
        if !lost && h.seq == ss.seq {
            // Seen before: answered again from the stored response (once it is back, if its
            // first send is still on the device or its request is still being read).
            let stored = ss.stored.take();
            ss.resend = stored.is_none();
            self.metrics.duplicates += 1;
            let token = slot_token(RESPONSE_TOKEN, session, h.slot, h.seq);
            if let Some(buf) = stored {
                let (ty, slot) = (header_type(&buf), h.slot);
                self.queue_send_apart(cx, Outgoing { conn, ty, token, room, session, slot, buf });
            }
            return Ok(());
        }
        // A new request acknowledges the slot's last response.
        ss.begin(h.seq);
        if lost {
            self.metrics.lost += 1;
            let reply = error_reply(cx, Status::Lost, 0, 0);
            self.send_answer(cx, session, Asked::of(h), reply);
            return Ok(());
        }
        if !h.large {
            if behind {
                // (a large request before it is still being read: it runs after that one)
                self.hold_small(session, Asked::of(h), payload);
            } else {
                let to = To { conn, room, peer_max, region };
                self.answer_on(cx, session, Asked::of(h), payload, to);
            }
            return Ok(());
        }
        // A large request: its payload is read first, then its handler runs.
        let d = Descriptor::decode(payload)?;
        let len = d.len as usize;
        let refusal = if len > large_max {
            Some((Status::TooLarge, d.len, large_max as u32))
        } else {
            match cx.alloc(len) {
                Ok(buf) => {
                    ss.reading = true;
                    let remote = RemoteAddr { addr: d.addr, rkey: d.rkey };
                    let token = slot_token(SERVER_READ, session, h.slot, h.seq);
                    if cx.read(conn, buf, remote, token).is_err() {
                        ss.reading = false;
                        self.metrics.send_refused += 1;
                    } else {
                        // Requests after it wait for it (the session's order).
                        self.hold(session, Asked::of(h), HeldPayload::Reading);
                        self.metrics.held += u64::from(behind);
                    }
                    None
                }
                Err(_) => Some((Status::Busy, 0, 0)),
            }
        };
        if let Some((status, a, b)) = refusal {
            let reply = error_reply(cx, status, a, b);
            self.send_answer(cx, session, Asked::of(h), reply);
        }
        Ok(())
    }

    /// Runs the handler of the request `asked` on its payload and sends its answer.
    fn answer(&mut self, cx: &mut Cx<P>, session: SessionId, asked: Asked, payload: &[u8]) {
        let Some(s) = self.session(session) else { return };
        let (peer_max, region) = (s.peer_max, s.region);
        let reply = self.run_handler(cx, session, asked.ty, payload, peer_max, region);
        self.send_answer(cx, session, asked, reply);
    }

    /// [`Endpoint::answer`] of a request that came on `to.conn` and runs at once (most do):
    /// the session's values at hand, a small answer goes with no second look at it.
    #[inline(always)]
    fn answer_on(
        &mut self,
        cx: &mut Cx<P>,
        session: SessionId,
        asked: Asked,
        payload: &[u8],
        to: To,
    ) {
        let reply = self.run_handler(cx, session, asked.ty, payload, to.peer_max, to.region);
        let Some((mut buf, status, None)) = reply else {
            return self.send_answer(cx, session, asked, reply);
        };
        answer_header(asked, status, &buf, false).write_to(buf.as_mut_slice());
        let (conn, room, ty, slot) = (to.conn, to.room, asked.ty, asked.slot);
        let token = slot_token(RESPONSE_TOKEN, session, slot, asked.seq);
        self.queue_send(cx, Outgoing { conn, ty, token, room, session, slot, buf });
    }

    /// Sends `reply` (header room, then the payload or a large one's descriptor) as the answer
    /// to `session`'s request on `slot`; a large one's arena slot is kept with the slot.
    fn send_answer(
        &mut self,
        cx: &mut Cx<P>,
        session: SessionId,
        asked: Asked,
        reply: Option<Reply<P>>,
    ) {
        let Asked { ty, slot, seq, .. } = asked;
        let Some((mut buf, status, arena)) = reply else {
            self.metrics.no_buffer += 1;
            return;
        };
        answer_header(asked, status, &buf, arena.is_some()).write_to(buf.as_mut_slice());
        let Some(s) = self.session_mut(session) else { return };
        let room = s.room();
        let Some(ss) = s.served.get_mut(usize::from(slot)) else { return };
        ss.arena = arena;
        let Some(conn) = s.conn else {
            // Its connection was lost meanwhile (a large request's read was its last): the
            // answer is kept for the request to come again.
            ss.stored = Some(buf);
            return;
        };
        let token = slot_token(RESPONSE_TOKEN, session, slot, seq);
        self.queue_send(cx, Outgoing { conn, ty, token, room, session, slot, buf });
    }

    /// The reply to a new request (header room, then the payload or a large one's
    /// descriptor), its status and a large payload's arena slot: its handler's response, or
    /// an error message; `None` when no buffer was free even for an error.
    #[inline(always)]
    fn run_handler(
        &mut self,
        cx: &mut Cx<P>,
        session: SessionId,
        ty: ReqType,
        payload: &[u8],
        peer_max: usize,
        region: Option<RemoteRegion>,
    ) -> Option<Reply<P>> {
        let Endpoint { handlers, arena, metrics, .. } = self;
        let Some(handler) = handlers.get_mut(usize::from(ty.0)).and_then(Option::as_mut) else {
            return error_reply(cx, Status::NoSuchType, u32::from(ty.0), 0);
        };
        metrics.handled += 1;
        let request = Request { ty, session, data: payload };
        let arena = arena.as_ref().filter(|_| region.is_some());
        let mut response = Response::new(cx, peer_max, arena);
        let outcome = handler(&request, &mut response);
        let Response { buf, refused, large, .. } = response;
        match (outcome, refused, large, buf) {
            // (most answers: the small response the handler wrote)
            (Ok(()), None, None, Some(buf)) => Some((buf, Status::Ok, None)),
            (outcome, refused, large, buf) => {
                reply_of(cx, outcome, refused, buf, large, arena.zip(region))
            }
        }
    }
}

/// The reply to a request whose handler ran, as [`Endpoint::run_handler`] makes it in every
/// case but a small response.
#[inline(never)]
fn reply_of<P: Provider>(
    cx: &mut Cx<P>,
    outcome: Result<(), Reject>,
    refused: Option<RpcError>,
    buf: Option<Buf<P>>,
    large: Option<(ArenaSlot, usize)>,
    arena: Option<(&Arena<P>, RemoteRegion)>,
) -> Option<Reply<P>> {
    // (the handler ran: a response that finds no buffer says so, `RAN`)
    match (outcome, refused) {
        (_, Some(RpcError::TooLarge { len, max })) => {
            error_reply(cx, Status::TooLarge, len as u32, max as u32)
        }
        (_, Some(_)) => error_reply(cx, Status::Busy, RAN, 0),
        (Err(Reject(code)), None) => error_reply(cx, Status::Rejected, code, 0),
        (Ok(()), None) => match (large, buf, arena) {
            (Some((slot, len)), _, Some((arena, region))) => {
                let Ok(mut buf) = cx.alloc(HEADER + DESCRIPTOR) else {
                    return error_reply(cx, Status::Busy, RAN, 0);
                };
                let d = arena.descriptor(&slot, region, len as u32);
                buf.as_mut_slice()[HEADER..].copy_from_slice(&d.encode());
                Some((buf, Status::Ok, Some(slot)))
            }
            (_, Some(buf), _) => Some((buf, Status::Ok, None)),
            _ => match cx.alloc(HEADER) {
                Ok(buf) => Some((buf, Status::Ok, None)),
                Err(_) => error_reply(cx, Status::Busy, RAN, 0),
            },
        },
    }
}

/// Where a request's answer goes: its connection, the bytes one send to the client may
/// carry (its receive), the payload bytes of a small answer at most, and the endpoint's arena
/// as the client reads it (large answers).
#[derive(Clone, Copy)]
struct To {
    conn: ConnId,
    room: usize,
    peer_max: usize,
    region: Option<RemoteRegion>,
}

/// The header of the answer to `asked` in `buf` (header room, then its payload or a large
/// one's descriptor), with `status`.
#[inline(always)]
fn answer_header<P: Provider>(asked: Asked, status: Status, buf: &Buf<P>, large: bool) -> Header {
    let kind = if status == Status::Ok { Kind::Response } else { Kind::Error };
    let Asked { ty, slot, client, seq } = asked;
    let len = (buf.len() - HEADER) as u32;
    Header { kind, ty, slot, session: client, seq, len, status, large, resent: false }
}

/// The request type a stored answer's header names (bytes 4..6).
fn header_type<P: Provider>(buf: &Buf<P>) -> ReqType {
    let b = buf.as_slice();
    ReqType(u16::from_le_bytes([b.get(4).copied().unwrap_or(0), b.get(5).copied().unwrap_or(0)]))
}

/// An error message's buffer (header room, then the two arguments) and its status.
#[cold]
#[inline(never)]
fn error_reply<P: Provider>(cx: &Cx<P>, status: Status, a: u32, b: u32) -> Option<Reply<P>> {
    let mut buf = cx.alloc(HEADER + ERROR_PAYLOAD).ok()?;
    let m = buf.as_mut_slice();
    m[HEADER..HEADER + 4].copy_from_slice(&a.to_le_bytes());
    m[HEADER + 4..].copy_from_slice(&b.to_le_bytes());
    Some((buf, status, None))
}
