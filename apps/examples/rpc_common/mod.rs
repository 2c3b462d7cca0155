//! What the RPC examples (`kv_store`, `sequencer`, `file_read`) share: the provider dispatch
//! after the command line (`engine_common`'s flags and core map), an engine whose one worker
//! runs an RPC endpoint (its engine handler the plain `RpcHandler`), and one-sided requests from
//! application threads.
//!
//! [`Agent`] is the worker's service: it carries out [`OneSided`] orders (reads and
//! fetch-and-adds from other threads, as the RPC layer's `Handle` carries out calls) with
//! `Rpc::submit` on the session's connection, hearing their completions in
//! `Service::on_completion`; runs an example's server part ([`Serving`], which grants memory to
//! `Rpc::conn` of each session it accepts); publishes the endpoint's metrics; and keeps why
//! each session ended (`Service::on_session_end`, [`Ends`]) for the examples' failure reports.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use corelink_config::{ProviderKind, Validated, WorkerResources};
use corelink_engine::verbs::{Provider, RemoteAddr, Waker, WcStatus};
use corelink_engine::{Buf, Done, Engine, EngineError, Op, OpKind, Placement};
use corelink_rpc::{
    Endpoint, Handle, Inbox, Rpc, RpcError, RpcHandler, RpcMetrics, Service, SessionEnd,
    SessionEvent, SessionId, MAX_SERVICE_TOKEN,
};

use crate::engine_common::{core_map, role_name, Common, Fail, Role};

/// An example: what it runs in each role on provider `P`.
pub trait Example {
    /// Runs `role` on `P`; `addr` is where the (first) server listens.
    fn run<P: Provider>(&self, role: Role, a: &Common, addr: SocketAddr) -> Result<(), Fail>;
}

/// An example's main, after clap: the role and address, the provider, the exit status (2: bad
/// usage, 1: a check failed or something broke).
pub fn main(
    name: &str,
    a: &Common,
    default: SocketAddr,
    ex: &impl Example,
) -> std::process::ExitCode {
    let role = a.role.unwrap_or(Role::Both);
    let res = (|| {
        let addr = match (role, a.addr) {
            (Role::Both, addr) => addr.unwrap_or(default),
            (_, Some(addr)) => addr,
            (r, None) => {
                return Err(Fail::Usage(format!(
                    "{name} {}: ADDR (IP:PORT) is needed",
                    role_name(r)
                )))
            }
        };
        match core_map(a, None)?.map.provider {
            ProviderKind::Soft => ex.run::<corelink_verbs::soft::Soft>(role, a, addr),
            #[cfg(feature = "ibverbs")]
            ProviderKind::Ibverbs => ex.run::<corelink_verbs::ibverbs::Ibverbs>(role, a, addr),
            #[cfg(not(feature = "ibverbs"))]
            ProviderKind::Ibverbs => Err(Fail::Usage("built without the ibverbs feature".into())),
        }
    })();
    crate::engine_common::exit_code(name, role, res)
}

/// The core map of one engine of an example: `--config` or the default (one worker), listening
/// on `listen` if given. Without `--config`, a worker that finds nothing to do yields its core
/// (several engines of one process, each busy-polling, may share a core).
pub fn map(a: &Common, listen: Option<SocketAddr>) -> Result<Validated, Fail> {
    let mut cfg = core_map(a, listen)?;
    if cfg.workers.len() != 1 {
        return Err(Fail::Usage(format!(
            "the core map has {} workers; these examples run one per engine (the service's \
             state is the worker's)",
            cfg.workers.len()
        )));
    }
    if a.config.is_none() {
        cfg.map.worker.yield_after_empty_polls = 64;
    }
    Ok(cfg)
}

