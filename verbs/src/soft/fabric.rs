//! The process-wide fabric shared by every `soft` context: the key table (lkeys/rkeys of
//! memory regions and windows), the QP table, and the connection manager's listeners.
//!
//! A key is `index << 8 | generation`: re-using a slot changes the generation byte, so a stale
//! key (a deregistered region's, a window's before its last bind) never resolves.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, Weak};

use super::cm::ListenerShared;
use super::mem::{MrShared, MwShared};
use super::qp::QpShared;
use crate::types::{AccessFlags, WcStatus};

/// What a key names.
#[derive(Debug, Clone)]
pub(crate) enum KeyEntry {
    Mr(Arc<MrShared>),
    Mw(Arc<MwShared>),
}

#[derive(Debug, Default)]
struct KeySlot {
    generation: u8,
    entry: Option<KeyEntry>,
}

/// Slot table of keys.
#[derive(Debug, Default)]
pub(crate) struct KeyTable {
    slots: Vec<KeySlot>,
    free: Vec<u32>,
}

impl KeyTable {
    #[inline]
    fn slot_of(key: u32) -> usize {
        (key >> 8) as usize
    }

    /// Stores `entry` in a free slot and returns its key.
    pub(crate) fn insert(&mut self, entry: KeyEntry) -> u32 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                if self.slots.is_empty() {
                    self.slots.push(KeySlot::default()); // index 0 is never handed out
                }
                self.slots.push(KeySlot::default());
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.entry = Some(entry);
        index << 8 | u32::from(slot.generation)
    }

    /// Frees the slot of `key` (if `key` is current).
    pub(crate) fn remove(&mut self, key: u32) {
        let i = Self::slot_of(key);
        if let Some(slot) = self.slots.get_mut(i) {
            if slot.entry.is_some() && u32::from(slot.generation) == key & 0xff {
                slot.entry = None;
                self.free.push(i as u32);
            }
        }
    }

    /// Gives the slot of `key` a new generation and returns the new key (a window's rebind).
    pub(crate) fn regenerate(&mut self, key: u32) -> Option<u32> {
        let i = Self::slot_of(key);
        let slot = self.slots.get_mut(i)?;
        if slot.entry.is_none() || u32::from(slot.generation) != key & 0xff {
            return None;
        }
        slot.generation = slot.generation.wrapping_add(1);
        Some((i as u32) << 8 | u32::from(slot.generation))
    }

    /// What `key` names, if it is current.
    #[inline]
    pub(crate) fn get(&self, key: u32) -> Option<&KeyEntry> {
        let slot = self.slots.get(Self::slot_of(key))?;
        if u32::from(slot.generation) != key & 0xff {
            return None;
        }
        slot.entry.as_ref()
    }

    /// Resolves a local SGE: the key must be a region of `pd` covering the range, with
    /// LOCAL_WRITE when the device writes it. As in rxe, a key that does not resolve (unknown,
    /// other PD, missing right) is a local QP operation error, a range outside the region a
    /// local protection error.
    #[inline]
    pub(crate) fn local(
        &self,
        lkey: u32,
        addr: u64,
        len: u32,
        write: bool,
        pd: u64,
    ) -> Result<*mut u8, WcStatus> {
        let Some(KeyEntry::Mr(mr)) = self.get(lkey) else {
            return Err(WcStatus::LocQpOpErr);
        };
        if mr.pd != pd || (write && !mr.access.contains(AccessFlags::LOCAL_WRITE)) {
            return Err(WcStatus::LocQpOpErr);
        }
        mr.ptr_for(addr, u64::from(len)).ok_or(WcStatus::LocProtErr)
    }

    /// Resolves a remote access on behalf of the target QP (`pd`, `qpn`): the key must be a
    /// region of that PD or a window bound through that QP, covering the range and granting
    /// `need`.
    #[inline]
    pub(crate) fn remote(
        &self,
        rkey: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
        pd: u64,
        qpn: u32,
    ) -> Result<*mut u8, WcStatus> {
        match self.get(rkey) {
            Some(KeyEntry::Mr(mr)) => {
                if mr.pd != pd || !mr.access.contains(need) {
                    return Err(WcStatus::RemAccessErr);
                }
                mr.ptr_for(addr, len).ok_or(WcStatus::RemAccessErr)
            }
            Some(KeyEntry::Mw(mw)) => mw.ptr_for(addr, len, need, pd, qpn),
            None => Err(WcStatus::RemAccessErr),
        }
    }
}

