//! The data path of `soft`: validating posted send requests and executing them against the
//! target's registered memory, as the NIC of both sides would.

use std::sync::Arc;
use std::time::Duration;

use arrayvec::ArrayVec;

use super::fabric::{Fabric, KeyEntry, KeyTable};
use super::limits::{MAX_INLINE, MAX_SGE};
use super::mem::{MrShared, MwShared};
use super::qp::{QpShared, SendQueue};
use super::Soft;
use crate::error::{invalid, Error, Result};
use crate::types::*;
use crate::wr::{SendOp, SendWr};

/// An operation, owned (so that it can wait for its RNR timer).
#[derive(Debug)]
pub(crate) enum Op {
    Send(Option<u32>),
    Write(RemoteAddr, Option<u32>),
    Read(RemoteAddr),
    CompSwap(RemoteAddr, u64, u64),
    FetchAdd(RemoteAddr, u64),
    BindMw { mw: Arc<MwShared>, mr: Arc<MrShared>, addr: u64, len: u64, access: AccessFlags },
    LocalInv(u32),
}

impl Op {
    pub(crate) fn wc_opcode(&self) -> WcOpcode {
        match self {
            Op::Send(_) => WcOpcode::Send,
            Op::Write(..) => WcOpcode::RdmaWrite,
            Op::Read(_) => WcOpcode::RdmaRead,
            Op::CompSwap(..) => WcOpcode::CompSwap,
            Op::FetchAdd(..) => WcOpcode::FetchAdd,
            Op::BindMw { .. } => WcOpcode::BindMw,
            Op::LocalInv(_) => WcOpcode::LocalInv,
        }
    }
}

/// A send request as the device keeps it: inline payloads copied, SGEs by value.
#[derive(Debug)]
pub(crate) struct Desc {
    pub(crate) wr_id: u64,
    pub(crate) op: Op,
    sges: ArrayVec<Sge, MAX_SGE>,
    inline: Option<ArrayVec<u8, MAX_INLINE>>,
    pub(crate) signaled: bool,
    ud: Option<(Gid, u32, u32)>,
}

impl Desc {
    fn len(&self) -> u64 {
        match &self.inline {
            Some(data) => data.len() as u64,
            None => self.sges.iter().map(|s| u64::from(s.length)).sum(),
        }
    }
}

/// What executing a request came to.
pub(crate) enum Step {
    /// Finished with this status and byte count.
    Done(WcStatus, u32),
    /// The receiver had no receive posted: try again after this wait.
    Rnr(Duration),
}

