//! The worker's loop: [`Worker`], built by `Worker::new` on its own core, runs the parts in
//! a fixed order (see `worker/mod.rs`); `retire.rs` is its completion stage.

mod retire;

use std::sync::{Arc, Mutex};

use arrayvec::ArrayVec;
use corelink_verbs::{Cq, Provider, Wc, WcOpcode, WcStatus};

use super::cfg::WorkerCfg;
use super::clients::Clients;
use super::completions;
use super::conn::{Conn, Lane, Phase};
use super::conns::Conns;
use super::cx::Cx;
use super::handler::Handler;
use super::ids::{RecvId, WrId};
use super::notice::Notice;
use super::outbox::Outbox;
use super::primes::{Early, Primes};
use super::recvs::Recvs;
use super::redial::DialKey;
use super::redial::Redial;
use super::requests::Requests;
use super::timers::{Due, Timers};
use super::{cx, keepalive, queues, redial, sched, untrusted};
use crate::client::Event;
use crate::error::EngineError;
use crate::handoff::{NewLane, Origin, PrimeFor, Qps, ToControl, ToWorker};
use crate::metrics::{thread_context_switches, Metrics};
use crate::pool::Pool;
use crate::request::{CloseReason, ConnId, ConnInfo, Message};
use crate::ring::{Consumer, Producer};
use crate::tunables::{
    CLIENT_BATCH, KEEPALIVE_EVERY, MAX_POLL_BATCH, MAX_QPS_PER_CONN, METRICS_EVERY,
    PARK_LOOK_AFTER, PARK_SLICE, SLOW_LOOK_EVERY,
};

/// A worker: its state and its handler.
pub(crate) struct Worker<P: Provider, H: Handler<P>> {
    pub(crate) cx: Cx<P>,
    pub(crate) handler: H,
    pub(crate) from_control: Consumer<ToWorker<P>>,
    pub(crate) clients: Clients,
    pub(crate) published: Arc<Mutex<Metrics>>,
    pub(crate) switches_base: (u64, u64),
    /// When the looks that are system calls on `ibverbs` are next due (the coarse clock).
    next_slow_look: std::time::Duration,
    /// Iterations in a row that found nothing to do.
    pub(crate) empty_run: u32,
    /// Where each poll puts its completions.
    pub(crate) wcs: [Wc; MAX_POLL_BATCH],
    /// Since when a worker without connections has found nothing to do (read only then).
    pub(crate) idle_since: Option<std::time::Instant>,
    /// `ToControl::Stopped` is queued: the loop runs on until the control core has it (and
    /// every release before it), however full the ring was.
    pub(crate) stopped_sent: bool,
    pub(crate) stopped: bool,
    /// The request queues' misses already counted in the metrics.
    pub(crate) queue_misses: u64,
    /// Probes of idle connections (`worker.keepalive_ms`; `None`: off).
    pub(crate) keepalive: Option<keepalive::Keepalive>,
    /// Connections coming up: their slots kept, their receives posted.
    primes: Primes<P>,
    /// Where the device's asynchronous events come from (see [`Owned::own_context`]).
    events: Option<Arc<P::Context>>,
    /// Whether completions were lost (a CQ overrun, a failed device), and since when.
    untrusted: untrusted::Untrusted,
    /// A lane's plain successes, gathered as a send-queue completion retires them and told
    /// together ([`Handler::on_completions`]).
    gathered: completions::Gathered<P>,
}

/// What a worker is given to own: its CQ and PD (made by the engine, shared with the control
/// core's QP pool) and its ends of the rings to and from the control core.
pub(crate) struct Owned<P: Provider> {
    pub(crate) cq: Arc<P::Cq>,
    pub(crate) pd: Arc<P::Pd>,
    /// The worker's own device context, which its CQ and PD are on and whose asynchronous
    /// events are its to read (`None`: it shares the control core's).
    pub(crate) own_context: Option<Arc<P::Context>>,
    pub(crate) to_control: Producer<ToControl<P>>,
    pub(crate) from_control: Consumer<ToWorker<P>>,
    /// Ends the control core's wait when a message for it is on the ring.
    pub(crate) wake: corelink_verbs::Waker,
}

