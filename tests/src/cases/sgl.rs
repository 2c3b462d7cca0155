//! Scatter/gather lists: gathers on send and write, scatters on receive and read, and the
//! per-request SGE limit.

use corelink_verbs::{
    AccessFlags, Mr, Provider, Qp, QpType, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

use crate::cases::errors::check_post_outcome;
use crate::expect::{self, PostOutcome};
use crate::harness::*;
use crate::{ensure_eq, CaseResult, Target};

/// A send gathered from 3 SGEs (in 2 regions) lands in a receive scattered over 2 (in 2
/// regions): 256 bytes fill the first, the other 344 the start of the second.
pub fn sgl_send_3_into_2<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let s1 = da.mr(1024, AccessFlags::LOCAL_WRITE)?;
    let s2 = da.mr(1024, AccessFlags::LOCAL_WRITE)?;
    let (p1, p2) = (fill(&s1, 1)?, fill(&s2, 2)?);
    let r1 = db.mr(256, AccessFlags::LOCAL_WRITE)?;
    let r2 = db.mr(1024, AccessFlags::LOCAL_WRITE)?;
    let (mut a, mut b) = pair(&da, &db, &PairOpts::new(QpType::Rc))?;
    let rsgl = [sge(&r1, 0, 256)?, sge(&r2, 0, 1024)?];
    // SAFETY: `r1` and `r2` are declared before the QPs and so outlive them.
    unsafe { post_recv::<P>(&mut b.qp, &[RecvWr { wr_id: 2, sgl: &rsgl }]) }?;
    let ssgl = [sge(&s1, 10, 100)?, sge(&s2, 500, 200)?, sge(&s1, 700, 300)?];
    let want: Vec<u8> = [&p1[10..110], &p2[500..700], &p1[700..1000]].concat();
    // SAFETY: `s1` and `s2` outlive the completion, which `exec` polls.
    let wc = unsafe { exec::<P>(&mut a.qp, &a.scq, SendWr::new(1, SendOp::Send, &ssgl)) }?;
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Send)?;
    let r = poll_one(&b.rcq, "the scattered receive")?;
    check_wc(&r, 2, WcStatus::Success, WcOpcode::Recv)?;
    ensure_eq!(r.byte_len, 600, "byte_len of the scattered receive");
    check_bytes(&r1, 0, &want[..256], "first scatter entry")?;
    check_bytes(&r2, 0, &want[256..], "second scatter entry")?;
    check_bytes(&r2, 344, &[0; 1024 - 344], "second scatter entry past the message")
}

/// A write gathered from 2 SGEs (in 2 regions) lands contiguously.
pub fn sgl_write_gather_2<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let s1 = da.mr(512, AccessFlags::LOCAL_WRITE)?;
    let s2 = da.mr(512, AccessFlags::LOCAL_WRITE)?;
    let (p1, p2) = (fill(&s1, 3)?, fill(&s2, 4)?);
    let dst = db.mr(1024, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let (mut a, _b) = pair(&da, &db, &PairOpts::new(QpType::Rc))?;
    let sgl = [sge(&s1, 0, 200)?, sge(&s2, 100, 300)?];
    let op = SendOp::Write(dst.remote(8));
    // SAFETY: `s1` and `s2` outlive the completion, which `exec` polls.
    let wc = unsafe { exec::<P>(&mut a.qp, &a.scq, SendWr::new(1, op, &sgl)) }?;
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::RdmaWrite)?;
    check_bytes(&dst, 0, &[0; 8], "before the written range")?;
    check_bytes(&dst, 8, &[&p1[..200], &p2[100..400]].concat(), "gathered write")?;
    check_bytes(&dst, 508, &[0; 1024 - 508], "after the written range")
}

/// A read scattered into 2 SGEs (in 2 regions).
pub fn sgl_read_scatter_2<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let l1 = da.mr(256, AccessFlags::LOCAL_WRITE)?;
    let l2 = da.mr(256, AccessFlags::LOCAL_WRITE)?;
    let src = db.mr(1024, AccessFlags::REMOTE_READ)?;
    let data = fill(&src, 5)?;
    let (mut a, _b) = pair(&da, &db, &PairOpts::new(QpType::Rc))?;
    let sgl = [sge(&l1, 0, 100)?, sge(&l2, 50, 150)?];
    let op = SendOp::Read(src.remote(300));
    // SAFETY: `l1` and `l2` outlive the completion, which `exec` polls.
    let wc = unsafe { exec::<P>(&mut a.qp, &a.scq, SendWr::new(1, op, &sgl)) }?;
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::RdmaRead)?;
    ensure_eq!(wc.byte_len, 250, "byte_len of the scattered read");
    check_bytes(&l1, 0, &data[300..400], "first scatter entry")?;
    check_bytes(&l1, 100, &[0; 156], "first region past its entry")?;
    check_bytes(&l2, 0, &[0; 50], "second region before its entry")?;
    check_bytes(&l2, 50, &data[400..550], "second scatter entry")?;
    check_bytes(&l2, 200, &[0; 56], "second region past its entry")
}

/// A send with one SGE more than `max_send_sge`: see `expect.too_many_sges`; the QP stays
/// usable.
pub fn sgl_too_many_sges_refused<P: Provider>(t: &Target) -> CaseResult {
    let exp = expect::get::<P>(t).too_many_sges;
    let (da, db) = devs::<P>(t)?;
    let src = da.mr(4096, AccessFlags::LOCAL_WRITE)?;
    let dst = db.mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let (mut a, _b) = pair(&da, &db, &PairOpts::new(QpType::Rc))?;
    let n = a.qp.cap().max_send_sge as usize + 1;
    let sgl = (0..n).map(|i| sge(&src, i * 8, 8)).collect::<Result<Vec<Sge>, _>>()?;
    let op = SendOp::Write(dst.remote(0));
    // SAFETY: `src` outlives the completion (polled by `check_post_outcome`) or the QP.
    let res = unsafe { post::<P>(&mut a.qp, &[SendWr::new(1, op, &sgl)]) };
    check_post_outcome(
        res,
        exp,
        &a.scq,
        1,
        WcOpcode::RdmaWrite,
        &format!("a write with {n} SGEs"),
    )?;
    if exp == PostOutcome::Refused {
        check_bytes(&dst, 0, &[0; 4096], "target of the refused write")?;
        fill(&src, 6)?;
        let ok = [sge(&src, 0, 16)?];
        // SAFETY: `src` outlives the completion, which `exec` polls.
        let wc = unsafe { exec::<P>(&mut a.qp, &a.scq, SendWr::new(2, op, &ok)) }?;
        check_wc(&wc, 2, WcStatus::Success, WcOpcode::RdmaWrite)?;
        check_bytes(&dst, 0, &pattern(6, 16), "a write after the refused one")?;
    }
    Ok(())
}
