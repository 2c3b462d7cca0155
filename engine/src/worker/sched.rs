//! The scheduler: how waiting requests become work requests. Per connection, requests wait in
//! priority classes (class 0 first, with aging so that no class starves); each batch goes to
//! the next lane with room, as one linked list (one doorbell) of at most `post_list` work
//! requests; a QP never has more than its send-queue depth (`max_outstanding`) nor more reads
//! and atomics than `max_rd_atomic` on the device (beyond, requests wait); identical reads in
//! flight share one RDMA read; adjacent writes may go as one gathered write; one work request
//! in `signal_every` asks for a completion (a batch's last one does whenever nothing follows
//! it at once, so every request learns its outcome).

use arrayvec::ArrayVec;
use corelink_verbs::{Error as VerbsError, Provider, Qp, SendFlags, SendOp, SendWr, Sge, WcStatus};

use super::conn::{Conn, Phase, Req};
use super::cx::{Cx, Notice, WorkerCfg};
use super::outbox::Outbox;
use super::requests::{ReqId, Requests};
use super::WrId;
use crate::metrics::Metrics;
use crate::request::OpKind;
use crate::tunables::{CLASSES, MAX_POST_LIST, MAX_SGE};

/// Everything a flush touches besides the connection.
struct Ctx<'a, P: Provider> {
    reqs: &'a mut Requests<P>,
    outbox: &'a mut Outbox<P>,
    metrics: &'a mut Metrics,
    cfg: &'a WorkerCfg,
}

impl<P: Provider> Cx<P> {
    /// Posts what the connections have waiting; returns whether anything was posted.
    pub(crate) fn flush(&mut self) -> bool {
        if self.stopping {
            self.close_for_shutdown();
        }
        let Cx { conns, reqs, outbox, metrics, cfg, .. } = self;
        let mut x = Ctx { reqs, outbox, metrics, cfg };
        let mut posted_any = false;
        // Visits each connection with work; keeps only those that still have some (waiting
        // behind backpressure, or closing), so that the rest of the loop finds the set empty.
        conns.retain_dirty(|c| {
            if c.phase == Phase::Closing {
                flush_waiting(c, &mut x);
            } else {
                posted_any |= flush_conn(c, &mut x);
            }
            // (a failed post closes it)
            c.phase == Phase::Closing || c.has_waiting()
        });
        posted_any
    }
}

/// Fails every waiting request of a closing connection with `WrFlushErr`.
fn flush_waiting<P: Provider>(c: &mut Conn<P>, x: &mut Ctx<'_, P>) {
    for q in c.queues.iter_mut() {
        while let Some(id) = q.pop(x.reqs.slab()) {
            if let Some((r, data)) = x.reqs.remove(id) {
                x.outbox.notify(Notice::failed(r, WcStatus::WrFlushErr, data));
            }
        }
    }
    c.waiting = 0;
}

/// Posts batches on the connection's lanes in turn until nothing more can go.
fn flush_conn<P: Provider>(c: &mut Conn<P>, x: &mut Ctx<'_, P>) -> bool {
    let mut served = [false; CLASSES];
    let mut any = false;
    let mut idle = 0;
    let lanes = c.lanes.len();
    while c.waiting > 0 && idle < lanes && c.phase == Phase::Open {
        // (next_lane < lanes always: it only ever steps through 0..lanes)
        let l = c.next_lane;
        c.next_lane = if l + 1 >= lanes { 0 } else { l + 1 };
        if post_batch(c, l, x, &mut served) > 0 {
            idle = 0;
            any = true;
        } else {
            idle += 1;
        }
    }
    // Aging: a class that waited while others were served moves up.
    if any && c.waiting == 0 {
        c.passed = [0; CLASSES];
        c.most_passed = 0;
    } else if any {
        let mut most = 0;
        for ((passed, queue), served) in c.passed.iter_mut().zip(&c.queues).zip(served) {
            *passed = if served || queue.is_empty() { 0 } else { passed.saturating_add(1) };
            most = most.max(*passed);
        }
        c.most_passed = most;
    }
    any
}

/// The class whose head goes next on a lane with `rd_room` reads/atomics to spare, if any.
fn pick_class<P: Provider>(c: &Conn<P>, rd_room: bool, x: &Ctx<'_, P>) -> Option<usize> {
    let admissible = |k: usize| {
        if rd_room {
            return !c.queues[k].is_empty(); // the common case: no need to look at the request
        }
        let Some(id) = c.queues[k].front(x.reqs.slab()) else { return false };
        let Some(r) = x.reqs.get(id) else { return true }; // gone: popped and skipped
        !r.is_rd_atomic()
            || (r.kind == OpKind::Read
                && x.cfg.merge_reads
                && x.reqs.reading(&r.merge_key(c.write_epoch)))
    };
    if c.most_passed >= x.cfg.aging_rounds {
        // The class passed over longest, once it has waited `aging_rounds` flushes, goes first.
        let aged = (0..CLASSES).max_by_key(|&k| c.passed[k]).filter(|&k| admissible(k));
        if aged.is_some() {
            return aged;
        }
    }
    (0..CLASSES).find(|&k| admissible(k))
}

