//! Completions of the send queue: a completion retires, in post order, every work request of
//! its lane up to itself (the unsignalled ones before it succeeded), and each retired request
//! tells its issuer — and the requests riding on it (merged reads get a copy of the bytes
//! read; coalesced writes share the outcome).

use corelink_verbs::{Provider, Wc, WcOpcode, WcStatus};

use super::Worker;
use crate::handoff::Origin;
use crate::pool::Buf;
use crate::request::{CloseReason, Done, OpKind};
use crate::worker::conn::Phase;
use crate::worker::handler::Handler;
use crate::worker::ids::ReqId;
use crate::worker::requests::Retired;

impl<P: Provider, H: Handler<P>> Worker<P, H> {
    /// A send-queue completion of request `done` (every request completes once, so each
    /// lookup below cannot fail; one that does is counted). The plain successes it retires
    /// are gathered with the lane held and told together ([`Handler::on_completions`]); any
    /// other request ends on its own, after those before it were told (post order holds).
    #[inline(always)]
    pub(super) fn dispatch_send(&mut self, wc: &Wc, done: ReqId) {
        let Some(r) = self.cx.reqs.get(done) else { return self.gone() };
        let (slot, l) = (r.conn.slot, r.lane as usize);
        loop {
            let step = self.retire_plain(wc, done, slot, l);
            if let Retiring::Alone(d) = step {
                // (the latency path: a completion that retires its own request only)
                return self.handler.on_completion(&mut self.cx, d);
            }
            self.tell_gathered();
            match step {
                Retiring::Mine | Retiring::Alone(_) => return,
                Retiring::Full => continue,
                Retiring::Unbatched { done, mine } => {
                    if self.tell_alone(done, mine) {
                        return;
                    }
                }
                Retiring::Missed => return self.cx.invariant_missed(),
                Retiring::Other { id, status } => {
                    self.retire_other(id, status, slot, l);
                    if id == done {
                        return;
                    }
                }
            }
        }
    }

    /// Takes lane `l` of connection `slot`'s posted requests off in order, up to `done`,
    /// gathering the plain successes; stops at `done`, at a request that is not one, or when
    /// the gathering is full.
    #[inline(always)]
    fn retire_plain(&mut self, wc: &Wc, done: ReqId, slot: u16, l: usize) -> Retiring<P> {
        let Worker { cx, gathered, .. } = self;
        let Some(c) = cx.conns.at_mut(slot) else { return Retiring::Missed };
        c.live.heard = true;
        let Some(lane) = c.lanes.get_mut(l) else { return Retiring::Missed };
        while !gathered.is_full() {
            let Some(id) = lane.sq.posted.pop() else { return Retiring::Missed };
            let mine = id == done;
            let status = if mine { wc.status } else { WcStatus::Success };
            // The common case: a plain request of the handler, succeeded.
            let plain = if status == WcStatus::Success { cx.reqs.take_plain(id) } else { None };
            let Some((conn, token, kind, buf, len, quiet)) = plain else {
                return Retiring::Other { id, status };
            };
            // (one test passes sends and writes: a read's or an atomic's slot in the QP's
            // outstanding ones comes back, and an atomic's old value is in its slot's word)
            let mut old_value = None;
            if kind.is_rd_atomic() {
                lane.sq.rd_outstanding = lane.sq.rd_outstanding.saturating_sub(1);
                // (its slot's word: no request is stored before it is read)
                old_value = cx.reqs.old_value(id, kind, status);
            }
            cx.metrics.success(kind, len); // (a plain request's status is success)
            if quiet {
                // Its success is not told: the buffer goes back to the pool.
                cx.metrics.quiet += 1;
                drop(buf);
                if mine {
                    return Retiring::Mine;
                }
                continue;
            }
            let d = Done { conn, token, kind, status, buf, old_value, closed_by: None };
            if mine && gathered.is_empty() {
                return Retiring::Alone(d);
            }
            if let Err(d) = gathered.push(d) {
                // (never: one lane's requests are one connection's, and it had room; told
                // alone all the same, after those gathered)
                cx.metrics.invariant_misses += 1;
                return Retiring::Unbatched { done: d, mine };
            }
            if mine {
                return Retiring::Mine;
            }
        }
        Retiring::Full
    }

