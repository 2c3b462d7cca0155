//! A connection's queues as the scheduler keeps them: its requests waiting by class, and each
//! lane's work requests on the device in post order.

use super::ids::ReqId;
use crate::slab::Fifo;
use crate::tunables::CLASSES;

/// The work requests a lane has on the device, in post order: a ring of request ids as deep
/// as the send queue (the scheduler never posts more), so that a post appends and a
/// completion takes the oldest without visiting any other record.
#[derive(Debug)]
pub(crate) struct Posted {
    ids: Box<[ReqId]>,
    /// `ids.len() - 1` (a power of two less one; set once: indices masked with it need no
    /// bounds check).
    mask: usize,
    head: usize,
    len: usize,
}

impl Posted {
    /// Room for `depth` work requests.
    pub(crate) fn new(depth: u32) -> Self {
        let n = (depth.max(1) as usize).next_power_of_two();
        Posted { ids: vec![ReqId::from_raw(0); n].into_boxed_slice(), mask: n - 1, head: 0, len: 0 }
    }

    /// Work requests in it.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether it has none.
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends request `id`; false (nothing kept) when it is full, which the scheduler rules
    /// out (it posts at most the send queue's depth).
    #[inline(always)]
    pub(crate) fn push(&mut self, id: ReqId) -> bool {
        if self.len > self.mask {
            return false;
        }
        // SAFETY: `mask` is `ids.len() - 1` (`new`), so the index is in range.
        *unsafe { self.ids.get_unchecked_mut((self.head + self.len) & self.mask) } = id;
        self.len += 1;
        true
    }

    /// Takes the oldest out.
    #[inline(always)]
    pub(crate) fn pop(&mut self) -> Option<ReqId> {
        if self.len == 0 {
            return None;
        }
        // SAFETY: `head` is always masked with `mask`, `ids.len() - 1` (`new`): in range.
        let id = *unsafe { self.ids.get_unchecked(self.head) };
        self.head = (self.head + 1) & self.mask;
        self.len -= 1;
        Some(id)
    }
}

/// A lane's send queue as the scheduler keeps it: what is on the device, in post order.
#[derive(Debug)]
pub(crate) struct SendQueue {
    /// Work requests on the device, signalled or not, in post order: a completion retires
    /// every one before it (the device completes a QP's requests in order).
    pub(crate) posted: Posted,
    /// Of those, reads and atomics.
    pub(crate) rd_outstanding: u32,
    /// Unsignalled work requests posted since the last signalled one.
    pub(crate) unsignalled: u32,
    /// Whether one of those is loud (not quiet): a signalled one must follow it in the same
    /// flush. Outside a flush, any unsignalled ones are quiet, and a closing connection's
    /// lane posts a fence behind them.
    pub(crate) loud: bool,
}

impl SendQueue {
    /// An empty one, `depth` deep.
    pub(crate) fn new(depth: u32) -> Self {
        SendQueue { posted: Posted::new(depth), rd_outstanding: 0, unsignalled: 0, loud: false }
    }

    /// Work requests on the device.
    #[inline(always)]
    pub(crate) fn outstanding(&self) -> u32 {
        self.posted.len() as u32
    }
}

/// A connection's requests waiting to become work requests, by class (class 0 goes first),
/// with what the scheduler keeps of them: aging, and the write epoch reads are merged by.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    pub(crate) queues: [Fifo; CLASSES],
    /// Requests in `queues`.
    pub(crate) len: usize,
    /// Flushes each waiting class was passed over in a row (aging).
    pub(crate) passed: [u32; CLASSES],
    /// The largest of `passed`.
    pub(crate) most_passed: u32,
    /// Bumped by every non-read posted (see [`MergeKey::epoch`](super::requests::MergeKey::epoch)).
    pub(crate) write_epoch: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posted_keeps_post_order_across_its_wrap_and_refuses_beyond_its_depth() {
        let id = |n: u64| ReqId::from_raw(n);
        let mut p = Posted::new(3); // (room for 4: a power of two)
        for n in 1..=4 {
            assert!(p.push(id(n)));
        }
        assert!(!p.push(id(5)), "full");
        assert_eq!(p.len(), 4);
        assert_eq!((p.pop(), p.pop()), (Some(id(1)), Some(id(2))));
        for n in 6..=7 {
            assert!(p.push(id(n)));
        }
        let rest: Vec<_> = std::iter::from_fn(|| p.pop()).collect();
        assert_eq!(rest, [id(3), id(4), id(6), id(7)]);
        assert!(p.is_empty());
        assert_eq!(p.pop(), None);
    }
}
