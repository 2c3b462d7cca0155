//! Queue pairs and shared receive queues of `soft`: creation, the state machine, receive
//! queues, and the deferred work a poll runs (RNR retries, flushes). The execution of work
//! requests is in [`super::exec`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arrayvec::ArrayVec;
use crossbeam_queue::ArrayQueue;

use super::context::CtxShared;
use super::cq::{CqShared, SoftCq};
use super::exec::Step;
use super::fabric::{Fabric, Keys};
use super::limits;
use super::mem::SoftPd;
use super::req::{Desc, Head};
use super::Soft;
use crate::error::{errno, invalid, Error, Result};
use crate::provider::QpInitAttr;
use crate::types::*;

/// A posted receive.
#[derive(Debug, Clone)]
pub(crate) struct RecvEntry {
    pub(crate) wr_id: u64,
    sges: RecvSges,
}

/// A receive's scatter list: up to [`limits::RECV_SGES_IN_PLACE`] entries in place (the common
/// case), longer lists on the heap.
#[derive(Debug, Clone)]
enum RecvSges {
    InPlace(ArrayVec<Sge, { limits::RECV_SGES_IN_PLACE }>),
    Heap(Box<[Sge]>),
}

impl RecvEntry {
    pub(crate) fn new(wr_id: u64, sgl: &[Sge]) -> RecvEntry {
        let sges = match ArrayVec::try_from(sgl) {
            Ok(a) => RecvSges::InPlace(a),
            Err(_) => RecvSges::Heap(sgl.into()),
        };
        RecvEntry { wr_id, sges }
    }

    /// The scatter list.
    pub(crate) fn sges(&self) -> &[Sge] {
        match &self.sges {
            RecvSges::InPlace(a) => a,
            RecvSges::Heap(b) => b,
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.sges().iter().map(|s| u64::from(s.length)).sum()
    }
}

/// A shared receive queue as QPs see it.
#[derive(Debug)]
pub(crate) struct SrqShared {
    id: u64,
    pd: u64,
    max_sge: u32,
    queue: ArrayQueue<RecvEntry>,
}

/// A shared receive queue of `soft`.
#[derive(Debug, Clone)]
pub struct SoftSrq {
    pub(crate) shared: Arc<SrqShared>,
}

impl SoftSrq {
    pub(crate) fn new(pd: &SoftPd, attr: &SrqAttr) -> Result<Self> {
        if attr.max_wr == 0
            || attr.max_wr > limits::MAX_QP_WR
            || attr.max_sge as usize > limits::MAX_SGE
        {
            return Err(Error::CreateSrq {
                max_wr: attr.max_wr,
                source: invalid(format!(
                    "max_wr must be 1..={} and max_sge at most {}",
                    limits::MAX_QP_WR,
                    limits::MAX_SGE
                )),
            });
        }
        Ok(SoftSrq {
            shared: Arc::new(SrqShared {
                id: Fabric::get().next_id(),
                pd: pd.id,
                max_sge: attr.max_sge,
                queue: ArrayQueue::new(attr.max_wr as usize),
            }),
        })
    }
}

impl crate::Srq for SoftSrq {
    unsafe fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let s = &self.shared;
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |source| Error::PostSrqRecv { index, source };
            if wr.sgl.len() > s.max_sge as usize {
                return Err(fail(invalid(format!(
                    "{} SGEs, max_sge is {}",
                    wr.sgl.len(),
                    s.max_sge
                ))));
            }
            let entry = RecvEntry::new(wr.wr_id, wr.sgl);
            s.queue.push(entry).map_err(|_| fail(errno(libc::ENOMEM)))?;
        }
        Ok(())
    }

    fn handle(&self) -> u64 {
        self.shared.id
    }
}

use crate::wr::RecvWr;

/// Where a QP's receives come from.
#[derive(Debug)]
pub(crate) enum RecvSource {
    Own(Box<ArrayQueue<RecvEntry>>),
    Srq(Arc<SrqShared>),
}

