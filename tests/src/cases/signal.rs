//! Selective signalling (`sq_sig_all = false`): only signalled requests and errors complete.

use corelink_verbs::{
    AccessFlags, Mr, Provider, QpType, RemoteAddr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus,
};

use crate::cases::errors::BAD_KEY;
use crate::expect::{self, PostOutcome};
use crate::harness::*;
use crate::{CaseResult, Target};

const N: usize = 10;
const LEN: usize = 32;

fn unsignalled_pair<P: Provider>(da: &Dev<P>, db: &Dev<P>) -> Result<(Side<P>, Side<P>), String> {
    pair(da, db, &PairOpts { sq_sig_all: false, ..PairOpts::new(QpType::Rc) })
}

/// 9 unsignalled writes then 1 signalled, in one post: exactly one completion, and all ten
/// writes landed.
pub fn unsignalled_writes_one_completion<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let src = da.mr(N * LEN, AccessFlags::LOCAL_WRITE)?;
    let dst = db.mr(N * LEN, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let data = fill(&src, 10)?;
    let (mut a, _b) = unsignalled_pair(&da, &db)?;
    let sgls = (0..N)
        .map(|i| sge(&src, i * LEN, LEN as u32).map(|s| [s]))
        .collect::<Result<Vec<_>, _>>()?;
    let wrs: Vec<SendWr<'_, P>> = (0..N)
        .map(|i| {
            let flags = if i == N - 1 { SendFlags::SIGNALED } else { SendFlags::empty() };
            SendWr::new(i as u64, SendOp::Write(dst.remote(i * LEN)), &sgls[i]).flags(flags)
        })
        .collect();
    // SAFETY: `src` outlives the signalled completion, polled below, which covers the others.
    unsafe { post::<P>(&mut a.qp, &wrs) }.ctx("post_send")?;
    let wc = poll_one(&a.scq, "the signalled write")?;
    check_wc(&wc, (N - 1) as u64, WcStatus::Success, WcOpcode::RdmaWrite)?;
    expect_quiet(&a.scq, "unsignalled successes complete silently")?;
    check_bytes(&dst, 0, &data, "all ten writes")
}

/// Unsignalled writes where the 4th has a bad rkey: it still completes (in error), every later
/// one flushes with its wr_id (the signalled last one and the unsignalled ones before it), the
/// three before it land silently, and nothing after it lands.
pub fn unsignalled_error_then_flush<P: Provider>(t: &Target) -> CaseResult {
    const BAD: usize = 3;
    let exp = expect::get::<P>(t);
    let (da, db) = devs::<P>(t)?;
    let src = da.mr(N * LEN, AccessFlags::LOCAL_WRITE)?;
    let dst = db.mr(N * LEN, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let data = fill(&src, 11)?;
    let (mut a, _b) = unsignalled_pair(&da, &db)?;
    let sgls = (0..N)
        .map(|i| sge(&src, i * LEN, LEN as u32).map(|s| [s]))
        .collect::<Result<Vec<_>, _>>()?;
    let wrs: Vec<SendWr<'_, P>> = (0..N)
        .map(|i| {
            let flags = if i == N - 1 { SendFlags::SIGNALED } else { SendFlags::empty() };
            let remote = if i == BAD {
                RemoteAddr { addr: dst.addr() + (i * LEN) as u64, rkey: BAD_KEY }
            } else {
                dst.remote(i * LEN)
            };
            SendWr::new(i as u64, SendOp::Write(remote), &sgls[i]).flags(flags)
        })
        .collect();
    // SAFETY: `src` is declared before the QPs and so outlives them.
    unsafe { post::<P>(&mut a.qp, &wrs) }.ctx("post_send")?;
    let wcs = poll(&a.scq, N - BAD, "the error and the flushes")?;
    let PostOutcome::Completes(status) = exp.remote_access.requester else {
        return Err("the table expects a refusal at post for a bad rkey".into());
    };
    check_wc(&wcs[0], BAD as u64, status, WcOpcode::RdmaWrite)?;
    for (k, wc) in wcs[1..].iter().enumerate() {
        check_wc(wc, (BAD + 1 + k) as u64, exp.flush, WcOpcode::RdmaWrite)?;
    }
    expect_quiet(&a.scq, "one completion per request")?;
    check_bytes(&dst, 0, &data[..BAD * LEN], "the writes before the failed one")?;
    check_bytes(
        &dst,
        BAD * LEN,
        &vec![0; (N - BAD) * LEN],
        "the failed and flushed writes' targets",
    )
}
