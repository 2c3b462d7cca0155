//! RDMA read over RC.

use corelink_verbs::{AccessFlags, Mr, Provider, QpType, SendOp, SendWr, WcOpcode, WcStatus};

use crate::harness::*;
use crate::{ensure_eq, CaseResult, Target};

/// RC read: the local buffer receives the remote bytes; byte_len is the length read.
pub fn rc_read<P: Provider>(t: &Target) -> CaseResult {
    const LEN: usize = 700;
    let (da, db) = devs::<P>(t)?;
    let local = da.mr(2048, AccessFlags::LOCAL_WRITE)?;
    let remote = db.mr(4096, AccessFlags::REMOTE_READ)?;
    let (mut a, _b) = pair(&da, &db, &PairOpts::new(QpType::Rc))?;
    let data = fill(&remote, 3)?;
    let sgl = [sge(&local, 100, LEN as u32)?];
    let op = SendOp::Read(remote.remote(1000));
    // SAFETY: `local` outlives the completion, which `exec` polls.
    let wc = unsafe { exec::<P>(&mut a.qp, &a.scq, SendWr::new(4, op, &sgl)) }?;
    check_wc(&wc, 4, WcStatus::Success, WcOpcode::RdmaRead)?;
    ensure_eq!(wc.byte_len, LEN as u32, "read completion's byte_len");
    check_bytes(&local, 0, &[0; 100], "local buffer before the scatter entry")?;
    check_bytes(&local, 100, &data[1000..1000 + LEN], "read data")?;
    check_bytes(&local, 100 + LEN, &vec![0; 2048 - 100 - LEN], "local buffer after the entry")?;
    check_bytes(&remote, 0, &data, "read target (unchanged)")
}
