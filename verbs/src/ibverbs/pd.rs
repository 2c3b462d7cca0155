//! Protection domains, memory regions, memory windows and address handles.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use rdma_sys::{ibv_ah, ibv_ah_attr, ibv_gid, ibv_global_route, ibv_mr, ibv_mw, ibv_pd};

use super::context::CtxInner;
use super::convert::{access_to_ibv, errno_err, last_err};
use super::qp::IbvQp;
use super::srq::IbvSrq;
use super::Ibverbs;
use crate::error::{Error, Result};
use crate::pages::Pages;
use crate::provider::{Mr, Mw, Pd, QpInitAttr};
use crate::types::{AccessFlags, AhAttr, LinkLayer, SrqAttr};

/// The shared state of a protection domain.
pub(crate) struct PdInner {
    pub(crate) pd: *mut ibv_pd,
    pub(crate) ctx: Arc<CtxInner>,
}

// SAFETY: libibverbs objects may be used from any thread; the pointer is never changed.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd; every child holds an Arc to us, so none is left.
        let ret = unsafe { rdma_sys::ibv_dealloc_pd(self.pd) };
        if ret != 0 {
            eprintln!("corelink ibverbs: ibv_dealloc_pd failed: {ret}");
        }
    }
}

/// A protection domain.
pub struct IbvPd {
    pub(crate) inner: Arc<PdInner>,
}

impl std::fmt::Debug for IbvPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvPd").field("device", &self.inner.ctx.name).finish()
    }
}

impl IbvPd {
    pub(crate) fn alloc(ctx: &Arc<CtxInner>) -> Result<IbvPd> {
        // SAFETY: the context is open.
        let pd = unsafe { rdma_sys::ibv_alloc_pd(ctx.ctx) };
        if pd.is_null() {
            return Err(Error::AllocPd(last_err()));
        }
        Ok(IbvPd { inner: Arc::new(PdInner { pd, ctx: ctx.clone() }) })
    }

    /// The underlying `ibv_pd` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut ibv_pd {
        self.inner.pd
    }

    /// Registers `addr..addr+len`; `owned` (if any) is unmapped after deregistration.
    fn reg(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
        owned: Option<Pages>,
    ) -> Result<IbvMr> {
        // (on a refusal `owned`, unregistered, is unmapped as it drops)
        if !access.is_valid_for_mr() {
            return Err(Error::RegMr { len, access, source: errno_err(libc::EINVAL) });
        }
        // SAFETY: the PD is live; the caller guarantees the range is valid memory.
        let mr = unsafe {
            rdma_sys::ibv_reg_mr(
                self.inner.pd,
                addr.cast(),
                len,
                access_to_ibv(access) as libc::c_int,
            )
        };
        if mr.is_null() {
            let e = last_err();
            return Err(Error::RegMr { len, access, source: e });
        }
        // SAFETY: a registered MR is valid until deregistered.
        let (lkey, rkey, mr_addr) = unsafe { ((*mr).lkey, (*mr).rkey, (*mr).addr as u64) };
        Ok(IbvMr {
            inner: Arc::new(MrInner {
                mr,
                addr: mr_addr,
                len,
                lkey,
                rkey,
                access,
                owned,
                _pd: self.inner.clone(),
            }),
        })
    }
}

impl Pd<Ibverbs> for IbvPd {
    /// Maps `len` bytes rounded up to whole 4 KiB pages, zeroed by the kernel ([`Pages`]), and
    /// registers the first `len`. `len == 0` is refused with
    /// `EINVAL`.
    fn register(&self, len: usize, access: AccessFlags) -> Result<IbvMr> {
        if len == 0 {
            return Err(Error::RegMr { len, access, source: errno_err(libc::EINVAL) });
        }
        let pages = Pages::new(len).map_err(|source| Error::RegMr { len, access, source })?;
        self.reg(pages.as_ptr(), len, access, Some(pages))
    }

    unsafe fn register_raw(&self, addr: *mut u8, len: usize, access: AccessFlags) -> Result<IbvMr> {
        self.reg(addr, len, access, None)
    }

    fn alloc_mw(&self) -> Result<IbvMw> {
        // SAFETY: the PD is live; ibv_alloc_mw reports a missing provider op as EOPNOTSUPP.
        let mw =
            unsafe { rdma_sys::ibv_alloc_mw(self.inner.pd, rdma_sys::ibv_mw_type::IBV_MW_TYPE_2) };
        let mw = match mw {
            Some(p) if !p.is_null() => p,
            _ => return Err(Error::AllocMw(last_err())),
        };
        // SAFETY: a live MW.
        let rkey = unsafe { (*mw).rkey };
        Ok(IbvMw {
            inner: Arc::new(MwInner { mw, rkey: AtomicU32::new(rkey), _pd: self.inner.clone() }),
        })
    }

    fn create_srq(&self, attr: &SrqAttr) -> Result<IbvSrq> {
        IbvSrq::create(&self.inner, attr)
    }

    fn create_qp(&self, attr: &QpInitAttr<'_, Ibverbs>) -> Result<IbvQp> {
        IbvQp::create(&self.inner, attr)
    }

