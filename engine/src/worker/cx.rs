//! `Cx`: what a worker's handler sees of its worker — buffers, connections, requests, timers,
//! metrics. Everything here runs on the worker's thread, takes no lock and allocates nothing
//! after start-up (the queues it fills were sized then).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use corelink_verbs::{Provider, RemoteAddr};

use super::conn::{Conn, InFlight, Phase, Queued};
use crate::error::{EngineError, Result};
use crate::handoff::{ExtCompletion, Origin, ToControl};
use crate::metrics::Metrics;
use crate::pool::{Buf, Pool};
use crate::request::{CloseReason, ConnId, ConnInfo, Done, Op, OpKind};
use crate::ring::Producer;
use crate::slab::Slab;
use crate::tunables::MAX_PRIVATE_DATA;

/// A worker's settings, from the core map.
#[derive(Clone, Debug)]
pub(crate) struct WorkerCfg {
    pub(crate) poll_budget: usize,
    pub(crate) sq_depth: u32,
    pub(crate) max_inline: u32,
    pub(crate) recv_size: usize,
    pub(crate) idle_after: Option<Duration>,
}

/// Something the handler (or a client) is to be told, produced outside a completion's dispatch.
#[derive(Debug)]
pub(crate) enum Notice<P: Provider> {
    Done(Done<P>),
    Client(u16, ExtCompletion),
    ConnectFailed(u64, String),
    Closed(ConnId, CloseReason),
}

/// A worker's state, as its handler uses it.
pub struct Cx<P: Provider> {
    pub(crate) index: usize,
    pub(crate) now: Instant,
    pub(crate) cfg: WorkerCfg,
    pub(crate) cq: Arc<P::Cq>,
    pub(crate) region: Arc<P::Mr>,
    pub(crate) pool: Pool<P>,
    pub(crate) conns: Vec<Option<Conn<P>>>,
    /// Connections in `conns` (so that the loop never scans the table to count them).
    pub(crate) live_conns: usize,
    pub(crate) generations: Vec<u32>,
    pub(crate) free_conns: Vec<u16>,
    /// Connections with queued requests or closing, to visit at the next flush.
    pub(crate) dirty: Vec<u16>,
    pub(crate) inflight: Slab<InFlight<P>>,
    pub(crate) to_control: Producer<ToControl<P>>,
    /// Messages for the control core that did not fit in the ring yet.
    pub(crate) control_backlog: VecDeque<ToControl<P>>,
    pub(crate) notices: VecDeque<Notice<P>>,
    pub(crate) timers: BinaryHeap<Reverse<(Instant, u64)>>,
    pub(crate) metrics: Metrics,
    pub(crate) stopping: bool,
    pub(crate) shutdown_deadline: Option<Instant>,
    /// External clients' connects in progress: (client, token, the vector to give back).
    pub(crate) ext_connects: Vec<(u16, u64, Vec<u8>)>,
}

impl<P: Provider> std::fmt::Debug for Cx<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cx")
            .field("worker", &self.index)
            .field("conns", &self.conns.iter().flatten().count())
            .field("in_flight", &self.inflight.len())
            .finish()
    }
}

impl<P: Provider> Cx<P> {
    /// This worker's index (its position in the core map's `workers`).
    pub fn worker_index(&self) -> usize {
        self.index
    }

    /// The time read at the start of this loop iteration.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// A buffer of at least `len` bytes from the worker's registered pool.
    pub fn alloc(&self, len: usize) -> Result<Buf<P>> {
        self.pool.get(len)
    }

    /// The region this worker exposes to its peers for one-sided operations (copy in and out
    /// with `Mr::write_at` / `Mr::read_at`: peers may write it at any time).
    pub fn region(&self) -> &P::Mr {
        &self.region
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
        self.conns.iter().flatten().filter(|c| c.phase == Phase::Open).map(|c| c.id)
    }

    pub(crate) fn conn(&self, id: ConnId) -> Result<&Conn<P>> {
        match self.conns.get(id.slot as usize).and_then(Option::as_ref) {
            Some(c) if c.id == id => Ok(c),
            _ => Err(EngineError::NoSuchConnection(id)),
        }
    }

    fn conn_mut(&mut self, id: ConnId) -> Result<&mut Conn<P>> {
        match self.conns.get_mut(id.slot as usize).and_then(Option::as_mut) {
            Some(c) if c.id == id => Ok(c),
            _ => Err(EngineError::NoSuchConnection(id)),
        }
    }

    /// Queues a request on `conn`; it goes to the device at the end of this iteration (one
    /// doorbell per connection). On refusal the request (and its buffer) comes back.
    pub fn submit(
        &mut self,
        conn: ConnId,
        op: Op<P>,
        token: u64,
    ) -> Result<(), (Op<P>, EngineError)> {
        let atomic_buf = match &op {
            Op::FetchAdd { .. } | Op::CompareSwap { .. } => match self.pool.get(8) {
                Ok(b) => Some(b),
                Err(e) => return Err((op, e)),
            },
            _ => None,
        };
        if let Err(e) = self.check_open(conn) {
            return Err((op, e));
        }
        let q = match op {
            Op::Send { buf, imm } => {
                queued(OpKind::Send, Some(buf), RemoteAddr::default(), imm, 0, 0, token)
            }
            Op::Write { buf, remote, imm } => {
                queued(OpKind::Write, Some(buf), remote, imm, 0, 0, token)
            }
            Op::Read { buf, remote } => queued(OpKind::Read, Some(buf), remote, None, 0, 0, token),
            Op::FetchAdd { remote, add } => {
                queued(OpKind::FetchAdd, atomic_buf, remote, None, add, 0, token)
            }
            Op::CompareSwap { remote, compare, swap } => {
                queued(OpKind::CompareSwap, atomic_buf, remote, None, compare, swap, token)
            }
        };
        self.enqueue(conn, q);
        Ok(())
    }

