//! Error cases: every way a request can fail, with the exact status from [`crate::expect`],
//! the requester's and responder's QP states afterwards, flushes of later requests, and the
//! target memory checked untouched byte for byte.

use std::time::Instant;

use corelink_verbs::{
    AccessFlags, AsyncElement, Context, Cq, Mr, Pd, Provider, Qp, QpState, QpType, RemoteAddr,
    SendOp, SendWr, Sge, WcOpcode,
};

use crate::expect::{self, PostOutcome, RcFault};
use crate::harness::*;
use crate::{ensure, ensure_eq, CaseResult, Target};

/// A key no region or window has.
pub(crate) const BAD_KEY: u32 = 0xdead_beef;

/// Checks what posting request `wr_id` did against `exp` (`opcode`: its opcode on success).
pub(crate) fn check_post_outcome<C: Cq>(
    res: corelink_verbs::Result<()>,
    exp: PostOutcome,
    cq: &C,
    wr_id: u64,
    opcode: WcOpcode,
    what: &str,
) -> CaseResult {
    match (exp, res) {
        (PostOutcome::Refused, Err(e)) => {
            ensure!(
                is_post_send_refusal(&e, 0),
                "{what}: expected Error::PostSend for request 0, got {}",
                chain(&e)
            );
            Ok(())
        }
        (PostOutcome::Refused, Ok(())) => {
            let wc = poll_one(cq, what);
            Err(format!(
                "{what}: expected a refusal at post (Error::PostSend), but it was posted; \
                 completion: {wc:?}"
            ))
        }
        (PostOutcome::Completes(status), res) => {
            res.ctx(&format!(
                "{what}: post_send (expected to be posted and complete with {status})"
            ))?;
            let wc = poll_one(cq, what)?;
            check_wc(&wc, wr_id, status, opcode).map_err(|e| format!("{what}: {e}"))
        }
    }
}

/// After a failed request from A to B: A's and B's states, a send posted on A afterwards
/// flushing (RC/UC), B's receives `b_recvs` flushing (or B untouched), as `exp` says.
pub(crate) fn check_aftermath<P: Provider>(
    a: &mut Side<P>,
    b: &mut Side<P>,
    spare: &P::Mr,
    exp: RcFault,
    b_recvs: &[u64],
) -> CaseResult {
    let flush = expect::TABLE.flush;
    if exp.requester_to_err {
        check_state::<P>(&a.qp, QpState::Err, "the requester after the error")?;
        if a.qp.qp_type() != QpType::Ud {
            let sgl = [sge(spare, 0, 8)?];
            // SAFETY: `spare` outlives this function, which polls the completion.
            unsafe { post::<P>(&mut a.qp, &[SendWr::new(99, SendOp::Send, &sgl)]) }
                .ctx("post_send on the requester in ERR")?;
            let wc = poll_one(&a.scq, "the flush of a send posted after the error")?;
            check_wc(&wc, 99, flush, WcOpcode::Send)?;
        }
    } else {
        check_state::<P>(&a.qp, QpState::Rts, "the requester after the error")?;
    }
    if exp.responder_to_err {
        check_state::<P>(&b.qp, QpState::Err, "the responder after the error")?;
        let wcs = poll(&b.rcq, b_recvs.len(), "the flush of the responder's receives")?;
        for (wc, &id) in wcs.iter().zip(b_recvs) {
            check_wc(wc, id, flush, WcOpcode::Recv)?;
        }
    } else {
        check_state::<P>(&b.qp, QpState::Rts, "the responder after the error")?;
    }
    expect_quiet(&a.scq, "nothing more on the requester's CQ")?;
    expect_quiet(&b.rcq, "nothing more on the responder's receive CQ")
}

/// A one-sided operation.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OneSided {
    Write,
    Read,
    Atomic,
}

