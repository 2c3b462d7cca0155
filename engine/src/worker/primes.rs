//! Connections coming up. Before the connection manager's exchange, the control core lends the
//! worker a connection's QPs (in INIT): the worker keeps a slot for it and posts its receives,
//! so that its peer, which may send the moment its side is up, always finds them (no
//! receiver-not-ready NAK at start, however late the worker hears of the connection). Receives
//! that complete before the connection is the worker's are kept and played back, in order,
//! after `on_connected`. A connection that does not come up gives its QPs back: they go to ERR,
//! and once every receive has flushed the slot is free and the QPs return to the pool.

use std::collections::HashMap;

use arrayvec::ArrayVec;
use corelink_verbs::{Error as VerbsError, Provider, Qp, QpAttr, QpState, RecvWr, Sge, Wc};

use super::conns::Conns;
use super::ids::{RecvId, WrId};
use crate::error::{EngineError, Limit};
use crate::handoff::Qps;
use crate::pool::{Buf, Pool};
use crate::request::{CloseReason, ConnId};
use crate::tunables::MAX_QPS_PER_CONN;

/// One lane's receives, posted before its connection came up.
pub(crate) struct PrimedLane<P: Provider> {
    /// Receive buffers, by receive index.
    pub(crate) recvs: Vec<Option<Buf<P>>>,
    /// Of those, posted and not yet completed (completions kept in `early` not subtracted).
    pub(crate) posted: usize,
}

/// A connection coming up, in its kept slot.
struct Primed<P: Provider> {
    id: ConnId,
    lanes: ArrayVec<PrimedLane<P>, MAX_QPS_PER_CONN>,
    /// Completions of its receives while its QPs were lent, in order.
    early: Vec<Wc>,
    /// A receive could not be posted (its connection closes once open).
    post_failed: bool,
    /// Its QPs, back and in ERR, once it did not come up: it waits for its receives to flush.
    draining: Option<Qps<P>>,
    /// The worker's completions were lost while it was primed (a CQ overrun, a failed
    /// device), for this reason: its receives' may be among them.
    lost: Option<CloseReason>,
}

/// What a connection's prime leaves for its opening.
pub(crate) struct Opened<P: Provider> {
    pub(crate) lanes: ArrayVec<PrimedLane<P>, MAX_QPS_PER_CONN>,
    /// Completions to play back once it is open, in order.
    pub(crate) early: Vec<Wc>,
    pub(crate) post_failed: bool,
    /// Completions were lost while it was coming up, for this reason: it closes at once, its
    /// receives made up for by the worker (`worker/untrusted.rs`).
    pub(crate) lost: Option<CloseReason>,
}

/// What a completion for a slot that holds no connection was.
pub(crate) enum Early<P: Provider> {
    /// Kept for its connection's opening.
    Kept,
    /// A flush of a connection that did not come up; it was its last: its slot can be freed
    /// and these QPs go back.
    Drained(ConnId, Qps<P>),
    /// A flush of a connection that did not come up, with receives still to flush.
    Flushed,
    /// Not a connection coming up (a bug).
    Unknown,
}

/// The worker's connections coming up, by slot.
pub(crate) struct Primes<P: Provider> {
    by_slot: HashMap<u16, Primed<P>>,
}

impl<P: Provider> Primes<P> {
    pub(crate) fn new() -> Self {
        Primes { by_slot: HashMap::new() }
    }

