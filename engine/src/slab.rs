//! Fixed slots for requests in flight: a work-request id is a slot index and a generation,
//! so a completion finds its request with an index, no hashing, and a stale id finds nothing.

use std::cell::Cell;
use std::mem::MaybeUninit;

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

/// A slab of `T`s with a free list, sized once. Each slot carries its generation (odd while
/// it holds a value, so one comparison with an id's checks both) and the link of the [`Fifo`]
/// its value is in: queues never look inside the values.
pub struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    /// Lookups that cannot fail and did (a queued value missing): a bug, counted.
    misses: Cell<u64>,
}

struct Slot<T> {
    /// Bumped at every insert and remove (within 31 bits): odd while the slot holds a value.
    generation: u32,
    /// The slot of the next member of the queue the value is in.
    link: u32,
    /// Initialised exactly while `generation` is odd.
    value: MaybeUninit<T>,
}

impl<T> Slot<T> {
    #[inline(always)]
    fn full(&self) -> bool {
        self.generation & 1 == 1
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Slab<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slab")
            .field("len", &self.len())
            .field("capacity", &self.slots.len())
            .finish()
    }
}

const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const GENERATION_MASK: u32 = u32::MAX >> 1;

impl<T> Slab<T> {
    /// A slab of `capacity` slots (at least one, at most 2^SLOT_BITS: never empty, so that
    /// a lookup reads a slot before it tests, [`Slab::at`]).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, 1 << SLOT_BITS);
        Slab {
            slots: (0..capacity)
                .map(|_| Slot { generation: 0, link: 0, value: MaybeUninit::uninit() })
                .collect(),
            free: (0..capacity as u32).rev().collect(),
            misses: Cell::new(0),
        }
    }

    /// Lookups that cannot fail and did, since start (see [`Fifo`]).
    pub fn misses(&self) -> u64 {
        self.misses.get()
    }

    /// Stores `v`; returns its id, or gives `v` back when every slot is taken.
    #[cfg(test)]
    pub fn insert(&mut self, v: T) -> Result<Id, T> {
        let Some(i) = self.free.pop() else { return Err(v) };
        let Some(slot) = self.slots.get_mut(i as usize) else { return Err(v) };
        debug_assert!(!slot.full());
        slot.generation = slot.generation.wrapping_add(1) & GENERATION_MASK;
        slot.value.write(v);
        Ok(Id::new(slot.generation, i))
    }

    /// Stores the value `make` builds from `arg`, written straight into a free slot (never
    /// built elsewhere and copied), if the slab is not full; else gives `arg` back (`make`
    /// unrun).
    #[inline(always)]
    pub fn insert_from<A>(&mut self, arg: A, make: impl FnOnce(A) -> T) -> Result<Id, A> {
        let Some(&i) = self.free.last() else { return Err(arg) };
        debug_assert!((i as usize) < self.slots.len());
        // SAFETY: the free list holds slot indices only (`new`, and every push is of a slot
        // being emptied).
        let slot = unsafe { self.slots.get_unchecked_mut(i as usize) };
        debug_assert!(!slot.full());
        // SAFETY: the slot is free (on the free list): nothing in it to drop or read; `make`
        // writes a whole value through the pointer, which the generation then marks full.
        unsafe { slot.value.as_mut_ptr().write(make(arg)) };
        self.free.pop();
        slot.generation = slot.generation.wrapping_add(1) & GENERATION_MASK;
        Ok(Id::new(slot.generation, i))
    }

    /// The index of `id`'s slot if `id` is current (a current id's slot holds a value: its
    /// generation is odd), with one test: the slot is read first (for an index past the end,
    /// the last slot, whose generation then never makes a match). In the emulated guest each
    /// branch on a completion's path is a block of translated code to find.
    #[inline(always)]
    fn at(&self, id: Id) -> Option<usize> {
        let i = id.slot();
        let at = i.min(self.slots.len() - 1);
        // SAFETY: `at < slots.len()`: the slab is never empty (`new`).
        let generation = unsafe { self.slots.get_unchecked(at) }.generation;
        ((u64::from(generation) == id.generation()) & (at == i)).then_some(at)
    }

    /// The slot of `id` if `id` is current.
    #[inline(always)]
    fn current(&self, id: Id) -> Option<&Slot<T>> {
        // SAFETY: `at` returns an index in range.
        self.at(id).map(|i| unsafe { self.slots.get_unchecked(i) })
    }

    /// The index and slot of `id`, mutably, if `id` is current.
    #[inline(always)]
    fn current_mut(&mut self, id: Id) -> Option<(usize, &mut Slot<T>)> {
        let i = self.at(id)?;
        // SAFETY: `at` returns an index in range.
        Some((i, unsafe { self.slots.get_unchecked_mut(i) }))
    }

    /// Takes the value of `id` out, if `id` is current.
    #[inline(always)]
    pub fn remove(&mut self, id: Id) -> Option<T> {
        let (i, slot) = self.current_mut(id)?;
        let value = Self::empty(slot);
        self.free.push(i as u32);
        Some(value)
    }

    /// Moves the value out of a full slot, leaving it free.
    #[inline(always)]
    fn empty(slot: &mut Slot<T>) -> T {
        debug_assert!(slot.full());
        slot.generation = slot.generation.wrapping_add(1) & GENERATION_MASK;
        // SAFETY: the slot was full (callers checked its generation against a current id, or
        // its parity), so its value is initialised; the new even generation marks it empty, so
        // it is never read again before the next `insert` writes it.
        unsafe { slot.value.assume_init_read() }
    }

    /// Takes the value of `id` out, if `id` is current and `take` (reading what it needs of
    /// the value where it lies) returns something; the value is then forgotten, not dropped.
    /// When `take` returns `None` the value stays.
    ///
    /// # Safety
    /// When it returns `Some`, `take` must have moved out (`std::ptr::read`) every part of the
    /// value that needs dropping (the slot is marked empty without running its destructor);
    /// when it returns `None`, it must have moved nothing out.
    #[inline(always)]
    pub unsafe fn take_read<R>(&mut self, id: Id, take: impl FnOnce(&T) -> Option<R>) -> Option<R> {
        let (i, slot) = self.current_mut(id)?;
        // SAFETY: a current slot is full; the caller's contract covers what `take` moves out,
        // and the new even generation marks the slot empty, so the value is never read or
        // dropped again.
        let r = take(unsafe { slot.value.assume_init_ref() })?;
        slot.generation = slot.generation.wrapping_add(1) & GENERATION_MASK;
        self.free.push(i as u32);
        Some(r)
    }

    /// The value of `id`, if `id` is current.
    #[inline(always)]
    pub fn get(&self, id: Id) -> Option<&T> {
        // SAFETY: a current slot is full.
        self.current(id).map(|s| unsafe { s.value.assume_init_ref() })
    }

    /// The value of `id`, mutably, if `id` is current.
    #[inline(always)]
    pub fn get_mut(&mut self, id: Id) -> Option<&mut T> {
        // SAFETY: a current slot is full.
        self.current_mut(id).map(|(_, s)| unsafe { s.value.assume_init_mut() })
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
            // SAFETY: a full slot's value is initialised.
            if slot.full() && pick(unsafe { slot.value.assume_init_ref() }) {
                self.free.push(i as u32);
                f(Self::empty(slot));
            }
        }
    }
}

