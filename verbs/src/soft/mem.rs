//! Protection domains, memory regions, memory windows and address handles of `soft`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::context::CtxShared;
use super::fabric::{Fabric, KeyEntry};
use crate::error::{invalid, Error, Result};
use crate::types::{AccessFlags, AhAttr, Gid, WcStatus};

/// A region's memory and rights, as the fabric sees them. The memory lives as long as this
/// does (work requests in flight and windows hold it).
#[derive(Debug)]
pub(crate) struct MrShared {
    pub(crate) pd: u64,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: AccessFlags,
    /// Where the memory comes from (held for its release with the region).
    _backing: Backing,
}

/// A region's memory.
#[derive(Debug)]
pub(crate) enum Backing {
    /// The caller's (`register_raw`).
    Caller,
    /// Allocated by the region (unmapped when the region's last holder lets go).
    Pages {
        /// (held for its unmapping)
        _pages: crate::pages::Pages,
    },
    /// Allocated by the region in a shared segment (on a named fabric: `soft::shm`).
    Shared {
        /// (held for its unmapping)
        _segment: super::shm::Segment,
    },
}

impl MrShared {
    /// Pointer to `len` bytes at virtual address `addr`, if inside the region.
    #[inline]
    pub(crate) fn ptr_for(&self, addr: u64, len: u64) -> Option<*mut u8> {
        let off = addr.checked_sub(self.addr)?;
        (off.checked_add(len)? <= self.len).then(|| (self.addr + off) as *mut u8)
    }
}

/// A protection domain of `soft`.
#[derive(Debug, Clone)]
pub struct SoftPd {
    pub(crate) id: u64,
    pub(crate) ctx: Arc<CtxShared>,
}

impl SoftPd {
    pub(crate) fn new(ctx: Arc<CtxShared>) -> Self {
        SoftPd { id: Fabric::get().next_id(), ctx }
    }

    pub(crate) fn make_mr(
        &self,
        addr: u64,
        len: usize,
        access: AccessFlags,
        backing: Backing,
    ) -> SoftMr {
        let len = len as u64;
        let shared = Arc::new(MrShared { pd: self.id, addr, len, access, _backing: backing });
        let key = Fabric::get().keys_mut(|t| t.insert(KeyEntry::Mr(shared.clone())));
        // Memory in a shared segment that peers may touch is published for their direct path.
        if access.intersects(AccessFlags::REMOTE_ALL) {
            if let Some((seg, seg_off)) = super::shm::segment_of(addr, len) {
                let pd = self.id;
                let view = super::shm::KeyView { access, pd, addr, len, seg, seg_off };
                super::shm::publish_key(key, view);
            }
        }
        SoftMr { shared, key, _pd: self.clone() }
    }

    pub(crate) fn check_access(len: usize, access: AccessFlags) -> Result<()> {
        if !access.is_valid_for_mr() {
            return Err(Error::RegMr {
                len,
                access,
                source: invalid("REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE"),
            });
        }
        Ok(())
    }
}

/// A registered memory region of `soft`; lkey and rkey are the same key.
#[derive(Debug)]
pub struct SoftMr {
    pub(crate) shared: Arc<MrShared>,
    key: u32,
    _pd: SoftPd,
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        super::shm::unpublish_key(self.key);
        Fabric::get().keys_mut(|t| t.remove(self.key));
    }
}

impl crate::Mr for SoftMr {
    fn addr(&self) -> u64 {
        self.shared.addr
    }
    fn len(&self) -> usize {
        self.shared.len as usize
    }
    fn lkey(&self) -> u32 {
        self.key
    }
    /// The key, or 0 when the region grants no remote right (as rxe gives it).
    fn rkey(&self) -> u32 {
        if self.shared.access.intersects(AccessFlags::REMOTE_ALL) {
            self.key
        } else {
            0
        }
    }
    fn access(&self) -> AccessFlags {
        self.shared.access
    }
}

/// A window's current binding.
#[derive(Debug)]
pub(crate) struct MwBinding {
    mr: Arc<MrShared>,
    addr: u64,
    len: u64,
    access: AccessFlags,
    qpn: u32,
}

/// A memory window as the fabric sees it.
#[derive(Debug)]
pub(crate) struct MwShared {
    pub(crate) pd: u64,
    pub(crate) rkey: AtomicU32,
    binding: Mutex<Option<MwBinding>>,
}

impl MwShared {
    pub(crate) fn new(pd: u64) -> Self {
        MwShared { pd, rkey: AtomicU32::new(0), binding: Mutex::new(None) }
    }