/// A send request waiting for its RNR timer or a fault plan's delay, or behind one that does.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) desc: Desc,
    /// When it may run; `None`: as soon as the requests before it have.
    next_try: Option<Instant>,
    rnr_left: u8,
    /// It is on its way to a QP of another process (`soft::port`): its answer.
    ticket: Option<Arc<super::port::Ticket>>,
}

/// The initiator side of a QP: what only its owner and its CQ's poll touch.
#[derive(Default)]
pub(crate) struct SendQueue {
    /// The connected peer, held (rather than looked up per request) from RTR until this QP
    /// is destroyed or connected again, when [`SoftQp`]'s drop or `modify` lets it go; a
    /// peer destroyed meanwhile is in RESET, so that it receives nothing, as if gone.
    peer: Option<Arc<QpShared>>,
    pub(crate) peer_qpn: u32,
    /// Set when the peer is a QP of another process of the fabric (`soft::port`), with the
    /// link to that process (`None` inside: it could not be reached).
    far: Option<Option<Arc<super::port::PeerLink>>>,
    /// See [`SendQueue::may_cross`].
    may_cross: bool,
    rnr_retry: u8,
    pub(crate) pending: VecDeque<Pending>,
}

impl std::fmt::Debug for SendQueue {
    // By hand: printing the peer would recurse into the peer's own send queue.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendQueue")
            .field("peer_qpn", &self.peer_qpn)
            .field("peer_found", &self.peer.is_some())
            .field("rnr_retry", &self.rnr_retry)
            .field("pending", &self.pending)
            .finish()
    }
}

impl SendQueue {
    /// Whether a request may go to another process: the peer is in one, or the QP is a UD QP
    /// of a process on a named fabric.
    #[inline(always)]
    pub(crate) fn may_cross(&self) -> bool {
        self.may_cross
    }

    /// The link to the peer's process when the peer is in another process (`Some(None)`: it
    /// cannot be reached).
    #[inline(always)]
    pub(crate) fn far(&self) -> Option<&Option<Arc<super::port::PeerLink>>> {
        self.far.as_ref()
    }

    /// Connects to QP `qpn`, in this process (`far` `None`), or in another process of the
    /// fabric (`far` from [`far_link`]).
    fn connect_to(&mut self, qpn: u32, far: Option<Option<Arc<super::port::PeerLink>>>) {
        self.peer_qpn = qpn;
        self.peer = None;
        self.may_cross = far.is_some();
        self.far = far;
        let _ = self.peer();
    }

    /// The connected peer (RC/UC), looked up by number if it was not there at RTR.
    pub(crate) fn peer(&mut self) -> Option<&QpShared> {
        if self.peer.is_none() && self.far.is_none() {
            self.peer = Fabric::get().qp(self.peer_qpn);
        }
        self.peer.as_deref()
    }
}

/// Where a QP on the port with `gid` lives: `None` in this process; `Some(link)` in another
/// process of the fabric (`Some(None)`: it cannot be reached).
fn far_link(gid: &Gid) -> Option<Option<Arc<super::port::PeerLink>>> {
    let port = super::port::get()?;
    let pid = super::port::pid_of(gid);
    (pid != 0 && pid != port.pid).then(|| port.link_to(pid).ok())
}

/// Whether a QP in the state stored as `s` accepts incoming messages (RTR or RTS).
#[inline]
pub(crate) fn receives_in(s: u8) -> bool {
    s == QpState::Rtr as u8 || s == QpState::Rts as u8
}

/// [`QpShared`]'s anomaly: its wire is cut.
const CUT: u8 = 1;
/// [`QpShared`]'s anomaly: it has a fault plan.
const FAULTY: u8 = 2;