/// Checks a request against the QP's transport, state and limits, and takes what the device
/// keeps of it.
///
/// # Safety
/// Inline SGEs' `addr..addr+length` must be readable.
unsafe fn admit(qp: &QpShared, wr: &SendWr<'_, Soft>) -> std::result::Result<Desc, std::io::Error> {
    let state = qp.state();
    if !matches!(state, QpState::Rts | QpState::Err) {
        return Err(invalid(format!("the QP is in {state:?}; sends need RTS")));
    }
    let allowed = matches!(
        (&wr.op, qp.qp_type),
        (SendOp::Send | SendOp::SendWithImm(_), _)
            | (SendOp::Write(_) | SendOp::WriteWithImm(..), QpType::Rc | QpType::Uc)
            | (SendOp::BindMw { .. } | SendOp::LocalInv(_), QpType::Rc | QpType::Uc)
            | (SendOp::Read(_) | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }, QpType::Rc)
    );
    if !allowed {
        return Err(invalid(format!("{:?} is not allowed on a {} QP", wr.op, qp.qp_type)));
    }
    if wr.sgl.len() > qp.cap.max_send_sge as usize {
        return Err(invalid(format!(
            "{} SGEs, max_send_sge is {}",
            wr.sgl.len(),
            qp.cap.max_send_sge
        )));
    }
    let len = wr.sgl_bytes();
    let inline = wr.flags.contains(SendFlags::INLINE);
    let mut desc = Desc {
        wr_id: wr.wr_id,
        op: Op::Send(None),
        sges: wr.sgl.iter().copied().collect(),
        inline: None,
        signaled: wr.flags.contains(SendFlags::SIGNALED),
        ud: None,
    };
    desc.op = match wr.op {
        SendOp::Send => Op::Send(None),
        SendOp::SendWithImm(imm) => Op::Send(Some(imm)),
        SendOp::Write(r) => Op::Write(r, None),
        SendOp::WriteWithImm(r, imm) => Op::Write(r, Some(imm)),
        SendOp::Read(r) => Op::Read(r),
        SendOp::CompareSwap { remote, compare, swap } => Op::CompSwap(remote, compare, swap),
        SendOp::FetchAdd { remote, add } => Op::FetchAdd(remote, add),
        SendOp::BindMw { mw, mr, addr, len, access } => {
            Op::BindMw { mw: mw.shared.clone(), mr: mr.shared.clone(), addr, len, access }
        }
        SendOp::LocalInv(rkey) => Op::LocalInv(rkey),
    };
    if let Op::CompSwap(r, ..) | Op::FetchAdd(r, _) = &desc.op {
        if len < 8 || r.addr % 8 != 0 {
            return Err(invalid(
                "atomics need an 8-byte local buffer and an 8-byte aligned remote address",
            ));
        }
    }
    if inline {
        if !matches!(desc.op, Op::Send(_) | Op::Write(..)) {
            return Err(invalid("only sends and writes may be inline"));
        }
        if len > u64::from(qp.cap.max_inline_data) {
            return Err(invalid(format!(
                "{len} bytes inline, max_inline_data is {}",
                qp.cap.max_inline_data
            )));
        }
        let mut data = ArrayVec::<u8, MAX_INLINE>::new();
        for sge in wr.sgl {
            // SAFETY: the caller guarantees inline SGEs are readable; the length is bounded by
            // max_inline_data <= MAX_INLINE, checked above.
            let bytes =
                unsafe { std::slice::from_raw_parts(sge.addr as *const u8, sge.length as usize) };
            data.try_extend_from_slice(bytes).map_err(|_| invalid("inline payload too large"))?;
        }
        desc.inline = Some(data);
    }
    if qp.qp_type == QpType::Ud {
        let Some(ud) = wr.ud else {
            return Err(invalid("a UD send needs a destination (SendWr::to)"));
        };
        if ud.ah.pd != qp.pd {
            return Err(invalid("the address handle belongs to another protection domain"));
        }
        // A qkey with the high bit set means "use the QP's own qkey".
        let qkey = if ud.qkey & 0x8000_0000 != 0 { qp.qkey() } else { ud.qkey };
        desc.ud = Some((ud.ah.dgid, ud.qpn, qkey));
    }
    Ok(desc)
}

