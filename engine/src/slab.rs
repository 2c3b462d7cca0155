//! Fixed slots for requests in flight: a work-request id is a slot index and a generation,
//! so a completion finds its request with an index, no hashing, and a stale id finds nothing.

use std::cell::Cell;

use crate::tunables::SLOT_BITS;

/// The id of a value in a [`Slab`]: its slot and the slot's generation when it was stored
/// (`generation << SLOT_BITS | slot`, below 2^63 so that a work-request id can tell it from a
/// receive's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Id(u64);

impl Id {
    /// Its slot (for side tables kept in step with a slab).
    #[inline(always)]
    pub fn slot(self) -> usize {
        (self.0 & SLOT_MASK) as usize
    }

    /// The id as a work request carries it.
    #[inline(always)]
    pub fn raw(self) -> u64 {
        self.0
    }

    /// An id read back from a work request (a stale or foreign one finds nothing).
    #[inline(always)]
    pub fn from_raw(raw: u64) -> Id {
        Id(raw)
    }

    #[inline(always)]
    fn generation(self) -> u64 {
        self.0 >> SLOT_BITS
    }

    #[inline(always)]
    fn new(generation: u32, slot: u32) -> Id {
        // Generations wrap within 31 bits: the top bit of a work-request id marks a receive.
        Id(u64::from(generation & (u32::MAX >> 1)) << SLOT_BITS | u64::from(slot))
    }
}

/// A slab of `T`s with a free list, sized once.
#[derive(Debug)]
pub struct Slab<T> {
    slots: Vec<(u32, Option<T>)>,
    free: Vec<u32>,
    /// Lookups that cannot fail and did (a queued value missing): a bug, counted.
    misses: Cell<u64>,
}

const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

impl<T> Slab<T> {
    /// A slab of `capacity` slots (at most 2^SLOT_BITS).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.min(1 << SLOT_BITS);
        Slab {
            slots: (0..capacity).map(|_| (0, None)).collect(),
            free: (0..capacity as u32).rev().collect(),
            misses: Cell::new(0),
        }
    }

    /// Lookups that cannot fail and did, since start (see [`Fifo`]).
    pub fn misses(&self) -> u64 {
        self.misses.get()
    }

    /// Stores `v`; returns its id, or gives `v` back when every slot is taken.
    #[inline(always)]
    pub fn insert(&mut self, v: T) -> Result<Id, T> {
        let Some(i) = self.free.pop() else { return Err(v) };
        let slot = &mut self.slots[i as usize];
        slot.0 = slot.0.wrapping_add(1) & (u32::MAX >> 1);
        // A free slot holds nothing, so there is nothing to drop (this skips the drop glue).
        let old = slot.1.replace(v);
        debug_assert!(old.is_none());
        std::mem::forget(old);
        Ok(Id::new(slot.0, i))
    }

    /// Takes the value of `id` out, if `id` is current.
    pub fn remove(&mut self, id: Id) -> Option<T> {
        let i = id.slot();
        let slot = self.slots.get_mut(i)?;
        if u64::from(slot.0) != id.generation() || slot.1.is_none() {
            return None;
        }
        self.free.push(i as u32);
        slot.1.take()
    }

    /// The value of `id`, if `id` is current.
    pub fn get(&self, id: Id) -> Option<&T> {
        let slot = self.slots.get(id.slot())?;
        if u64::from(slot.0) != id.generation() {
            return None;
        }
        slot.1.as_ref()
    }

    /// The value of `id`, mutably, if `id` is current.
    pub fn get_mut(&mut self, id: Id) -> Option<&mut T> {
        let slot = self.slots.get_mut(id.slot())?;
        if u64::from(slot.0) != id.generation() {
            return None;
        }
        slot.1.as_mut()
    }

    /// The value in slot `i` and its id, if the slot holds one.
    #[inline]
    pub fn at(&self, i: u32) -> Option<(Id, &T)> {
        let slot = self.slots.get(i as usize)?;
        let v = slot.1.as_ref()?;
        Some((Id::new(slot.0, i), v))
    }

    /// The value in slot `i`, mutably, if the slot holds one.
    #[inline]
    pub fn at_mut(&mut self, i: u32) -> Option<&mut T> {
        self.slots.get_mut(i as usize)?.1.as_mut()
    }

    /// Values stored.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether nothing is stored.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes every value out whose id `pick` selects, passing each to `f`.
    #[cfg(test)]
    pub fn drain_where(&mut self, mut pick: impl FnMut(&T) -> bool, mut f: impl FnMut(T)) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.1.as_ref().is_some_and(&mut pick) {
                if let Some(v) = slot.1.take() {
                    self.free.push(i as u32);
                    f(v);
                }
            }
        }
    }
}

/// A value that can be a member of a [`Fifo`]: it carries the slot of the member after it.
pub trait Linked {
    /// The slot of the next member.
    fn link(&self) -> u32;
    /// Sets the slot of the next member.
    fn set_link(&mut self, next: u32);
}

/// A first-in first-out queue of values in a [`Slab`], linked through the values themselves:
/// it never allocates and has no capacity of its own. A value is in one `Fifo` at most, and
/// stays in the slab while it is in one (it is taken out of the slab only after `pop`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Fifo {
    head: u32,
    tail: u32,
    len: u32,
}

impl Fifo {
    /// An empty queue.
    pub const fn new() -> Fifo {
        Fifo { head: 0, tail: 0, len: 0 }
    }

