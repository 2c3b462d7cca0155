//! Work requests: what [`crate::Qp::post_send`], [`crate::Qp::post_recv`] and
//! [`crate::Srq::post_recv`] take. They borrow their scatter/gather lists and the provider
//! objects they name, so building one allocates nothing.

use std::fmt;

use crate::provider::Provider;
use crate::types::{AccessFlags, RemoteAddr, SendFlags, Sge};

/// The operation of a send work request.
pub enum SendOp<'a, P: Provider> {
    /// SEND: the payload lands in the peer's next receive.
    Send,
    /// SEND_WITH_IMM: a send whose receive completion carries the immediate.
    SendWithImm(u32),
    /// SEND_WITH_INV (RC): a send that also invalidates, at the responder, the memory window
    /// with this rkey (a type 2 window bound through the receiving QP), revoking the peer's
    /// access before the receive completes; the receive completion carries the rkey in
    /// [`crate::Wc::invalidated_rkey`].
    SendWithInv(u32),
    /// RDMA_WRITE to the remote location.
    Write(RemoteAddr),
    /// RDMA_WRITE_WITH_IMM: a write that also consumes a receive and reports the immediate.
    WriteWithImm(RemoteAddr, u32),
    /// RDMA_READ from the remote location into the scatter list.
    Read(RemoteAddr),
    /// ATOMIC_CMP_AND_SWP on the 8-byte remote word; the old value lands in the 8-byte SGE.
    CompareSwap {
        /// The 8-byte-aligned remote word.
        remote: RemoteAddr,
        /// Value expected.
        compare: u64,
        /// Value stored when the word equals `compare`.
        swap: u64,
    },
    /// ATOMIC_FETCH_AND_ADD on the 8-byte remote word; the old value lands in the 8-byte SGE.
    FetchAdd {
        /// The 8-byte-aligned remote word.
        remote: RemoteAddr,
        /// Value added (wrapping).
        add: u64,
    },
    /// BIND_MW: bind a (type 2) memory window to `len` bytes at `addr` inside `mr`, granting
    /// `access`. After the post, `mw.rkey()` is the new key peers use.
    BindMw {
        /// The window.
        mw: &'a P::Mw,
        /// The region it opens onto (registered with `MW_BIND`).
        mr: &'a P::Mr,
        /// First byte (virtual address inside `mr`).
        addr: u64,
        /// Bytes.
        len: u64,
        /// Remote rights the window grants.
        access: AccessFlags,
    },
    /// LOCAL_INV: invalidate the memory window with this rkey (revoke it).
    LocalInv(u32),
}

impl<P: Provider> Clone for SendOp<'_, P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<P: Provider> Copy for SendOp<'_, P> {}

impl<P: Provider> fmt::Debug for SendOp<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendOp::Send => f.write_str("Send"),
            SendOp::SendWithImm(i) => write!(f, "SendWithImm({i:#x})"),
            SendOp::SendWithInv(k) => write!(f, "SendWithInv({k:#x})"),
            SendOp::Write(r) => write!(f, "Write({r:?})"),
            SendOp::WriteWithImm(r, i) => write!(f, "WriteWithImm({r:?}, {i:#x})"),
            SendOp::Read(r) => write!(f, "Read({r:?})"),
            SendOp::CompareSwap { remote, compare, swap } => {
                write!(f, "CompareSwap({remote:?}, {compare:#x} -> {swap:#x})")
            }
            SendOp::FetchAdd { remote, add } => write!(f, "FetchAdd({remote:?}, +{add})"),
            SendOp::BindMw { addr, len, access, .. } => {
                write!(f, "BindMw({addr:#x}+{len}, {access:?})")
            }
            SendOp::LocalInv(rkey) => write!(f, "LocalInv({rkey:#x})"),
        }
    }
}

/// Where a UD send goes: an address handle, the remote QP number and its qkey.
pub struct UdDest<'a, P: Provider> {
    /// Route to the peer's port.
    pub ah: &'a P::Ah,
    /// The peer's QP number.
    pub qpn: u32,
    /// The peer's qkey.
    pub qkey: u32,
}

impl<P: Provider> Clone for UdDest<'_, P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<P: Provider> Copy for UdDest<'_, P> {}

impl<P: Provider> fmt::Debug for UdDest<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdDest").field("qpn", &self.qpn).field("qkey", &self.qkey).finish()
    }
}

/// A send work request.
pub struct SendWr<'a, P: Provider> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp<'a, P>,
    /// The gather list (send, write), scatter list (read) or the 8-byte result buffer (atomics).
    pub sgl: &'a [Sge],
    /// SIGNALED, FENCE, SOLICITED, INLINE.
    pub flags: SendFlags,
    /// The destination, for UD QPs only.
    pub ud: Option<UdDest<'a, P>>,
}

impl<'a, P: Provider> SendWr<'a, P> {
    /// A signalled request with no UD destination.
    pub fn new(wr_id: u64, op: SendOp<'a, P>, sgl: &'a [Sge]) -> Self {
        SendWr { wr_id, op, sgl, flags: SendFlags::SIGNALED, ud: None }
    }

    /// `self` with `flags` instead of its flags.
    pub fn flags(mut self, flags: SendFlags) -> Self {
        self.flags = flags;
        self
    }

    /// `self` sent to a UD destination.
    pub fn to(mut self, dest: UdDest<'a, P>) -> Self {
        self.ud = Some(dest);
        self
    }

    /// Total bytes of the scatter/gather list (saturating).
    pub fn sgl_bytes(&self) -> u64 {
        self.sgl.iter().map(|s| u64::from(s.length)).sum()
    }
}

impl<P: Provider> Clone for SendWr<'_, P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<P: Provider> Copy for SendWr<'_, P> {}

impl<P: Provider> fmt::Debug for SendWr<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendWr")
            .field("wr_id", &self.wr_id)
            .field("op", &self.op)
            .field("sgl", &self.sgl)
            .field("flags", &self.flags)
            .field("ud", &self.ud)
            .finish()
    }
}

/// A receive work request: the buffers an incoming send (or write-with-immediate) fills.
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The scatter list.
    pub sgl: &'a [Sge],
}
