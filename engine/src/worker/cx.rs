//! `Cx`: what a worker's handler sees of its worker — buffers, connections, requests, timers,
//! metrics. Everything here runs on the worker's thread, takes no lock and allocates nothing
//! after start-up (the queues it fills were sized then).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use corelink_verbs::{AccessFlags, Provider, RemoteAddr, WcStatus};

use super::admit::{admit, Now, Refusal};
use super::cfg::WorkerCfg;
use super::conn::{Conn, Phase};
use super::conns::Conns;
use super::ids::RecvId;
use super::ids::ReqId;
use super::on::On;
use super::outbox::Outbox;
use super::requests::{Carried, Requests};
use super::sched;
use super::timers::Timers;
use crate::error::{EngineError, Result};
use crate::handoff::{Origin, ToControl};
use crate::memory::{Grant, GrantId, Memory};
use crate::metrics::Metrics;
use crate::pool::{Buf, Pool};
use crate::request::{CloseReason, ConnId, ConnInfo, Op};
use crate::tunables::{CLASSES, MAX_POLL_BATCH, MAX_QPS_PER_CONN};

/// A worker's state, as its handler uses it: buffers, connections, requests, timers and
/// metrics of the worker the handler runs on.
///
/// It never leaves its worker's thread (it is not `Send`):
///
/// ```compile_fail,E0277
/// fn is_send<T: Send>() {}
/// is_send::<corelink_engine::Cx<corelink_engine::verbs::soft::Soft>>();
/// ```
pub struct Cx<P: Provider> {
    pub(crate) index: usize,
    /// This iteration's clock, once read (see [`Cx::now`]).
    pub(crate) now: std::cell::Cell<Option<Instant>>,
    pub(crate) cfg: WorkerCfg,
    pub(crate) cq: Arc<P::Cq>,
    /// The worker's protection domain (application memory and its grants are registered on it).
    pub(crate) pd: Arc<P::Pd>,
    pub(crate) pool: Pool<P>,
    /// The connections' receive buffers (`worker.max_conns * worker.recvs_per_conn` of
    /// `worker.recv_size`; the control core admits no more connections than they serve).
    pub(crate) recv_pool: Pool<P>,
    /// Connections (slots, generations, the dirty set).
    pub(crate) conns: Conns<P>,
    /// Requests accepted and not yet completed (waiting or on the device), by id, with
    /// external clients' vectors and the reads in flight that identical reads may share.
    pub(crate) reqs: Requests<P>,
    /// Notices for the handler and clients, messages for the control core.
    pub(crate) outbox: Outbox<P>,
    /// Receives whose messages were handled this iteration, to post again once the iteration's
    /// work requests went out (a repost is then off the path from a message to its answer).
    pub(crate) reposts: ArrayVec<(RecvId, Buf<P>), MAX_POLL_BATCH>,
    /// A lane is low on posted receives: this iteration's go back before its flush.
    pub(crate) repost_first: bool,
    /// Where the scheduler writes a batch's gather lists.
    pub(crate) gather: sched::GatherSpace,
    pub(crate) timers: Timers,
    /// Connects with a reconnect policy ([`Cx::connect_with`]).
    pub(crate) redials: super::redial::Redials,
    pub(crate) metrics: Metrics,
    pub(crate) stopping: bool,
    pub(crate) shutdown_deadline: Option<Instant>,
    /// The worker's thread (what [`Cx::waker`] unparks).
    pub(crate) thread: std::thread::Thread,
}

impl<P: Provider> std::fmt::Debug for Cx<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cx")
            .field("worker", &self.index)
            .field("conns", &self.conns.live())
            .field("requests", &self.reqs.len())
            .finish()
    }
}

impl<P: Provider> Cx<P> {
    /// This worker's index (its position in the core map's `workers`).
    pub fn worker_index(&self) -> usize {
        self.index
    }

    /// The loop's clock: read at the first call in a loop iteration, the same for the rest of
    /// it (the loop itself reads it only when it needs it: a clock read is a system call on
    /// some machines, e.g. a guest whose clock source is the HPET).
    #[inline]
    pub fn now(&self) -> Instant {
        clock(&self.now)
    }

    /// A buffer of at least `len` bytes from the worker's registered pool.
    pub fn alloc(&self, len: usize) -> Result<Buf<P>> {
        self.pool.get(len)
    }

    /// Registers `len` bytes of zeroed memory with this worker (page-aligned; on huge pages
    /// with `huge_pages`). No peer can reach it until [`Cx::grant`] exposes a range.
    pub fn register_memory(&mut self, len: usize, huge_pages: bool) -> Result<Memory<P>> {
        Memory::allocate(&self.pd, len, huge_pages)
    }

