//! Single-producer single-consumer rings: the only way cores talk to each other.
//!
//! A ring of fixed, power-of-two capacity. The producer's and the consumer's indices live on
//! separate cache lines, and each side keeps a cached copy of the other's index so that a push
//! or pop touches the shared line only when the cached view says the ring is full or empty.
//! Neither end is `Clone`: one producer and one consumer, enforced by the types. Both ends are
//! `Send` (when `T` is), so each can be moved to the thread that will own it; a full ring hands
//! the value back instead of dropping it.

use std::cell::Cell;
use std::mem::MaybeUninit;

use crossbeam_utils::CachePadded;

use crate::sync::{Arc, AtomicUsize, Ordering, UnsafeCell};

struct Shared<T> {
    /// Next slot the producer writes (only the producer stores it).
    tail: CachePadded<AtomicUsize>,
    /// Next slot the consumer reads (only the consumer stores it).
    head: CachePadded<AtomicUsize>,
    mask: usize,
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
}

// SAFETY: a slot is written only by the producer while it is outside head..tail and read only
// by the consumer while it is inside; the Release/Acquire pairs on `tail` and `head` order those
// accesses. So sharing `Shared` between the two threads moves `T`s across threads, which needs
// `T: Send` and nothing more.
unsafe impl<T: Send> Sync for Shared<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for Shared<T> {}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Relaxed);
        for i in head..tail {
            let slot = &self.slots[i & self.mask];
            // SAFETY: slots in head..tail hold initialised values that nobody else will read:
            // both ends are gone (this is the last `Arc`).
            slot.with_mut(|p| unsafe { (*p).assume_init_drop() });
        }
    }
}

/// The sending end of a ring.
///
/// Not `Clone` (one producer) and not `Sync` (used through `&mut` by its one thread):
///
/// ```compile_fail,E0599
/// let (p, _c) = corelink_engine::bench_support::ring::<u8>(2);
/// let _q = p.clone();
/// ```
///
/// ```compile_fail,E0277
/// fn is_sync<T: Sync>() {}
/// is_sync::<corelink_engine::bench_support::Producer<u8>>();
/// ```
pub struct Producer<T> {
    shared: Arc<Shared<T>>,
    /// The consumer's `head` as last read.
    head_cache: Cell<usize>,
}

/// The receiving end of a ring.
///
/// Not `Clone` (one consumer):
///
/// ```compile_fail,E0599
/// let (_p, c) = corelink_engine::bench_support::ring::<u8>(2);
/// let _d = c.clone();
/// ```
pub struct Consumer<T> {
    shared: Arc<Shared<T>>,
    /// The producer's `tail` as last read.
    tail_cache: Cell<usize>,
}

// SAFETY: an end is used by one thread at a time (`&mut self` for push/pop; `Cell` caches are
// only touched through the end itself), and moving it moves `T`s' ownership, hence `T: Send`.
unsafe impl<T: Send> Send for Producer<T> {}
// SAFETY: as for `Producer`.
unsafe impl<T: Send> Send for Consumer<T> {}

impl<T> std::fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .finish()
    }
}

impl<T> std::fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .finish()
    }
}

/// A ring holding `capacity` items (rounded up to a power of two, at least 2).
pub fn ring<T>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    let cap = capacity.max(2).next_power_of_two();
    let slots = (0..cap).map(|_| UnsafeCell::new(MaybeUninit::uninit())).collect();
    let shared = Arc::new(Shared {
        tail: CachePadded::new(AtomicUsize::new(0)),
        head: CachePadded::new(AtomicUsize::new(0)),
        mask: cap - 1,
        slots,
    });
    (
        Producer { shared: shared.clone(), head_cache: Cell::new(0) },
        Consumer { shared, tail_cache: Cell::new(0) },
    )
}

impl<T> Producer<T> {
    /// Appends `value`, or hands it back when the ring is full.
    pub fn push(&mut self, value: T) -> Result<(), T> {
        let s = &*self.shared;
        let tail = s.tail.load(Ordering::Relaxed);
        if tail.wrapping_sub(self.head_cache.get()) > s.mask {
            self.head_cache.set(s.head.load(Ordering::Acquire));
            if tail.wrapping_sub(self.head_cache.get()) > s.mask {
                return Err(value);
            }
        }
        let slot = &s.slots[tail & s.mask];
        // SAFETY: the slot is outside head..tail (checked above against a `head` the consumer
        // published with Release), so the consumer neither reads it nor will until we publish
        // the new tail below; we are the only producer.
        slot.with_mut(|p| unsafe { (*p).write(value) });
        s.tail.store(tail.wrapping_add(1), Ordering::Release);
        Ok(())
    }

    /// Items in the ring now (a snapshot).
    pub fn len(&self) -> usize {
        let s = &*self.shared;
        s.tail.load(Ordering::Relaxed).wrapping_sub(s.head.load(Ordering::Acquire))
    }

    /// Whether the ring is empty now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Items the ring holds at most.
    pub fn capacity(&self) -> usize {
        self.shared.mask + 1
    }

    /// Whether the consumer is gone (pushes still succeed until the ring fills).
    pub fn is_abandoned(&self) -> bool {
        Arc::strong_count(&self.shared) == 1
    }
}

