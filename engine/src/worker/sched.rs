//! The scheduler: how waiting requests become work requests. Per connection, requests wait in
//! priority classes (class 0 first, with aging so that no class starves); each batch goes to
//! the next lane with room, as one linked list (one doorbell) of at most `post_list` work
//! requests; a QP never has more than its send-queue depth (`max_outstanding`) nor more reads
//! and atomics than `max_rd_atomic` on the device (beyond, requests wait); identical reads in
//! flight share one RDMA read; adjacent writes may go as one gathered write; one work request
//! in `signal_every` asks for a completion (a batch's last one does whenever nothing follows
//! it at once, so every request learns its outcome).
//!
//! In two steps: [`plan`] picks a batch for one lane from the waiting requests and that lane's
//! send queue (no device involved: unit-tested on its own), and [`post`] gives a batch to the
//! lane's QP with one doorbell. The flat path (`Cx::post_now`) posts a batch of one through the
//! same [`post`].

use arrayvec::ArrayVec;
use corelink_verbs::{Error as VerbsError, Provider, Qp, SendFlags, SendOp, SendWr, Sge, WcStatus};

use super::cfg::WorkerCfg;
use super::conn::{Conn, Lane, Phase};
use super::conns::Conns;
use super::ids::{ReqId, WrId};
use super::notice::Notice;
use super::outbox::Outbox;
use super::queues::{SendQueue, Waiting};
use super::ready::{Entry, Wire};
use super::requests::{Req, Requests};
use super::words::WordsAt;
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::request::OpKind;
use crate::tunables::{CLASSES, MAX_POST_LIST, MAX_SGE};

/// Everything a flush touches besides the connection.
struct Ctx<'a, P: Provider> {
    reqs: &'a mut Requests<P>,
    pool: &'a Pool<P>,
    outbox: &'a mut Outbox<P>,
    metrics: &'a mut Metrics,
    cfg: &'a WorkerCfg,
    gather: &'a mut GatherSpace,
}

/// Where a batch's gather lists are written: room for a whole batch's (`MAX_POST_LIST` work
/// requests of `MAX_SGE` entries), made once per worker, so that a batch's work requests
/// borrow their lists from it and go to the device as they were planned (never copied).
pub(crate) struct GatherSpace(Box<[Sge; MAX_POST_LIST * MAX_SGE]>);

impl GatherSpace {
    pub(crate) fn new() -> Self {
        GatherSpace(Box::new([Sge { addr: 0, length: 0, lkey: 0 }; MAX_POST_LIST * MAX_SGE]))
    }
}

// A batch's per-request bits (`Batch::rd_atomic`, `Batch::release`) fit a `u32`.
const _: () = assert!(MAX_POST_LIST <= 32);

/// Posts what the dirty connections have waiting (fails what closing ones have); returns
/// whether anything was posted.
pub(crate) fn flush<P: Provider>(
    conns: &mut Conns<P>,
    reqs: &mut Requests<P>,
    pool: &Pool<P>,
    outbox: &mut Outbox<P>,
    metrics: &mut Metrics,
    cfg: &WorkerCfg,
    gather: &mut GatherSpace,
) -> bool {
    let mut x = Ctx { reqs, pool, outbox, metrics, cfg, gather };
    let mut posted_any = false;
    // Visits each connection with work; keeps only those that still have some (waiting behind
    // backpressure, or closing), so that the rest of the loop finds the set empty.
    conns.retain_dirty(|c| {
        if c.phase == Phase::Closing {
            c.ready.demote(&mut c.waiting, x.reqs);
            flush_waiting(c, &mut x);
            fence(c, &mut x);
        } else {
            if !c.ready.is_empty() {
                posted_any |= flush_ready(c, &mut x);
            }
            if c.waiting.len > 0 {
                posted_any |= flush_conn(c, &mut x);
            }
        }
        // (a failed post closes it)
        c.phase == Phase::Closing || c.has_waiting()
    });
    posted_any
}

/// Fails every waiting request of a closing connection with `WrFlushErr`.
fn flush_waiting<P: Provider>(c: &mut Conn<P>, x: &mut Ctx<'_, P>) {
    for q in c.waiting.queues.iter_mut() {
        while let Some(id) = q.pop(x.reqs.slab()) {
            if let Some((r, data)) = x.reqs.remove(id) {
                if let Some(n) = Notice::failed(id, r, WcStatus::WrFlushErr, data, c.reason) {
                    x.outbox.notify(n);
                }
            }
        }
    }
    c.waiting.len = 0;
}

/// Posts a fence on each lane of a closing connection whose last work requests are quiet ones
/// that asked for no completion: a signalled zero-length write (executed, or flushed once the
/// QP is in ERR) whose completion retires them, so that the lane drains. Without a buffer or
/// a slot for it, or refused by the device, it is tried again at the next flush (a closing
/// connection is visited by every flush).
#[cold]
#[inline(never)]
fn fence<P: Provider>(c: &mut Conn<P>, x: &mut Ctx<'_, P>) {
    for (l, lane) in c.lanes.iter_mut().enumerate() {
        // (a full lane makes room as its signalled requests complete: the quiet tail is
        // shorter than `signal_every`, which is at most the queue's depth)
        if lane.sq.unsignalled == 0 || lane.sq.outstanding() >= x.cfg.max_outstanding {
            continue;
        }
        let Ok(buf) = x.pool.get(0) else { return };
        let r = Req {
            conn: c.id,
            lane: l as u8,
            kind: OpKind::Write,
            buf: Some(buf),
            remote: corelink_verbs::RemoteAddr::default(),
            len: 0,
            imm: None,
            arg: 0,
            swap: 0,
            token: 0,
            origin: crate::handoff::Origin::Fence,
            next: None,
            merge_epoch: None,
            quiet: false,
        };
        let Ok(id) = x.reqs.insert_from((), r, |r| r) else { return };
        let Some(r) = x.reqs.get(id) else { return };
        let one = single(id, r, x.reqs.words(), x.cfg);
        if post_one(one, lane, x.reqs, x.metrics, x.outbox) {
            x.metrics.fences += 1;
        }
    }
}