impl<P: Provider, H: Handler<P>> Worker<P, H> {
    /// Worker `index` with the core map's resources `res`: registers its buffer pools and
    /// receive buffers and sizes every table (call it on the worker's own thread: first touch).
    pub(crate) fn new(
        index: usize,
        res: &corelink_config::WorkerResources,
        cfg: WorkerCfg,
        owned: Owned<P>,
        published: Arc<Mutex<Metrics>>,
        pinned: bool,
        handler: H,
    ) -> crate::Result<Self> {
        use crate::tunables::{
            CONTROL_RING, MAX_CLIENTS_PER_WORKER, MAX_REQUESTS_PER_WORKER, MAX_TIMERS, MERGE_TABLE,
        };
        let classes: Vec<(usize, usize)> = res.pools.iter().map(|p| (p.size, p.count)).collect();
        let recvs = crate::control::Budget::recv_buffers(res) as usize;
        let recv_class = [(res.recv_size as usize, recvs)];
        let Owned { cq, pd, own_context, to_control, from_control, wake } = owned;
        let (own, events) = (own_context.is_some(), own_context);
        let (pool, recv_pool) = (Pool::new(&*pd, &classes)?, Pool::new(&*pd, &recv_class)?);
        let keepalive = cfg.keepalive.map(|k| keepalive::Keepalive::new(k, res.max_conns as usize));
        let cx = Cx {
            index,
            now: std::cell::Cell::new(None),
            cfg,
            cq,
            pool,
            recv_pool,
            conns: Conns::new(index as u16, res.max_conns as usize),
            reqs: Requests::new(&*pd, MAX_REQUESTS_PER_WORKER, MERGE_TABLE)?,
            outbox: Outbox::new(to_control, 4096, CONTROL_RING).waking(wake),
            reposts: ArrayVec::new(),
            repost_first: false,
            gather: sched::GatherSpace::new(),
            timers: Timers::new(MAX_TIMERS),
            redials: redial::Redials::default(),
            pd,
            metrics: Metrics { worker: index, pinned, own_context: own, ..Metrics::default() },
            stopping: false,
            shutdown_deadline: None,
            thread: std::thread::current(),
        };
        Ok(Worker {
            cx,
            handler,
            from_control,
            clients: Clients::new(MAX_CLIENTS_PER_WORKER),
            published,
            switches_base: (0, 0),
            next_slow_look: std::time::Duration::ZERO,
            idle_since: None,
            empty_run: 0,
            wcs: [Wc::default(); MAX_POLL_BATCH],
            stopped_sent: false,
            queue_misses: 0,
            stopped: false,
            keepalive,
            primes: Primes::new(),
            events,
            untrusted: untrusted::Untrusted::default(),
            gathered: completions::Gathered::new(),
        })
    }

    /// Runs the loop until the engine shuts down.
    pub(crate) fn run(mut self) {
        self.handler.on_start(&mut self.cx);
        self.switches_base = thread_context_switches();
        while !self.stopped {
            let busy = self.run_once();
            if busy {
                self.idle_since = None;
                self.empty_run = 0;
            } else if self.cx.conns.connections() > 0 {
                // A worker with connections busy-polls (reading no clock for this); where the
                // core map says so, it lets others have the core while nothing comes, or parks
                // once idle long enough. (One with connections coming up only does not: their
                // messages wait in the CQ until the control core hands them over, and it
                // needs the CPU meanwhile.)
                self.empty_run = self.empty_run.saturating_add(1);
                if let Some(after) = self.cx.cfg.park_after {
                    // (the clock is read only after a run of empty polls)
                    if self.empty_run >= PARK_LOOK_AFTER && self.idle_for(after) {
                        self.park();
                    }
                } else {
                    self.idle_since = None;
                    if self.cx.cfg.yield_after > 0 && self.empty_run >= self.cx.cfg.yield_after {
                        std::thread::yield_now();
                    }
                }
            } else if let Some(idle) = self.cx.cfg.idle_after {
                // (as above, the clock is read only after a run of empty polls)
                self.empty_run = self.empty_run.saturating_add(1);
                if self.empty_run >= PARK_LOOK_AFTER && self.idle_for(idle) {
                    std::thread::park_timeout(PARK_SLICE);
                }
            }
        }
        self.publish_with_switches();
    }

    /// Whether the worker has found nothing to do for longer than `idle` (since the first
    /// empty iteration this asked about).
    fn idle_for(&mut self, idle: std::time::Duration) -> bool {
        let now = self.cx.now();
        let since = *self.idle_since.get_or_insert(now);
        now.duration_since(since) > idle
    }

