//! The `soft` provider: a userspace RDMA device with the semantics of a real one, for hosts
//! without an RDMA NIC.
//!
//! Every context opened in a process is a port on one in-process fabric. The requester's post
//! executes a work request the way both NICs would: one-sided operations check the key and
//! copy to or from the target's registered memory (the target's CPU takes no part), atomics
//! use 64-bit atomic instructions on the target word, sends consume the target's next receive
//! and complete on both CQs. What a NIC does later (RNR retries after the timer, flushes after
//! an error) happens in the requester's next poll of its send CQ.
//!
//! Semantics follow Soft-RoCE (rxe): the statuses, which side goes to ERR, what UC and UD lose
//! silently. See `tests/` for the conformance suite that holds both providers to them.

mod cm;
mod context;
mod cq;
mod exec;
mod fabric;
pub mod faults;
mod mem;
mod port;
mod qp;
mod req;
mod shm;
mod wire;

pub use cm::{
    HalfOpen, SoftAccepting, SoftCmWaiter, SoftConnRequest, SoftConnecting, SoftConnection,
    SoftListener, MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA,
};
pub use context::SoftContext;
pub use exec::direct_accesses;
pub use port::{default_fabric, ACK_TIMEOUT, FABRIC_ENV};
#[doc(hidden)]
pub use wire::decode_frames;

pub use cq::SoftCq;
pub use mem::{SoftAh, SoftMr, SoftMw, SoftPd};
pub use qp::{SoftQp, SoftSrq};

use crate::error::{Error, Result};
use crate::provider::{Provider, QpInitAttr};
use crate::types::{AccessFlags, AhAttr, DeviceInfo, SrqAttr};

/// The device limits of `soft`, in one place.
pub mod limits {
    use crate::types::Mtu;

    /// Scatter/gather entries per work request.
    pub const MAX_SGE: usize = 16;
    /// Bytes a send may carry inline.
    pub const MAX_INLINE: usize = 256;
    /// Depth of a work queue or SRQ.
    pub const MAX_QP_WR: u32 = 16384;
    /// Depth of a CQ.
    pub const MAX_CQE: u32 = 1 << 20;
    /// Outstanding reads/atomics per QP.
    pub const MAX_RD_ATOMIC: u32 = 128;
    /// The port's MTU (UD messages are at most this long): 1024, what rxe derives from a
    /// standard 1500-byte Ethernet netdev, so that UD behaves the same on both.
    pub const MTU: Mtu = Mtu::Mtu1024;
    /// Largest message.
    pub const MAX_MSG: u32 = 1 << 31;
    /// Scatter entries a posted receive keeps in place (a longer list is copied to the heap):
    /// at least `QpCap::default().max_recv_sge`, so that receives within the default caps never
    /// allocate, and few, so that a receive queue element stays small (88 bytes; room for
    /// `MAX_SGE` entries made it 272, copied at every push and pop).
    pub const RECV_SGES_IN_PLACE: usize = 4;

    const _: () = assert!(MAX_INLINE <= u16::MAX as usize && MAX_SGE > 0);
    const _: () = assert!(RECV_SGES_IN_PLACE >= 1 && RECV_SGES_IN_PLACE <= MAX_SGE);
}

/// The name of the one `soft` device.
pub const DEVICE_NAME: &str = "soft0";

/// The `soft` provider.
#[derive(Debug, Clone, Copy, Default)]
pub struct Soft;

impl Provider for Soft {
    type Context = SoftContext;
    type Pd = SoftPd;
    type Mr = SoftMr;
    type Mw = SoftMw;
    type Cq = SoftCq;
    type Srq = SoftSrq;
    type Qp = SoftQp;
    type Ah = SoftAh;
    type Listener = SoftListener;
    type ConnRequest = SoftConnRequest;
    type Accepting = SoftAccepting;
    type Connecting = SoftConnecting;
    type Connection = SoftConnection;
    type CmWaiter = SoftCmWaiter;

    const NAME: &'static str = "soft";

    fn devices() -> Result<Vec<DeviceInfo>> {
        Ok(vec![DeviceInfo { name: DEVICE_NAME.to_owned(), guid: 0x50f7 }])
    }

    fn cm_waiter() -> Result<SoftCmWaiter> {
        Ok(SoftCmWaiter::new())
    }

    fn open(name: &str) -> Result<SoftContext> {
        if name != DEVICE_NAME {
            return Err(Error::NoSuchDevice {
                name: name.to_owned(),
                available: DEVICE_NAME.to_owned(),
            });
        }
        faults::global()?; // (a bad CORELINK_SOFT_FAULTS is the open's error)
        port::check()?; // (and a fabric that CORELINK_SOFT_FABRIC names but cannot be joined)
        Ok(SoftContext::new(name))
    }
}

impl crate::Pd<Soft> for SoftPd {
    fn register(&self, len: usize, access: AccessFlags) -> Result<SoftMr> {
        SoftPd::check_access(len, access)?;
        // On a named fabric the memory goes in a shared segment, which peers' one-sided
        // requests reach directly (`shm`); zeroed as a fresh file is.
        if let Some(seg) = shm::Segment::new(len) {
            let addr = seg.ptr() as u64;
            return Ok(self.make_mr(addr, len, access, mem::Backing::Shared { _segment: seg }));
        }
        let pages =
            crate::pages::Pages::new(len).map_err(|source| Error::RegMr { len, access, source })?;
        let addr = pages.as_ptr() as u64;
        Ok(self.make_mr(addr, len, access, mem::Backing::Pages { _pages: pages }))
    }

    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<SoftMr> {
        SoftPd::check_access(len, access)?;
        if addr.is_null() {
            return Err(Error::RegMr {
                len,
                access,
                source: crate::error::invalid("null address"),
            });
        }
        Ok(self.make_mr(addr as u64, len, access, mem::Backing::Caller))
    }

    fn alloc_mw(&self) -> Result<SoftMw> {
        Ok(SoftMw::new(self))
    }

    fn create_srq(&self, attr: &SrqAttr) -> Result<SoftSrq> {
        SoftSrq::new(self, attr)
    }

    fn create_qp(&self, attr: &QpInitAttr<'_, Soft>) -> Result<SoftQp> {
        SoftQp::new(self, attr)
    }

    fn create_ah(&self, attr: &AhAttr) -> Result<SoftAh> {
        SoftAh::new(self, attr)
    }
}

#[cfg(test)]
mod tests;
