//! Per-worker registered buffer pools in size classes.
//!
//! One registration per class (a single memory region sliced into equal buffers), a free list
//! per class sized at start-up, so getting and returning a buffer never allocates. A [`Buf`]
//! holds an `Rc` of its pool: it cannot leave its worker's thread (it is `!Send`), and dropping it
//! returns it to its class. Pool memory is registered for local access only, so no peer can
//! write it; the device writes a buffer only while the engine holds it for a posted request,
//! which is why a `Buf` can hand out plain slices.

use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

use corelink_verbs::{AccessFlags, Mr, Pd, Provider, Sge};

use crate::error::{EngineError, Result};

struct Class<P: Provider> {
    size: usize,
    mr: P::Mr,
    free: RefCell<Vec<u32>>,
    count: usize,
}

struct Inner<P: Provider> {
    classes: Vec<Class<P>>,
}

/// A worker's buffer pool.
pub struct Pool<P: Provider> {
    inner: Rc<Inner<P>>,
}

impl<P: Provider> fmt::Debug for Pool<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut l = f.debug_list();
        for c in &self.inner.classes {
            l.entry(&format_args!("{} B: {}/{} free", c.size, c.free.borrow().len(), c.count));
        }
        l.finish()
    }
}

impl<P: Provider> Pool<P> {
    /// Registers `classes` (`(size, count)`, sizes strictly increasing) on `pd`.
    pub fn new(pd: &P::Pd, classes: &[(usize, usize)]) -> Result<Self> {
        if classes.len() > MAX_CLASSES {
            let (size, count) = classes[MAX_CLASSES];
            return Err(EngineError::PoolClass { size, count, why: "at most 256 classes" });
        }
        let mut out = Vec::with_capacity(classes.len());
        let mut prev = 0;
        for &(size, count) in classes {
            let why = if size <= prev {
                Some("sizes must increase")
            } else if size > MAX_BUF {
                Some("sizes must be at most 2^32-1 (a gather entry's length)")
            } else if count == 0 || count > MAX_COUNT {
                Some("counts must be 1..=2^24")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(EngineError::PoolClass { size, count, why });
            }
            prev = size;
            let bytes = size.checked_mul(count).ok_or(EngineError::PoolClass {
                size,
                count,
                why: "its bytes overflow",
            })?;
            let mr = pd.register(bytes, AccessFlags::LOCAL_WRITE).map_err(EngineError::Verbs)?;
            // Hand out low indices first (the free list pops from the back).
            let free = RefCell::new((0..count as u32).rev().collect());
            out.push(Class { size, mr, free, count });
        }
        Ok(Pool { inner: Rc::new(Inner { classes: out }) })
    }

    /// A buffer of at least `len` bytes from the smallest class that has one free, with its
    /// length set to `len`.
    #[inline(always)]
    pub fn get(&self, len: usize) -> Result<Buf<P>> {
        // Inlined where it is called: the smallest class that fits has one free (the rest,
        // the larger classes and the errors, out of line). Sizes increase: the first class
        // that fits is the smallest.
        let first = self.inner.classes.iter().position(|c| c.size >= len);
        match first.and_then(|i| self.take(i, len)) {
            Some(buf) => Ok(buf),
            None => self.get_past_first(first, len),
        }
    }

    /// A free buffer of class `i`, if it has one, with its length set to `len`.
    #[inline(always)]
    fn take(&self, i: usize, len: usize) -> Option<Buf<P>> {
        let index = self.inner.classes[i].free.borrow_mut().pop()?;
        Some(Buf { pool: Rc::clone(&self.inner), at: BufAt::new(i, index, len) })
    }

    /// [`Pool::get`] once class `first`, the smallest that fits (`None`: none does), had no
    /// buffer free: the larger classes, else why not.
    #[cold]
    #[inline(never)]
    fn get_past_first(&self, first: Option<usize>, len: usize) -> Result<Buf<P>> {
        let classes = &self.inner.classes;
        let Some(first) = first else {
            let largest = classes.last().map_or(0, |c| c.size);
            return Err(EngineError::BufferTooLarge { len, largest });
        };
        if let Some(buf) = (first + 1..classes.len()).find_map(|i| self.take(i, len)) {
            return Ok(buf);
        }
        Err(EngineError::PoolExhausted { size: classes[first].size, count: classes[first].count })
    }