    /// A worker with connections parks for a slice (`worker.park_after_us`); what came
    /// meanwhile is polled next. The periodic work (keepalive, lost completions) runs and the
    /// metrics are published at each wake: they would otherwise wait for `KEEPALIVE_EVERY`
    /// and `METRICS_EVERY` iterations of a slice each.
    #[cold]
    fn park(&mut self) {
        std::thread::park_timeout(PARK_SLICE);
        self.cx.metrics.parks += 1;
        self.cx.now.set(None);
        self.periodic();
        // (a parked worker's switches are its point: counted at each wake)
        self.publish_with_switches();
    }

    /// One iteration of the loop; returns whether anything happened.
    pub(crate) fn run_once(&mut self) -> bool {
        self.cx.now.set(None);
        let budget = self.cx.cfg.poll_budget;
        // The completion array lives in the worker (zeroing one per iteration costs more than
        // an idle iteration's work).
        let n = match self.cx.cq.poll(&mut self.wcs[..budget]) {
            Ok(n) => n,
            Err(_) => {
                self.cx.metrics.poll_errors += 1;
                0
            }
        };
        self.cx.metrics.polls += 1;
        if n == 0 {
            self.cx.metrics.empty_polls += 1;
            self.after_poll(0)
        } else {
            self.after_completions(n)
        }
    }

    /// The rest of an iteration whose poll found completions (not inlined, so that a profiler
    /// can count the instructions of busy iterations alone: `valgrind --tool=callgrind
    /// --toggle-collect='*after_completions*'`).
    #[inline(never)]
    fn after_completions(&mut self, n: usize) -> bool {
        self.after_poll(n)
    }

    /// The rest of an iteration: dispatch the `n` completions polled, then everything else in
    /// the loop's order.
    #[inline(always)]
    fn after_poll(&mut self, n: usize) -> bool {
        for i in 0..n {
            let wc = self.wcs[i];
            self.dispatch(&wc);
        }
        self.handler.poll(&mut self.cx);
        // The steps after the handler have nothing to do in most iterations: one test skips
        // them all.
        if !self.more_to_do() {
            return n > 0;
        }
        self.rest_of_iteration(n)
    }

    /// Whether any step of [`Worker::rest_of_iteration`] has work: each part's "has work"
    /// or-ed without a branch each ([`corelink_verbs::one_test`]). Every step's condition is here: a
    /// step added there adds its condition here, or it never runs while the others idle.
    #[inline(always)]
    fn more_to_do(&self) -> bool {
        let cx = &self.cx;
        corelink_verbs::one_test(
            !self.clients.is_empty()
                | cx.repost_first
                | cx.conns.any_dirty()
                | cx.stopping
                | !cx.reposts.is_empty()
                | cx.outbox.has_notices()
                | self.from_control.ready()
                | !cx.timers.is_empty()
                | cx.outbox.control_waiting()
                | self.clients.backlogged()
                | (cx.metrics.polls % KEEPALIVE_EVERY == 0)
                | self.stopped_sent,
        )
    }

    /// The steps of an iteration after the handler's poll, in the loop's order (each skipped
    /// by one check when it has nothing to do, which [`Worker::more_to_do`] also reads);
    /// returns whether anything happened.
    #[inline(never)]
    fn rest_of_iteration(&mut self, n: usize) -> bool {
        let took = !self.clients.is_empty() && self.take_client_requests();
        if std::mem::take(&mut self.cx.repost_first) {
            self.cx.repost_all();
        }
        let posted = (self.cx.conns.any_dirty() || self.cx.stopping) && self.cx.flush();
        self.cx.repost_all();
        if self.cx.outbox.has_notices() {
            self.deliver_notices();
        }
        // Words from the control core (a connection primed, handed over, closed by its peer)
        // are work, but not a sign that completions follow: they do not count as busy, so
        // that they keep no worker that may park (`worker.park_after_us`) polling, on the
        // CPU the control cores need while connections come up.
        if self.from_control.ready() {
            self.drain_control();
        }
        if self.cx.conns.any_dirty() {
            self.finish_closing();
        }
        if self.cx.outbox.has_notices() {
            self.deliver_notices();
        }
        if !self.cx.timers.is_empty() {
            self.fire_timers();
        }
        if self.cx.outbox.control_waiting() {
            self.cx.outbox.flush_control();
        }
        if self.clients.backlogged() {
            self.clients.flush();
        }
        if self.cx.metrics.polls % KEEPALIVE_EVERY == 0 {
            self.periodic();
        }
        // Stops once every client's queued submissions were taken (and refused): none is lost.
        if self.cx.stopping
            && self.cx.conns.live() == 0
            && !self.stopped_sent
            && self.clients.queued() == 0
        {
            self.cx.tell_control(ToControl::Stopped);
            self.stopped_sent = true;
        }
        if self.stopped_sent {
            // Everything queued for the control core (releases, then `Stopped`) must reach it:
            // stop only once the backlog is empty.
            self.stopped = self.cx.outbox.flush_control();
            if !self.stopped {
                std::thread::yield_now();
            }
        }
        n > 0 || took || posted
    }