/// A QP as the fabric sees it.
#[derive(Debug)]
pub(crate) struct QpShared {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) pd: u64,
    pub(crate) ctx: Arc<CtxShared>,
    pub(crate) cap: QpCap,
    pub(crate) sq_sig_all: bool,
    state: AtomicU8,
    pub(crate) rq: RecvSource,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
    access: AtomicU32,
    qkey: AtomicU32,
    min_rnr_timer: AtomicU8,
    pub(crate) mtu: AtomicU32,
    sq: Mutex<SendQueue>,
    /// Incoming messages dropped (UC/UD with no receive, UD qkey mismatch or oversize).
    pub(crate) dropped: AtomicU64,
    /// Injected faults, a bit each ([`CUT`], [`FAULTY`]), so that the data path looks at one
    /// byte: its connection's wire is cut (`soft::faults::cut`: nothing it sends arrives, as
    /// with a peer whose host died; cleared when the QP is reset for reuse), or it has a fault
    /// plan (`soft::faults`: what the wire does to its messages is drawn).
    anomalies: AtomicU8,
    /// Transport retries (RTS's `retry_cnt`; 7: for ever, as on rxe): what a fault plan's
    /// drops may cost an RC message before `RetryExcErr`.
    retry_cnt: AtomicU8,
    /// The plan and its generator (locked only when `faulty`).
    faults: Mutex<Option<super::faults::QpFaults>>,
}

impl QpShared {
    /// The state (stored as its discriminant).
    pub(crate) fn state(&self) -> QpState {
        match self.state.load(Ordering::Acquire) {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            _ => QpState::Err,
        }
    }

    /// Whether the QP is in state `s` (one load and compare, for the data path).
    pub(crate) fn is(&self, s: QpState) -> bool {
        self.state.load(Ordering::Acquire) == s as u8
    }

    fn set_state(&self, s: QpState) {
        self.state.store(s as u8, Ordering::Release);
        // On a named fabric, peers' direct path reads the state from the published table.
        let view = super::shm::QpView {
            state: s as u8,
            qp_type: self.qp_type,
            access: self.access(),
            pd: self.pd,
        };
        super::shm::publish_qp(self.qpn, Some(view));
    }

    /// Whether incoming messages are accepted (RTR or RTS).
    pub(crate) fn receiving(&self) -> bool {
        receives_in(self.state.load(Ordering::Acquire))
    }

    /// Whether any fault is injected into it (one relaxed load on the data path).
    #[inline(always)]
    pub(crate) fn anomalous(&self) -> bool {
        self.anomalies.load(Ordering::Relaxed) != 0
    }

    /// Whether its connection's wire is cut.
    pub(crate) fn is_cut(&self) -> bool {
        self.anomalies.load(Ordering::Relaxed) & CUT != 0
    }

    /// Cuts its connection's wire (see [`QpShared::is_cut`]).
    pub(crate) fn cut(&self) {
        self.anomalies.fetch_or(CUT, Ordering::Relaxed);
    }

    /// Gives it `plan` (`None`: none).
    pub(crate) fn set_faults(&self, plan: Option<super::faults::FaultPlan>) {
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        *f = plan.map(|p| super::faults::QpFaults::new(p, self.qpn));
        if f.is_some() {
            self.anomalies.fetch_or(FAULTY, Ordering::Relaxed);
        } else {
            self.anomalies.fetch_and(!FAULTY, Ordering::Relaxed);
        }
    }

    /// Holds back `h` to be overtaken; returns the message held before, if any.
    #[cold]
    pub(crate) fn hold(&self, h: super::exec::Held) -> Option<super::exec::Held> {
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        match f.as_mut() {
            Some(f) => f.held.replace(h),
            None => Some(h),
        }
    }

    /// The message held back to be overtaken.
    #[cold]
    pub(crate) fn take_held(&self) -> Option<super::exec::Held> {
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        f.as_mut()?.held.take()
    }

    /// The message held back to be overtaken if its time (`now`) has come, and whether one is
    /// held still.
    fn held_due(&self, now: Instant) -> (Option<super::exec::Held>, bool) {
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        let Some(f) = f.as_mut() else { return (None, false) };
        match &f.held {
            Some(h) if h.due <= now => (f.held.take(), false),
            held => (None, held.is_some()),
        }
    }