/// Runs a one-sided `op` of `len` bytes at `remote` from A to B, which must fail as `exp`
/// says, leaving every region of `victims` unchanged.
pub(crate) fn one_sided_fault<P: Provider>(
    da: &Dev<P>,
    db: &Dev<P>,
    op: OneSided,
    remote: RemoteAddr,
    len: u32,
    victims: &[&P::Mr],
    exp: RcFault,
) -> CaseResult {
    let local = da.mr(4096, AccessFlags::LOCAL_WRITE)?;
    fill(&local, 0x33)?;
    let rbuf = db.mr(128, AccessFlags::LOCAL_WRITE)?;
    let before = victims.iter().map(|m| bytes(*m, 0, m.len())).collect::<Result<Vec<_>, _>>()?;
    let (mut a, mut b) = pair(da, db, &PairOpts::new(QpType::Rc))?;
    let rsgl = [sge(&rbuf, 0, 64)?, sge(&rbuf, 64, 64)?];
    let rwrs = [
        corelink_verbs::RecvWr { wr_id: 50, sgl: &rsgl[..1] },
        corelink_verbs::RecvWr { wr_id: 51, sgl: &rsgl[1..] },
    ];
    // SAFETY: `rbuf` is declared before the QPs and so outlives them.
    unsafe { post_recv::<P>(&mut b.qp, &rwrs) }?;
    let sgl = [sge(&local, 0, len)?];
    let (sop, opcode) = match op {
        OneSided::Write => (SendOp::Write(remote), WcOpcode::RdmaWrite),
        OneSided::Read => (SendOp::Read(remote), WcOpcode::RdmaRead),
        OneSided::Atomic => (SendOp::FetchAdd { remote, add: 1 }, WcOpcode::FetchAdd),
    };
    // SAFETY: `local` is declared before the QPs and so outlives them.
    let res = unsafe { post::<P>(&mut a.qp, &[SendWr::new(1, sop, &sgl)]) };
    check_post_outcome(res, exp.requester, &a.scq, 1, opcode, &format!("{op:?}"))?;
    check_aftermath(&mut a, &mut b, &local, exp, &[50, 51])?;
    for (i, (m, snap)) in victims.iter().zip(&before).enumerate() {
        check_bytes(*m, 0, snap, &format!("target region {i} after the failed {op:?}"))?;
    }
    Ok(())
}

const RW: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);
const RA: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_ATOMIC);

fn bad_rkey<P: Provider>(t: &Target, op: OneSided, access: AccessFlags, len: u32) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let mr = db.mr(4096, access)?;
    fill(&mr, 0x44)?;
    let remote = RemoteAddr { addr: mr.addr(), rkey: BAD_KEY };
    one_sided_fault(&da, &db, op, remote, len, &[&mr], expect::get::<P>(t).remote_access)
}

/// Write with an rkey nobody has.
pub fn write_bad_rkey<P: Provider>(t: &Target) -> CaseResult {
    bad_rkey::<P>(t, OneSided::Write, RW, 64)
}

/// Read with an rkey nobody has.
pub fn read_bad_rkey<P: Provider>(t: &Target) -> CaseResult {
    bad_rkey::<P>(t, OneSided::Read, AccessFlags::REMOTE_READ, 64)
}

/// Atomic with an rkey nobody has.
pub fn atomic_bad_rkey<P: Provider>(t: &Target) -> CaseResult {
    bad_rkey::<P>(t, OneSided::Atomic, RA, 8)
}

fn stale_rkey<P: Provider>(t: &Target, op: OneSided, access: AccessFlags) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let old = db.mr(4096, access)?;
    let remote = old.remote(0);
    drop(old);
    // A region registered after the deregistration (perhaps at the same address, perhaps with
    // the same key index) must not be reachable with the old key.
    let new = db.mr(4096, access)?;
    fill(&new, 0x55)?;
    ensure!(new.rkey() != remote.rkey, "a new registration reused the old rkey {:#x}", remote.rkey);
    one_sided_fault(&da, &db, op, remote, 64, &[&new], expect::get::<P>(t).remote_access)
}