    /// Every `KEEPALIVE_EVERY` iterations (out of line: most iterations skip it with one test):
    /// the keepalive, and every `METRICS_EVERY` the metrics' publication, on the worker's
    /// coarse clock (a vDSO read, never the clocksource).
    #[inline(never)]
    fn periodic(&mut self) {
        let now = super::coarse::now();
        if self.keepalive.is_some() {
            self.keepalive_pass(now);
        }
        if self.untrusted.waiting() && self.untrusted.due(self.cx.now()) {
            self.make_up();
        }
        if self.cx.metrics.polls % METRICS_EVERY == 0 {
            if now >= self.next_slow_look {
                self.slow_looks(now);
            }
            self.publish();
            if self.from_control.is_abandoned() {
                // The engine is gone without a shutdown (it failed to start): stop too.
                self.cx.begin_shutdown();
                self.end_redials();
            }
        }
    }

    /// Reads the device's asynchronous events (a few a pass), each handled by
    /// [`Worker::device_event`].
    fn device_events(&mut self) {
        use corelink_verbs::Context as _;
        let Some(ctx) = self.events.clone() else { return };
        for _ in 0..16 {
            match ctx.poll_async_event() {
                Ok(Some(ev)) => self.device_event(ev),
                Ok(None) => return,
                Err(_) => {
                    self.cx.metrics.poll_errors += 1;
                    return;
                }
            }
        }
    }

    /// A device event (read on this worker's context, or handed over by the control core,
    /// whose context this worker shares): counted; a fatal error of one of this worker's QPs
    /// closes its connection, an overrun of its CQ or a failed device every connection (their
    /// completions cannot be trusted), each with `CloseReason::Device`, and is said on stderr.
    /// Events naming another worker's QP or CQ are only counted.
    fn device_event(&mut self, ev: corelink_verbs::AsyncEvent) {
        use corelink_verbs::{AsyncElement, AsyncEventKind as K, Cq as _, Qp as _};
        self.cx.metrics.async_events += 1;
        let reason = CloseReason::Device(ev.kind);
        // An overrun of this worker's CQ, or a failed device: every connection's completions
        // are in doubt (those coming up included).
        let wide = match (ev.kind, ev.element) {
            (K::CqErr, AsyncElement::Cq(h)) => h == self.cx.cq.handle(),
            (K::CqErr | K::DeviceFatal, _) => true,
            _ => false,
        };
        let hit: Vec<ConnId> = match (ev.kind, ev.element) {
            (K::QpFatal | K::QpReqErr | K::QpAccessErr, AsyncElement::Qp(qpn)) => self
                .cx
                .conns
                .iter()
                .filter(|c| c.lanes.iter().any(|l| l.qp.qp_num() == qpn))
                .map(|c| c.id)
                .collect(),
            _ if wide => self.cx.conns.iter().map(|c| c.id).collect(),
            _ => Vec::new(),
        };
        let mine = !hit.is_empty() || matches!(ev.kind, K::DeviceFatal | K::PortErr);
        if mine && matches!(ev.kind, K::CqErr | K::DeviceFatal | K::PortErr | K::QpFatal) {
            eprintln!(
                "corelink: worker {}: the device reported {:?} on {:?}{}",
                self.cx.index,
                ev.kind,
                ev.element,
                if hit.is_empty() { String::new() } else { format!(": closing {hit:?}") }
            );
        }
        // An overrun's completions are gone and a failed device may flush nothing: what their
        // connections have posted is ended after a wait (`untrusted`).
        let lost = wide && (!hit.is_empty() || self.primes.any());
        if lost {
            self.untrusted.struck(self.cx.now());
            // (connections coming up may have lost their receives' completions too)
            self.primes.strike(reason);
        }
        for id in hit {
            if let Ok(c) = self.cx.conns.get_mut(id) {
                c.error_lanes();
                c.untrusted |= lost;
            }
            let _ = self.cx.begin_close(id, reason);
        }
    }

