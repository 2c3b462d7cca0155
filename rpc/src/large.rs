//! Large messages: an endpoint's arena of registered memory, in equal slots, that its
//! sessions' peers may read. A message larger than the peer's receive puts its payload in a
//! slot and sends a [`Descriptor`](crate::wire::Descriptor) instead; the receiver reads the
//! payload with one RDMA read into a buffer of its pools, when it has one.
//!
//! Why the receiver reads (rather than the sender writing into a buffer the receiver granted):
//! the receiver decides when it has memory for the payload and where it goes, no round trip
//! is needed to ask for a buffer, and the sender's memory is exposed for reads only.

use std::cell::RefCell;
use std::rc::Rc;

use corelink_engine::verbs::{AccessFlags, Provider, RemoteRegion};
use corelink_engine::{ConnId, Cx, Memory};

use crate::error::{Result, RpcError};
use crate::wire::Descriptor;

/// The arena: `slots` slots of `size` bytes.
pub(crate) struct Arena<P: Provider> {
    mem: Memory<P>,
    size: usize,
    free: Rc<RefCell<Vec<u16>>>,
}

/// A slot of the arena, held: back to the arena's free list when dropped.
pub(crate) struct ArenaSlot {
    index: u16,
    free: Rc<RefCell<Vec<u16>>>,
}

impl Drop for ArenaSlot {
    fn drop(&mut self) {
        self.free.borrow_mut().push(self.index);
    }
}

impl<P: Provider> Arena<P> {
    /// Registers `slots` slots of `size` bytes with the worker.
    pub(crate) fn new(cx: &mut Cx<P>, size: usize, slots: u16) -> Result<Self> {
        let bytes = size
            .checked_mul(usize::from(slots))
            .ok_or(RpcError::TooLarge { len: size, max: usize::MAX / usize::from(slots) })?;
        let mem = cx.register_memory(bytes, false)?;
        let free = Rc::new(RefCell::new((0..slots).rev().collect()));
        Ok(Arena { mem, size, free })
    }

    /// Bytes of each slot.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Slots.
    pub(crate) fn slots(&self) -> usize {
        self.mem.len() / self.size.max(1)
    }

    /// Whether a slot is free.
    pub(crate) fn has_free(&self) -> bool {
        !self.free.borrow().is_empty()
    }

    /// A free slot, if one is.
    pub(crate) fn take(&self) -> Option<ArenaSlot> {
        let index = self.free.borrow_mut().pop()?;
        Some(ArenaSlot { index, free: self.free.clone() })
    }

    /// Where `slot` starts in the arena.
    pub(crate) fn offset(&self, slot: &ArenaSlot) -> usize {
        usize::from(slot.index) * self.size
    }

    /// Where a peer granted `region` (this arena, [`Arena::grant`]) reads the first `len`
    /// bytes of `slot`.
    pub(crate) fn descriptor(
        &self,
        slot: &ArenaSlot,
        region: RemoteRegion,
        len: u32,
    ) -> Descriptor {
        let addr = region.addr + self.offset(slot) as u64;
        Descriptor { addr, rkey: region.rkey, len }
    }

    /// The first `len` bytes of `slot`, to write in place.
    pub(crate) fn bytes_mut<'s>(&'s self, slot: &'s mut ArenaSlot, len: usize) -> &'s mut [u8] {
        let len = len.min(self.size);
        let offset = self.offset(slot);
        // SAFETY: `offset + len` lies in the registered region (`slot.index < slots` and
        // `len <= size`), which lives as long as `self.mem`, borrowed for the slice's
        // lifetime; the slot is held by `slot` alone (the free list hands each index
        // out once), and the `&mut` borrow of it makes the slice unique. Peers hold read-only
        // grants (no remote write reaches it), and a peer reads a slot only after its
        // descriptor was sent, which is after this slice is gone.
        unsafe { std::slice::from_raw_parts_mut(self.mem.as_ptr().add(offset), len) }
    }

    /// Grants the whole arena to `conn`'s peer, for reads.
    pub(crate) fn grant(&self, cx: &mut Cx<P>, conn: ConnId) -> Result<RemoteRegion> {
        let g = cx.grant(conn, &self.mem, 0, self.mem.len(), AccessFlags::REMOTE_READ)?;
        Ok(g.region)
    }
}