/// Write with the rkey of a deregistered region.
pub fn write_stale_rkey<P: Provider>(t: &Target) -> CaseResult {
    stale_rkey::<P>(t, OneSided::Write, RW)
}

/// Read with the rkey of a deregistered region.
pub fn read_stale_rkey<P: Provider>(t: &Target) -> CaseResult {
    stale_rkey::<P>(t, OneSided::Read, AccessFlags::REMOTE_READ)
}

fn out_of_bounds<P: Provider>(t: &Target, op: OneSided, access: AccessFlags) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let mr = db.mr(4096, access)?;
    fill(&mr, 0x66)?;
    // 64 bytes starting 32 before the end: half inside, half outside.
    let remote = mr.remote(4096 - 32);
    one_sided_fault(&da, &db, op, remote, 64, &[&mr], expect::get::<P>(t).remote_access)
}

/// Write that runs past the end of the region.
pub fn write_out_of_bounds<P: Provider>(t: &Target) -> CaseResult {
    out_of_bounds::<P>(t, OneSided::Write, RW)
}

/// Read that runs past the end of the region.
pub fn read_out_of_bounds<P: Provider>(t: &Target) -> CaseResult {
    out_of_bounds::<P>(t, OneSided::Read, AccessFlags::REMOTE_READ)
}

fn missing_right<P: Provider>(
    t: &Target,
    op: OneSided,
    access: AccessFlags,
    len: u32,
) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let mr = db.mr(4096, access)?;
    fill(&mr, 0x77)?;
    one_sided_fault(&da, &db, op, mr.remote(0), len, &[&mr], expect::get::<P>(t).remote_access)
}

/// Write to a region registered with REMOTE_READ only.
pub fn write_read_only_mr<P: Provider>(t: &Target) -> CaseResult {
    missing_right::<P>(t, OneSided::Write, AccessFlags::REMOTE_READ, 64)
}

/// Read of a region registered with LOCAL_WRITE | REMOTE_WRITE only.
pub fn read_write_only_mr<P: Provider>(t: &Target) -> CaseResult {
    missing_right::<P>(t, OneSided::Read, RW, 64)
}

/// Atomic on a region registered without REMOTE_ATOMIC.
pub fn atomic_without_remote_atomic<P: Provider>(t: &Target) -> CaseResult {
    missing_right::<P>(t, OneSided::Atomic, RW | AccessFlags::REMOTE_READ, 8)
}

/// Write to a region registered in another PD than the target QP's.
pub fn write_other_pd_mr<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let pd2 = db.ctx.alloc_pd().ctx("alloc_pd")?;
    let mr = pd2.register(4096, RW | AccessFlags::REMOTE_ALL).ctx("register in the other PD")?;
    fill(&mr, 0x88)?;
    one_sided_fault(
        &da,
        &db,
        OneSided::Write,
        mr.remote(0),
        64,
        &[&mr],
        expect::get::<P>(t).remote_access,
    )
}

/// Atomic on a word that is not 8-byte aligned.
pub fn atomic_misaligned<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let mr = db.mr(64, RA)?;
    fill(&mr, 0x99)?;
    one_sided_fault(
        &da,
        &db,
        OneSided::Atomic,
        mr.remote(4),
        8,
        &[&mr],
        expect::get::<P>(t).misaligned_atomic,
    )
}

/// Send whose SGE names an lkey nobody has.
pub fn send_bad_lkey<P: Provider>(t: &Target) -> CaseResult {
    let exp = expect::get::<P>(t).bad_lkey;
    let (da, db) = devs::<P>(t)?;
    let local = da.mr(64, AccessFlags::LOCAL_WRITE)?;
    let rbuf = db.mr(64, AccessFlags::LOCAL_WRITE)?;
    let (mut a, mut b) = pair(&da, &db, &PairOpts::new(QpType::Rc))?;
    // SAFETY: `rbuf` is declared before the QPs and so outlives them.
    unsafe { recv::<P>(&mut b.qp, 50, &rbuf, 64) }?;
    let sgl = [Sge { addr: local.addr(), length: 16, lkey: BAD_KEY }];
    // SAFETY: the SGE points into `local`, which is declared before the QPs.
    let res = unsafe { post::<P>(&mut a.qp, &[SendWr::new(1, SendOp::Send, &sgl)]) };
    check_post_outcome(res, exp.requester, &a.scq, 1, WcOpcode::Send, "send with a bad lkey")?;
    check_aftermath(&mut a, &mut b, &local, exp, &[50])?;
    check_bytes(&rbuf, 0, &[0; 64], "the responder's receive buffer")
}