/// Posts batches on the connection's lanes in turn until nothing more can go (inlined in
/// the flush: the latency path's one call).
#[inline(always)]
fn flush_conn<P: Provider>(c: &mut Conn<P>, x: &mut Ctx<'_, P>) -> bool {
    if c.waiting.len == 1 && c.lanes.len() == 1 {
        if let Some(posted) = flush_one(c, x) {
            return posted;
        }
    }
    let mut served = [false; CLASSES];
    let mut any = false;
    let mut idle = 0;
    let lanes = c.lanes.len();
    while c.waiting.len > 0 && idle < lanes && c.phase == Phase::Open {
        // (next_lane < lanes always: it only ever steps through 0..lanes)
        let l = c.next_lane;
        c.next_lane = if l + 1 >= lanes { 0 } else { l + 1 };
        let lane = &mut c.lanes[l];
        // (filled where it lies: it is kilobytes, and moving it costs a copy)
        let mut batch = Batch::new(x.gather);
        plan(&mut c.waiting, &lane.sq, lanes, l, x.reqs, x.cfg, x.metrics, &mut served, &mut batch);
        if batch.is_empty() {
            idle += 1;
            continue;
        }
        idle = 0;
        any = true;
        if post(&batch, lane, x.reqs, x.metrics, x.outbox) < batch.len() {
            c.note_error(WcStatus::GeneralErr);
        }
    }
    // Aging: a class that waited while others were served moves up.
    let w = &mut c.waiting;
    if any && w.len == 0 {
        w.passed = [0; CLASSES];
        w.most_passed = 0;
    } else if any {
        let mut most = 0;
        for ((passed, queue), served) in w.passed.iter_mut().zip(&w.queues).zip(served) {
            *passed = if served || queue.is_empty() { 0 } else { passed.saturating_add(1) };
            most = most.max(*passed);
        }
        w.most_passed = most;
    }
    any
}

/// Whether connection `c`'s only work is one ready request with room on its one lane: the
/// latency path, posted alone (`post_lone_ready`) wherever it is found.
#[inline(always)]
fn sole_ready<P: Provider>(c: &Conn<P>, cfg: &WorkerCfg) -> bool {
    c.waiting.len == 0
        && c.ready.len() == 1
        && matches!(c.lanes.as_slice(), [lane] if c.ready.fits(&lane.sq, cfg))
}

/// Whether a request of queue `queue` that connection `c` would make ready (`Ready::admits`
/// said it may join) goes to the device as it is submitted rather than at the loop's flush: it
/// is of the first queue (which nothing submitted after it can pass: the first class with
/// priorities, any without), nothing is ready or waits before it, and the connection's one
/// lane has nothing on the device, so no completion is due that would bring requests to batch
/// with it (the latency path: a read posted once the last one completed). A handler that
/// submits several at once on an idle connection has the first go alone and the rest in the
/// flush's batches.
#[inline(always)]
pub(crate) fn goes_at_once<P: Provider>(c: &Conn<P>, queue: usize) -> bool {
    // (a lane with nothing on the device has room for one)
    match c.lanes.as_slice() {
        [lane] => corelink_verbs::one_test(
            (queue == 0) & (c.waiting.len == 0) & c.ready.is_empty() & (lane.sq.outstanding() == 0),
        ),
        _ => false,
    }
}

/// The flush of connection `c` when its only work is one ready request (`sole_ready`): posted
/// as [`flush_ready`] posts it, without the scheduler's frame. `None` when it has other work
/// (the general flush's); else whether it stays dirty (a failed post closes it).
#[inline(always)]
pub(crate) fn flush_sole<P: Provider>(
    c: &mut Conn<P>,
    reqs: &mut Requests<P>,
    metrics: &mut Metrics,
    outbox: &mut Outbox<P>,
    cfg: &WorkerCfg,
) -> Option<bool> {
    if c.phase != Phase::Open || !sole_ready(c, cfg) {
        return None;
    }
    post_lone_ready(c, reqs, metrics, outbox, cfg);
    Some(c.phase == Phase::Closing || c.has_waiting())
}

/// Posts connection `c`'s one ready request (`worker/ready.rs`), on its one lane, which has
/// room for it, with its own doorbell, as a lone waiting request goes; returns false when the
/// device refused it (it failed, and the connection is to close: `Conn::note_error`).
#[inline(always)]
pub(crate) fn post_lone_ready<P: Provider>(
    c: &mut Conn<P>,
    reqs: &mut Requests<P>,
    metrics: &mut Metrics,
    outbox: &mut Outbox<P>,
    cfg: &WorkerCfg,
) -> bool {
    let (waiting, ready) = (&mut c.waiting, &mut c.ready);
    let Some(lane) = c.lanes.first_mut() else {
        metrics.invariant_misses += 1; // (never: the callers checked it; the request stays)
        return true;
    };
    let [e] = ready.batch(1) else {
        metrics.invariant_misses += 1; // (never: the callers checked it)
        return true;
    };
    let posted = post_lone(e.wire, lane, waiting, reqs, metrics, outbox, cfg);
    ready.clear();
    if !posted {
        c.note_error(WcStatus::GeneralErr);
    }
    posted
}

/// Posts `e`, the only work of the connection whose one lane is `lane` and whose queues are
/// `waiting` (ready, or made ready as it was submitted: `admit`), on that lane, which has room
/// for it, with its own doorbell; returns false when the device refused it (it failed, and
/// the connection is to close: the caller's `Conn::note_error`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn post_lone<P: Provider>(
    e: Wire<P>,
    lane: &mut Lane<P>,
    waiting: &mut Waiting,
    reqs: &mut Requests<P>,
    metrics: &mut Metrics,
    outbox: &mut Outbox<P>,
    cfg: &WorkerCfg,
) -> bool {
    let (flags, release) = lone_flags(e.inline, e.quiet);
    let flags = quiet_unless_due(flags, release, &lane.sq, cfg);
    let sgl = std::slice::from_ref(&e.sge);
    let wr = SendWr { wr_id: WrId::Req(e.id).encode(), op: e.op, sgl, flags, ud: None };
    let (read, rd_atomic) = e.reads();
    if !read {
        waiting.write_epoch = waiting.write_epoch.wrapping_add(1);
    }
    post_wr(&wr, e.id, rd_atomic, release, lane, reqs, metrics, outbox)
}

