//! Requests planned as they are submitted. A request that finds its connection with nothing
//! waiting and room on its one lane has its work request made at once, where its kind is
//! known (no queue, no planning pass), and goes out first at the next flush, flagged as the
//! scheduler's plan would flag it. If anything came to wait behind it meanwhile, or the lane's
//! room shrank (the flat path posted), the ready requests go back to the front of their class
//! and the scheduler plans them with the rest: the order and the batches are the plan's either
//! way.

use corelink_verbs::{Provider, SendOp, Sge};

use super::cfg::WorkerCfg;
use super::ids::ReqId;
use super::queues::{SendQueue, Waiting};
use super::requests::Requests;

/// One request's work request, made when it was submitted.
pub(crate) struct Entry<P: Provider> {
    pub(crate) wire: Wire<P>,
    /// A read or an atomic: decided once, from `op`, where the kind is known (`Entry::new`).
    rd_atomic: bool,
}

/// A request's work request as the scheduler posts it: its parts.
pub(crate) struct Wire<P: Provider> {
    pub(crate) id: ReqId,
    pub(crate) op: SendOp<'static, P>,
    pub(crate) sge: Sge,
    /// It may go inline (a send or write within `max_inline`).
    pub(crate) inline: bool,
    /// A quiet request ([`super::Cx::send_quiet`], [`super::Cx::write_quiet`]).
    pub(crate) quiet: bool,
}

impl<P: Provider> Entry<P> {
    /// Request `wire.id`'s work request.
    #[inline(always)]
    pub(crate) fn new(wire: Wire<P>) -> Self {
        let (_, rd_atomic) = wire.reads();
        Entry { wire, rd_atomic }
    }

    /// Whether it is a read or an atomic (counted against `max_rd_atomic`).
    #[inline(always)]
    pub(crate) fn rd_atomic(&self) -> bool {
        self.rd_atomic
    }
}

impl<P: Provider> Wire<P> {
    /// Whether it is a read, and whether it is a read or an atomic (counted against
    /// `max_rd_atomic`).
    #[inline(always)]
    pub(crate) fn reads(&self) -> (bool, bool) {
        match self.op {
            SendOp::Read(_) => (true, true),
            SendOp::FetchAdd { .. } | SendOp::CompareSwap { .. } => (false, true),
            _ => (false, false),
        }
    }
}

impl<P: Provider> Clone for Wire<P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P: Provider> Copy for Wire<P> {}

impl<P: Provider> Clone for Entry<P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P: Provider> Copy for Entry<P> {}

/// A connection's ready requests, in submission order, all of one queue (their class's, or
/// the one queue of arrival order without priorities: [`WorkerCfg::queue`]).
pub(crate) struct Ready<P: Provider> {
    entries: Vec<Entry<P>>,
    /// The first not yet taken (`Ready::batch`).
    next: usize,
    /// Their queue.
    queue: usize,
    /// Reads and atomics among them.
    rd_atomic: u32,
}

impl<P: Provider> Ready<P> {
    /// Room for `max_outstanding` requests (a lane's worth: made now, so that joining never
    /// allocates).
    pub(crate) fn new(max_outstanding: u32) -> Self {
        let entries = Vec::with_capacity(max_outstanding as usize);
        Ready { entries, next: 0, queue: 0, rd_atomic: 0 }
    }

    /// Requests in it.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len() - self.next
    }

    /// Whether it has none.
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a request of queue `k` (a read or atomic if `rd_atomic`) may join, on a lane
    /// whose send queue is `sq`, with `waiting` requests queued on the connection: nothing
    /// waits, it is of their queue, and the lane has room for it.
    #[inline(always)]
    pub(crate) fn admits(
        &self,
        k: usize,
        rd_atomic: bool,
        waiting: usize,
        sq: &SendQueue,
        cfg: &WorkerCfg,
    ) -> bool {
        let n = self.entries.len();
        waiting == 0
            && (n == 0 || self.queue == k)
            && n < self.entries.capacity()
            && sq.outstanding() as usize + n < cfg.max_outstanding as usize
            && (!rd_atomic || sq.rd_outstanding + self.rd_atomic < cfg.max_rd_atomic)
    }

    /// Adds `e`, of queue `k` (which [`Ready::admits`] said may join).
    #[inline(always)]
    pub(crate) fn push(&mut self, k: usize, e: Entry<P>) {
        debug_assert!(self.entries.len() < self.entries.capacity(), "admitted");
        debug_assert_eq!(self.next, 0, "joined between flushes only");
        self.queue = k;
        self.rd_atomic += u32::from(e.rd_atomic());
        self.entries.push(e);
    }

    /// Whether they still go as they are on a lane whose send queue is `sq` (its room may have
    /// shrunk since they joined).
    #[inline(always)]
    pub(crate) fn fits(&self, sq: &SendQueue, cfg: &WorkerCfg) -> bool {
        sq.outstanding() as usize + self.len() <= cfg.max_outstanding as usize
            && (self.rd_atomic == 0 || sq.rd_outstanding + self.rd_atomic <= cfg.max_rd_atomic)
    }

    /// The next `n` (at most), in order, to post as one batch: taken (see [`Ready::clear`]).
    #[inline(always)]
    pub(crate) fn batch(&mut self, n: usize) -> &[Entry<P>] {
        let (from, to) = (self.next, self.entries.len().min(self.next + n));
        self.next = to;
        &self.entries[from..to]
    }

    /// Empties it once every request was taken (posted): the next to join starts afresh.
    #[inline(always)]
    pub(crate) fn clear(&mut self) {
        debug_assert!(self.is_empty(), "all taken");
        self.entries.clear();
        self.next = 0;
        self.rd_atomic = 0;
    }

    /// Puts them back at the front of their queue in `w`, in order (they came before anything
    /// queued there): the scheduler plans them.
    pub(crate) fn demote(&mut self, w: &mut Waiting, reqs: &mut Requests<P>) {
        let k = self.queue;
        for e in self.entries[self.next..].iter().rev() {
            w.queues[k].push_front(reqs.slab_mut(), e.wire.id);
            w.len += 1;
        }
        self.entries.clear();
        self.next = 0;
        self.rd_atomic = 0;
    }
}

impl<P: Provider> std::fmt::Debug for Ready<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ready").field("len", &self.len()).field("queue", &self.queue).finish()
    }
}