    /// Tells the handler what [`Worker::retire_plain`] gathered, if anything.
    #[inline(always)]
    fn tell_gathered(&mut self) {
        let Worker { cx, gathered, handler, .. } = self;
        if let Some(batch) = gathered.drain() {
            handler.on_completions(cx, batch);
        }
    }

    /// Tells a plain success the gathering refused on its own (never happens); returns
    /// whether it was the completion's own request.
    #[cold]
    #[inline(never)]
    fn tell_alone(&mut self, done: Done<Buf<P>>, mine: bool) -> bool {
        self.handler.on_completion(&mut self.cx, done);
        mine
    }

    /// Ends request `id` (taken off lane `l` of connection `slot`) with `status`: not a plain
    /// success (a client's or a probe's, a chain, a failure).
    fn retire_other(&mut self, id: ReqId, status: WcStatus, slot: u16, l: usize) {
        let Some(r) = self.cx.reqs.take(id) else { return self.cx.invariant_missed() };
        let r = Retired::of(id, r);
        let Some(c) = self.cx.conns.at_mut(slot) else { return self.cx.invariant_missed() };
        if let (true, Some(lane)) = (r.is_rd_atomic(), c.lanes.get_mut(l)) {
            lane.sq.rd_outstanding = lane.sq.rd_outstanding.saturating_sub(1);
        }
        if status != WcStatus::Success {
            let open = c.phase == Phase::Open;
            if open && r.origin == Origin::Keepalive {
                c.reason = Some(CloseReason::Unanswered(status));
            }
            c.note_error(status);
            if open {
                self.cx.conns.mark(slot);
            }
        }
        self.finish(r, status);
    }

    /// A completion whose request or receive is gone: one the worker ended already (its
    /// completions were lost, `worker/untrusted.rs`), else a broken invariant.
    #[cold]
    pub(super) fn gone(&mut self) {
        if self.untrusted.ever() {
            self.cx.metrics.late_completions += 1;
        } else {
            self.cx.invariant_missed();
        }
    }

    /// Ends, as flushed, everything still posted on the connections whose completions cannot
    /// be trusted and that are closing (their device had `UNTRUSTED_FLUSH_WAIT` to flush it):
    /// each request and the requests riding on it, in post order, and the receives.
    #[cold]
    pub(super) fn make_up(&mut self) {
        let mut ended = Vec::new();
        let Worker { cx, .. } = self;
        let mut slots = Vec::new();
        let mut missed = 0;
        for c in cx.conns.iter_mut().filter(|c| c.untrusted && c.phase == Phase::Closing) {
            for lane in c.lanes.iter_mut() {
                while let Some(id) = lane.sq.posted.pop() {
                    match cx.reqs.take(id) {
                        Some(r) => ended.push(Retired::of(id, r)),
                        None => missed += 1,
                    }
                }
                lane.sq.rd_outstanding = 0;
                cx.metrics.completions_made_up += lane.recvs.forget_posted() as u64;
            }
            slots.push(c.id.slot);
        }
        for slot in slots {
            self.cx.conns.mark(slot);
        }
        for _ in 0..missed {
            self.cx.invariant_missed();
        }
        // Connections that did not come up, whose receives' flushes were lost.
        for (conn, qps, posted) in self.primes.make_up() {
            self.cx.metrics.completions_made_up += posted;
            self.unprimed(conn, qps);
        }
        self.cx.metrics.completions_made_up += ended.len() as u64;
        for r in ended {
            self.finish(r, WcStatus::WrFlushErr);
        }
    }