impl<T> Consumer<T> {
    /// Takes the oldest item, if any.
    pub fn pop(&mut self) -> Option<T> {
        let s = &*self.shared;
        let head = s.head.load(Ordering::Relaxed);
        if head == self.tail_cache.get() {
            self.tail_cache.set(s.tail.load(Ordering::Acquire));
            if head == self.tail_cache.get() {
                return None;
            }
        }
        let slot = &s.slots[head & s.mask];
        // SAFETY: the slot is inside head..tail (the producer published it with Release and we
        // loaded `tail` with Acquire), so it holds an initialised value the producer will not
        // touch until we publish the new head below; we are the only consumer.
        let value = slot.with(|p| unsafe { (*p).assume_init_read() });
        s.head.store(head.wrapping_add(1), Ordering::Release);
        Some(value)
    }

    /// Whether an item is there to pop: the producer index read (with Acquire, and cached for
    /// [`Consumer::pop`]) and compared, without a branch (a worker asks once an iteration,
    /// where the ring is most often empty and the index is read anyway).
    #[inline]
    pub fn ready(&self) -> bool {
        let s = &*self.shared;
        let tail = s.tail.load(Ordering::Acquire);
        self.tail_cache.set(tail);
        s.head.load(Ordering::Relaxed) != tail
    }

    /// Items in the ring now (a snapshot).
    pub fn len(&self) -> usize {
        let s = &*self.shared;
        s.tail.load(Ordering::Acquire).wrapping_sub(s.head.load(Ordering::Relaxed))
    }

    /// Whether the ring is empty now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Items the ring holds at most.
    pub fn capacity(&self) -> usize {
        self.shared.mask + 1
    }

    /// Whether the producer is gone (items already pushed can still be popped).
    pub fn is_abandoned(&self) -> bool {
        Arc::strong_count(&self.shared) == 1
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_full() {
        let (mut p, mut c) = ring::<u32>(3);
        assert_eq!(p.capacity(), 4);
        for i in 0..4 {
            p.push(i).unwrap();
        }
        assert_eq!(p.push(9), Err(9), "a full ring hands the value back");
        assert_eq!(c.len(), 4);
        for i in 0..4 {
            assert_eq!(c.pop(), Some(i));
        }
        assert_eq!(c.pop(), None);
    }

    #[test]
    fn ready_says_whether_a_pop_would_take_an_item() {
        let (mut p, mut c) = ring::<u32>(2);
        assert!(!c.ready(), "empty");
        p.push(1).unwrap();
        p.push(2).unwrap();
        assert!(c.ready());
        assert_eq!(c.pop(), Some(1));
        assert!(c.ready(), "one left");
        assert_eq!(c.pop(), Some(2));
        assert!(!c.ready(), "empty again");
        p.push(3).unwrap();
        assert!(c.ready(), "an item pushed after the last look");
        assert_eq!(c.pop(), Some(3));
    }

    #[test]
    fn drops_what_is_left() {
        let item = std::sync::Arc::new(());
        let (mut p, c) = ring(4);
        p.push(item.clone()).unwrap();
        p.push(item.clone()).unwrap();
        assert!(!p.is_abandoned());
        drop(c);
        assert!(p.is_abandoned());
        drop(p);
        assert_eq!(std::sync::Arc::strong_count(&item), 1);
    }

    #[test]
    fn two_threads_in_order() {
        let (mut p, mut c) = ring::<u64>(64);
        const N: u64 = 200_000;
        let t = std::thread::spawn(move || {
            let mut i = 0;
            while i < N {
                if p.push(i).is_ok() {
                    i += 1;
                }
            }
        });
        let mut next = 0;
        while next < N {
            if let Some(v) = c.pop() {
                assert_eq!(v, next);
                next += 1;
            }
        }
        t.join().unwrap();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    #[test]
    fn push_pop_across_threads() {
        loom::model(|| {
            let (mut p, mut c) = ring::<usize>(2);
            let t = loom::thread::spawn(move || {
                let mut sent = 0;
                while sent < 3 {
                    if p.push(sent).is_ok() {
                        sent += 1;
                    } else {
                        loom::thread::yield_now();
                    }
                }
            });
            let mut got = 0;
            while got < 3 {
                match c.pop() {
                    Some(v) => {
                        assert_eq!(v, got);
                        got += 1;
                    }
                    None => loom::thread::yield_now(),
                }
            }
            t.join().unwrap();
        });
    }

    /// The control core and a worker talk over one ring each way: a request goes out, its
    /// answer comes back, in every interleaving.
    #[test]
    fn request_and_response_rings() {
        loom::model(|| {
            let (mut to_worker, mut worker_in) = ring::<usize>(2);
            let (mut worker_out, mut from_worker) = ring::<usize>(2);
            let worker = loom::thread::spawn(move || {
                let mut served = 0;
                while served < 2 {
                    match worker_in.pop() {
                        Some(v) => {
                            let mut answer = v * 10;
                            while let Err(back) = worker_out.push(answer) {
                                answer = back;
                                loom::thread::yield_now();
                            }
                            served += 1;
                        }
                        None => loom::thread::yield_now(),
                    }
                }
            });
            for v in 1..=2 {
                to_worker.push(v).unwrap();
                let answer = loop {
                    match from_worker.pop() {
                        Some(a) => break a,
                        None => loom::thread::yield_now(),
                    }
                };
                assert_eq!(answer, v * 10);
            }
            worker.join().unwrap();
        });
    }

    #[test]
    fn values_left_in_the_ring_are_dropped_once() {
        loom::model(|| {
            let item = loom::sync::Arc::new(());
            let (mut p, mut c) = ring(2);
            let i2 = item.clone();
            let t = loom::thread::spawn(move || {
                let _ = p.push(i2);
            });
            let _ = c.pop();
            t.join().unwrap();
            drop(c);
            assert_eq!(loom::sync::Arc::strong_count(&item), 1);
        });
    }
}
