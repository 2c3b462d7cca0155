//! A lane's receive buffers: each is posted, handed to the handler, or back and waiting to be
//! posted again. Buffers come back one message at a time but go back to the device in lists
//! (a quarter of the lane's receives at a time): a post of one receive costs as much as a
//! post of several (a call into the provider, its lock), and on the latency path it runs
//! between a doorbell and the next message, where the loop should be back polling.

use arrayvec::ArrayVec;
use corelink_verbs::{Provider, Qp, RecvWr, Sge};

use super::ids::{RecvId, WrId};
use crate::pool::Buf;
use crate::request::ConnId;

/// Receives posted in one call at most (longer lists go in several).
const LIST: usize = 16;

/// One lane's receives.
#[derive(Debug)]
pub(crate) struct Recvs<P: Provider> {
    /// Buffers by receive index; `None` while handed to the handler or after a flush.
    bufs: Vec<Option<Buf<P>>>,
    /// Receives posted and not yet completed.
    posted: usize,
    /// Indexes whose buffers are back in `bufs` and not posted, each once.
    unposted: Vec<u16>,
}

impl<P: Provider> Recvs<P> {
    /// Buffers `bufs` (by index), of which `posted` are posted (a primed lane's).
    pub(crate) fn new(bufs: Vec<Option<Buf<P>>>, posted: usize) -> Self {
        let unposted = Vec::with_capacity(bufs.len());
        Recvs { bufs, posted, unposted }
    }

    /// Receives posted and not yet completed.
    pub(crate) fn posted(&self) -> usize {
        self.posted
    }

    /// Receive `index` completed: its buffer (`None` if none was posted there), and whether
    /// fewer than half of the lane's receives are left posted.
    #[inline(always)]
    pub(crate) fn complete(&mut self, index: u16) -> Option<(Buf<P>, bool)> {
        self.posted = self.posted.saturating_sub(1);
        let low = self.low();
        let buf = self.bufs.get_mut(usize::from(index)).and_then(Option::take)?;
        Some((buf, low))
    }

    /// Whether fewer than half of the lane's receives are posted.
    #[inline(always)]
    fn low(&self) -> bool {
        self.posted * 2 < self.bufs.len()
    }

    /// The buffer of receive `index`, handled, comes back to be posted again.
    #[inline(always)]
    pub(crate) fn give_back(&mut self, index: u16, buf: Buf<P>) {
        if let Some(slot @ None) = self.bufs.get_mut(usize::from(index)) {
            *slot = Some(buf);
            // (room: each index is unposted once, and there are `bufs.len()` of them)
            self.unposted.push(index);
        }
    }

    /// Whether the buffers back should be posted now: a quarter of the lane's receives are
    /// back, or the lane is short of posted receives and any is.
    #[inline(always)]
    pub(crate) fn due(&self) -> bool {
        !self.unposted.is_empty() && (self.low() || self.unposted.len() * 4 >= self.bufs.len())
    }

    /// Posts every buffer back on `qp`, the receives of lane `lane` of connection `conn`, in
    /// lists of at most [`LIST`]. On a failed post, those before the failure count as posted
    /// and the rest stay back (the connection closes).
    pub(crate) fn post(
        &mut self,
        qp: &mut P::Qp,
        conn: ConnId,
        lane: u8,
    ) -> corelink_verbs::Result<()> {
        // (an unposted index holds its buffer, `give_back` put it there, unless a stray
        // completion took it since: such an index is dropped, so that ids and buffers pair)
        let bufs = &self.bufs;
        self.unposted.retain(|&i| matches!(bufs.get(usize::from(i)), Some(Some(_))));
        while !self.unposted.is_empty() {
            let n = self.unposted.len().min(LIST);
            let from = self.unposted.len() - n;
            let mut sges: ArrayVec<[Sge; 1], LIST> = ArrayVec::new();
            for &i in &self.unposted[from..] {
                if let Some(Some(buf)) = self.bufs.get(usize::from(i)) {
                    sges.push([buf.sge(true)]);
                }
            }
            let ids = self.unposted[from..].iter().map(|&i| RecvId::of(conn, lane, i));
            let wrs: ArrayVec<RecvWr<'_>, LIST> = ids
                .zip(&sges)
                .map(|(id, sgl)| RecvWr { wr_id: WrId::Recv(id).encode(), sgl })
                .collect();
            // SAFETY: each buffer stays in `bufs` until its receive completes (`complete`
            // takes it then) or the lane is dropped, after its QP.
            let res = unsafe { qp.post_recv(&wrs) };
            let done = match &res {
                Ok(()) => wrs.len(),
                Err(corelink_verbs::Error::PostRecv { index, .. }) => (*index).min(wrs.len()),
                Err(_) => 0,
            };
            self.posted += done;
            // Posted ones leave the list from its end, in the order they were listed.
            let keep = self.unposted.len() - n;
            self.unposted.drain(keep..keep + done);
            res?;
        }
        Ok(())
    }