    /// How long its plan holds a message it sends (counted), if it has a plan with a delay.
    #[cold]
    pub(crate) fn fault_delay(&self) -> Option<std::time::Duration> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|f| f.delay())
    }

    /// What its plan does to a message of `len` bytes it sends (`fresh`: not held for a delay
    /// before; `needs_recv`: it takes a receive), drawn under one lock.
    #[cold]
    pub(crate) fn draw_for(&self, len: u64, fresh: bool, needs_recv: bool) -> super::faults::Drawn {
        use super::faults::{Drawn, Fate, Msg};
        let msg = Msg {
            len,
            mtu: u64::from(self.mtu.load(Ordering::Relaxed)),
            reliable: self.qp_type == QpType::Rc,
            retry_cnt: self.retry_cnt.load(Ordering::Relaxed),
            datagram: self.qp_type == QpType::Ud,
            fresh,
            needs_recv,
        };
        match self.faults.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            Some(f) => f.draw_for(msg),
            None => Drawn::Wire(Fate::Arrives),
        }
    }

    pub(crate) fn access(&self) -> AccessFlags {
        AccessFlags::from_bits_truncate(self.access.load(Ordering::Relaxed))
    }

    pub(crate) fn qkey(&self) -> u32 {
        self.qkey.load(Ordering::Relaxed)
    }

    /// The RNR NAK timer this QP (as a receiver) asks senders to wait.
    pub(crate) fn rnr_wait(&self) -> std::time::Duration {
        std::time::Duration::from_micros(rnr_timer_us(self.min_rnr_timer.load(Ordering::Relaxed)))
    }

    pub(crate) fn sq(&self) -> MutexGuard<'_, SendQueue> {
        self.sq.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the next posted receive.
    pub(crate) fn pop_recv(&self) -> Option<RecvEntry> {
        match &self.rq {
            RecvSource::Own(q) => q.pop(),
            RecvSource::Srq(s) => s.queue.pop(),
        }
    }

    /// Whether receives come from an SRQ.
    pub(crate) fn has_srq(&self) -> bool {
        matches!(self.rq, RecvSource::Srq(_))
    }

    /// The PD whose keys a receive's SGEs use.
    pub(crate) fn recv_pd(&self) -> u64 {
        match &self.rq {
            RecvSource::Own(_) => self.pd,
            RecvSource::Srq(s) => s.pd,
        }
    }

    /// Moves to ERR: posted receives flush now; deferred sends flush at the next poll (or
    /// post) of their owner.
    pub(crate) fn set_error(&self) {
        self.set_state(QpState::Err);
        self.flush_recv();
        self.send_cq.note_work();
    }

    /// Completes every receive of the QP's own queue with a flush error.
    pub(crate) fn flush_recv(&self) {
        if let RecvSource::Own(q) = &self.rq {
            while let Some(e) = q.pop() {
                self.recv_cq.push(self.error_wc(e.wr_id, WcStatus::WrFlushErr));
            }
        }
    }

    /// An error (or flush) completion as rxe reports it: only `wr_id`, `status` and `qp_num`
    /// are set; the opcode reads as `IBV_WC_SEND` (0) and `byte_len` as 0.
    pub(crate) fn error_wc(&self, wr_id: u64, status: WcStatus) -> Wc {
        Wc { wr_id, status, opcode: WcOpcode::Send, qp_num: self.qpn, ..Wc::default() }
    }

    /// Completes a receive on this QP's receive CQ; an overflow there moves the QP to ERR
    /// (rxe's class G error). A fault plan's overrun loses it (the CQ raises its error).
    pub(crate) fn complete_recv(&self, wc: Wc) {
        if self.overran(&self.recv_cq) {
            return;
        }
        if !self.recv_cq.push(wc) {
            self.set_error();
        }
    }

    /// Finishes a send request: its completion when it asks for one or failed, and the move
    /// to ERR (with the flush of everything queued behind it) on failure.
    #[inline(always)]
    pub(crate) fn complete(
        &self,
        sq: &mut SendQueue,
        desc: &Head,
        status: WcStatus,
        byte_len: u32,
    ) {
        if status != WcStatus::Success {
            self.push_send_wc(self.error_wc(desc.wr_id, status));
        } else if desc.signaled || self.sq_sig_all {
            let opcode = desc.op.wc_opcode();
            self.push_send_wc(Wc {
                wr_id: desc.wr_id,
                status,
                opcode,
                byte_len,
                qp_num: self.qpn,
                ..Wc::default()
            });
        }
        if status != WcStatus::Success {
            self.set_error();
            self.flush_pending(sq);
        }
    }

    /// Completes a send request on the send CQ (where a fault plan may lose it to an overrun).
    #[inline(always)]
    fn push_send_wc(&self, wc: Wc) {
        if !self.overran(&self.send_cq) {
            self.send_cq.push(wc);
        }
    }

    /// Whether its plan loses the completion it is about to put on `cq` to an overrun of
    /// `cq` (which then raises its error). One relaxed load without a plan.
    #[inline(always)]
    fn overran(&self, cq: &CqShared) -> bool {
        self.anomalous() && self.loses_to_overrun(cq)
    }

    #[cold]
    fn loses_to_overrun(&self, cq: &CqShared) -> bool {
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        let lost = f.as_mut().is_some_and(|f| f.overruns());
        if lost {
            cq.overrun();
        }
        lost
    }

    fn flush_pending(&self, sq: &mut SendQueue) {
        while let Some(p) = sq.pending.pop_front() {
            self.send_cq.push(self.error_wc(p.desc.head.wr_id, WcStatus::WrFlushErr));
        }
    }

    /// Runs one send request (`head`, with the gather/scatter list `sges`) now, or queues a
    /// copy of it behind earlier ones / for its RNR timer.
    ///
    /// # Safety
    /// When `head.inline`, every SGE's `addr..addr+length` must be readable; the buffers of
    /// the others stay valid until the request completes.
    #[inline(always)]
    pub(crate) unsafe fn submit(
        &self,
        sq: &mut SendQueue,
        head: Head,
        sges: &[Sge],
        keys: &mut Keys<'_>,
    ) -> std::io::Result<()> {
        if self.is(QpState::Err) {
            self.flush_pending(sq);
            self.send_cq.push(self.error_wc(head.wr_id, WcStatus::WrFlushErr));
            return Ok(());
        }
        if !sq.pending.is_empty() {
            if sq.pending.len() >= self.cap.max_send_wr as usize {
                return Err(errno(libc::ENOMEM));
            }
            let rnr_left = sq.rnr_retry;
            // A fault plan's delay holds it its own time after the ones before it.
            let next_try = if self.anomalous() {
                self.fault_delay().map(|wait| Instant::now() + wait)
            } else {
                None
            };
            // SAFETY: forwarded from this function's contract.
            let desc = unsafe { Desc::keep(head, sges) };
            sq.pending.push_back(Pending { desc, next_try, rnr_left, ticket: None });
            return Ok(());
        }
        // SAFETY: forwarded from this function's contract.
        match unsafe { super::exec::execute(self, sq, &head, sges, keys, false) } {
            Step::Done(status, len) => self.complete(sq, &head, status, len),
            Step::Later(wait) => {
                let rnr_left = sq.rnr_retry;
                // SAFETY: forwarded from this function's contract.
                let desc = unsafe { Desc::keep(head, sges) };
                let next_try = Some(Instant::now() + wait);
                sq.pending.push_back(Pending { desc, next_try, rnr_left, ticket: None });
                self.send_cq.note_work();
            }
            Step::Waiting(ticket) => {
                let rnr_left = sq.rnr_retry;
                // SAFETY: forwarded from this function's contract.
                let desc = unsafe { Desc::keep(head, sges) };
                sq.pending.push_back(Pending {
                    desc,
                    next_try: None,
                    rnr_left,
                    ticket: Some(ticket),
                });
                self.send_cq.note_work();
            }
            Step::Rnr(wait) => {
                if sq.rnr_retry == 0 {
                    self.complete(sq, &head, WcStatus::RnrRetryExcErr, 0);
                } else {
                    let rnr_left = sq.rnr_retry - 1;
                    // SAFETY: forwarded from this function's contract.
                    let desc = unsafe { Desc::keep(head, sges) };
                    let next_try = Some(Instant::now() + wait);
                    sq.pending.push_back(Pending { desc, next_try, rnr_left, ticket: None });
                    self.send_cq.note_work();
                }
            }
        }
        Ok(())
    }

    /// Deferred work, run by a poll of the send CQ: flushes after an error, RNR retries whose
    /// timer is due. Returns whether work remains.
    pub(crate) fn progress(&self) -> bool {
        let mut sq = self.sq();
        let mut held = false;
        if self.anomalous() {
            // A message held back to be overtaken goes once none came in time.
            let (due, still) = self.held_due(Instant::now());
            if let Some(h) = due {
                let mut keys = Fabric::get().keys_lazy();
                h.deliver(self, keys.get());
            }
            held = still;
        }
        if sq.pending.is_empty() {
            return held;
        }
        if self.state() == QpState::Err {
            self.flush_pending(&mut sq);
            return false;
        }
        let now = Instant::now();
        let mut keys = Fabric::get().keys_lazy();
        while let Some(front) = sq.pending.front() {
            if front.next_try.is_some_and(|t| t > now) {
                return true;
            }
            // A request on its way to another process ends when its answer comes.
            let answer = match &front.ticket {
                Some(t) => match t.poll() {
                    None => return true,
                    answer => answer,
                },
                None => None,
            };
            let Some(p) = sq.pending.pop_front() else { break };
            let (head, sges) = (&p.desc.head, &p.desc.sges);
            let step = match answer {
                // SAFETY: a kept request's SGEs are its own (its buffers stay valid until it
                // completes, the post's contract).
                Some(answer) => unsafe {
                    super::exec::answered(self, head, sges, &mut keys, answer)
                },
                // SAFETY: a kept request's inline SGE points at its own copy of the payload.
                None => unsafe { super::exec::execute(self, &mut sq, head, sges, &mut keys, true) },
            };
            let (desc, rnr_left) = (p.desc, p.rnr_left);
            match step {
                Step::Done(status, len) => self.complete(&mut sq, &desc.head, status, len),
                Step::Later(wait) => {
                    // (never: a replayed request draws no delay)
                    let next_try = Some(now + wait);
                    sq.pending.push_front(Pending { desc, next_try, rnr_left, ticket: None });
                    return true;
                }
                Step::Waiting(ticket) => {
                    let ticket = Some(ticket);
                    sq.pending.push_front(Pending { desc, next_try: None, rnr_left, ticket });
                    return true;
                }
                Step::Rnr(wait) => {
                    if rnr_left == 0 {
                        self.complete(&mut sq, &desc.head, WcStatus::RnrRetryExcErr, 0);
                    } else {
                        // 7 means "retry forever".
                        let rnr_left = if sq.rnr_retry == 7 { 7 } else { rnr_left - 1 };
                        let next_try = Some(now + wait);
                        sq.pending.push_front(Pending { desc, next_try, rnr_left, ticket: None });
                        return true;
                    }
                }
            }
        }
        !sq.pending.is_empty() || held
    }
}