    /// Keeps a slot in `conns` for a connection of `qps.len()` lanes and posts `per_lane`
    /// receives of `recv_size` bytes from `pool` on each of its QPs (in INIT). Fails, posting
    /// nothing, when every slot is taken. Returns the slot's id and the receives missing from
    /// the pool (a bug: the control core reserved them).
    pub(crate) fn prime(
        &mut self,
        conns: &mut Conns<P>,
        pool: &Pool<P>,
        (per_lane, recv_size): (usize, usize),
        qps: &mut Qps<P>,
        post_errors: &mut u64,
    ) -> Result<(ConnId, u64), EngineError> {
        let Some(id) = conns.reserve() else {
            return Err(EngineError::Limit {
                worker: usize::from(conns.worker()),
                limit: Limit::Connections,
                max: conns.capacity() as u64,
                in_use: conns.live() as u64,
                need: 1,
            });
        };
        let (mut misses, mut post_failed) = (0, false);
        let mut lanes = ArrayVec::new();
        for (l, qp) in qps.iter_mut().enumerate() {
            let mut recvs = Vec::with_capacity(per_lane);
            for _ in 0..per_lane {
                let Ok(b) = pool.get(recv_size) else {
                    misses += 1;
                    break;
                };
                recvs.push(Some(b));
            }
            // The lane's receives as one list: one call (and one doorbell), not one each.
            let sges: Vec<Sge> = recvs.iter().flatten().map(|b| b.sge(true)).collect();
            let wrs: Vec<RecvWr<'_>> = (sges.iter().enumerate())
                .map(|(i, sge)| {
                    let r = RecvId::of(id, l as u8, i as u16);
                    RecvWr { wr_id: WrId::Recv(r).encode(), sgl: std::slice::from_ref(sge) }
                })
                .collect();
            // SAFETY: each buffer stays in `recvs` (then in its lane) until its completion.
            let posted = match unsafe { qp.post_recv(&wrs) } {
                Ok(()) => wrs.len(),
                Err(e) => {
                    // (those before the refused one went; the rest are counted as failed)
                    let index = match e {
                        VerbsError::PostRecv { index, .. } => index.min(wrs.len()),
                        _ => 0,
                    };
                    *post_errors += (wrs.len() - index) as u64;
                    post_failed = true;
                    index
                }
            };
            lanes.push(PrimedLane { recvs, posted });
        }
        let primed =
            Primed { id, lanes, early: Vec::new(), post_failed, draining: None, lost: None };
        self.by_slot.insert(id.slot, primed);
        Ok((id, misses))
    }

    /// A receive completion whose slot holds no connection (or another one than its own).
    pub(crate) fn early(&mut self, wc: &Wc, r: RecvId) -> Early<P> {
        let Some(p) = self.by_slot.get_mut(&r.slot).filter(|p| r.is_of(p.id)) else {
            return Early::Unknown;
        };
        if p.draining.is_none() {
            p.early.push(*wc);
            return Early::Kept;
        }
        p.settle(r);
        if !p.flushed() {
            return Early::Flushed;
        }
        match self.by_slot.remove(&r.slot) {
            Some(Primed { id, draining: Some(qps), .. }) => Early::Drained(id, qps),
            _ => Early::Unknown,
        }
    }

    /// Connection `id` is up: what its prime left (`None` if `id` is not coming up).
    pub(crate) fn open(&mut self, id: ConnId) -> Option<Opened<P>> {
        match self.by_slot.get(&id.slot) {
            Some(p) if p.id == id && p.draining.is_none() => {}
            _ => return None,
        }
        let p = self.by_slot.remove(&id.slot)?;
        Some(Opened { lanes: p.lanes, early: p.early, post_failed: p.post_failed, lost: p.lost })
    }

    /// Whether any connection is coming up (or draining).
    pub(crate) fn any(&self) -> bool {
        !self.by_slot.is_empty()
    }

    /// The worker's completions were lost (for `reason`): every connection coming up or
    /// draining may have lost its receives' too.
    pub(crate) fn strike(&mut self, reason: CloseReason) {
        for p in self.by_slot.values_mut() {
            p.lost = Some(reason);
        }
    }

    /// Ends the draining connections whose completions were lost: their receives still posted
    /// are taken as flushed (how many, for the metrics), their slots can be freed and their
    /// QPs go back. Those coming up stay (they close when they open).
    pub(crate) fn make_up(&mut self) -> Vec<(ConnId, Qps<P>, u64)> {
        let ended: Vec<u16> = self
            .by_slot
            .iter()
            .filter(|(_, p)| p.lost.is_some() && p.draining.is_some())
            .map(|(&slot, _)| slot)
            .collect();
        ended
            .into_iter()
            .filter_map(|slot| {
                let p = self.by_slot.remove(&slot)?;
                let posted = p.lanes.iter().map(|l| l.posted as u64).sum();
                Some((p.id, p.draining?, posted))
            })
            .collect()
    }