/// An example's server part, run by its worker's [`Agent`].
#[allow(unused_variables)]
pub trait Serving<P: Provider>: 'static {
    /// Every loop iteration.
    fn poll(&mut self, rpc: &mut Rpc<'_, P>) {}
    /// A peer opened `session` (`rpc.conn(session)` is its engine connection, to grant it
    /// memory).
    fn accepted(&mut self, rpc: &mut Rpc<'_, P>, session: SessionId) {}
    /// A session it served ended.
    fn closed(&mut self, rpc: &mut Rpc<'_, P>, session: SessionId) {}
}

/// A worker that serves nothing of its own (a client's).
pub struct NoServer;

impl<P: Provider> Serving<P> for NoServer {}

/// Why each client session of a worker ended, as its service heard it
/// (`Service::on_session_end`): what the examples' failure reports add to an error on a
/// session. (A served session's end goes to [`Started::closed`].)
#[derive(Clone, Default)]
pub struct Ends(Arc<Mutex<HashMap<SessionId, String>>>);

impl Ends {
    fn record(&self, session: SessionId, why: String) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(session, why);
        }
    }

    /// Why `session` ended, if it did: waits up to a second for the worker to hear it (a
    /// failed request or call comes first, its connection's close just after).
    pub fn why(&self, session: SessionId) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            if let Some(why) = self.0.lock().ok().and_then(|m| m.get(&session).cloned()) {
                return Some(why);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// An RPC error on `session` as a run failure, with what was being done and, when the
    /// session ended, why.
    pub fn fail<'a>(&'a self, what: &'a str, session: SessionId) -> impl Fn(RpcError) -> Fail + 'a {
        move |e| {
            let e = corelink_verbs::chain(&e);
            match self.why(session) {
                Some(why) => Fail::Run(format!("{what}: {e} (session {session} ended: {why})")),
                None => Fail::Run(format!("{what}: {e}")),
            }
        }
    }
}

/// A one-sided request from another thread.
enum OneOp {
    Read { remote: RemoteAddr, len: usize },
    FetchAdd { remote: RemoteAddr, add: u64 },
}

/// An order for the agent: a request on a session's connection, and where to answer.
struct Order {
    session: SessionId,
    op: OneOp,
    seq: u64,
    reply: Sender<Answer>,
}

/// An answer to a thread's order: its sequence number and outcome.
type Answer = (u64, Result<Outcome, OpError>);

/// What a one-sided request brought back: a read's bytes, or an atomic's old value.
enum Outcome {
    Bytes(Vec<u8>),
    Old(u64),
}

/// Why a one-sided request from a thread failed.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// No buffer for a read.
    #[error("no buffer for the read: {}", corelink_verbs::chain(.0))]
    Alloc(EngineError),
    /// The endpoint refused it (`Rpc::submit`: no such session, the engine's refusal...).
    #[error("the endpoint refused it: {}", corelink_verbs::chain(.0))]
    Refused(RpcError),
    /// It completed with an error status.
    #[error("it completed with {0:?}")]
    Status(WcStatus),
    /// No answer within the timeout, or the worker is gone.
    #[error("no answer from the worker")]
    NoAnswer,
    /// It failed, and its session ended: why.
    #[error("{error} (session {session} ended: {why})")]
    Ended {
        /// The session.
        session: SessionId,
        /// How the request failed.
        error: Box<OpError>,
        /// Why the session ended (`SessionEnd`, as it displays).
        why: String,
    },
}

/// The service of a worker: [`OneSided`] orders, the example's [`Serving`] part, metrics,
/// why sessions ended.
pub struct Agent<H> {
    serving: H,
    orders: Receiver<Order>,
    waker: Arc<OnceLock<Waker>>,
    /// The orders submitted, by their service token.
    pending: HashMap<u64, (u64, Sender<Answer>)>,
    token: u64,
    served: HashSet<SessionId>,
    metrics: Arc<Mutex<RpcMetrics>>,
    ends: Ends,
    closed: Sender<(SessionId, String)>,
}

