//! Identifiers: each kind its own newtype.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

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
    /// Generations keep to 29 bits: bits 62 and 63 of an engine token tell the other kinds
    /// of request (a response's send, the reads of large payloads), and bit 61 marks the
    /// service's own requests (`Rpc::submit`).
    pub(crate) const GENERATION_MASK: u32 = 0x1fff_ffff;

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

/// A map keyed by ids the engine or the endpoint hands out (connection ids): hashed with
/// [`IdHasher`], a multiply-rotate hash (Fx's), not SipHash, whose cost showed in every
/// message's session look-up. Its keys are numbers this worker assigns, not a peer's bytes,
/// so there is no flooding to defend against.
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// The hash of [`IdMap`]: each word folded in with a rotate, a xor and a multiply.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IdHasher(u64);

impl IdHasher {
    const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;

    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
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
    fn id_maps_tell_keys_apart() {
        let mut m: IdMap<(u16, u32), u32> = IdMap::default();
        for i in 0..1000u32 {
            m.insert((i as u16, i >> 3), i);
        }
        assert_eq!(m.len(), 1000);
        assert!((0..1000u32).all(|i| m.get(&(i as u16, i >> 3)) == Some(&i)));
    }
}
