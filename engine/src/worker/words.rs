//! Where atomics' old values land: one 8-byte word for each request slot, in memory registered
//! once when the worker starts. An atomic then needs no buffer from the pool (nothing to take
//! at its submission, nothing to give back at its completion), and cannot fail for want of
//! one. A word is its request's while the request lives: the slot, and so the word, is reused
//! only once the request was taken out of the slab, after its completion was read.

use corelink_verbs::{AccessFlags, Mr as _, Pd as _, Provider, Sge};

use super::ids::ReqId;
use crate::error::EngineError;

/// Bytes of a word (an atomic's operand and old value).
const WORD: usize = 8;

/// The words of a worker's request slots.
pub(crate) struct Words<P: Provider> {
    /// (kept registered for as long as the words are used)
    _mr: P::Mr,
    at: WordsAt,
}

/// Where the words are: what a work request names (copied where the request's record is
/// borrowed from the slab that holds the words).
#[derive(Clone, Copy, Debug)]
pub(crate) struct WordsAt {
    base: u64,
    lkey: u32,
    /// Words there are (one per request slot).
    count: usize,
}

impl<P: Provider> Words<P> {
    /// `count` words (at least one), registered on `pd` for the device to write.
    pub(crate) fn new(pd: &P::Pd, count: usize) -> crate::Result<Self> {
        let count = count.max(1);
        let mr = pd.register(count * WORD, AccessFlags::LOCAL_WRITE).map_err(EngineError::Verbs)?;
        let at = WordsAt { base: mr.addr(), lkey: mr.lkey(), count };
        Ok(Words { _mr: mr, at })
    }

    /// Where they are.
    #[inline(always)]
    pub(crate) fn at(&self) -> WordsAt {
        self.at
    }

    /// What the device wrote into request `id`'s word: the old value of the atomic whose
    /// completion (a success) is being read.
    #[inline(always)]
    pub(crate) fn read(&self, id: ReqId) -> u64 {
        let addr = self.at.base + self.at.offset(id) as u64;
        // SAFETY: the word lies inside the region (`offset` clamps), which lives as long as
        // `self`; the registered memory is page-aligned, so a word at a multiple of 8 is
        // aligned. The device wrote it before the completion that the caller polled; nothing
        // holds a reference into the region (its words are read and written through pointers
        // only).
        unsafe { std::ptr::read_volatile(addr as *const u64) }
    }
}

impl WordsAt {
    /// The offset of request `id`'s word (clamped into the region: a slab has as many slots
    /// as there are words, `Requests::new`).
    #[inline(always)]
    fn offset(self, id: ReqId) -> usize {
        id.slot().min(self.count - 1) * WORD
    }

    /// The gather entry of request `id`'s word: an atomic's local target.
    #[inline(always)]
    pub(crate) fn sge(self, id: ReqId) -> Sge {
        Sge { addr: self.base + self.offset(id) as u64, length: WORD as u32, lkey: self.lkey }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use corelink_verbs::soft::Soft;
    use corelink_verbs::Context as _;

    #[test]
    fn each_slot_has_its_own_aligned_word_in_the_region() {
        let ctx = Soft::open("soft0").expect("soft");
        let pd = ctx.alloc_pd().expect("pd");
        let words = Words::<Soft>::new(&pd, 4).expect("words");
        let id = |slot: u64| ReqId::from_raw(7 << crate::tunables::SLOT_BITS | slot);
        let sges: Vec<Sge> = (0..4).map(|s| words.at().sge(id(s))).collect();
        for (s, sge) in sges.iter().enumerate() {
            assert_eq!(sge.length, 8);
            assert_eq!(sge.addr % 8, 0, "aligned");
            assert_eq!(sge.addr, sges[0].addr + 8 * s as u64, "one word a slot, in order");
            assert_eq!(sge.lkey, words._mr.lkey());
        }
        assert_eq!(words.at().sge(id(9)).addr, sges[3].addr, "a slot past the words is clamped");
        // What the device writes there is what a completion reads.
        // SAFETY: slot 2's word lies in the region, aligned.
        unsafe { (sges[2].addr as *mut u64).write_volatile(41) };
        assert_eq!(words.read(id(2)), 41);
        assert_eq!(words.read(ReqId::from_raw(2)), 41, "the slot's word, whatever its generation");
    }
}
