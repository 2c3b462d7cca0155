//! The data path: `post_send`, `post_recv` and SRQ `post_recv`. Nothing here allocates.
//!
//! Work requests are built into scratch arrays (the QP's, preallocated at creation; the stack
//! for SRQs), linked, and posted with one call. Scatter/gather lists are passed to the device
//! as the caller's slices: [`crate::Sge`] has `ibv_sge`'s layout (checked at compile time in
//! `convert`) and the device only reads them.
//!
//! Batches larger than the send (receive) queue: the first `max_send_wr` (`max_recv_wr`)
//! requests are posted as one batch and [`Error::PostSend`] ([`Error::PostRecv`]) reports the
//! next index with `ENOMEM`, what a device answers when its queue is full.

use std::os::raw::c_int;
use std::sync::atomic::Ordering;

use rdma_sys::{
    atomic_t, bind_mw_t, bind_mw_tso_union_t, ibv_mw_bind_info, ibv_recv_wr, ibv_send_wr, ibv_sge,
    ibv_wr_opcode, imm_data_invalidated_rkey_union_t, rdma_t, ud_t, wr_t,
};

use super::convert::{access_to_ibv, dec_rkey, errno_err, inc_rkey, ret_err, send_flags_to_ibv};
use super::qp::IbvQp;
use super::srq::SrqInner;
use super::Ibverbs;
use crate::error::{Error, Result};
use crate::types::{QpState, QpType, Sge};
use crate::wr::{RecvWr, SendOp, SendWr};

/// Receive requests an SRQ post builds on the stack at a time.
const SRQ_CHUNK: usize = 32;

/// The caller's scatter/gather list as the C API's pointer.
#[inline(always)]
fn sg_ptr(sgl: &[Sge]) -> *mut ibv_sge {
    // The C API takes a mutable pointer but never writes through it.
    sgl.as_ptr().cast_mut().cast()
}

/// Index of `bad` in the array starting at `base`, clamped to `0..=limit`.
fn bad_index<T>(base: *const T, bad: *const T, limit: usize) -> usize {
    if bad.is_null() || (bad as usize) < (base as usize) {
        return 0;
    }
    ((bad as usize - base as usize) / std::mem::size_of::<T>()).min(limit)
}

/// Why a send request cannot be built (refused before it reaches the device).
fn check_send(qp: &IbvQp, wr: &SendWr<'_, Ibverbs>) -> Option<c_int> {
    (!send_fits(qp, wr)).then_some(libc::EINVAL)
}

/// Whether `wr` can be built for `qp`: its gather list fits, and a UD QP's request names its
/// destination (and-ed without a branch each: [`crate::one_test`]'s callers test it once).
#[inline(always)]
fn send_fits(qp: &IbvQp, wr: &SendWr<'_, Ibverbs>) -> bool {
    (wr.sgl.len() <= qp.cap.max_send_sge as usize) & !((qp.qp_type == QpType::Ud) & wr.ud.is_none())
}