/// Posts the connection's ready requests (`worker/ready.rs`) on its one lane, in the plan's
/// batches of `post_list`; when requests wait beside them, or the lane's room shrank since
/// they were made, they go back to their queue instead and the scheduler plans them with the
/// rest (the same batches either way). Returns whether anything was posted.
#[inline(always)]
fn flush_ready<P: Provider>(c: &mut Conn<P>, x: &mut Ctx<'_, P>) -> bool {
    if sole_ready(c, x.cfg) {
        // (the latency path: one request, posted as `flush_one` posts a lone waiting one,
        // its work request made once from its entry)
        post_lone_ready(c, x.reqs, x.metrics, x.outbox, x.cfg);
        return true;
    }
    let (waiting, ready) = (&mut c.waiting, &mut c.ready);
    let Some(lane) = c.lanes.first_mut() else {
        ready.demote(waiting, x.reqs);
        return false;
    };
    if waiting.len > 0 || !ready.fits(&lane.sq, x.cfg) {
        ready.demote(waiting, x.reqs);
        return false;
    }
    // (batches of `post_list`, as the scheduler would make them)
    while !ready.is_empty() {
        let follows = ready.len() > x.cfg.post_list;
        let entries = ready.batch(x.cfg.post_list);
        let mut batch = Batch::new(x.gather);
        plan_ready(entries, follows, waiting, &lane.sq, x.cfg, &mut batch);
        let short = post(&batch, lane, x.reqs, x.metrics, x.outbox) < batch.len();
        drop(batch); // (it borrows the entries)
        if short {
            // (the connection closes: what is left is failed with the waiting requests)
            ready.demote(waiting, x.reqs);
            c.note_error(WcStatus::GeneralErr);
            return true;
        }
    }
    ready.clear();
    true
}

/// Plans a batch of ready requests, `entries` (at most `post_list`, taken from the
/// connection's [`Ready`]; more follow on this lane at once if `follows`), into `b` for a lane
/// whose send queue is `sq`, as [`plan`] would plan them were they waiting alone: flagged the
/// same (signalled one in `signal_every`, and at the end of the last batch). Each work
/// request's gather list is its entry's. Touches no device.
#[inline(always)]
pub(crate) fn plan_ready<'s, P: Provider>(
    entries: &'s [Entry<P>],
    follows: bool,
    w: &mut Waiting,
    sq: &SendQueue,
    cfg: &WorkerCfg,
    b: &mut Batch<'s, P>,
) {
    debug_assert!(b.is_empty(), "a batch is planned once");
    b.unsignalled_after = sq.unsignalled;
    b.loud = sq.loud;
    let mut rd = sq.rd_outstanding;
    for e in entries {
        let rd_atomic = e.rd_atomic();
        rd += u32::from(rd_atomic);
        let e = &e.wire;
        if !matches!(e.op, SendOp::Read(_)) {
            w.write_epoch = w.write_epoch.wrapping_add(1);
        }
        let sgl = std::slice::from_ref(&e.sge);
        add(b, e.id, e.op, sgl, e.inline, e.quiet, rd_atomic, rd, cfg);
    }
    // (room for what follows was checked: `Ready::fits`)
    finish(b, sq, cfg, follows);
}

/// The one request waiting on a one-lane connection, posted alone as [`plan`] would post it
/// (signalled: it is its batch's last and nothing follows), without planning: the latency
/// path, where each iteration has one request to send. `None` (nothing done) when it needs
/// the planner: a read that may ride on one in flight, or no room on the lane.
#[inline]
fn flush_one<P: Provider>(c: &mut Conn<P>, x: &mut Ctx<'_, P>) -> Option<bool> {
    let w = &mut c.waiting;
    let lane = c.lanes.first_mut()?;
    let k = w.queues.iter().position(|q| !q.is_empty())?;
    let id = w.queues[k].front(x.reqs.slab())?;
    let words = x.reqs.words();
    let r = x.reqs.get_mut(id)?;
    let rd_atomic = r.is_rd_atomic();
    let full = lane.sq.outstanding() >= x.cfg.max_outstanding
        || (rd_atomic && lane.sq.rd_outstanding >= x.cfg.max_rd_atomic);
    if full || (r.kind == OpKind::Read && x.cfg.merge_reads) {
        return None;
    }
    r.lane = 0;
    if r.kind != OpKind::Read {
        w.write_epoch = w.write_epoch.wrapping_add(1);
    }
    let mut wr = single(id, r, words, x.cfg);
    wr.flags = quiet_unless_due(wr.flags, wr.release, &lane.sq, x.cfg);
    w.queues[k].pop(x.reqs.slab());
    w.len = 0;
    // (aging: nothing waits any more)
    w.passed = [0; CLASSES];
    w.most_passed = 0;
    if !post_one(wr, lane, x.reqs, x.metrics, x.outbox) {
        c.note_error(WcStatus::GeneralErr);
    }
    Some(true)
}

/// The class whose head goes next on a lane with `rd_room` reads/atomics to spare, if any.
#[inline(always)]
fn pick_class<P: Provider>(
    w: &Waiting,
    rd_room: bool,
    reqs: &Requests<P>,
    cfg: &WorkerCfg,
) -> Option<usize> {
    let admissible = |k: usize| {
        if rd_room {
            return !w.queues[k].is_empty(); // the common case: no need to look at the request
        }
        let Some(id) = w.queues[k].front(reqs.slab()) else { return false };
        let Some(r) = reqs.get(id) else { return true }; // gone: popped and skipped
        !r.is_rd_atomic()
            || (r.kind == OpKind::Read
                && cfg.merge_reads
                && reqs.reading(&r.merge_key(w.write_epoch)))
    };
    if w.most_passed >= cfg.aging_rounds {
        // The class passed over longest, once it has waited `aging_rounds` flushes, goes first.
        let aged = (0..CLASSES).max_by_key(|&k| w.passed[k]).filter(|&k| admissible(k));
        if aged.is_some() {
            return aged;
        }
    }
    (0..CLASSES).find(|&k| admissible(k))
}

