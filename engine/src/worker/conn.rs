//! A connection as its worker holds it: its lanes (QPs, each with its posted receives and its
//! send queue), its requests waiting by class (`queues.rs`), its ready request (`ready.rs`).

use arrayvec::ArrayVec;
use std::time::{Duration, Instant};

use corelink_verbs::{Provider, Qp, QpAttr, QpState, WcStatus};

use super::queues::{SendQueue, Waiting};
use super::ready::Ready;
use super::recvs::Recvs;
use crate::handoff::Origin;
use crate::memory::Exposed;
use crate::request::{CloseReason, ConnId, ConnInfo};
use crate::tunables::MAX_QPS_PER_CONN;

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Open,
    /// Closing: nothing new is accepted; waiting for in-flight requests and receives to flush.
    Closing,
}

/// One QP of a connection.
#[derive(Debug)]
pub(crate) struct Lane<P: Provider> {
    pub(crate) qp: P::Qp,
    pub(crate) cm_key: u64,
    /// Its receive buffers: posted, handed to the handler, or back to be posted again.
    pub(crate) recvs: Recvs<P>,
    /// Its send queue.
    pub(crate) sq: SendQueue,
}

/// A connection.
#[derive(Debug)]
pub(crate) struct Conn<P: Provider> {
    pub(crate) id: ConnId,
    pub(crate) info: ConnInfo,
    /// Who hears its messages and its close (whoever connected it; the handler for one
    /// accepted).
    pub(crate) owner: Origin,
    pub(crate) lanes: ArrayVec<Lane<P>, MAX_QPS_PER_CONN>,
    /// The lane the next batch goes to (requests stripe over the lanes).
    pub(crate) next_lane: usize,
    /// Its requests waiting.
    pub(crate) waiting: Waiting,
    /// Its requests planned as they were submitted (`worker/ready.rs`), to post first.
    pub(crate) ready: Ready<P>,
    pub(crate) phase: Phase,
    /// Why it is closing.
    pub(crate) reason: Option<crate::request::CloseReason>,
    /// Set once the control core has been asked to disconnect.
    pub(crate) disconnect_sent: bool,
    /// Memory exposed to its peer, by grant number (revoked when it starts closing).
    pub(crate) grants: Vec<(u32, Exposed<P>)>,
    /// The next grant's number.
    pub(crate) next_grant: u32,
    /// What the keepalive keeps of it (heard from since its last pass, its probe out).
    pub(crate) live: super::keepalive::Liveness,
    /// Its completions cannot be trusted (the CQ overran, the device failed): what is left
    /// posted once `worker/untrusted.rs`'s wait runs out is ended by the worker.
    pub(crate) untrusted: bool,
    /// Its close waits for the peer's disconnect (a request failed on the peer's side).
    peer_wait: PeerWait,
    /// Its peer disconnected with requests of its in flight: the lanes go to ERR once their
    /// answers came (the peer sent them before its disconnect) or the wait ran out.
    answers_wait: PeerWait,
}

/// A close held for the peer's disconnect (`worker.peer_grace_ms`): a request the peer's side
/// refused is often the first sign that the peer's process died (its memory goes before its
/// connections), ahead of the connection manager's word; the close waits for that word a
/// while, so that it is named for what it was.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum PeerWait {
    /// Not held.
    #[default]
    No,
    /// Held from the next look on.
    Asked,
    /// Held until then.
    Until(Instant),
}

impl PeerWait {
    /// Whether the close is still held (the clock is read only for a held one; the first look
    /// starts the wait of `grace`).
    fn holds(&mut self, now: impl FnOnce() -> Instant, grace: Duration) -> bool {
        match *self {
            PeerWait::No => return false,
            PeerWait::Asked if !grace.is_zero() => *self = PeerWait::Until(now() + grace),
            PeerWait::Until(t) if now() < t => {}
            PeerWait::Asked | PeerWait::Until(_) => *self = PeerWait::No,
        }
        *self != PeerWait::No
    }
}