    /// Registers the caller's memory at `addr..addr + len` with this worker (any size: a
    /// table, a file cache). No peer can reach it until [`Cx::grant`] exposes a range.
    ///
    /// # Safety
    /// The range must be valid for reads and writes until the returned `Memory` and every
    /// grant of it are gone (a grant lives until it is revoked or its connection starts
    /// closing), and nothing may hold a Rust reference into it while the device or a peer may
    /// write it.
    pub unsafe fn register_memory_raw(&mut self, addr: *mut u8, len: usize) -> Result<Memory<P>> {
        // SAFETY: forwarded from this function's contract.
        unsafe { Memory::from_raw(&self.pd, addr, len) }
    }

    /// Exposes `len` bytes of `mem` at `offset` to the peer of `conn` with `rights`
    /// (`REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`, or several): hand the grant's
    /// `region` to that peer (a message). Until then, and after [`Cx::revoke`] or once the
    /// connection starts closing, the peer's accesses fail with a remote access error.
    ///
    /// # Examples
    ///
    /// ```
    /// # use corelink_engine::verbs::{soft::Soft, AccessFlags};
    /// # use corelink_engine::{ConnId, ConnInfo, Cx};
    /// // In a handler: expose 4 KiB of a table, read-only, to the peer that just connected,
    /// // and tell it where (the peer's handler decodes the 20 bytes).
    /// fn on_connected(cx: &mut Cx<Soft>, conn: ConnId, table: &corelink_engine::Memory<Soft>) {
    ///     let grant = cx.grant(conn, table, 0, 4096, AccessFlags::REMOTE_READ).unwrap();
    ///     let mut msg = cx.alloc(20).unwrap();
    ///     msg.fill(&grant.region.to_bytes()).unwrap();
    ///     cx.send(conn, msg, None, 0).map_err(|(_, e)| e).unwrap();
    /// }
    /// ```
    pub fn grant(
        &mut self,
        conn: ConnId,
        mem: &Memory<P>,
        offset: usize,
        len: usize,
        rights: AccessFlags,
    ) -> Result<Grant> {
        if let Phase::Closing = self.conns.get(conn)?.phase {
            return Err(EngineError::ConnectionClosing(conn));
        }
        let exposed = mem.expose(offset, len, rights)?;
        let c = self.conns.get_mut(conn)?;
        let n = c.next_grant;
        c.next_grant = c.next_grant.wrapping_add(1);
        let region = exposed.region();
        c.grants.push((n, exposed));
        Ok(Grant { id: GrantId { conn, n }, region })
    }

    /// Takes grant `id` back: from now on its peer's accesses fail with a remote access error.
    pub fn revoke(&mut self, id: GrantId) -> Result<()> {
        let c = self.conns.get_mut(id.conn)?;
        let i =
            c.grants.iter().position(|(n, _)| *n == id.n).ok_or(EngineError::NoSuchGrant(id))?;
        c.grants.swap_remove(i);
        Ok(())
    }

    /// What wakes this worker from another thread: a worker without connections parks between
    /// idle iterations (up to 1 ms); give this to whatever hands the handler work through
    /// memory of its own (a ring the handler drains in [`Handler::poll`](crate::Handler::poll)),
    /// and call it after each hand-over. Cheap when the worker is not parked.
    pub fn waker(&self) -> corelink_verbs::Waker {
        let t = self.thread.clone();
        corelink_verbs::Waker::new(move || t.unpark())
    }

    /// This worker's metrics so far.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// What the worker knows of an open connection.
    pub fn conn_info(&self, conn: ConnId) -> Option<&ConnInfo> {
        self.conn(conn).ok().map(|c| &c.info)
    }