/// RC send with no receive posted and `rnr_retry` 0.
pub fn rc_rnr_retry_exceeded<P: Provider>(t: &Target) -> CaseResult {
    let exp = expect::get::<P>(t).rnr_retry_exceeded;
    let (da, db) = devs::<P>(t)?;
    let local = da.mr(64, AccessFlags::LOCAL_WRITE)?;
    let opts = PairOpts { a_rnr_retry: 0, ..PairOpts::new(QpType::Rc) };
    let (mut a, mut b) = pair(&da, &db, &opts)?;
    let sgl = [sge(&local, 0, 16)?];
    // SAFETY: `local` is declared before the QPs and so outlives them.
    let res = unsafe { post::<P>(&mut a.qp, &[SendWr::new(1, SendOp::Send, &sgl)]) };
    check_post_outcome(res, exp.requester, &a.scq, 1, WcOpcode::Send, "send without receive")?;
    check_aftermath(&mut a, &mut b, &local, exp, &[])
}

/// RC send larger than the receive buffer.
pub fn rc_send_too_long<P: Provider>(t: &Target) -> CaseResult {
    let exp = expect::get::<P>(t).send_too_long;
    let (da, db) = devs::<P>(t)?;
    let local = da.mr(256, AccessFlags::LOCAL_WRITE)?;
    fill(&local, 0x12)?;
    let rbuf = db.mr(256, AccessFlags::LOCAL_WRITE)?;
    let (mut a, mut b) = pair(&da, &db, &PairOpts::new(QpType::Rc))?;
    let rsgl = [sge(&rbuf, 0, 64)?, sge(&rbuf, 128, 64)?];
    let rwrs = [
        corelink_verbs::RecvWr { wr_id: 50, sgl: &rsgl[..1] },
        corelink_verbs::RecvWr { wr_id: 51, sgl: &rsgl[1..] },
    ];
    // SAFETY: `rbuf` is declared before the QPs and so outlives them.
    unsafe { post_recv::<P>(&mut b.qp, &rwrs) }?;
    let sgl = [sge(&local, 0, 128)?];
    // SAFETY: `local` is declared before the QPs and so outlives them.
    let res = unsafe { post::<P>(&mut a.qp, &[SendWr::new(1, SendOp::Send, &sgl)]) };
    check_post_outcome(res, exp.requester, &a.scq, 1, WcOpcode::Send, "send of 128 bytes")?;
    if let Some(status) = exp.responder_recv {
        let r = poll_one(&b.rcq, "the receive the oversized send consumed")?;
        check_wc(&r, 50, status, WcOpcode::Recv)?;
    }
    let rest: &[u64] = if exp.responder_recv.is_some() { &[51] } else { &[50, 51] };
    check_aftermath(&mut a, &mut b, &local, exp, rest)
}

