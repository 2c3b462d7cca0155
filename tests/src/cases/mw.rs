//! Type 2 memory windows: bind a window on part of a region, access through it, revoke it.
//!
//! Side A owns the region and the window and binds it on its QP; side B, its peer, reads and
//! writes through the window's rkey.

use corelink_verbs::{
    AccessFlags, Mr, Mw, Pd, Provider, QpType, RecvWr, RemoteAddr, SendOp, SendWr, WcOpcode,
    WcStatus,
};

use crate::cases::errors::check_aftermath;
use crate::expect::{self, PostOutcome};
use crate::harness::*;
use crate::{ensure, ensure_eq, CaseResult, Target};

const WIN_OFF: usize = 1024;
const WIN_LEN: usize = 1024;

/// Region, window and the pair, with A's region filled and B's local buffer ready.
///
/// Fields drop in order: the window first (a bound type 2 window holds its QP: on rxe,
/// destroying the QP first waits about 50 s for it), then the QPs, then what they name.
struct Setup<P: Provider> {
    mw: P::Mw,
    a: Side<P>,
    b: Side<P>,
    region: P::Mr,
    abuf: P::Mr,
    blocal: P::Mr,
    before: Vec<u8>,
    exp: expect::Expect,
    _da: Dev<P>,
    _db: Dev<P>,
}

impl<P: Provider> Setup<P> {
    fn new(t: &Target) -> Result<Setup<P>, String> {
        let (da, db) = devs::<P>(t)?;
        let region = da.mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
        let before = fill(&region, 0x42)?;
        let abuf = da.mr(128, AccessFlags::LOCAL_WRITE)?;
        let blocal = db.mr(4096, AccessFlags::LOCAL_WRITE)?;
        fill(&blocal, 0x17)?;
        let mw = da.pd.alloc_mw().ctx("alloc_mw")?;
        let (mut a, b) = pair(&da, &db, &PairOpts::new(QpType::Rc))?;
        let rsgl = [sge(&abuf, 0, 64)?, sge(&abuf, 64, 64)?];
        let rwrs = [RecvWr { wr_id: 50, sgl: &rsgl[..1] }, RecvWr { wr_id: 51, sgl: &rsgl[1..] }];
        // SAFETY: `abuf` is a field after the QPs, so it is dropped after them.
        unsafe { post_recv::<P>(&mut a.qp, &rwrs) }?;
        let exp = expect::get::<P>(t);
        Ok(Setup { mw, a, b, region, abuf, blocal, before, exp, _da: da, _db: db })
    }

    /// Binds the window to [WIN_OFF, WIN_OFF + WIN_LEN) of the region with `access`; returns
    /// the window's base as B addresses it.
    fn bind(&mut self, access: AccessFlags) -> Result<RemoteAddr, String> {
        let op = SendOp::BindMw {
            mw: &self.mw,
            mr: &self.region,
            addr: self.region.addr() + WIN_OFF as u64,
            len: WIN_LEN as u64,
            access,
        };
        // SAFETY: a bind names no buffer; the region and window outlive the completion.
        let wc = unsafe { exec::<P>(&mut self.a.qp, &self.a.scq, SendWr::new(1, op, &[])) }?;
        check_wc(&wc, 1, WcStatus::Success, WcOpcode::BindMw)?;
        let rkey = self.mw.rkey();
        ensure!(rkey != self.region.rkey(), "the window's rkey {rkey:#x} is the region's");
        Ok(RemoteAddr { addr: self.region.addr() + WIN_OFF as u64, rkey })
    }

    /// B reads (`write == false`) or writes `len` bytes at `remote` from/to `blocal[off..]`.
    fn peer(
        &mut self,
        write: bool,
        remote: RemoteAddr,
        off: usize,
        len: u32,
        wr_id: u64,
    ) -> Result<corelink_verbs::Wc, String> {
        let sgl = [sge(&self.blocal, off, len)?];
        let op = if write { SendOp::Write(remote) } else { SendOp::Read(remote) };
        // SAFETY: `blocal` is a field of `self`, which outlives the completion `exec` polls.
        unsafe { exec::<P>(&mut self.b.qp, &self.b.scq, SendWr::new(wr_id, op, &sgl)) }
    }

    /// B's failed access: status, aftermath (B requester, A responder), region untouched.
    fn check_refused(&mut self, wc: &corelink_verbs::Wc, what: &str) -> CaseResult {
        self.check_refused_with(wc, what, &[50, 51])
    }

    /// [`Setup::check_refused`] with A's receives `a_recvs` still posted.
    fn check_refused_with(
        &mut self,
        wc: &corelink_verbs::Wc,
        what: &str,
        a_recvs: &[u64],
    ) -> CaseResult {
        let exp = self.exp.remote_access;
        let PostOutcome::Completes(status) = exp.requester else {
            return Err(format!(
                "{what}: the table expects a refusal at post for remote access errors"
            ));
        };
        check_wc(wc, wc.wr_id, status, WcOpcode::RdmaWrite).map_err(|e| format!("{what}: {e}"))?;
        check_aftermath(&mut self.b, &mut self.a, &self.blocal, exp, a_recvs)?;
        Ok(())
    }
}