/// One batch on lane `l`: returns the work requests posted.
fn post_batch<P: Provider>(
    c: &mut Conn<P>,
    l: usize,
    x: &mut Ctx<'_, P>,
    served: &mut [bool; CLASSES],
) -> usize {
    let cfg = x.cfg;
    let lane = &c.lanes[l];
    let room = cfg.max_outstanding.saturating_sub(lane.outstanding()) as usize;
    let limit = room.min(cfg.post_list);
    let mut rd = lane.rd_outstanding;
    let mut staged = ArrayVec::<Staged<P>, MAX_POST_LIST>::new();
    let mut sges = ArrayVec::<Sge, { MAX_POST_LIST * MAX_SGE }>::new();
    while staged.len() < limit && c.waiting > 0 {
        let rd_room = rd < cfg.max_rd_atomic;
        let Some(k) = pick_class(c, rd_room, x) else { break };
        served[k] = true;
        // Class `k` stays the one to serve while it has requests and reads and atomics have
        // room (queues only shrink during a flush, so no class above it fills up): take its
        // requests without choosing again. Without that room, each head is admitted alone.
        while let Some(id) = c.queues[k].pop(x.reqs.slab()) {
            c.waiting -= 1;
            stage(c, k, l, id, x, &mut staged, &mut sges, &mut rd);
            if staged.len() >= limit || !rd_room || rd >= cfg.max_rd_atomic {
                break;
            }
        }
    }
    if staged.is_empty() {
        return 0;
    }
    post(c, l, &staged, &sges, x)
}

/// Stages request `id` (just taken from class `k`) for lane `l`: it rides on an identical read
/// in flight, or becomes a work request (with the writes it coalesces).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn stage<P: Provider>(
    c: &mut Conn<P>,
    k: usize,
    l: usize,
    id: ReqId,
    x: &mut Ctx<'_, P>,
    staged: &mut ArrayVec<Staged<P>, MAX_POST_LIST>,
    sges: &mut ArrayVec<Sge, { MAX_POST_LIST * MAX_SGE }>,
    rd: &mut u32,
) {
    let cfg = x.cfg;
    let Some(r) = x.reqs.get_mut(id) else { return };
    let key = (r.kind == OpKind::Read && cfg.merge_reads).then(|| r.merge_key(c.write_epoch));
    let r = match key {
        None => r,
        Some(key) => {
            if x.reqs.ride_or_register(key, id) {
                x.metrics.merged_reads += 1;
                return;
            }
            let Some(r) = x.reqs.get_mut(id) else { return };
            r
        }
    };
    r.merge_epoch = key.map(|k| k.epoch);
    r.lane = l as u8;
    let rd_atomic = r.is_rd_atomic();
    if rd_atomic {
        *rd += 1;
    }
    let op = send_op(r);
    let may_inline = matches!(r.kind, OpKind::Send | OpKind::Write);
    if r.kind != OpKind::Read {
        c.write_epoch = c.write_epoch.wrapping_add(1);
    }
    let first = sge_of(r);
    let coalesce = cfg.coalesce_writes && r.kind == OpKind::Write && r.imm.is_none();
    sges.push(first);
    if coalesce {
        coalesce_after(c, k, id, x, sges);
    }
    staged.push(Staged { id, end: sges.len(), op, rd_atomic, may_inline });
}

/// The verbs operation of a request.
pub(crate) fn send_op<P: Provider>(r: &Req<P>) -> SendOp<'static, P> {
    match r.kind {
        OpKind::Send => r.imm.map_or(SendOp::Send, SendOp::SendWithImm),
        OpKind::Write => match r.imm {
            Some(imm) => SendOp::WriteWithImm(r.remote, imm),
            None => SendOp::Write(r.remote),
        },
        OpKind::Read => SendOp::Read(r.remote),
        OpKind::FetchAdd => SendOp::FetchAdd { remote: r.remote, add: r.arg },
        OpKind::CompareSwap => {
            SendOp::CompareSwap { remote: r.remote, compare: r.arg, swap: r.swap }
        }
    }
}

/// The scatter/gather entry of a request's buffer.
pub(crate) fn sge_of<P: Provider>(r: &Req<P>) -> Sge {
    match r.kind {
        OpKind::FetchAdd | OpKind::CompareSwap => Sge { length: 8, ..r.buf.sge(true) },
        _ => r.buf.sge(false),
    }
}