/// The `ibv_send_wr` of `wr` (not linked). A memory-window bind takes the window's next rkey
/// and stores it in the window now (see [`undo_binds`]). Inlined: where the caller knows the
/// request's kind its match folds away.
#[inline(always)]
fn build_send(wr: &SendWr<'_, Ibverbs>, ud: bool) -> ibv_send_wr {
    let mut opcode = ibv_wr_opcode::IBV_WR_SEND;
    let mut imm = 0u32;
    // SAFETY: plain C unions of integers and raw pointers; all-zero is valid.
    let mut w: wr_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut bind: bind_mw_tso_union_t = unsafe { std::mem::zeroed() };
    match wr.op {
        SendOp::Send => {}
        SendOp::SendWithImm(i) => {
            opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
            imm = i.to_be();
        }
        SendOp::SendWithInv(rkey) => {
            opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
            imm = rkey; // the union's invalidate_rkey, in host order
        }
        SendOp::Write(r) => {
            opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            w.rdma = rdma_t { remote_addr: r.addr, rkey: r.rkey };
        }
        SendOp::WriteWithImm(r, i) => {
            opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
            w.rdma = rdma_t { remote_addr: r.addr, rkey: r.rkey };
            imm = i.to_be();
        }
        SendOp::Read(r) => {
            opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
            w.rdma = rdma_t { remote_addr: r.addr, rkey: r.rkey };
        }
        SendOp::CompareSwap { remote, compare, swap } => {
            opcode = ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
            w.atomic = atomic_t {
                remote_addr: remote.addr,
                compare_add: compare,
                swap,
                rkey: remote.rkey,
            };
        }
        SendOp::FetchAdd { remote, add } => {
            opcode = ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
            w.atomic =
                atomic_t { remote_addr: remote.addr, compare_add: add, swap: 0, rkey: remote.rkey };
        }
        SendOp::BindMw { mw, mr, addr, len, access } => {
            opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
            let new_rkey = inc_rkey(mw.inner.rkey.load(Ordering::Acquire));
            mw.inner.rkey.store(new_rkey, Ordering::Release);
            bind.bind_mw = bind_mw_t {
                mw: mw.as_raw(),
                rkey: new_rkey,
                bind_info: ibv_mw_bind_info {
                    mr: mr.as_raw(),
                    addr,
                    length: len,
                    mw_access_flags: access_to_ibv(access),
                },
            };
        }
        SendOp::LocalInv(rkey) => {
            opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
            imm = rkey;
        }
    }
    if ud {
        if let Some(d) = wr.ud {
            w.ud = ud_t { ah: d.ah.as_raw(), remote_qpn: d.qpn, remote_qkey: d.qkey };
        }
    }
    ibv_send_wr {
        wr_id: wr.wr_id,
        next: std::ptr::null_mut(),
        sg_list: sg_ptr(wr.sgl),
        num_sge: wr.sgl.len() as c_int,
        opcode,
        send_flags: send_flags_to_ibv(wr.flags),
        imm_data_invalidated_rkey_union: imm_data_invalidated_rkey_union_t { imm_data: imm },
        wr: w,
        // SAFETY: a plain C union of integers; all-zero is valid.
        qp_type: unsafe { std::mem::zeroed() },
        bind_mw_tso_union: bind,
    }
}