    /// Connection `id` did not come up: its QPs go to ERR to flush what is posted. Returns them
    /// when nothing is left to flush (the slot can be freed now); else the last flush does
    /// ([`Early::Drained`]). `Err` gives the QPs back if `id` is not coming up.
    pub(crate) fn unprime(
        &mut self,
        id: ConnId,
        mut qps: Qps<P>,
    ) -> Result<Option<Qps<P>>, Qps<P>> {
        let Some(p) = self.by_slot.get_mut(&id.slot).filter(|p| p.id == id && p.draining.is_none())
        else {
            return Err(qps);
        };
        for qp in qps.iter_mut() {
            let _ = qp.modify(&QpAttr { state: QpState::Err, ..QpAttr::default() });
        }
        // What completed while they were lent, settled now (nobody hears of its messages).
        for wc in std::mem::take(&mut p.early) {
            if let WrId::Recv(r) = WrId::decode(wc.wr_id) {
                p.settle(r);
            }
        }
        if p.flushed() {
            self.by_slot.remove(&id.slot);
            return Ok(Some(qps));
        }
        p.draining = Some(qps);
        Ok(None)
    }
}

impl<P: Provider> Primed<P> {
    /// Receive `r` of a connection that did not come up has completed: its buffer goes back.
    fn settle(&mut self, r: RecvId) {
        if let Some(l) = self.lanes.get_mut(usize::from(r.lane)) {
            l.posted = l.posted.saturating_sub(1);
            if let Some(b) = l.recvs.get_mut(usize::from(r.index)) {
                drop(b.take());
            }
        }
    }

    fn flushed(&self) -> bool {
        self.lanes.iter().all(|l| l.posted == 0)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use corelink_verbs::soft::Soft;
    use corelink_verbs::Context;

    /// A prime of one lane with 4 receives on a soft QP in INIT; its conns, pool and CQ.
    fn primed() -> (Primes<Soft>, Conns<Soft>, Pool<Soft>, ConnId, Qps<Soft>) {
        let ctx = Soft::open("soft0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let qp = crate::worker::testing::soft_qp_in_init(&pd, &cq, 8);
        let mut qps = Qps::<Soft>::new();
        qps.push(qp);
        let pool = Pool::new(&pd, &[(64, 8)]).unwrap();
        let (mut primes, mut conns) = (Primes::new(), Conns::new(0, 2));
        let mut errors = 0;
        let (id, misses) = primes.prime(&mut conns, &pool, (4, 64), &mut qps, &mut errors).unwrap();
        assert_eq!((misses, errors), (0, 0));
        (primes, conns, pool, id, qps)
    }

    #[test]
    fn a_draining_prime_whose_flushes_were_lost_is_made_up_for() {
        let (mut primes, _conns, pool, id, qps) = primed();
        // It did not come up: its QPs go to ERR and it waits for its 4 receives' flushes,
        // which (the CQ overran) never come.
        assert!(matches!(primes.unprime(id, qps), Ok(None)));
        assert!(primes.make_up().is_empty(), "nothing was lost yet");
        primes.strike(CloseReason::Device(corelink_verbs::AsyncEventKind::CqErr));
        let ended = primes.make_up();
        assert_eq!(
            ended.iter().map(|(c, q, n)| (*c, q.len(), *n)).collect::<Vec<_>>(),
            [(id, 1, 4)]
        );
        assert!(!primes.any(), "its slot is no longer kept");
        drop(ended);
        assert_eq!(pool.occupancy().next().map(|(_, free, _)| free), Some(8), "buffers back");
    }

    #[test]
    fn a_prime_coming_up_when_completions_were_lost_opens_to_close() {
        let (mut primes, _conns, _pool, id, _qps) = primed();
        primes.strike(CloseReason::Device(corelink_verbs::AsyncEventKind::CqErr));
        assert!(primes.make_up().is_empty(), "one coming up stays until it opens");
        let opened = primes.open(id).unwrap();
        assert!(opened.lost.is_some());
    }
}
