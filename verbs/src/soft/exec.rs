//! The data path of `soft`: executing admitted send requests against the target's registered
//! memory, as the NIC of both sides would. Admission is in [`super::req`].
//!
//! A request runs straight from the caller's work request (its SGEs read in place); the key
//! table stays read-locked across a batch (see [`Keys`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arrayvec::ArrayVec;

use super::fabric::{Fabric, KeyEntry, KeyTable, Keys};
use super::faults::{Drawn, Fate};
use super::limits::MAX_SGE;
use super::port::PeerLink;
use super::qp::{QpShared, RecvEntry, SendQueue};
use super::req::{admit, Head, Op};
use super::Soft;
use crate::error::{Error, Result};
use crate::types::*;
use crate::wr::SendWr;

/// What executing a request came to.
#[derive(Clone)]
pub(crate) enum Step {
    /// Finished with this status and byte count.
    Done(WcStatus, u32),
    /// The receiver had no receive posted: try again after this wait.
    Rnr(Duration),
    /// A fault plan's delay: run it again (once, without another delay) after this wait.
    Later(Duration),
    /// On its way to a QP of another process: its end is [`answered`] when the ticket says
    /// the answer came (`soft::port`).
    Waiting(std::sync::Arc<super::port::Ticket>),
}

/// Posts a batch of send requests.
///
/// # Safety
/// As [`crate::Qp::post_send`]; in particular inline SGEs' `addr..addr+length` are readable.
pub(crate) unsafe fn post_send(qp: &QpShared, wrs: &[SendWr<'_, Soft>]) -> Result<()> {
    let mut sq = qp.sq();
    let mut keys = Fabric::get().keys_lazy();
    for (index, wr) in wrs.iter().enumerate() {
        let fail = |source| Error::PostSend { qpn: qp.qpn, index, source };
        let head = admit(qp, wr).map_err(fail)?;
        // SAFETY: forwarded from this function's contract (inline SGEs are readable; the other
        // buffers stay valid until completion).
        unsafe { qp.submit(&mut sq, head, wr.sgl, &mut keys) }.map_err(fail)?;
    }
    Ok(())
}

/// Local buffers resolved to pointers.
type Segs = ArrayVec<(*mut u8, usize), MAX_SGE>;

/// Resolves a local gather/scatter list into `out` (zero-length entries are skipped): the
/// common single entry here, longer lists out of line (inlined, the loop bounded by
/// `MAX_SGE` is unrolled into far more code than one entry needs).
#[inline]
fn resolve_local(
    keys: &KeyTable,
    sges: &[Sge],
    write: bool,
    pd: u64,
    out: &mut Segs,
) -> Result<(), WcStatus> {
    match sges {
        [] => Ok(()),
        [s] if s.length == 0 => Ok(()),
        [s] => {
            let p = keys.local(s.lkey, s.addr, s.length, write, pd)?;
            out.try_push((p, s.length as usize)).map_err(|_| WcStatus::LocLenErr)
        }
        _ => resolve_many(keys, sges, write, pd, out),
    }
}

/// [`resolve_local`] for lists of two entries or more.
#[inline(never)]
fn resolve_many(
    keys: &KeyTable,
    sges: &[Sge],
    write: bool,
    pd: u64,
    out: &mut Segs,
) -> Result<(), WcStatus> {
    for s in sges.iter().filter(|s| s.length > 0) {
        let p = keys.local(s.lkey, s.addr, s.length, write, pd)?;
        // The lists are bounded by max_send_sge/max_recv_sge <= MAX_SGE.
        out.try_push((p, s.length as usize)).map_err(|_| WcStatus::LocLenErr)?;
    }
    Ok(())
}

/// The segments of an inline payload: its SGEs' own addresses (no key is checked).
#[inline]
fn inline_segs(sges: &[Sge], out: &mut Segs) -> Result<(), WcStatus> {
    if let [s] = sges {
        if s.length > 0 {
            out.try_push((s.addr as *mut u8, s.length as usize))
                .map_err(|_| WcStatus::LocLenErr)?;
        }
        return Ok(());
    }
    inline_many(sges, out)
}

/// [`inline_segs`] for lists of any other length.
#[inline(never)]
fn inline_many(sges: &[Sge], out: &mut Segs) -> Result<(), WcStatus> {
    for s in sges.iter().filter(|s| s.length > 0) {
        // At most max_send_sge <= MAX_SGE entries (admission).
        out.try_push((s.addr as *mut u8, s.length as usize)).map_err(|_| WcStatus::LocLenErr)?;
    }
    Ok(())
}

/// Copies the bytes of `src` (a gather list) into `dst` (a scatter list) in order, skipping
/// `skip` bytes of `dst` first, for `len` bytes.
///
/// # Safety
/// Every segment must be valid for its length (resolved from live regions).
#[inline]
unsafe fn copy_segs(src: &[(*mut u8, usize)], dst: &[(*mut u8, usize)], skip: usize, len: usize) {
    if len == 0 {
        return; // zero-length accesses resolve no pointer (it may be null)
    }
    if let ([(s, slen)], [(d, dlen)], 0) = (src, dst, skip) {
        let n = len.min(*slen).min(*dlen);
        if (8..=16).contains(&n) {
            // SAFETY: as below; both words are read before either is written (so overlap is
            // fine), and they cover bytes 0..8 and n-8..n, within both ranges.
            unsafe { copy_small(*s, *d, n) };
            return;
        }
        // SAFETY: both ranges lie within their segments; they may overlap when a QP targets
        // its own memory, hence `copy` (memmove).
        unsafe { std::ptr::copy(*s, *d, n) };
        return;
    }
    // SAFETY: forwarded from this function's contract.
    unsafe { copy_many(src, dst, skip, len) }
}

/// Copies `n` (8 to 16) bytes from `s` to `d` as two possibly overlapping words, without a
/// call (a small RDMA write's payload; `memmove` costs a call and a size dispatch).
///
/// # Safety
/// `s..s+n` readable, `d..d+n` writable (they may overlap).
#[inline(always)]
unsafe fn copy_small(s: *const u8, d: *mut u8, n: usize) {
    debug_assert!((8..=16).contains(&n));
    // SAFETY: 8 <= n, so both words lie within the ranges (the caller's contract); both are
    // read before anything is written.
    unsafe {
        let head = std::ptr::read_unaligned(s as *const u64);
        let tail = std::ptr::read_unaligned(s.add(n - 8) as *const u64);
        std::ptr::write_unaligned(d as *mut u64, head);
        std::ptr::write_unaligned(d.add(n - 8) as *mut u64, tail);
    }
}

/// [`copy_segs`] for anything but one segment on each side.
///
/// # Safety
/// As [`copy_segs`].
#[inline(never)]
unsafe fn copy_many(
    src: &[(*mut u8, usize)],
    dst: &[(*mut u8, usize)],
    mut skip: usize,
    len: usize,
) {
    let (mut si, mut so) = (0usize, 0usize);
    let mut left = len;
    for &(d, dlen) in dst {
        if left == 0 {
            break;
        }
        if skip >= dlen {
            skip -= dlen;
            continue;
        }
        let mut doff = skip;
        skip = 0;
        while doff < dlen && left > 0 && si < src.len() {
            let (s, slen) = src[si];
            let n = (dlen - doff).min(slen - so).min(left);
            // SAFETY: both ranges lie within their segments (bounded by dlen, slen); they may
            // overlap when a QP targets its own memory, hence `copy` (memmove).
            unsafe { std::ptr::copy(s.add(so), d.add(doff), n) };
            doff += n;
            so += n;
            left -= n;
            if so == slen {
                si += 1;
                so = 0;
            }
        }
    }
}

/// Whether a transport carries an operation.
fn transport_allows(t: QpType, op: &Op) -> bool {
    match op {
        Op::Send(_) => true,
        Op::Write(..) | Op::BindMw { .. } => t != QpType::Ud,
        Op::Read(_) | Op::CompSwap(..) | Op::FetchAdd(..) | Op::LocalInv(_) | Op::SendInv(_) => {
            t == QpType::Rc
        }
    }
}

/// Runs one request (`d`, whose gather/scatter list is `sges`). The requester's QP is `qp`
/// (whose send queue `sq` the caller holds).
///
/// The order of the checks is rxe's: the requester's local gather list; the responder's QP
/// (state, then the remote rights of the QP); for messages that consume a receive, the receive
/// (RNR on RC when there is none); the rkey; the data; for reads and atomics, the local scatter
/// list when the response arrives.
///
/// `replaying`: it was held before (a fault plan's delay is not drawn again).
///
/// # Safety
/// When `d.inline`, every SGE's `addr..addr+length` must be readable.
#[inline]
pub(crate) unsafe fn execute(
    qp: &QpShared,
    sq: &mut SendQueue,
    d: &Head,
    sges: &[Sge],
    keys: &mut Keys<'_>,
    replaying: bool,
) -> Step {
    if !transport_allows(qp.qp_type, &d.op) {
        return Step::Done(WcStatus::LocQpOpErr, 0);
    }
    match &d.op {
        Op::BindMw { mw, mr, addr, len, access } => {
            keys.release(); // the bind writes the key table
            return match mw.bind(mr, *addr, *len, *access, qp.pd, qp.qpn) {
                Ok(_) => Step::Done(WcStatus::Success, 0),
                Err(st) => Step::Done(st, 0),
            };
        }
        Op::LocalInv(rkey) => {
            let mw = match keys.get().get(*rkey) {
                Some(KeyEntry::Mw(mw)) => Some(mw.clone()),
                _ => None,
            };
            let st = match mw.map(|mw| mw.invalidate(*rkey, qp.pd)) {
                Some(Ok(())) => WcStatus::Success,
                Some(Err(st)) => st,
                None => WcStatus::LocQpOpErr,
            };
            return Step::Done(st, 0);
        }
        _ => {}
    }
    let len = d.len;
    let len32 = len.min(u64::from(u32::MAX)) as u32;
    let reliable = qp.qp_type == QpType::Rc;
    let sent = Step::Done(WcStatus::Success, len32);
    // A target in another process (`soft::port`): the request crosses the link.
    // (one flag on the data path: set when the peer is in another process, or for every UD QP
    // of a process on a named fabric)
    if sq.may_cross() {
        if let Some(far) = far_target(qp, sq, d) {
            // SAFETY: forwarded from this function's contract.
            return unsafe { remote(qp, d, sges, keys, far) };
        }
    }
    let keys = keys.get();
    // The gather list of sends and writes is read before anything goes on the wire.
    let mut src = Segs::new();
    if d.inline {
        if let Err(st) = inline_segs(sges, &mut src) {
            return Step::Done(st, 0);
        }
    } else if let Op::Send(_) | Op::SendInv(_) | Op::Write(..) = d.op {
        if let Err(st) = resolve_local(keys, sges, false, qp.pd, &mut src) {
            return Step::Done(st, 0);
        }
    }
    let ud_target;
    let target: &QpShared = match (qp.qp_type, d.ud) {
        (QpType::Ud, Some((dgid, qpn, qkey))) => {
            // Longer than the MTU: nothing is sent, and the send "succeeds" (IB C10-93.1.1).
            if len > u64::from(qp.mtu.load(Ordering::Relaxed)) {
                return sent;
            }
            match Fabric::get().qp(qpn) {
                Some(t) if t.qp_type == QpType::Ud && t.ctx.gid == dgid && t.receiving() => {
                    if t.qkey() != qkey {
                        t.dropped.fetch_add(1, Ordering::Relaxed);
                        return sent;
                    }
                    ud_target = t;
                    &ud_target
                }
                _ => return sent,
            }
        }
        _ => match sq.peer() {
            Some(t) if t.receiving() && t.qp_type == qp.qp_type => t,
            // Nobody answers: a reliable transport retries until it gives up.
            _ if reliable => return Step::Done(WcStatus::RetryExcErr, 0),
            _ => return sent,
        },
    };
    let r =
        Responder { from_qpn: qp.qpn, from_type: qp.qp_type, target, keys, reliable, len, sent };
    // An injected fault (`soft::faults`: a cut wire, a plan; one branch while there is none).
    if qp.anomalous() {
        if let Some(step) = r.faulted(qp, &d.op, &src, replaying) {
            return step;
        }
    }
    let need = match d.op {
        Op::Write(..) => AccessFlags::REMOTE_WRITE,
        Op::Read(_) => AccessFlags::REMOTE_READ,
        Op::CompSwap(..) | Op::FetchAdd(..) => AccessFlags::REMOTE_ATOMIC,
        _ => AccessFlags::empty(),
    };
    if !target.access().contains(need) {
        return r.class_c(WcStatus::RemInvReqErr);
    }
    match d.op {
        Op::Send(imm) => r.send(&src, imm),
        Op::SendInv(rkey) => r.send_as(&src, None, Some(rkey)),
        Op::Write(remote, imm) => r.write(&src, remote, imm),
        Op::Read(remote) => {
            let p = match r.rkey(remote, len, need) {
                Ok(p) => p,
                Err(st) => return r.class_c(st),
            };
            let mut dst = Segs::new();
            if resolve_local(keys, sges, true, qp.pd, &mut dst).is_err() {
                return Step::Done(WcStatus::LocProtErr, 0);
            }
            // SAFETY: `p` covers `len` bytes of a live region (resolved under the key table's
            // read lock, which deregistration needs for writing); `dst` are live local buffers.
            unsafe { copy_segs(&[(p, len as usize)], &dst, 0, len as usize) };
            r.sent
        }
        Op::CompSwap(remote, ..) | Op::FetchAdd(remote, _) => {
            let p = match r.rkey(remote, 8, need) {
                Ok(p) => p,
                Err(st) => return r.class_c(st),
            };
            // SAFETY: `p` covers 8 bytes of a live region and is 8-byte aligned (the remote
            // address was checked at post, and regions are mapped at their own addresses); the
            // device accesses the word only atomically.
            let word = unsafe { AtomicU64::from_ptr(p.cast()) };
            let old = match d.op {
                Op::CompSwap(_, cmp, swap) => word
                    .compare_exchange(cmp, swap, Ordering::AcqRel, Ordering::Acquire)
                    .unwrap_or_else(|v| v),
                Op::FetchAdd(_, add) => word.fetch_add(add, Ordering::AcqRel),
                _ => 0,
            };
            // The old value comes back in the response; a bad scatter list fails only then.
            let mut dst = Segs::new();
            if resolve_local(keys, sges, true, qp.pd, &mut dst).is_err() {
                return Step::Done(WcStatus::LocProtErr, 0);
            }
            let bytes = old.to_ne_bytes();
            // SAFETY: `dst` are live local buffers with LOCAL_WRITE, 8 bytes or more (checked
            // at post).
            unsafe { copy_segs(&[(bytes.as_ptr().cast_mut(), 8)], &dst, 0, 8) };
            r.sent
        }
        Op::BindMw { .. } | Op::LocalInv(_) => Step::Done(WcStatus::LocQpOpErr, 0),
    }
}

/// Where a request to another process goes.
pub(crate) struct Far {
    /// The link to the target's process (`None`: it cannot be reached).
    link: Option<std::sync::Arc<PeerLink>>,
    qpn: u32,
    /// A UD send's destination GID and qkey.
    ud: Option<(Gid, u32)>,
}

/// The target of `d` when it is in another process of the fabric (`None`: in this one).
#[cold]
#[inline(never)]
fn far_target(qp: &QpShared, sq: &mut SendQueue, d: &Head) -> Option<Far> {
    match (qp.qp_type, d.ud) {
        (QpType::Ud, Some((dgid, qpn, qkey))) => {
            let port = super::port::get()?;
            let pid = super::port::pid_of(&dgid);
            if pid == 0 || pid == port.pid {
                return None;
            }
            Some(Far { link: port.link_to(pid).ok(), qpn, ud: Some((dgid, qkey)) })
        }
        (QpType::Ud, None) => None,
        _ => sq.far().map(|link| Far { link: link.clone(), qpn: sq.peer_qpn, ud: None }),
    }
}

/// Runs `d` against a QP of another process: its request goes over the link and, on RC, the
/// responder's answer comes back (the target's process executes it with [`serve`]).
///
/// # Safety
/// As [`execute`].
#[cold]
unsafe fn remote(qp: &QpShared, d: &Head, sges: &[Sge], keys: &mut Keys<'_>, far: Far) -> Step {
    use super::wire::{Msg, WireOp};
    let reliable = qp.qp_type == QpType::Rc;
    let len = d.len;
    let len32 = len.min(u64::from(u32::MAX)) as u32;
    // (what the requester sees of a message that went out: success, lost unseen or not)
    let sent = Step::Done(WcStatus::Success, len32);
    let lost = || if reliable { Step::Done(WcStatus::RetryExcErr, 0) } else { sent.clone() };
    let Some(link) = far.link else { return lost() };
    if qp.is_cut() {
        return lost();
    }
    if far.ud.is_some() && len > u64::from(qp.mtu.load(Ordering::Relaxed)) {
        return sent; // longer than the MTU: nothing is sent (IB C10-93.1.1)
    }
    let op = match (&d.op, far.ud) {
        (&Op::Send(imm), Some((gid, qkey))) => WireOp::UdSend { gid, qkey, imm },
        (&Op::Send(imm), None) => WireOp::Send(imm),
        (&Op::SendInv(rkey), _) => WireOp::SendInv(rkey),
        (&Op::Write(r, imm), _) => WireOp::Write(r, imm),
        (&Op::Read(r), _) => WireOp::Read(r, len32),
        (&Op::CompSwap(r, cmp, swap), _) => WireOp::CompSwap(r, cmp, swap),
        (&Op::FetchAdd(r, add), _) => WireOp::FetchAdd(r, add),
        (Op::BindMw { .. } | Op::LocalInv(_), _) => return Step::Done(WcStatus::LocQpOpErr, 0),
    };
    if reliable {
        // SAFETY: forwarded from this function's contract.
        if let Some(step) = unsafe { direct(qp, d, sges, keys, &link, far.qpn, op, len) } {
            return step;
        }
    }
    // The gather list of sends and writes, copied into the request's frame.
    let mut src = Segs::new();
    let carried = match op {
        WireOp::Send(_) | WireOp::UdSend { .. } | WireOp::SendInv(_) | WireOp::Write(..) => {
            let resolved = if d.inline {
                inline_segs(sges, &mut src)
            } else {
                resolve_local(keys.get(), sges, false, qp.pd, &mut src)
            };
            if let Err(st) = resolved {
                return Step::Done(st, 0);
            }
            len as usize
        }
        _ => 0,
    };
    let (dst_qpn, src_qpn, src_type) = (far.qpn, qp.qpn, qp.qp_type);
    let frame = |seq| {
        Msg::req_frame(seq, dst_qpn, src_qpn, src_type, &op, carried, |payload| {
            // SAFETY: `src` are live local buffers (or the request's inline payload, readable
            // by this function's contract) of `carried` bytes in all, resolved under the key
            // table's lock, still held; `payload` is the frame's own.
            unsafe { copy_segs(&src, &[(payload.as_mut_ptr(), payload.len())], 0, payload.len()) }
        })
    };
    let seq = if reliable { link.next_seq() } else { 0 };
    let frame = frame(seq);
    // (no lock of this process's key table is held while the request travels or waits)
    keys.release();
    if !reliable {
        link.send_frame(&frame);
        return sent;
    }
    // (a response is its header and a read's or atomic's data)
    let reply_max = 64 + if let WireOp::Read(_, n) = op { n as usize } else { 8 };
    match link.start(seq, &frame, reply_max) {
        Some(ticket) => Step::Waiting(ticket),
        None => lost(),
    }
}

/// How request `d` (on RC, to a QP of another process; its scatter list `sges`) ends, given
/// its responder's answer (`None`: none came: the process died or hangs, and the transport
/// gives up as after its retries).
///
/// # Safety
/// `sges` are the request's own (kept with it), valid until it completes.
pub(crate) unsafe fn answered(
    qp: &QpShared,
    d: &Head,
    sges: &[Sge],
    keys: &mut Keys<'_>,
    answer: Option<super::port::Answer>,
) -> Step {
    use super::wire::Outcome;
    let Some((outcome, data)) = answer else { return Step::Done(WcStatus::RetryExcErr, 0) };
    match outcome {
        Outcome::Rnr(us) => Step::Rnr(Duration::from_micros(us)),
        Outcome::Done(WcStatus::Success, n) => {
            if let Op::Read(_) | Op::CompSwap(..) | Op::FetchAdd(..) = d.op {
                // The response's data lands in the local scatter list, checked only now.
                let mut dst = Segs::new();
                if resolve_local(keys.get(), sges, true, qp.pd, &mut dst).is_err() {
                    return Step::Done(WcStatus::LocProtErr, 0);
                }
                let m = data.len().min(d.len as usize);
                // SAFETY: `dst` are live local buffers with LOCAL_WRITE holding `len` bytes
                // (checked at post); `data` holds `m`.
                unsafe { copy_segs(&[(data.as_ptr().cast_mut(), m)], &dst, 0, m) };
            }
            Step::Done(WcStatus::Success, n)
        }
        Outcome::Done(st, n) => Step::Done(st, n),
    }
}

/// The direct path of an RC write (without an immediate) or read to QP `dst_qpn` of the
/// process at the other end of `link`: when that process's published table (`soft::shm`) shows
/// the QP receiving with the right, and the key a region of its PD covering the range in a
/// shared segment, the copy runs here, against this process's mapping of the segment, with no
/// message. `None`: anything else, left to the responder (which checks again and answers
/// exactly, errors included).
///
/// # Safety
/// As [`execute`].
#[allow(clippy::too_many_arguments)]
unsafe fn direct(
    qp: &QpShared,
    d: &Head,
    sges: &[Sge],
    keys: &mut Keys<'_>,
    link: &PeerLink,
    dst_qpn: u32,
    op: super::wire::WireOp,
    len: u64,
) -> Option<Step> {
    use super::wire::WireOp;
    let remote = match op {
        WireOp::Write(r, None) | WireOp::Read(r, _) => r,
        _ => return None,
    };
    let need = op.rights();
    let view = link.view()?;
    let t = view.qp(dst_qpn)?;
    if !super::qp::receives_in(t.state) || t.qp_type != qp.qp_type || !t.access.contains(need) {
        return None;
    }
    let len32 = len.min(u64::from(u32::MAX)) as u32;
    let mut local = Segs::new();
    let resolved = match (op, d.inline) {
        (WireOp::Write(..), true) => inline_segs(sges, &mut local),
        (WireOp::Write(..), false) => resolve_local(keys.get(), sges, false, qp.pd, &mut local),
        _ => Ok(()),
    };
    if let Err(st) = resolved {
        return Some(Step::Done(st, 0));
    }
    if len == 0 {
        return Some(Step::Done(WcStatus::Success, 0)); // (zero-length accesses skip the key)
    }
    let k = view.key(remote.rkey)?;
    if k.pd != t.pd || !k.access.contains(need) {
        return None;
    }
    let off = remote.addr.checked_sub(k.addr)?;
    if off.checked_add(len)? > k.len {
        return None;
    }
    let seg = view.segment(k.seg)?;
    let p = seg.at(k.seg_off.checked_add(off)?, len)?;
    if let WireOp::Read(..) = op {
        // The scatter list is checked when the data comes back, as after a response.
        if resolve_local(keys.get(), sges, true, qp.pd, &mut local).is_err() {
            return Some(Step::Done(WcStatus::LocProtErr, 0));
        }
        // SAFETY: `p` covers `len` bytes of this process's live mapping of the peer's segment
        // (`seg` holds it); `local` are live local buffers with LOCAL_WRITE of `len` bytes.
        unsafe { copy_segs(&[(p, len as usize)], &local, 0, len as usize) };
    } else {
        // SAFETY: as above; `local` are live local buffers (or the inline payload, readable by
        // this function's contract) of `len` bytes.
        unsafe { copy_segs(&local, &[(p, len as usize)], 0, len as usize) };
    }
    DIRECT.fetch_add(1, Ordering::Relaxed);
    Some(Step::Done(WcStatus::Success, len32))
}

/// Requests [`direct`] ran.
static DIRECT: AtomicU64 = AtomicU64::new(0);

/// One-sided requests this process ran against another process's memory on the direct path
/// (no message; see `soft::shm`), since it started.
pub fn direct_accesses() -> u64 {
    DIRECT.load(Ordering::Relaxed)
}

/// The responder side of a request from QP `src_qpn` (of type `src_type`) in another process
/// to this process's QP `dst_qpn`, with the same checks and effects as in one process: its
/// outcome and a read's or atomic's data.
pub(crate) fn serve(
    src_qpn: u32,
    src_type: QpType,
    dst_qpn: u32,
    op: super::wire::WireOp,
    payload: &mut [u8],
) -> (super::wire::Outcome, Vec<u8>) {
    use super::wire::{Outcome, WireOp};
    let reliable = src_type == QpType::Rc;
    let len = match op {
        WireOp::Read(_, n) => u64::from(n),
        WireOp::CompSwap(..) | WireOp::FetchAdd(..) => 8,
        _ => payload.len() as u64,
    };
    let len32 = len.min(u64::from(u32::MAX)) as u32;
    let sent = Step::Done(WcStatus::Success, len32);
    let told = |step: Step| match step {
        Step::Done(st, n) => Outcome::Done(st, n),
        Step::Rnr(wait) => Outcome::Rnr(wait.as_micros() as u64),
        // (never: no plan or link on this side)
        Step::Later(_) | Step::Waiting(_) => Outcome::Done(WcStatus::Success, len32),
    };
    let fabric = Fabric::get();
    let target = match (op, fabric.qp(dst_qpn)) {
        (WireOp::UdSend { gid, qkey, .. }, Some(t))
            if t.qp_type == QpType::Ud && t.ctx.gid == gid && t.receiving() =>
        {
            if t.qkey() != qkey {
                t.dropped.fetch_add(1, Ordering::Relaxed);
                return (told(sent), Vec::new());
            }
            t
        }
        (WireOp::UdSend { .. }, _) => return (told(sent), Vec::new()),
        (_, Some(t)) if t.receiving() && t.qp_type == src_type && src_type != QpType::Ud => t,
        // Nobody answers: a reliable transport retries until it gives up.
        _ if reliable => return (Outcome::Done(WcStatus::RetryExcErr, 0), Vec::new()),
        _ => return (told(sent), Vec::new()),
    };
    let keys = fabric.keys();
    let r = Responder {
        from_qpn: src_qpn,
        from_type: src_type,
        target: &target,
        keys: &keys,
        reliable,
        len,
        sent,
    };
    let need = op.rights();
    if !target.access().contains(need) {
        return (told(r.class_c(WcStatus::RemInvReqErr)), Vec::new());
    }
    let src = [(payload.as_mut_ptr(), payload.len())];
    let mut data = Vec::new();
    let step = match op {
        WireOp::Send(imm) | WireOp::UdSend { imm, .. } => r.send(&src, imm),
        WireOp::SendInv(rkey) => r.send_as(&src, None, Some(rkey)),
        WireOp::Write(remote, imm) => r.write(&src, remote, imm),
        WireOp::Read(remote, _) => match r.rkey(remote, len, need) {
            Ok(p) => {
                data = vec![0u8; len as usize];
                // SAFETY: `p` covers `len` bytes of a live region (resolved under the key
                // table's read lock, held here); `data` is fresh.
                unsafe {
                    copy_segs(&[(p, data.len())], &[(data.as_mut_ptr(), data.len())], 0, data.len())
                };
                r.sent.clone()
            }
            Err(st) => r.class_c(st),
        },
        WireOp::CompSwap(remote, ..) | WireOp::FetchAdd(remote, _) => {
            // (a peer's requester checks alignment at post; this one does not trust it to)
            if remote.addr % 8 != 0 {
                return (told(r.class_c(WcStatus::RemInvReqErr)), Vec::new());
            }
            match r.rkey(remote, 8, need) {
                Ok(p) => {
                    // SAFETY: `p` covers 8 bytes of a live region at an 8-byte aligned
                    // address (regions are mapped at their own addresses); the device
                    // accesses the word only atomically.
                    let word = unsafe { AtomicU64::from_ptr(p.cast()) };
                    let old = match op {
                        WireOp::CompSwap(_, cmp, swap) => word
                            .compare_exchange(cmp, swap, Ordering::AcqRel, Ordering::Acquire)
                            .unwrap_or_else(|v| v),
                        WireOp::FetchAdd(_, add) => word.fetch_add(add, Ordering::AcqRel),
                        _ => 0,
                    };
                    data = old.to_ne_bytes().to_vec();
                    r.sent.clone()
                }
                Err(st) => r.class_c(st),
            }
        }
    };
    (told(step), data)
}

/// A UC or UD message held back to be overtaken (`soft::faults`' `reorder`): a copy of its
/// payload, its target and what it does there.
#[derive(Debug)]
pub(crate) struct Held {
    target: std::sync::Arc<QpShared>,
    op: HeldOp,
    payload: Vec<u8>,
    /// When it goes anyway if no message overtakes it.
    pub(crate) due: std::time::Instant,
}

#[derive(Debug)]
enum HeldOp {
    Send(Option<u32>),
    Write(RemoteAddr, Option<u32>),
}

/// How long a held message waits for one to overtake it.
const HOLD: Duration = Duration::from_micros(100);

impl Held {
    /// A copy of message `op` of `len` bytes from `src` to `target` (`None` for what UC and
    /// UD do not carry, or a target gone from the fabric).
    fn copy(target: &QpShared, op: &Op, src: &[(*mut u8, usize)], len: u64) -> Option<Held> {
        let op = match op {
            Op::Send(imm) => HeldOp::Send(*imm),
            Op::Write(remote, imm) => HeldOp::Write(*remote, *imm),
            _ => return None,
        };
        let mut payload = vec![0u8; len as usize];
        // SAFETY: `src` are live local buffers (or the request's inline copy) of `len` bytes
        // in all; `payload` is a fresh buffer of `len` bytes.
        unsafe { copy_segs(src, &[(payload.as_mut_ptr(), payload.len())], 0, payload.len()) };
        let target = Fabric::get().qp(target.qpn)?;
        Some(Held { target, op, payload, due: std::time::Instant::now() + HOLD })
    }

    /// Delivers it now, from `qp`, as it would have been at its post (nothing if its target
    /// no longer receives).
    pub(crate) fn deliver(mut self, qp: &QpShared, keys: &KeyTable) {
        if !self.target.receiving() {
            return;
        }
        let len = self.payload.len() as u64;
        let sent = Step::Done(WcStatus::Success, len.min(u64::from(u32::MAX)) as u32);
        let target = &*self.target;
        let (from_qpn, from_type) = (qp.qpn, qp.qp_type);
        let r = Responder { from_qpn, from_type, target, keys, reliable: false, len, sent };
        let src = [(self.payload.as_mut_ptr(), self.payload.len())];
        let _ = match self.op {
            HeldOp::Send(imm) => r.send(&src, imm),
            HeldOp::Write(_, _) if !target.access().contains(AccessFlags::REMOTE_WRITE) => {
                r.class_c(WcStatus::RemInvReqErr)
            }
            HeldOp::Write(remote, imm) => r.write(&src, remote, imm),
        };
    }
}

/// What the responder side of one message needs.
struct Responder<'a> {
    /// The requester's QP number and type.
    from_qpn: u32,
    from_type: QpType,
    target: &'a QpShared,
    keys: &'a KeyTable,
    reliable: bool,
    len: u64,
    /// The requester's outcome when the message went out fine (or was lost unseen).
    sent: Step,
}