/// A read lock on the key table, taken when a request first needs a key and held until the
/// end of the batch (one lock round trip per post or poll rather than per request). While it is
/// held, regions and windows cannot be deregistered, so the pointers resolved under it stay
/// valid. Anything that writes the table (a bind) must [`Keys::release`] it first.
pub(crate) struct Keys<'a> {
    fabric: &'a Fabric,
    guard: Option<RwLockReadGuard<'a, KeyTable>>,
}

impl Keys<'_> {
    /// The table, locking it if this guard does not hold it yet.
    pub(crate) fn get(&mut self) -> &KeyTable {
        self.guard.get_or_insert_with(|| self.fabric.keys())
    }

    /// Unlocks the table (the next [`Keys::get`] locks it again).
    pub(crate) fn release(&mut self) {
        self.guard = None;
    }
}

impl std::fmt::Debug for Keys<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").field("locked", &self.guard.is_some()).finish()
    }
}

/// The fabric.
#[derive(Debug, Default)]
pub(crate) struct Fabric {
    pub(crate) keys: RwLock<KeyTable>,
    qps: RwLock<HashMap<u32, Weak<QpShared>>>,
    pub(crate) listeners: Mutex<HashMap<SocketAddr, Arc<ListenerShared>>>,
    next_qpn: AtomicU32,
    next_id: AtomicU64,
}

impl Fabric {
    /// The process's fabric.
    pub(crate) fn get() -> &'static Fabric {
        static FABRIC: OnceLock<Fabric> = OnceLock::new();
        FABRIC.get_or_init(|| Fabric {
            next_qpn: AtomicU32::new(0x11),
            next_id: AtomicU64::new(1),
            ..Fabric::default()
        })
    }

    /// A fresh identifier (contexts, PDs, CQs, SRQs).
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Reads the key table (a poisoned lock is still usable: the table has no invariants a
    /// panic could break half-way).
    pub(crate) fn keys(&self) -> RwLockReadGuard<'_, KeyTable> {
        self.keys.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The key table, read-locked on first use and kept locked across a batch of requests:
    /// see [`Keys`].
    pub(crate) fn keys_lazy(&self) -> Keys<'_> {
        Keys { fabric: self, guard: None }
    }

    /// Runs `f` on the key table for writing.
    pub(crate) fn keys_mut<R>(&self, f: impl FnOnce(&mut KeyTable) -> R) -> R {
        f(&mut self.keys.write().unwrap_or_else(|e| e.into_inner()))
    }

    /// Numbers and records a new QP.
    pub(crate) fn add_qp(&self, make: impl FnOnce(u32) -> Arc<QpShared>) -> Arc<QpShared> {
        let qpn = self.next_qpn.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
        let qp = make(qpn);
        self.qps.write().unwrap_or_else(|e| e.into_inner()).insert(qpn, Arc::downgrade(&qp));
        qp
    }

    /// Forgets a QP.
    pub(crate) fn remove_qp(&self, qpn: u32) {
        self.qps.write().unwrap_or_else(|e| e.into_inner()).remove(&qpn);
    }

    /// The live QP numbered `qpn`.
    pub(crate) fn qp(&self, qpn: u32) -> Option<Arc<QpShared>> {
        self.qps.read().unwrap_or_else(|e| e.into_inner()).get(&qpn)?.upgrade()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dummy() -> KeyEntry {
        KeyEntry::Mw(Arc::new(MwShared::new(1)))
    }

    #[test]
    fn stale_keys_do_not_resolve() {
        let mut t = KeyTable::default();
        let k1 = t.insert(dummy());
        assert!(t.get(k1).is_some());
        t.remove(k1);
        assert!(t.get(k1).is_none());
        let k2 = t.insert(dummy());
        assert_eq!(k1 >> 8, k2 >> 8, "slot reused");
        assert_ne!(k1, k2);
        assert!(t.get(k1).is_none());
        let k3 = t.regenerate(k2).unwrap();
        assert!(t.get(k2).is_none());
        assert!(t.get(k3).is_some());
        assert!(t.regenerate(k2).is_none());
        assert!(t.get(0).is_none());
        assert!(t.get(0xffff_ffff).is_none());
    }
}
