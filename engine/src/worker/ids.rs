//! The ids a work request carries: a request's slab id, or a receive's slot, lane and index;
//! encoded and decoded here only.

use super::requests::ReqId;
use crate::tunables::RECV_INDEX_BITS;

/// A receive's identity: connection slot, lane, and its index among the lane's receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecvId {
    pub(crate) slot: u16,
    pub(crate) lane: u8,
    pub(crate) index: u16,
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
                    | u64::from(r.slot) << 16
                    | u64::from(r.lane) << RECV_INDEX_BITS
                    | u64::from(r.index)
            }
        }
    }

    /// The id a completion carries, read back.
    #[inline(always)]
    pub(crate) fn decode(wr_id: u64) -> WrId {
        if wr_id & RECV_FLAG == 0 {
            return WrId::Req(ReqId::from_raw(wr_id));
        }
        WrId::Recv(RecvId {
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
        let recv = |slot, lane, index| WrId::Recv(RecvId { slot, lane, index });
        for id in [
            WrId::Req(ReqId::from_raw(0)),
            WrId::Req(ReqId::from_raw((1 << 40) | 7)),
            recv(0, 0, 0),
            recv(u16::MAX, 7, (1 << RECV_INDEX_BITS) - 1),
            recv(513, 3, 4000),
        ] {
            assert_eq!(WrId::decode(id.encode()), id);
        }
        assert_ne!(recv(1, 0, 0).encode(), recv(0, 1, 0).encode());
    }
}