    /// Free buffers of each class, smallest first: `(size, free, count)`.
    pub fn occupancy(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.inner.classes.iter().map(|c| (c.size, c.free.borrow().len(), c.count))
    }
}

/// A registered buffer from a [`Pool`]; back to the pool when dropped.
///
/// It cannot leave its worker's thread:
///
/// ```compile_fail,E0277
/// fn is_send<T: Send>() {}
/// is_send::<corelink_engine::Buf<corelink_verbs::soft::Soft>>();
/// ```
pub struct Buf<P: Provider> {
    pool: Rc<Inner<P>>,
    at: BufAt,
}

/// Classes a pool may have at most (a buffer's class is 8 bits of its [`BufAt`]).
const MAX_CLASSES: usize = 256;
/// Buffers a class may have at most (a buffer's index is 24 bits).
const MAX_COUNT: usize = corelink_config::limits::MAX_BUFFERS_PER_CLASS as usize;
/// Bytes a buffer may have at most (its length is 32 bits, as a gather entry's).
const MAX_BUF: usize = u32::MAX as usize;

// (every pool a valid core map asks for fits: its classes, with the receive buffers' class,
// its counts and its sizes, at most 1 GiB)
const _: () = assert!(corelink_config::limits::MAX_POOL_CLASSES < MAX_CLASSES);
const _: () = assert!(MAX_COUNT <= 1 << 24);
const _: () = assert!(1 << 30 <= MAX_BUF);

/// Where a [`Buf`] is and how much of it is in use, in one word: its class (bits 56..64),
/// its index in the class (bits 32..56) and its length (bits 0..32). A `Buf` is then two
/// words, which the compiler keeps in registers and moves whole: a fresh buffer written field
/// by field and then moved by a wider load cannot have its stores forwarded, and the load
/// waits for them to reach the cache (once per buffer, on the hot path).
#[derive(Clone, Copy)]
struct BufAt(u64);

impl BufAt {
    #[inline(always)]
    fn new(class: usize, index: u32, len: usize) -> BufAt {
        BufAt((class as u64) << 56 | u64::from(index) << 32 | len as u64)
    }

    #[inline(always)]
    fn class(self) -> usize {
        (self.0 >> 56) as usize
    }

    #[inline(always)]
    fn index(self) -> u32 {
        (self.0 >> 32) as u32 & 0xff_ffff
    }

    #[inline(always)]
    fn len(self) -> usize {
        self.0 as u32 as usize
    }

    /// The same buffer with `len` bytes in use (at most its capacity, so at most `MAX_BUF`).
    #[inline(always)]
    fn with_len(self, len: usize) -> BufAt {
        BufAt(self.0 & !u64::from(u32::MAX) | len as u64)
    }
}

impl<P: Provider> fmt::Debug for Buf<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buf").field("len", &self.len()).field("capacity", &self.capacity()).finish()
    }
}

impl<P: Provider> Buf<P> {
    #[inline(always)]
    fn class(&self) -> &Class<P> {
        &self.pool.classes[self.at.class()]
    }

    #[inline(always)]
    fn ptr(&self) -> *mut u8 {
        let c = self.class();
        // SAFETY: index < count and the region holds size * count bytes.
        unsafe { c.mr.as_ptr().add(self.at.index() as usize * c.size) }
    }

    /// Bytes in use.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// Whether no byte is in use.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the buffer can hold.
    #[inline(always)]
    pub fn capacity(&self) -> usize {
        self.class().size
    }

    /// Sets the bytes in use (at most the capacity).
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.capacity() {
            return Err(EngineError::BufferTooLarge { len, largest: self.capacity() });
        }
        self.at = self.at.with_len(len);
        Ok(())
    }

    /// Copies `data` in and sets the length to match.
    pub fn fill(&mut self, data: &[u8]) -> Result<()> {
        self.set_len(data.len())?;
        self.as_mut_slice().copy_from_slice(data);
        Ok(())
    }

    /// The bytes in use.
    #[inline(always)]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the range lies in the pool's region, which lives as long as `self.pool`; no
        // peer may write it (registered without remote rights) and the device writes it only
        // for a posted request, during which the engine holds this `Buf` (not the application).
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len()) }
    }

    /// The bytes in use, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len()) }
    }

    /// The scatter/gather entry of the bytes in use (`len`) or of the whole buffer.
    #[inline(always)]
    pub fn sge(&self, whole: bool) -> Sge {
        let length = if whole { self.capacity() } else { self.len() } as u32;
        Sge { addr: self.ptr() as u64, length, lkey: self.class().mr.lkey() }
    }
}