/// Work requests for one lane, to go with one doorbell: planned by [`plan`], given to the
/// device by [`post`] as they are (their gather lists in the worker's [`GatherSpace`]).
pub(crate) struct Batch<'s, P: Provider> {
    pub(crate) wrs: ArrayVec<SendWr<'s, P>, MAX_POST_LIST>,
    /// The gather space the batch's work requests have not taken.
    free: &'s mut [Sge],
    /// Bit `i`: work request `i` is a read or an atomic.
    rd_atomic: u32,
    /// Bit `i`: work request `i` is a quiet send posted inline, whose buffer goes back to the
    /// pool once posted.
    release: u32,
    /// Work requests that ask for a completion.
    signalled: u64,
    /// The lane's unsignalled count once the batch is on the device.
    unsignalled_after: u32,
    /// Whether a loud (not quiet) request is among those unsignalled, once the batch is on
    /// the device (`SendQueue::loud`).
    loud: bool,
}

impl<'s, P: Provider> Batch<'s, P> {
    /// An empty batch whose gather lists go in `space`.
    #[inline(always)]
    pub(crate) fn new(space: &'s mut GatherSpace) -> Self {
        Batch {
            wrs: ArrayVec::new(),
            free: &mut space.0[..],
            rd_atomic: 0,
            release: 0,
            signalled: 0,
            unsignalled_after: 0,
            loud: false,
        }
    }

    /// Work requests in it.
    pub(crate) fn len(&self) -> usize {
        self.wrs.len()
    }

    /// Whether it has none.
    pub(crate) fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }
}

/// Plans one batch (into `b`) on lane `l` (of `lanes`) whose send queue is `sq`: takes waiting requests
/// by class within the lane's room (`max_outstanding`, `max_rd_atomic`, `post_list`), lets
/// identical reads ride on one in flight and coalesces adjacent writes, and decides each work
/// request's flags (signalled, inline). Touches no device.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn plan<P: Provider>(
    w: &mut Waiting,
    sq: &SendQueue,
    lanes: usize,
    l: usize,
    reqs: &mut Requests<P>,
    cfg: &WorkerCfg,
    metrics: &mut Metrics,
    served: &mut [bool; CLASSES],
    b: &mut Batch<'_, P>,
) {
    debug_assert!(b.is_empty(), "a batch is planned once");
    b.unsignalled_after = sq.unsignalled; // counted on as requests are staged
    b.loud = sq.loud;
    let room = cfg.max_outstanding.saturating_sub(sq.outstanding()) as usize;
    let limit = room.min(cfg.post_list);
    let mut rd = sq.rd_outstanding;
    while b.wrs.len() < limit && w.len > 0 {
        let rd_room = rd < cfg.max_rd_atomic;
        let Some(k) = pick_class(w, rd_room, reqs, cfg) else { break };
        served[k] = true;
        // Class `k` stays the one to serve while it has requests and reads and atomics have
        // room (queues only shrink during a flush, so no class above it fills up): take its
        // requests without choosing again. Without that room, each head is admitted alone.
        while stage(w, k, l, reqs, cfg, metrics, b, &mut rd) {
            if b.wrs.len() >= limit || !rd_room || rd >= cfg.max_rd_atomic {
                break;
            }
        }
    }
    let n = b.wrs.len();
    let room_after = cfg.max_outstanding.saturating_sub(sq.outstanding() + n as u32);
    let follows = lanes == 1 && n == cfg.post_list && room_after > 0 && w.len > 0;
    finish(b, sq, cfg, follows);
}

/// Ends batch `b` for a lane whose send queue is `sq`: its last request is signalled too
/// unless another batch `follows` on this lane at once, or every unsignalled request before it
/// is quiet and the lane keeps room for a later signalled one (one in `signal_every`, and a
/// read or atomic that fills `max_rd_atomic`, were signalled as they were added).
#[inline(always)]
fn finish<P: Provider>(b: &mut Batch<'_, P>, sq: &SendQueue, cfg: &WorkerCfg, follows: bool) {
    let n = b.wrs.len();
    let room_after = cfg.max_outstanding.saturating_sub(sq.outstanding() + n as u32);
    let mut unsignalled = b.unsignalled_after;
    let quiet_tail = !b.loud && room_after > 0;
    if let (Some(last), false, false) = (b.wrs.last_mut(), follows, quiet_tail) {
        if !last.flags.contains(SendFlags::SIGNALED) {
            last.flags |= SendFlags::SIGNALED;
            b.signalled += 1;
            unsignalled = 0;
            b.loud = false;
        }
    }
    b.unsignalled_after = unsignalled;
}

/// Adds request `id`'s work request (`op` on `sgl`) to batch `b`, with its flags: inline if
/// `inline`; signalled one in `signal_every`, and when this read or atomic fills
/// `max_rd_atomic` (`rd` counts it: its completion makes room).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn add<'s, P: Provider>(
    b: &mut Batch<'s, P>,
    id: ReqId,
    op: SendOp<'static, P>,
    sgl: &'s [Sge],
    inline: bool,
    quiet: bool,
    rd_atomic: bool,
    rd: u32,
    cfg: &WorkerCfg,
) {
    let mut flags = SendFlags::empty();
    if inline {
        flags |= SendFlags::INLINE;
    }
    b.unsignalled_after += 1;
    if b.unsignalled_after >= cfg.signal_every || (rd_atomic && rd >= cfg.max_rd_atomic) {
        flags |= SendFlags::SIGNALED;
        b.signalled += 1;
        b.unsignalled_after = 0;
        b.loud = false;
    } else if !quiet || !inline {
        b.loud = true; // (a quiet send not inline holds its buffer: it asks like any)
    }
    let i = b.wrs.len();
    b.rd_atomic |= u32::from(rd_atomic) << i;
    b.release |= u32::from(quiet && inline) << i;
    b.wrs.push(SendWr { wr_id: WrId::Req(id).encode(), op, sgl, flags, ud: None });
}

