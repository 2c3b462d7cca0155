//! RDMA write and write-with-immediate over RC and UC.

use corelink_verbs::{
    AccessFlags, Mr, Provider, Qp, QpType, RemoteAddr, SendOp, SendWr, WcOpcode, WcStatus,
};

use crate::expect;
use crate::harness::*;
use crate::{ensure_eq, CaseResult, Target};

const LEN: usize = 500;
const OFF: usize = 64;
const IMM: u32 = 0x0102_0304;

fn write<P: Provider>(t: &Target, qp_type: QpType, imm: Option<u32>) -> CaseResult {
    let exp = expect::get::<P>(t);
    let (da, db) = devs::<P>(t)?;
    let src = da.mr(LEN, AccessFlags::LOCAL_WRITE)?;
    let dst = db.mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let rbuf = db.mr(64, AccessFlags::LOCAL_WRITE)?;
    let (mut a, mut b) = pair(&da, &db, &PairOpts::new(qp_type))?;
    let data = fill(&src, 2)?;
    let before = fill(&dst, 0x80)?;
    // A receive is posted either way: a plain write must leave it alone.
    // SAFETY: `rbuf` lives until the end of the case.
    unsafe { recv::<P>(&mut b.qp, 9, &rbuf, 64) }?;
    let remote = dst.remote(OFF);
    let op = imm.map_or(SendOp::Write(remote), |i| SendOp::WriteWithImm(remote, i));
    let sgl = [sge(&src, 0, LEN as u32)?];
    // SAFETY: `src` outlives the completion, which `exec` polls.
    let wc = unsafe { exec::<P>(&mut a.qp, &a.scq, SendWr::new(1, op, &sgl)) }?;
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::RdmaWrite)?;
    ensure_eq!(wc.qp_num, a.qp.qp_num(), "initiator completion's qp_num");
    match imm {
        Some(i) => {
            let r = poll_one(&b.rcq, "the receive consumed by the write-with-immediate")?;
            check_wc(&r, 9, WcStatus::Success, WcOpcode::RecvRdmaWithImm)?;
            ensure_eq!(r.imm, Some(i), "immediate");
            ensure_eq!(r.grh, exp.rc_uc_recv_grh, "grh flag of the write-with-immediate's receive");
            let want_len = if exp.write_with_imm_byte_len_is_write_len { LEN as u32 } else { 0 };
            ensure_eq!(r.byte_len, want_len, "byte_len of the write-with-immediate's receive");
            check_bytes(&rbuf, 0, &[0; 64], "receive buffer of a write-with-immediate")?;
        }
        None => expect_quiet(&b.rcq, "a plain write consumes no receive")?,
    }
    check_bytes(&dst, 0, &before[..OFF], "target before the written range")?;
    check_bytes(&dst, OFF, &data, "written range")?;
    check_bytes(&dst, OFF + LEN, &before[OFF + LEN..], "target after the written range")
}

/// RC write: the target range holds the data, the bytes around it are untouched.
pub fn rc_write<P: Provider>(t: &Target) -> CaseResult {
    write::<P>(t, QpType::Rc, None)
}

/// RC write with immediate: data, plus a receive completion with the immediate.
pub fn rc_write_with_imm<P: Provider>(t: &Target) -> CaseResult {
    write::<P>(t, QpType::Rc, Some(IMM))
}

/// UC write.
pub fn uc_write<P: Provider>(t: &Target) -> CaseResult {
    write::<P>(t, QpType::Uc, None)
}

/// UC write with immediate.
pub fn uc_write_with_imm<P: Provider>(t: &Target) -> CaseResult {
    write::<P>(t, QpType::Uc, Some(IMM))
}

/// RC zero-length write to no memory at all (address and key 0): it succeeds and touches
/// nothing, since a responder checks no key for a zero-length access (IB C9-88; rxe's
/// `check_rkey`); the QP stays usable. The engine's keepalive probe is this write.
pub fn rc_zero_length_write_without_key<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let src = da.mr(64, AccessFlags::LOCAL_WRITE)?;
    let dst = db.mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let rbuf = db.mr(64, AccessFlags::LOCAL_WRITE)?;
    let (mut a, mut b) = pair(&da, &db, &PairOpts::new(QpType::Rc))?;
    let before = fill(&dst, 0x80)?;
    // SAFETY: `rbuf` lives until the end of the case.
    unsafe { recv::<P>(&mut b.qp, 9, &rbuf, 64) }?;
    let sgl = [sge(&src, 0, 0)?];
    let op = SendOp::Write(RemoteAddr { addr: 0, rkey: 0 });
    // SAFETY: `src` outlives the completion, which `exec` polls.
    let wc = unsafe { exec::<P>(&mut a.qp, &a.scq, SendWr::new(1, op, &sgl)) }?;
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::RdmaWrite)?;
    ensure_eq!(wc.byte_len, 0, "byte_len of a zero-length write");
    expect_quiet(&b.rcq, "a zero-length write consumes no receive")?;
    let data = fill(&src, 3)?;
    let sgl = [sge(&src, 0, 64)?];
    // SAFETY: as above.
    let wc = unsafe {
        exec::<P>(&mut a.qp, &a.scq, SendWr::new(2, SendOp::Write(dst.remote(0)), &sgl))
    }?;
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::RdmaWrite)?;
    check_bytes(&dst, 0, &data, "a write after the zero-length one")?;
    check_bytes(&dst, 64, &before[64..], "the rest of the target")
}
