//! Small messages packed: the messages an endpoint sends to one peer in one pass of its
//! worker's loop go in as few sends as the peer's receive size allows. The pass's first
//! message to a peer goes at once from its own buffer, as it would unpacked (a lone call pays
//! nothing); the next ones are copied back to back into the connection's pack (each but the
//! last flagged [`wire::PACKED`]), which goes at the end of the pass (`Endpoint::flush_sends`,
//! before the engine posts its sends), when the next message would not fit, or before a
//! message to its connection that goes alone (the session's order). A window of small calls
//! then costs two sends and two receives each way per pass, not one per call.
//!
//! A message copied into a pack is over for its sender: a request's buffer is kept for a
//! resend (a resumable session) or freed, a response's kept for a duplicate, as their own
//! sends' completions would; the pack goes quietly (`Cx::send_quiet`: its completion would
//! only free its buffer, which the engine does). A message that goes alone and fits inline
//! goes quietly too (`send_alone`): an RPC's answer says its request arrived, and the next
//! request on a slot says its answer did.

use corelink_engine::verbs::Provider;
use corelink_engine::{Buf, ConnId, Cx, EngineError};

use super::{Endpoint, PACKED_TOKEN, RESPONSE_TOKEN, TOKEN_KIND};
use crate::ids::{CallId, ReqType, SessionId};
use crate::wire::{self, HEADER};

/// A message on its way: where it goes, what it is, and its buffer (header and payload).
pub(super) struct Outgoing<P: Provider> {
    pub(super) conn: ConnId,
    pub(super) ty: ReqType,
    /// Its engine token (a request's `CallId`, a response's slot token).
    pub(super) token: u64,
    /// Bytes the peer's receive holds: what one send to it may carry.
    pub(super) room: usize,
    /// The session and slot it is for (what a refused request frees).
    pub(super) session: SessionId,
    pub(super) slot: u16,
    pub(super) buf: Buf<P>,
}

/// A message in a pack: what a refusal of the pack's send ends.
#[derive(Clone, Copy)]
struct Part {
    token: u64,
    session: SessionId,
    slot: u16,
}

/// What a pack is written into: the engine's [`Buf`] (a vector in the tests).
pub(super) trait PackBuf {
    /// Its bytes (as long as it was asked for).
    fn bytes_mut(&mut self) -> &mut [u8];
    /// Shortens it to `len` bytes; false when it is shorter.
    fn truncate_to(&mut self, len: usize) -> bool;
}

impl<P: Provider> PackBuf for Buf<P> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }

    fn truncate_to(&mut self, len: usize) -> bool {
        len <= self.len() && self.set_len(len).is_ok()
    }
}

/// One connection's packed messages of this pass (`K` names the connection).
struct Pack<B, K> {
    conn: K,
    /// Bytes its send may carry (the peer's receive, at most the largest pool buffer).
    room: usize,
    /// Bytes so far.
    len: usize,
    /// The packed send's buffer (`len` bytes written; `room` long).
    buf: Option<B>,
    /// Where the last message copied in starts (flagged packed when another follows).
    last_at: usize,
    /// The messages copied in, in order.
    parts: Vec<Part>,
}

/// What names a connection to the packer: the engine's `ConnId` (a number in the tests).
pub(super) trait PackKey: Copy + PartialEq {
    /// Its slot on the worker (below `worker.max_conns`): where its pass mark is kept.
    fn slot(self) -> usize;
}

impl PackKey for ConnId {
    #[inline(always)]
    fn slot(self) -> usize {
        self.index()
    }
}

/// The connections sent to in this pass, and their packs (`K` names a connection: the
/// engine's `ConnId`; a number in the tests).
pub(super) struct Packer<B, K = ConnId> {
    /// Bytes a message may have to go packed (0: none does).
    max: usize,
    /// Bytes of the worker's largest pool buffer: what one pack may hold at most.
    largest: usize,
    /// The pass's number (never 0; a new pass is a new number: nothing to clear).
    pass: u32,
    /// Per connection slot, the last pass a message went to it (the next ones in that pass
    /// pack). A slot's later connection in the same pass counts as seen: it packs, which
    /// only defers its message to the end of the pass.
    marks: Vec<u32>,
    /// Packs `..open` are this pass's; those after are kept for their vectors' room.
    packs: Vec<Pack<B, K>>,
    open: usize,
    /// Connections seen, and packs open, at once at most.
    cap: usize,
}