/// Whether a request's failure with `status` happened on the peer's side: what a peer whose
/// process is ending looks like before its disconnect arrives.
fn peer_side(status: WcStatus) -> bool {
    matches!(status, WcStatus::RemAccessErr | WcStatus::RemOpErr | WcStatus::RemInvReqErr)
}

impl<P: Provider> Conn<P> {
    /// A connection just opened with its lanes (receives posted), nothing waiting; at most
    /// `max_outstanding` requests may be ready at once (a lane's room).
    pub(crate) fn new(
        id: ConnId,
        info: ConnInfo,
        owner: Origin,
        lanes: ArrayVec<Lane<P>, MAX_QPS_PER_CONN>,
        max_outstanding: u32,
    ) -> Self {
        Conn {
            id,
            info,
            owner,
            lanes,
            next_lane: 0,
            waiting: Waiting::default(),
            ready: Ready::new(max_outstanding),
            phase: Phase::Open,
            reason: None,
            disconnect_sent: false,
            grants: Vec::new(),
            next_grant: 0,
            live: super::keepalive::Liveness::new(),
            untrusted: false,
            peer_wait: PeerWait::No,
            answers_wait: PeerWait::No,
        }
    }

    /// Whether everything posted has come back, so the connection can be released.
    pub(crate) fn drained(&self) -> bool {
        !self.has_waiting()
            && self.lanes.iter().all(|l| l.sq.posted.is_empty() && l.recvs.posted() == 0)
    }

    /// Whether it has anything to post.
    pub(crate) fn has_waiting(&self) -> bool {
        self.waiting.len > 0 || !self.ready.is_empty()
    }

    /// Moves every lane's QP to ERR, so that everything posted on it flushes (a peer gone, or a
    /// failed request's connection: the device errs only the lane that failed).
    pub(crate) fn error_lanes(&mut self) {
        for lane in self.lanes.iter_mut() {
            let _ = lane.qp.modify(&QpAttr { state: QpState::Err, ..QpAttr::default() });
        }
    }

    /// The first error status of a failed request closes the connection with it (one on the
    /// peer's side after a wait for the peer's disconnect: [`Conn::waits_for_peer`]). A refusal
    /// that comes after the peer's disconnect (an answer the peer sent before it:
    /// [`Conn::peer_left`]) names that close: the peer went away after refusing it.
    pub(crate) fn note_error(&mut self, status: WcStatus) {
        match self.reason {
            None => {
                self.reason = Some(CloseReason::Error(status));
                if peer_side(status) {
                    self.peer_wait = PeerWait::Asked;
                }
            }
            Some(CloseReason::Peer) if peer_side(status) => {
                self.reason = Some(CloseReason::PeerGone(status));
            }
            Some(_) => {}
        }
        self.phase = Phase::Closing;
    }

    /// Whether any of its requests is on the device.
    fn in_flight(&self) -> bool {
        self.lanes.iter().any(|l| !l.sq.posted.is_empty())
    }

    /// The peer disconnected: with requests in flight, the lanes stay as they are a while
    /// ([`Conn::awaits_answers`]), since what the peer answered before its disconnect (an
    /// acknowledgement, a refusal) may still be on its way through the device and must not be
    /// flushed; with none, they go to ERR now, so that the receives flush.
    pub(crate) fn peer_left(&mut self) {
        if self.in_flight() {
            self.answers_wait = PeerWait::Asked;
        } else {
            self.error_lanes();
        }
    }

    /// Whether its lanes still wait for the answers to its requests in flight after the
    /// peer's disconnect (for `grace` from the first look, `worker.peer_grace_ms`); once
    /// nothing is in flight or the wait ran out, they go to ERR (the rest flushes).
    pub(crate) fn awaits_answers(
        &mut self,
        now: impl FnOnce() -> Instant,
        grace: Duration,
    ) -> bool {
        if self.answers_wait == PeerWait::No {
            return false;
        }
        if self.in_flight() && self.answers_wait.holds(now, grace) {
            return true;
        }
        self.answers_wait = PeerWait::No;
        self.error_lanes();
        false
    }