/// Posts a batch of send requests.
///
/// # Safety
/// As [`crate::Qp::post_send`].
pub(crate) unsafe fn post_send(qp: &QpShared, wrs: &[SendWr<'_, Soft>]) -> Result<()> {
    let mut sq = qp.sq();
    for (index, wr) in wrs.iter().enumerate() {
        let fail = |source| Error::PostSend { qpn: qp.qpn, index, source };
        // SAFETY: forwarded from this function's contract.
        let desc = unsafe { admit(qp, wr) }.map_err(fail)?;
        qp.submit(&mut sq, desc).map_err(fail)?;
    }
    Ok(())
}

/// Local buffers resolved to pointers.
type Segs = ArrayVec<(*mut u8, usize), MAX_SGE>;

fn resolve_local(keys: &KeyTable, sges: &[Sge], write: bool, pd: u64) -> Result<Segs, WcStatus> {
    let mut segs = Segs::new();
    for s in sges.iter().filter(|s| s.length > 0) {
        let p = keys.local(s.lkey, s.addr, s.length, write, pd)?;
        segs.push((p, s.length as usize));
    }
    Ok(segs)
}

/// Copies the bytes of `src` (a gather list) into `dst` (a scatter list) in order, skipping
/// `skip` bytes of `dst` first, for `len` bytes.
///
/// # Safety
/// Every segment must be valid for its length (resolved from live regions).
unsafe fn copy_segs(
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

/// Runs one request. The requester's QP is `qp` (whose send queue `sq` the caller holds).
pub(crate) fn execute(qp: &QpShared, sq: &mut SendQueue, d: &Desc) -> Step {
    match &d.op {
        Op::BindMw { mw, mr, addr, len, access } => {
            return match mw.bind(mr, *addr, *len, *access, qp.pd, qp.qpn) {
                Ok(_) => Step::Done(WcStatus::Success, 0),
                Err(st) => Step::Done(st, 0),
            };
        }
        Op::LocalInv(rkey) => {
            let mw = match Fabric::get().keys().get(*rkey) {
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
    let len = d.len();
    let len32 = len.min(u64::from(u32::MAX)) as u32;
    let reliable = qp.qp_type == QpType::Rc;
    // What an unreliable transport does with a message the far side cannot take: lose it.
    let lost = |t: Option<&QpShared>| {
        if let Some(t) = t {
            t.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Step::Done(WcStatus::Success, len32)
    };
    let target = match (qp.qp_type, d.ud) {
        (QpType::Ud, Some((dgid, qpn, qkey))) => match Fabric::get().qp(qpn) {
            Some(t) if t.qp_type == QpType::Ud && t.ctx.gid == dgid && t.receiving() => {
                if t.qkey() != qkey
                    || len > u64::from(qp.mtu.load(std::sync::atomic::Ordering::Relaxed))
                {
                    return lost(Some(&t));
                }
                t
            }
            _ => return lost(None),
        },
        _ => match sq.peer() {
            Some(t) if t.receiving() && t.qp_type == qp.qp_type => t,
            // No one answers: a reliable transport retries until it gives up.
            _ if reliable => return Step::Done(WcStatus::RetryExcErr, 0),
            _ => return lost(None),
        },
    };
    let keys = Fabric::get().keys();
    // Local buffers first: a bad lkey fails before anything reaches the wire.
    let local_write = matches!(d.op, Op::Read(_) | Op::CompSwap(..) | Op::FetchAdd(..));
    let inline_seg;
    let src: Segs = match &d.inline {
        Some(data) => {
            inline_seg = [(data.as_ptr().cast_mut(), data.len())];
            inline_seg.iter().copied().collect()
        }
        None => match resolve_local(&keys, &d.sges, local_write, qp.pd) {
            Ok(s) => s,
            Err(st) => return Step::Done(st, 0),
        },
    };
    // A responder-detected error: RC NAKs it (both QPs end in ERR), UC/UD drop the message.
    let nak = |st: WcStatus| {
        if reliable {
            target.set_error();
            Step::Done(st, 0)
        } else {
            lost(Some(&target))
        }
    };
    let need = match d.op {
        Op::Write(..) => AccessFlags::REMOTE_WRITE,
        Op::Read(_) => AccessFlags::REMOTE_READ,
        Op::CompSwap(..) | Op::FetchAdd(..) => AccessFlags::REMOTE_ATOMIC,
        _ => AccessFlags::empty(),
    };
    if !target.access().contains(need) {
        return nak(WcStatus::RemInvReqErr);
    }
    match d.op {
        Op::Send(imm) => deliver(qp, &target, &keys, &src, len, imm, WcOpcode::Recv, None),
        Op::Write(remote, imm) => {
            let dst = if len == 0 {
                std::ptr::null_mut()
            } else {
                match keys.remote(remote.rkey, remote.addr, len, need, target.pd, target.qpn) {
                    Ok(p) => p,
                    Err(st) => return nak(st),
                }
            };
            if imm.is_some() {
                return deliver(
                    qp,
                    &target,
                    &keys,
                    &src,
                    len,
                    imm,
                    WcOpcode::RecvRdmaWithImm,
                    Some(dst),
                );
            }
            // SAFETY: `dst` covers `len` bytes of a live region (resolved under the key lock,
            // which deregistration needs for writing); `src` segments are live local buffers.
            unsafe { copy_segs(&src, &[(dst, len as usize)], 0, len as usize) };
            Step::Done(WcStatus::Success, len32)
        }
        Op::Read(remote) => {
            if len > 0 {
                match keys.remote(remote.rkey, remote.addr, len, need, target.pd, target.qpn) {
                    // SAFETY: as for writes, in the other direction.
                    Ok(p) => unsafe { copy_segs(&[(p, len as usize)], &src, 0, len as usize) },
                    Err(st) => return nak(st),
                }
            }
            Step::Done(WcStatus::Success, len32)
        }
        Op::CompSwap(remote, _, _) | Op::FetchAdd(remote, _) => {
            let p = match keys.remote(remote.rkey, remote.addr, 8, need, target.pd, target.qpn) {
                Ok(p) if (p as usize) % 8 == 0 => p,
                Ok(_) => return nak(WcStatus::RemInvReqErr),
                Err(st) => return nak(st),
            };
            // SAFETY: `p` is 8-byte aligned and covers 8 bytes of a live region; every access
            // to the word by the device is atomic.
            let word = unsafe { std::sync::atomic::AtomicU64::from_ptr(p.cast()) };
            use std::sync::atomic::Ordering::AcqRel;
            let old = match d.op {
                Op::CompSwap(_, cmp, swap) => word
                    .compare_exchange(cmp, swap, AcqRel, std::sync::atomic::Ordering::Acquire)
                    .unwrap_or_else(|v| v),
                Op::FetchAdd(_, add) => word.fetch_add(add, AcqRel),
                _ => 0,
            };
            let bytes = old.to_ne_bytes();
            // SAFETY: `src` are live local buffers with LOCAL_WRITE; 8 bytes were checked at post.
            unsafe { copy_segs(&[(bytes.as_ptr().cast_mut(), 8)], &src, 0, 8) };
            Step::Done(WcStatus::Success, len32)
        }
        Op::BindMw { .. } | Op::LocalInv(_) => Step::Done(WcStatus::LocQpOpErr, 0),
    }
}

/// Consumes the target's next receive for a send (or a write-with-immediate whose data goes
/// to `write_to`) and completes it on the target's receive CQ.
#[allow(clippy::too_many_arguments)]
fn deliver(
    qp: &QpShared,
    target: &QpShared,
    keys: &KeyTable,
    src: &[(*mut u8, usize)],
    len: u64,
    imm: Option<u32>,
    opcode: WcOpcode,
    write_to: Option<*mut u8>,
) -> Step {
    let reliable = qp.qp_type == QpType::Rc;
    let len32 = len.min(u64::from(u32::MAX)) as u32;
    let Some(recv) = target.pop_recv() else {
        if reliable {
            return Step::Rnr(target.rnr_wait());
        }
        target.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Step::Done(WcStatus::Success, len32);
    };
    let ud = qp.qp_type == QpType::Ud;
    let grh = if ud { u64::from(GRH_BYTES) } else { 0 };
    let mut wc = Wc {
        wr_id: recv.wr_id,
        status: WcStatus::Success,
        opcode,
        byte_len: (len + grh) as u32,
        imm,
        qp_num: target.qpn,
        src_qp: qp.qpn,
        grh: ud,
        ..Wc::default()
    };
    let fail = |wc: Wc, recv_status: WcStatus, send_status: WcStatus| {
        target.recv_cq.push(Wc { status: recv_status, byte_len: 0, imm: None, ..wc });
        if reliable {
            target.set_error();
            Step::Done(send_status, 0)
        } else {
            Step::Done(WcStatus::Success, len32)
        }
    };
    if let Some(dst) = write_to {
        // SAFETY: see the plain write in `execute`.
        unsafe { copy_segs(src, &[(dst, len as usize)], 0, len as usize) };
        wc.grh = false;
        target.recv_cq.push(wc);
        return Step::Done(WcStatus::Success, len32);
    }
    if len + grh > recv.capacity() {
        return fail(wc, WcStatus::LocLenErr, WcStatus::RemInvReqErr);
    }
    let dst = match resolve_local(keys, &recv.sges, true, target.recv_pd()) {
        Ok(d) => d,
        Err(_) => return fail(wc, WcStatus::LocProtErr, WcStatus::RemOpErr),
    };
    if ud {
        let zeros = [0u8; GRH_BYTES as usize];
        // SAFETY: `dst` are live buffers of the target's PD with LOCAL_WRITE, holding at least
        // len + 40 bytes (checked above).
        unsafe { copy_segs(&[(zeros.as_ptr().cast_mut(), zeros.len())], &dst, 0, zeros.len()) };
    }
    // SAFETY: as above; the payload goes after the GRH area.
    unsafe { copy_segs(src, &dst, grh as usize, len as usize) };
    target.recv_cq.push(wc);
    Step::Done(WcStatus::Success, len32)
}