/// A queue pair of `soft`.
#[derive(Debug)]
pub struct SoftQp {
    pub(crate) shared: Arc<QpShared>,
    _pd: SoftPd,
    _cqs: (SoftCq, SoftCq),
}

impl SoftQp {
    /// Injects the faults of `plan` into what this QP sends from now on (`None`: none; a
    /// program's `CORELINK_SOFT_FAULTS` plan comes back when the QP is reset), drawn from the
    /// plan's seed and this QP's number (see [`super::faults`]).
    pub fn set_fault_plan(&self, plan: Option<super::faults::FaultPlan>) {
        self.shared.set_faults(plan);
    }

    pub(crate) fn new(pd: &SoftPd, attr: &QpInitAttr<'_, Soft>) -> Result<Self> {
        let cap = attr.cap;
        let fail =
            |msg: String| Error::CreateQp { qp_type: attr.qp_type, cap, source: invalid(msg) };
        if cap.max_send_wr == 0
            || cap.max_send_wr > limits::MAX_QP_WR
            || cap.max_recv_wr > limits::MAX_QP_WR
        {
            return Err(fail(format!("queue depths must be 1..={}", limits::MAX_QP_WR)));
        }
        if cap.max_send_sge as usize > limits::MAX_SGE
            || cap.max_recv_sge as usize > limits::MAX_SGE
        {
            return Err(fail(format!("at most {} SGEs per request", limits::MAX_SGE)));
        }
        if cap.max_inline_data as usize > limits::MAX_INLINE {
            return Err(fail(format!("at most {} bytes inline", limits::MAX_INLINE)));
        }
        // Objects of two contexts do not combine, as on a device (see `Error::ForeignObject`).
        let foreign = |what| Error::ForeignObject { what, device: pd.ctx.describe() };
        if !Arc::ptr_eq(&attr.send_cq.shared.ctx, &pd.ctx) {
            return Err(foreign("send CQ"));
        }
        if !Arc::ptr_eq(&attr.recv_cq.shared.ctx, &pd.ctx) {
            return Err(foreign("receive CQ"));
        }
        let rq = match attr.srq {
            Some(srq) => {
                if srq.shared.pd != pd.id {
                    return Err(fail("the SRQ belongs to another protection domain".into()));
                }
                RecvSource::Srq(srq.shared.clone())
            }
            None => RecvSource::Own(Box::new(ArrayQueue::new(cap.max_recv_wr.max(1) as usize))),
        };
        let shared = Fabric::get().add_qp(|qpn| {
            Arc::new(QpShared {
                qpn,
                qp_type: attr.qp_type,
                pd: pd.id,
                ctx: pd.ctx.clone(),
                cap,
                sq_sig_all: attr.sq_sig_all,
                state: AtomicU8::new(0),
                rq,
                send_cq: attr.send_cq.shared.clone(),
                recv_cq: attr.recv_cq.shared.clone(),
                access: AtomicU32::new(0),
                qkey: AtomicU32::new(0),
                min_rnr_timer: AtomicU8::new(12),
                mtu: AtomicU32::new(limits::MTU.bytes()),
                // (a UD QP of a process on a named fabric may send to any process)
                sq: Mutex::new(SendQueue {
                    may_cross: attr.qp_type == QpType::Ud && super::port::get().is_some(),
                    ..SendQueue::default()
                }),
                dropped: AtomicU64::new(0),
                anomalies: AtomicU8::new(0),
                retry_cnt: AtomicU8::new(0),
                faults: Mutex::new(None),
            })
        });
        shared.set_faults(super::faults::global().ok().flatten());
        attr.send_cq.shared.register(&shared);
        Ok(SoftQp { shared, _pd: pd.clone(), _cqs: (attr.send_cq.clone(), attr.recv_cq.clone()) })
    }