impl<B: PackBuf, K: PackKey> Packer<B, K> {
    /// A packer for messages of at most `max` bytes, into buffers of at most `largest` bytes,
    /// with at most `cap` connections' packs open at once, for a worker of `conns`
    /// connection slots.
    pub(super) fn new(max: usize, cap: usize, largest: usize, conns: usize) -> Self {
        let cap = if max == 0 { 0 } else { cap };
        Packer {
            max,
            largest,
            pass: 1,
            marks: vec![0; if cap == 0 { 0 } else { conns }],
            packs: Vec::with_capacity(cap),
            open: 0,
            cap,
        }
    }

    /// Whether a message of `len` bytes to a peer whose receive holds `room` may go packed
    /// (it is small, and another fits beside it).
    #[inline]
    pub(super) fn takes(&self, len: usize, room: usize) -> bool {
        len <= self.max && len + HEADER <= room.min(self.largest)
    }

    /// Notes a message to `conn` in this pass; false when one went before (this one packs).
    /// A connection past the slots the packer was made for is never seen (its messages go
    /// alone).
    #[inline]
    fn first_to(&mut self, conn: K) -> bool {
        let Some(mark) = self.marks.get_mut(conn.slot()) else { return true };
        let first = *mark != self.pass;
        *mark = self.pass;
        first
    }

    /// Starts a new pass: every connection's next message is its first.
    #[inline]
    fn next_pass(&mut self) {
        self.pass = self.pass.wrapping_add(1);
        if self.pass == 0 {
            // (after 2^32 passes: the marks, which may hold any number, start over)
            self.marks.fill(0);
            self.pass = 1;
        }
    }

    #[cfg(test)]
    fn is_empty_of_packs(&self) -> bool {
        self.open == 0
    }

    /// The open pack of `conn`.
    #[inline]
    fn find(&self, conn: K) -> Option<usize> {
        self.packs[..self.open].iter().position(|p| p.conn == conn)
    }

    /// Opens a pack for `conn` in `buf` (`room` bytes); false when `cap` are open.
    fn start(&mut self, conn: K, room: usize, buf: B) -> Result<usize, B> {
        if self.open == self.cap {
            return Err(buf);
        }
        if self.open == self.packs.len() {
            let parts = Vec::new();
            self.packs.push(Pack { conn, room, len: 0, buf: None, last_at: 0, parts });
        }
        let p = &mut self.packs[self.open];
        (p.conn, p.room, p.len, p.buf, p.last_at) = (conn, room, 0, Some(buf), 0);
        p.parts.clear();
        self.open += 1;
        Ok(self.open - 1)
    }

    /// Closes pack `i`: its connection and buffer (its parts stay at `self.open` until
    /// another pack opens).
    fn close(&mut self, i: usize) -> Option<(K, B)> {
        self.open -= 1;
        self.packs.swap(i, self.open);
        let p = &mut self.packs[self.open];
        let mut buf = p.buf.take()?;
        buf.truncate_to(p.len).then_some((p.conn, buf))
    }

    /// Copies `msg` (of a message with `part`) into open pack `i`; false when it does not fit.
    fn append(&mut self, i: usize, msg: &[u8], part: Part) -> bool {
        let p = &mut self.packs[i];
        let Some(buf) = p.buf.as_mut().filter(|_| p.len + msg.len() <= p.room) else {
            return false;
        };
        let last = (!p.parts.is_empty()).then_some(p.last_at);
        copy_in(buf.bytes_mut(), p.len, last, msg);
        p.last_at = p.len;
        p.len += msg.len();
        p.parts.push(part);
        true
    }

    /// Gives back the parts vector of the pack closed at `at`, unless that place is open again.
    fn give_parts(&mut self, at: usize, mut parts: Vec<Part>) {
        parts.clear();
        if let Some(p) = self.packs.get_mut(at).filter(|_| at >= self.open) {
            if p.parts.capacity() < parts.capacity() {
                p.parts = parts;
            }
        }
    }
}

/// Copies `msg` into `out` at `at`, flagging the message at `last` (the one before it) packed
/// when there is one.
fn copy_in(out: &mut [u8], at: usize, last: Option<usize>, msg: &[u8]) {
    out[at..at + msg.len()].copy_from_slice(msg);
    if let Some(last) = last {
        wire::mark_packed(&mut out[last..]);
    }
}