/// Takes the writes queued right behind write `id` in class `k` that continue its remote range
/// (same key, no immediate, within `coalesce_max_bytes` and the gather list), chaining them to it.
fn coalesce_after<P: Provider>(
    c: &mut Conn<P>,
    k: usize,
    id: ReqId,
    x: &mut Ctx<'_, P>,
    sges: &mut ArrayVec<Sge, { MAX_POST_LIST * MAX_SGE }>,
) {
    let Some(head) = x.reqs.get(id) else { return };
    let (rkey, mut end, mut total) =
        (head.remote.rkey, head.remote.addr + head.len as u64, head.len);
    let mut tail = id;
    let mut n = 1;
    while n < MAX_SGE && !sges.is_full() {
        let Some(next) = c.queues[k].front(x.reqs.slab()) else { break };
        let Some(r) = x.reqs.get(next) else { break };
        let fits = r.kind == OpKind::Write
            && r.imm.is_none()
            && r.remote.rkey == rkey
            && r.remote.addr == end
            && total + r.len <= x.cfg.coalesce_max;
        if !fits {
            break;
        }
        sges.push(sge_of(r));
        end += r.len as u64;
        total += r.len;
        c.queues[k].pop(x.reqs.slab());
        c.waiting -= 1;
        if let Some(t) = x.reqs.get_mut(tail) {
            t.next = Some(next);
        }
        tail = next;
        n += 1;
        x.metrics.coalesced_writes += 1;
    }
}

/// A request staged for a batch: what its work request needs, so that posting looks nothing up.
struct Staged<P: Provider> {
    id: ReqId,
    /// Its gather list ends here in the batch's entries.
    end: usize,
    op: SendOp<'static, P>,
    rd_atomic: bool,
    /// A send or a write (may go inline).
    may_inline: bool,
}

/// Posts the staged work requests on lane `l` with one doorbell; returns how many the device
/// took (the rest fail, and the connection closes).
fn post<P: Provider>(
    c: &mut Conn<P>,
    l: usize,
    staged: &[Staged<P>],
    sges: &[Sge],
    x: &mut Ctx<'_, P>,
) -> usize {
    let cfg = x.cfg;
    let lanes = c.lanes.len();
    let waiting = c.waiting;
    let lane = &mut c.lanes[l];
    let n = staged.len();
    let room_after = cfg.max_outstanding.saturating_sub(lane.outstanding() + n as u32);
    // The batch's last request is signalled unless another batch follows on this lane at once.
    let follows = lanes == 1 && n == cfg.post_list && room_after > 0 && waiting > 0;
    let mut rd = lane.rd_outstanding;
    let mut signalled = 0;
    let mut start = 0;
    // Built in place (collecting would build it elsewhere and copy all 32 slots).
    let mut wrs = ArrayVec::<SendWr<'_, P>, MAX_POST_LIST>::new();
    for (i, st) in staged.iter().enumerate() {
        let sgl = &sges[start..st.end];
        start = st.end;
        if st.rd_atomic {
            rd += 1;
        }
        lane.unsignalled += 1;
        let last = i + 1 == n;
        let signal = lane.unsignalled >= cfg.signal_every
            || (last && !follows)
            || (st.rd_atomic && rd >= cfg.max_rd_atomic);
        let mut flags = SendFlags::empty();
        if signal {
            flags |= SendFlags::SIGNALED;
            lane.unsignalled = 0;
            signalled += 1;
        }
        let bytes: u32 = sgl.iter().map(|s| s.length).sum();
        if st.may_inline && bytes <= cfg.max_inline {
            flags |= SendFlags::INLINE;
        }
        wrs.push(SendWr { wr_id: WrId::Req(st.id).encode(), op: st.op, sgl, flags, ud: None });
    }
    // SAFETY: every buffer a work request names is held by its request in the slab (not by the
    // application) until the request's completion is dispatched.
    let res = unsafe { lane.qp.post_send(&wrs) };
    let k = match res {
        Ok(()) => wrs.len(),
        Err(VerbsError::PostSend { index, .. }) => index,
        Err(_) => 0,
    };
    drop(wrs);
    for st in &staged[..k] {
        lane.posted.push(x.reqs.slab_mut(), st.id);
        lane.rd_outstanding += u32::from(st.rd_atomic);
    }
    x.metrics.posted += k as u64;
    x.metrics.signalled += signalled;
    x.metrics.doorbells += 1;
    if k < n {
        for st in &staged[k..] {
            x.reqs.fail_chain(st.id, WcStatus::GeneralErr, x.outbox);
        }
        c.note_error(WcStatus::GeneralErr);
    }
    k
}