    fn check_open(&self, conn: ConnId) -> Result<()> {
        if self.stopping {
            return Err(EngineError::ShuttingDown);
        }
        match self.conn(conn)?.phase {
            Phase::Open => Ok(()),
            Phase::Closing => Err(EngineError::ConnectionClosing(conn)),
        }
    }

    pub(crate) fn enqueue(&mut self, conn: ConnId, q: Queued<P>) {
        let Some(c) = self.conns.get_mut(conn.slot as usize).and_then(Option::as_mut) else {
            return;
        };
        if c.id != conn {
            return;
        }
        if c.queued.is_empty() {
            self.dirty.push(conn.slot);
        }
        c.queued.push_back(q);
    }

    /// Sends `buf`'s bytes (with an immediate if `imm`).
    pub fn send(
        &mut self,
        conn: ConnId,
        buf: Buf<P>,
        imm: Option<u32>,
        token: u64,
    ) -> Result<(), (Op<P>, EngineError)> {
        self.submit(conn, Op::Send { buf, imm }, token)
    }

    /// Writes `buf`'s bytes to `remote` (with an immediate if `imm`).
    pub fn write(
        &mut self,
        conn: ConnId,
        buf: Buf<P>,
        remote: RemoteAddr,
        imm: Option<u32>,
        token: u64,
    ) -> Result<(), (Op<P>, EngineError)> {
        self.submit(conn, Op::Write { buf, remote, imm }, token)
    }

    /// Reads `buf.len()` bytes at `remote` into `buf`.
    pub fn read(
        &mut self,
        conn: ConnId,
        buf: Buf<P>,
        remote: RemoteAddr,
        token: u64,
    ) -> Result<(), (Op<P>, EngineError)> {
        self.submit(conn, Op::Read { buf, remote }, token)
    }

    /// Adds `add` to the word at `remote`; the old value comes in the completion.
    pub fn fetch_add(
        &mut self,
        conn: ConnId,
        remote: RemoteAddr,
        add: u64,
        token: u64,
    ) -> Result<(), (Op<P>, EngineError)> {
        self.submit(conn, Op::FetchAdd { remote, add }, token)
    }

    /// Swaps `swap` into the word at `remote` if it holds `compare`; the old value comes in the
    /// completion.
    pub fn compare_swap(
        &mut self,
        conn: ConnId,
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
        token: u64,
    ) -> Result<(), (Op<P>, EngineError)> {
        self.submit(conn, Op::CompareSwap { remote, compare, swap }, token)
    }

    /// Connects to `addr` through the control core; the handler hears `on_connected` (with
    /// `token` in the info) or `on_connect_failed`. `private_data` may hold 36 bytes (the rest
    /// of rdma_cm's 56 carries the engine's own region descriptor).
    pub fn connect(&mut self, addr: SocketAddr, private_data: &[u8], token: u64) -> Result<()> {
        self.connect_from(addr, private_data, token, Origin::Handler)
    }

    pub(crate) fn connect_from(
        &mut self,
        addr: SocketAddr,
        private_data: &[u8],
        token: u64,
        origin: Origin,
    ) -> Result<()> {
        if self.stopping {
            return Err(EngineError::ShuttingDown);
        }
        let max = MAX_PRIVATE_DATA - corelink_verbs::RemoteRegion::WIRE_BYTES;
        if private_data.len() > max {
            return Err(EngineError::Config(format!(
                "{} bytes of private data; at most {max}",
                private_data.len()
            )));
        }
        let mut pd = ArrayVec::new();
        pd.extend(private_data.iter().copied());
        self.tell_control(ToControl::Connect { addr, private_data: pd, token, origin });
        Ok(())
    }

    /// Closes `conn`: queued requests fail with `WrFlushErr`, in-flight ones complete or
    /// flush, the peer is disconnected, and the handler hears `on_closed`.
    pub fn close(&mut self, conn: ConnId) -> Result<()> {
        self.begin_close(conn, CloseReason::Local)
    }

    pub(crate) fn begin_close(&mut self, conn: ConnId, reason: CloseReason) -> Result<()> {
        let c = self.conn_mut(conn)?;
        if c.reason.is_none() {
            c.reason = Some(reason);
        }
        c.phase = Phase::Closing;
        let send = !c.disconnect_sent;
        c.disconnect_sent = true;
        let key = c.cm_key;
        self.dirty.push(conn.slot);
        if send {
            self.tell_control(ToControl::Disconnect { cm_key: key });
        }
        Ok(())
    }

    /// Calls the handler's `on_timer(token)` once `after` has passed.
    pub fn set_timer(&mut self, after: Duration, token: u64) -> Result<()> {
        if self.timers.len() >= crate::tunables::MAX_TIMERS {
            return Err(EngineError::Config(format!(
                "more than {} timers",
                crate::tunables::MAX_TIMERS
            )));
        }
        self.timers.push(Reverse((self.now + after, token)));
        Ok(())
    }

    pub(crate) fn tell_control(&mut self, m: ToControl<P>) {
        if !self.control_backlog.is_empty() {
            self.control_backlog.push_back(m);
            return;
        }
        if let Err(m) = self.to_control.push(m) {
            self.control_backlog.push_back(m);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn queued<P: Provider>(
    kind: OpKind,
    buf: Option<Buf<P>>,
    remote: RemoteAddr,
    imm: Option<u32>,
    arg: u64,
    swap: u64,
    token: u64,
) -> Queued<P> {
    Queued { kind, buf, remote, imm, arg, swap, token, origin: Origin::Handler, ext_data: None }
}
