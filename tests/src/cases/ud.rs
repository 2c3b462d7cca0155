//! UD: send and send-with-immediate through an address handle, the GRH area, qkeys, the MTU
//! limit, drops, and the opcodes UD refuses.

use corelink_verbs::{
    AccessFlags, AhAttr, Mr, Pd, Provider, Qp, QpType, SendOp, SendWr, UdDest, WcOpcode, WcStatus,
    DEFAULT_QKEY, GRH_BYTES,
};

use crate::cases::errors::{check_aftermath, check_post_outcome, not_for_transport};
use crate::expect::{self, PostOutcome};
use crate::harness::*;
use crate::{ensure, ensure_eq, CaseResult, Target};

const GRH: usize = GRH_BYTES as usize;

/// A UD pair, A's address handle to B, a send buffer on A and a receive buffer on B.
/// (Fields drop in order: QPs, then what they name, then the devices.)
struct Ud<P: Provider> {
    a: Side<P>,
    b: Side<P>,
    ah: P::Ah,
    src: P::Mr,
    dst: P::Mr,
    exp: expect::Expect,
    da: Dev<P>,
    db: Dev<P>,
}

impl<P: Provider> Ud<P> {
    fn new(t: &Target) -> Result<Ud<P>, String> {
        let (da, db) = devs::<P>(t)?;
        let attr = AhAttr {
            port: da.port,
            dlid: db.lid,
            dgid: db.gid()?,
            sgid_index: da.gid_index as u8,
            hop_limit: 64,
        };
        let ah = da.pd.create_ah(&attr).ctx("create_ah")?;
        let len = da.mtu.bytes() as usize * 2;
        let src = da.mr(len, AccessFlags::LOCAL_WRITE)?;
        let dst = db.mr(len + GRH, AccessFlags::LOCAL_WRITE)?;
        let (a, b) = pair(&da, &db, &PairOpts::new(QpType::Ud))?;
        Ok(Ud { a, b, ah, src, dst, exp: expect::get::<P>(t), da, db })
    }

    /// Posts a receive for the whole of `dst` on B.
    fn post_recv(&mut self, wr_id: u64) -> CaseResult {
        let len = self.dst.len() as u32;
        // SAFETY: `dst` lives as long as the QP (both are fields of `self`).
        unsafe { recv::<P>(&mut self.b.qp, wr_id, &self.dst, len) }
    }

    /// Sends `len` bytes of `src` (filled with `pattern(seed)`) to B with `qkey`; returns what
    /// the post said and, if posted, the sender's completion.
    fn send(
        &mut self,
        wr_id: u64,
        seed: u8,
        len: usize,
        op: SendOp<'_, P>,
        qkey: u32,
    ) -> Result<(corelink_verbs::Result<()>, Vec<u8>), String> {
        let data = pattern(seed, len);
        self.src.write_at(0, &data).ctx("write_at")?;
        let sgl = [sge(&self.src, 0, len as u32)?];
        let dest = UdDest { ah: &self.ah, qpn: self.b.qp.qp_num(), qkey };
        let wr = SendWr::new(wr_id, op, &sgl).to(dest);
        // SAFETY: `src` is a field of `self` and so outlives the completion polled by callers.
        let res = unsafe { post::<P>(&mut self.a.qp, &[wr]) };
        Ok((res, data))
    }

    /// Sends and checks that the sender's completion is a success.
    fn send_ok(
        &mut self,
        wr_id: u64,
        seed: u8,
        len: usize,
        op: SendOp<'_, P>,
        qkey: u32,
    ) -> Result<Vec<u8>, String> {
        let (res, data) = self.send(wr_id, seed, len, op, qkey)?;
        res.ctx("post_send UD")?;
        let wc = poll_one(&self.a.scq, "the UD send's completion")?;
        check_wc(&wc, wr_id, WcStatus::Success, WcOpcode::Send)?;
        Ok(data)
    }

    /// Polls B's receive and checks it holds `data` after the GRH area, from A.
    fn check_recv(&self, wr_id: u64, data: &[u8], imm: Option<u32>) -> CaseResult {
        let exp = self.exp;
        let r = poll_one(&self.b.rcq, "the UD receive")?;
        check_wc(&r, wr_id, WcStatus::Success, WcOpcode::Recv)?;
        ensure_eq!(r.byte_len, (data.len() + GRH) as u32, "UD receive byte_len (payload + GRH)");
        ensure_eq!(r.src_qp, self.a.qp.qp_num(), "UD receive src_qp");
        ensure_eq!(r.qp_num, self.b.qp.qp_num(), "UD receive qp_num");
        ensure_eq!(r.imm, imm, "UD receive immediate");
        ensure_eq!(r.grh, exp.ud_recv_grh, "UD receive grh flag");
        check_bytes(&self.dst, GRH, data, "UD payload after the GRH area")
    }
}

