//! A worker's QP pool, as the control core keeps it: RC QPs on the worker's PD and CQ, created
//! ahead (at engine start, and again in the control loop when it is idle) and kept ready in
//! INIT with the engine's attributes (where the worker posts a connection's receives before
//! the connection manager's exchange), so that a new connection's lanes take ready QPs instead
//! of creating them or moving them; a released lane's QP comes back for reuse, reset and moved
//! to INIT again when the loop is idle (creates and moves are slow system calls, about 80 us
//! each in the emulated guest: none should delay a connection coming up) or, if a connection
//! needs it first, then. The pool also enforces `worker.qps.max`: the QPs of the worker that
//! exist (in use and pooled) never exceed it.
//!
//! Reuse, per provider:
//! - `soft`: a QP moved to RESET forgets its queues and its peer; `connect` and `accept` take
//!   it from INIT again (RTR towards the new peer's QP number, RTS).
//! - `ibverbs`: the engine's QPs are its own (`ibv_create_qp`), not librdmacm's, so a cm id
//!   never owns one: `connect` and `accept` drive the QP through INIT, RTR and RTS by hand with
//!   `rdma_init_qp_attr`'s attributes for the new id (its port, P_Key, path, destination QP
//!   number and fresh PSNs), and dropping a connection destroys only its id. A QP reset after
//!   its connection-manager side was dropped is therefore as good as a new one. What reuse
//!   keeps is the QP number: the peer's IB CM refuses a request whose QP number it still
//!   holds in an established connection (a stale-connection reject) until it processed our
//!   disconnect. Released QPs are therefore reused oldest first (a FIFO), which puts every
//!   other pooled QP between a release and its reuse.
//!
//! The order matters on both: the connection-manager side is dropped (which, on `soft`, moves
//! the QP it was made with to ERR) before the QP is reset; a QP whose reset fails is destroyed.

use std::collections::VecDeque;
use std::sync::Arc;

use corelink_verbs::{Pd, Provider, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType};

use crate::error::{EngineError, Result};
use crate::metrics::WorkerCounts;

/// One worker's QPs, as the control core accounts for them.
pub(crate) struct QpPool<P: Provider> {
    worker: usize,
    pd: Arc<P::Pd>,
    cq: Arc<P::Cq>,
    cap: QpCap,
    /// What a ready QP is moved to INIT with (the engine's port, GID and access).
    init: QpAttr,
    /// Ready QPs in INIT with `init`, oldest first, each with whether a connection used it
    /// before.
    idle: VecDeque<(P::Qp, bool)>,
    /// QPs given back and not made ready yet (their connection-manager sides dropped),
    /// oldest first: reset and moved to INIT by [`QpPool::settle_one`], or as they are taken.
    released: VecDeque<P::Qp>,
    /// QPs the pool keeps ready (`worker.qps.pool`).
    size: usize,
    /// QPs the worker may have at most (`worker.qps.max`).
    max: usize,
    /// QPs of the worker that exist: in use (connecting, accepted, on the worker) and idle.
    live: usize,
    /// Refilling towards `size` (begun once fewer than half are left).
    refilling: bool,
    counts: WorkerCounts,
}

impl<P: Provider> QpPool<P> {
    /// A pool of `size` new QPs (at most `max` QPs in all) for worker `worker`, each made
    /// ready in INIT with `attr` (its state aside).
    pub(crate) fn new(
        worker: usize,
        (pd, cq): (Arc<P::Pd>, Arc<P::Cq>),
        cap: QpCap,
        attr: &QpAttr,
        size: usize,
        max: usize,
    ) -> Result<Self> {
        let size = size.min(max);
        let mut pool = QpPool {
            worker,
            pd,
            cq,
            cap,
            init: QpAttr { state: QpState::Init, ..*attr },
            idle: VecDeque::with_capacity(size),
            released: VecDeque::with_capacity(size),
            size,
            max,
            live: 0,
            refilling: false,
            counts: WorkerCounts::default(),
        };
        for _ in 0..size {
            let qp = pool.create()?;
            pool.idle.push_back((qp, false));
        }
        Ok(pool)
    }

    /// A new QP, ready (in INIT); none if it cannot be created or moved.
    fn create(&mut self) -> Result<P::Qp> {
        let attr = QpInitAttr::<P> {
            qp_type: QpType::Rc,
            send_cq: &self.cq,
            recv_cq: &self.cq,
            srq: None,
            cap: self.cap,
            sq_sig_all: false,
        };
        let mut qp = self.pd.create_qp(&attr)?;
        self.live += 1;
        self.counts.qps_created += 1;
        if let Err(e) = qp.modify(&self.init) {
            self.destroy(qp);
            return Err(e.into());
        }
        Ok(qp)
    }