    /// Members.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether it has no member.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends the value of `id` (which must be in `slab` and in no other queue).
    #[inline]
    pub fn push<T: Linked>(&mut self, slab: &mut Slab<T>, id: Id) {
        let i = id.slot() as u32;
        let prev = self.tail;
        if self.len > 0 {
            let Some(t) = slab.at_mut(prev) else { return self.lost(slab) };
            t.set_link(i);
        } else {
            self.head = i;
        }
        self.tail = i;
        self.len += 1;
    }

    /// The id of the first member.
    #[inline]
    pub fn front<T: Linked>(&self, slab: &Slab<T>) -> Option<Id> {
        if self.len == 0 {
            return None;
        }
        slab.at(self.head).map(|(id, _)| id)
    }

    /// Takes the first member out of the queue (it stays in the slab); returns its id.
    #[inline]
    pub fn pop<T: Linked>(&mut self, slab: &Slab<T>) -> Option<Id> {
        if self.len == 0 {
            return None;
        }
        let Some((id, v)) = slab.at(self.head) else {
            self.lost(slab);
            return None;
        };
        self.head = v.link();
        self.len -= 1;
        Some(id)
    }

    /// Takes the first member out of the queue and out of the slab, in one visit of its slot.
    #[inline(always)]
    pub fn pop_take<T: Linked>(&mut self, slab: &mut Slab<T>) -> Option<(Id, T)> {
        if self.len == 0 {
            return None;
        }
        let i = self.head;
        let Some(slot) = slab.slots.get_mut(i as usize) else {
            self.lost(slab);
            return None;
        };
        let id = Id::new(slot.0, i);
        let Some(v) = slot.1.take() else {
            self.lost(slab);
            return None;
        };
        slab.free.push(i);
        self.head = v.link();
        self.len -= 1;
        Some((id, v))
    }

    /// A member left the slab while queued (a bug): the rest of the chain is unreachable.
    /// Counted in the slab's misses (the worker's metrics), and a debug assertion.
    #[cold]
    fn lost<T>(&mut self, slab: &Slab<T>) {
        slab.misses.set(slab.misses.get() + 1);
        debug_assert!(false, "a queued value left the slab");
        *self = Fifo::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Linked for (char, u32) {
        fn link(&self) -> u32 {
            self.1
        }
        fn set_link(&mut self, next: u32) {
            self.1 = next;
        }
    }

    #[test]
    fn fifos_link_through_the_slab() {
        let mut s = Slab::new(8);
        let (mut a, mut b) = (Fifo::new(), Fifo::new());
        let ids: Vec<Id> = "wxyz".chars().map(|c| s.insert((c, 0)).unwrap()).collect();
        a.push(&mut s, ids[0]);
        b.push(&mut s, ids[1]);
        a.push(&mut s, ids[2]);
        a.push(&mut s, ids[3]);
        assert_eq!((a.len(), b.len()), (3, 1));
        assert_eq!(a.front(&s), Some(ids[0]));
        assert_eq!(a.pop(&s), Some(ids[0]));
        b.push(&mut s, ids[0]);
        assert_eq!(a.pop(&s), Some(ids[2]));
        assert_eq!(b.pop(&s), Some(ids[1]));
        assert_eq!(b.pop(&s), Some(ids[0]));
        assert_eq!(b.pop(&s), None);
        assert!(b.is_empty());
        assert_eq!(s.remove(ids[2]).map(|v| v.0), Some('y'));
        assert_eq!(a.pop_take(&mut s), Some((ids[3], ('z', 0))));
        assert_eq!(s.get(ids[3]), None, "taken out of the slab too");
        assert_eq!(a.pop(&s), None);
        assert_eq!(a.pop_take(&mut s), None);
    }

    #[test]
    fn ids_are_generational() {
        let mut s = Slab::new(2);
        let a = s.insert('a').unwrap();
        let b = s.insert('b').unwrap();
        assert_eq!(s.insert('c'), Err('c'));
        assert_eq!(s.get(a), Some(&'a'));
        *s.get_mut(b).unwrap() = 'B';
        assert_eq!(s.remove(b), Some('B'));
        let b = s.insert('b').unwrap();
        assert_eq!(s.remove(a), Some('a'));
        assert_eq!(s.get(a), None);
        assert_eq!(s.remove(a), None, "removed already");
        let c = s.insert('c').unwrap();
        assert_ne!(a, c, "same slot, new generation");
        assert_eq!(s.remove(a), None, "a stale id finds nothing");
        assert_eq!(s.len(), 2);
        let mut got = vec![];
        s.drain_where(|v| *v == 'b', |v| got.push(v));
        assert_eq!(got, vec!['b']);
        assert_eq!(s.remove(b), None);
        assert_eq!(s.remove(c), Some('c'));
        assert!(s.is_empty());
    }

    #[test]
    fn ids_stay_below_the_receive_flag_and_round_trip() {
        let mut s = Slab::new(1);
        for _ in 0..3 {
            let id = s.insert(()).unwrap();
            assert!(id.raw() < 1 << 63);
            assert_eq!(Id::from_raw(id.raw()), id);
            s.remove(id).unwrap();
        }
        // A generation at the top of its range wraps within 31 bits.
        s.slots[0].0 = u32::MAX >> 1;
        let id = s.insert(()).unwrap();
        assert_eq!((id.generation(), id.slot()), (0, 0));
    }

    #[test]
    fn a_member_missing_from_its_queue_is_counted() {
        let mut s = Slab::new(4);
        let mut q = Fifo::new();
        let a = s.insert(('a', 0)).unwrap();
        q.push(&mut s, a);
        s.remove(a);
        let pop = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| q.pop(&s)));
        // (a debug assertion in debug builds; counted either way)
        assert!(pop.is_err() || pop.unwrap().is_none());
        assert_eq!(s.misses(), 1);
    }
}
