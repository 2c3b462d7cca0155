//! Work queues and QP states: a full receive queue refuses the next receive at post, a QP
//! refuses a transition the state machine lacks (and stays where it was), and a send that meets
//! no receive waits (RNR, retried without end) until the responder posts one.

use corelink_verbs::{
    AccessFlags, Error, Provider, Qp, QpAttr, QpCap, QpState, QpType, RecvWr, SendOp, SendWr,
    WcOpcode, WcStatus,
};

use crate::harness::*;
use crate::{ensure, ensure_eq, CaseResult, Target};

/// Receive slots (16 bytes each) the receive-queue case's buffer has room for.
const RQ_SLOTS: usize = 64;

/// Receives fill an RC receive queue: every one up to the depth the QP reports is taken, and
/// one past the queue's real size is refused at post (`PostRecv` at index 0). (A device may
/// take more than it reports: rxe rounds its rings up to a power of two.) No completion
/// appears for the refused receive, the QP stays in RTS, and the queued receives still serve
/// sends, first posted first.
pub fn rq_overflow_refused<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let local = da.mr(64, AccessFlags::LOCAL_WRITE)?;
    let want = fill(&local, 0x5a)?;
    let rbuf = db.mr(16 * RQ_SLOTS, AccessFlags::LOCAL_WRITE)?;
    let cap = QpCap { max_recv_wr: 8, ..QpCap::default() };
    let (mut a, mut b) = pair(&da, &db, &PairOpts { cap, ..PairOpts::new(QpType::Rc) })?;
    let depth = b.qp.cap().max_recv_wr as usize;
    ensure!((8..RQ_SLOTS).contains(&depth), "max_recv_wr of 8 asked, {depth} given");
    let mut taken = 0;
    while taken < RQ_SLOTS {
        let sgl = [sge(&rbuf, 16 * taken, 16)?];
        let wr = [RecvWr { wr_id: 100 + taken as u64, sgl: &sgl }];
        // SAFETY: `rbuf` is declared before the QPs and so outlives them.
        match unsafe { b.qp.post_recv(&wr) } {
            Ok(()) => taken += 1,
            Err(Error::PostRecv { index: 0, .. }) => break,
            Err(e) => return Err(format!("receive {}: {e}, not a refusal at index 0", taken + 1)),
        }
    }
    ensure!(taken >= depth, "only {taken} receives taken by a queue of {depth}");
    ensure!(taken < RQ_SLOTS, "{taken} receives taken by a queue of {depth}: none refused");
    check_state::<P>(&b.qp, QpState::Rts, "the receiver after a refused receive")?;
    for i in 0..2u64 {
        let sgl = [sge(&local, 0, 16)?];
        // SAFETY: `local` is declared before the QPs; `exec` polls the completion.
        let wc = unsafe { exec::<P>(&mut a.qp, &a.scq, SendWr::new(i, SendOp::Send, &sgl)) }?;
        check_wc(&wc, i, WcStatus::Success, WcOpcode::Send)?;
        let r = poll_one(&b.rcq, "a receive of the full queue")?;
        check_wc(&r, 100 + i, WcStatus::Success, WcOpcode::Recv)?;
        ensure_eq!(r.byte_len, 16, "byte_len of receive {}", 100 + i);
        check_bytes(&rbuf, 16 * i as usize, &want[..16], "a received message")?;
    }
    expect_quiet(&b.rcq, "nothing for the refused receive")
}

/// RESET to RTS and RESET to RTR are not transitions: both are refused and the QP stays in
/// RESET; RESET to INIT then works.
pub fn qp_invalid_transition_refused<P: Provider>(t: &Target) -> CaseResult {
    let (da, _db) = devs::<P>(t)?;
    let (scq, rcq) = (da.cq(16)?, da.cq(16)?);
    let mut qp = da.qp(QpType::Rc, &scq, &rcq, None, QpCap::default(), false)?;
    for to in [QpState::Rts, QpState::Rtr] {
        let res = qp.modify(&QpAttr { state: to, ..da.attr() });
        ensure!(
            matches!(res, Err(Error::ModifyQp { .. })),
            "RESET -> {to:?}: {res:?}, not a refusal"
        );
        check_state::<P>(&qp, QpState::Reset, &format!("after a refused RESET -> {to:?}"))?;
    }
    qp.modify(&QpAttr { state: QpState::Init, ..da.attr() }).ctx("RESET -> INIT")?;
    check_state::<P>(&qp, QpState::Init, "after RESET -> INIT")
}

