//! Compare-and-swap and fetch-and-add over RC.

use corelink_verbs::{
    AccessFlags, Mr, Provider, QpType, RemoteAddr, SendOp, SendWr, WcOpcode, WcStatus,
};

use crate::harness::*;
use crate::{ensure_eq, CaseResult, Target};

const WORD: usize = 16;
const INITIAL: u64 = 0x0102_0304_0506_0708;
const NEIGHBOUR: u64 = 0x5a5a_5a5a_5a5a_5a5a;

/// Runs one atomic on a word holding [`INITIAL`]; returns (old value fetched, word after).
fn atomic<P: Provider>(
    t: &Target,
    op: impl FnOnce(RemoteAddr) -> SendOp<'static, P>,
    opcode: WcOpcode,
) -> Result<(u64, u64), String> {
    let (da, db) = devs::<P>(t)?;
    let result = da.mr(64, AccessFlags::LOCAL_WRITE)?;
    result.write_u64(8, 0xffff_ffff_ffff_ffff).ctx("write_u64")?;
    let target = db.mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)?;
    let (mut a, _b) = pair(&da, &db, &PairOpts::new(QpType::Rc))?;
    for off in (0..64).step_by(8) {
        target.write_u64(off, NEIGHBOUR).ctx("write_u64")?;
    }
    target.write_u64(WORD, INITIAL).ctx("write_u64")?;
    let sgl = [sge(&result, 8, 8)?];
    // SAFETY: `result` outlives the completion, which `exec` polls.
    let wc =
        unsafe { exec::<P>(&mut a.qp, &a.scq, SendWr::new(5, op(target.remote(WORD)), &sgl)) }?;
    check_wc(&wc, 5, WcStatus::Success, opcode)?;
    ensure_eq!(wc.byte_len, 8, "atomic completion's byte_len");
    for off in (0..64).step_by(8).filter(|&o| o != WORD) {
        ensure_eq!(
            target.read_u64(off).ctx("read_u64")?,
            NEIGHBOUR,
            "word at {off} next to the target"
        );
    }
    for off in [0, 16] {
        ensure_eq!(result.read_u64(off).ctx("read_u64")?, 0, "result buffer word at {off}");
    }
    let (old, after) =
        (result.read_u64(8).ctx("read_u64")?, target.read_u64(WORD).ctx("read_u64")?);
    crate::record::atomic_value(old);
    crate::record::memory(&after.to_le_bytes());
    Ok((old, after))
}

/// Compare-and-swap whose compare value matches: old value back, word swapped.
pub fn rc_cmp_swap_success<P: Provider>(t: &Target) -> CaseResult {
    let swap = 0x1111_2222_3333_4444;
    let op = |remote| SendOp::CompareSwap { remote, compare: INITIAL, swap };
    let (old, after) = atomic::<P>(t, op, WcOpcode::CompSwap)?;
    ensure_eq!(old, INITIAL, "old value");
    ensure_eq!(after, swap, "target word after a matching compare-and-swap");
    Ok(())
}

/// Compare-and-swap whose compare value differs: old value back, word unchanged.
pub fn rc_cmp_swap_mismatch<P: Provider>(t: &Target) -> CaseResult {
    let op = |remote| SendOp::CompareSwap { remote, compare: INITIAL + 1, swap: 7 };
    let (old, after) = atomic::<P>(t, op, WcOpcode::CompSwap)?;
    ensure_eq!(old, INITIAL, "old value");
    ensure_eq!(after, INITIAL, "target word after a mismatching compare-and-swap");
    Ok(())
}

/// Fetch-and-add: old value back, word increased (wrapping).
pub fn rc_fetch_add<P: Provider>(t: &Target) -> CaseResult {
    let add = 0xff00_0000_0000_0001;
    let op = |remote| SendOp::FetchAdd { remote, add };
    let (old, after) = atomic::<P>(t, op, WcOpcode::FetchAdd)?;
    ensure_eq!(old, INITIAL, "old value");
    ensure_eq!(after, INITIAL.wrapping_add(add), "target word after fetch-and-add");
    Ok(())
}
