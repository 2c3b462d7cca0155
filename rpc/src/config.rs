//! An endpoint's settings, checked against the worker's resources.

use std::time::Duration;

use corelink_config::WorkerResources;

use crate::error::{Result, RpcError};

/// Credits per session unless configured otherwise (eRPC's).
pub const DEFAULT_CREDITS: u16 = 32;

/// Orders a worker takes off each [`crate::Handle`]'s ring per loop iteration at most (a
/// burst from one thread cannot hold the worker from its completions for long).
pub const HANDLE_BATCH: usize = 32;

/// Loop iterations between two looks at the calls' deadlines: each look reads the clock,
/// which the engine's loop otherwise reads only when something needs it (a read is a system
/// call on some machines), so a deadline is noticed within this many iterations after it
/// passed (microseconds on a busy worker).
pub const EXPIRE_EVERY: u32 = 32;

/// How long a server keeps a resumable session's record after its connection is lost, unless
/// configured otherwise ([`EndpointConfig::resume`]).
pub const DEFAULT_RESUME: Duration = Duration::from_secs(10);

/// Bytes a message may have to travel packed with others, unless configured otherwise
/// ([`EndpointConfig::pack_max`]).
pub const DEFAULT_PACK_MAX: usize = 1024;

/// Connections whose messages one pass packs at most ([`EndpointConfig::pack_max`]): a
/// message to one more sends the packs open so far first.
pub const PACK_CONNS: usize = 64;

// (A full poll's receives, each from another peer, answered in one pass, pack.)
const _: () = assert!(PACK_CONNS >= corelink_engine::tunables::MAX_POLL_BATCH);

/// An endpoint's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Requests a client session has in flight at most (its slots); calls beyond wait in the
    /// endpoint. At most the receives the engine keeps posted per connection lane, so a
    /// server never gets a request it has no receive for.
    pub credits: u16,
    /// Sessions (client and server) the endpoint holds at most.
    pub max_sessions: u16,
    /// Calls (in flight and waiting for a credit) the endpoint holds at most.
    pub max_calls: u32,
    /// Request types are `0..max_types`.
    pub max_types: u16,
    /// Payload bytes a large message (one beyond the peer's receive) may have; 0: none (such
    /// a call fails with [`RpcError::TooLarge`]). A large payload is read by its receiver
    /// into a buffer of its pools: a pool class must hold this many bytes.
    pub large_max: usize,
    /// Large messages this endpoint's sessions may have out at once (slots of `large_max`
    /// bytes in one registered arena, granted to each session's peer for reads): a large
    /// request holds one until its response comes, a large response until the client's next
    /// request on its slot acknowledges it.
    pub large_slots: u16,
    /// How long a server keeps the record of a resumable session ([`crate::Rpc::connect_with`])
    /// once its connection is lost: its slots' last sequence numbers and responses, so that
    /// the requests its client sends again on the next connection run at most once (a
    /// request already run is answered from the record). Past it, the session ends
    /// ([`crate::SessionEvent::Closed`]) and a request sent again is answered
    /// [`RpcError::OutcomeUnknown`]. Zero: no record is kept. The record holds a response
    /// buffer per slot and the session's place in `max_sessions` meanwhile.
    pub resume: Duration,
    /// Messages (header included) of at most this many bytes that an endpoint sends to one
    /// peer in one pass of its worker's loop, after the pass's first to that peer (which goes
    /// at once from its own buffer), travel together: copied back to back into one send (a
    /// packed receive, [`crate::wire::unpack`]) of up to the peer's receive size and the
    /// largest pool buffer, sent at the end of the pass. A window of small calls then costs
    /// two sends and two receives each way per pass, not one per call. Longer messages, and
    /// those of request types with a class ([`crate::Endpoint::set_class`]), go alone from
    /// their own buffers. Zero: every message goes alone.
    pub pack_max: usize,
}

impl EndpointConfig {
    /// The defaults for a worker with resources `res`: [`DEFAULT_CREDITS`] credits, or fewer
    /// when a connection keeps fewer receives posted; as many sessions as the worker takes
    /// connections.
    pub fn for_worker(res: &WorkerResources) -> Self {
        let recvs = recvs_per_session(res);
        EndpointConfig {
            credits: DEFAULT_CREDITS.min(recvs.min(u32::from(u16::MAX)) as u16).max(1),
            max_sessions: res.max_conns.min(u32::from(u16::MAX)) as u16,
            max_calls: 1 << 16,
            max_types: 256,
            large_max: 0,
            large_slots: 0,
            resume: DEFAULT_RESUME,
            pack_max: DEFAULT_PACK_MAX,
        }
    }

    /// The same with large messages of up to `max` payload bytes, `slots` of them out at once.
    pub fn with_large(self, max: usize, slots: u16) -> Self {
        EndpointConfig { large_max: max, large_slots: slots, ..self }
    }

    /// The same keeping resumable sessions' records for `resume` ([`EndpointConfig::resume`]).
    pub fn with_resume(self, resume: Duration) -> Self {
        EndpointConfig { resume, ..self }
    }

    /// The same packing messages of at most `max` bytes ([`EndpointConfig::pack_max`]; 0:
    /// none).
    pub fn with_pack(self, max: usize) -> Self {
        EndpointConfig { pack_max: max, ..self }
    }

    /// The same with `credits` credits per session.
    pub fn with_credits(self, credits: u16) -> Self {
        EndpointConfig { credits, ..self }
    }

    /// Checks the settings against the worker's resources: credits at least 1 and at most the
    /// receives a connection keeps posted.
    pub fn check(&self, res: &WorkerResources) -> Result<()> {
        let recvs = recvs_per_session(res);
        if self.credits == 0 || u32::from(self.credits) > recvs {
            return Err(RpcError::TooManyCredits { credits: u32::from(self.credits), recvs });
        }
        if self.large_max > 0 {
            let fits = res.pools.iter().any(|c| c.size >= self.large_max);
            if !fits || self.large_slots == 0 || self.large_max > u32::MAX as usize {
                return Err(RpcError::NoLargeBuffers { len: self.large_max });
            }
        }
        Ok(())
    }
}

/// Receives one session's connection keeps posted on each of its lanes (a session sends on
/// whichever lane the engine picks, so the least a lane holds bounds the credits).
pub fn recvs_per_session(res: &WorkerResources) -> u32 {
    res.recvs_per_lane(res.qps.per_conn.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_never_exceed_a_connections_receives() {
        let mut res = WorkerResources::default();
        let cfg = EndpointConfig::for_worker(&res);
        assert_eq!(cfg.credits, 32);
        cfg.check(&res).unwrap();
        res.recvs_per_conn = 8;
        let cfg = EndpointConfig::for_worker(&res);
        assert_eq!(cfg.credits, 8);
        let err = cfg.clone().with_credits(9).check(&res).unwrap_err();
        assert!(matches!(err, RpcError::TooManyCredits { credits: 9, recvs: 8 }), "{err}");
        assert!(cfg.clone().with_credits(0).check(&res).is_err());
        // Large messages need a pool class to read them into.
        assert!(cfg.clone().with_large(65536, 2).check(&res).is_ok());
        let err = cfg.clone().with_large(65537, 2).check(&res).unwrap_err();
        assert!(matches!(err, RpcError::NoLargeBuffers { len: 65537 }), "{err}");
        assert!(cfg.with_large(4096, 0).check(&res).is_err());
    }
}
