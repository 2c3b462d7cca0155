//! A run of requests on one connection, its checks made once ([`Cx::on`]).
//!
//! [`Cx::on`]: super::Cx::on

use corelink_verbs::{Provider, RemoteAddr};

use super::admit::admit;
use super::cfg::WorkerCfg;
use super::conn::Conn;
use super::requests::Requests;
use crate::error::EngineError;
use crate::handoff::Origin;
use crate::pool::Buf;
use crate::request::{ConnId, Op};
use crate::tunables::CLASSES;

/// Requests on one connection, checked once for all of them (the connection is there and
/// open, the worker is not stopping): what [`Cx::on`] gives a handler that issues several
/// requests on a connection at once, such as a window posted again as its completions come.
/// Each request goes exactly as it would through the [`Cx`] call of the same name.
///
/// It borrows its worker's state for one handler call, so it stays on the worker's thread:
///
/// ```compile_fail,E0277
/// fn is_send<T: Send>() {}
/// is_send::<corelink_engine::On<'static, corelink_engine::verbs::soft::Soft>>();
/// ```
///
/// [`Cx::on`]: super::Cx::on
/// [`Cx`]: super::Cx
pub struct On<'a, P: Provider> {
    conn: ConnId,
    c: &'a mut Conn<P>,
    reqs: &'a mut Requests<P>,
    cfg: &'a WorkerCfg,
}

/// What a refused request gives back: the operation, and why.
type Refused<P> = (Op<Buf<P>>, EngineError);

impl<'a, P: Provider> On<'a, P> {
    pub(crate) fn new(
        conn: ConnId,
        c: &'a mut Conn<P>,
        reqs: &'a mut Requests<P>,
        cfg: &'a WorkerCfg,
    ) -> Self {
        On { conn, c, reqs, cfg }
    }

    /// The connection.
    pub fn conn(&self) -> ConnId {
        self.conn
    }

    /// Queues a request in its kind's class, as [`Cx::submit`](super::Cx::submit).
    #[inline(always)]
    pub fn submit(&mut self, op: Op<Buf<P>>, token: u64) -> Result<(), Refused<P>> {
        let queue = self.cfg.queues[op.kind().index()];
        self.admit(op, token, queue, false)
    }

    /// A quiet request in its kind's class ([`Cx::send_quiet`](super::Cx::send_quiet)).
    #[inline(always)]
    fn quiet(&mut self, op: Op<Buf<P>>, token: u64) -> Result<(), Refused<P>> {
        let queue = self.cfg.queues[op.kind().index()];
        self.admit(op, token, queue, true)
    }

    #[inline(always)]
    fn admit(
        &mut self,
        op: Op<Buf<P>>,
        token: u64,
        queue: usize,
        quiet: bool,
    ) -> Result<(), Refused<P>> {
        let On { conn, c, reqs, cfg } = self;
        let origin = Origin::Handler;
        admit(c, reqs, cfg, *conn, op, token, origin, (), Some(queue), quiet, None)
            .map(|_| ())
            .map_err(|(op, (), e)| (op, e))
    }

    /// Queues a request in class `class`, as [`Cx::submit_as`](super::Cx::submit_as).
    #[inline(always)]
    pub fn submit_as(&mut self, op: Op<Buf<P>>, token: u64, class: u8) -> Result<(), Refused<P>> {
        if usize::from(class) >= CLASSES {
            return Err((op, EngineError::NoSuchClass { class, classes: CLASSES }));
        }
        let queue = self.cfg.queue(class);
        self.admit(op, token, queue, false)
    }

    /// Writes `buf`'s bytes to `remote`, as [`Cx::write`](super::Cx::write).
    #[inline(always)]
    pub fn write(
        &mut self,
        buf: Buf<P>,
        remote: RemoteAddr,
        imm: Option<u32>,
        token: u64,
    ) -> Result<(), Refused<P>> {
        self.submit(Op::Write { buf, remote, imm }, token)
    }

    /// Writes `buf`'s bytes to `remote` telling only a failure, as
    /// [`Cx::write_quiet`](super::Cx::write_quiet).
    #[inline(always)]
    pub fn write_quiet(
        &mut self,
        buf: Buf<P>,
        remote: RemoteAddr,
        imm: Option<u32>,
        token: u64,
    ) -> Result<(), Refused<P>> {
        self.quiet(Op::Write { buf, remote, imm }, token)
    }

    /// Sends `buf`'s bytes telling only a failure, as
    /// [`Cx::send_quiet`](super::Cx::send_quiet).
    #[inline(always)]
    pub fn send_quiet(&mut self, buf: Buf<P>, token: u64) -> Result<(), Refused<P>> {
        self.quiet(Op::Send { buf, imm: None }, token)
    }

    /// Sends `buf`'s bytes, as [`Cx::send`](super::Cx::send).
    #[inline(always)]
    pub fn send(&mut self, buf: Buf<P>, imm: Option<u32>, token: u64) -> Result<(), Refused<P>> {
        self.submit(Op::Send { buf, imm }, token)
    }

    /// Reads `buf.len()` bytes at `remote` into `buf`, as [`Cx::read`](super::Cx::read).
    #[inline(always)]
    pub fn read(&mut self, buf: Buf<P>, remote: RemoteAddr, token: u64) -> Result<(), Refused<P>> {
        self.submit(Op::Read { buf, remote }, token)
    }

    /// Adds `add` to the word at `remote`, as [`Cx::fetch_add`](super::Cx::fetch_add).
    #[inline(always)]
    pub fn fetch_add(
        &mut self,
        remote: RemoteAddr,
        add: u64,
        token: u64,
    ) -> Result<(), Refused<P>> {
        self.submit(Op::FetchAdd { remote, add }, token)
    }

    /// Swaps the word at `remote` if it equals `compare`, as
    /// [`Cx::compare_swap`](super::Cx::compare_swap).
    #[inline(always)]
    pub fn compare_swap(
        &mut self,
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
        token: u64,
    ) -> Result<(), Refused<P>> {
        self.submit(Op::CompareSwap { remote, compare, swap }, token)
    }
}

impl<P: Provider> std::fmt::Debug for On<'_, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("On").field("conn", &self.conn).finish()
    }
}
