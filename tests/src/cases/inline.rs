//! Inline sends and writes: the payload is copied at post, needs no lkey, and is bounded by
//! `max_inline_data`.

use corelink_verbs::{
    AccessFlags, Mr, Provider, Qp, QpType, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

use crate::cases::errors::check_post_outcome;
use crate::expect;
use crate::harness::*;
use crate::{ensure, ensure_eq, CaseResult, Target};

const INLINE: SendFlags = SendFlags::SIGNALED.union(SendFlags::INLINE);

/// An SGE over plain (unregistered) memory, as inline requests allow.
fn plain_sge(buf: &[u8]) -> Sge {
    Sge { addr: buf.as_ptr() as u64, length: buf.len() as u32, lkey: 0 }
}

fn inline_len(qp_cap: u32) -> Result<usize, String> {
    ensure!(qp_cap > 0, "the QP reports max_inline_data 0 (64 asked for)");
    Ok(qp_cap.min(48) as usize)
}

/// An inline send from unregistered memory, overwritten right after the post: the receiver
/// gets the bytes as they were at post.
pub fn inline_send_buffer_reusable<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let dst = db.mr(256, AccessFlags::LOCAL_WRITE)?;
    let (mut a, mut b) = pair(&da, &db, &PairOpts::new(QpType::Rc))?;
    let len = inline_len(a.qp.cap().max_inline_data)?;
    // SAFETY: `dst` is declared before the QPs and so outlives them.
    unsafe { recv::<P>(&mut b.qp, 2, &dst, 256) }?;
    let mut buf = pattern(7, len);
    let want = buf.clone();
    let sgl = [plain_sge(&buf)];
    let wr = SendWr::new(1, SendOp::SendWithImm(77), &sgl).flags(INLINE);
    // SAFETY: inline: the payload is copied at post; `buf` outlives the call anyway.
    unsafe { post::<P>(&mut a.qp, &[wr]) }.ctx("post_send inline")?;
    buf.fill(0xff);
    let wc = poll_one(&a.scq, "the inline send")?;
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::Send)?;
    let r = poll_one(&b.rcq, "the receive of the inline send")?;
    check_wc(&r, 2, WcStatus::Success, WcOpcode::Recv)?;
    ensure_eq!(r.byte_len, len as u32, "byte_len");
    ensure_eq!(r.imm, Some(77), "immediate");
    check_bytes(&dst, 0, &want, "inline payload as it was at post")?;
    check_bytes(&dst, len, &vec![0; 256 - len], "receive buffer past the payload")
}

/// An inline write from unregistered memory.
pub fn inline_write<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let dst = db.mr(256, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let (mut a, _b) = pair(&da, &db, &PairOpts::new(QpType::Rc))?;
    let len = inline_len(a.qp.cap().max_inline_data)?;
    let mut buf = pattern(8, len);
    let want = buf.clone();
    let sgl = [plain_sge(&buf)];
    let wr = SendWr::new(1, SendOp::Write(dst.remote(16)), &sgl).flags(INLINE);
    // SAFETY: inline: the payload is copied at post; `buf` outlives the call anyway.
    unsafe { post::<P>(&mut a.qp, &[wr]) }.ctx("post_send inline write")?;
    buf.fill(0xff);
    let wc = poll_one(&a.scq, "the inline write")?;
    check_wc(&wc, 1, WcStatus::Success, WcOpcode::RdmaWrite)?;
    check_bytes(&dst, 0, &[0; 16], "before the written range")?;
    check_bytes(&dst, 16, &want, "inline write as it was at post")?;
    check_bytes(&dst, 16 + len, &vec![0; 240 - len], "after the written range")
}

/// An inline send one byte over `max_inline_data`: see `expect.inline_too_large`.
pub fn inline_too_large_refused<P: Provider>(t: &Target) -> CaseResult {
    let exp = expect::get::<P>(t).inline_too_large;
    let (da, db) = devs::<P>(t)?;
    let dst = db.mr(8192, AccessFlags::LOCAL_WRITE)?;
    let (mut a, mut b) = pair(&da, &db, &PairOpts::new(QpType::Rc))?;
    // SAFETY: `dst` is declared before the QPs and so outlives them.
    unsafe { recv::<P>(&mut b.qp, 2, &dst, 8192) }?;
    let len = a.qp.cap().max_inline_data as usize + 1;
    let buf = pattern(9, len);
    let sgl = [plain_sge(&buf)];
    let wr = SendWr::new(1, SendOp::Send, &sgl).flags(INLINE);
    // SAFETY: inline; `buf` outlives the completion (polled by `check_post_outcome`) anyway.
    let res = unsafe { post::<P>(&mut a.qp, &[wr]) };
    check_post_outcome(
        res,
        exp,
        &a.scq,
        1,
        WcOpcode::Send,
        &format!("an inline send of {len} bytes"),
    )?;
    if exp == expect::PostOutcome::Refused {
        expect_quiet(&b.rcq, "a refused inline send delivers nothing")?;
    }
    Ok(())
}