    /// `n` QPs in INIT for a connection's lanes (where its worker can post their receives
    /// before the connection manager's exchange): pooled ones first (ready ones, then given
    /// back ones, made ready now), new ones for the rest. Fails, taking none, when the worker
    /// would have more than `worker.qps.max` QPs or a QP cannot be created.
    pub(crate) fn take(&mut self, n: usize) -> Result<Vec<P::Qp>> {
        while self.idle.len() < n && self.settle_one() {}
        let pooled = self.idle.len() + self.released.len();
        let in_use = self.live - pooled;
        if in_use + n > self.max {
            self.counts.qps_refused += 1;
            return Err(EngineError::QpLimit {
                worker: self.worker,
                max: self.max,
                in_use,
                pooled,
                need: n,
            });
        }
        let mut out = Vec::with_capacity(n);
        let mut reused = 0;
        while out.len() < n {
            let qp = match self.idle.pop_front() {
                Some((qp, used)) => {
                    reused += u64::from(used);
                    qp
                }
                None => match self.create() {
                    Ok(qp) => qp,
                    Err(e) => {
                        // Nothing taken after all: the QPs go back, oldest first as before.
                        for qp in out.into_iter().rev() {
                            self.idle.push_front((qp, false));
                        }
                        return Err(e);
                    }
                },
            };
            out.push(qp);
        }
        self.counts.qps_reused += reused;
        Ok(out)
    }

    /// Takes back a QP of this worker whose connection-manager side is gone (dropped first):
    /// keeps it for reuse (made ready later, [`QpPool::settle_one`]) if the pool is below its
    /// size, else destroys it.
    pub(crate) fn give_back(&mut self, qp: P::Qp) {
        if self.idle.len() + self.released.len() < self.size {
            self.released.push_back(qp);
        } else {
            self.destroy(qp);
        }
    }

    /// Resets the oldest QP given back and moves it to INIT, ready (or destroys it if it
    /// cannot be moved); for the control loop when it is idle. Returns whether there was one.
    pub(crate) fn settle_one(&mut self) -> bool {
        let Some(mut qp) = self.released.pop_front() else { return false };
        let reset = QpAttr { state: QpState::Reset, ..QpAttr::default() };
        match qp.modify(&reset).and_then(|()| qp.modify(&self.init)) {
            Ok(()) => self.idle.push_back((qp, true)),
            Err(_) => self.destroy(qp),
        }
        true
    }

    /// Destroys a QP of this worker instead of keeping it.
    pub(crate) fn destroy(&mut self, qp: P::Qp) {
        drop(qp);
        self.forget();
    }

    /// A QP of this worker was destroyed outside the pool.
    pub(crate) fn forget(&mut self) {
        self.live = self.live.saturating_sub(1);
        self.counts.qps_destroyed += 1;
    }

    /// One step of refilling, for the control loop when it is idle: once fewer than half of
    /// `size` are left, creates one QP at a time until the pool is full again (or the worker
    /// is at `worker.qps.max`). Waiting for half to go, rather than replacing every QP taken,
    /// lets connections that come and go reuse the QPs they give back instead of churning
    /// creates and destroys. A QP given back is reset first ([`QpPool::settle_one`]). Returns
    /// whether it reset or created one.
    pub(crate) fn refill_one(&mut self) -> bool {
        if self.settle_one() {
            return true; // (a reset first: cheaper than a create, and it makes a QP ready too)
        }
        if !self.refilling && self.idle.len() * 2 < self.size {
            self.refilling = true;
        }
        if !self.refilling {
            return false;
        }
        if self.idle.len() >= self.size || self.live >= self.max {
            self.refilling = false;
            return false;
        }
        match self.create() {
            Ok(qp) => {
                self.idle.push_back((qp, false));
                true
            }
            Err(_) => {
                // The device is short of QPs now: try again at the next low mark.
                self.refilling = false;
                false
            }
        }
    }

