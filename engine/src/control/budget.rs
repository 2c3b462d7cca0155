//! What one worker can hold, as the control core admits connections to it: connection slots
//! (`worker.max_conns`), receive buffers (`max_conns * recvs_per_conn`, registered at start)
//! and room on its one CQ (`worker.cq_depth`: every receive and every request on the device of
//! every QP may complete at once, as when a QP flushes). A connect or accept that would exceed
//! one is refused with the limit and its key, before any rdma_cm exchange on the accepting
//! side, so the worker itself never runs short.

use corelink_config::WorkerResources;

use crate::error::{EngineError, Limit, Result};

/// One worker's budget: how much of each limit is reserved by its connections (connecting,
/// accepted while lanes come up, on the worker, closing until their last lane is released).
#[derive(Debug)]
pub(crate) struct Budget {
    worker: usize,
    res: WorkerResources,
    conns: u64,
    recvs: u64,
    cqes: u64,
    /// Connections refused because a limit was reached.
    refused: u64,
}

/// What one connection holds of its worker's budget; given back once, by [`Budget::release`]
/// (it is neither `Clone` nor `Copy`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Reservation {
    recvs: u64,
    cqes: u64,
}

impl Budget {
    /// An empty budget for worker `worker` with the core map's resources.
    pub(crate) fn new(worker: usize, res: &WorkerResources) -> Self {
        Budget { worker, res: res.clone(), conns: 0, recvs: 0, cqes: 0, refused: 0 }
    }

    /// Receive buffers the worker registers for its connections.
    pub(crate) fn recv_buffers(res: &WorkerResources) -> u64 {
        u64::from(res.max_conns) * u64::from(res.recvs_per_conn)
    }

    /// Reserves what a connection of `lanes` lanes needs, or says which limit it would exceed.
    pub(crate) fn reserve(&mut self, lanes: usize) -> Result<Reservation> {
        let lanes = lanes.max(1) as u32;
        let recvs = u64::from(lanes) * u64::from(self.res.recvs_per_lane(lanes));
        let cqes = self.res.cqes_per_conn(lanes);
        let checks = [
            (Limit::Connections, u64::from(self.res.max_conns), self.conns, 1),
            (Limit::ReceiveBuffers, Self::recv_buffers(&self.res), self.recvs, recvs),
            (Limit::CompletionQueue, u64::from(self.res.cq_depth), self.cqes, cqes),
        ];
        for (limit, max, in_use, need) in checks {
            if in_use + need > max {
                self.refused += 1;
                return Err(EngineError::Limit { worker: self.worker, limit, max, in_use, need });
            }
        }
        self.conns += 1;
        self.recvs += recvs;
        self.cqes += cqes;
        Ok(Reservation { recvs, cqes })
    }

    /// Gives a connection's reservation back.
    pub(crate) fn release(&mut self, r: Reservation) {
        debug_assert!(self.conns > 0 && self.recvs >= r.recvs && self.cqes >= r.cqes);
        self.conns = self.conns.saturating_sub(1);
        self.recvs = self.recvs.saturating_sub(r.recvs);
        self.cqes = self.cqes.saturating_sub(r.cqes);
    }

    /// Receives the worker posts on each lane of a connection of `lanes` lanes when it primes
    /// them (its `ConnInfo::recvs_per_lane`).
    pub(crate) fn recvs_per_lane(&self, lanes: u32) -> u32 {
        self.res.recvs_per_lane(lanes)
    }

    /// Connections reserved now.
    pub(crate) fn conns(&self) -> usize {
        self.conns as usize
    }

    /// Connections refused since start.
    pub(crate) fn refused(&self) -> u64 {
        self.refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(text: &str) -> WorkerResources {
        corelink_config::parse(text).unwrap().worker
    }

    #[test]
    fn each_limit_refuses_with_its_key_and_a_release_makes_room() {
        let mut b = Budget::new(3, &res("[worker]\nmax_conns = 2"));
        let r1 = b.reserve(1).unwrap();
        let _r2 = b.reserve(1).unwrap();
        let e = b.reserve(1).unwrap_err();
        assert!(
            matches!(e, EngineError::Limit { worker: 3, limit: Limit::Connections, max: 2, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("worker.max_conns"), "{e}");
        assert_eq!((b.conns(), b.refused()), (2, 1));
        b.release(r1);
        b.reserve(1).unwrap();

        // 8 lanes keep 8 receives each: 64 of the 2 * 32 there are.
        let mut b = Budget::new(0, &res("[worker]\nmax_conns = 2"));
        b.reserve(8).unwrap();
        let e = b.reserve(1).unwrap_err();
        assert!(matches!(e, EngineError::Limit { limit: Limit::ReceiveBuffers, .. }), "{e}");

        // One connection's completions: 32 receives + 256 requests; a CQ of 600 holds two.
        let mut b = Budget::new(0, &res("[worker]\ncq_depth = 600"));
        let (a, c) = (b.reserve(1).unwrap(), b.reserve(1).unwrap());
        assert_eq!(a, Reservation { recvs: 32, cqes: 288 });
        let e = b.reserve(1).unwrap_err();
        assert!(matches!(e, EngineError::Limit { limit: Limit::CompletionQueue, .. }), "{e}");
        assert!(e.to_string().contains("worker.cq_depth"), "{e}");
        b.release(a);
        b.release(c);
        assert_eq!((b.conns, b.recvs, b.cqes), (0, 0, 0));
    }
}