/// Bind a window on a sub-range (completion `BindMw`); the peer reads and writes inside it,
/// including its last byte, through the window's rkey.
pub fn mw_bind_access_inside<P: Provider>(t: &Target) -> CaseResult {
    let mut s = Setup::<P>::new(t)?;
    let win = s.bind(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE)?;
    let wc = s.peer(false, win, 0, 256, 2)?;
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::RdmaRead)?;
    check_bytes(&s.blocal, 0, &s.before[WIN_OFF..WIN_OFF + 256], "read through the window")?;
    let wc = s.peer(false, win.offset(WIN_LEN as u64 - 64), 256, 64, 3)?;
    check_wc(&wc, 3, WcStatus::Success, WcOpcode::RdmaRead)?;
    check_bytes(
        &s.blocal,
        256,
        &s.before[WIN_OFF + WIN_LEN - 64..WIN_OFF + WIN_LEN],
        "read of the window's end",
    )?;
    let wc = s.peer(true, win.offset(512), 1024, 128, 4)?;
    check_wc(&wc, 4, WcStatus::Success, WcOpcode::RdmaWrite)?;
    let mut want = s.before.clone();
    want[WIN_OFF + 512..WIN_OFF + 640].copy_from_slice(&pattern(0x17, 4096)[1024..1152]);
    check_bytes(&s.region, 0, &want, "region after a write through the window")
}

/// The peer writes across the window's end (inside the region, outside the window): refused,
/// or, where `expect.mw_bounds_enforced` is false, written as if to the region.
pub fn mw_access_outside_range<P: Provider>(t: &Target) -> CaseResult {
    let mut s = Setup::<P>::new(t)?;
    let win = s.bind(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE)?;
    let wc = s.peer(true, win.offset(WIN_LEN as u64 - 8), 0, 16, 2)?;
    if !s.exp.mw_bounds_enforced {
        crate::record::unsupported(
            "this device does not enforce a memory window's bounds (rxe 6.1 checks the range \
             against the window's region only); checked that the write lands instead",
        );
        check_wc(&wc, 2, WcStatus::Success, WcOpcode::RdmaWrite)?;
        let mut want = s.before.clone();
        want[WIN_OFF + WIN_LEN - 8..WIN_OFF + WIN_LEN + 8].copy_from_slice(&pattern(0x17, 16));
        return check_bytes(&s.region, 0, &want, "region after a write across the window's end");
    }
    s.check_refused(&wc, "write across the window's end")?;
    check_bytes(&s.region, 0, &s.before, "region after a refused write")
}

/// LOCAL_INV revokes the window (completion `LocalInv`); the peer's access with the old rkey
/// then fails.
pub fn mw_local_inv_revokes<P: Provider>(t: &Target) -> CaseResult {
    let mut s = Setup::<P>::new(t)?;
    let win = s.bind(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE)?;
    let wc = s.peer(false, win, 0, 64, 2)?;
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::RdmaRead)?;
    // SAFETY: a local invalidate names no buffer.
    let wc = unsafe {
        exec::<P>(&mut s.a.qp, &s.a.scq, SendWr::new(3, SendOp::LocalInv(win.rkey), &[]))
    }?;
    check_wc(&wc, 3, WcStatus::Success, WcOpcode::LocalInv)?;
    let wc = s.peer(true, win, 0, 64, 4)?;
    s.check_refused(&wc, "write through a revoked window")?;
    check_bytes(&s.region, 0, &s.before, "region after a write through a revoked window")
}

/// A window granting only REMOTE_READ: reads pass, a write is refused.
pub fn mw_read_only_refuses_write<P: Provider>(t: &Target) -> CaseResult {
    let mut s = Setup::<P>::new(t)?;
    let win = s.bind(AccessFlags::REMOTE_READ)?;
    let wc = s.peer(false, win, 0, 64, 2)?;
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::RdmaRead)?;
    let wc = s.peer(true, win, 0, 64, 3)?;
    s.check_refused(&wc, "write through a read-only window")?;
    check_bytes(&s.region, 0, &s.before, "region after a write through a read-only window")
}

/// SEND_WITH_INV from the peer names the window's rkey: A's receive completes with the payload
/// and the rkey in `invalidated_rkey`, and the window is revoked: the peer's write through it
/// then fails and the region is untouched.
pub fn mw_send_with_inv_revokes<P: Provider>(t: &Target) -> CaseResult {
    let mut s = Setup::<P>::new(t)?;
    let win = s.bind(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE)?;
    let wc = s.peer(false, win, 0, 64, 2)?;
    check_wc(&wc, 2, WcStatus::Success, WcOpcode::RdmaRead)?;
    // (B's buffer from 2048 on still holds its own pattern: the read above landed at 0.)
    let sgl = [sge(&s.blocal, 2048, 32)?];
    let wr = SendWr::new(3, SendOp::SendWithInv(win.rkey), &sgl);
    // SAFETY: `blocal` is a field of `s`, which outlives the completion `exec` polls.
    let wc = unsafe { exec::<P>(&mut s.b.qp, &s.b.scq, wr) }?;
    check_wc(&wc, 3, WcStatus::Success, WcOpcode::Send)?;
    let r = poll_one(&s.a.rcq, "the receive of the send-with-invalidate")?;
    check_wc(&r, 50, WcStatus::Success, WcOpcode::Recv)?;
    ensure_eq!(r.byte_len, 32, "byte_len of the send-with-invalidate's receive");
    ensure_eq!(r.invalidated_rkey, Some(win.rkey), "the receive's invalidated rkey");
    ensure_eq!(r.imm, None, "the receive's immediate");
    check_bytes(&s.abuf, 0, &pattern(0x17, 4096)[2048..2080], "the received payload")?;
    let wc = s.peer(true, win, 0, 64, 4)?;
    s.check_refused_with(&wc, "write through a window invalidated by a send", &[51])?;
    check_bytes(&s.region, 0, &s.before, "region after a write through an invalidated window")
}