impl<H> Agent<H> {
    fn issue<P: Provider>(&mut self, rpc: &mut Rpc<'_, P>, o: Order) {
        self.token = (self.token + 1) & MAX_SERVICE_TOKEN;
        let t = self.token;
        let op = match o.op {
            OneOp::Read { remote, len } => match rpc.cx().alloc(len) {
                Ok(buf) => Op::Read { buf, remote },
                Err(e) => {
                    let _ = o.reply.send((o.seq, Err(OpError::Alloc(e))));
                    return;
                }
            },
            OneOp::FetchAdd { remote, add } => Op::FetchAdd { remote, add },
        };
        match rpc.submit(o.session, op, t) {
            Ok(()) => {
                self.pending.insert(t, (o.seq, o.reply));
            }
            Err((_, e)) => {
                let _ = o.reply.send((o.seq, Err(OpError::Refused(e))));
            }
        }
    }
}

impl<P: Provider, H: Serving<P>> Service<P> for Agent<H> {
    fn poll(&mut self, rpc: &mut Rpc<'_, P>) {
        if self.waker.get().is_none() {
            let _ = self.waker.set(rpc.cx().waker());
        }
        while let Ok(o) = self.orders.try_recv() {
            self.issue(rpc, o);
        }
        self.serving.poll(rpc);
        if let Ok(mut m) = self.metrics.try_lock() {
            m.clone_from(rpc.endpoint().metrics());
        }
    }

    fn on_completion(&mut self, _rpc: &mut Rpc<'_, P>, done: Done<Buf<P>>) {
        let Some((seq, reply)) = self.pending.remove(&done.token) else { return };
        let out = match (done.status.is_success(), done.kind, done.buf, done.old_value) {
            (false, ..) => Err(OpError::Status(done.status)),
            (true, OpKind::Read, Some(b), _) => Ok(Outcome::Bytes(b.as_slice().to_vec())),
            (true, _, _, Some(old)) => Ok(Outcome::Old(old)),
            (true, ..) => Err(OpError::Status(done.status)),
        };
        let _ = reply.send((seq, out));
    }

    fn on_session(&mut self, rpc: &mut Rpc<'_, P>, session: SessionId, event: SessionEvent) {
        if event == SessionEvent::Accepted {
            self.served.insert(session);
            self.serving.accepted(rpc, session);
        }
    }

    fn on_session_end(&mut self, rpc: &mut Rpc<'_, P>, session: SessionId, end: SessionEnd<'_>) {
        let why = end.to_string();
        if self.served.remove(&session) {
            self.serving.closed(rpc, session);
            let _ = self.closed.send((session, why));
        } else {
            self.ends.record(session, why);
        }
    }
}

/// One-sided requests on a worker's client sessions, from another thread (one per thread:
/// [`OneSided::another`] makes the next); each call blocks until its completion.
pub struct OneSided {
    orders: Sender<Order>,
    waker: Arc<OnceLock<Waker>>,
    reply_tx: Sender<Answer>,
    reply_rx: Receiver<Answer>,
    seq: u64,
    ends: Ends,
}

impl OneSided {
    /// Another, for another thread.
    pub fn another(&self) -> OneSided {
        let (reply_tx, reply_rx) = mpsc::channel();
        OneSided {
            orders: self.orders.clone(),
            waker: self.waker.clone(),
            reply_tx,
            reply_rx,
            seq: 0,
            ends: self.ends.clone(),
        }
    }

    /// Has the worker's service submit `op` on `session` and waits for its completion; a
    /// failure says why the session ended, if it did.
    fn run(&mut self, session: SessionId, op: OneOp) -> Result<Outcome, OpError> {
        self.answer(session, op).map_err(|error| match self.ends.why(session) {
            Some(why) => OpError::Ended { session, error: Box::new(error), why },
            None => error,
        })
    }

    fn answer(&mut self, session: SessionId, op: OneOp) -> Result<Outcome, OpError> {
        self.seq += 1;
        let order = Order { session, op, seq: self.seq, reply: self.reply_tx.clone() };
        self.orders.send(order).map_err(|_| OpError::NoAnswer)?;
        if let Some(w) = self.waker.get() {
            w.wake();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.reply_rx.recv_timeout(left) {
                Ok((seq, out)) if seq == self.seq => return out,
                Ok(_) => continue, // the answer to an order that timed out
                Err(_) => return Err(OpError::NoAnswer),
            }
        }
    }