impl Responder<'_> {
    /// What an injected fault does to the message: `Some` its end (lost, retries exceeded, or
    /// a UD send delivered twice: a duplicate takes a second receive, or is dropped as any UD
    /// message without one) or its delay (held, then run again with `replaying`: its other
    /// fates are drawn then), `None` when it goes on as usual.
    #[cold]
    fn faulted(
        &self,
        qp: &QpShared,
        op: &Op,
        src: &[(*mut u8, usize)],
        replaying: bool,
    ) -> Option<Step> {
        if qp.is_cut() {
            // Nobody answers: a reliable transport retries until it gives up.
            return Some(if self.reliable {
                Step::Done(WcStatus::RetryExcErr, 0)
            } else {
                self.sent.clone()
            });
        }
        let needs_recv = matches!(op, Op::Send(_) | Op::SendInv(_) | Op::Write(_, Some(_)));
        let fate = match qp.draw_for(self.len, !replaying, needs_recv) {
            Drawn::Later(wait) => return Some(Step::Later(wait)),
            // No receive this time: what the transport does without one.
            Drawn::Withheld if self.reliable => return Some(Step::Rnr(self.target.rnr_wait())),
            Drawn::Withheld => {
                self.target.dropped.fetch_add(1, Ordering::Relaxed);
                return Some(self.sent.clone());
            }
            Drawn::Wire(fate) => fate,
        };
        let step = match fate {
            Fate::Arrives if self.reliable => return None,
            Fate::Arrives => match op {
                Op::Send(imm) => self.send(src, *imm),
                Op::Write(remote, imm)
                    if self.target.access().contains(AccessFlags::REMOTE_WRITE) =>
                {
                    self.write(src, *remote, *imm)
                }
                Op::Write(..) => self.class_c(WcStatus::RemInvReqErr),
                _ => return None, // (UC and UD carry sends and writes only)
            },
            Fate::Lost => return Some(self.sent.clone()),
            Fate::RetryExceeded => return Some(Step::Done(WcStatus::RetryExcErr, 0)),
            Fate::Twice => match op {
                Op::Send(imm) => {
                    let first = self.send(src, *imm);
                    let _ = self.send(src, *imm);
                    first
                }
                _ => return None,
            },
            Fate::Overtaken => {
                // Held back, a copy of it (the sender's buffer is its own again at the
                // completion); one held before goes now, ahead of it.
                let held = Held::copy(self.target, op, src, self.len);
                if let Some(earlier) = held.and_then(|h| qp.hold(h)) {
                    earlier.deliver(qp, self.keys);
                }
                qp.send_cq.note_work();
                return Some(self.sent.clone());
            }
        };
        // A message this one overtook arrives after it.
        if let Some(h) = qp.take_held() {
            h.deliver(qp, self.keys);
        }
        Some(step)
    }

    /// An error the responder NAKs (class A/C): on RC the responder QP goes to ERR and the
    /// requester sees `st`; UC and UD drop the message silently.
    fn class_c(&self, st: WcStatus) -> Step {
        if self.reliable {
            self.target.set_error();
            Step::Done(st, 0)
        } else {
            self.target.dropped.fetch_add(1, Ordering::Relaxed);
            self.sent.clone()
        }
    }

    /// The target memory of a one-sided operation.
    fn rkey(&self, remote: RemoteAddr, len: u64, need: AccessFlags) -> Result<*mut u8, WcStatus> {
        if len == 0 {
            return Ok(std::ptr::null_mut()); // zero-length accesses skip the key check
        }
        let t = self.target;
        self.keys.remote(remote.rkey, remote.addr, len, need, t.pd, t.qpn)
    }

    /// The receive a send or write-with-immediate consumes, or what happens without one.
    fn take_recv(&self) -> Result<RecvEntry, Step> {
        match self.target.pop_recv() {
            Some(r) => Ok(r),
            None if self.reliable => Err(Step::Rnr(self.target.rnr_wait())),
            None => {
                self.target.dropped.fetch_add(1, Ordering::Relaxed);
                Err(self.sent.clone())
            }
        }
    }

    fn recv_wc(&self, recv: &RecvEntry, opcode: WcOpcode, byte_len: u64, imm: Option<u32>) -> Wc {
        let ud = self.from_type == QpType::Ud;
        Wc {
            wr_id: recv.wr_id,
            status: WcStatus::Success,
            opcode,
            byte_len: byte_len.min(u64::from(u32::MAX)) as u32,
            imm,
            qp_num: self.target.qpn,
            src_qp: if ud { self.from_qpn } else { 0 },
            // rxe flags every successful receive so (N5 in docs/rxe-semantics.md).
            grh: true,
            ..Wc::default()
        }
    }

    fn send(&self, src: &[(*mut u8, usize)], imm: Option<u32>) -> Step {
        self.send_as(src, imm, None)
    }

    /// A send, with an immediate or invalidating `inv` at the target.
    fn send_as(&self, src: &[(*mut u8, usize)], imm: Option<u32>, inv: Option<u32>) -> Step {
        let recv = match self.take_recv() {
            Ok(r) => r,
            Err(step) => return step,
        };
        let grh = if self.from_type == QpType::Ud { u64::from(GRH_BYTES) } else { 0 };
        let mut dst = Segs::new();
        match resolve_local(self.keys, recv.sges(), true, self.target.recv_pd(), &mut dst) {
            Ok(()) if self.len + grh <= recv.capacity() => {}
            // A receive too small or with a bad scatter list is a malformed WQE (class A): the
            // receive fails with a local QP operation error and its QP goes to ERR, whatever
            // the transport; an RC requester is told with a remote operational error.
            _ => {
                self.target.complete_recv(self.target.error_wc(recv.wr_id, WcStatus::LocQpOpErr));
                self.target.set_error();
                return if self.reliable {
                    Step::Done(WcStatus::RemOpErr, 0)
                } else {
                    self.sent.clone()
                };
            }
        }
        if grh > 0 {
            let zeros = [0u8; GRH_BYTES as usize];
            // SAFETY: `dst` are live buffers of the target's PD with LOCAL_WRITE holding at
            // least len + 40 bytes (checked above).
            unsafe { copy_segs(&[(zeros.as_ptr().cast_mut(), zeros.len())], &dst, 0, zeros.len()) };
        }
        // SAFETY: as above; the payload goes after the GRH area.
        unsafe { copy_segs(src, &dst, grh as usize, self.len as usize) };
        let mut wc = self.recv_wc(&recv, WcOpcode::Recv, self.len + grh, imm);
        if let Some(rkey) = inv {
            if let Err(st) = self.invalidate(rkey) {
                // An invalidation error (class J), as rxe's responder handles it: the receive
                // fails and the responder's QP goes to ERR; the message was acknowledged.
                self.target.complete_recv(self.target.error_wc(recv.wr_id, st));
                self.target.set_error();
                return self.sent.clone();
            }
            wc.invalidated_rkey = Some(rkey);
        }
        self.target.complete_recv(wc);
        self.sent.clone()
    }

    /// A send-with-invalidate's revocation: the target's type 2 window with `rkey`, bound
    /// through the target QP.
    fn invalidate(&self, rkey: u32) -> Result<(), WcStatus> {
        match self.keys.get(rkey) {
            Some(KeyEntry::Mw(mw)) => mw.invalidate_remote(rkey, self.target.pd, self.target.qpn),
            _ => Err(WcStatus::RemInvReqErr),
        }
    }

    #[inline(always)]
    fn write(&self, src: &[(*mut u8, usize)], remote: RemoteAddr, imm: Option<u32>) -> Step {
        // rxe takes the receive of a write-with-immediate before checking the key, except on
        // UC without an SRQ, where a message with a bad key is dropped untouched.
        let peek_key_first = !self.reliable && !self.target.has_srq();
        let mut recv = None;
        if imm.is_some() && !peek_key_first {
            match self.take_recv() {
                Ok(r) => recv = Some(r),
                Err(step) => return step,
            }
        }
        let dst = match self.rkey(remote, self.len, AccessFlags::REMOTE_WRITE) {
            Ok(p) => p,
            Err(st) => {
                if let Some(r) = &recv {
                    self.target.complete_recv(self.target.error_wc(r.wr_id, st));
                }
                return self.class_c(st);
            }
        };
        if imm.is_some() && peek_key_first {
            match self.take_recv() {
                Ok(r) => recv = Some(r),
                Err(step) => return step,
            }
        }
        // SAFETY: `dst` covers `len` bytes of a live region (resolved under the key table's
        // read lock); `src` are live local buffers (or the request's inline copy).
        unsafe { copy_segs(src, &[(dst, self.len as usize)], 0, self.len as usize) };
        if let Some(r) = &recv {
            self.target.complete_recv(self.recv_wc(r, WcOpcode::RecvRdmaWithImm, self.len, imm));
        }
        self.sent.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::copy_segs;

    /// Single-segment copies of every small size, apart and overlapping either way, match
    /// `memmove`.
    #[test]
    fn small_copies_are_memmoves() {
        for n in 1..=24 {
            for (from, to) in [(0, 32), (4, 0), (0, 4), (0, 0)] {
                let mut got: Vec<u8> = (0..64).collect();
                let mut want = got.clone();
                want.copy_within(from..from + n, to);
                let p = got.as_mut_ptr();
                // SAFETY: both ranges lie within `got`, which outlives the call.
                unsafe {
                    copy_segs(&[(p.add(from), n)], &[(p.add(to), n)], 0, n);
                }
                assert_eq!(got, want, "{n} bytes from {from} to {to}");
            }
        }
    }
}
