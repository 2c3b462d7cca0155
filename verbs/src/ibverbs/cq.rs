//! Completion queues: creation and polling.

use std::mem::MaybeUninit;
use std::sync::Arc;

use rdma_sys::{ibv_cq, ibv_wc};

use super::context::CtxInner;
use super::convert::{errno_err, last_err, ret_err, wc_from_ibv};
use crate::error::{Error, Result};
use crate::provider::Cq;
use crate::types::Wc;

/// Completions read from the device per `ibv_poll_cq` call (on the stack).
const POLL_BATCH: usize = 32;

/// The shared state of a CQ.
pub(crate) struct CqInner {
    pub(crate) cq: *mut ibv_cq,
    depth: u32,
    pub(crate) ctx: Arc<CtxInner>,
}

// SAFETY: libibverbs CQs may be polled and destroyed from any thread (providers lock).
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq; every QP using it holds an Arc, so none is left.
        let ret = unsafe { rdma_sys::ibv_destroy_cq(self.cq) };
        if ret != 0 {
            eprintln!("corelink ibverbs: ibv_destroy_cq failed: {ret}");
        }
    }
}

/// A completion queue.
pub struct IbvCq {
    pub(crate) inner: Arc<CqInner>,
}

impl std::fmt::Debug for IbvCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvCq").field("depth", &self.inner.depth).finish()
    }
}

impl IbvCq {
    pub(crate) fn create(ctx: &Arc<CtxInner>, depth: u32) -> Result<IbvCq> {
        let cqe = match libc::c_int::try_from(depth) {
            Ok(v) if v > 0 => v,
            _ => return Err(Error::CreateCq { depth, source: errno_err(libc::EINVAL) }),
        };
        // SAFETY: the context is open; no completion channel, vector 0.
        let cq = unsafe {
            rdma_sys::ibv_create_cq(ctx.ctx, cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0)
        };
        if cq.is_null() {
            return Err(Error::CreateCq { depth, source: last_err() });
        }
        // SAFETY: a live CQ; `cqe` is the depth the device actually gave (at least `depth`).
        let actual = u32::try_from(unsafe { (*cq).cqe }).unwrap_or(depth).max(depth);
        Ok(IbvCq { inner: Arc::new(CqInner { cq, depth: actual, ctx: ctx.clone() }) })
    }

    /// The underlying `ibv_cq` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut ibv_cq {
        self.inner.cq
    }
}

impl Cq for IbvCq {
    /// Polls up to 32 completions at a time into a stack array and converts them into `out`,
    /// until `out` is full or the CQ is empty. No allocation. Inlined into the caller's loop
    /// (a call and its return are dear in the emulated guest).
    #[inline(always)]
    fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        let mut buf: [MaybeUninit<ibv_wc>; POLL_BATCH] =
            [const { MaybeUninit::uninit() }; POLL_BATCH];
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(POLL_BATCH);
            // SAFETY: the CQ is live; `buf` has room for `want <= POLL_BATCH` entries.
            let n = unsafe {
                rdma_sys::ibv_poll_cq(self.inner.cq, want as libc::c_int, buf.as_mut_ptr().cast())
            };
            if n < 0 {
                return Err(Error::PollCq(ret_err(n)));
            }
            let n = (n as usize).min(want);
            // SAFETY: ibv_poll_cq initialised the first `n` entries.
            #[cfg(feature = "guest-stamps")]
            unsafe {
                stamp_poll(&buf[..n])
            };
            for (slot, raw) in out[done..done + n].iter_mut().zip(&buf[..n]) {
                // SAFETY: ibv_poll_cq initialised the first `n` entries.
                *slot = wc_from_ibv(unsafe { raw.assume_init_ref() }, self.inner.ctx.wc_inv_flag);
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    fn depth(&self) -> u32 {
        self.inner.depth
    }

    /// The CQ's address, as async events name it.
    fn handle(&self) -> u64 {
        self.inner.cq as u64
    }
}

/// Stamps a poll that found `wcs` (`benches/guest-stamps.sh`): empty, or with a receive's
/// completion, a send queue's, or both.
///
/// # Safety
/// Every entry of `wcs` is initialised (by ibv_poll_cq).
#[cfg(feature = "guest-stamps")]
#[inline(always)]
unsafe fn stamp_poll(wcs: &[MaybeUninit<ibv_wc>]) {
    use crate::stamps::{stamp, Point};
    // SAFETY: initialised, as the caller promises.
    let recv = |w: &MaybeUninit<ibv_wc>| unsafe { w.assume_init_ref() }.opcode
        & rdma_sys::ibv_wc_opcode::IBV_WC_RECV
        != 0;
    if wcs.is_empty() {
        stamp(Point::Empty);
    }
    if wcs.iter().any(recv) {
        stamp(Point::Recv);
    }
    if !wcs.iter().all(recv) {
        stamp(Point::Send);
    }
}
