//! The control core: one pinned thread that owns connection management. It listens and
//! accepts, runs connects (a step per connection-manager event, driven by its loop, so that
//! one slow peer stalls nothing), gives each connection QPs from the
//! chosen worker's pool ([`pool`]: pre-created on the worker's PD and CQ, reset and reused
//! after release, at most `worker.qps.max` per worker), has the worker post the connection's
//! receives on them before any exchange ([`lanes`]), exchanges the engine's header (lanes, receive
//! size) in private data ([`header`]), hands finished connections to workers over SPSC
//! rings, watches connection events, disconnects and recycles what workers release, and runs
//! the shutdown.
//!
//! One engine connection is `worker.qps.per_conn` rdma_cm connections (lanes) between the same
//! two workers: the connecting side opens them all, and the accepting side groups them by the
//! nonce in their header and hands them over once all are up ([`lanes`]). Releases,
//! disconnects and peer closes stay per lane (by cm key); a worker's connection count counts
//! engine connections.

mod budget;
pub(crate) mod header;
mod lanes;
mod pool;

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use corelink_verbs::{CmEvent, CmWaiter as _, Connection, Listener as _, Provider, QpAttr, Watch};

use crate::client::{ConnectOrder, Event, Waiter};
use crate::handoff::{NewLane, Origin, ToControl, ToWorker};
use crate::metrics::{ControlMetrics, WorkerCounts};
use crate::request::ConnInfo;
use crate::ring::{Consumer, Producer};
use crate::tunables::MAX_QPS_PER_CONN;

pub(crate) use budget::Budget;
use budget::Reservation;
pub use header::{HEADER, MAX_APP_PRIVATE_DATA};
pub(crate) use pool::QpPool;

/// How long the control loop sleeps at most when nothing happens (it wakes at once for an
/// event of its connection manager, or a word from a worker or the application): the pace of
/// its deadlines (accepts that wait too long) and of its idle work (refilling QP pools).
const LISTEN_SLICE: Duration = Duration::from_millis(1);
/// Idle iterations after which the control loop's slice doubles, up to
/// `LISTEN_SLICE << MAX_SLICE_SHIFT` (8 ms): an idle control core wakes about 125 times a
/// second instead of 1000; any activity brings it back to 1 ms.
const SLOWER_AFTER: u32 = 16;
const MAX_SLICE_SHIFT: u32 = 3;
/// How long the control loop sleeps at most when it has nothing in progress (no connect or
/// accept coming up, no QP pool to refill, no shutdown): everything it then waits for wakes
/// it (its connection manager's events, workers' and the application's words), so the slice
/// only paces its look at its device's asynchronous events. Each wake takes a worker's CPU
/// where they share one (the Soft-RoCE guest: a context switch, its clock reads).
const QUIET_SLICE: Duration = Duration::from_millis(100);
/// Connection requests the control loop takes in one pass at most: a burst's requests are
/// taken together (each pass costs a wait and a look at every object in progress), while the
/// pass's other work (confirmations, workers' words) still comes between bursts.
const ACCEPTS_PER_PASS: usize = 32;
/// QPs an idle pass of the control loop makes ready at most, per worker (each a reset and a
/// move to INIT, or a create and a move, about 160 us in the emulated guest): enough that the
/// QPs a burst of connections released are ready again before the next burst, which then
/// makes none ready on its own path; few enough that a connection arriving meanwhile waits
/// a millisecond or so at worst.
const REFILLS_PER_PASS: usize = 8;
/// How often a pass looks at every object, not only those the wait saw an event for: the pace
/// at which deadlines of objects that hear nothing (a connect's `connect_timeout_ms`) are
/// checked. Each look costs a lookup and a clock read, so that a hundred connects in progress
/// looked at on every pass cost more than their own system calls.
const FULL_PASS: Duration = Duration::from_millis(10);

/// An application's placement rule: from the connector's private data (its part) and each
/// worker's connection count, the worker to use.
pub type PlaceFn = Box<dyn Fn(&[u8], &[usize]) -> usize + Send>;

/// Which worker gets an accepted connection (all its lanes: placement is decided when its
/// first lane arrives).
pub enum Placement {
    /// Each in turn.
    RoundRobin,
    /// The one with the fewest connections.
    LeastLoaded,
    /// The application decides, from the connector's private data (its part) and each
    /// worker's connection count.
    Custom(PlaceFn),
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Placement::RoundRobin => "RoundRobin",
            Placement::LeastLoaded => "LeastLoaded",
            Placement::Custom(_) => "Custom",
        })
    }
}