    /// Incoming messages this QP dropped (UD/UC with no receive posted, UD qkey mismatch).
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        Fabric::get().remove_qp(self.shared.qpn);
        self.shared.set_state(QpState::Reset);
        super::shm::publish_qp(self.shared.qpn, None);
        // Lets the peer go (two connected QPs hold each other), and forgets deferred sends,
        // so that a destroyed QP its peer still holds does nothing more on the CQ.
        let mut sq = self.shared.sq();
        sq.peer = None;
        sq.far = None;
        sq.may_cross = false;
        sq.pending.clear();
    }
}

impl crate::Qp<Soft> for SoftQp {
    fn qp_num(&self) -> u32 {
        self.shared.qpn
    }

    fn qp_type(&self) -> QpType {
        self.shared.qp_type
    }

    fn state(&self) -> QpState {
        self.shared.state()
    }

    fn cap(&self) -> QpCap {
        self.shared.cap
    }

    fn modify(&mut self, attr: &QpAttr) -> Result<()> {
        let qp = &self.shared;
        let from = qp.state();
        let fail = |msg: String| Error::ModifyQp {
            qpn: qp.qpn,
            from,
            to: attr.state,
            source: invalid(msg),
        };
        if !from.can_move_to(attr.state) {
            return Err(fail(format!("{from:?} -> {:?} is not a valid transition", attr.state)));
        }
        match attr.state {
            QpState::Reset => {
                qp.anomalies.fetch_and(!CUT, Ordering::Relaxed);
                // (a listener's plan was the last connection's; the program's stays)
                qp.set_faults(super::faults::global().ok().flatten());
                let mut sq = qp.sq();
                sq.pending.clear();
                if let RecvSource::Own(q) = &qp.rq {
                    while q.pop().is_some() {}
                }
            }
            QpState::Init => {
                if attr.port != 1 {
                    return Err(fail(format!("port {} does not exist", attr.port)));
                }
                qp.access.store(attr.access.bits(), Ordering::Relaxed);
                qp.qkey.store(attr.qkey, Ordering::Relaxed);
            }
            QpState::Rtr => {
                qp.min_rnr_timer.store(attr.min_rnr_timer, Ordering::Relaxed);
                if qp.qp_type != QpType::Ud {
                    qp.mtu.store(attr.path_mtu.bytes().min(limits::MTU.bytes()), Ordering::Relaxed);
                    // (the link is made before the send queue is locked: making one may wait)
                    let far = far_link(&attr.dest.gid);
                    qp.sq().connect_to(attr.dest.qpn, far);
                }
            }
            QpState::Rts => {
                qp.sq().rnr_retry = attr.rnr_retry.min(7);
                qp.retry_cnt.store(attr.retry_cnt.min(7), Ordering::Relaxed);
            }
            QpState::Err => {
                qp.set_error();
                let mut sq = qp.sq();
                qp.flush_pending(&mut sq);
            }
            QpState::Sqd | QpState::Sqe => {
                return Err(fail(format!("the soft provider does not enter {:?}", attr.state)));
            }
        }
        qp.set_state(attr.state);
        Ok(())
    }

    unsafe fn post_send(&mut self, wrs: &[crate::SendWr<'_, Soft>]) -> Result<()> {
        // SAFETY: the caller keeps every buffer valid until completion (this fn's contract).
        unsafe { super::exec::post_send(&self.shared, wrs) }
    }

    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let qp = &self.shared;
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |source| Error::PostRecv { qpn: qp.qpn, index, source };
            let RecvSource::Own(q) = &qp.rq else {
                return Err(fail(invalid("the QP takes its receives from an SRQ")));
            };
            if qp.state() == QpState::Reset {
                return Err(fail(invalid("the QP is in RESET")));
            }
            if wr.sgl.len() > qp.cap.max_recv_sge as usize {
                return Err(fail(invalid(format!(
                    "{} SGEs, max_recv_sge is {}",
                    wr.sgl.len(),
                    qp.cap.max_recv_sge
                ))));
            }
            let entry = RecvEntry::new(wr.wr_id, wr.sgl);
            q.push(entry).map_err(|_| fail(errno(libc::ENOMEM)))?;
            if qp.state() == QpState::Err {
                qp.flush_recv();
            }
        }
        Ok(())
    }
}
