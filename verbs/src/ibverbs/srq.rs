//! Shared receive queues (creation; posting is in `post`).

use std::sync::Arc;

use rdma_sys::{ibv_srq, ibv_srq_attr, ibv_srq_init_attr};

use super::convert::last_err;
use super::pd::PdInner;
use super::post;
use crate::error::{Error, Result};
use crate::provider::Srq;
use crate::types::SrqAttr;
use crate::wr::RecvWr;

/// The shared state of an SRQ.
pub(crate) struct SrqInner {
    pub(crate) srq: *mut ibv_srq,
    pub(crate) max_sge: u32,
    pub(crate) pd: Arc<PdInner>,
}

// SAFETY: libibverbs SRQs may be posted to and destroyed from any thread (providers lock).
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_srq; QPs using it hold an Arc, so none is left.
        let ret = unsafe { rdma_sys::ibv_destroy_srq(self.srq) };
        if ret != 0 {
            eprintln!("corelink ibverbs: ibv_destroy_srq failed: {ret}");
        }
    }
}

/// A shared receive queue.
pub struct IbvSrq {
    pub(crate) inner: Arc<SrqInner>,
}

impl std::fmt::Debug for IbvSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvSrq").field("max_sge", &self.inner.max_sge).finish()
    }
}

impl IbvSrq {
    pub(crate) fn create(pd: &Arc<PdInner>, attr: &SrqAttr) -> Result<IbvSrq> {
        let mut init = ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ibv_srq_attr { max_wr: attr.max_wr, max_sge: attr.max_sge, srq_limit: 0 },
        };
        // SAFETY: the PD is live; `init` is a valid attribute block (updated in place).
        let srq = unsafe { rdma_sys::ibv_create_srq(pd.pd, &mut init) };
        if srq.is_null() {
            return Err(Error::CreateSrq { max_wr: attr.max_wr, source: last_err() });
        }
        Ok(IbvSrq {
            inner: Arc::new(SrqInner {
                srq,
                max_sge: init.attr.max_sge.max(attr.max_sge),
                pd: pd.clone(),
            }),
        })
    }

    /// The underlying `ibv_srq` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut ibv_srq {
        self.inner.srq
    }
}

impl Srq for IbvSrq {
    /// Posts in chunks of up to 32 requests built on the stack (the SRQ is shared, so it has
    /// no per-caller scratch space): no allocation and no lock, but a batch larger than 32 is
    /// several doorbells.
    unsafe fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        // SAFETY: forwarded caller contract.
        unsafe { post::srq_post_recv(&self.inner, wrs) }
    }

    /// The SRQ's address, as async events name it.
    fn handle(&self) -> u64 {
        self.inner.srq as u64
    }
}
