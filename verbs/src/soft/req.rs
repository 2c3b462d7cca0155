//! Send requests as the device sees them: admission (the checks a post makes), the borrowed
//! view a request executes from, and the owned copy kept when it has to wait.
//!
//! A request that runs at once (the common case) is executed straight from the caller's
//! [`SendWr`]: its gather list is read in place and nothing is copied. Only a request that
//! waits (behind an RNR retry, or for its own) is copied into a [`Desc`], holding exactly the
//! SGEs and inline bytes it uses.

use std::sync::Arc;

use super::limits::MAX_INLINE;
use super::mem::{MrShared, MwShared};
use super::qp::QpShared;
use super::Soft;
use crate::error::invalid;
use crate::types::*;
use crate::wr::{SendOp, SendWr};

/// An operation, owned (so that it can wait for its RNR timer).
#[derive(Debug)]
pub(crate) enum Op {
    Send(Option<u32>),
    /// A send that invalidates this rkey at the responder.
    SendInv(u32),
    Write(RemoteAddr, Option<u32>),
    Read(RemoteAddr),
    CompSwap(RemoteAddr, u64, u64),
    FetchAdd(RemoteAddr, u64),
    BindMw {
        mw: Arc<MwShared>,
        mr: Arc<MrShared>,
        addr: u64,
        len: u64,
        access: AccessFlags,
    },
    LocalInv(u32),
}

impl Op {
    pub(crate) fn wc_opcode(&self) -> WcOpcode {
        match self {
            Op::Send(_) | Op::SendInv(_) => WcOpcode::Send,
            Op::Write(..) => WcOpcode::RdmaWrite,
            Op::Read(_) => WcOpcode::RdmaRead,
            Op::CompSwap(..) => WcOpcode::CompSwap,
            Op::FetchAdd(..) => WcOpcode::FetchAdd,
            Op::BindMw { .. } => WcOpcode::BindMw,
            Op::LocalInv(_) => WcOpcode::LocalInv,
        }
    }
}

/// Everything of an admitted request but its gather/scatter list.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) wr_id: u64,
    pub(crate) op: Op,
    /// Bytes of the gather/scatter list (the message length of sends and writes).
    pub(crate) len: u64,
    /// The SGEs are plain pointers to the payload, with no key to check (inline data).
    pub(crate) inline: bool,
    pub(crate) signaled: bool,
    pub(crate) ud: Option<(Gid, u32, u32)>,
}

/// A request waiting in the send queue: its head, and copies of exactly the SGEs it names
/// (for inline requests: of its payload, which the one SGE then points at).
#[derive(Debug)]
pub(crate) struct Desc {
    pub(crate) head: Head,
    pub(crate) sges: Box<[Sge]>,
    /// The inline payload `sges` points into (heap memory: it does not move with `Desc`).
    _inline: Box<[u8]>,
}

impl Desc {
    /// Keeps a request that cannot run now.
    ///
    /// # Safety
    /// When `head.inline`, every SGE's `addr..addr+length` must be readable.
    pub(crate) unsafe fn keep(head: Head, sges: &[Sge]) -> Desc {
        if !head.inline {
            return Desc { head, sges: sges.into(), _inline: Box::default() };
        }
        let mut data = Vec::with_capacity(head.len.min(MAX_INLINE as u64) as usize);
        for s in sges.iter().filter(|s| s.length > 0) {
            // SAFETY: the caller guarantees inline SGEs are readable; their total length was
            // bounded by max_inline_data <= MAX_INLINE at admission.
            data.extend_from_slice(unsafe {
                std::slice::from_raw_parts(s.addr as *const u8, s.length as usize)
            });
        }
        let data = data.into_boxed_slice();
        let sges = match data.len() {
            0 => Box::default(),
            n => Box::new([Sge { addr: data.as_ptr() as u64, length: n as u32, lkey: 0 }]),
        };
        Desc { head, sges, _inline: data }
    }
}

/// Checks a request against the QP's transport, state and limits, and returns what the device
/// keeps of it besides its SGEs.
#[inline(always)]
pub(crate) fn admit(
    qp: &QpShared,
    wr: &SendWr<'_, Soft>,
) -> std::result::Result<Head, std::io::Error> {
    if !qp.is(QpState::Rts) && !qp.is(QpState::Err) {
        let state = qp.state();
        return Err(invalid(format!("the QP is in {state:?}; sends need RTS")));
    }
    // As rdma-core's rxe provider: only a bind on a UD QP is refused here; other opcodes the
    // transport lacks (read or atomics on UC, anything but send on UD) fail at execution with
    // a local QP operation error, as the device's requester finds them.
    if matches!(wr.op, SendOp::BindMw { .. }) && qp.qp_type == QpType::Ud {
        return Err(invalid("memory windows are bound on RC or UC QPs"));
    }
    if wr.sgl.len() > qp.cap.max_send_sge as usize {
        return Err(invalid(format!(
            "{} SGEs, max_send_sge is {}",
            wr.sgl.len(),
            qp.cap.max_send_sge
        )));
    }
    let len = match wr.sgl {
        [s] => u64::from(s.length),
        _ => wr.sgl_bytes(),
    };
    let op = match wr.op {
        SendOp::Send => Op::Send(None),
        SendOp::SendWithImm(imm) => Op::Send(Some(imm)),
        SendOp::SendWithInv(rkey) => Op::SendInv(rkey),
        SendOp::Write(r) => Op::Write(r, None),
        SendOp::WriteWithImm(r, imm) => Op::Write(r, Some(imm)),
        SendOp::Read(r) => Op::Read(r),
        SendOp::CompareSwap { remote, compare, swap } => Op::CompSwap(remote, compare, swap),
        SendOp::FetchAdd { remote, add } => Op::FetchAdd(remote, add),
        SendOp::BindMw { mw, mr, addr, len, access } => {
            Op::BindMw { mw: mw.shared.clone(), mr: mr.shared.clone(), addr, len, access }
        }
        SendOp::LocalInv(rkey) => Op::LocalInv(rkey),
    };
    if let Op::CompSwap(r, ..) | Op::FetchAdd(r, _) = &op {
        if len < 8 || r.addr % 8 != 0 {
            return Err(invalid(
                "atomics need an 8-byte local buffer and an 8-byte aligned remote address",
            ));
        }
    }
    let inline = wr.flags.contains(SendFlags::INLINE);
    if inline {
        if !matches!(op, Op::Send(_) | Op::SendInv(_) | Op::Write(..)) {
            return Err(invalid("only sends and writes may be inline"));
        }
        if len > u64::from(qp.cap.max_inline_data) {
            return Err(invalid(format!(
                "{len} bytes inline, max_inline_data is {}",
                qp.cap.max_inline_data
            )));
        }
    }
    let ud = if qp.qp_type == QpType::Ud {
        let Some(ud) = wr.ud else {
            return Err(invalid("a UD send needs a destination (SendWr::to)"));
        };
        if ud.ah.pd != qp.pd {
            return Err(invalid("the address handle belongs to another protection domain"));
        }
        Some((ud.ah.dgid, ud.qpn, ud.qkey))
    } else {
        None
    };
    Ok(Head {
        wr_id: wr.wr_id,
        op,
        len,
        inline,
        signaled: wr.flags.contains(SendFlags::SIGNALED),
        ud,
    })
}