    /// The looks that are system calls on `ibverbs`, once a `SLOW_LOOK_EVERY` at most: the
    /// device's asynchronous events, the thread's context switches.
    fn slow_looks(&mut self, now: std::time::Duration) {
        self.next_slow_look = now + SLOW_LOOK_EVERY;
        if self.events.is_some() {
            self.device_events();
        }
        self.cx.metrics.sample_switches(self.switches_base);
    }

    /// Probes the connections idle since the last keepalive pass, if one is due at `now` (the
    /// coarse clock).
    fn keepalive_pass(&mut self, now: std::time::Duration) {
        let Worker { cx, keepalive: Some(k), .. } = self else { return };
        if cx.stopping || !k.due(now) {
            return;
        }
        // (an engine's header always says its receive size: a plain rdma_cm peer's does not)
        let conns = cx.conns.iter_mut().map(|c| {
            let probed = c.phase == Phase::Open && c.info.peer_recv_size.is_some();
            (c.id, probed, &mut c.live)
        });
        for &conn in k.pick(conns) {
            cx.probe(conn);
        }
    }

    /// Publishes the metrics with the thread's context switches counted now (a system call:
    /// at exit and at a parked worker's wakes; a busy one counts them in its slow looks).
    fn publish_with_switches(&mut self) {
        self.cx.metrics.sample_switches(self.switches_base);
        self.publish();
    }

    fn publish(&mut self) {
        // The queues' misses are counted in the request slab (a queue cannot reach the metrics).
        let queued = self.cx.reqs.misses();
        self.cx.metrics.invariant_misses += queued - self.queue_misses;
        self.queue_misses = queued;
        self.cx.metrics.ring_occupancy = (self.from_control.len() + self.clients.queued()) as u64;
        if let Ok(mut m) = self.published.try_lock() {
            m.clone_from(&self.cx.metrics);
        }
    }

    /// A completion to its stage: inlined into the loop, a send-queue completion's retirement
    /// with it, a receive's out of line (in the emulated guest each call's return costs a
    /// look-up of the translated code).
    #[inline(always)]
    fn dispatch(&mut self, wc: &Wc) {
        match WrId::decode(wc.wr_id) {
            WrId::Recv(r) => self.dispatch_recv(wc, r),
            WrId::Req(id) => self.dispatch_send(wc, id),
        }
    }

    #[inline(never)]
    fn dispatch_recv(&mut self, wc: &Wc, id: RecvId) {
        crate::bench_support::tail_mark();
        let found = self.cx.conns.at_mut(id.slot).filter(|c| id.is_of(c.id)).and_then(|c| {
            let lane = c.lanes.get_mut(usize::from(id.lane))?;
            // Fewer than half its receives left posted: this iteration's receives go back
            // before its answers (a peer answered at once must find a receive posted).
            let (buf, low) = lane.recvs.complete(id.index)?;
            Some((c, buf, low))
        });
        // A receive's connection, lane and buffer are held until its completion (or, for a
        // connection coming up, by its prime).
        let Some((c, mut buf, low)) = found else { return self.early(wc, id) };
        self.cx.repost_first |= low;
        if wc.status != WcStatus::Success {
            if c.phase == Phase::Open {
                c.note_error(wc.status);
                self.cx.conns.mark(id.slot);
            }
            return;
        }
        self.cx.metrics.completion(wc.opcode, wc.status, wc.byte_len);
        // Delivered even once the connection is closing: the sender has its acknowledgement,
        // so the message is the application's (it comes before `on_closed`, which waits for
        // every receive). Its buffer is not posted again then (`repost` checks).
        let conn = c.id;
        let write_imm = wc.opcode == WcOpcode::RecvRdmaWithImm;
        let len = if write_imm { 0 } else { wc.byte_len as usize };
        if buf.set_len(len.min(buf.capacity())).is_err() {
            return;
        }
        let written = write_imm.then_some(wc.byte_len);
        c.live.heard = true;
        match c.owner {
            // (a probe owns no connection)
            Origin::Handler | Origin::Keepalive | Origin::Fence => {
                let msg = Message { data: buf.as_slice(), imm: wc.imm, written };
                self.handler.on_message(&mut self.cx, conn, &msg);
            }
            Origin::Client(n) => {
                // A client's message leaves the worker: its bytes are copied out (into a
                // vector the client gave back, if it did).
                let data = self.clients.copy_for(n, buf.as_slice());
                self.clients.tell(n, Event::Message { conn, data, imm: wc.imm, written });
            }
        }
        // Posted again after this iteration's flush (at most one per completion polled).
        if let Err(e) = self.cx.reposts.try_push((id, buf)) {
            let (id, buf) = e.element();
            self.cx.repost(id, buf);
        }
    }

