//! A worker's settings, from the core map: what the scheduler, the loop and the facade read.

use std::time::Duration;

use crate::tunables::MAX_QPS_PER_CONN;

/// A worker's settings, from the core map.
#[derive(Clone, Debug)]
pub(crate) struct WorkerCfg {
    pub(crate) poll_budget: usize,
    pub(crate) max_inline: u32,
    /// Bytes of each receive buffer (`worker.recv_size`).
    pub(crate) recv_size: usize,
    /// Receives each lane keeps posted, by the connection's lane count (index 0 unused).
    pub(crate) recvs_per_lane: [u32; MAX_QPS_PER_CONN + 1],
    pub(crate) idle_after: Option<Duration>,
    /// How long a worker with connections goes without work before it parks (`None`: never).
    pub(crate) park_after: Option<Duration>,
    /// Empty polls in a row before a worker with connections yields its core (0: never).
    pub(crate) yield_after: u32,
    /// Work requests per doorbell at most (1..=MAX_POST_LIST).
    pub(crate) post_list: usize,
    /// One work request in this many is signalled.
    pub(crate) signal_every: u32,
    /// Serve waiting requests by class (else: everything in class 0, arrival order).
    pub(crate) priorities: bool,
    pub(crate) aging_rounds: u32,
    /// Default class by `OpKind::index`.
    pub(crate) classes: [u8; 5],
    /// The queue a request of each kind's default class waits in (`WorkerCfg::queue`).
    pub(crate) queues: [usize; 5],
    /// Work requests per QP on the device at most (at most its send-queue depth).
    pub(crate) max_outstanding: u32,
    pub(crate) max_rd_atomic: u32,
    pub(crate) merge_reads: bool,
    pub(crate) coalesce_writes: bool,
    pub(crate) coalesce_max: u32,
    /// How long a connection may go without traffic before it is probed (`worker.keepalive_ms`).
    pub(crate) keepalive: Option<Duration>,
    /// How long a close for a failure on the peer's side waits for the peer's disconnect
    /// (`worker.peer_grace_ms`).
    pub(crate) peer_grace: Duration,
}

/// The queue a request of class `class` waits in: its class's with `priorities`, else the
/// one queue of arrival order.
#[inline(always)]
fn queue(priorities: bool, class: u8) -> usize {
    if priorities {
        usize::from(class).min(crate::tunables::CLASSES - 1)
    } else {
        0
    }
}

impl WorkerCfg {
    /// The queue a request of class `class` waits in.
    #[inline(always)]
    pub(crate) fn queue(&self, class: u8) -> usize {
        queue(self.priorities, class)
    }

    /// The scheduling part of a worker's settings, from the core map.
    pub(crate) fn from_map(w: &corelink_config::WorkerResources, poll_budget: usize) -> WorkerCfg {
        let s = &w.scheduler;
        let max_outstanding = w.max_outstanding();
        let c = &s.classes;
        let mut recvs_per_lane = [0; MAX_QPS_PER_CONN + 1];
        for (lanes, n) in recvs_per_lane.iter_mut().enumerate() {
            *n = w.recvs_per_lane(lanes as u32);
        }
        // OpKind::index order: send, write, read, fetch-and-add, compare-and-swap.
        let classes = [c.send, c.write, c.read, c.atomic, c.atomic]
            .map(|k| k.min(crate::tunables::CLASSES as u8 - 1));
        WorkerCfg {
            poll_budget,
            max_inline: w.max_inline,
            recv_size: w.recv_size as usize,
            recvs_per_lane,
            idle_after: (w.idle_after_us > 0).then(|| Duration::from_micros(w.idle_after_us)),
            park_after: (w.park_after_us > 0)
                .then(|| Duration::from_micros(w.park_after_us.into())),
            yield_after: w.yield_after_empty_polls,
            post_list: (w.batching.post_list as usize).clamp(1, crate::tunables::MAX_POST_LIST),
            signal_every: w.batching.signal_every.max(1),
            priorities: s.priorities,
            aging_rounds: s.aging_rounds.max(1),
            classes,
            queues: classes.map(|k| queue(s.priorities, k)),
            max_outstanding: max_outstanding.max(1),
            max_rd_atomic: s.max_rd_atomic.max(1),
            merge_reads: s.merge_reads,
            coalesce_writes: s.coalesce_writes,
            coalesce_max: s.coalesce_max_bytes,
            keepalive: (w.keepalive_ms > 0).then(|| Duration::from_millis(w.keepalive_ms.into())),
            peer_grace: Duration::from_millis(w.peer_grace_ms.into()),
        }
    }
}