/// Stages request `id` (just taken from class `k`) for lane `l`: it rides on an identical read
/// in flight, or becomes a work request (with the writes it coalesces). False when class `k`
/// had none.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn stage<'s, P: Provider>(
    w: &mut Waiting,
    k: usize,
    l: usize,
    reqs: &mut Requests<P>,
    cfg: &WorkerCfg,
    metrics: &mut Metrics,
    b: &mut Batch<'s, P>,
    rd: &mut u32,
) -> bool {
    // (one visit of its slot: out of the queue, and its record)
    let words = reqs.words();
    let Some((id, r)) = w.queues[k].pop_mut(reqs.slab_mut()) else { return false };
    w.len -= 1;
    let key = (r.kind == OpKind::Read && cfg.merge_reads).then(|| r.merge_key(w.write_epoch));
    let r = match key {
        None => r,
        Some(key) => {
            if reqs.ride_or_register(key, id) {
                metrics.merged_reads += 1;
                return true;
            }
            let Some(r) = reqs.get_mut(id) else { return true };
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
    let quiet = r.quiet;
    if r.kind != OpKind::Read {
        w.write_epoch = w.write_epoch.wrapping_add(1);
    }
    let coalesce = cfg.coalesce_writes && r.kind == OpKind::Write && r.imm.is_none();
    // (the space holds a full batch's lists: a request planned has room for its entries)
    let free = std::mem::take(&mut b.free);
    free[0] = sge_of(id, r, words);
    let mut bytes = free[0].length;
    let mut n = 1;
    if coalesce {
        n = coalesce_after(w, k, id, reqs, cfg, metrics, free);
        bytes = free[..n].iter().map(|s| s.length).sum();
    }
    let (sgl, rest) = free.split_at_mut(n);
    b.free = rest;
    let inline = may_inline && bytes <= cfg.max_inline;
    add(b, id, op, sgl, inline, quiet, rd_atomic, *rd, cfg);
    true
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

/// The scatter/gather entry of request `id` (record `r`): its buffer's, or an atomic's word
/// (`words`).
pub(crate) fn sge_of<P: Provider>(id: ReqId, r: &Req<P>, words: WordsAt) -> Sge {
    if matches!(r.kind, OpKind::FetchAdd | OpKind::CompareSwap) {
        return words.sge(id);
    }
    // (a request waiting to be posted holds its buffer)
    let Some(buf) = &r.buf else { return Sge { addr: 0, length: 0, lkey: 0 } };
    buf.sge(false)
}

/// Takes the writes queued right behind write `id` in class `k` that continue its remote range
/// (same key, no immediate, within `coalesce_max_bytes` and the gather list), chaining them to
/// it; their entries follow its own (`sges[0]`) in `sges`. Returns the entries in all.
fn coalesce_after<P: Provider>(
    w: &mut Waiting,
    k: usize,
    id: ReqId,
    reqs: &mut Requests<P>,
    cfg: &WorkerCfg,
    metrics: &mut Metrics,
    sges: &mut [Sge],
) -> usize {
    let Some(head) = reqs.get(id) else { return 1 };
    let (rkey, mut end, mut total) =
        (head.remote.rkey, head.remote.addr + head.len as u64, head.len);
    let mut tail = id;
    let mut n = 1;
    while n < MAX_SGE && n < sges.len() {
        let Some(next) = w.queues[k].front(reqs.slab()) else { break };
        let Some(r) = reqs.get(next) else { break };
        let fits = r.kind == OpKind::Write
            && r.imm.is_none()
            && r.remote.rkey == rkey
            && r.remote.addr == end
            && total + r.len <= cfg.coalesce_max;
        if !fits {
            break;
        }
        sges[n] = sge_of(next, r, reqs.words());
        end += r.len as u64;
        total += r.len;
        w.queues[k].pop(reqs.slab());
        w.len -= 1;
        if let Some(t) = reqs.get_mut(tail) {
            t.next = Some(next);
        }
        tail = next;
        n += 1;
        metrics.coalesced_writes += 1;
    }
    n
}

/// A request posted alone (the flat path, and one request waiting on a one-lane connection):
/// its work request, signalled, inline when it fits, with its gather entry.
pub(crate) struct Single<P: Provider> {
    id: ReqId,
    op: SendOp<'static, P>,
    sge: Sge,
    flags: SendFlags,
    rd_atomic: bool,
    /// A quiet send posted inline: its buffer goes back to the pool once posted.
    release: bool,
}

/// The flags of a request posted alone on a lane whose send queue is `sq`: a quiet request
/// posted inline (`release`) asks for no completion unless one is due (or it fills the lane:
/// a completion must come to make room again).
#[inline(always)]
fn quiet_unless_due(flags: SendFlags, release: bool, sq: &SendQueue, cfg: &WorkerCfg) -> SendFlags {
    if release
        && !sq.loud
        && sq.unsignalled + 1 < cfg.signal_every
        && sq.outstanding() + 1 < cfg.max_outstanding
    {
        return flags - SendFlags::SIGNALED;
    }
    flags
}

/// The work request of request `id` (record `r`) posted alone.
#[inline(always)]
pub(crate) fn single<P: Provider>(
    id: ReqId,
    r: &Req<P>,
    words: WordsAt,
    cfg: &WorkerCfg,
) -> Single<P> {
    let sge = sge_of(id, r, words);
    let inline = matches!(r.kind, OpKind::Send | OpKind::Write) && sge.length <= cfg.max_inline;
    let (flags, release) = lone_flags(inline, r.quiet);
    Single { id, op: send_op(r), sge, flags, rd_atomic: r.is_rd_atomic(), release }
}

/// The flags of a request posted alone (signalled; inline if `inline`), and whether its buffer
/// goes back to the pool at the post (a `quiet` send that went inline).
#[inline(always)]
fn lone_flags(inline: bool, quiet: bool) -> (SendFlags, bool) {
    let flags = if inline { SendFlags::SIGNALED | SendFlags::INLINE } else { SendFlags::SIGNALED };
    (flags, quiet && inline)
}

/// Posts `one` on `lane` with its own doorbell; false when the device refused it (it, and the
/// requests riding on it, fail with `GeneralErr`: the caller closes the connection).
#[inline(always)]
pub(crate) fn post_one<P: Provider>(
    one: Single<P>,
    lane: &mut Lane<P>,
    reqs: &mut Requests<P>,
    metrics: &mut Metrics,
    outbox: &mut Outbox<P>,
) -> bool {
    let sgl = std::slice::from_ref(&one.sge);
    let wr =
        SendWr { wr_id: WrId::Req(one.id).encode(), op: one.op, sgl, flags: one.flags, ud: None };
    post_wr(&wr, one.id, one.rd_atomic, one.release, lane, reqs, metrics, outbox)
}

/// Posts `wr`, request `id`'s work request (a read or atomic if `rd_atomic`; a quiet send
/// whose buffer goes back to the pool once posted if `release`), on `lane` with its own
/// doorbell: [`post_one`]'s work.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn post_wr<P: Provider>(
    wr: &SendWr<'_, P>,
    id: ReqId,
    rd_atomic: bool,
    release: bool,
    lane: &mut Lane<P>,
    reqs: &mut Requests<P>,
    metrics: &mut Metrics,
    outbox: &mut Outbox<P>,
) -> bool {
    // SAFETY: as in `post`: the buffer is held by its request in the slab until the request's
    // completion is dispatched.
    if unsafe { lane.qp.post_send(std::slice::from_ref(wr)) }.is_err() {
        metrics.doorbells += 1;
        fail_chain(reqs, id, WcStatus::GeneralErr, outbox);
        return false;
    }
    if !lane.sq.posted.push(id) {
        metrics.invariant_misses += 1; // (never: the caller checked the lane's room)
    }
    if release {
        self::release(reqs, id);
    }
    lane.sq.rd_outstanding += u32::from(rd_atomic);
    if wr.flags.contains(SendFlags::SIGNALED) {
        lane.sq.unsignalled = 0;
        lane.sq.loud = false;
        metrics.signalled += 1;
    } else {
        lane.sq.unsignalled += 1; // (a quiet one: `loud` stays as it was, false)
    }
    metrics.posted += 1;
    metrics.doorbells += 1;
    true
}

/// Posts `batch` on `lane` with one doorbell; returns how many work requests the device took
/// (the rest, and the requests riding on them, fail with `GeneralErr`: the caller closes the
/// connection).
#[inline(always)]
pub(crate) fn post<P: Provider>(
    batch: &Batch<'_, P>,
    lane: &mut Lane<P>,
    reqs: &mut Requests<P>,
    metrics: &mut Metrics,
    outbox: &mut Outbox<P>,
) -> usize {
    // SAFETY: every buffer a work request names is held by its request in the slab (not by the
    // application) until the request's completion is dispatched.
    let res = unsafe { lane.qp.post_send(&batch.wrs) };
    let k = match res {
        Ok(()) => batch.wrs.len(),
        Err(VerbsError::PostSend { index, .. }) => index,
        Err(_) => 0,
    };
    for wr in &batch.wrs[..k] {
        if !lane.sq.posted.push(WrId::req_of(wr.wr_id)) {
            metrics.invariant_misses += 1; // (never: a batch fits the lane's room)
        }
    }
    // (the per-request bits of those taken, counted or acted on once for the batch)
    let taken = u32::MAX.checked_shr(32 - k as u32).unwrap_or(0);
    lane.sq.rd_outstanding += (batch.rd_atomic & taken).count_ones();
    let mut release_bits = batch.release & taken;
    while release_bits != 0 {
        let i = release_bits.trailing_zeros() as usize;
        release_bits &= release_bits - 1;
        release(reqs, WrId::req_of(batch.wrs[i].wr_id));
    }
    let signalled = if k == batch.wrs.len() {
        batch.signalled
    } else {
        let asked = |wr: &&SendWr<'_, P>| wr.flags.contains(SendFlags::SIGNALED);
        batch.wrs[..k].iter().filter(asked).count() as u64
    };
    lane.sq.unsignalled = batch.unsignalled_after;
    lane.sq.loud = batch.loud;
    metrics.posted += k as u64;
    metrics.signalled += signalled;
    metrics.doorbells += 1;
    for wr in &batch.wrs[k..] {
        fail_chain(reqs, WrId::req_of(wr.wr_id), WcStatus::GeneralErr, outbox);
    }
    k
}

/// The buffer of quiet send `id`, just posted inline, goes back to the pool: the device copied
/// its bytes at the post, and a quiet request's success gives nothing back (so that quiet
/// requests that asked for no completion hold no buffers, however many connections have them).
#[inline(always)]
fn release<P: Provider>(reqs: &mut Requests<P>, id: ReqId) {
    if let Some(r) = reqs.get_mut(id) {
        r.buf = None;
    }
}

/// Fails request `id`, whose post failed, and every request riding on it, telling each issuer.
#[cold]
fn fail_chain<P: Provider>(
    reqs: &mut Requests<P>,
    id: ReqId,
    status: WcStatus,
    outbox: &mut Outbox<P>,
) {
    reqs.take_chain(id, |n, r, data| {
        if let Some(n) = Notice::failed(n, r, status, data, None) {
            outbox.notify(n);
        }
    });
}

/// The scheduler's plan, on its own: no QP, no device (a soft PD registers the buffers).
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::handoff::Origin;
    use crate::pool::Pool;
    use crate::request::ConnId;
    use corelink_verbs::soft::Soft;
    use corelink_verbs::{Context, RemoteAddr};

    struct Bed {
        pool: Pool<Soft>,
        reqs: Requests<Soft>,
        w: Waiting,
        sq: SendQueue,
        cfg: WorkerCfg,
        metrics: Metrics,
    }

    impl Bed {
        fn new(map: &str) -> Bed {
            let res = corelink_config::parse(map).unwrap().worker;
            let ctx = Soft::open("soft0").unwrap();
            let pd = ctx.alloc_pd().unwrap();
            Bed {
                pool: Pool::new(&pd, &[(64, 256)]).unwrap(),
                reqs: Requests::new(&pd, 1024, 64).unwrap(),
                w: Waiting::default(),
                sq: SendQueue::new(WorkerCfg::from_map(&res, 32).max_outstanding),
                cfg: WorkerCfg::from_map(&res, 32),
                metrics: Metrics::default(),
            }
        }

        /// Queues a request of `kind` at remote `addr` in the kind's default class.
        fn queue(&mut self, kind: OpKind, addr: u64, len: usize) -> ReqId {
            let mut buf = self.pool.get(len).unwrap();
            buf.set_len(len).unwrap();
            let r = Req {
                conn: ConnId { worker: 0, slot: 0, generation: 1 },
                lane: 0,
                kind,
                buf: Some(buf),
                remote: RemoteAddr { addr, rkey: 9 },
                len: len as u32,
                imm: None,
                arg: 0,
                swap: 0,
                token: addr,
                origin: Origin::Handler,
                next: None,
                merge_epoch: None,
                quiet: false,
            };
            let id = self.reqs.insert_from((), r, |r| r).map_err(|_| ()).unwrap();
            let k = usize::from(self.cfg.classes[kind.index()]);
            self.w.queues[k].push(self.reqs.slab_mut(), id);
            self.w.len += 1;
            id
        }

        fn plan<'s>(&mut self, space: &'s mut GatherSpace) -> Batch<'s, Soft> {
            let mut served = [false; CLASSES];
            let (w, sq, reqs, cfg, m) =
                (&mut self.w, &self.sq, &mut self.reqs, &self.cfg, &mut self.metrics);
            let mut b = Batch::new(space);
            plan(w, sq, 1, 0, reqs, cfg, m, &mut served, &mut b);
            b
        }

        /// The batch's requests as (kind, remote address, signalled).
        fn seen(&self, b: &Batch<'_, Soft>) -> Vec<(OpKind, u64, bool)> {
            b.wrs
                .iter()
                .map(|wr| {
                    let r = self.reqs.get(WrId::req_of(wr.wr_id)).unwrap();
                    (r.kind, r.remote.addr, wr.flags.contains(SendFlags::SIGNALED))
                })
                .collect()
        }
    }

    use OpKind::{Read, Send, Write};

    #[test]
    fn reads_go_first_and_a_batch_holds_post_list_requests() {
        let mut b = Bed::new("[worker.batching]\npost_list = 4");
        for a in [1, 2, 3] {
            b.queue(Write, a, 8);
        }
        for a in [11, 12, 13] {
            b.queue(Read, a, 8);
        }
        let mut space = GatherSpace::new();
        let batch = b.plan(&mut space);
        // Another batch follows at once: the last one is not signalled (one in 16 is).
        let want = [(Read, 11, false), (Read, 12, false), (Read, 13, false), (Write, 1, false)];
        assert_eq!(b.seen(&batch), want);
        assert_eq!(b.w.len, 2);
        let mut space = GatherSpace::new();
        let batch = b.plan(&mut space);
        assert_eq!(b.seen(&batch), [(Write, 2, false), (Write, 3, true)], "the run's last asks");
        assert_eq!(b.w.len, 0);
        // Small sends and writes go inline; reads never do.
        assert!(batch.wrs.iter().all(|wr| wr.flags.contains(SendFlags::INLINE)));
    }

    #[test]
    fn a_full_send_queue_holds_requests_back() {
        let mut b = Bed::new("[worker]\nsend_queue_depth = 4\n[worker.batching]\nsignal_every = 4");
        // Three requests already on the device: room for one.
        for a in [100, 101, 102] {
            let id = b.queue(Write, a, 8);
            b.w.queues[2].pop(b.reqs.slab());
            b.w.len -= 1;
            b.sq.posted.push(id);
        }
        for a in [1, 2] {
            b.queue(Write, a, 8);
        }
        let mut space = GatherSpace::new();
        let batch = b.plan(&mut space);
        assert_eq!(b.seen(&batch), [(Write, 1, true)]);
        assert_eq!(b.w.len, 1, "the other waits");
    }

    #[test]
    fn reads_and_atomics_stop_at_max_rd_atomic_and_the_one_that_fills_it_asks() {
        let mut b = Bed::new("[worker.scheduler]\nmax_rd_atomic = 2\nmerge_reads = false");
        for a in [1, 2, 3, 4] {
            b.queue(Read, a, 8);
        }
        b.queue(Write, 50, 8);
        let mut space = GatherSpace::new();
        let batch = b.plan(&mut space);
        // Two reads fill max_rd_atomic; the write (another class) still goes.
        assert_eq!(b.seen(&batch), [(Read, 1, false), (Read, 2, true), (Write, 50, true)]);
        assert_eq!(b.w.len, 2);
    }

    #[test]
    fn an_identical_read_rides_on_the_one_in_flight() {
        let mut b = Bed::new("");
        let first = b.queue(Read, 7, 8);
        let second = b.queue(Read, 7, 8);
        let other = b.queue(Read, 8, 8);
        let mut space = GatherSpace::new();
        let batch = b.plan(&mut space);
        assert_eq!(b.seen(&batch), [(Read, 7, false), (Read, 8, true)]);
        assert_eq!(b.metrics.merged_reads, 1);
        assert_eq!(b.reqs.get(first).unwrap().next, Some(second));
        assert_eq!(b.reqs.get(other).unwrap().next, None);
    }

    #[test]
    fn adjacent_writes_go_as_one_gathered_write() {
        let mut b = Bed::new("[worker.scheduler]\ncoalesce_writes = true");
        let a = b.queue(Write, 0, 16);
        let c = b.queue(Write, 16, 16);
        b.queue(Write, 32, 16);
        b.queue(Write, 100, 16); // not adjacent
        let mut space = GatherSpace::new();
        let batch = b.plan(&mut space);
        assert_eq!(b.seen(&batch), [(Write, 0, false), (Write, 100, true)]);
        assert_eq!(batch.wrs[0].sgl.len(), 3);
        assert_eq!(batch.wrs[0].sgl.iter().map(|s| s.length).sum::<u32>(), 48);
        assert_eq!(b.metrics.coalesced_writes, 2);
        assert_eq!(b.reqs.get(a).unwrap().next, Some(c));
    }

    #[test]
    fn one_in_signal_every_asks_for_a_completion() {
        let mut b = Bed::new("[worker.batching]\nsignal_every = 2\npost_list = 8");
        for a in 1..=5 {
            b.queue(Write, a, 8);
        }
        let mut space = GatherSpace::new();
        let batch = b.plan(&mut space);
        let signalled: Vec<bool> = b.seen(&batch).iter().map(|s| s.2).collect();
        assert_eq!(signalled, [false, true, false, true, true]);
        assert_eq!(batch.unsignalled_after, 0);
    }

    #[test]
    fn quiet_requests_ask_for_no_completion_unless_one_is_due() {
        let mut b = Bed::new("[worker.batching]\nsignal_every = 4\npost_list = 8");
        let quiet = |b: &mut Bed, a| {
            let id = b.queue(Send, a, 8);
            b.reqs.get_mut(id).unwrap().quiet = true;
        };
        // Quiet alone: the batch's last asks for nothing, one in `signal_every` still does.
        for a in 1..=5 {
            quiet(&mut b, a);
        }
        let mut space = GatherSpace::new();
        let batch = b.plan(&mut space);
        let signalled: Vec<bool> = b.seen(&batch).iter().map(|s| s.2).collect();
        assert_eq!(signalled, [false, false, false, true, false]);
        assert_eq!((batch.unsignalled_after, batch.loud), (1, false), "a quiet tail");
        // A loud request among quiet ones: the batch's last asks, for the loud one's sake.
        let mut b2 = Bed::new("[worker.batching]\nsignal_every = 4\npost_list = 8");
        b2.queue(Send, 1, 8);
        quiet(&mut b2, 2);
        let mut space = GatherSpace::new();
        let batch = b2.plan(&mut space);
        let signalled: Vec<bool> = b2.seen(&batch).iter().map(|s| s.2).collect();
        assert_eq!(signalled, [false, true]);
        assert_eq!((batch.unsignalled_after, batch.loud), (0, false));
        // A lane whose last batch left a loud request unsignalled (another followed at once):
        // the next batch's quiet last asks too.
        let mut b3 = Bed::new("[worker.batching]\nsignal_every = 4\npost_list = 8");
        b3.sq.loud = true;
        b3.sq.unsignalled = 1;
        quiet(&mut b3, 1);
        let mut space = GatherSpace::new();
        let batch = b3.plan(&mut space);
        assert!(b3.seen(&batch)[0].2, "signalled");
        // A quiet batch that fills the lane (`max_outstanding`) asks: a completion must come
        // to make room again.
        let mut b4 = Bed::new(
            "[worker.batching]\nsignal_every = 16\npost_list = 8\n\
             [worker.scheduler]\nmax_outstanding = 3",
        );
        for a in 1..=3 {
            quiet(&mut b4, a);
        }
        let mut space = GatherSpace::new();
        let batch = b4.plan(&mut space);
        let signalled: Vec<bool> = b4.seen(&batch).iter().map(|s| s.2).collect();
        assert_eq!(signalled, [false, false, true]);
    }

    /// `n` writes of 8 bytes made ready (as `Cx` makes them), in class 2.
    fn ready_writes(b: &mut Bed, n: u64) -> crate::worker::ready::Ready<Soft> {
        let mut ready = crate::worker::ready::Ready::new(b.cfg.max_outstanding);
        for a in 0..n {
            assert!(ready.admits(2, false, b.w.len, &b.sq, &b.cfg), "write {a} is admitted");
            let id = b.queue(Write, a, 8);
            b.w.queues[2].pop(b.reqs.slab());
            b.w.len -= 1;
            let r = b.reqs.get(id).unwrap();
            let sge = sge_of(id, r, b.reqs.words());
            let wire = Wire { id, op: send_op(r), sge, inline: true, quiet: false };
            let e = Entry::new(wire);
            ready.push(2, e);
        }
        ready
    }

    /// A batch's work requests as (remote address, flags).
    fn wrs(b: &Bed, batch: &Batch<'_, Soft>) -> Vec<(u64, SendFlags)> {
        batch
            .wrs
            .iter()
            .map(|wr| (b.reqs.get(WrId::req_of(wr.wr_id)).unwrap().remote.addr, wr.flags))
            .collect()
    }

    #[test]
    fn ready_requests_go_in_the_batches_and_with_the_flags_of_the_plan() {
        let map = "[worker.batching]\npost_list = 8\nsignal_every = 4";
        // The plan of 20 queued writes, batch by batch (nothing posted in between).
        let mut planned = Bed::new(map);
        for a in 0..20 {
            planned.queue(Write, a, 8);
        }
        let mut want = Vec::new();
        while planned.w.len > 0 {
            let mut space = GatherSpace::new();
            let batch = planned.plan(&mut space);
            want.push(wrs(&planned, &batch));
        }
        // The same writes made ready as they were submitted.
        let mut b = Bed::new(map);
        let mut ready = ready_writes(&mut b, 20);
        let mut got = Vec::new();
        while !ready.is_empty() {
            let mut space = GatherSpace::new();
            let mut batch = Batch::new(&mut space);
            let follows = ready.len() > b.cfg.post_list;
            plan_ready(ready.batch(b.cfg.post_list), follows, &mut b.w, &b.sq, &b.cfg, &mut batch);
            assert!(batch.wrs.iter().all(|wr| wr.sgl.len() == 1 && wr.sgl[0].length == 8));
            got.push(wrs(&b, &batch));
        }
        ready.clear();
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), [8, 8, 4]);
        assert_eq!(got, want);
        assert_eq!(b.w.write_epoch, 20, "each write moves the epoch, as planned ones do");
    }

    #[test]
    fn ready_requests_wait_behind_nothing_and_go_back_in_order() {
        let mut b = Bed::new("[worker]\nsend_queue_depth = 4");
        let mut ready = ready_writes(&mut b, 3);
        // The lane has room for one more; a read or another class may not join.
        assert!(ready.admits(2, false, 0, &b.sq, &b.cfg));
        assert!(!ready.admits(0, true, 0, &b.sq, &b.cfg), "another class");
        assert!(!ready.admits(2, false, 1, &b.sq, &b.cfg), "something waits");
        b.sq.posted.push(ReqId::from_raw(1 << 40));
        assert!(!ready.admits(2, false, 0, &b.sq, &b.cfg), "the lane is full");
        assert!(ready.fits(&b.sq, &b.cfg));
        b.sq.posted.push(ReqId::from_raw(2 << 40));
        assert!(!ready.fits(&b.sq, &b.cfg), "the room shrank since");
        // A write queued behind them: they go back in front of it, in order.
        b.queue(Write, 50, 8);
        ready.demote(&mut b.w, &mut b.reqs);
        assert!(ready.is_empty());
        assert_eq!(b.w.len, 4);
        let order: Vec<u64> = std::iter::from_fn(|| b.w.queues[2].pop(b.reqs.slab()))
            .map(|id| b.reqs.get(id).unwrap().remote.addr)
            .collect();
        assert_eq!(order, [0, 1, 2, 50]);
    }

    #[test]
    fn a_class_passed_over_long_enough_goes_first() {
        let mut b = Bed::new("[worker.scheduler]\naging_rounds = 2");
        b.queue(Write, 1, 8);
        b.queue(Read, 2, 8);
        b.w.passed[2] = 2; // writes were passed over twice
        b.w.most_passed = 2;
        let mut space = GatherSpace::new();
        let batch = b.plan(&mut space);
        assert_eq!(b.seen(&batch)[0], (Write, 1, false));
    }
}