    /// Reads `len` bytes at `remote` over `session`'s connection.
    pub fn read(
        &mut self,
        session: SessionId,
        remote: RemoteAddr,
        len: usize,
    ) -> Result<Vec<u8>, OpError> {
        match self.run(session, OneOp::Read { remote, len })? {
            Outcome::Bytes(b) => Ok(b),
            Outcome::Old(_) => Err(OpError::Status(WcStatus::GeneralErr)),
        }
    }

    /// Adds `add` to the 64-bit word at `remote`; its old value.
    pub fn fetch_add(
        &mut self,
        session: SessionId,
        remote: RemoteAddr,
        add: u64,
    ) -> Result<u64, OpError> {
        match self.run(session, OneOp::FetchAdd { remote, add })? {
            Outcome::Old(v) => Ok(v),
            Outcome::Bytes(_) => Err(OpError::Status(WcStatus::GeneralErr)),
        }
    }
}

/// A running engine of an example, and the threads' ways into its worker.
pub struct Started<P: Provider> {
    pub engine: Engine<P>,
    /// RPC handles into the worker, one per application thread.
    pub handles: Vec<Handle>,
    /// One-sided requests into the worker ([`OneSided::another`] for more threads).
    pub one_sided: OneSided,
    /// The worker's endpoint's metrics, as last published.
    pub metrics: Arc<Mutex<RpcMetrics>>,
    /// Why the worker's client sessions ended.
    pub ends: Ends,
    /// Sessions the worker served that ended, and why.
    pub closed: Receiver<(SessionId, String)>,
}

impl<P: Provider> Started<P> {
    /// Waits for `n` sessions it served to close (`timeout` at most); a failure says why
    /// those that did ended.
    pub fn wait_closed(&self, n: u32, timeout: Duration) -> Result<(), Fail> {
        let deadline = Instant::now() + timeout;
        let mut ended = Vec::new();
        for i in 0..n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.closed.recv_timeout(left) {
                Ok((session, why)) => ended.push(format!("{session}: {why}")),
                Err(_) => {
                    let why = match ended.is_empty() {
                        true => String::new(),
                        false => format!(" ({})", ended.join("; ")),
                    };
                    return Err(Fail::Run(format!(
                        "{i} of {n} client sessions closed within {} s{why}",
                        timeout.as_secs()
                    )));
                }
            }
        }
        Ok(())
    }

    /// The endpoint's metrics once `ready` holds of them (or as they are after 5 s).
    pub fn metrics_when(&self, ready: impl Fn(&RpcMetrics) -> bool) -> RpcMetrics {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let m = self.metrics.lock().map(|m| m.clone()).unwrap_or_default();
            if ready(&m) || Instant::now() > deadline {
                return m;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Shuts the engine down.
    pub fn shutdown(self) -> Result<(), Fail> {
        drop(self.handles);
        self.engine.shutdown().map(|_| ()).map_err(|e| Fail::Run(format!("shutdown: {e}")))
    }
}

/// How an example makes its worker's endpoint (its types registered) and server part.
pub trait Make<P: Provider, H>:
    Fn(&WorkerResources) -> Result<(Endpoint<P>, H), RpcError> + Send + Sync + 'static
{
}
impl<P: Provider, H, F> Make<P, H> for F where
    F: Fn(&WorkerResources) -> Result<(Endpoint<P>, H), RpcError> + Send + Sync + 'static
{
}

/// Starts an engine on `cfg` (one worker) whose worker runs the endpoint and server part
/// `make` makes, with `handles` RPC handles into it. `make` runs once here first, so that its
/// errors are this thread's.
/// What makes a worker's endpoint and serving part with counters `C` shared with the main
/// thread.
pub type MakeWith<P, H, C> = fn(&WorkerResources, Arc<C>) -> Result<(Endpoint<P>, H), RpcError>;

/// A server's engine listening on `addr` (its map from `a`), its endpoint made by `make`
/// with the counters it shares with the main thread (a new `C`); says where it listens.
pub fn start_server<P: Provider, H: Serving<P>, C: Default + Send + Sync + 'static>(
    name: &str,
    a: &Common,
    addr: SocketAddr,
    make: MakeWith<P, H, C>,
) -> Result<(Started<P>, Arc<C>), Fail> {
    let cfg = map(a, Some(addr))?;
    let counts = Arc::new(C::default());
    let c = counts.clone();
    let s = start::<P, _>(name, &cfg, 0, move |res| make(res, c.clone()))?;
    let at = s.engine.listen_addr().map_or("?".into(), |a| a.to_string());
    println!("{name}: listening on {at} ({})", P::NAME);
    Ok((s, counts))
}