/// A send's refusal again, for the next message of a refused pack (a send is refused with
/// these plain values; another reason, which a send does not give, reads as the connection
/// going: its close then ends the calls).
fn again(e: &EngineError, conn: ConnId) -> EngineError {
    match *e {
        EngineError::NoSuchConnection(c) => EngineError::NoSuchConnection(c),
        EngineError::QueueFull(c) => EngineError::QueueFull(c),
        EngineError::TooManyRequests { limit } => EngineError::TooManyRequests { limit },
        EngineError::MessageTooLarge { conn, len, max } => {
            EngineError::MessageTooLarge { conn, len, max }
        }
        _ => EngineError::ConnectionClosing(conn),
    }
}

impl<P: Provider> Endpoint<P> {
    /// Sends `o`: now when it is the pass's first to its peer, large, or of a class (after
    /// what waits for its connection: the session's order); else packed with the pass's
    /// other messages to its peer.
    #[inline]
    pub(super) fn queue_send(&mut self, cx: &mut Cx<P>, o: Outgoing<P>) {
        let packs = self.packer.takes(o.buf.len(), o.room) && self.class(o.ty).is_none();
        if packs && !self.packer.first_to(o.conn) {
            return self.pack(cx, o);
        }
        self.send_pack_of(cx, o.conn);
        self.send_alone(cx, o);
    }

    /// [`Endpoint::queue_send`] in a call of its own, for rare paths of hot functions (its
    /// code stays out of theirs).
    #[inline(never)]
    pub(super) fn queue_send_apart(&mut self, cx: &mut Cx<P>, o: Outgoing<P>) {
        self.queue_send(cx, o);
    }

    /// Sends `conn`'s pack, if one is open (before something else goes on the connection).
    #[inline]
    pub(super) fn send_pack_of(&mut self, cx: &mut Cx<P>, conn: ConnId) {
        if self.packer.open > 0 {
            if let Some(i) = self.packer.find(conn) {
                self.send_pack(cx, i);
            }
        }
    }

    /// Copies `o` into its connection's pack (opened, or sent and opened again, when it
    /// does not hold `o`); alone when no buffer is free for a pack.
    #[inline(never)]
    fn pack(&mut self, cx: &mut Cx<P>, o: Outgoing<P>) {
        let len = o.buf.len();
        let i = match self.packer.find(o.conn) {
            Some(i) if self.packer.packs[i].len + len <= self.packer.packs[i].room => Some(i),
            Some(i) => {
                self.send_pack(cx, i); // (full: this one starts the next)
                None
            }
            None => None,
        };
        let i = match i {
            Some(i) => i,
            None => {
                let room = o.room.min(self.packer.largest);
                let Ok(buf) = cx.alloc(room) else { return self.send_alone(cx, o) };
                match self.packer.start(o.conn, room, buf) {
                    Ok(i) => i,
                    Err(_) => return self.send_alone(cx, o), // (packs for `cap` peers)
                }
            }
        };
        let part = Part { token: o.token, session: o.session, slot: o.slot };
        if !self.packer.append(i, o.buf.as_slice(), part) {
            return self.send_alone(cx, o);
        }
        self.copied(cx, o);
    }

    /// Sends the open packs and forgets the pass's peers (run at the end of each pass,
    /// before the engine posts its sends).
    #[inline]
    pub(crate) fn flush_sends(&mut self, cx: &mut Cx<P>) {
        self.packer.next_pass();
        while self.packer.open > 0 {
            self.send_pack(cx, self.packer.open - 1);
        }
    }

    /// Sends open pack `i`.
    #[inline(never)]
    fn send_pack(&mut self, cx: &mut Cx<P>, i: usize) {
        let Some((conn, packed)) = self.packer.close(i) else {
            return self.metrics.invariant_misses += 1; // (a pack holds its buffer)
        };
        let at = self.packer.open;
        let n = self.packer.packs[at].parts.len();
        // (quiet: its completion would only free its buffer, which the engine does)
        let Err((_, e)) = cx.send_quiet(conn, packed, PACKED_TOKEN) else {
            self.metrics.packs += 1;
            self.metrics.packed += n as u64;
            return;
        };
        // Each message is refused as its own send would have been (the calls that end may
        // open packs, so the parts are taken out meanwhile: a rare path, which may allocate).
        let parts = std::mem::take(&mut self.packer.packs[at].parts);
        for &Part { token, session, slot } in &parts {
            self.refused(cx, token, session, slot, again(&e, conn));
        }
        self.packer.give_parts(at, parts);
    }