    /// A global (GRH-carrying) handle when the port is Ethernet (RoCE) or no LID is given.
    fn create_ah(&self, attr: &AhAttr) -> Result<IbvAh> {
        let global = attr.dlid == 0
            || self.inner.ctx.link_layer(attr.port).map_err(|e| match e {
                Error::QueryPort { source, .. } => Error::CreateAh(source),
                other => other,
            })? == LinkLayer::Ethernet;
        let mut a = ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ibv_gid { raw: attr.dgid.0 },
                flow_label: 0,
                sgid_index: attr.sgid_index,
                hop_limit: attr.hop_limit,
                traffic_class: 0,
            },
            dlid: attr.dlid,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            is_global: u8::from(global),
            port_num: attr.port,
        };
        // SAFETY: the PD is live; `a` is a valid attribute block.
        let ah = unsafe { rdma_sys::ibv_create_ah(self.inner.pd, &mut a) };
        if ah.is_null() {
            return Err(Error::CreateAh(last_err()));
        }
        Ok(IbvAh { inner: Arc::new(AhInner { ah, _pd: self.inner.clone() }) })
    }
}

/// The shared state of a memory region.
pub(crate) struct MrInner {
    mr: *mut ibv_mr,
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: AccessFlags,
    /// The memory to unmap after deregistration (memory owned by the region).
    owned: Option<Pages>,
    _pd: Arc<PdInner>,
}

// SAFETY: libibverbs MRs may be used from any thread; the memory is only accessed through
// raw copies (`Mr` hands out no references).
unsafe impl Send for MrInner {}
// SAFETY: as above.
unsafe impl Sync for MrInner {}

impl Drop for MrInner {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once.
        let ret = unsafe { rdma_sys::ibv_dereg_mr(self.mr) };
        if ret != 0 {
            eprintln!("corelink ibverbs: ibv_dereg_mr failed: {ret}");
            // Leak the memory rather than unmap pages the device may still reach.
            std::mem::forget(self.owned.take());
        }
        // (else `owned`, no longer registered, is unmapped as it drops)
    }
}

/// A registered memory region.
pub struct IbvMr {
    inner: Arc<MrInner>,
}

impl std::fmt::Debug for IbvMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvMr")
            .field("addr", &format_args!("{:#x}", self.inner.addr))
            .field("len", &self.inner.len)
            .field("lkey", &format_args!("{:#x}", self.inner.lkey))
            .field("rkey", &format_args!("{:#x}", self.inner.rkey))
            .field("access", &self.inner.access)
            .finish()
    }
}

impl IbvMr {
    /// The underlying `ibv_mr` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut ibv_mr {
        self.inner.mr
    }
}

impl Mr for IbvMr {
    fn addr(&self) -> u64 {
        self.inner.addr
    }
    fn len(&self) -> usize {
        self.inner.len
    }
    fn lkey(&self) -> u32 {
        self.inner.lkey
    }
    fn rkey(&self) -> u32 {
        self.inner.rkey
    }
    fn access(&self) -> AccessFlags {
        self.inner.access
    }
}

/// The shared state of a memory window.
pub(crate) struct MwInner {
    mw: *mut ibv_mw,
    /// The rkey of the current (or last posted) binding.
    pub(crate) rkey: AtomicU32,
    _pd: Arc<PdInner>,
}

// SAFETY: libibverbs MWs may be used from any thread; the rkey is atomic.
unsafe impl Send for MwInner {}
// SAFETY: as above.
unsafe impl Sync for MwInner {}

impl Drop for MwInner {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_mw (so the provider has dealloc_mw), freed once.
        let ret = unsafe { rdma_sys::ibv_dealloc_mw(self.mw) };
        if ret != 0 {
            eprintln!("corelink ibverbs: ibv_dealloc_mw failed: {ret}");
        }
    }
}

/// A type 2 memory window. Its rkey changes when a bind is posted: the post computes the next
/// key (`ibv_inc_rkey`) and stores it here, so [`Mw::rkey`] is the key of the latest bind.
pub struct IbvMw {
    pub(crate) inner: Arc<MwInner>,
}

impl std::fmt::Debug for IbvMw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvMw").field("rkey", &format_args!("{:#x}", self.rkey())).finish()
    }
}

impl IbvMw {
    /// The underlying `ibv_mw` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut ibv_mw {
        self.inner.mw
    }
}

impl Mw for IbvMw {
    fn rkey(&self) -> u32 {
        self.inner.rkey.load(Ordering::Acquire)
    }
}

/// The shared state of an address handle.
struct AhInner {
    ah: *mut ibv_ah,
    _pd: Arc<PdInner>,
}

// SAFETY: libibverbs AHs may be used from any thread; the pointer never changes.
unsafe impl Send for AhInner {}
// SAFETY: as above.
unsafe impl Sync for AhInner {}

impl Drop for AhInner {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_ah, destroyed once.
        let ret = unsafe { rdma_sys::ibv_destroy_ah(self.ah) };
        if ret != 0 {
            eprintln!("corelink ibverbs: ibv_destroy_ah failed: {ret}");
        }
    }
}

/// A UD address handle.
pub struct IbvAh {
    inner: Arc<AhInner>,
}

impl std::fmt::Debug for IbvAh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvAh").finish_non_exhaustive()
    }
}

impl IbvAh {
    /// The underlying `ibv_ah` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut ibv_ah {
        self.inner.ah
    }
}
