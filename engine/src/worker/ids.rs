//! The ids a work request carries: a request's slab id, or a receive's slot, lane and index;
//! encoded and decoded here only.

use crate::tunables::RECV_INDEX_BITS;

/// A request's id: its slot in the worker's request slab and the slot's generation.
pub(crate) type ReqId = crate::slab::Id;

/// A receive's identity: connection slot, lane, its index among the lane's receives, and
/// its connection's generation (the low [`RECV_GENERATION_BITS`] of it: a completion that
/// comes after its slot was given to another connection is told apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecvId {
    pub(crate) slot: u16,
    pub(crate) lane: u8,
    pub(crate) index: u16,
    pub(crate) generation: u32,
}

/// Bits of a connection's generation a receive's id carries (bits 32..62 of the id).
pub(crate) const RECV_GENERATION_BITS: u32 = 30;
const GENERATION_MASK: u32 = (1 << RECV_GENERATION_BITS) - 1;

impl RecvId {
    /// Receive `index` of lane `lane` of connection `conn`.
    pub(crate) fn of(conn: crate::request::ConnId, lane: u8, index: u16) -> RecvId {
        RecvId { slot: conn.slot, lane, index, generation: conn.generation & GENERATION_MASK }
    }

    /// Whether it is a receive of connection `conn` (not of an earlier one in its slot).
    #[inline(always)]
    pub(crate) fn is_of(&self, conn: crate::request::ConnId) -> bool {
        self.slot == conn.slot && self.generation == conn.generation & GENERATION_MASK
    }
}

/// What a work request's 64-bit id names: a request in the slab (its slab id), or a receive.
/// Encoded and decoded here only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WrId {
    Req(ReqId),
    Recv(RecvId),
}

/// The top bit of a work-request id marks a receive (slab ids stay below it).
const RECV_FLAG: u64 = 1 << 63;

impl WrId {
    /// The id as the device carries it.
    #[inline(always)]
    pub(crate) fn encode(self) -> u64 {
        match self {
            WrId::Req(id) => id.raw(),
            WrId::Recv(r) => {
                RECV_FLAG
                    | u64::from(r.generation & GENERATION_MASK) << 32
                    | u64::from(r.slot) << 16
                    | u64::from(r.lane) << RECV_INDEX_BITS
                    | u64::from(r.index)
            }
        }
    }

    /// The request a work request that names one carries (a send-queue work request's id).
    #[inline(always)]
    pub(crate) fn req_of(wr_id: u64) -> ReqId {
        debug_assert!(wr_id & RECV_FLAG == 0, "a request's work request");
        ReqId::from_raw(wr_id)
    }

    /// The id a completion carries, read back.
    #[inline(always)]
    pub(crate) fn decode(wr_id: u64) -> WrId {
        if wr_id & RECV_FLAG == 0 {
            return WrId::Req(ReqId::from_raw(wr_id));
        }
        WrId::Recv(RecvId {
            generation: (wr_id >> 32) as u32 & GENERATION_MASK,
            slot: (wr_id >> 16) as u16,
            lane: ((wr_id & 0xffff) >> RECV_INDEX_BITS) as u8,
            index: (wr_id & ((1 << RECV_INDEX_BITS) - 1)) as u16,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_request_ids_round_trip() {
        let recv = |slot, lane, index| WrId::Recv(RecvId { slot, lane, index, generation: 5 });
        for id in [
            WrId::Req(ReqId::from_raw(0)),
            WrId::Req(ReqId::from_raw((1 << 40) | 7)),
            recv(0, 0, 0),
            recv(u16::MAX, 7, (1 << RECV_INDEX_BITS) - 1),
            recv(513, 3, 4000),
            WrId::Recv(RecvId { slot: 9, lane: 1, index: 2, generation: GENERATION_MASK }),
        ] {
            assert_eq!(WrId::decode(id.encode()), id);
        }
        assert_ne!(recv(1, 0, 0).encode(), recv(0, 1, 0).encode());
        // A receive of a slot's earlier connection is not the later one's.
        let conn = |generation| crate::request::ConnId { worker: 0, slot: 3, generation };
        let r = RecvId::of(conn(7), 0, 1);
        assert!(r.is_of(conn(7)) && !r.is_of(conn(8)));
        let WrId::Recv(back) = WrId::decode(WrId::Recv(r).encode()) else { panic!() };
        assert!(back.is_of(conn(7)) && !back.is_of(conn(8)));
        assert!(RecvId::of(conn(u32::MAX), 0, 0).is_of(conn(u32::MAX)), "the low bits only");
    }
}