    /// Sends `o` in a send of its own (in its callers' code: the common path, `queue_send`,
    /// makes no call for it). One that fits inline goes quietly (`Cx::send_quiet`: no
    /// completion, on the device or in the worker): a request that is never sent again from
    /// its own buffer, anything else as a copy, so that it is done with at once, as a packed
    /// message is (a response kept for a duplicate, a resumable session's request for a
    /// resend). A larger one goes from its own buffer, which its completion gives back.
    #[inline(always)]
    fn send_alone(&mut self, cx: &mut Cx<P>, o: Outgoing<P>) {
        if o.buf.len() <= cx.max_inline() && self.class(o.ty).is_none() {
            if o.token & TOKEN_KIND != RESPONSE_TOKEN && self.resumable == 0 {
                // A request that is never sent again: its own buffer goes, quietly.
                let Outgoing { conn, token, session, slot, buf, .. } = o;
                if let Err((_, e)) = cx.send_quiet(conn, buf, PACKED_TOKEN) {
                    self.refused(cx, token, session, slot, e);
                }
                return;
            }
            if let Ok(copy) = cx.alloc(o.buf.len()) {
                return self.send_copy(cx, o, copy);
            }
        }
        let Outgoing { conn, ty, token, session, slot, buf, .. } = o;
        if let Err((_, e)) = self.send_typed(cx, conn, ty, buf, token) {
            self.refused(cx, token, session, slot, e);
        }
    }

    /// Sends a quiet copy of `o` (in `copy`, as long): `o` is done with at once, as a packed
    /// message is.
    #[inline(always)]
    fn send_copy(&mut self, cx: &mut Cx<P>, o: Outgoing<P>, mut copy: Buf<P>) {
        copy.as_mut_slice().copy_from_slice(o.buf.as_slice());
        match cx.send_quiet(o.conn, copy, PACKED_TOKEN) {
            Ok(()) => self.copied(cx, o),
            Err((_, e)) => self.refused(cx, o.token, o.session, o.slot, e),
        }
    }

    /// `o` was copied into a pack: done with as its own send's completion would be.
    fn copied(&mut self, cx: &mut Cx<P>, o: Outgoing<P>) {
        if o.token & TOKEN_KIND == RESPONSE_TOKEN {
            self.answer_sent(cx, o.token, Some(o.buf));
        } else {
            self.request_sent(o.token, Some(o.buf));
        }
    }

