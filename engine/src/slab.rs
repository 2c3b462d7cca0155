//! Fixed slots for requests in flight: a work-request id is a slot index and a generation,
//! so a completion finds its request with an index, no hashing, and a stale id finds nothing.

use crate::tunables::SLOT_BITS;

/// A slab of `T`s with a free list, sized once.
#[derive(Debug)]
pub struct Slab<T> {
    slots: Vec<(u32, Option<T>)>,
    free: Vec<u32>,
}

const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

impl<T> Slab<T> {
    /// A slab of `capacity` slots (at most 2^SLOT_BITS).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.min(1 << SLOT_BITS);
        Slab {
            slots: (0..capacity).map(|_| (0, None)).collect(),
            free: (0..capacity as u32).rev().collect(),
        }
    }

    /// Stores `v`; returns its id, or gives `v` back when every slot is taken.
    pub fn insert(&mut self, v: T) -> Result<u64, T> {
        let Some(i) = self.free.pop() else { return Err(v) };
        let slot = &mut self.slots[i as usize];
        slot.0 = slot.0.wrapping_add(1);
        slot.1 = Some(v);
        Ok(u64::from(slot.0) << SLOT_BITS | u64::from(i))
    }

    /// The slot index of `id` (for side tables kept in step with the slab).
    #[inline]
    pub fn slot(id: u64) -> usize {
        (id & SLOT_MASK) as usize
    }

    /// Takes the value of `id` out, if `id` is current.
    pub fn remove(&mut self, id: u64) -> Option<T> {
        let i = (id & SLOT_MASK) as usize;
        let slot = self.slots.get_mut(i)?;
        if u64::from(slot.0) != id >> SLOT_BITS || slot.1.is_none() {
            return None;
        }
        self.free.push(i as u32);
        slot.1.take()
    }

    /// The value of `id`, if `id` is current.
    pub fn get(&self, id: u64) -> Option<&T> {
        let slot = self.slots.get((id & SLOT_MASK) as usize)?;
        if u64::from(slot.0) != id >> SLOT_BITS {
            return None;
        }
        slot.1.as_ref()
    }

    /// The value of `id`, mutably, if `id` is current.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        let slot = self.slots.get_mut((id & SLOT_MASK) as usize)?;
        if u64::from(slot.0) != id >> SLOT_BITS {
            return None;
        }
        slot.1.as_mut()
    }

    /// Values stored.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes every value out whose id `pick` selects, passing each to `f`.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