    /// Whether its close still waits for the peer's disconnect after a failure on the peer's
    /// side (for `grace` from the first look, when its lanes go to ERR so that what is posted
    /// flushes meanwhile).
    pub(crate) fn waits_for_peer(
        &mut self,
        now: impl FnOnce() -> Instant,
        grace: Duration,
    ) -> bool {
        if self.peer_wait == PeerWait::Asked {
            self.error_lanes();
        }
        self.peer_wait.holds(now, grace)
    }

    /// It closes for `reason` (the first reason given stays); returns whether the control
    /// core is to disconnect it now (once; not while it waits for the peer's disconnect). The
    /// peer's disconnect during that wait names the refusal that came first as the peer's
    /// going away; this side's close (an application closing on the refusal) leaves the wait
    /// as it is; any other reason (a shutdown) ends it.
    pub(crate) fn closing(&mut self, reason: CloseReason) -> bool {
        if self.awaits_peer() {
            match (reason, self.reason) {
                (CloseReason::Local, _) => {}
                (CloseReason::Peer, Some(CloseReason::Error(s))) => {
                    self.reason = Some(CloseReason::PeerGone(s));
                    self.peer_wait = PeerWait::No;
                }
                _ => self.peer_wait = PeerWait::No,
            }
        }
        self.reason.get_or_insert(reason);
        self.phase = Phase::Closing;
        let now = !self.awaits_peer() && !self.disconnect_sent;
        self.disconnect_sent |= now;
        now
    }

    /// Whether its close waits for the peer's disconnect.
    pub(crate) fn awaits_peer(&self) -> bool {
        self.peer_wait != PeerWait::No
    }

    /// Whether it can be released: closing, no longer waiting, nothing left on the device.
    pub(crate) fn releasable(&self) -> bool {
        self.phase == Phase::Closing && !self.awaits_peer() && self.drained()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corelink_verbs::soft::Soft;

    fn conn() -> Conn<Soft> {
        let info = ConnInfo {
            private_data: vec![],
            peer_recv_size: None,
            initiated: true,
            token: 0,
            lanes: 1,
            recvs_per_lane: 0,
        };
        let id = ConnId { worker: 0, slot: 1, generation: 1 };
        Conn::new(id, info, Origin::Handler, ArrayVec::new(), 4)
    }

    /// A connection with one lane on a soft QP in INIT, request 7 posted on it.
    fn conn_in_flight() -> Conn<Soft> {
        use corelink_verbs::Context;
        let ctx = Soft::open("soft0").unwrap();
        let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(16).unwrap());
        let qp = crate::worker::testing::soft_qp_in_init(&pd, &cq, 4);
        let mut sq = SendQueue::new(4);
        assert!(sq.posted.push(crate::worker::ids::ReqId::from_raw(7)));
        let lane = Lane { qp, cm_key: 1, recvs: Recvs::new(Vec::new(), 0), sq };
        let mut c = conn();
        c.lanes.push(lane);
        c
    }

    #[test]
    fn a_peer_that_left_has_its_answers_waited_for() {
        let (t0, grace) = (Instant::now(), Duration::from_millis(100));
        let unread = || -> Instant { panic!("the clock is read only while waiting") };
        let err = |c: &Conn<Soft>| c.lanes[0].qp.state() == QpState::Err;
        // In flight: the lane stays as it is until the answer comes.
        let mut c = conn_in_flight();
        c.peer_left();
        assert!(c.awaits_answers(|| t0, grace) && !err(&c));
        assert!(c.awaits_answers(|| t0 + grace / 2, grace) && !err(&c));
        c.lanes[0].sq.posted.pop();
        assert!(!c.awaits_answers(unread, grace) && err(&c), "answered: to ERR at once");
        assert!(!c.awaits_answers(unread, grace), "once");
        // No answer within the grace: to ERR, what is posted flushes.
        let mut c = conn_in_flight();
        c.peer_left();
        assert!(c.awaits_answers(|| t0, grace));
        assert!(!c.awaits_answers(|| t0 + grace, grace) && err(&c));
        // Nothing in flight: to ERR at once, no wait.
        let mut c = conn_in_flight();
        c.lanes[0].sq.posted.pop();
        c.peer_left();
        assert!(err(&c) && !c.awaits_answers(unread, grace));
    }