    /// The engine refused to send the message with `token` (for `session`'s `slot`).
    #[cold]
    #[inline(never)]
    fn refused(
        &mut self,
        cx: &mut Cx<P>,
        token: u64,
        session: SessionId,
        slot: u16,
        e: EngineError,
    ) {
        if token & TOKEN_KIND == RESPONSE_TOKEN {
            // The connection is closing (the client's calls end with it), or the worker's
            // request table is full: the call times out.
            self.metrics.send_refused += 1;
        } else {
            self.request_refused(cx, session, slot, CallId(token), e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ReqType;
    use crate::wire::{unpack, Header, Kind, Status};

    impl PackKey for u8 {
        fn slot(self) -> usize {
            usize::from(self)
        }
    }

    impl PackBuf for Vec<u8> {
        fn bytes_mut(&mut self) -> &mut [u8] {
            self
        }

        fn truncate_to(&mut self, len: usize) -> bool {
            let fits = len <= self.len();
            self.truncate(len);
            fits
        }
    }

    fn msg(slot: u16, payload: &[u8]) -> (Header, Vec<u8>) {
        let h = Header {
            kind: Kind::Response,
            ty: ReqType(3),
            slot,
            session: SessionId::from_wire(9),
            seq: 1,
            len: payload.len() as u32,
            status: Status::Ok,
            large: false,
            resent: false,
        };
        let mut m = h.encode().to_vec();
        m.extend_from_slice(payload);
        (h, m)
    }

    fn part(slot: u16) -> Part {
        Part { token: u64::from(slot), session: SessionId::from_wire(9), slot }
    }

    #[test]
    fn the_first_message_to_a_peer_in_a_pass_goes_alone_the_next_ones_pack() {
        let mut p: Packer<Vec<u8>, u8> = Packer::new(1024, 2, 4096, 3);
        assert!(p.is_empty_of_packs());
        assert!(p.first_to(1));
        assert!(!p.first_to(1));
        assert!(p.first_to(2));
        // Past the connection slots it was made for, each message goes alone (nothing is
        // remembered of it).
        assert!(p.first_to(3) && p.first_to(3));
        // A new pass: each peer's next message is its first again.
        p.next_pass();
        assert!(p.first_to(1) && p.first_to(2) && !p.first_to(1));
        // The pass number wraps past 0 with the marks cleared (no peer counts as seen).
        p.pass = u32::MAX;
        assert!(p.first_to(1) && !p.first_to(1));
        p.next_pass();
        assert_eq!(p.pass, 1);
        assert!(p.first_to(1) && p.first_to(2));
        // Small messages that fit beside another pack; large ones and those no receive holds
        // twice do not; a packer of `max` 0 packs nothing.
        assert!(p.takes(1024, 4096) && !p.takes(1025, 4096) && !p.takes(100, 100 + HEADER - 1));
        // The largest pool buffer bounds a pack as the peer's receive does.
        let small_pool: Packer<Vec<u8>, u8> = Packer::new(8192, 2, 256, 3);
        assert!(small_pool.takes(200, 1 << 20) && !small_pool.takes(300, 1 << 20));
        assert!(!Packer::<Vec<u8>, u8>::new(0, 2, 4096, 3).takes(1, 4096));
    }

    #[test]
    fn a_pack_holds_its_messages_in_order_until_the_next_does_not_fit() {
        let mut p: Packer<Vec<u8>, u8> = Packer::new(1024, 2, 4096, 3);
        let msgs = [msg(0, b"one"), msg(1, b""), msg(2, b"three")];
        let room = msgs.iter().map(|(_, m)| m.len()).sum::<usize>();
        let i = p.start(7, room, vec![0; room]).unwrap();
        for (k, (_, m)) in msgs.iter().enumerate() {
            assert!(p.append(i, m, part(k as u16)));
        }
        // Full: one byte more does not fit, and the pack is as it was.
        assert!(!p.append(i, &msgs[1].1[..1], part(9)));
        assert_eq!(p.find(7), Some(i));
        let (conn, buf) = p.close(i).unwrap();
        assert_eq!((conn, buf.len()), (7, room));
        let parts: Vec<u16> = p.packs[p.open].parts.iter().map(|x| x.slot).collect();
        assert_eq!(parts, [0, 1, 2]);
        let got: Vec<_> = unpack(&buf).map(Result::unwrap).collect();
        assert_eq!(got.len(), 3);
        for ((h, payload), (want, m)) in got.into_iter().zip(&msgs) {
            assert_eq!(h, *want);
            assert_eq!(payload, &m[HEADER..]);
        }
        assert!(p.is_empty_of_packs());
    }

    #[test]
    fn packs_open_for_cap_peers_at_most_and_close_in_any_order() {
        let mut p: Packer<Vec<u8>, u8> = Packer::new(1024, 2, 4096, 3);
        let a = p.start(1, 256, vec![0; 256]).unwrap();
        let b = p.start(2, 256, vec![0; 256]).unwrap();
        assert!(p.start(3, 256, vec![0; 256]).is_err());
        assert!(p.append(a, &msg(0, b"a").1, part(0)));
        assert!(p.append(b, &msg(1, b"b").1, part(1)));
        // Closing the first moves the second into its place; it is still found.
        assert_eq!(p.close(a).map(|(c, _)| c), Some(1));
        let b = p.find(2).unwrap();
        assert_eq!(p.find(1), None);
        // A pack reopened in a closed one's place starts empty (its vector kept).
        let c = p.start(3, 256, vec![0; 256]).unwrap();
        assert!(p.packs[c].parts.is_empty() && p.packs[c].len == 0);
        assert_eq!(p.close(b).map(|(c, buf)| (c, buf.len())), Some((2, msg(1, b"b").1.len())));
        assert_eq!(p.close(p.find(3).unwrap()).map(|(c, b)| (c, b.len())), Some((3, 0)));
        assert!(p.is_empty_of_packs());
    }

    #[test]
    fn appended_messages_unpack_as_they_were() {
        let msgs = [msg(0, b"one"), msg(1, b""), msg(2, b"three")];
        let total = msgs.iter().map(|(_, m)| m.len()).sum();
        let mut out = vec![0u8; total];
        let (mut at, mut last) = (0, None);
        for (_, m) in &msgs {
            copy_in(&mut out, at, last, m);
            last = Some(at);
            at += m.len();
        }
        let got: Vec<_> = unpack(&out).map(Result::unwrap).collect();
        assert_eq!(got.len(), 3);
        // The first message alone is itself, unflagged.
        let mut alone = vec![0u8; msgs[0].1.len()];
        copy_in(&mut alone, 0, None, &msgs[0].1);
        assert_eq!(alone, msgs[0].1);
    }
}
