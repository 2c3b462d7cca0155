//! Completion queues of `soft`: bounded lock-free queues that any thread may complete into
//! (as a NIC's DMA would), polled by their owner. A poll also runs what a NIC would do later
//! for the QPs on the CQ: RNR retries when their timer is due, and flushes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crossbeam_queue::ArrayQueue;

use super::context::CtxShared;
use super::fabric::Fabric;
use super::limits;
use super::qp::QpShared;
use crate::error::{invalid, Error, Result};
use crate::types::{AsyncElement, AsyncEventKind, Wc};

/// A CQ as QPs see it.
#[derive(Debug)]
pub(crate) struct CqShared {
    id: u64,
    depth: u32,
    queue: ArrayQueue<Wc>,
    pub(crate) ctx: Arc<CtxShared>,
    /// Set when a QP whose send queue completes here has deferred work.
    work: AtomicBool,
    /// QPs whose send queue completes here (registered at QP creation).
    qps: Mutex<Vec<Weak<QpShared>>>,
    overflowed: AtomicBool,
}

impl CqShared {
    /// Adds a completion; on overflow the completion is lost, the context raises
    /// `IBV_EVENT_CQ_ERR` (once), as a device does, and this returns false.
    pub(crate) fn push(&self, wc: Wc) -> bool {
        if self.queue.push(wc).is_ok() {
            return true;
        }
        if !self.overflowed.swap(true, Ordering::AcqRel) {
            self.ctx.raise(AsyncEventKind::CqErr, AsyncElement::Cq(self.id));
        }
        false
    }

    /// Loses a completion as an overrun would (a fault plan's `cq_overrun`): the context
    /// raises `IBV_EVENT_CQ_ERR`, each time.
    #[cold]
    pub(crate) fn overrun(&self) {
        self.ctx.raise(AsyncEventKind::CqErr, AsyncElement::Cq(self.id));
    }

    /// Notes that a QP on this CQ has deferred work for the next poll.
    pub(crate) fn note_work(&self) {
        self.work.store(true, Ordering::Release);
    }

    pub(crate) fn register(&self, qp: &Arc<QpShared>) {
        let mut qps = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        qps.retain(|w| w.strong_count() > 0);
        qps.push(Arc::downgrade(qp));
    }

    fn progress(&self) {
        // A plain load first: the common poll finds no deferred work and writes nothing.
        if !self.work.load(Ordering::Acquire) || !self.work.swap(false, Ordering::AcqRel) {
            return;
        }
        let qps = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        let mut again = false;
        for qp in qps.iter().filter_map(Weak::upgrade) {
            again |= qp.progress();
        }
        if again {
            self.work.store(true, Ordering::Release);
        }
    }
}

/// A completion queue of `soft`.
#[derive(Debug, Clone)]
pub struct SoftCq {
    pub(crate) shared: Arc<CqShared>,
}

impl SoftCq {
    pub(crate) fn new(ctx: &Arc<CtxShared>, depth: u32) -> Result<Self> {
        if depth == 0 || depth > limits::MAX_CQE {
            return Err(Error::CreateCq {
                depth,
                source: invalid(format!("depth must be 1..={}", limits::MAX_CQE)),
            });
        }
        Ok(SoftCq {
            shared: Arc::new(CqShared {
                id: Fabric::get().next_id(),
                depth,
                queue: ArrayQueue::new(depth as usize),
                ctx: ctx.clone(),
                work: AtomicBool::new(false),
                qps: Mutex::new(Vec::new()),
                overflowed: AtomicBool::new(false),
            }),
        })
    }
}

impl crate::Cq for SoftCq {
    fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        // Requests other processes of the fabric left for this one (`soft::port`).
        super::port::serve_inboxes();
        self.shared.progress();
        // Pops only what is there: popping an empty queue costs a full fence. (Another
        // consumer may still take some meanwhile: a pop can come back empty.)
        let queue = &self.shared.queue;
        let avail = if queue.is_empty() { 0 } else { queue.len().min(out.len()) };
        let mut n = 0;
        for slot in &mut out[..avail] {
            match queue.pop() {
                Some(wc) => *slot = wc,
                None => break,
            }
            n += 1;
        }
        Ok(n)
    }

    fn depth(&self) -> u32 {
        self.shared.depth
    }

    fn handle(&self) -> u64 {
        self.shared.id
    }
}