/// Gives back the rkeys taken by the binds among `wrs`, which were not posted (newest first,
/// so a window bound twice in the batch gets its original key back).
fn undo_binds(wrs: &[SendWr<'_, Ibverbs>]) {
    for wr in wrs.iter().rev() {
        if let SendOp::BindMw { mw, .. } = wr.op {
            let k = mw.inner.rkey.load(Ordering::Acquire);
            mw.inner.rkey.store(dec_rkey(k), Ordering::Release);
        }
    }
}

/// Whether a QP in `state` takes send requests: RTS, and the states past it (SQD, SQE and ERR,
/// where they flush). Before RTS (RESET, INIT, RTR) every provider refuses them.
#[inline(always)]
fn sends_allowed(state: QpState) -> bool {
    matches!(state, QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err)
}

/// Rings `qp`'s doorbell for the `n` requests at `head`, built from `wrs[..n]`; on a refusal,
/// the binds from the refused request on are given back and the error names its index.
///
/// # Safety
/// `head` is a list of `n` valid requests linked in order, built from `wrs[..n]`, whose
/// pointers (scatter lists, AHs, MWs, MRs) are borrowed for this call; the buffers they name
/// are as [`post_send`] says.
#[inline(always)]
unsafe fn ring(
    qp: &IbvQp,
    head: *mut ibv_send_wr,
    wrs: &[SendWr<'_, Ibverbs>],
    n: usize,
) -> Result<()> {
    let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
    #[cfg(feature = "guest-stamps")]
    crate::stamps::stamp(crate::stamps::Point::DoorbellIn);
    // SAFETY: the QP is live; the caller vouches for the list at `head`.
    let ret = unsafe { rdma_sys::ibv_post_send(qp.inner.qp, head, &mut bad) };
    #[cfg(feature = "guest-stamps")]
    crate::stamps::stamp(crate::stamps::Point::DoorbellOut);
    if ret != 0 {
        let index = bad_index(head, bad, n);
        undo_binds(&wrs[index..n]);
        return Err(Error::PostSend { qpn: qp.qp_num, index, source: ret_err(ret) });
    }
    Ok(())
}

/// [`crate::Qp::post_send`].
///
/// One request that the QP takes as it is (the latency path) is built on the stack and rung
/// here, inlined into the caller, its checks one test: in the emulated guest each call's
/// return costs a look-up of the translated code (tens of nanoseconds), and each branch a
/// block. Anything else goes the general way, out of line.
///
/// # Safety
/// The buffers named by the requests' scatter/gather lists must stay valid as the trait says.
#[inline(always)]
pub(crate) unsafe fn post_send(qp: &mut IbvQp, wrs: &[SendWr<'_, Ibverbs>]) -> Result<()> {
    if let [wr] = wrs {
        let fits = sends_allowed(qp.state) & send_fits(qp, wr) & !qp.send_wrs.is_empty();
        if crate::one_test(fits) {
            let mut w = build_send(wr, qp.qp_type == QpType::Ud);
            // SAFETY: `w` is one valid request (not linked), built from `wrs[0]`.
            return unsafe { ring(qp, &mut w, wrs, 1) };
        }
    }
    // SAFETY: as this function's.
    unsafe { post_send_general(qp, wrs) }
}

/// [`post_send`] of anything but one request that the QP takes as it is.
///
/// # Safety
/// As [`post_send`]'s.
#[inline(never)]
unsafe fn post_send_general(qp: &mut IbvQp, wrs: &[SendWr<'_, Ibverbs>]) -> Result<()> {
    if wrs.is_empty() {
        return Ok(());
    }
    let qpn = qp.qp_num;
    if !sends_allowed(qp.state) {
        // rxe answers EINVAL here yet keeps the request queued in its ring, to run once the
        // QP is up; corelink's promise is that a refused request is not queued.
        let state = crate::Qp::state(qp); // (the device may have moved it to ERR since)
        if !sends_allowed(state) {
            let msg = format!("the QP is in {state:?}; sends need RTS");
            return Err(Error::PostSend { qpn, index: 0, source: crate::error::invalid(msg) });
        }
    }
    let room = wrs.len().min(qp.send_wrs.len());
    let ok = wrs[..room].iter().position(|wr| check_send(qp, wr).is_some()).unwrap_or(room);
    let ud = qp.qp_type == QpType::Ud;
    if ok > 0 {
        let base = qp.send_wrs.as_mut_ptr();
        for (i, wr) in wrs[..ok].iter().enumerate() {
            let mut w = build_send(wr, ud);
            if i + 1 < ok {
                // SAFETY: `i + 1 < ok <= send_wrs.len()`: inside the scratch array.
                w.next = unsafe { base.add(i + 1) };
            }
            qp.send_wrs[i] = w;
        }
        // SAFETY: `base[..ok]` is a list of valid requests, linked in order, built from
        // `wrs[..ok]`.
        unsafe { ring(qp, base, wrs, ok) }?;
    }
    if ok < room {
        let code = check_send(qp, &wrs[ok]).unwrap_or(libc::EINVAL);
        return Err(Error::PostSend { qpn, index: ok, source: errno_err(code) });
    }
    if room < wrs.len() {
        return Err(Error::PostSend { qpn, index: room, source: errno_err(libc::ENOMEM) });
    }
    Ok(())
}

/// The `ibv_recv_wr` of `wr` (not linked).
fn build_recv(wr: &RecvWr<'_>) -> ibv_recv_wr {
    ibv_recv_wr {
        wr_id: wr.wr_id,
        next: std::ptr::null_mut(),
        sg_list: sg_ptr(wr.sgl),
        num_sge: wr.sgl.len() as c_int,
    }
}

/// Index of the first request whose list is longer than `max_sge`, or `wrs.len()`.
fn first_bad_recv(wrs: &[RecvWr<'_>], max_sge: u32) -> usize {
    wrs.iter().position(|wr| wr.sgl.len() > max_sge as usize).unwrap_or(wrs.len())
}

/// [`crate::Qp::post_recv`].
///
/// # Safety
/// The buffers named by the requests' scatter lists must stay valid as the trait says.
pub(crate) unsafe fn post_recv(qp: &mut IbvQp, wrs: &[RecvWr<'_>]) -> Result<()> {
    if wrs.is_empty() {
        return Ok(());
    }
    let qpn = qp.qp_num;
    if qp.has_srq {
        // Receives of a QP attached to an SRQ come from the SRQ.
        return Err(Error::PostRecv { qpn, index: 0, source: errno_err(libc::EINVAL) });
    }
    let room = wrs.len().min(qp.recv_wrs.len());
    let ok = first_bad_recv(&wrs[..room], qp.cap.max_recv_sge);
    if ok > 0 {
        let base = qp.recv_wrs.as_mut_ptr();
        for (i, wr) in wrs[..ok].iter().enumerate() {
            let mut w = build_recv(wr);
            if i + 1 < ok {
                // SAFETY: `i + 1 < ok <= recv_wrs.len()`: inside the scratch array.
                w.next = unsafe { base.add(i + 1) };
            }
            qp.recv_wrs[i] = w;
        }
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        #[cfg(feature = "guest-stamps")]
        crate::stamps::stamp(crate::stamps::Point::RepostIn);
        // SAFETY: the QP is live; `base[..ok]` is a linked list of valid requests; the
        // buffers are the caller's responsibility.
        let ret = unsafe { rdma_sys::ibv_post_recv(qp.inner.qp, base, &mut bad) };
        #[cfg(feature = "guest-stamps")]
        crate::stamps::stamp(crate::stamps::Point::RepostOut);
        if ret != 0 {
            let index = bad_index(base, bad, ok);
            return Err(Error::PostRecv { qpn, index, source: ret_err(ret) });
        }
    }
    if ok < room {
        return Err(Error::PostRecv { qpn, index: ok, source: errno_err(libc::EINVAL) });
    }
    if room < wrs.len() {
        return Err(Error::PostRecv { qpn, index: room, source: errno_err(libc::ENOMEM) });
    }
    Ok(())
}

/// [`crate::Srq::post_recv`], in chunks of [`SRQ_CHUNK`] built on the stack.
///
/// # Safety
/// The buffers named by the requests' scatter lists must stay valid as the trait says.
pub(crate) unsafe fn srq_post_recv(srq: &SrqInner, wrs: &[RecvWr<'_>]) -> Result<()> {
    let ok = first_bad_recv(wrs, srq.max_sge);
    // SAFETY: ibv_recv_wr is a plain C struct; all-zero is valid.
    let mut scratch: [ibv_recv_wr; SRQ_CHUNK] = unsafe { std::mem::zeroed() };
    let mut start = 0;
    while start < ok {
        let n = (ok - start).min(SRQ_CHUNK);
        let base = scratch.as_mut_ptr();
        for (i, wr) in wrs[start..start + n].iter().enumerate() {
            let mut w = build_recv(wr);
            if i + 1 < n {
                // SAFETY: `i + 1 < n <= SRQ_CHUNK`: inside the scratch array.
                w.next = unsafe { base.add(i + 1) };
            }
            scratch[i] = w;
        }
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the SRQ is live; `scratch[..n]` is a linked list of valid requests; the
        // buffers are the caller's responsibility.
        let ret = unsafe { rdma_sys::ibv_post_srq_recv(srq.srq, scratch.as_mut_ptr(), &mut bad) };
        if ret != 0 {
            let index = start + bad_index(scratch.as_ptr(), bad, n);
            return Err(Error::PostSrqRecv { index, source: ret_err(ret) });
        }
        start += n;
    }
    if ok < wrs.len() {
        return Err(Error::PostSrqRecv { index: ok, source: errno_err(libc::EINVAL) });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_wr_index() {
        let arr = [0u64; 8];
        let base = arr.as_ptr();
        assert_eq!(bad_index(base, std::ptr::null(), 8), 0);
        // SAFETY: in bounds.
        assert_eq!(bad_index(base, unsafe { base.add(3) }, 8), 3);
        // SAFETY: in bounds.
        assert_eq!(bad_index(base, unsafe { base.add(7) }, 5), 5);
    }

    #[test]
    fn recv_sge_limit() {
        let sge = [Sge::default(); 3];
        let wrs = [
            RecvWr { wr_id: 1, sgl: &sge[..1] },
            RecvWr { wr_id: 2, sgl: &sge[..3] },
            RecvWr { wr_id: 3, sgl: &sge[..1] },
        ];
        assert_eq!(first_bad_recv(&wrs, 2), 1);
        assert_eq!(first_bad_recv(&wrs, 3), 3);
        let r = build_recv(&wrs[1]);
        assert_eq!(r.num_sge, 3);
        assert_eq!(r.sg_list as usize, sge.as_ptr() as usize);
    }
}