    /// A receive completed whose slot holds no connection: one coming up.
    #[cold]
    fn early(&mut self, wc: &Wc, id: RecvId) {
        match self.primes.early(wc, id) {
            Early::Kept => {
                self.cx.metrics.early_receives += u64::from(wc.status == WcStatus::Success)
            }
            Early::Flushed => {}
            Early::Drained(conn, qps) => self.unprimed(conn, qps),
            Early::Unknown => self.gone(),
        }
    }

    /// Connection `conn` did not come up, and its receives have flushed: its
    /// slot is free, its QPs go back to the pool.
    fn unprimed(&mut self, conn: ConnId, qps: Qps<P>) {
        if !self.cx.conns.unreserve(conn) {
            self.cx.invariant_missed();
        }
        self.cx.tell_control(ToControl::Return { qps });
    }

    fn take_client_requests(&mut self) -> bool {
        let mut took = false;
        for n in 0..self.clients.len() {
            for _ in 0..CLIENT_BATCH {
                let Some(req) = self.clients.next_request(n) else { break };
                took = true;
                if !self.cx.stopping && req.conn().is_some_and(|c| self.cx.conns.coming_up(c)) {
                    // A connection the control core told the client of before handing it over
                    // (the handover is on its way): the request, and the client's after it,
                    // wait for it.
                    self.clients.hold(n, req);
                    break;
                }
                if let Some(e) = self.cx.client_request(n as u16, req) {
                    self.clients.tell(n as u16, e);
                }
            }
        }
        took
    }

    fn deliver_notices(&mut self) {
        while let Some(n) = self.cx.outbox.next_notice() {
            match n {
                Notice::Done(d) => self.handler.on_completion(&mut self.cx, d),
                Notice::Client(c, e) => self.clients.tell(c, e),
                Notice::ConnectFailed(origin, token, e) => {
                    self.connect_failure(DialKey { origin, token }, e)
                }
                Notice::Closed(owner, id, reason) => {
                    match owner {
                        // (a probe owns no connection)
                        Origin::Handler | Origin::Keepalive | Origin::Fence => {
                            self.handler.on_closed(&mut self.cx, id, &reason)
                        }
                        Origin::Client(n) => {
                            self.clients.tell(n, Event::Closed { conn: id, reason })
                        }
                    }
                    if self.cx.redials.has_any() {
                        self.redial_closed(id, reason);
                    }
                }
            }
        }
    }

    fn drain_control(&mut self) {
        while let Some(m) = self.from_control.pop() {
            match m {
                ToWorker::Prime { prime, qps } => self.prime(prime, qps),
                ToWorker::NewConn { conn, lanes, info, origin, told } => {
                    self.add_conn(conn, lanes, info, origin, told)
                }
                ToWorker::Unprime { conn, qps } => self.unprime(conn, qps),
                ToWorker::ConnectFailed { token, origin, error } => {
                    self.connect_failed(token, origin, error)
                }
                ToWorker::PeerClosed { cm_key } => {
                    let found = self
                        .cx
                        .conns
                        .iter_mut()
                        .find(|c| c.lanes.iter().any(|l| l.cm_key == cm_key));
                    if let Some(c) = found {
                        let id = c.id;
                        // The peer is gone: what it answered before still comes, then
                        // everything posted flushes, and the other lanes are disconnected.
                        c.peer_left();
                        let _ = self.cx.begin_close(id, CloseReason::Peer);
                    }
                }
                ToWorker::AddClient { number, requests, events, overflow, waiter } => {
                    // (in order, through one ring: a client's number is its place)
                    if self.clients.add(requests, events, overflow, waiter) != number {
                        self.cx.invariant_missed();
                    }
                }
                ToWorker::DeviceEvent(ev) => self.device_event(ev),
                ToWorker::Shutdown => {
                    self.cx.begin_shutdown();
                    self.end_redials();
                }
            }
        }
    }

    /// Tells whoever asked for connect `token` that it failed.
    fn connect_failed(&mut self, token: u64, origin: Origin, error: EngineError) {
        self.cx.outbox.notify(Notice::ConnectFailed(origin, token, error));
    }