/// What the application asks of the control core.
pub(crate) enum Command<P: Provider> {
    Shutdown,
    ToWorker(usize, ToWorker<P>),
}

/// One worker, as the control core sees it.
pub(crate) struct WorkerLink<P: Provider> {
    pub(crate) to: Producer<ToWorker<P>>,
    pub(crate) from: Consumer<ToControl<P>>,
    pub(crate) thread: std::thread::Thread,
    /// Its QPs: the pool, and the account of those in use.
    pub(crate) qps: QpPool<P>,
    /// What its connections hold of its limits (accepted ones waiting for lanes included).
    pub(crate) budget: Budget,
    /// Lanes handed to it since start.
    pub(crate) lanes: u64,
    pub(crate) stopped: bool,
    /// Something was put on its ring this pass: it is woken once the pass's work is done.
    pub(crate) wake: bool,
    /// It has no context of its own (it shares the control core's): the control core reads
    /// its QPs' and CQ's device events and hands them over.
    pub(crate) shares_context: bool,
}

/// How the control core sets connections up.
pub(crate) struct ControlCfg {
    pub(crate) placement: Placement,
    /// QP attributes for the connection manager's transitions (and the reset).
    pub(crate) attr: QpAttr,
    /// Lanes of a connection this side opens (`worker.qps.per_conn`).
    pub(crate) per_conn: usize,
    /// The workers' receive size, told to peers in the header (`worker.recv_size`).
    pub(crate) recv_size: u32,
    /// Whether requests without the engine's header are accepted (`accept_foreign`).
    pub(crate) accept_foreign: bool,
    /// How long a connect may take (`connect_timeout_ms`).
    pub(crate) connect_timeout: Duration,
}

impl ControlCfg {
    /// How long an accepted connection waits for the rest of its lanes: twice what its
    /// connector gives each lane.
    pub(crate) fn group_timeout(&self) -> Duration {
        self.connect_timeout * 2
    }
}

/// A lane handed to a worker, by cm key.
struct Lane<P: Provider> {
    cm: P::Connection,
    worker: usize,
    /// The engine connection it belongs to.
    conn: u64,
}

/// The control core's state.
pub(crate) struct Control<P: Provider> {
    ctx: Arc<P::Context>,
    listener: Option<P::Listener>,
    /// Where the loop sleeps between passes: until one of its objects has an event.
    waiter: P::CmWaiter,
    /// What it watches (rebuilt for each wait, kept to reuse its allocation).
    watches: Vec<Watch>,
    /// This pass looks only at the objects the last wait saw ready (else at every one: at
    /// least once in [`FULL_PASS`], for the deadlines of those that hear nothing).
    targeted: bool,
    /// When a pass last looked at every object.
    last_full: Instant,
    workers: Vec<WorkerLink<P>>,
    commands: mpsc::Receiver<Command<P>>,
    /// Clients' connects (each client sends its own, after its `AddClient` command).
    connects: mpsc::Receiver<ConnectOrder>,
    cfg: ControlCfg,
    next_worker: usize,
    /// Lanes on workers, by cm key.
    lanes: HashMap<u64, Lane<P>>,
    /// Engine connections on workers: lanes not yet released, and what they hold.
    conns: HashMap<u64, (usize, Reservation)>,
    next_key: u64,
    next_conn: u64,
    outgoing: lanes::Outgoing<P>,
    incoming: lanes::Incoming<P>,
    published: Arc<Mutex<ControlMetrics>>,
    last_published: ControlMetrics,
    /// The counters of this pass, before they are compared with the last published.
    gathered: ControlMetrics,
    shutting_down: bool,
    /// Clients told of new connections in this pass, woken once its work is done.
    told: Vec<Arc<Waiter>>,
    /// Iterations in a row with nothing to do (see [`SLOWER_AFTER`]).
    idle: u32,
    /// Requests without the engine's header rejected (`accept_foreign` off).
    foreign_refused: u64,
    /// Waits for connection-manager events that failed.
    wait_errors: u64,
    /// Asynchronous events of the control core's own context read.
    async_events: u64,
}