fn ud_two_sided<P: Provider>(t: &Target, imm: Option<u32>) -> CaseResult {
    let mut u = Ud::<P>::new(t)?;
    u.post_recv(3)?;
    let op = imm.map_or(SendOp::Send, SendOp::SendWithImm);
    let data = u.send_ok(1, 4, 200, op, DEFAULT_QKEY)?;
    u.check_recv(3, &data, imm)
}

/// UD send: payload after the 40-byte GRH area, byte_len = payload + 40, src_qp = sender.
pub fn ud_send<P: Provider>(t: &Target) -> CaseResult {
    ud_two_sided::<P>(t, None)
}

/// UD send with immediate.
pub fn ud_send_with_imm<P: Provider>(t: &Target) -> CaseResult {
    ud_two_sided::<P>(t, Some(0xcafe_f00d))
}

/// A UD send with the wrong qkey is dropped (the sender still succeeds); a later good one
/// takes the receive.
pub fn ud_wrong_qkey_dropped<P: Provider>(t: &Target) -> CaseResult {
    let mut u = Ud::<P>::new(t)?;
    u.post_recv(3)?;
    u.send_ok(1, 5, 100, SendOp::Send, DEFAULT_QKEY ^ 0x0f0f_0f0f)?;
    expect_quiet(&u.b.rcq, "a UD send with the wrong qkey is dropped")?;
    let data = u.send_ok(2, 6, 120, SendOp::Send, DEFAULT_QKEY)?;
    u.check_recv(3, &data, None)
}

/// A UD send larger than the MTU: see `expect.ud_larger_than_mtu`; a later good one takes the
/// receive.
pub fn ud_larger_than_mtu<P: Provider>(t: &Target) -> CaseResult {
    let exp = expect::get::<P>(t);
    let mut u = Ud::<P>::new(t)?;
    let mtu = u.da.mtu.bytes() as usize;
    u.post_recv(3)?;
    let (res, data) = u.send(1, 7, mtu + 1, SendOp::Send, DEFAULT_QKEY)?;
    match exp.ud_larger_than_mtu {
        PostOutcome::Refused => {
            ensure!(
                matches!(&res, Err(e) if is_post_send_refusal(e, 0)),
                "UD send of MTU+1 bytes: expected a refusal at post, got {res:?}"
            );
            return Ok(());
        }
        PostOutcome::Completes(status) => {
            res.ctx("post_send of MTU+1 bytes")?;
            let wc = poll_one(&u.a.scq, "the oversized UD send's completion")?;
            check_wc(&wc, 1, status, WcOpcode::Send)?;
            if !status.is_success() {
                return Ok(()); // the QP may be in SQE/ERR now
            }
        }
    }
    if exp.ud_larger_than_mtu_delivered {
        return u.check_recv(3, &data, None);
    }
    expect_quiet(&u.b.rcq, "a UD send larger than the MTU is not delivered")?;
    let data = u.send_ok(2, 8, mtu, SendOp::Send, DEFAULT_QKEY)?;
    u.check_recv(3, &data, None)
}

/// A UD send with no receive posted is dropped; the sender succeeds; a receive posted later
/// gets only the next message.
pub fn ud_no_recv_dropped<P: Provider>(t: &Target) -> CaseResult {
    let mut u = Ud::<P>::new(t)?;
    u.send_ok(1, 9, 64, SendOp::Send, DEFAULT_QKEY)?;
    expect_quiet(&u.b.rcq, "no receive posted")?;
    u.post_recv(3)?;
    expect_quiet(&u.b.rcq, "the dropped message is not delivered to a later receive")?;
    let data = u.send_ok(2, 10, 64, SendOp::Send, DEFAULT_QKEY)?;
    u.check_recv(3, &data, None)
}

/// An RDMA write posted on a UD QP: see `expect.opcode_not_for_transport`; nothing lands.
pub fn ud_write_not_allowed<P: Provider>(t: &Target) -> CaseResult {
    let exp = expect::get::<P>(t).opcode_not_for_transport;
    let mut u = Ud::<P>::new(t)?;
    let remote = u.db.mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let (res, _) = u.send(1, 11, 16, SendOp::Write(remote.remote(0)), DEFAULT_QKEY)?;
    check_post_outcome(res, exp, &u.a.scq, 1, WcOpcode::RdmaWrite, "write on UD")?;
    check_aftermath(&mut u.a, &mut u.b, &u.src, not_for_transport(exp), &[])?;
    check_bytes(&remote, 0, &[0; 64], "target of a write posted on UD")
}
