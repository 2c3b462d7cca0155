//! Shared receive queues.

use corelink_verbs::{
    AccessFlags, Pd, Provider, Qp, QpCap, QpType, RecvWr, SendOp, SendWr, Srq, SrqAttr, WcOpcode,
    WcStatus,
};

use crate::harness::*;
use crate::{ensure, ensure_eq, CaseResult, Target};

/// Two RC QPs on B share one SRQ; sends from two QPs on A both take receives from it, each
/// completion naming the QP that received.
pub fn srq_shared_by_two_qps<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let src = da.mr(256, AccessFlags::LOCAL_WRITE)?;
    let p = fill(&src, 12)?;
    let rbuf = db.mr(512, AccessFlags::LOCAL_WRITE)?;
    let srq = db.pd.create_srq(&SrqAttr::default()).ctx("create_srq")?;
    // A's QPs' CQs are A's: a QP's CQs come from its PD's context (`Error::ForeignObject`).
    let (scq, rcq) = (da.cq(64)?, da.cq(64)?);
    let (bscq, brcq) = (db.cq(64)?, db.cq(64)?);
    let cap = QpCap::default();
    let mut qa = Vec::new();
    let mut qb = Vec::new();
    for _ in 0..2 {
        let mut x = da.qp(QpType::Rc, &scq, &rcq, None, cap, true)?;
        let mut y = db.qp(QpType::Rc, &bscq, &brcq, Some(&srq), cap, true)?;
        let (ex, ey) = (da.endpoint(&x)?, db.endpoint(&y)?);
        x.connect_to(ey, &da.attr()).ctx("connect A")?;
        y.connect_to(ex, &db.attr()).ctx("connect B (SRQ)")?;
        qa.push(x);
        qb.push(y);
    }
    let rsgl = [sge(&rbuf, 0, 256)?, sge(&rbuf, 256, 256)?];
    let rwrs = [RecvWr { wr_id: 10, sgl: &rsgl[..1] }, RecvWr { wr_id: 11, sgl: &rsgl[1..] }];
    // SAFETY: `rbuf` is declared before the SRQ and the QPs and so outlives them.
    unsafe { srq.post_recv(&rwrs) }.ctx("srq post_recv")?;
    let mut taken = Vec::new();
    for (i, q) in qa.iter_mut().enumerate() {
        let sgl = [sge(&src, i * 100, 100)?];
        // SAFETY: `src` outlives the completion, which `exec` polls.
        let wc = unsafe { exec::<P>(q, &scq, SendWr::new(i as u64, SendOp::Send, &sgl)) }?;
        check_wc(&wc, i as u64, WcStatus::Success, WcOpcode::Send)?;
        let r = poll_one(&brcq, &format!("the receive of QP B{i} from the SRQ"))?;
        ensure_eq!(r.status, WcStatus::Success, "status of B{i}'s receive");
        ensure_eq!(r.opcode, WcOpcode::Recv, "opcode of B{i}'s receive");
        ensure_eq!(r.qp_num, qb[i].qp_num(), "qp_num of the SRQ receive completion {i}");
        ensure_eq!(r.byte_len, 100, "byte_len of B{i}'s receive");
        ensure!(r.wr_id == 10 || r.wr_id == 11, "wr_id {} is not one posted to the SRQ", r.wr_id);
        ensure!(!taken.contains(&r.wr_id), "SRQ receive {} completed twice", r.wr_id);
        taken.push(r.wr_id);
        let off = (r.wr_id as usize - 10) * 256;
        check_bytes(&rbuf, off, &p[i * 100..i * 100 + 100], &format!("B{i}'s received data"))?;
    }
    expect_quiet(&brcq, "two sends take two receives")
}