    /// Keeps a slot for a connection coming up and posts its receives on its QPs, lent for
    /// that; the QPs go back with the slot's id (or why there is none).
    fn prime(&mut self, prime: PrimeFor, mut qps: Qps<P>) {
        let conn = if self.cx.stopping {
            Err(EngineError::ShuttingDown)
        } else {
            let per_lane = self.cx.cfg.recvs_per_lane[qps.len().min(MAX_QPS_PER_CONN)] as usize;
            let Cx { conns, recv_pool, cfg, metrics, .. } = &mut self.cx;
            let shape = (per_lane, cfg.recv_size);
            let primed =
                self.primes.prime(conns, recv_pool, shape, &mut qps, &mut metrics.recv_post_errors);
            primed.map(|(id, misses)| {
                for _ in 0..misses {
                    self.cx.invariant_missed();
                }
                id
            })
        };
        self.cx.tell_control(ToControl::Primed { prime, conn, qps });
    }

    /// Connection `conn` did not come up: its QPs, back, flush before they return.
    fn unprime(&mut self, conn: ConnId, qps: Qps<P>) {
        match self.primes.unprime(conn, qps) {
            Ok(Some(qps)) => self.unprimed(conn, qps),
            Ok(None) => {} // (its last flush returns them)
            Err(qps) => {
                self.cx.invariant_missed();
                self.cx.tell_control(ToControl::Return { qps });
            }
        }
    }

    /// Connection `id` (primed) is up: it opens in its kept slot with the receives posted then,
    /// and what arrived meanwhile is delivered after the connect's issuer hears of it (from the
    /// control core already, when `told`).
    fn add_conn(
        &mut self,
        id: ConnId,
        new: ArrayVec<NewLane<P>, MAX_QPS_PER_CONN>,
        info: ConnInfo,
        origin: Origin,
        told: bool,
    ) {
        let Some(opened) = self.primes.open(id) else {
            // Never: the control core hands over only what was primed. Count it, give the QPs
            // back, and tell the connect's issuer (an accepted one's peer sees the disconnect).
            self.cx.invariant_missed();
            for l in new {
                self.cx.tell_control(ToControl::Disconnect { cm_key: l.cm_key });
                self.cx.tell_control(ToControl::Release { cm_key: l.cm_key, qp: l.qp });
            }
            if let (true, Origin::Client(n)) = (told, origin) {
                // (it heard of the connection: it hears of its end)
                let reason = CloseReason::Error(corelink_verbs::WcStatus::GeneralErr);
                self.clients.tell(n, Event::Closed { conn: id, reason });
            } else if info.initiated {
                let error = EngineError::Limit {
                    worker: self.cx.index,
                    limit: crate::error::Limit::Connections,
                    max: self.cx.conns.capacity() as u64,
                    in_use: self.cx.conns.live() as u64,
                    need: 1,
                };
                self.connect_failed(info.token, origin, error);
            }
            return;
        };
        let mut lanes = ArrayVec::new();
        for (NewLane { qp, cm_key }, primed) in new.into_iter().zip(opened.lanes) {
            let recvs = Recvs::new(primed.recvs, primed.posted);
            let sq = queues::SendQueue::new(self.cx.cfg.max_outstanding);
            lanes.push(Lane { qp, cm_key, recvs, sq });
        }
        if !self
            .cx
            .conns
            .fill(id, Conn::new(id, info.clone(), origin, lanes, self.cx.cfg.max_outstanding))
        {
            // (never: `open` found it primed, so its slot is kept)
            return self.cx.invariant_missed();
        }
        // The connection is its connect's issuer's (an accepted one the handler's): its
        // messages and its close go there.
        let key = DialKey { origin, token: info.token };
        if info.initiated && self.cx.redials.has(key) {
            self.cx.redials.connected(key, id);
        }
        match origin {
            // (a probe connects nothing)
            Origin::Handler | Origin::Keepalive | Origin::Fence => {
                self.handler.on_connected(&mut self.cx, id, &info)
            }
            Origin::Client(_) if told => {}
            Origin::Client(n) => self.clients.tell(n, Event::Connected { conn: id, info }),
        }
        for wc in &opened.early {
            self.dispatch(wc);
        }
        if let Some(reason) = opened.lost {
            // Its receives' completions may be gone: it closes, and what it still has posted
            // is made up for after the wait.
            if let Ok(c) = self.cx.conns.get_mut(id) {
                c.error_lanes();
                c.untrusted = true;
            }
            self.untrusted.struck(self.cx.now());
            let _ = self.cx.begin_close(id, reason);
        } else if opened.post_failed {
            let _ = self.cx.begin_close(id, CloseReason::RecvPostFailed);
        }
    }

