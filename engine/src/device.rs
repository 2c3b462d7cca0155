//! The device contexts of an engine: the control core's, opened by `Engine::start` (it listens
//! and connects through the connection manager), and a context of its own for each worker, a
//! sibling of the control core's ([`corelink_verbs::Context::open_sibling`]) on which the
//! worker's PD, CQ, QP pool and buffers are made. On ConnectX NICs the QPs of one context share
//! doorbell registers under a lock; a worker's own context has its own, so workers never meet
//! on a doorbell.
//!
//! Where a worker's context cannot be opened (a provider without siblings:
//! `verbs::Error::Unsupported`; a device out of contexts or doorbell pages:
//! `ibv_open_device` failing), the worker shares the control core's context: it works, its QPs
//! share doorbells with the other workers' that do too, and it is said at start (a line on
//! stderr with the reason) and in the worker's metrics ([`crate::Metrics::own_context`]).

use std::sync::Arc;

/// The context a worker's objects are made on.
#[derive(Debug)]
pub(crate) struct WorkerContext<C> {
    /// The context.
    pub(crate) ctx: Arc<C>,
    /// Whether it was opened for this worker (false: it is the control core's, shared).
    pub(crate) own: bool,
}

impl<C> WorkerContext<C> {
    /// The control core's context, shared because the core map says so
    /// (`worker.own_context = false`).
    pub(crate) fn shared(shared: &Arc<C>) -> Self {
        WorkerContext { ctx: shared.clone(), own: false }
    }

    /// Worker `worker`'s context: what `open` gives (a sibling of `shared`), or, if it
    /// fails, `shared` itself, saying why on stderr.
    pub(crate) fn open(
        worker: usize,
        shared: &Arc<C>,
        open: impl FnOnce(&C) -> corelink_verbs::Result<C>,
    ) -> Self {
        match open(shared) {
            Ok(ctx) => WorkerContext { ctx: Arc::new(ctx), own: true },
            Err(e) => {
                eprintln!(
                    "corelink: worker {worker} cannot open a device context of its own ({}): it \
                     shares the control core's, and its QPs share doorbell registers with the \
                     other workers' that do",
                    corelink_verbs::chain(&e)
                );
                WorkerContext { ctx: shared.clone(), own: false }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corelink_verbs::soft::{Soft, DEVICE_NAME};
    use corelink_verbs::{Context, Error, Provider};

    #[test]
    fn a_worker_gets_a_context_of_its_own() {
        let shared = Arc::new(Soft::open(DEVICE_NAME).unwrap());
        let w = WorkerContext::open(0, &shared, |c| c.open_sibling());
        assert!(w.own);
        assert!(!Arc::ptr_eq(&w.ctx, &shared));
        assert_eq!(w.ctx.query_gid(1, 0).unwrap(), shared.query_gid(1, 0).unwrap());
    }

    #[test]
    fn without_one_it_shares_the_control_cores() {
        let shared = Arc::new(7u32);
        let w = WorkerContext::open(3, &shared, |_| {
            Err(Error::Unsupported { what: "opening a second context of a device", provider: "x" })
        });
        assert!(!w.own);
        assert!(Arc::ptr_eq(&w.ctx, &shared));
    }
}