fn uc_not_allowed<P: Provider>(t: &Target, op: OneSided) -> CaseResult {
    let exp = expect::get::<P>(t).opcode_not_for_transport;
    let (da, db) = devs::<P>(t)?;
    let local = da.mr(64, AccessFlags::LOCAL_WRITE)?;
    let remote = db.mr(64, RW | AccessFlags::REMOTE_ALL)?;
    fill(&remote, 0x21)?;
    let (mut a, mut b) = pair(&da, &db, &PairOpts::new(QpType::Uc))?;
    let sgl = [sge(&local, 0, 8)?];
    let (sop, opcode) = match op {
        OneSided::Read => (SendOp::Read(remote.remote(0)), WcOpcode::RdmaRead),
        _ => (SendOp::FetchAdd { remote: remote.remote(0), add: 1 }, WcOpcode::FetchAdd),
    };
    // SAFETY: `local` is declared before the QPs and so outlives them.
    let res = unsafe { post::<P>(&mut a.qp, &[SendWr::new(1, sop, &sgl)]) };
    check_post_outcome(res, exp, &a.scq, 1, opcode, &format!("{op:?} on UC"))?;
    check_aftermath(&mut a, &mut b, &local, not_for_transport(exp), &[])?;
    check_bytes(&remote, 0, &pattern(0x21, 64), "target of the request")?;
    check_bytes(&local, 0, &[0; 64], "local buffer of the request")
}

/// The aftermath of a request the transport does not allow, posted with outcome `exp`.
pub(crate) fn not_for_transport(exp: PostOutcome) -> RcFault {
    RcFault {
        requester: exp,
        requester_to_err: matches!(exp, PostOutcome::Completes(s) if !s.is_success()),
        responder_recv: None,
        responder_to_err: false,
    }
}

/// RDMA read posted on a UC QP: see `expect.opcode_not_for_transport`; nothing is read.
pub fn uc_read_not_allowed<P: Provider>(t: &Target) -> CaseResult {
    uc_not_allowed::<P>(t, OneSided::Read)
}

/// Atomic posted on a UC QP: see `expect.opcode_not_for_transport`; the target is untouched.
pub fn uc_atomic_not_allowed<P: Provider>(t: &Target) -> CaseResult {
    uc_not_allowed::<P>(t, OneSided::Atomic)
}

/// A send CQ of depth 4 overrun by twice its depth in completions raises the expected async
/// event naming that CQ.
pub fn cq_overrun_async_event<P: Provider>(t: &Target) -> CaseResult {
    let exp = expect::get::<P>(t).cq_overrun_event;
    let (da, db) = devs::<P>(t)?;
    let local = da.mr(64, AccessFlags::LOCAL_WRITE)?;
    let remote = db.mr(4096, RW)?;
    let opts = PairOpts { a_send_cq_depth: 4, ..PairOpts::new(QpType::Rc) };
    let (mut a, _b) = pair(&da, &db, &opts)?;
    let depth = a.scq.depth();
    ensure!(depth >= 4, "a CQ asked for 4 holds {depth}");
    let n = 2 * depth as usize;
    ensure!(
        n <= opts.cap.max_send_wr as usize,
        "the CQ of 4 was rounded up to {depth}: too deep to overrun"
    );
    let sgl = [sge(&local, 0, 8)?];
    let wrs: Vec<_> =
        (0..n).map(|i| SendWr::new(i as u64, SendOp::Write(remote.remote(8 * i)), &sgl)).collect();
    // SAFETY: `local` is declared before the QPs and so outlives them (the completions are
    // never polled: the point is to overrun the CQ).
    unsafe { post::<P>(&mut a.qp, &wrs) }.ctx("post_send")?;
    let handle = a.scq.handle();
    let deadline = Instant::now() + POLL_DEADLINE.min(QUIET_PERIOD * 5);
    let mut seen = Vec::new();
    loop {
        match da.ctx.poll_async_event().ctx("poll_async_event")? {
            Some(ev) if ev.element == AsyncElement::Cq(handle) => {
                ensure_eq!(Some(ev.kind), exp, "async event on the overrun CQ");
                return Ok(());
            }
            Some(ev) => seen.push(ev),
            None if Instant::now() > deadline => break,
            None => std::thread::sleep(std::time::Duration::from_millis(1)),
        }
    }
    ensure!(exp.is_none(), "no async event for CQ {handle:#x} after {n} completions into a CQ of {depth}; other events: {seen:?}");
    Ok(())
}
