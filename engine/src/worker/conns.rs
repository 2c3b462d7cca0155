//! A worker's connections: a fixed table of `worker.max_conns` slots with a generation each (a
//! stale [`ConnId`] finds nothing), a free list, the count of live ones, and the dirty set (the
//! connections the next flush visits: requests waiting, or closing). A connection is in the
//! dirty set at most once, put there by [`Conns::mark`] only.

use corelink_verbs::Provider;

use super::conn::{Conn, Phase};
use crate::error::{EngineError, Result};
use crate::request::ConnId;

/// The connections of one worker.
pub(crate) struct Conns<P: Provider> {
    worker: u16,
    slots: Vec<Option<Conn<P>>>,
    generations: Vec<u32>,
    free: Vec<u16>,
    live: usize,
    /// Of `live`, slots kept for connections coming up.
    kept: usize,
    dirty: Vec<u16>,
    /// By slot: whether it is in `dirty`.
    marked: Vec<bool>,
}

impl<P: Provider> Conns<P> {
    /// A table of `max` slots (at most 2^16) for worker `worker`.
    pub(crate) fn new(worker: u16, max: usize) -> Self {
        let max = max.min(1 << 16);
        Conns {
            worker,
            slots: (0..max).map(|_| None).collect(),
            generations: vec![0; max],
            free: (0..max).rev().map(|s| s as u16).collect(),
            live: 0,
            kept: 0,
            dirty: Vec::with_capacity(max),
            marked: vec![false; max],
        }
    }