    #[test]
    fn a_refusal_by_the_peer_waits_a_while_for_its_disconnect() {
        let (t0, grace) = (Instant::now(), Duration::from_millis(100));
        let unread = || -> Instant { panic!("the clock is read only for a held close") };
        // The peer's disconnect during the wait: the close names the peer's going away.
        let mut c = conn();
        c.note_error(WcStatus::RemAccessErr);
        assert!(!c.releasable(), "held before its first look");
        assert!(c.waits_for_peer(|| t0, grace));
        assert!(c.waits_for_peer(|| t0 + grace / 2, grace) && !c.releasable());
        c.closing(CloseReason::Peer);
        assert_eq!(c.reason, Some(CloseReason::PeerGone(WcStatus::RemAccessErr)));
        assert!(!c.waits_for_peer(unread, grace) && c.releasable());
        // No disconnect within the grace: the refusal is the cause, and a disconnect after it
        // changes nothing.
        let mut c = conn();
        c.note_error(WcStatus::RemOpErr);
        assert!(c.waits_for_peer(|| t0, grace));
        assert!(!c.waits_for_peer(|| t0 + grace, grace) && c.releasable());
        c.closing(CloseReason::Peer);
        assert_eq!(c.reason, Some(CloseReason::Error(WcStatus::RemOpErr)));
        // The answers to what was in flight at the peer's disconnect: a refusal among them
        // names the close; a failure on this side or a flush does not.
        for (status, want) in [
            (WcStatus::RemAccessErr, CloseReason::PeerGone(WcStatus::RemAccessErr)),
            (WcStatus::WrFlushErr, CloseReason::Peer),
            (WcStatus::RetryExcErr, CloseReason::Peer),
        ] {
            let mut c = conn();
            c.peer_left();
            assert!(c.closing(CloseReason::Peer));
            c.note_error(status);
            assert_eq!(c.reason, Some(want), "{status}");
        }
        // A failure on this side, or a grace of 0: no wait.
        for (status, g) in
            [(WcStatus::RetryExcErr, grace), (WcStatus::RemAccessErr, Duration::ZERO)]
        {
            let mut c = conn();
            c.note_error(status);
            assert!(!c.waits_for_peer(unread, g) && c.releasable(), "{status}");
            assert_eq!(c.reason, Some(CloseReason::Error(status)));
        }
        // This side's close during the wait (an application closing on the refusal) neither
        // ends it nor disconnects; a shutdown ends it (and disconnects, once). The refusal
        // stays the cause.
        let mut c = conn();
        c.note_error(WcStatus::RemInvReqErr);
        assert!(c.waits_for_peer(|| t0, grace));
        assert!(!c.closing(CloseReason::Local) && !c.releasable());
        assert!(c.waits_for_peer(|| t0, grace));
        assert!(c.closing(CloseReason::Shutdown) && c.releasable());
        assert!(!c.closing(CloseReason::Shutdown), "disconnected once");
        assert_eq!(c.reason, Some(CloseReason::Error(WcStatus::RemInvReqErr)));
        // Without a wait, the first close disconnects, once.
        let mut c = conn();
        assert!(c.closing(CloseReason::Local) && !c.closing(CloseReason::Peer));
        assert_eq!(c.reason, Some(CloseReason::Local));
    }
}