    /// Open connections.
    pub fn connections(&self) -> impl Iterator<Item = ConnId> + '_ {
        self.conns.iter().filter(|c| c.phase == Phase::Open).map(|c| c.id)
    }

    pub(crate) fn conn(&self, id: ConnId) -> Result<&Conn<P>> {
        self.conns.get(id)
    }

    /// Queues a request on `conn` in its kind's default class; it goes to the device at the
    /// end of this iteration, or later when the connection's QPs are busy (backpressure). On
    /// refusal the request (and its buffer) comes back.
    ///
    /// Order: requests of one class go to the device in submission order, on one QP per
    /// batch. Across classes, and across the lanes of a multi-QP connection, there is no order:
    /// with priorities on, a read submitted after a write may overtake it (that is the point).
    /// A read that must see an earlier write goes in the write's class ([`Cx::submit_as`]), on
    /// a connection with one lane; a read identical to one already in flight may share that
    /// read's result, unless the connection posted a write in between (`merge_reads`).
    #[inline(always)]
    pub fn submit(
        &mut self,
        conn: ConnId,
        op: Op<Buf<P>>,
        token: u64,
    ) -> Result<(), (Op<Buf<P>>, EngineError)> {
        // Each kind through an arm of its own, so that a runtime `Op` is matched once, here,
        // and what follows is made knowing its kind (not moved through every layer below).
        match op {
            Op::Write { buf, remote, imm } => {
                self.in_default_class(conn, Op::Write { buf, remote, imm }, token, false)
            }
            Op::Send { buf, imm } => {
                self.in_default_class(conn, Op::Send { buf, imm }, token, false)
            }
            Op::Read { buf, remote } => {
                self.in_default_class(conn, Op::Read { buf, remote }, token, false)
            }
            Op::FetchAdd { remote, add } => {
                self.in_default_class(conn, Op::FetchAdd { remote, add }, token, false)
            }
            Op::CompareSwap { remote, compare, swap } => {
                self.in_default_class(conn, Op::CompareSwap { remote, compare, swap }, token, false)
            }
        }
    }

    /// A request of the handler in its kind's class (the core map's, so in range), quiet
    /// if `quiet`: [`Cx::submit`]'s arms, [`Cx::send_quiet`] and [`Cx::write_quiet`].
    #[inline(always)]
    fn in_default_class(
        &mut self,
        conn: ConnId,
        op: Op<Buf<P>>,
        token: u64,
        quiet: bool,
    ) -> Result<(), (Op<Buf<P>>, EngineError)> {
        let queue = self.cfg.queues[op.kind().index()];
        self.handler_request(conn, op, token, queue, quiet)
    }

    /// Queues a request in request class `class` (0 goes first; at most
    /// [`crate::tunables::CLASSES`] - 1). With priorities off, every request goes in arrival
    /// order.
    #[inline(always)]
    pub fn submit_as(
        &mut self,
        conn: ConnId,
        op: Op<Buf<P>>,
        token: u64,
        class: u8,
    ) -> Result<(), (Op<Buf<P>>, EngineError)> {
        if usize::from(class) >= CLASSES {
            return Err((op, EngineError::NoSuchClass { class, classes: CLASSES }));
        }
        let queue = self.cfg.queue(class);
        self.handler_request(conn, op, token, queue, false)
    }

    /// A request of the handler on `conn` in queue `queue` ([`WorkerCfg::queue`]), quiet if
    /// `quiet` ([`Cx::send_quiet`]): accepted, or everything back with why.
    #[inline(always)]
    fn handler_request(
        &mut self,
        conn: ConnId,
        op: Op<Buf<P>>,
        token: u64,
        queue: usize,
        quiet: bool,
    ) -> Result<(), (Op<Buf<P>>, EngineError)> {
        self.accept_with(conn, op, token, Origin::Handler, (), Some(queue), quiet)
            .map(|_| ())
            .map_err(|(op, (), e)| (op, e))
    }

    /// The flat path: posts the request now, on its own doorbell, signalled, bypassing the
    /// scheduler (no waiting, no priorities, no merging). When the connection's QPs have no
    /// room the request comes back with `QueueFull`: the caller retries later.
    pub fn post_now(
        &mut self,
        conn: ConnId,
        op: Op<Buf<P>>,
        token: u64,
    ) -> Result<(), (Op<Buf<P>>, EngineError)> {
        let max = self.cfg.max_outstanding;
        let rd = op.kind().is_rd_atomic();
        let max_rd = self.cfg.max_rd_atomic;
        let lane = match self.conn(conn) {
            Ok(c) => {
                let n = c.lanes.len();
                (0..n).map(|i| (c.next_lane + i) % n).find(|&l| {
                    let lane = &c.lanes[l];
                    lane.sq.outstanding() < max && (!rd || lane.sq.rd_outstanding < max_rd)
                })
            }
            Err(e) => return Err((op, e)),
        };
        let Some(l) = lane else { return Err((op, EngineError::QueueFull(conn))) };
        let id = self.accept(conn, op, token, Origin::Handler)?;
        let Cx { conns, reqs, metrics, cfg, outbox, .. } = self;
        let words = reqs.words();
        let (Ok(c), Some(r)) = (conns.get_mut(conn), reqs.get_mut(id)) else {
            return Ok(());
        };
        c.next_lane = (l + 1) % c.lanes.len();
        r.lane = l as u8;
        let one = sched::single(id, r, words, cfg);
        if !sched::post_one(one, &mut c.lanes[l], reqs, metrics, outbox) {
            c.note_error(WcStatus::GeneralErr);
            conns.mark(conn.slot);
        }
        Ok(())
    }

    /// Connection `conn`, checked once (it is there and open, and the worker is not stopping)
    /// for a run of requests on it: a window posted at once, or posted again as its
    /// completions come ([`Handler::on_completions`]). Each request through the [`On`] goes
    /// as through this `Cx`'s call of the same name, without the checks made again.
    ///
    /// # Examples
    ///
    /// The connecting end sends a window of three messages on its new connection; the
    /// accepting end counts them:
    ///
    /// ```
    /// use corelink_engine::verbs::soft::Soft;
    /// use corelink_engine::{ConnId, ConnInfo, Cx, Engine, Handler, Message, Placement};
    /// use std::sync::mpsc::{channel, Sender};
    ///
    /// struct Window { addr: std::net::SocketAddr, asked: bool, got: Sender<Vec<u8>> }
    ///
    /// impl Handler<Soft> for Window {
    ///     fn poll(&mut self, cx: &mut Cx<Soft>) {
    ///         if !std::mem::replace(&mut self.asked, true) {
    ///             cx.connect(self.addr, b"", 1).unwrap();
    ///         }
    ///     }
    ///     fn on_connected(&mut self, cx: &mut Cx<Soft>, conn: ConnId, info: &ConnInfo) {
    ///         if !info.initiated {
    ///             return;
    ///         }
    ///         let bufs: Vec<_> = (0..3u8)
    ///             .map(|i| {
    ///                 let mut b = cx.alloc(1).unwrap();
    ///                 b.fill(&[i]).unwrap();
    ///                 b
    ///             })
    ///             .collect();
    ///         let mut on = cx.on(conn).unwrap();
    ///         for (token, buf) in bufs.into_iter().enumerate() {
    ///             on.send(buf, None, token as u64).map_err(|(_, e)| e).unwrap();
    ///         }
    ///     }
    ///     fn on_message(&mut self, _cx: &mut Cx<Soft>, _conn: ConnId, msg: &Message<'_>) {
    ///         self.got.send(msg.data.to_vec()).unwrap();
    ///     }
    /// }
    ///
    /// let addr: std::net::SocketAddr = "10.98.0.9:7000".parse()?;
    /// let map = corelink_config::parse(&format!(
    ///     "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{addr}\""
    /// ))?
    /// .validate(&corelink_config::MachineTopology::load()?)?;
    /// let (tx, rx) = channel();
    /// let engine = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| Window {
    ///     addr,
    ///     asked: false,
    ///     got: tx.clone(),
    /// })?;
    /// for i in 0..3u8 {
    ///     assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(30))?, [i], "in order");
    /// }
    /// engine.shutdown()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// [`Handler::on_completions`]: super::Handler::on_completions
    pub fn on(&mut self, conn: ConnId) -> Result<On<'_, P>> {
        let Cx { conns, reqs, cfg, stopping, .. } = self;
        let c = conns.taking_marked(conn, *stopping)?;
        Ok(On::new(conn, c, reqs, cfg))
    }

    /// Checks `conn` and makes `op` a request of the handler; returns its id.
    #[inline(always)]
    pub(crate) fn accept(
        &mut self,
        conn: ConnId,
        op: Op<Buf<P>>,
        token: u64,
        origin: Origin,
    ) -> Result<ReqId, (Op<Buf<P>>, EngineError)> {
        self.accept_with(conn, op, token, origin, (), None, false).map_err(|(op, (), e)| (op, e))
    }

    /// Checks `conn` and makes `op` a request (with an external client's vector `ext`, given
    /// back in its completion), queued in `queue` if one is given (a class's:
    /// [`WorkerCfg::queue`]; with the one lookup of the
    /// connection); returns its id, or everything back with why (unboxed: a refusal allocates
    /// nothing). A `quiet` one tells only a failure ([`Cx::send_quiet`]).
    #[allow(clippy::result_large_err, clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn accept_with<E: Carried>(
        &mut self,
        conn: ConnId,
        op: Op<Buf<P>>,
        token: u64,
        origin: Origin,
        ext: E,
        queue: Option<usize>,
        quiet: bool,
    ) -> Result<ReqId, Refusal<P, E>> {
        let Cx { conns, reqs, cfg, stopping, metrics, outbox, .. } = self;
        let c = match conns.taking(conn, *stopping) {
            Ok(c) => c,
            Err(e) => return Err((op, ext, e)),
        };
        // A lone request of the first queue on an idle lane goes at once (`admit`); anything
        // else goes at the loop's flush, which visits the connection (as one whose post
        // failed: it closes).
        let now = Some(Now { metrics, outbox });
        let (id, visit) = admit(c, reqs, cfg, conn, op, token, origin, ext, queue, quiet, now)?;
        if visit {
            conns.mark(conn.slot);
        }
        Ok(id)
    }

    /// Queues a keepalive probe on `conn` (a zero-length RDMA write, first in its class order);
    /// refused (no buffer, a full request table), it is tried again at the next pass.
    pub(crate) fn probe(&mut self, conn: ConnId) {
        let queued = self.pool.get(0).ok().is_some_and(|buf| {
            let op = Op::Write { buf, remote: RemoteAddr::default(), imm: None };
            self.accept_with(conn, op, 0, Origin::Keepalive, (), Some(self.cfg.queue(0)), false)
                .is_ok()
        });
        match self.conns.get_mut(conn) {
            Ok(c) if !queued => c.live.probing = false,
            _ => self.metrics.keepalive_probes += u64::from(queued),
        }
    }

    /// A keepalive probe of `conn` ended with `status` (a failure closed the connection).
    #[cold]
    pub(crate) fn probe_done(&mut self, conn: ConnId, status: WcStatus) {
        self.metrics.keepalive_failures += u64::from(!status.is_success());
        if let Ok(c) = self.conns.get_mut(conn) {
            c.live.probing = false;
        }
    }

    /// Checks that `conn` takes requests (see [`Conns::taking`]).
    pub(crate) fn check_open(&mut self, conn: ConnId) -> Result<()> {
        self.conns.taking(conn, self.stopping).map(|_| ())
    }

    /// The bytes a send may carry inline (`worker.max_inline`): what a quiet send
    /// ([`Cx::send_quiet`]) may have to hold no buffer and ask for no completion.
    pub fn max_inline(&self) -> usize {
        self.cfg.max_inline as usize
    }

    /// The largest message this worker's connections take (`worker.recv_size`): a peer's send
    /// up to this size lands in one receive buffer.
    pub fn recv_size(&self) -> usize {
        self.cfg.recv_size
    }

    /// Sends `buf`'s bytes (with an immediate if `imm`); the peer's handler hears
    /// `on_message`, this one `on_completion` with `token`.
    ///
    /// # Examples
    ///
    /// A handler that connects its engine to itself, sends on the connection it opened and
    /// echoes on the one it accepted:
    ///
    /// ```
    /// use corelink_engine::verbs::soft::Soft;
    /// use corelink_engine::{Buf, ConnId, ConnInfo, Cx, Done, Engine, Handler, Message, Placement};
    /// use std::sync::mpsc::{channel, Sender};
    ///
    /// struct Ping { addr: std::net::SocketAddr, asked: bool, told: Sender<Vec<u8>> }
    ///
    /// impl Handler<Soft> for Ping {
    ///     fn poll(&mut self, cx: &mut Cx<Soft>) {
    ///         if !std::mem::replace(&mut self.asked, true) {
    ///             cx.connect(self.addr, b"ping", 1).unwrap();
    ///         }
    ///     }
    ///     fn on_connected(&mut self, cx: &mut Cx<Soft>, conn: ConnId, info: &ConnInfo) {
    ///         if info.initiated {
    ///             let mut buf = cx.alloc(4).unwrap();
    ///             buf.fill(b"ping").unwrap();
    ///             cx.send(conn, buf, None, 2).map_err(|(_, e)| e).unwrap();
    ///         }
    ///     }
    ///     fn on_message(&mut self, cx: &mut Cx<Soft>, conn: ConnId, msg: &Message<'_>) {
    ///         if cx.conn_info(conn).is_some_and(|i| i.initiated) {
    ///             self.told.send(msg.data.to_vec()).unwrap(); // the answer
    ///         } else {
    ///             let mut buf = cx.alloc(4).unwrap();
    ///             buf.fill(b"pong").unwrap();
    ///             cx.send(conn, buf, None, 3).map_err(|(_, e)| e).unwrap();
    ///         }
    ///     }
    ///     fn on_completion(&mut self, _cx: &mut Cx<Soft>, done: Done<Buf<Soft>>) {
    ///         assert!(done.status.is_success(), "{done:?}");
    ///     }
    /// }
    ///
    /// let addr: std::net::SocketAddr = "10.98.0.3:7000".parse()?;
    /// let map = corelink_config::parse(&format!(
    ///     "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{addr}\""
    /// ))?
    /// .validate(&corelink_config::MachineTopology::load()?)?;
    /// let (tx, rx) = channel();
    /// let engine = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| Ping {
    ///     addr,
    ///     asked: false,
    ///     told: tx.clone(),
    /// })?;
    /// assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(30))?, b"pong");
    /// engine.shutdown()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn send(
        &mut self,
        conn: ConnId,
        buf: Buf<P>,
        imm: Option<u32>,
        token: u64,
    ) -> Result<(), (Op<Buf<P>>, EngineError)> {
        self.submit(conn, Op::Send { buf, imm }, token)
    }

    /// Sends `buf`'s bytes as [`Cx::send`] does (no immediate), but tells only a failure:
    /// on success the buffer goes back to the pool and the handler hears nothing. For
    /// protocols whose answers already say a message arrived (an RPC layer's requests and
    /// responses): the sender keeps what it needs of the bytes itself.
    ///
    /// A quiet send of at most [`Cx::max_inline`] bytes goes inline: its buffer goes back to
    /// the pool as soon as it is posted, and its work request asks for no completion of its
    /// own unless one is due (one in `worker.batching.signal_every`, or a loud request's
    /// before it in the same flush), so it costs the device no completion and the worker no
    /// dispatch; a later signalled request on its lane retires it, at the latest a fence the
    /// worker posts when the connection closes. A larger one asks for its completion as any
    /// request (which then frees its buffer untold). A failure or a flush ends a quiet send
    /// with [`Handler::on_completion`] and `token`, as any request (without its buffer, if it
    /// went inline).
    ///
    /// [`Handler::on_completion`]: super::Handler::on_completion
    #[inline(always)]
    pub fn send_quiet(
        &mut self,
        conn: ConnId,
        buf: Buf<P>,
        token: u64,
    ) -> Result<(), (Op<Buf<P>>, EngineError)> {
        self.in_default_class(conn, Op::Send { buf, imm: None }, token, true)
    }

    /// Writes `buf`'s bytes to `remote` as [`Cx::write`] does, but tells only a failure, as
    /// [`Cx::send_quiet`] does a send's: on success the buffer goes back to the pool and the
    /// handler hears nothing. For writes whose effect the peer's answer confirms (a
    /// ping-pong, a record the peer reads after a message): one of at most [`Cx::max_inline`]
    /// bytes goes inline and asks for no completion of its own unless one is due.
    #[inline(always)]
    pub fn write_quiet(
        &mut self,
        conn: ConnId,
        buf: Buf<P>,
        remote: RemoteAddr,
        imm: Option<u32>,
        token: u64,
    ) -> Result<(), (Op<Buf<P>>, EngineError)> {
        self.in_default_class(conn, Op::Write { buf, remote, imm }, token, true)
    }

    /// Writes `buf`'s bytes to `remote` (with an immediate if `imm`).
    ///
    /// # Examples
    ///
    /// The accepting end of a connection grants 4 KiB of its memory and says where in a
    /// message; the connecting end writes 8 bytes there and reads them back with [`Cx::read`]:
    ///
    /// ```
    /// use corelink_engine::verbs::{soft::Soft, AccessFlags, RemoteRegion};
    /// use corelink_engine::{Buf, ConnId, ConnInfo, Cx, Done, Engine, Handler, Memory, Message, OpKind, Placement};
    /// use std::sync::mpsc::{channel, Sender};
    ///
    /// struct WriteRead {
    ///     addr: std::net::SocketAddr,
    ///     asked: bool,
    ///     mem: Option<Memory<Soft>>,
    ///     at: Option<RemoteRegion>,
    ///     told: Sender<Vec<u8>>,
    /// }
    ///
    /// impl Handler<Soft> for WriteRead {
    ///     fn poll(&mut self, cx: &mut Cx<Soft>) {
    ///         if !std::mem::replace(&mut self.asked, true) {
    ///             cx.connect(self.addr, &[], 1).unwrap();
    ///         }
    ///     }
    ///     fn on_connected(&mut self, cx: &mut Cx<Soft>, conn: ConnId, info: &ConnInfo) {
    ///         if info.initiated {
    ///             return; // it waits for the grant
    ///         }
    ///         let mem = self.mem.insert(cx.register_memory(4096, false).unwrap());
    ///         let rights = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    ///         let grant = cx.grant(conn, mem, 0, 4096, rights).unwrap();
    ///         let mut msg = cx.alloc(RemoteRegion::WIRE_BYTES).unwrap();
    ///         msg.fill(&grant.region.to_bytes()).unwrap();
    ///         cx.send(conn, msg, None, 0).map_err(|(_, e)| e).unwrap();
    ///     }
    ///     fn on_message(&mut self, cx: &mut Cx<Soft>, conn: ConnId, msg: &Message<'_>) {
    ///         let region = RemoteRegion::from_bytes(msg.data).unwrap();
    ///         self.at = Some(region);
    ///         let mut buf = cx.alloc(8).unwrap();
    ///         buf.fill(&42u64.to_le_bytes()).unwrap();
    ///         cx.write(conn, buf, region.at(0), None, 2).map_err(|(_, e)| e).unwrap();
    ///     }
    ///     fn on_completion(&mut self, cx: &mut Cx<Soft>, done: Done<Buf<Soft>>) {
    ///         assert!(done.status.is_success(), "{done:?}");
    ///         match (done.kind, self.at) {
    ///             // Requests of one class go in order; a read after a write goes in the
    ///             // write's class to see it (or, as here, after the write's completion).
    ///             (OpKind::Write, Some(at)) => {
    ///                 let buf = cx.alloc(8).unwrap();
    ///                 cx.read(done.conn, buf, at.at(0), 3).map_err(|(_, e)| e).unwrap();
    ///             }
    ///             (OpKind::Read, _) => self.told.send(done.buf.unwrap().as_slice().to_vec()).unwrap(),
    ///             _ => {} // the grant's message went
    ///         }
    ///     }
    /// }
    ///
    /// let addr: std::net::SocketAddr = "10.98.0.4:7000".parse()?;
    /// let map = corelink_config::parse(&format!(
    ///     "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{addr}\""
    /// ))?
    /// .validate(&corelink_config::MachineTopology::load()?)?;
    /// let (tx, rx) = channel();
    /// let engine = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| WriteRead {
    ///     addr,
    ///     asked: false,
    ///     mem: None,
    ///     at: None,
    ///     told: tx.clone(),
    /// })?;
    /// let read = rx.recv_timeout(std::time::Duration::from_secs(30))?;
    /// assert_eq!(read, 42u64.to_le_bytes());
    /// engine.shutdown()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn write(
        &mut self,
        conn: ConnId,
        buf: Buf<P>,
        remote: RemoteAddr,
        imm: Option<u32>,
        token: u64,
    ) -> Result<(), (Op<Buf<P>>, EngineError)> {
        self.submit(conn, Op::Write { buf, remote, imm }, token)
    }

    /// Reads `buf.len()` bytes at `remote` into `buf` (the completion's `buf`; an example is
    /// at [`Cx::write`]).
    #[inline(always)]
    pub fn read(
        &mut self,
        conn: ConnId,
        buf: Buf<P>,
        remote: RemoteAddr,
        token: u64,
    ) -> Result<(), (Op<Buf<P>>, EngineError)> {
        self.submit(conn, Op::Read { buf, remote }, token)
    }

    /// Adds `add` to the word at `remote`; the old value comes in the completion.
    #[inline(always)]
    pub fn fetch_add(
        &mut self,
        conn: ConnId,
        remote: RemoteAddr,
        add: u64,
        token: u64,
    ) -> Result<(), (Op<Buf<P>>, EngineError)> {
        self.submit(conn, Op::FetchAdd { remote, add }, token)
    }

    /// Swaps `swap` into the word at `remote` if it holds `compare`; the old value comes in the
    /// completion.
    #[inline(always)]
    pub fn compare_swap(
        &mut self,
        conn: ConnId,
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
        token: u64,
    ) -> Result<(), (Op<Buf<P>>, EngineError)> {
        self.submit(conn, Op::CompareSwap { remote, compare, swap }, token)
    }

    /// Connects to `addr` through the control core; the handler hears `on_connected` (with
    /// `token` in the info) or `on_connect_failed`. `private_data` may hold
    /// [`crate::MAX_APP_PRIVATE_DATA`] bytes (the rest of rdma_cm's 56 carries the engine's
    /// header, see [`crate::HEADER`]). An example is at [`Cx::send`].
    pub fn connect(&mut self, addr: SocketAddr, private_data: &[u8], token: u64) -> Result<()> {
        let private_data = self.connect_data(private_data)?;
        let origin = Origin::Handler;
        self.tell_control(ToControl::Connect { addr, private_data, token, origin });
        Ok(())
    }

    /// A connect's private data as the control core takes it (refused while stopping, or
    /// beyond [`crate::MAX_APP_PRIVATE_DATA`]).
    fn connect_data(&self, private_data: &[u8]) -> Result<crate::handoff::ConnectData> {
        if self.stopping {
            return Err(EngineError::ShuttingDown);
        }
        let max = crate::MAX_APP_PRIVATE_DATA;
        if private_data.len() > max {
            return Err(EngineError::PrivateDataTooLong { len: private_data.len(), max });
        }
        let mut pd = ArrayVec::new();
        pd.extend(private_data.iter().copied());
        Ok(pd)
    }

    /// [`Cx::connect`] with a reconnect policy: when the connection closes for any reason but
    /// this side's own [`Cx::close`], or when a try fails, the worker connects again after
    /// `policy`'s backoff, until its tries are spent; the handler hears of every step
    /// ([`crate::Handler::on_redial`]), each new connection as `on_connected` with `token`, and
    /// the end of the tries as `on_connect_failed`. Tokens of connects under a policy are
    /// unique among them ([`EngineError::TokenInUse`]). A policy ends at a local close, at
    /// [`Cx::stop_reconnecting`] and at shutdown (a try then waiting fails with
    /// `ShuttingDown`).
    pub fn connect_with(
        &mut self,
        addr: SocketAddr,
        private_data: &[u8],
        token: u64,
        policy: super::redial::Reconnect,
    ) -> Result<()> {
        self.dial(Origin::Handler, addr, private_data, token, policy)
    }

    /// A connect of `origin`'s under `policy` (see [`Cx::connect_with`]).
    pub(crate) fn dial(
        &mut self,
        origin: Origin,
        addr: SocketAddr,
        private_data: &[u8],
        token: u64,
        policy: super::redial::Reconnect,
    ) -> Result<()> {
        let key = super::redial::DialKey { origin, token };
        if self.redials.has(key) {
            return Err(EngineError::TokenInUse(token));
        }
        let pd = self.connect_data(private_data)?;
        self.redials.add(key, addr, pd.clone(), policy);
        self.tell_control(ToControl::Connect { addr, private_data: pd, token, origin });
        Ok(())
    }

    /// Ends the reconnect policy of connect `token` (its connection, if up, stays open and is
    /// not made again; a try waiting is dropped, and nothing more is told of it). Whether it
    /// had one.
    pub fn stop_reconnecting(&mut self, token: u64) -> bool {
        self.redials.stop(super::redial::DialKey::handler(token))
    }

    /// Gives back the receives whose messages this iteration handled, each lane's posted
    /// again when due.
    #[inline(always)]
    pub(crate) fn repost_all(&mut self) {
        while let Some((id, buf)) = self.reposts.pop() {
            self.repost(id, buf);
        }
    }

    /// Closes `conn`: queued requests fail with `WrFlushErr`, in-flight ones complete or
    /// flush, the peer is disconnected, and the handler hears `on_closed`.
    pub fn close(&mut self, conn: ConnId) -> Result<()> {
        self.begin_close(conn, CloseReason::Local)
    }

    pub(crate) fn begin_close(&mut self, conn: ConnId, reason: CloseReason) -> Result<()> {
        let c = self.conns.get_mut(conn)?;
        let send = c.closing(reason);
        // No peer keeps access to memory once its connection closes.
        c.grants.clear();
        let keys: ArrayVec<u64, MAX_QPS_PER_CONN> = c.lanes.iter().map(|l| l.cm_key).collect();
        self.conns.mark(conn.slot);
        if send {
            for cm_key in keys {
                self.tell_control(ToControl::Disconnect { cm_key });
            }
        }
        Ok(())
    }

    /// Calls the handler's `on_timer(token)` once `after` has passed.
    pub fn set_timer(&mut self, after: Duration, token: u64) -> Result<()> {
        self.set_due(after, super::timers::Due::Handler(token))
    }

    /// A timer for `what` once `after` has passed (refused with the limit when the table is
    /// full).
    pub(crate) fn set_due(&mut self, after: Duration, what: super::timers::Due) -> Result<()> {
        let due = self.now() + after;
        self.timers.set(due, what).map_err(|in_use| EngineError::Limit {
            worker: self.index,
            limit: crate::error::Limit::Timers,
            max: crate::tunables::MAX_TIMERS as u64,
            in_use: in_use as u64,
            need: 1,
        })
    }

    /// Posts what the connections have waiting (the scheduler); returns whether anything was.
    #[inline(always)]
    pub(crate) fn flush(&mut self) -> bool {
        if self.stopping {
            self.close_for_shutdown();
        }
        // (most idle iterations: nothing to post, and the scheduler's frame is kilobytes)
        if !self.conns.any_dirty() {
            return false;
        }
        // The latency path: one connection with work, its one ready request posted here as
        // the scheduler would post it (`sched::flush_sole`), without the scheduler's frame.
        let Cx { conns, reqs, metrics, outbox, cfg, .. } = self;
        if conns.visit_sole_dirty(|c| sched::flush_sole(c, reqs, metrics, outbox, cfg)) {
            return true;
        }
        self.flush_dirty()
    }

    /// [`Cx::flush`] of the connections with work.
    #[inline(never)]
    fn flush_dirty(&mut self) -> bool {
        let Cx { conns, reqs, pool, outbox, metrics, cfg, gather, .. } = self;
        sched::flush(conns, reqs, pool, outbox, metrics, cfg, gather)
    }

    /// A lookup that cannot fail did: counted (and a debug assertion).
    #[cold]
    pub(crate) fn invariant_missed(&mut self) {
        self.metrics.invariant_misses += 1;
        debug_assert!(false, "a lookup that cannot fail did (worker {})", self.index);
    }

    pub(crate) fn tell_control(&mut self, m: ToControl<P>) {
        self.outbox.tell_control(m);
    }
}

/// The loop's clock in `cell`: read once an iteration ([`Cx::now`]).
#[inline]
pub(crate) fn clock(cell: &std::cell::Cell<Option<Instant>>) -> Instant {
    match cell.get() {
        Some(t) => t,
        None => {
            let t = Instant::now();
            cell.set(Some(t));
            t
        }
    }
}