impl<P: Provider> Control<P> {
    pub(crate) fn new(
        ctx: Arc<P::Context>,
        listener: Option<P::Listener>,
        waiter: P::CmWaiter,
        workers: Vec<WorkerLink<P>>,
        (commands, connects): (mpsc::Receiver<Command<P>>, mpsc::Receiver<ConnectOrder>),
        cfg: ControlCfg,
        published: Arc<Mutex<ControlMetrics>>,
    ) -> Self {
        let cfg = ControlCfg { per_conn: cfg.per_conn.clamp(1, MAX_QPS_PER_CONN), ..cfg };
        let mut c = Control {
            ctx,
            listener,
            waiter,
            watches: Vec::new(),
            targeted: false,
            last_full: Instant::now(),
            workers,
            commands,
            connects,
            cfg,
            next_worker: 0,
            lanes: HashMap::new(),
            conns: HashMap::new(),
            next_key: 1,
            next_conn: 1,
            outgoing: lanes::Outgoing::new(),
            incoming: lanes::Incoming::new(),
            published,
            last_published: ControlMetrics::default(),
            gathered: ControlMetrics::default(),
            shutting_down: false,
            told: Vec::new(),
            idle: 0,
            foreign_refused: 0,
            wait_errors: 0,
            async_events: 0,
        };
        c.publish();
        c
    }

    /// Runs until every worker has stopped after a shutdown.
    pub(crate) fn run(mut self) {
        loop {
            let mut busy = self.commands();
            busy |= (0..ACCEPTS_PER_PASS).take_while(|_| self.accept_one()).count() > 0;
            busy |= self.incoming.confirming() > 0 && self.finish_accepts();
            busy |= self.worker_messages();
            busy |= self.finish_connects();
            self.advance_priming();
            self.idle = if busy { 0 } else { self.idle.saturating_add(1) };
            self.watch_events();
            self.expire_incoming();
            // Before anything slow (a refill creates QPs): what the pass gave goes now.
            self.wake_given();
            let mut quiet = !busy
                && !self.shutting_down
                && self.outgoing.is_empty()
                && self.incoming.is_empty();
            if quiet {
                // Off the critical path: nothing else to do in this iteration, and no connection
                // coming up (whose next event would wait while the loop creates or resets a QP;
                // a connect that finds the pool empty creates its own).
                for w in &mut self.workers {
                    quiet &= (0..REFILLS_PER_PASS).take_while(|_| w.qps.refill_one()).count() == 0;
                }
            }
            self.publish();
            if self.shutting_down
                && self.outgoing.connecting() == 0
                && self.workers.iter().all(|w| w.stopped)
            {
                break;
            }
            // After a busy pass, just a look (which tells the next pass what is ready).
            self.wait(if busy {
                Duration::ZERO
            } else if quiet {
                QUIET_SLICE
            } else {
                self.slice()
            });
            if !self.targeted {
                // (a system call on ibverbs: with each full pass)
                self.device_events();
            }
        }
        self.drop_incoming();
        // Connection-manager sides first, then the QPs (in the pools, dropped with `self`).
        self.lanes.clear();
        self.publish();
    }

    /// How long the loop waits for something to happen this iteration.
    pub(super) fn slice(&self) -> Duration {
        LISTEN_SLICE * (1 << (self.idle / SLOWER_AFTER).min(MAX_SLICE_SHIFT))
    }

    /// Sleeps until one of the control core's connection-manager objects (its listener, its
    /// connects and accepts in progress, its connections' lanes) may have an event, a worker
    /// or the application wakes it, or the slice passes.
    fn wait(&mut self, timeout: Duration) {
        let full = self.slice().max(FULL_PASS);
        let mut watches = std::mem::take(&mut self.watches);
        watches.clear();
        watches.extend(self.listener.as_ref().map(|l| l.watch()));
        self.outgoing.watch(&mut watches);
        self.incoming.watch(&mut watches);
        watches.extend(self.lanes.values().map(|l| l.cm.watch()));
        let ok = self.waiter.wait(&watches, timeout).is_ok();
        if !ok {
            // Counted; a slice's sleep instead, so that the loop does not spin.
            self.wait_errors += 1;
            std::thread::sleep(timeout);
        }
        self.watches = watches;
        let now = Instant::now();
        self.targeted = ok && now.duration_since(self.last_full) < full;
        if !self.targeted {
            self.last_full = now;
        }
    }