    fn binding(&self) -> std::sync::MutexGuard<'_, Option<MwBinding>> {
        self.binding.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remote access through the window by target QP `qpn` of PD `pd`.
    pub(crate) fn ptr_for(
        &self,
        addr: u64,
        len: u64,
        need: AccessFlags,
        pd: u64,
        qpn: u32,
    ) -> Result<*mut u8, WcStatus> {
        let b = self.binding();
        let Some(b) = b.as_ref() else { return Err(WcStatus::RemAccessErr) };
        let inside =
            addr >= b.addr && addr.checked_add(len).is_some_and(|end| end <= b.addr + b.len);
        if self.pd != pd || b.qpn != qpn || !b.access.contains(need) || !inside {
            return Err(WcStatus::RemAccessErr);
        }
        b.mr.ptr_for(addr, len).ok_or(WcStatus::RemAccessErr)
    }

    /// Binds the window (type 2, through QP `qpn` of PD `pd`) and returns its new rkey.
    pub(crate) fn bind(
        self: &Arc<Self>,
        mr: &Arc<MrShared>,
        addr: u64,
        len: u64,
        access: AccessFlags,
        pd: u64,
        qpn: u32,
    ) -> Result<u32, WcStatus> {
        let inside = len > 0 && mr.ptr_for(addr, len).is_some();
        let rights_ok = access.difference(AccessFlags::REMOTE_ALL).is_empty()
            && (!access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
                || mr.access.contains(AccessFlags::LOCAL_WRITE));
        if self.pd != pd
            || mr.pd != pd
            || !mr.access.contains(AccessFlags::MW_BIND)
            || !inside
            || !rights_ok
        {
            return Err(WcStatus::MwBindErr);
        }
        if self.binding().is_some() {
            return Err(WcStatus::MwBindErr); // a type 2 window must be invalidated first
        }
        let old = self.rkey.load(Ordering::Acquire);
        let new = Fabric::get().keys_mut(|t| t.regenerate(old)).ok_or(WcStatus::MwBindErr)?;
        *self.binding() = Some(MwBinding { mr: mr.clone(), addr, len, access, qpn });
        self.rkey.store(new, Ordering::Release);
        Ok(new)
    }

    /// Invalidates the window for a send-with-invalidate that reached QP `qpn` of PD `pd`: a
    /// type 2 window is revoked remotely only through the QP it is bound through.
    pub(crate) fn invalidate_remote(&self, rkey: u32, pd: u64, qpn: u32) -> Result<(), WcStatus> {
        if self.pd != pd || self.rkey.load(Ordering::Acquire) != rkey {
            return Err(WcStatus::RemInvReqErr);
        }
        let mut b = self.binding();
        match b.as_ref() {
            Some(bound) if bound.qpn == qpn => {
                *b = None;
                Ok(())
            }
            _ => Err(WcStatus::RemInvReqErr),
        }
    }

    /// Invalidates the window if `rkey` is its current key.
    pub(crate) fn invalidate(&self, rkey: u32, pd: u64) -> Result<(), WcStatus> {
        if self.pd != pd || self.rkey.load(Ordering::Acquire) != rkey {
            return Err(WcStatus::LocQpOpErr);
        }
        let mut b = self.binding();
        if b.take().is_none() {
            return Err(WcStatus::LocQpOpErr);
        }
        Ok(())
    }
}

/// A type 2 memory window of `soft`.
#[derive(Debug)]
pub struct SoftMw {
    pub(crate) shared: Arc<MwShared>,
    _pd: SoftPd,
}

impl SoftMw {
    pub(crate) fn new(pd: &SoftPd) -> Self {
        let shared = Arc::new(MwShared::new(pd.id));
        let key = Fabric::get().keys_mut(|t| t.insert(KeyEntry::Mw(shared.clone())));
        shared.rkey.store(key, Ordering::Release);
        SoftMw { shared, _pd: pd.clone() }
    }
}

impl Drop for SoftMw {
    fn drop(&mut self) {
        let key = self.shared.rkey.load(Ordering::Acquire);
        Fabric::get().keys_mut(|t| t.remove(key));
    }
}

impl crate::Mw for SoftMw {
    fn rkey(&self) -> u32 {
        self.shared.rkey.load(Ordering::Acquire)
    }
}

/// A UD address handle of `soft`: the destination port's GID.
#[derive(Debug, Clone)]
pub struct SoftAh {
    pub(crate) dgid: Gid,
    pub(crate) pd: u64,
}

impl SoftAh {
    pub(crate) fn new(pd: &SoftPd, attr: &AhAttr) -> Result<Self> {
        if attr.port != 1 {
            return Err(Error::CreateAh(invalid(format!("port {} does not exist", attr.port))));
        }
        Ok(SoftAh { dgid: attr.dgid, pd: pd.id })
    }
}