/// An RC send posted before the responder has a receive waits (RNR NAKs, retried without end
/// with `rnr_retry` 7): nothing completes; once a receive is posted, the send and the receive
/// both complete, with the bytes.
pub fn rc_rnr_wait_then_receive<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let local = da.mr(64, AccessFlags::LOCAL_WRITE)?;
    let want = fill(&local, 0x33)?;
    let rbuf = db.mr(64, AccessFlags::LOCAL_WRITE)?;
    let opts = PairOpts { a_rnr_retry: 7, ..PairOpts::new(QpType::Rc) };
    let (mut a, mut b) = pair(&da, &db, &opts)?;
    let sgl = [sge(&local, 0, 32)?];
    // SAFETY: `local` is declared before the QPs and so outlives them.
    unsafe { post::<P>(&mut a.qp, &[SendWr::new(1, SendOp::Send, &sgl)]) }.ctx("post_send")?;
    expect_quiet(&a.scq, "a send waiting for a receive")?;
    let rsgl = [sge(&rbuf, 0, 64)?];
    // SAFETY: `rbuf` is declared before the QPs and so outlives them.
    unsafe { post_recv::<P>(&mut b.qp, &[RecvWr { wr_id: 2, sgl: &rsgl }]) }?;
    let s = poll_one(&a.scq, "the send, once a receive was posted")?;
    check_wc(&s, 1, WcStatus::Success, WcOpcode::Send)?;
    let r = poll_one(&b.rcq, "the receive")?;
    check_wc(&r, 2, WcStatus::Success, WcOpcode::Recv)?;
    ensure_eq!(r.byte_len, 32, "byte_len of the receive");
    check_bytes(&rbuf, 0, &want[..32], "the received bytes")
}

/// A send posted to an RC QP before it reaches RTS (in INIT, then in RTR) is refused at post
/// (`PostSend` at index 0) and not queued: once the QP is in RTS nothing completes for it and
/// the peer receives nothing, and the next send arrives alone. (rxe's own post answers EINVAL
/// and yet keeps such a request in its ring, to run once the QP is up; corelink refuses it
/// before the device sees it, on every provider.)
pub fn rc_send_before_rts_refused<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let local = da.mr(64, AccessFlags::LOCAL_WRITE)?;
    let want = fill(&local, 0x3c)?;
    let rbuf = db.mr(128, AccessFlags::LOCAL_WRITE)?;
    let (ascq, arcq, bscq, brcq) = (da.cq(16)?, da.cq(16)?, db.cq(16)?, db.cq(16)?);
    let mut a = da.qp(QpType::Rc, &ascq, &arcq, None, QpCap::default(), true)?;
    let mut b = db.qp(QpType::Rc, &bscq, &brcq, None, QpCap::default(), true)?;
    let (ea, eb) = (da.endpoint(&a)?, db.endpoint(&b)?);
    b.connect_to(ea, &db.attr()).ctx("connect B to A")?;
    let rsgl = [sge(&rbuf, 0, 64)?, sge(&rbuf, 64, 64)?];
    let rwrs = [RecvWr { wr_id: 7, sgl: &rsgl[..1] }, RecvWr { wr_id: 8, sgl: &rsgl[1..] }];
    // SAFETY: `rbuf` is declared before the QPs and so outlives them.
    unsafe { post_recv::<P>(&mut b, &rwrs) }?;
    let sgl = [sge(&local, 0, 16)?];
    for state in [QpState::Init, QpState::Rtr] {
        a.modify(&QpAttr { state, dest: eb, ..da.attr() }).ctx(&format!("A to {state:?}"))?;
        // SAFETY: `local` is declared before the QPs and so outlives them.
        match unsafe { post::<P>(&mut a, &[SendWr::new(1, SendOp::Send, &sgl)]) } {
            Err(e) if is_post_send_refusal(&e, 0) => {}
            other => return Err(format!("a send in {state:?}: {other:?}, not a refusal")),
        }
    }
    a.modify(&QpAttr { state: QpState::Rts, dest: eb, ..da.attr() }).ctx("A to RTS")?;
    expect_quiet(&ascq, "no completion for the refused sends")?;
    expect_quiet(&brcq, "nothing received of the refused sends")?;
    // SAFETY: as above; `exec` polls the completion.
    let wc = unsafe { exec::<P>(&mut a, &ascq, SendWr::new(2, SendOp::Send, &sgl)) }?;
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::Send)?;
    let r = poll_one(&brcq, "the receive of the send posted in RTS")?;
    check_wc(&r, 7, WcStatus::Success, WcOpcode::Recv)?;
    ensure_eq!(r.byte_len, 16, "byte_len of the one message");
    check_bytes(&rbuf, 0, &want[..16], "the one message")?;
    expect_quiet(&brcq, "one message received")?;
    expect_quiet(&ascq, "one send completed")
}