    /// Tells a request (taken out as `r`) and every request riding on it how it ended.
    #[inline(always)]
    pub(super) fn finish(&mut self, r: Retired<P>, status: WcStatus) {
        let mut next = r.next;
        if r.kind == OpKind::Read && status.is_success() && next.is_some() {
            // The bytes read go to every merged requester too.
            let mut n = next;
            while let Some(id) = n {
                let Some(f) = self.cx.reqs.get_mut(id) else { break };
                if let (Some(from), Some(to)) = (&r.buf, &mut f.buf) {
                    let len = from.len().min(to.capacity());
                    let _ = to.fill(&from.as_slice()[..len]);
                }
                n = f.next;
            }
        }
        self.complete(r, status);
        while let Some(id) = next {
            let Some(f) = self.cx.reqs.take(id) else { return self.cx.invariant_missed() };
            next = f.next;
            self.complete(Retired::of(id, f), status);
        }
    }

    /// Why connection `conn` is closing, if it is (off the hot path: flushes only).
    #[cold]
    #[inline(never)]
    fn close_reason(&self, conn: crate::request::ConnId) -> Option<crate::request::CloseReason> {
        self.cx.conns.get(conn).ok().and_then(|c| c.reason)
    }

    /// Tells the issuer of a request (just taken out as `r`) how it ended; a flush names the
    /// close it is a consequence of (looked up off the success path).
    #[inline(always)]
    pub(super) fn complete(&mut self, r: Retired<P>, status: WcStatus) {
        if status == WcStatus::Success {
            self.complete_as(r, status, None)
        } else {
            self.complete_failed(r, status)
        }
    }

    /// [`Worker::complete`] of a request that failed or was flushed.
    #[cold]
    #[inline(never)]
    fn complete_failed(&mut self, r: Retired<P>, status: WcStatus) {
        let closed_by =
            if status == WcStatus::WrFlushErr { self.close_reason(r.conn) } else { None };
        self.complete_as(r, status, closed_by)
    }

    #[inline(always)]
    fn complete_as(&mut self, r: Retired<P>, status: WcStatus, closed_by: Option<CloseReason>) {
        // (its slot's word: no request is stored before it is read)
        let old_value = self.cx.reqs.old_value(r.id, r.kind, status);
        match r.origin {
            Origin::Handler if r.quiet && status.is_success() => {
                self.cx.metrics.completion(wc_opcode(r.kind), status, r.len);
                self.cx.metrics.quiet += 1; // (untold: the buffer goes back to the pool)
            }
            Origin::Handler => {
                self.cx.metrics.completion(wc_opcode(r.kind), status, r.len);
                let Retired { conn, token, kind, buf, .. } = r;
                let done = Done { conn, token, kind, status, buf, old_value, closed_by };
                self.handler.on_completion(&mut self.cx, done);
            }
            // (its buffer goes back to the pool; a failure closed its connection above)
            Origin::Keepalive => self.cx.probe_done(r.conn, status),
            Origin::Fence => {}
            Origin::Client(n) => {
                self.cx.metrics.completion(wc_opcode(r.kind), status, r.len);
                let ext = self.cx.reqs.vector(r.id, r.origin);
                let done = r.client_done(status, ext, old_value, closed_by);
                self.clients.tell(n, crate::client::Event::Done(done));
            }
        }
    }
}

/// Where [`Worker::retire_plain`] stopped.
enum Retiring<P: Provider> {
    /// At the completion's own request.
    Mine,
    /// At the completion's own request, the only one retired: its completion, to tell alone.
    Alone(Done<Buf<P>>),
    /// A plain success the gathering refused (never): to tell alone after the gathered ones,
    /// then go on unless it was the completion's own.
    Unbatched { done: Done<Buf<P>>, mine: bool },
    /// The gathering is full: tell it, then go on.
    Full,
    /// At request `id`, which is not a plain success: it ends on its own with `status`.
    Other { id: ReqId, status: WcStatus },
    /// A lookup that cannot fail did.
    Missed,
}

/// The completion opcode of a kind of request (for the metrics).
pub(crate) fn wc_opcode(kind: OpKind) -> WcOpcode {
    match kind {
        OpKind::Send => WcOpcode::Send,
        OpKind::Write => WcOpcode::RdmaWrite,
        OpKind::Read => WcOpcode::RdmaRead,
        OpKind::FetchAdd => WcOpcode::FetchAdd,
        OpKind::CompareSwap => WcOpcode::CompSwap,
    }
}