pub fn start<P: Provider, H: Serving<P>>(
    name: &str,
    cfg: &Validated,
    handles: usize,
    make: impl Make<P, H>,
) -> Result<Started<P>, Fail> {
    let res = cfg.map.worker.clone();
    drop(make(&res).map_err(|e| Fail::Run(format!("{name}: the endpoint: {e}")))?);
    let (hs, inboxes): (Vec<Handle>, Vec<Inbox>) =
        (0..handles).map(|_| corelink_rpc::handle(256)).unzip();
    let inboxes = Mutex::new(Some(inboxes));
    let (orders_tx, orders_rx) = mpsc::channel();
    let orders_rx = Mutex::new(Some(orders_rx));
    let waker = Arc::new(OnceLock::new());
    let metrics = Arc::new(Mutex::new(RpcMetrics::default()));
    let ends = Ends::default();
    let (closed_tx, closed_rx) = mpsc::channel();
    let (w, m, e) = (waker.clone(), metrics.clone(), ends.clone());
    let closed_tx = Mutex::new(closed_tx);
    let engine = Engine::<P>::start(cfg, Placement::RoundRobin, move |_| {
        // Checked above; the same again cannot fail (the resources are the same).
        let (endpoint, serving) = make(&res).expect("the endpoint was made once already");
        let orders =
            orders_rx.lock().ok().and_then(|mut o| o.take()).unwrap_or_else(|| mpsc::channel().1);
        let agent = Agent {
            serving,
            orders,
            waker: w.clone(),
            pending: HashMap::new(),
            token: 0,
            served: HashSet::new(),
            metrics: m.clone(),
            ends: e.clone(),
            closed: closed_tx.lock().map(|t| t.clone()).unwrap_or_else(|_| mpsc::channel().0),
        };
        let mut handler = RpcHandler::new(endpoint, agent);
        for inbox in inboxes.lock().ok().and_then(|mut i| i.take()).unwrap_or_default() {
            handler = handler.with_inbox(inbox);
        }
        handler
    })
    .map_err(|e| {
        Fail::Run(format!("{name}: starting the engine: {}", corelink_verbs::chain(&e)))
    })?;
    let (reply_tx, reply_rx) = mpsc::channel();
    let one_sided =
        OneSided { orders: orders_tx, waker, reply_tx, reply_rx, seq: 0, ends: ends.clone() };
    Ok(Started { engine, handles: hs, one_sided, metrics, ends, closed: closed_rx })
}

/// An RPC error as a run failure, with what was being done.
pub fn rpc_fail(what: &str) -> impl Fn(RpcError) -> Fail + '_ {
    move |e| Fail::Run(format!("{what}: {}", corelink_verbs::chain(&e)))
}

/// FNV-1a, 64 bits, of `data` (after `seed`, to chain pieces).
pub fn fnv1a64(seed: u64, data: &[u8]) -> u64 {
    data.iter().fold(seed, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// FNV-1a's starting value.
pub const FNV_SEED: u64 = 0xcbf2_9ce4_8422_2325;