impl<T> Drop for Slab<T> {
    fn drop(&mut self) {
        if self.free.len() == self.slots.len() {
            // (the usual end: no look at every slot)
            return;
        }
        for slot in self.slots.iter_mut().filter(|s| s.full()) {
            // SAFETY: a full slot's value is initialised, and dropped once: the slab goes.
            unsafe { slot.value.assume_init_drop() };
        }
    }
}

/// A first-in first-out queue of values in a [`Slab`], linked through the slab's slots: it
/// never allocates and has no capacity of its own. A value is in one `Fifo` at most, and
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
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether it has no member.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends the value of `id` (which must be in `slab` and in no other queue).
    #[inline(always)]
    pub fn push<T>(&mut self, slab: &mut Slab<T>, id: Id) {
        let i = id.slot() as u32;
        if self.len > 0 {
            let Some(t) = slab.slots.get_mut(self.tail as usize) else { return self.lost(slab) };
            t.link = i;
        } else {
            self.head = i;
        }
        self.tail = i;
        self.len += 1;
    }

    /// Puts the value of `id` (which must be in `slab` and in no other queue) first.
    #[inline]
    pub fn push_front<T>(&mut self, slab: &mut Slab<T>, id: Id) {
        let i = id.slot() as u32;
        if self.len > 0 {
            let Some(s) = slab.slots.get_mut(i as usize) else { return self.lost(slab) };
            s.link = self.head;
        } else {
            self.tail = i;
        }
        self.head = i;
        self.len += 1;
    }

    /// The first member's slot, checked to be full (a member that left the slab is a bug:
    /// counted, and the queue reset).
    #[inline(always)]
    fn head_slot<'a, T>(&mut self, slab: &'a Slab<T>) -> Option<&'a Slot<T>> {
        match slab.slots.get(self.head as usize) {
            Some(s) if s.full() => Some(s),
            _ => {
                self.lost(slab);
                None
            }
        }
    }

    /// The id of the first member.
    #[inline(always)]
    pub fn front<T>(&self, slab: &Slab<T>) -> Option<Id> {
        if self.len == 0 {
            return None;
        }
        let slot = slab.slots.get(self.head as usize).filter(|s| s.full())?;
        Some(Id::new(slot.generation, self.head))
    }

    /// Takes the first member out of the queue (it stays in the slab); returns its id.
    #[inline(always)]
    pub fn pop<T>(&mut self, slab: &Slab<T>) -> Option<Id> {
        if self.len == 0 {
            return None;
        }
        let head = self.head;
        let slot = self.head_slot(slab)?;
        self.head = slot.link;
        self.len -= 1;
        Some(Id::new(slot.generation, head))
    }

    /// Takes the first member out of the queue (it stays in the slab); returns its id and its
    /// value, mutably, from the one visit of its slot.
    #[inline(always)]
    pub fn pop_mut<'a, T>(&mut self, slab: &'a mut Slab<T>) -> Option<(Id, &'a mut T)> {
        if self.len == 0 {
            return None;
        }
        let head = self.head;
        if !slab.slots.get(head as usize).is_some_and(|s| s.full()) {
            self.lost(slab);
            return None;
        }
        let slot = slab.slots.get_mut(head as usize)?;
        self.head = slot.link;
        self.len -= 1;
        let id = Id::new(slot.generation, head);
        // SAFETY: the slot is full (its generation is odd), so its value is initialised.
        Some((id, unsafe { slot.value.assume_init_mut() }))
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
        let (id, v) = a.pop_mut(&mut s).unwrap();
        assert_eq!((id, v.0), (ids[3], 'z'));
        v.1 = 9;
        assert_eq!(s.get(ids[3]), Some(&('z', 9)), "still in the slab, changed in place");
        assert_eq!(a.pop(&s), None);
        assert!(a.pop_mut(&mut s).is_none());
    }

    #[test]
    fn a_value_put_first_comes_out_first() {
        let mut s = Slab::new(8);
        let mut q = Fifo::new();
        let ids: Vec<Id> = (0..4).map(|i| s.insert(i).unwrap()).collect();
        q.push_front(&mut s, ids[1]); // into an empty queue: first and last
        q.push(&mut s, ids[2]);
        q.push_front(&mut s, ids[0]);
        q.push(&mut s, ids[3]);
        assert_eq!(q.len(), 4);
        let order: Vec<Id> = std::iter::from_fn(|| q.pop(&s)).collect();
        assert_eq!(order, ids);
        assert!(q.is_empty());
    }

    #[test]
    fn take_read_takes_only_what_it_is_given_and_forgets_the_rest() {
        use std::rc::Rc;
        let mut s = Slab::new(2);
        let held = Rc::new(());
        let id = s.insert((Rc::clone(&held), 7u32)).unwrap();
        // `None`: nothing moved out, the value stays.
        // SAFETY: the closure moves nothing out when it returns `None`.
        let kept = unsafe { s.take_read(id, |v: &(Rc<()>, u32)| (v.1 == 8).then_some(())) };
        assert_eq!(kept, None);
        assert_eq!(s.get(id).map(|v| v.1), Some(7));
        // `Some`: the one part that needs dropping moved out, the record forgotten.
        // SAFETY: the `Rc`, the only part with drop glue, is read out exactly once.
        let taken = unsafe { s.take_read(id, |v: &(Rc<()>, u32)| Some(std::ptr::read(&v.0))) };
        assert_eq!(Rc::strong_count(&held), 2, "moved, not cloned nor dropped");
        drop(taken);
        assert_eq!(Rc::strong_count(&held), 1);
        assert_eq!(s.get(id), None, "the slot is free");
        assert_eq!(s.len(), 0);
        // SAFETY: as above (and a stale id finds nothing).
        assert_eq!(unsafe { s.take_read(id, |_: &(Rc<()>, u32)| Some(())) }, None);
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
        s.slots[0].generation = (u32::MAX >> 1) - 1;
        let id = s.insert(()).unwrap();
        assert_eq!((id.generation(), id.slot()), (u64::from(u32::MAX >> 1), 0));
        assert!(id.raw() < 1 << 63);
        s.remove(id).unwrap();
        let id = s.insert(()).unwrap();
        assert_eq!((id.generation(), id.slot()), (1, 0), "wrapped, and odd: full");
    }

    #[test]
    fn an_id_past_the_slots_or_of_another_generation_finds_nothing() {
        let mut s = Slab::new(2);
        let a = s.insert('a').unwrap();
        let b = s.insert('b').unwrap();
        // (the lookup reads the last slot for a slot past the end: its generation matches)
        let past = Id::new(b.generation() as u32, 7);
        assert_eq!(s.get(past), None);
        assert!(s.get_mut(past).is_none());
        assert_eq!(s.remove(past), None);
        // SAFETY: `take` moves nothing out (a `char` needs no drop).
        assert_eq!(unsafe { s.take_read(past, |c| Some(*c)) }, None);
        let stale = Id::new(a.generation() as u32 + 2, a.slot() as u32);
        assert_eq!(s.get(stale), None);
        assert_eq!(s.remove(stale), None);
        assert_eq!((s.get(a), s.get(b)), (Some(&'a'), Some(&'b')));
        assert_eq!(s.len(), 2);
        // A slab asked for no slots has one (never empty: a lookup reads a slot first).
        let mut none = Slab::new(0);
        let id = none.insert(1).unwrap();
        assert_eq!(none.get(id), Some(&1));
        assert_eq!(none.insert(2), Err(2));
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

    #[test]
    fn a_dropped_slab_drops_the_values_it_holds_once() {
        use std::rc::Rc;
        let held = Rc::new(());
        let mut s = Slab::new(64);
        let ids: Vec<Id> = (0..5).map(|_| s.insert(held.clone()).unwrap()).collect();
        drop(s.remove(ids[1]));
        drop(s.remove(ids[3]));
        assert_eq!(Rc::strong_count(&held), 4);
        drop(s);
        assert_eq!(Rc::strong_count(&held), 1, "the three held values dropped, once each");
        let mut empty = Slab::new(64);
        let id = empty.insert(held.clone()).unwrap();
        drop(empty.remove(id));
        drop(empty);
        assert_eq!(Rc::strong_count(&held), 1);
    }
}