    /// Opens a connection in a free slot (`make` builds it for its new id); `None` when every
    /// slot is taken.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn open(&mut self, make: impl FnOnce(ConnId) -> Conn<P>) -> Option<ConnId> {
        let id = self.reserve()?;
        if !self.fill(id, make(id)) {
            return None;
        }
        Some(id)
    }

    /// Keeps a free slot for a connection coming up (it counts as live, finds nothing, and is
    /// [`Conns::fill`]ed or [`Conns::unreserve`]d later); `None` when every slot is taken.
    pub(crate) fn reserve(&mut self) -> Option<ConnId> {
        let slot = self.free.pop()?;
        let gen = &mut self.generations[usize::from(slot)];
        *gen = gen.wrapping_add(1);
        self.live += 1;
        self.kept += 1;
        Some(ConnId { worker: self.worker, slot, generation: *gen })
    }

    /// Whether `id` is a connection coming up: a kept slot, not yet filled (one load while
    /// none is kept).
    #[inline]
    pub(crate) fn coming_up(&self, id: ConnId) -> bool {
        self.kept > 0 && self.reserved(id)
    }

    /// Whether `id` is a kept slot, not yet filled.
    fn reserved(&self, id: ConnId) -> bool {
        let s = usize::from(id.slot);
        self.generations.get(s) == Some(&id.generation) && matches!(self.slots.get(s), Some(None))
    }

    /// Puts connection `conn` (built for `id`) in its kept slot; whether `id` was one (if not,
    /// `conn` is dropped).
    pub(crate) fn fill(&mut self, id: ConnId, conn: Conn<P>) -> bool {
        if !self.reserved(id) || conn.id != id {
            return false;
        }
        self.slots[usize::from(id.slot)] = Some(conn);
        self.kept -= 1;
        true
    }

    /// Frees kept slot `id` (its connection did not come up); whether it was one.
    pub(crate) fn unreserve(&mut self, id: ConnId) -> bool {
        if !self.reserved(id) {
            return false;
        }
        // (a new generation: `id` keeps nothing now)
        let gen = &mut self.generations[usize::from(id.slot)];
        *gen = gen.wrapping_add(1);
        self.free.push(id.slot);
        self.live -= 1;
        self.kept -= 1;
        true
    }

    /// The connection `id`, if it is still there.
    #[inline(always)]
    pub(crate) fn get(&self, id: ConnId) -> Result<&Conn<P>> {
        match self.slots.get(usize::from(id.slot)).and_then(Option::as_ref) {
            Some(c) if c.id == id => Ok(c),
            _ => Err(EngineError::NoSuchConnection(id)),
        }
    }

    /// The connection `id`, mutably, if it is still there.
    #[inline(always)]
    pub(crate) fn get_mut(&mut self, id: ConnId) -> Result<&mut Conn<P>> {
        match self.slots.get_mut(usize::from(id.slot)).and_then(Option::as_mut) {
            Some(c) if c.id == id => Ok(c),
            _ => Err(EngineError::NoSuchConnection(id)),
        }
    }

    /// The connection `id`, if it takes requests now: it is there and open, and the worker is
    /// not `stopping` (the one check every submission makes).
    #[inline(always)]
    pub(crate) fn taking(&mut self, id: ConnId, stopping: bool) -> Result<&mut Conn<P>> {
        if stopping {
            return Err(EngineError::ShuttingDown);
        }
        let c = self.get_mut(id)?;
        match c.phase {
            Phase::Open => Ok(c),
            Phase::Closing => Err(EngineError::ConnectionClosing(id)),
        }
    }

    /// The connection `id` as [`Conns::taking`] checks it, its slot marked dirty (its requests
    /// are about to be submitted). Marked first, so that the connection is looked up once: a
    /// slot marked for a connection then refused, or for requests then refused, costs the next
    /// flush a visit that finds nothing to do.
    #[inline(always)]
    pub(crate) fn taking_marked(&mut self, id: ConnId, stopping: bool) -> Result<&mut Conn<P>> {
        self.mark(id.slot);
        self.taking(id, stopping)
    }

    /// The connection in `slot` (a completion's: its requests and receives keep it there).
    #[inline(always)]
    pub(crate) fn at_mut(&mut self, slot: u16) -> Option<&mut Conn<P>> {
        self.slots.get_mut(usize::from(slot)).and_then(Option::as_mut)
    }

    /// Puts connection `slot` in the dirty set (once).
    #[inline(always)]
    pub(crate) fn mark(&mut self, slot: u16) {
        if let Some(m) = self.marked.get_mut(usize::from(slot)) {
            if !*m {
                *m = true;
                self.dirty.push(slot);
            }
        }
    }

    /// Whether the dirty set is not empty.
    #[inline(always)]
    pub(crate) fn any_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// With exactly one connection in the dirty set, `visit`s it: `visit` says whether to keep
    /// it in the set, or `None` to leave it (and the set) to [`Conns::retain_dirty`]. Returns
    /// whether it was visited so.
    #[inline(always)]
    pub(crate) fn visit_sole_dirty(
        &mut self,
        visit: impl FnOnce(&mut Conn<P>) -> Option<bool>,
    ) -> bool {
        let [slot] = self.dirty[..] else { return false };
        let Some(c) = self.slots.get_mut(usize::from(slot)).and_then(Option::as_mut) else {
            return false;
        };
        match visit(c) {
            None => false,
            Some(true) => true,
            Some(false) => {
                self.marked[usize::from(slot)] = false;
                self.dirty.clear();
                true
            }
        }
    }

    /// Visits every dirty connection; keeps in the set those for which `visit` says so.
    #[inline(always)]
    pub(crate) fn retain_dirty(&mut self, mut visit: impl FnMut(&mut Conn<P>) -> bool) {
        let mut kept = 0;
        for i in 0..self.dirty.len() {
            let slot = self.dirty[i];
            let keep = match self.slots[usize::from(slot)].as_mut() {
                Some(c) => visit(c),
                None => false,
            };
            if keep {
                self.dirty[kept] = slot;
                kept += 1;
            } else {
                self.marked[usize::from(slot)] = false;
            }
        }
        self.dirty.truncate(kept);
    }

    /// Visits every dirty connection that is closing.
    pub(crate) fn closing(&mut self, mut visit: impl FnMut(&mut Conn<P>)) {
        for &slot in &self.dirty {
            if let Some(c) = self.slots[usize::from(slot)].as_mut() {
                if c.phase == Phase::Closing {
                    visit(c);
                }
            }
        }
    }

    /// Visits every dirty connection that is closing and has not yet been disconnected (one a
    /// failed request closed: its other lanes are still up): `disconnect` disconnects it, or
    /// says it waits (for the peer's disconnect) and is visited again.
    pub(crate) fn undisconnected(&mut self, mut disconnect: impl FnMut(&mut Conn<P>) -> bool) {
        self.closing(|c| {
            if !c.disconnect_sent {
                c.disconnect_sent = disconnect(c);
            }
        });
    }

    /// Takes out every dirty connection that is closing and has nothing left on the device
    /// (its slot is free again), passing each to `released`; the rest stay dirty while they
    /// are closing or have requests waiting.
    pub(crate) fn release_drained(&mut self, mut released: impl FnMut(Conn<P>)) {
        let mut kept = 0;
        for i in 0..self.dirty.len() {
            let slot = self.dirty[i];
            let s = usize::from(slot);
            if matches!(&self.slots[s], Some(c) if c.releasable()) {
                if let Some(c) = self.slots[s].take() {
                    self.free.push(slot);
                    self.live -= 1;
                    released(c);
                }
            }
            let keep =
                matches!(&self.slots[s], Some(c) if c.phase == Phase::Closing || c.has_waiting());
            if keep {
                self.dirty[kept] = slot;
                kept += 1;
            } else {
                self.marked[s] = false;
            }
        }
        self.dirty.truncate(kept);
    }

    /// Connections open or closing, and slots kept for connections coming up.
    #[inline(always)]
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Connections open or closing (not counting kept slots: nothing comes on those that
    /// cannot wait in the CQ).
    #[inline(always)]
    pub(crate) fn connections(&self) -> usize {
        self.live - self.kept
    }

    /// The worker whose connections these are.
    pub(crate) fn worker(&self) -> u16 {
        self.worker
    }

    /// Slots there are (`worker.max_conns`).
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Every connection there is.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Conn<P>> {
        self.slots.iter().flatten()
    }

    /// Every connection there is, mutably.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Conn<P>> {
        self.slots.iter_mut().flatten()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::request::ConnInfo;
    use arrayvec::ArrayVec;
    use corelink_verbs::soft::Soft;

    fn info() -> ConnInfo {
        ConnInfo {
            private_data: vec![],
            peer_recv_size: None,
            initiated: false,
            token: 0,
            lanes: 1,
            recvs_per_lane: 0,
        }
    }

    fn open(c: &mut Conns<Soft>) -> Option<ConnId> {
        c.open(|id| Conn::new(id, info(), crate::handoff::Origin::Handler, ArrayVec::new(), 4))
    }

    #[test]
    fn slots_are_generational_and_bounded() {
        let mut c = Conns::<Soft>::new(3, 2);
        let a = open(&mut c).unwrap();
        let b = open(&mut c).unwrap();
        assert_eq!((a.worker, c.live()), (3, 2));
        assert!(open(&mut c).is_none(), "every slot is taken");
        // Released (closing, nothing on the device), its slot comes back with a new generation.
        c.get_mut(a).unwrap().phase = Phase::Closing;
        c.mark(a.slot);
        let mut released = vec![];
        c.release_drained(|conn| released.push(conn.id));
        assert_eq!((released, c.live(), c.any_dirty()), (vec![a], 1, false));
        let a2 = open(&mut c).unwrap();
        assert_eq!(a2.slot, a.slot);
        assert_ne!(a2, a);
        assert!(matches!(c.get(a), Err(EngineError::NoSuchConnection(id)) if id == a));
        assert!(c.get(a2).is_ok() && c.get(b).is_ok());
        assert_eq!(c.iter().count(), 2);
    }

    #[test]
    fn a_kept_slot_counts_as_live_finds_nothing_and_is_filled_or_freed_once() {
        let mut c = Conns::<Soft>::new(0, 2);
        let a = c.reserve().unwrap();
        let b = c.reserve().unwrap();
        assert_eq!((c.live(), c.connections()), (2, 0));
        assert!(c.reserve().is_none(), "kept slots are taken");
        assert!(c.get(a).is_err() && c.at_mut(a.slot).is_none());
        let conn = |id| Conn::new(id, info(), crate::handoff::Origin::Handler, ArrayVec::new(), 4);
        assert!(!c.fill(b, conn(a)), "a connection goes in its own slot");
        assert!(c.fill(a, conn(a)));
        assert!(c.get(a).is_ok());
        assert!(!c.fill(a, conn(a)) && !c.unreserve(a), "filled: no longer kept");
        assert!(c.unreserve(b) && !c.unreserve(b));
        assert_eq!((c.live(), c.connections()), (1, 1));
        let b2 = c.reserve().unwrap();
        assert_eq!(b2.slot, b.slot);
        assert_ne!(b2, b, "a new generation");
        assert!(!c.unreserve(b), "a stale id frees nothing");
    }

    #[test]
    fn a_connection_is_dirty_once_until_a_visit_lets_it_go() {
        let mut c = Conns::<Soft>::new(0, 4);
        let a = open(&mut c).unwrap();
        let b = open(&mut c).unwrap();
        for _ in 0..3 {
            c.mark(a.slot);
        }
        c.mark(b.slot);
        let mut seen = vec![];
        c.retain_dirty(|conn| {
            seen.push(conn.id);
            conn.id == b // b stays (say, waiting behind backpressure)
        });
        assert_eq!(seen, vec![a, b], "each marked connection visited once");
        seen.clear();
        c.retain_dirty(|conn| {
            seen.push(conn.id);
            false
        });
        assert_eq!(seen, vec![b]);
        assert!(!c.any_dirty());
        c.mark(a.slot);
        assert!(c.any_dirty(), "a connection let go can be marked again");
        // An open connection with nothing waiting leaves the set without being released.
        c.release_drained(|_| panic!("not closing"));
        assert!(!c.any_dirty());
        assert_eq!(c.live(), 2);
    }

    #[test]
    fn a_sole_dirty_connection_is_visited_alone() {
        let mut c = Conns::<Soft>::new(0, 4);
        let a = open(&mut c).unwrap();
        let b = open(&mut c).unwrap();
        assert!(!c.visit_sole_dirty(|_| panic!("none is dirty")));
        c.mark(a.slot);
        // Left to the general visit: the set is as it was.
        assert!(!c.visit_sole_dirty(|_| None));
        assert!(c.any_dirty());
        // Kept, then let go.
        assert!(c.visit_sole_dirty(|conn| Some(conn.id == a)));
        assert!(c.any_dirty());
        assert!(c.visit_sole_dirty(|_| Some(false)));
        assert!(!c.any_dirty());
        c.mark(a.slot);
        assert!(c.any_dirty(), "a connection let go can be marked again");
        // Two dirty: not the sole visit's.
        c.mark(b.slot);
        assert!(!c.visit_sole_dirty(|_| panic!("two are dirty")));
        let mut seen = vec![];
        c.retain_dirty(|conn| {
            seen.push(conn.id);
            false
        });
        assert_eq!(seen, vec![a, b]);
    }
}