    fn finish_closing(&mut self) {
        let Cx { conns, outbox, now, cfg, .. } = &mut self.cx;
        let grace = cfg.peer_grace;
        // A connection whose peer left: its lanes go to ERR once the answers in flight came.
        conns.closing(|c| {
            c.awaits_answers(|| cx::clock(now), grace);
        });
        // A connection a failed request closed: every lane's QP to ERR (the failed one is
        // there already), so that everything posted on it flushes, and the peer disconnected
        // (after a wait for the peer's own disconnect, if the failure was on the peer's side).
        conns.undisconnected(|c| {
            if c.waits_for_peer(|| cx::clock(now), grace) {
                return false;
            }
            c.error_lanes();
            for lane in &c.lanes {
                outbox.tell_control(ToControl::Disconnect { cm_key: lane.cm_key });
            }
            true
        });
        conns.release_drained(|c| {
            let reason = c.reason.unwrap_or(CloseReason::Local);
            for lane in c.lanes {
                outbox.tell_control(ToControl::Release { cm_key: lane.cm_key, qp: lane.qp });
            }
            outbox.notify(Notice::Closed(c.owner, c.id, reason));
        });
    }

    /// A connect failed: tried again under its policy, or told.
    fn connect_failure(&mut self, token: DialKey, e: EngineError) {
        if self.cx.redials.has(token) {
            let after = if self.cx.stopping {
                self.cx.redials.stop(token);
                redial::AfterFailure::GiveUp
            } else {
                self.cx.redials.failed(token)
            };
            if let redial::AfterFailure::Again { attempt, after } = after {
                return self.redial(token, attempt, after, Some(e));
            }
        }
        self.tell_connect_failed(token, e)
    }

    /// Tells connect `key`'s issuer that it failed for good.
    fn tell_connect_failed(&mut self, key: DialKey, error: EngineError) {
        let token = key.token;
        match key.origin {
            Origin::Handler | Origin::Keepalive | Origin::Fence => {
                self.handler.on_connect_failed(&mut self.cx, token, &error)
            }
            Origin::Client(n) => self.clients.tell(n, Event::ConnectFailed { token, error }),
        }
    }

    /// Connection `id` closed (and the handler was told): made again if its connect had a
    /// policy and this side did not close it.
    #[cold]
    fn redial_closed(&mut self, id: ConnId, reason: CloseReason) {
        let local = reason == CloseReason::Local || self.cx.stopping;
        if let Some((token, redial::AfterFailure::Again { attempt, after })) =
            self.cx.redials.closed(id, local)
        {
            self.redial(token, attempt, after, None);
        }
    }

    /// Waits out try `attempt` of connect `key` on a timer, telling its issuer (a full timer
    /// table ends the policy: the connect fails with that limit).
    fn redial(
        &mut self,
        key: DialKey,
        attempt: u32,
        after: std::time::Duration,
        failed: Option<EngineError>,
    ) {
        if let Err(e) = self.cx.set_due(after, Due::Redial(key)) {
            self.cx.redials.stop(key);
            return self.tell_connect_failed(key, e);
        }
        let token = key.token;
        match key.origin {
            Origin::Handler | Origin::Keepalive | Origin::Fence => {
                let step = Redial { token, attempt, after, failed: failed.as_ref() };
                self.handler.on_redial(&mut self.cx, &step);
            }
            Origin::Client(n) => {
                self.clients.tell(n, Event::Redial { token, attempt, after, failed });
            }
        }
    }

    /// Ends the reconnect policies whose tries wait (the worker is stopping): their connects
    /// fail with `ShuttingDown`.
    fn end_redials(&mut self) {
        for key in self.cx.redials.drain_waiting() {
            self.tell_connect_failed(key, EngineError::ShuttingDown);
        }
    }

    fn fire_timers(&mut self) {
        while let Some(due) = self.cx.timers.next_due(self.cx.now()) {
            match due {
                Due::Handler(token) => self.handler.on_timer(&mut self.cx, token),
                Due::Redial(key) => {
                    // (nothing if its policy ended meanwhile)
                    if let Some((addr, private_data)) = self.cx.redials.due(key) {
                        let (origin, token) = (key.origin, key.token);
                        let m = ToControl::Connect { addr, private_data, token, origin };
                        self.cx.tell_control(m);
                    }
                }
            }
        }
    }
}
