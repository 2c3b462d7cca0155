//! Send and send-with-immediate over RC and UC.

use corelink_verbs::{AccessFlags, Provider, Qp, QpType, SendOp, SendWr, WcOpcode, WcStatus};

use crate::harness::*;
use crate::{ensure_eq, CaseResult, Target};

const LEN: usize = 300;
const RECV_LEN: usize = 1024;
const IMM: u32 = 0xdead_beef;

fn two_sided<P: Provider>(t: &Target, qp_type: QpType, imm: Option<u32>) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let src = da.mr(LEN, AccessFlags::LOCAL_WRITE)?;
    let dst = db.mr(RECV_LEN, AccessFlags::LOCAL_WRITE)?;
    let (mut a, mut b) = pair(&da, &db, &PairOpts::new(qp_type))?;
    let data = fill(&src, 1)?;
    // SAFETY: `dst` lives until the end of the case, after the receive's completion.
    unsafe { recv::<P>(&mut b.qp, 7, &dst, RECV_LEN as u32) }?;
    let op = imm.map_or(SendOp::Send, SendOp::SendWithImm);
    let sgl = [sge(&src, 0, LEN as u32)?];
    // SAFETY: `src` outlives the completion, which `exec` polls.
    let wc = unsafe { exec::<P>(&mut a.qp, &a.scq, SendWr::new(1, op, &sgl)) }?;
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Send)?;
    ensure_eq!(wc.qp_num, a.qp.qp_num(), "sender completion's qp_num");
    let r = poll_one(&b.rcq, "the receive")?;
    check_wc(&r, 7, WcStatus::Success, WcOpcode::Recv)?;
    ensure_eq!(r.byte_len, LEN as u32, "receive byte_len");
    ensure_eq!(r.imm, imm, "receive immediate");
    ensure_eq!(r.invalidated_rkey, None, "receive's invalidated rkey");
    ensure_eq!(r.grh, crate::expect::get::<P>(t).rc_uc_recv_grh, "receive grh flag");
    ensure_eq!(r.qp_num, b.qp.qp_num(), "receive completion's qp_num");
    check_bytes(&dst, 0, &data, "received payload")?;
    check_bytes(&dst, LEN, &[0; RECV_LEN - LEN], "receive buffer past the payload")?;
    expect_quiet(&b.rcq, "one send consumes one receive")
}

/// RC send: payload, byte_len, opcodes, no immediate.
pub fn rc_send<P: Provider>(t: &Target) -> CaseResult {
    two_sided::<P>(t, QpType::Rc, None)
}

/// RC send with immediate: the receive reports it.
pub fn rc_send_with_imm<P: Provider>(t: &Target) -> CaseResult {
    two_sided::<P>(t, QpType::Rc, Some(IMM))
}

/// UC send.
pub fn uc_send<P: Provider>(t: &Target) -> CaseResult {
    two_sided::<P>(t, QpType::Uc, None)
}

/// UC send with immediate.
pub fn uc_send_with_imm<P: Provider>(t: &Target) -> CaseResult {
    two_sided::<P>(t, QpType::Uc, Some(IMM))
}
