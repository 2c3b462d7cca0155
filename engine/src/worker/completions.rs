//! Completions handed to a handler together: the plain successes that one send-queue
//! completion retires on one lane (with selective signalling, up to `signal_every` requests),
//! gathered while the lane is held and told in one [`Handler::on_completions`] call, in post
//! order.
//!
//! [`Handler::on_completions`]: super::Handler::on_completions

use arrayvec::ArrayVec;
use corelink_verbs::Provider;

use crate::pool::Buf;
use crate::request::{ConnId, Done};
use crate::tunables::COMPLETION_BATCH;

/// Where a worker gathers one connection's completions before telling them (at most
/// [`COMPLETION_BATCH`]; all of one connection).
pub(crate) struct Gathered<P: Provider> {
    dones: ArrayVec<Done<Buf<P>>, COMPLETION_BATCH>,
}

impl<P: Provider> Gathered<P> {
    pub(crate) fn new() -> Self {
        Gathered { dones: ArrayVec::new() }
    }

    /// Whether it holds none.
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.dones.is_empty()
    }

    /// Whether it holds as many as it can.
    #[inline(always)]
    pub(crate) fn is_full(&self) -> bool {
        self.dones.is_full()
    }

    /// Adds `done`; refused (and given back) when full or of another connection than those
    /// gathered: tell those first.
    #[inline(always)]
    pub(crate) fn push(&mut self, done: Done<Buf<P>>) -> Result<(), Done<Buf<P>>> {
        if self.dones.first().is_some_and(|d| d.conn != done.conn) {
            return Err(done);
        }
        self.dones.try_push(done).map_err(|e| e.element())
    }

    /// What was gathered, to tell (none when empty); it is empty again afterwards.
    #[inline(always)]
    pub(crate) fn drain(&mut self) -> Option<Completions<'_, P>> {
        let conn = self.dones.first()?.conn;
        Some(Completions { conn, inner: self.dones.drain(..) })
    }
}

/// Several completions of a handler's requests on one connection, in the order the requests
/// were posted ([`Handler::on_completions`]). An iterator of [`Done`]s; those it still holds
/// when dropped are dropped with it (their buffers go back to the pool).
///
/// It lends the worker's gathering and its buffers, so it stays on the worker's thread:
///
/// ```compile_fail,E0277
/// fn is_send<T: Send>() {}
/// is_send::<corelink_engine::Completions<'static, corelink_verbs::soft::Soft>>();
/// ```
///
/// [`Handler::on_completions`]: super::Handler::on_completions
pub struct Completions<'a, P: Provider> {
    conn: ConnId,
    inner: arrayvec::Drain<'a, Done<Buf<P>>, COMPLETION_BATCH>,
}

impl<P: Provider> Completions<'_, P> {
    /// The connection every completion here is of.
    pub fn conn(&self) -> ConnId {
        self.conn
    }
}

impl<P: Provider> Iterator for Completions<'_, P> {
    type Item = Done<Buf<P>>;

    #[inline(always)]
    fn next(&mut self) -> Option<Done<Buf<P>>> {
        self.inner.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl<P: Provider> ExactSizeIterator for Completions<'_, P> {}

impl<P: Provider> std::fmt::Debug for Completions<'_, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completions").field("conn", &self.conn).field("left", &self.len()).finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::pool::Pool;
    use crate::request::OpKind;
    use corelink_verbs::soft::Soft;
    use corelink_verbs::{Context as _, WcStatus};

    fn done(conn: ConnId, token: u64, buf: Option<Buf<Soft>>) -> Done<Buf<Soft>> {
        let (kind, status) = (OpKind::Write, WcStatus::Success);
        Done { conn, token, kind, status, buf, old_value: None, closed_by: None }
    }

    #[test]
    fn gathers_one_connection_in_order_up_to_its_capacity() {
        let a = ConnId { worker: 0, slot: 1, generation: 0 };
        let b = ConnId { slot: 2, ..a };
        let mut g = Gathered::<Soft>::new();
        assert!(g.drain().is_none(), "nothing gathered: nothing to tell");
        for t in 0..COMPLETION_BATCH as u64 {
            assert!(g.push(done(a, t, None)).is_ok());
        }
        assert!(g.is_full());
        assert_eq!(g.push(done(a, 99, None)).map_err(|d| d.token), Err(99), "full");
        let told = g.drain().expect("gathered");
        assert_eq!(told.conn(), a);
        assert_eq!(told.len(), COMPLETION_BATCH);
        assert!(told.map(|d| d.token).eq(0..COMPLETION_BATCH as u64), "in post order");
        assert!(g.drain().is_none(), "empty once told");
        assert!(g.push(done(a, 1, None)).is_ok());
        assert_eq!(g.push(done(b, 2, None)).map_err(|d| d.conn), Err(b), "another connection");
    }

    #[test]
    fn completions_left_untold_give_their_buffers_back() {
        let ctx = Soft::open("soft0").expect("soft");
        let pd = ctx.alloc_pd().expect("pd");
        let pool = Pool::new(&pd, &[(64, 2)]).expect("pool");
        let conn = ConnId { worker: 0, slot: 1, generation: 0 };
        let mut g = Gathered::<Soft>::new();
        for t in 0..2 {
            let buf = pool.get(8).expect("a buffer");
            assert!(g.push(done(conn, t, Some(buf))).is_ok());
        }
        assert!(pool.get(8).is_err(), "both buffers are out");
        let mut told = g.drain().expect("gathered");
        assert_eq!(told.next().map(|d| d.token), Some(0));
        drop(told);
        assert!(pool.get(8).is_ok() && pool.get(8).is_ok(), "both back: taken and dropped, untold");
    }
}
