//! Identifiers: each kind its own newtype.

use std::fmt;

use corelink_engine::ConnId;

/// A request type: the number a service registers a handler under and a call names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqType(pub u16);

impl fmt::Display for ReqType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "type {}", self.0)
    }
}

/// A session of an endpoint: its index in the endpoint's table and that entry's generation
/// (an id of a closed session never names a later one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionId(pub(crate) u32);

impl SessionId {
    pub(crate) fn new(index: u16, generation: u16) -> Self {
        SessionId(u32::from(generation) << 16 | u32::from(index))
    }

    pub(crate) fn index(self) -> usize {
        usize::from(self.0 as u16)
    }

    pub(crate) fn generation(self) -> u16 {
        (self.0 >> 16) as u16
    }

    /// The id as it travels in the wire header's `session` field.
    pub fn to_wire(self) -> u32 {
        self.0
    }

    /// The id a wire header's `session` field carries.
    pub fn from_wire(word: u32) -> Self {
        SessionId(word)
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}.{}", self.index(), self.generation())
    }
}

/// A group of an endpoint's client sessions that calls are balanced across
/// ([`crate::Endpoint::group`], [`crate::Rpc::call_group`]): its index in the endpoint's
/// table of groups (groups are never removed, so an id names one group for the endpoint's
/// life).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupId(pub(crate) u16);

impl GroupId {
    pub(crate) fn index(self) -> usize {
        usize::from(self.0)
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "group {}", self.0)
    }
}

/// A call in flight on an endpoint (its index in the call table and that entry's generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallId(pub(crate) u64);

impl CallId {
    /// Generations keep to 28 bits: bits 62 and 63 of an engine token tell the other kinds
    /// of request (a response's send, the reads of large payloads), bit 61 marks the
    /// service's own requests (`Rpc::submit`), and bit 60 a send of packed messages.
    pub(crate) const GENERATION_MASK: u32 = 0x0fff_ffff;

    pub(crate) fn new(index: u32, generation: u32) -> Self {
        CallId(u64::from(generation & Self::GENERATION_MASK) << 32 | u64::from(index))
    }

    pub(crate) fn index(self) -> usize {
        self.0 as u32 as usize
    }

    pub(crate) fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "call {}.{}", self.index(), self.generation())
    }
}

/// An id with a small index of its own (a connection's slot on its worker), the key of a
/// [`SlotMap`].
pub(crate) trait Slotted: Copy + PartialEq {
    /// Its index (reused by later ids, which compare unequal).
    fn index(&self) -> usize;
}

impl Slotted for ConnId {
    #[inline(always)]
    fn index(&self) -> usize {
        ConnId::index(*self)
    }
}

/// Values by [`Slotted`] key (the sessions of a worker's connections, by connection slot):
/// one indexed load and a comparison per look-up, where a hash map cost a hash and a probe
/// on every message. Each entry keeps its whole key, so that a slot's next id finds nothing
/// of the last one's.
#[derive(Debug)]
pub(crate) struct SlotMap<K, V> {
    slots: Vec<Option<(K, V)>>,
    len: usize,
}

impl<K: Slotted, V: Copy> SlotMap<K, V> {
    /// Room for keys of index below `n` (grown on demand beyond).
    pub(crate) fn with_capacity(n: usize) -> Self {
        SlotMap { slots: Vec::with_capacity(n), len: 0 }
    }

    /// The value of `key`, if it has one.
    #[inline]
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        match self.slots.get(key.index()) {
            Some(Some((k, v))) if k == key => Some(v),
            _ => None,
        }
    }

    /// `key`'s value is `value` (replacing what its index held).
    pub(crate) fn insert(&mut self, key: K, value: V) {
        let i = key.index();
        if self.slots.len() <= i {
            self.slots.resize(i + 1, None);
        }
        if self.slots[i].replace((key, value)).is_none() {
            self.len += 1;
        }
    }

    /// Takes `key`'s entry out; its value.
    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let e = self.slots.get_mut(key.index())?;
        match *e {
            Some((k, v)) if k == *key => {
                *e = None;
                self.len -= 1;
                Some(v)
            }
            _ => None,
        }
    }

    /// Entries in it.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_keep_index_and_generation_apart() {
        let s = SessionId::new(65535, 7);
        assert_eq!((s.index(), s.generation()), (65535, 7));
        assert_eq!(SessionId::from_wire(s.to_wire()), s);
        let c = CallId::new(u32::MAX, u32::MAX);
        assert_eq!((c.index(), c.generation()), (u32::MAX as usize, CallId::GENERATION_MASK));
        assert_eq!(c.0 >> 62, 0, "bits 62 and 63 stay clear for the other tokens");
    }

    #[test]
    fn a_slot_map_tells_a_slots_ids_apart() {
        #[derive(Clone, Copy, Debug, PartialEq)]
        struct Key(u16, u32);
        impl Slotted for Key {
            fn index(&self) -> usize {
                usize::from(self.0)
            }
        }
        let mut m: SlotMap<Key, u32> = SlotMap::with_capacity(2);
        for i in 0..100u16 {
            m.insert(Key(i, 1), u32::from(i));
        }
        assert_eq!(m.len(), 100);
        assert!((0..100u16).all(|i| m.get(&Key(i, 1)) == Some(&u32::from(i))));
        // A slot's next id: the old one finds nothing, and removing it takes nothing.
        m.insert(Key(7, 2), 70);
        assert_eq!((m.get(&Key(7, 1)), m.get(&Key(7, 2)), m.len()), (None, Some(&70), 100));
        assert_eq!(m.remove(&Key(7, 1)), None);
        assert_eq!(m.remove(&Key(7, 2)), Some(70));
        assert_eq!((m.get(&Key(7, 2)), m.len()), (None, 99));
        assert_eq!(m.remove(&Key(500, 1)), None, "beyond the table");
    }
}