    /// The counters, with the current numbers of live and pooled QPs.
    pub(crate) fn counts(&self) -> WorkerCounts {
        WorkerCounts {
            qps_live: self.live as u64,
            qps_pooled: (self.idle.len() + self.released.len()) as u64,
            ..self.counts
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corelink_verbs::soft::Soft;
    use corelink_verbs::{Context, Provider};

    fn pool(size: usize, max: usize) -> QpPool<Soft> {
        let ctx = Soft::open("soft0").unwrap();
        let pd = Arc::new(ctx.alloc_pd().unwrap());
        let cq = Arc::new(ctx.create_cq(64).unwrap());
        let cap = QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        QpPool::new(3, (pd, cq), cap, &QpAttr::default(), size, max).unwrap()
    }

    /// The states of the QPs given back and not made ready yet.
    fn qps_states(p: &QpPool<Soft>) -> Vec<QpState> {
        p.released.iter().map(|q| q.state()).collect()
    }

    #[test]
    fn takes_pooled_qps_and_reuses_given_back_ones() {
        let mut p = pool(4, 8);
        assert_eq!((p.counts().qps_created, p.counts().qps_pooled), (4, 4));
        let mut qps = p.take(2).unwrap();
        assert!(qps.iter().all(|q| q.state() == QpState::Init), "ready in INIT");
        let attr = QpAttr::default();
        qps[0].modify(&QpAttr { state: QpState::Err, ..attr }).unwrap();
        for qp in qps {
            p.give_back(qp);
        }
        let c = p.counts();
        assert_eq!((c.qps_created, c.qps_pooled, c.qps_live, c.qps_destroyed), (4, 4, 4, 0));
        // FIFO: the two never used come first, then the two given back (made ready again).
        let qps = p.take(4).unwrap();
        assert!(qps.iter().all(|q| q.state() == QpState::Init));
        assert_eq!(p.counts().qps_reused, 2);
        // Beyond the pool: new ones, up to the limit.
        let more = p.take(4).unwrap();
        assert_eq!((p.counts().qps_created, p.counts().qps_live), (8, 8));
        for qp in qps.into_iter().chain(more) {
            p.give_back(qp);
        }
        let c = p.counts();
        assert_eq!((c.qps_pooled, c.qps_live, c.qps_destroyed), (4, 4, 4), "kept up to the size");
    }

    #[test]
    fn a_qp_given_back_is_made_ready_when_the_loop_is_idle_or_when_taken() {
        let mut p = pool(2, 4);
        let attr = QpAttr::default();
        let mut qps = p.take(2).unwrap();
        for qp in &mut qps {
            qp.modify(&QpAttr { state: QpState::Err, ..attr }).unwrap();
        }
        let mut qps = qps.into_iter();
        p.give_back(qps.next().unwrap());
        p.give_back(qps.next().unwrap());
        assert_eq!(p.counts().qps_pooled, 2, "kept, not reset yet");
        assert!(qps_states(&p).iter().all(|s| *s == QpState::Err), "given back as they were");
        // The idle loop makes one ready (a refill step does that before it creates).
        assert!(p.settle_one());
        assert!(p.refill_one());
        assert!(!p.settle_one(), "both ready");
        let qps = p.take(2).unwrap();
        assert!(qps.iter().all(|q| q.state() == QpState::Init));
        // A QP taken before the loop made it ready is made ready as it is taken.
        let mut qps = qps.into_iter();
        let mut q = qps.next().unwrap();
        q.modify(&QpAttr { state: QpState::Err, ..attr }).unwrap();
        p.give_back(q);
        let again = p.take(1).unwrap();
        assert_eq!(again[0].state(), QpState::Init);
        assert_eq!(p.counts().qps_created, 2, "reused, not created");
    }

    #[test]
    fn the_limit_refuses_and_names_itself() {
        let mut p = pool(2, 3);
        let held = p.take(3).unwrap();
        let e = p.take(1).unwrap_err().to_string();
        assert!(e.contains("worker.qps.max") && e.contains("3 QPs in use"), "{e}");
        assert_eq!(p.counts().qps_refused, 1);
        drop(held.into_iter().next());
        p.forget();
        assert_eq!(p.take(1).unwrap().len(), 1);
    }

    #[test]
    fn refills_from_half_empty_to_full_within_the_limit() {
        let mut p = pool(4, 5);
        let a = p.take(2).unwrap();
        assert!(!p.refill_one(), "half left: no refill yet");
        let b = p.take(1).unwrap();
        let mut made = 0;
        while p.refill_one() {
            made += 1;
        }
        // 3 in use, 1 pooled: one more reaches the limit of 5 before the size of 4.
        assert_eq!((made, p.counts().qps_pooled, p.counts().qps_live), (1, 2, 5));
        drop((a, b));
    }
}