impl<P: Provider> Drop for Buf<P> {
    #[inline]
    fn drop(&mut self) {
        self.class().free.borrow_mut().push(self.at.index());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corelink_verbs::soft::{Soft, DEVICE_NAME};
    use corelink_verbs::Context;

    fn pool() -> Pool<Soft> {
        let ctx = Soft::open(DEVICE_NAME).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        Pool::new(&pd, &[(64, 2), (4096, 1)]).unwrap()
    }

    #[test]
    fn smallest_fitting_class_then_larger_then_exhausted() {
        let p = pool();
        let a = p.get(10).unwrap();
        let b = p.get(64).unwrap();
        assert_eq!((a.capacity(), b.capacity()), (64, 64));
        let c = p.get(1).unwrap();
        assert_eq!(c.capacity(), 4096, "falls through to the next class");
        let e = p.get(1).unwrap_err();
        assert!(matches!(e, EngineError::PoolExhausted { size: 64, count: 2 }), "{e}");
        drop(a);
        let mut d = p.get(5).unwrap();
        d.fill(b"hello").unwrap();
        assert_eq!(d.as_slice(), b"hello");
        assert_eq!(d.sge(false).length, 5);
        assert!(matches!(
            p.get(5000),
            Err(EngineError::BufferTooLarge { len: 5000, largest: 4096 })
        ));
        assert!(d.set_len(65).is_err());
        drop((b, c, d));
        assert_eq!(p.occupancy().collect::<Vec<_>>(), vec![(64, 2, 2), (4096, 1, 1)]);
    }

    #[test]
    fn bad_classes_are_refused() {
        let ctx = Soft::open(DEVICE_NAME).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        assert!(Pool::<Soft>::new(&pd, &[(64, 1), (32, 1)]).is_err());
        assert!(Pool::<Soft>::new(&pd, &[(64, 0)]).is_err());
        // Past what a buffer's handle holds: its index (24 bits), its length (32 bits), its
        // class (8 bits); refused before anything is registered.
        let e = Pool::<Soft>::new(&pd, &[(64, MAX_COUNT + 1)]).unwrap_err();
        assert!(matches!(e, EngineError::PoolClass { why, .. } if why.contains("2^24")), "{e}");
        assert!(Pool::<Soft>::new(&pd, &[(MAX_BUF + 1, 1)]).is_err());
        let many: Vec<_> = (1..=MAX_CLASSES + 1).map(|i| (i * 8, 1)).collect();
        assert!(Pool::<Soft>::new(&pd, &many).is_err());
    }

    #[test]
    fn a_buffer_handle_keeps_its_class_index_and_length_apart() {
        let at = BufAt::new(255, (1 << 24) - 1, u32::MAX as usize);
        assert_eq!((at.class(), at.index(), at.len()), (255, (1 << 24) - 1, u32::MAX as usize));
        let at = at.with_len(7);
        assert_eq!((at.class(), at.index(), at.len()), (255, (1 << 24) - 1, 7));
        let at = BufAt::new(3, 5, 0).with_len(1 << 30);
        assert_eq!((at.class(), at.index(), at.len()), (3, 5, 1 << 30));
        // A pool's buffers: each its own place, lengths set and read back.
        let p = pool();
        let (mut a, mut b, c) = (p.get(1).unwrap(), p.get(64).unwrap(), p.get(100).unwrap());
        a.fill(&[1; 64]).unwrap();
        b.fill(&[2; 3]).unwrap();
        assert_eq!((a.len(), b.len(), c.len(), c.capacity()), (64, 3, 100, 4096));
        assert_eq!((a.as_slice(), b.as_slice()), (&[1u8; 64][..], &[2u8; 3][..]));
        assert_ne!(a.sge(true).addr, b.sge(true).addr);
    }
}