    /// Every posted receive is taken as flushed (its completion lost): how many there were.
    pub(crate) fn forget_posted(&mut self) -> usize {
        std::mem::take(&mut self.posted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Pool;
    use corelink_verbs::soft::Soft;
    use corelink_verbs::{Context, Cq as _, Wc};

    /// A lane of `n` receives on a soft QP in INIT, all posted.
    fn lane(n: usize) -> (Recvs<Soft>, <Soft as Provider>::Qp, <Soft as Provider>::Cq, Pool<Soft>) {
        let ctx = Soft::open("soft0").unwrap();
        let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(64).unwrap());
        let mut qp = crate::worker::testing::soft_qp_in_init(&pd, &cq, 64);
        let pool = Pool::new(&pd, &[(64, 2 * n)]).unwrap();
        let bufs: Vec<_> = (0..n).map(|_| Some(pool.get(64).unwrap())).collect();
        let mut r = Recvs::new(bufs, 0);
        r.unposted.extend(0..n as u16);
        r.post(&mut qp, conn(), 0).unwrap();
        (r, qp, cq, pool)
    }

    fn conn() -> ConnId {
        ConnId { worker: 0, slot: 3, generation: 5 }
    }

    #[test]
    fn buffers_go_back_a_quarter_at_a_time() {
        let (mut r, mut qp, cq, _pool) = lane(8);
        assert_eq!((r.posted(), r.unposted.len()), (8, 0));
        let (buf, low) = r.complete(2).unwrap();
        assert!(!low);
        r.give_back(2, buf);
        assert!(!r.due(), "one back of eight: not yet");
        let (buf, _) = r.complete(5).unwrap();
        r.give_back(5, buf);
        assert!(r.due(), "two of eight: a quarter");
        r.post(&mut qp, conn(), 0).unwrap();
        assert_eq!((r.posted(), r.unposted.len()), (8, 0));
        // The posted ones carry their ids: flushed in ERR, each names its index.
        let err =
            corelink_verbs::QpAttr { state: corelink_verbs::QpState::Err, ..Default::default() };
        qp.modify(&err).unwrap();
        let mut wcs = [Wc::default(); 16];
        let n = cq.poll(&mut wcs).unwrap();
        let mut idx: Vec<u16> = wcs[..n]
            .iter()
            .map(|w| match WrId::decode(w.wr_id) {
                WrId::Recv(id) => {
                    assert!(id.is_of(conn()) && id.lane == 0);
                    id.index
                }
                WrId::Req(_) => panic!("a send's completion"),
            })
            .collect();
        idx.sort();
        // (2 and 5 were taken as completed without a message: their first posts flush too)
        assert_eq!(idx, [0, 1, 2, 2, 3, 4, 5, 5, 6, 7]);
    }

    #[test]
    fn a_low_lane_posts_what_it_has() {
        let (mut r, _qp, _cq, _pool) = lane(8);
        let (buf, _) = r.complete(2).unwrap();
        r.give_back(2, buf);
        // (four more with the handler: 3 of 8 left posted)
        let _held: Vec<_> = [0, 1, 3, 4].map(|i| r.complete(i).unwrap().0).into();
        assert!(r.due(), "a low lane posts what it has");
    }

    #[test]
    fn a_receive_not_held_gives_nothing_and_low_is_told() {
        let (mut r, _qp, _cq, _pool) = lane(4);
        assert!(r.complete(9).is_none(), "no such index");
        let (_b, low) = r.complete(0).unwrap();
        assert!(!low, "2 of 4 left posted");
        let (_b, low) = r.complete(1).unwrap();
        assert!(low, "1 of 4 left posted");
        assert!(r.complete(1).is_none(), "taken already");
        assert_eq!(r.forget_posted(), 0);
    }

    #[test]
    fn an_index_whose_buffer_was_taken_again_is_not_posted() {
        let (mut r, mut qp, _cq, _pool) = lane(8);
        for i in [1, 4] {
            let (buf, _) = r.complete(i).unwrap();
            r.give_back(i, buf);
        }
        // A stray completion of 4 (never, with a sane device) takes its buffer again.
        let (_stray, _) = r.complete(4).unwrap();
        r.post(&mut qp, conn(), 0).unwrap();
        assert!(r.unposted.is_empty());
        assert_eq!(r.posted(), 6, "8 - 3 completions + receive 1 posted again");
    }

    #[test]
    fn a_buffer_given_back_twice_is_listed_once() {
        let (mut r, _qp, _cq, pool) = lane(4);
        let (buf, _) = r.complete(1).unwrap();
        r.give_back(1, buf);
        r.give_back(1, pool.get(64).unwrap());
        assert_eq!(r.unposted, vec![1]);
    }
}