    /// Reads the control core's own context's asynchronous events (a few a look): each is
    /// counted, a device's or port's failure said on stderr, and handed to every worker that
    /// shares this context (its QPs and CQ are on it), which acts on those that name its own.
    /// (A worker with a context of its own reads that context's.)
    fn device_events(&mut self) {
        use corelink_verbs::{AsyncEventKind as K, Context as _};
        for _ in 0..16 {
            let ev = match self.ctx.poll_async_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => return,
                Err(_) => {
                    self.wait_errors += 1;
                    return;
                }
            };
            self.async_events += 1;
            if matches!(ev.kind, K::DeviceFatal | K::PortErr) {
                eprintln!(
                    "corelink: the control core's device reported {:?} on {:?}",
                    ev.kind, ev.element
                );
            }
            for w in 0..self.workers.len() {
                if self.workers[w].shares_context {
                    self.send(w, ToWorker::DeviceEvent(ev));
                }
            }
        }
    }

    /// Whether this pass looks at the object `w` watches.
    pub(super) fn look(&self, w: Watch) -> bool {
        !self.targeted || self.waiter.ready(w)
    }

    /// Publishes the counters if they changed (once a pass: gathered into a reused record,
    /// so that a pass allocates nothing and takes the lock only for a change).
    fn publish(&mut self) {
        let mut now = std::mem::take(&mut self.gathered);
        now.workers.clear();
        now.workers.extend(self.workers.iter().map(|w| WorkerCounts {
            connections: w.budget.conns() as u64,
            conns_refused: w.budget.refused(),
            lanes: w.lanes,
            ..w.qps.counts()
        }));
        now.foreign_refused = self.foreign_refused;
        now.accepts_waiting = self.incoming.confirming() as u64;
        now.wait_errors = self.wait_errors;
        now.async_events = self.async_events;
        if now != self.last_published {
            if let Ok(mut m) = self.published.lock() {
                m.clone_from(&now);
            }
            std::mem::swap(&mut self.last_published, &mut now);
        }
        self.gathered = now;
    }

    fn send(&mut self, w: usize, m: ToWorker<P>) {
        let link = &mut self.workers[w];
        if link.stopped {
            return; // (it has exited: nobody would read it, and a full ring would never drain)
        }
        let mut m = m;
        // The ring is sized for bursts; a full one means the worker is behind: wait for it.
        loop {
            match link.to.push(m) {
                Ok(()) => break,
                Err(_) if link.to.is_abandoned() => {
                    // The worker is gone without its `Stopped` (it panicked): nobody will read.
                    link.stopped = true;
                    return;
                }
                Err(back) => {
                    m = back;
                    link.thread.unpark();
                    std::thread::yield_now();
                }
            }
        }
        // (woken once the pass's work is done, after the clients told of connections in it:
        // a wake of a parked worker costs the control core tens of microseconds in the guest)
        link.wake = true;
    }

    /// Once a pass has done its work: wakes the clients told of connections in it, then the
    /// workers given something (each once).
    fn wake_given(&mut self) {
        for client in self.told.drain(..) {
            client.wake();
        }
        for link in self.workers.iter_mut().filter(|l| l.wake) {
            link.wake = false;
            link.thread.unpark();
        }
    }

    fn commands(&mut self) -> bool {
        let mut any = false;
        while let Ok(c) = self.commands.try_recv() {
            any = true;
            match c {
                Command::Shutdown => {
                    if !self.shutting_down {
                        self.shutting_down = true;
                        self.listener = None; // stop accepting
                        self.drop_incoming();
                        for w in 0..self.workers.len() {
                            self.send(w, ToWorker::Shutdown);
                        }
                    }
                }
                Command::ToWorker(w, m) => self.send(w, m),
            }
        }
        // After the commands: a client's `AddClient` reaches its worker before its connection.
        while let Ok(o) = self.connects.try_recv() {
            any = true;
            let origin = Origin::Client(o.client);
            self.start_connect(o.worker, o.addr, &o.private_data, o.token, origin, Some(o.waiter));
        }
        any
    }

    fn choose_worker(&mut self, app: &[u8]) -> usize {
        let n = self.workers.len();
        let w = match &self.cfg.placement {
            Placement::RoundRobin => {
                self.next_worker = (self.next_worker + 1) % n;
                self.next_worker
            }
            Placement::LeastLoaded => {
                (0..n).min_by_key(|&i| self.workers[i].budget.conns()).unwrap_or(0)
            }
            Placement::Custom(f) => {
                let loads: Vec<usize> = self.workers.iter().map(|w| w.budget.conns()).collect();
                f(app, &loads)
            }
        };
        w.min(n - 1)
    }

    /// Gives a connection's lanes (in lane order, all up) to worker `w`, with what it
    /// reserved of the worker's budget (given back when its last lane is released). An
    /// external client's connect (`tell`) is told to the client here, before the worker has
    /// it: the client need not wait for the worker to wake and take it.
    #[allow(clippy::too_many_arguments)]
    fn hand_off(
        &mut self,
        w: usize,
        conn: crate::request::ConnId,
        up: Vec<(P::Qp, P::Connection)>,
        info: ConnInfo,
        origin: Origin,
        reservation: Reservation,
        tell: Option<Arc<Waiter>>,
    ) {
        let id = self.next_conn;
        self.next_conn += 1;
        let mut lanes = ArrayVec::<NewLane<P>, MAX_QPS_PER_CONN>::new();
        for (qp, cm) in up {
            if lanes.is_full() {
                // Never more lanes than a connection may have (headers are checked).
                lanes::retire(cm);
                self.workers[w].qps.destroy(qp);
                continue;
            }
            let key = self.next_key;
            self.next_key += 1;
            self.lanes.insert(key, Lane { cm, worker: w, conn: id });
            lanes.push(NewLane { qp, cm_key: key });
        }
        self.conns.insert(id, (lanes.len(), reservation));
        self.workers[w].lanes += lanes.len() as u64;
        // Its lanes, and the receives the worker posted on each when it primed them.
        let n = lanes.len() as u32;
        let info =
            ConnInfo { lanes: n, recvs_per_lane: self.workers[w].budget.recvs_per_lane(n), ..info };
        // (not to a worker that stops: its clients hear of nothing new)
        let tell = tell.filter(|_| !self.shutting_down && !self.workers[w].stopped);
        let told = tell.is_some();
        if let Some(waiter) = tell {
            waiter.tell(Event::Connected { conn, info: info.clone() });
            // (woken once the pass's work is done, however many it was told, before the worker)
            if !self.told.iter().any(|t| Arc::ptr_eq(t, &waiter)) {
                self.told.push(waiter);
            }
        }
        self.send(w, ToWorker::NewConn { conn, lanes, info, origin, told });
    }

    fn worker_messages(&mut self) -> bool {
        let mut any = false;
        for w in 0..self.workers.len() {
            while let Some(m) = self.workers[w].from.pop() {
                any = true;
                match m {
                    ToControl::Connect { addr, private_data, token, origin } => {
                        self.start_connect(w, addr, &private_data, token, origin, None)
                    }
                    ToControl::Disconnect { cm_key } => {
                        if let Some(l) = self.lanes.get_mut(&cm_key) {
                            let _ = l.cm.disconnect();
                        }
                    }
                    ToControl::Release { cm_key, qp } => self.release(w, cm_key, qp),
                    ToControl::Primed { prime, conn, qps } => self.primed(w, prime, conn, qps),
                    ToControl::Return { qps } => {
                        for qp in qps {
                            self.workers[w].qps.give_back(qp);
                        }
                    }
                    ToControl::Stopped => self.workers[w].stopped = true,
                }
            }
            // A worker that panicked dropped its ring ends without saying `Stopped`: it has
            // stopped all the same (`Engine::shutdown` reports the panic when it joins it).
            let link = &mut self.workers[w];
            if !link.stopped && link.from.is_abandoned() {
                link.stopped = true;
                any = true;
            }
        }
        any
    }

    /// A worker is done with a lane: drop its connection-manager side, then reset its QP for
    /// reuse (or destroy it); the connection ends with its last lane.
    fn release(&mut self, w: usize, cm_key: u64, qp: P::Qp) {
        let mut owner = w;
        if let Some(lane) = self.lanes.remove(&cm_key) {
            owner = lane.worker;
            drop(lane.cm);
            if let Some((left, _)) = self.conns.get_mut(&lane.conn) {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    if let Some((_, r)) = self.conns.remove(&lane.conn) {
                        self.workers[lane.worker].budget.release(r);
                    }
                }
            }
        }
        self.workers[owner].qps.give_back(qp);
    }

    fn watch_events(&mut self) {
        let mut closed = Vec::new();
        let (waiter, targeted) = (&self.waiter, self.targeted);
        for (key, l) in self.lanes.iter_mut() {
            if targeted && !waiter.ready(l.cm.watch()) {
                continue;
            }
            if let Ok(Some(CmEvent::Disconnected | CmEvent::DeviceRemoval)) =
                l.cm.poll_event(Duration::ZERO)
            {
                closed.push((*key, l.worker));
            }
        }
        for (key, w) in closed {
            self.send(w, ToWorker::PeerClosed { cm_key: key });
        }
        self.watch_incoming();
    }
}
