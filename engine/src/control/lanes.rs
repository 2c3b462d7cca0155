//! A connection's lanes while they come up, on both sides.
//!
//! Either side first lends the connection's QPs (moved to INIT) to its worker, which keeps a
//! slot for it and posts its receives (`ToWorker::Prime`, answered by `ToControl::Primed`):
//! the peer may send the moment its side is up, and finds them. A connection that then fails
//! gives its QPs back to the worker (`ToWorker::Unprime`), which flushes them and returns them
//! to the pool.
//!
//! Connecting: [`Control::start_connect`] takes `worker.qps.per_conn` QPs from the worker's
//! pool and starts one connect per lane (`Context::connect_start`), each sending the same
//! header but for its lane index, while the worker primes the QPs (a lane's next step waits
//! for its QP: the peer cannot send before this side's last step); the control core takes each
//! lane's next step as its events come (`finish_connects`, once per loop: no thread, no wait); when
//! every lane has reported, the connection goes to the worker whole, or, if any lane failed,
//! the lanes that came up are disconnected and the connect fails with the first cause.
//!
//! Accepting: lanes are grouped by their header's nonce. The first lane of a group decides
//! its worker (the placement rule runs once per connection) and reserves its budget; each
//! lane's request is held until all have come (the lane count is the connector's, whatever
//! this side's `per_conn`); then the group's QPs are primed and every lane is accepted (the
//! accept goes out at once; its connector's confirmation is polled once per loop, so that a
//! slow or half-open peer delays no other), and the group goes to the worker when its last
//! lane is up. A group whose lane fails (no QP within `worker.qps.max`, a failed accept, a
//! lane disconnected) or that waits longer than twice `connect_timeout_ms` is dropped: its
//! held requests are rejected with the reason, its lanes disconnected, and its late lanes
//! rejected with the reason.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corelink_verbs::{
    Accepting as _, CmEvent, CmWaiter as _, ConnRequest, Connecting as _, Connection, Context,
    Listener, Progress, Provider, Watch, ACCEPT_WAIT,
};

use super::header::{nonce, reject_data, reject_reason, Header, MAX_APP_PRIVATE_DATA};
use super::{Control, Reservation};
use crate::client::Waiter;
use crate::error::EngineError;
use crate::handoff::{Origin, PrimeFor, Qps, ToWorker};
use crate::request::{ConnId, ConnInfo};
use crate::tunables::MAX_QPS_PER_CONN;

type Up<P> = (<P as Provider>::Qp, <P as Provider>::Connection);

/// Work polled in passes (connects and accepts waiting for their peers): a pass takes every
/// item out, and those still waiting go back. Two buffers take turns, so that once warm a pass
/// allocates nothing.
pub(super) struct Passes<T> {
    items: Vec<T>,
    spare: Vec<T>,
}

impl<T> Passes<T> {
    fn new() -> Self {
        Passes { items: Vec::new(), spare: Vec::new() }
    }

    /// Items waiting.
    pub(super) fn len(&self) -> usize {
        self.items.len()
    }

    /// Items waiting, to look at.
    fn iter(&self) -> std::slice::Iter<'_, T> {
        self.items.iter()
    }

    fn push(&mut self, t: T) {
        self.items.push(t);
    }

    /// Every item, for a pass (what goes back is pushed meanwhile); give the emptied vector
    /// back with [`Passes::end`].
    fn begin(&mut self) -> Vec<T> {
        let spare = std::mem::take(&mut self.spare);
        std::mem::replace(&mut self.items, spare)
    }

    fn end(&mut self, mut done: Vec<T>) {
        done.clear();
        self.spare = done;
    }
}

/// One lane's connect in progress (polled by the control core: no thread waits on it).
struct LaneConnecting<P: Provider> {
    conn: u64,
    lane: usize,
    qp: P::Qp,
    connecting: P::Connecting,
}

/// A connect in progress.
struct Connecting<P: Provider> {
    worker: usize,
    token: u64,
    origin: Origin,
    /// The worker's slot for it, once its QPs are primed (`None`: lent to the worker now).
    conn: Option<ConnId>,
    /// By lane: its connect, started while its QP is with the worker, and taking the steps
    /// that need no QP meanwhile (`Connecting::advance`; polled with its QP once the QP is
    /// back: the peer cannot send before this side's last step, which needs the QP), or why
    /// it failed meanwhile.
    started: Vec<Result<P::Connecting, EngineError>>,
    /// QPs of lanes that failed, kept to go back to the worker to flush.
    back: Qps<P>,
    /// By lane index: the lanes that came up.
    lanes: Vec<Option<Up<P>>>,
    /// Lanes not reported yet.
    waiting: usize,
    /// The first failure.
    error: Option<EngineError>,
    /// Where it connects.
    addr: SocketAddr,
    /// What it holds of the worker's budget.
    reservation: Reservation,
    /// An external client's connect: the client, told of its connection by the control core.
    tell: Option<Arc<Waiter>>,
}

/// The connects in progress and their lanes' connects.
pub(super) struct Outgoing<P: Provider> {
    groups: HashMap<u64, Connecting<P>>,
    lanes: Passes<LaneConnecting<P>>,
}

impl<P: Provider> Outgoing<P> {
    pub(super) fn new() -> Self {
        Outgoing { groups: HashMap::new(), lanes: Passes::new() }
    }

    /// Lanes still connecting.
    pub(super) fn connecting(&self) -> usize {
        self.lanes.len()
    }

    /// Whether no connect is in progress (none priming, none connecting).
    pub(super) fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Adds what a waiter watches of each lane connecting (with its QP, or while the QP is
    /// being primed).
    pub(super) fn watch(&self, out: &mut Vec<Watch>) {
        out.extend(self.lanes.iter().map(|l| l.connecting.watch()));
        let priming = self.groups.values().flat_map(|g| g.started.iter().flatten());
        out.extend(priming.map(|c| c.watch()));
    }
}

/// An accepted connection waiting for its lanes (or, failed, rejecting its late ones).
///
/// Its lanes' requests are held until all have come; then its QPs are lent to the worker to
/// post its receives on (`priming`), and once they are back each lane is accepted.
struct Accepting<P: Provider> {
    worker: usize,
    deadline: Instant,
    info: ConnInfo,
    /// A plain rdma_cm peer's (answered without a header).
    foreign: bool,
    /// By lane: its request, until the lane is accepted.
    requests: Vec<Option<P::ConnRequest>>,
    /// Its QPs are with the worker, being primed.
    priming: bool,
    /// The worker's slot for it, once primed.
    conn: Option<ConnId>,
    lanes: Vec<Option<Up<P>>>,
    /// Lanes whose accept waits for its connector (their QPs are in `pending`).
    confirming: usize,
    /// Its QPs in hand after it failed, to go back to the worker to flush.
    back: Qps<P>,
    /// Why it failed (its late lanes are rejected with this), once it has.
    failed: Option<String>,
    /// What it holds of the worker's budget (until it fails or goes to the worker).
    reservation: Option<Reservation>,
}

/// A lane accepted and waiting for its connector's confirmation.
struct PendingLane<P: Provider> {
    nonce: u64,
    lane: usize,
    /// Lanes of its connection.
    lanes: usize,
    worker: usize,
    qp: P::Qp,
    accepting: P::Accepting,
    /// When it gives up.
    deadline: Instant,
}

/// Accepted connections waiting for their lanes, by nonce, and the lanes whose accepts wait
/// for their connectors.
pub(super) struct Incoming<P: Provider> {
    groups: HashMap<u64, Accepting<P>>,
    pending: Passes<PendingLane<P>>,
}

impl<P: Provider> Incoming<P> {
    pub(super) fn new() -> Self {
        Incoming { groups: HashMap::new(), pending: Passes::new() }
    }

    /// Accepts waiting for their connectors.
    pub(super) fn confirming(&self) -> usize {
        self.pending.len()
    }

    /// Whether no accepted connection is coming up (none waiting for lanes, priming or
    /// confirming, none failed and waiting for its QPs).
    pub(super) fn is_empty(&self) -> bool {
        self.groups.is_empty() && self.pending.len() == 0
    }

    /// Adds what a waiter watches of each accept waiting for its connector, and of each
    /// lane up in a connection still waiting for its other lanes.
    pub(super) fn watch(&self, out: &mut Vec<Watch>) {
        out.extend(self.pending.iter().map(|p| p.accepting.watch()));
        let up = self.groups.values().flat_map(|g| g.lanes.iter().flatten());
        out.extend(up.map(|(_, cm)| cm.watch()));
    }
}

/// A lane's connect error: an engine's reject reason when the peer gave one, else the verbs
/// error.
fn describe(e: corelink_verbs::Error) -> EngineError {
    match &e {
        corelink_verbs::Error::Rejected { private_data, .. } => match reject_reason(private_data) {
            Some(why) => EngineError::PeerRefused(why),
            None => e.into(),
        },
        _ => e.into(),
    }
}

/// A reason in text for a reject's private data (the whole cause chain).
fn reason(e: &EngineError) -> String {
    corelink_verbs::chain(e).to_string()
}

fn lane_text(lane: usize, lanes: usize, e: String) -> String {
    if lanes == 1 {
        e
    } else {
        format!("lane {lane} of {lanes}: {e}")
    }
}

impl<P: Provider> Control<P> {
    /// Takes `k` QPs from worker `w`'s pool, in INIT, where the worker can post receives on
    /// them.
    fn qps_for(&mut self, w: usize, k: usize) -> Result<Qps<P>, EngineError> {
        let qps = self.workers[w].qps.take(k.min(MAX_QPS_PER_CONN))?;
        Ok(qps.into_iter().collect())
    }

    /// Starts worker `w`'s connect to `addr`: `per_conn` lanes, primed by the worker first.
    pub(super) fn start_connect(
        &mut self,
        w: usize,
        addr: SocketAddr,
        app: &[u8],
        token: u64,
        origin: Origin,
        tell: Option<Arc<Waiter>>,
    ) {
        let refuse = if self.shutting_down {
            Some(EngineError::ShuttingDown)
        } else if app.len() > MAX_APP_PRIVATE_DATA {
            Some(EngineError::PrivateDataTooLong { len: app.len(), max: MAX_APP_PRIVATE_DATA })
        } else {
            None
        };
        if let Some(error) = refuse {
            return self.send(w, ToWorker::ConnectFailed { token, origin, error });
        }
        let k = self.cfg.per_conn;
        let reservation = match self.workers[w].budget.reserve(k) {
            Ok(r) => r,
            Err(error) => return self.send(w, ToWorker::ConnectFailed { token, origin, error }),
        };
        let qps = match self.qps_for(w, k) {
            Ok(qps) => qps,
            Err(error) => {
                self.workers[w].budget.release(reservation);
                return self.send(w, ToWorker::ConnectFailed { token, origin, error });
            }
        };
        // Every lane's connect starts now (address and route resolution, on `ibverbs`, go on
        // while the worker posts the receives); one that cannot start fails the connect before
        // anything is primed.
        let (nonce, mut qps, mut started) = (nonce(), qps, Vec::with_capacity(k));
        for (lane, qp) in qps.iter_mut().enumerate() {
            let hdr = Header {
                nonce,
                lane: lane as u8,
                lanes: k as u8,
                recv_size: Some(self.cfg.recv_size),
                app: app.to_vec(),
            }
            .to_bytes();
            match self.ctx.connect_start(addr, qp, &self.cfg.attr, &hdr, self.cfg.connect_timeout) {
                Ok(c) => started.push(Ok(c)),
                Err(e) => {
                    drop(started);
                    for qp in qps {
                        self.workers[w].qps.give_back(qp);
                    }
                    self.workers[w].budget.release(reservation);
                    let e = describe(e);
                    let error = EngineError::Connect { addr, lane, lanes: k, source: Box::new(e) };
                    return self.send(w, ToWorker::ConnectFailed { token, origin, error });
                }
            }
        }
        let id = self.next_conn;
        self.next_conn += 1;
        let group = Connecting {
            worker: w,
            token,
            origin,
            conn: None,
            started,
            back: Qps::<P>::new(),
            lanes: (0..k).map(|_| None).collect(),
            waiting: k,
            error: None,
            addr,
            reservation,
            tell,
        };
        self.outgoing.groups.insert(id, group);
        self.send(w, ToWorker::Prime { prime: PrimeFor::Connect(id), qps });
    }

    /// The worker's answer to a prime: its QPs back, with their receives posted.
    pub(super) fn primed(
        &mut self,
        w: usize,
        prime: PrimeFor,
        conn: Result<ConnId, EngineError>,
        qps: Qps<P>,
    ) {
        match prime {
            PrimeFor::Connect(id) => self.connect_primed(w, id, conn, qps),
            PrimeFor::Accept(nonce) => self.accept_primed(w, nonce, conn, qps),
        }
    }

    /// Gives worker `w` back QPs primed for `conn` (or, not primed, to the pool).
    fn give_back_primed(&mut self, w: usize, conn: Option<ConnId>, qps: Qps<P>) {
        match conn {
            Some(conn) => self.send(w, ToWorker::Unprime { conn, qps }),
            None => {
                for qp in qps {
                    self.workers[w].qps.give_back(qp);
                }
            }
        }
    }

    /// Connect `id`'s QPs are primed: each lane connects (or the connect fails).
    fn connect_primed(
        &mut self,
        w: usize,
        id: u64,
        conn: Result<ConnId, EngineError>,
        qps: Qps<P>,
    ) {
        let (conn, refused) = match conn {
            Ok(c) if self.shutting_down => (Some(c), Some(EngineError::ShuttingDown)),
            Ok(c) => (Some(c), None),
            Err(e) => (None, Some(e)),
        };
        if !self.outgoing.groups.contains_key(&id) {
            return self.give_back_primed(w, conn, qps); // (never: a connect waits for its prime)
        }
        if let Some(error) = refused {
            if let Some(g) = self.outgoing.groups.remove(&id) {
                self.workers[g.worker].budget.release(g.reservation);
                let (token, origin) = (g.token, g.origin);
                self.give_back_primed(w, conn, qps);
                self.send(w, ToWorker::ConnectFailed { token, origin, error });
            }
            return;
        }
        let Some(g) = self.outgoing.groups.get_mut(&id) else { return };
        g.conn = conn;
        let started = std::mem::take(&mut g.started);
        // Each lane's next step at once (with its QP back, the connect may go on).
        for (lane, (connecting, qp)) in started.into_iter().zip(qps).enumerate() {
            match connecting {
                Ok(connecting) => {
                    self.step_connect(LaneConnecting { conn: id, lane, qp, connecting });
                }
                Err(e) => {
                    self.lane_connected(id, lane, qp, Err(e));
                    self.finish_connect(id);
                }
            }
        }
    }

    /// Takes the steps that need no QP of the lanes whose QPs are being primed (without
    /// waiting): address and route resolution and the connect go on meanwhile.
    pub(super) fn advance_priming(&mut self) {
        let (waiter, targeted) = (&self.waiter, self.targeted);
        for g in self.outgoing.groups.values_mut().filter(|g| !g.started.is_empty()) {
            // (collected in place: the same type)
            g.started = std::mem::take(&mut g.started)
                .into_iter()
                .map(|lane| match lane {
                    Ok(c) if !targeted || waiter.ready(c.watch()) => {
                        c.advance(Duration::ZERO).map_err(describe)
                    }
                    other => other,
                })
                .collect();
        }
    }

    /// Takes lane `l`'s next step (without waiting); returns whether it finished.
    fn step_connect(&mut self, l: LaneConnecting<P>) -> bool {
        let LaneConnecting { conn, lane, mut qp, connecting } = l;
        let result = match connecting.poll(&mut qp, Duration::ZERO) {
            Ok(Progress::Pending(connecting)) => {
                self.outgoing.lanes.push(LaneConnecting { conn, lane, qp, connecting });
                return false;
            }
            Ok(Progress::Ready(cm)) => Ok(cm),
            Err(e) => Err(describe(e)),
        };
        self.lane_connected(conn, lane, qp, result);
        self.finish_connect(conn);
        true
    }

    /// Takes the next steps of the lanes connecting (without waiting); returns whether any
    /// lane finished.
    pub(super) fn finish_connects(&mut self) -> bool {
        let mut any = false;
        let mut pass = self.outgoing.lanes.begin();
        for l in pass.drain(..) {
            if !self.look(l.connecting.watch()) {
                self.outgoing.lanes.push(l);
                continue;
            }
            any |= self.step_connect(l);
        }
        self.outgoing.lanes.end(pass);
        any
    }

    /// Lane `lane` of connect `conn` finished: up (with its QP), or failed (its QP is kept to
    /// go back to the worker).
    fn lane_connected(
        &mut self,
        conn: u64,
        lane: usize,
        qp: P::Qp,
        result: Result<P::Connection, EngineError>,
    ) {
        let Some(g) = self.outgoing.groups.get_mut(&conn) else { return };
        g.waiting -= 1;
        match result {
            Ok(cm) => g.lanes[lane] = Some((qp, cm)),
            Err(e) => {
                let (addr, lanes) = (g.addr, g.lanes.len());
                let e = EngineError::Connect { addr, lane, lanes, source: Box::new(e) };
                g.error.get_or_insert(e);
                g.back.push(qp);
            }
        }
    }

    /// Once every lane of connect `id` has reported: hands the connection over, or fails it
    /// (its QPs go back to the worker to flush).
    fn finish_connect(&mut self, id: u64) {
        if self.outgoing.groups.get(&id).is_none_or(|g| g.waiting > 0) {
            return;
        }
        let Some(g) = self.outgoing.groups.remove(&id) else { return };
        let (w, token, origin) = (g.worker, g.token, g.origin);
        let error = match g.error {
            Some(e) => Some(e),
            None if self.shutting_down => Some(EngineError::ShuttingDown),
            None => None,
        };
        let up: Vec<Up<P>> = g.lanes.into_iter().flatten().collect();
        let Some(conn) = g.conn else { return }; // (never: lanes connect once primed)
        if let Some(error) = error {
            let mut back = g.back;
            for (qp, cm) in up {
                retire(cm);
                back.push(qp);
            }
            self.workers[w].budget.release(g.reservation);
            self.send(w, ToWorker::Unprime { conn, qps: back });
            return self.send(w, ToWorker::ConnectFailed { token, origin, error });
        }
        let peer = up.first().map(|(_, cm)| Header::parse(cm.peer_private_data()));
        let (private_data, peer_recv_size) = match peer {
            Some(Ok(Some(h))) => (h.app, h.recv_size),
            // An accepting side that is not an engine (a plain rdma_cm program): its data.
            Some(Ok(None)) => (
                up.first().map(|(_, cm)| cm.peer_private_data().to_vec()).unwrap_or_default(),
                None,
            ),
            _ => (Vec::new(), None),
        };
        // (lanes and receives: filled in at the handover)
        let info = ConnInfo {
            private_data,
            peer_recv_size,
            initiated: true,
            token,
            lanes: 0,
            recvs_per_lane: 0,
        };
        self.hand_off(w, conn, up, info, origin, g.reservation, g.tell);
    }

    /// Takes one lane's request if one is waiting; returns whether one was.
    pub(super) fn accept_one(&mut self) -> bool {
        // (just a look: the loop's wait watches the listener)
        let Some(w) = self.listener.as_ref().map(|l| l.watch()) else { return false };
        if !self.look(w) {
            return false;
        }
        let Some(l) = self.listener.as_mut() else { return false };
        let req = match l.get_request(Duration::ZERO) {
            Ok(Some(r)) => r,
            _ => return false,
        };
        let (hdr, foreign) = match Header::parse(req.private_data()) {
            Ok(Some(h)) => (h, false),
            Ok(None) if self.cfg.accept_foreign => {
                // A plain rdma_cm peer: one lane, its whole private data, answered with none.
                let app = req.private_data().to_vec();
                (Header { nonce: nonce(), lane: 0, lanes: 1, recv_size: None, app }, true)
            }
            Ok(None) => {
                let why = "no corelink engine header in the request (this listener takes \
                           engine peers only; accept_foreign = true in the core map takes \
                           plain rdma_cm peers)";
                let _ = req.reject(&reject_data(why));
                self.foreign_refused += 1;
                return true;
            }
            Err(why) => {
                let _ = req.reject(&reject_data(&why));
                return true;
            }
        };
        let (nonce, lane, k) = (hdr.nonce, hdr.lane as usize, hdr.lanes as usize);
        match self.incoming.groups.get(&nonce) {
            Some(g) => {
                let refuse = match &g.failed {
                    Some(why) => Some(why.clone()),
                    None if g.requests.len() != k
                        || g.requests[lane].is_some()
                        || g.priming
                        || g.conn.is_some() =>
                    {
                        Some(format!("lane {lane} of {k} does not fit its connection"))
                    }
                    None => None,
                };
                if let Some(why) = refuse {
                    let _ = req.reject(&reject_data(&why));
                    return true;
                }
            }
            None => {
                let w = self.choose_worker(&hdr.app);
                let reservation = match self.workers[w].budget.reserve(k) {
                    Ok(r) => r,
                    Err(e) => {
                        // Refused before any exchange: the connecting side hears why.
                        let _ = req.reject(&reject_data(&reason(&e)));
                        return true;
                    }
                };
                // (lanes and receives: filled in at the handover)
                let info = ConnInfo {
                    private_data: hdr.app,
                    peer_recv_size: hdr.recv_size,
                    initiated: false,
                    token: 0,
                    lanes: 0,
                    recvs_per_lane: 0,
                };
                let group = Accepting {
                    worker: w,
                    deadline: Instant::now() + self.cfg.group_timeout(),
                    info,
                    foreign,
                    requests: (0..k).map(|_| None).collect(),
                    priming: false,
                    conn: None,
                    lanes: (0..k).map(|_| None).collect(),
                    confirming: 0,
                    back: Qps::<P>::new(),
                    failed: None,
                    reservation: Some(reservation),
                };
                self.incoming.groups.insert(nonce, group);
            }
        }
        let Some(g) = self.incoming.groups.get_mut(&nonce) else { return true };
        g.requests[lane] = Some(req);
        if g.requests.iter().all(Option::is_some) {
            // Every lane is here: the worker posts the connection's receives, then each lane
            // is accepted (`accept_primed`).
            let w = g.worker;
            match self.qps_for(w, k) {
                Ok(qps) => {
                    if let Some(g) = self.incoming.groups.get_mut(&nonce) {
                        g.priming = true;
                    }
                    self.send(w, ToWorker::Prime { prime: PrimeFor::Accept(nonce), qps });
                }
                Err(e) => self.fail_incoming(nonce, reason(&e)),
            }
        }
        true
    }

    /// Accepted connection `nonce`'s QPs are primed: each lane's accept goes out now; its
    /// connector's confirmation is waited for by `finish_accepts`, one poll per loop, so that
    /// a slow or half-open peer delays no one.
    fn accept_primed(
        &mut self,
        w: usize,
        nonce: u64,
        conn: Result<ConnId, EngineError>,
        qps: Qps<P>,
    ) {
        let Some(g) = self.incoming.groups.get_mut(&nonce).filter(|g| g.priming) else {
            return self.give_back_primed(w, conn.ok(), qps); // (never: it waits for its prime)
        };
        g.priming = false;
        let id = match (conn, &g.failed) {
            (Ok(id), None) => id,
            (Err(e), None) => {
                self.give_back_primed(w, None, qps);
                return self.fail_incoming(nonce, reason(&e));
            }
            (conn, Some(_)) => {
                // It failed meanwhile (shutdown, expiry): nothing to accept.
                self.give_back_primed(w, conn.ok(), qps);
                return self.settle_incoming(nonce);
            }
        };
        g.conn = Some(id);
        let k = g.requests.len();
        let (foreign, deadline) =
            (g.foreign, Instant::now() + ACCEPT_WAIT.min(self.cfg.group_timeout()));
        let requests: Vec<_> = g.requests.iter_mut().map(Option::take).collect();
        let mut failed: Option<String> = None;
        for (lane, (req, mut qp)) in requests.into_iter().zip(qps).enumerate() {
            let Some(req) = req else { continue }; // (all came: that is why it was primed)
            if let Some(why) = &failed {
                let _ = req.reject(&reject_data(why));
                self.keep_back(nonce, qp);
                continue;
            }
            let answer = if foreign {
                Vec::new()
            } else {
                Header {
                    nonce,
                    lane: lane as u8,
                    lanes: k as u8,
                    recv_size: Some(self.cfg.recv_size),
                    app: Vec::new(),
                }
                .to_bytes()
            };
            match req.accept_start(&mut qp, &self.cfg.attr, &answer) {
                Ok(accepting) => {
                    let p =
                        PendingLane { nonce, lane, lanes: k, worker: w, qp, accepting, deadline };
                    self.incoming.pending.push(p);
                    if let Some(g) = self.incoming.groups.get_mut(&nonce) {
                        g.confirming += 1;
                    }
                }
                Err(e) => {
                    self.keep_back(nonce, qp);
                    failed = Some(lane_text(lane, k, reason(&e.into())));
                }
            }
        }
        if let Some(why) = failed {
            self.fail_incoming(nonce, why);
        }
    }

    /// Keeps a QP of accepted group `nonce` that will not come up, to go back to its worker.
    fn keep_back(&mut self, nonce: u64, qp: P::Qp) {
        if let Some(g) = self.incoming.groups.get_mut(&nonce) {
            g.back.push(qp);
        }
    }

    /// Polls the accepts waiting for their connectors' confirmation (without waiting); returns
    /// whether any finished.
    pub(super) fn finish_accepts(&mut self) -> bool {
        let mut any = false;
        let mut pass = self.incoming.pending.begin();
        for p in pass.drain(..) {
            if !self.look(p.accepting.watch()) && Instant::now() < p.deadline {
                self.incoming.pending.push(p);
                continue;
            }
            let PendingLane { nonce, lane, lanes, worker, mut qp, accepting, deadline } = p;
            match accepting.poll(&mut qp, Duration::ZERO) {
                Ok(Progress::Ready(cm)) => {
                    any = true;
                    self.lane_accepted(nonce, lane, worker, qp, cm);
                }
                Ok(Progress::Pending(a)) if Instant::now() < deadline => {
                    let p = PendingLane { nonce, lane, lanes, worker, qp, accepting: a, deadline };
                    self.incoming.pending.push(p);
                }
                Ok(Progress::Pending(a)) => {
                    any = true;
                    let e = a.abandon(&mut qp);
                    self.lane_failed(nonce, lane, lanes, qp, e.into());
                }
                Err(e) => {
                    any = true;
                    self.lane_failed(nonce, lane, lanes, qp, e.into());
                }
            }
        }
        self.incoming.pending.end(pass);
        any
    }

    /// Lane `lane` of accepted group `nonce` is up (on worker `w`); the group goes to its
    /// worker once every lane is.
    fn lane_accepted(&mut self, nonce: u64, lane: usize, w: usize, qp: P::Qp, cm: P::Connection) {
        let Some(g) = self.incoming.groups.get_mut(&nonce) else {
            // (never: a group stays while its lanes are confirming)
            retire(cm);
            return self.workers[w].qps.destroy(qp);
        };
        g.confirming -= 1;
        if g.failed.is_some() {
            // The group failed (or expired) while this lane was being confirmed.
            retire(cm);
            g.back.push(qp);
            return self.settle_incoming(nonce);
        }
        g.lanes[lane] = Some((qp, cm));
        if !g.lanes.iter().all(Option::is_some) {
            return;
        }
        let Some(g) = self.incoming.groups.remove(&nonce) else { return };
        let up = g.lanes.into_iter().flatten().collect();
        match (g.conn, g.reservation) {
            (Some(conn), Some(r)) => {
                self.hand_off(g.worker, conn, up, g.info, Origin::Handler, r, None)
            }
            // (never: a group that failed takes no lanes)
            _ => {
                for (qp, cm) in up {
                    retire(cm);
                    self.workers[w].qps.destroy(qp);
                }
            }
        }
    }

    /// Lane `lane` (of `lanes`) of accepted group `nonce` could not be accepted: its QP is
    /// kept to go back to the worker, and the group fails.
    fn lane_failed(&mut self, nonce: u64, lane: usize, lanes: usize, qp: P::Qp, e: EngineError) {
        if let Some(g) = self.incoming.groups.get_mut(&nonce) {
            g.confirming -= 1;
        }
        self.keep_back(nonce, qp);
        self.fail_incoming(nonce, lane_text(lane, lanes, reason(&e)));
        self.settle_incoming(nonce);
    }

    /// Fails accepted group `nonce`: its held requests are rejected with `why`, its lanes up
    /// are disconnected, and (for a group of several lanes) its late lanes rejected with `why`
    /// until its deadline. Its QPs go back to its worker once all are in hand.
    fn fail_incoming(&mut self, nonce: u64, why: String) {
        let Some(g) = self.incoming.groups.get_mut(&nonce) else { return };
        if g.failed.is_some() {
            return;
        }
        for req in g.requests.iter_mut().filter_map(Option::take) {
            let _ = req.reject(&reject_data(&why));
        }
        for (qp, cm) in g.lanes.iter_mut().filter_map(Option::take) {
            retire(cm);
            g.back.push(qp);
        }
        let (w, reservation) = (g.worker, g.reservation.take());
        g.failed = Some(why);
        if let Some(r) = reservation {
            self.workers[w].budget.release(r);
        }
        self.settle_incoming(nonce);
    }

    /// Once failed group `nonce` has every QP of its in hand (none being primed or
    /// confirming), gives them back to its worker; a group of one lane is forgotten then (no
    /// lane will follow, and peers without a header all share nonce 0).
    fn settle_incoming(&mut self, nonce: u64) {
        let Some(g) = self.incoming.groups.get_mut(&nonce) else { return };
        if g.failed.is_none() || g.priming || g.confirming > 0 {
            return;
        }
        let (w, back) = (g.worker, std::mem::take(&mut g.back));
        let conn = g.conn.take();
        if g.lanes.len() == 1 {
            self.incoming.groups.remove(&nonce);
        }
        match conn {
            Some(conn) => self.send(w, ToWorker::Unprime { conn, qps: back }),
            None => {
                for qp in back {
                    self.workers[w].qps.give_back(qp);
                }
            }
        }
    }

    /// Drops accepted groups one of whose lanes the peer disconnected.
    pub(super) fn watch_incoming(&mut self) {
        let mut gone = Vec::new();
        let (waiter, targeted) = (&self.waiter, self.targeted);
        for (nonce, g) in self.incoming.groups.iter_mut() {
            let k = g.lanes.len();
            for (lane, up) in g.lanes.iter_mut().enumerate() {
                let Some((_, cm)) = up else { continue };
                if targeted && !waiter.ready(cm.watch()) {
                    continue;
                }
                if let Ok(Some(CmEvent::Disconnected | CmEvent::DeviceRemoval)) =
                    cm.poll_event(Duration::ZERO)
                {
                    gone.push((
                        *nonce,
                        lane_text(lane, k, "disconnected before all lanes were up".into()),
                    ));
                    break;
                }
            }
        }
        for (nonce, why) in gone {
            self.fail_incoming(nonce, why);
        }
    }

    /// Fails accepted groups past their deadline, and forgets failed ones then (once their
    /// QPs are back).
    pub(super) fn expire_incoming(&mut self) {
        if self.incoming.groups.is_empty() {
            return;
        }
        let now = Instant::now();
        let due: Vec<u64> = self
            .incoming
            .groups
            .iter()
            .filter(|(_, g)| g.deadline <= now)
            .map(|(n, _)| *n)
            .collect();
        for nonce in due {
            let why = format!(
                "not all lanes came within {:?} (twice connect_timeout_ms)",
                self.cfg.group_timeout()
            );
            self.fail_incoming(nonce, why);
            self.forget_settled(nonce);
        }
    }

    /// Forgets failed group `nonce` if it holds nothing any more.
    fn forget_settled(&mut self, nonce: u64) {
        let settled = self.incoming.groups.get(&nonce).is_some_and(|g| {
            g.failed.is_some() && !g.priming && g.confirming == 0 && g.conn.is_none()
        });
        if settled {
            self.incoming.groups.remove(&nonce);
        }
    }

    /// Fails every accepted group still waiting (at shutdown): accepts waiting for their
    /// connectors are abandoned, so that every QP goes back to its worker now.
    pub(super) fn drop_incoming(&mut self) {
        let all: Vec<u64> = self.incoming.groups.keys().copied().collect();
        for &nonce in &all {
            self.fail_incoming(nonce, "the engine is shutting down".into());
        }
        let mut pass = self.incoming.pending.begin();
        for p in pass.drain(..) {
            let PendingLane { nonce, lane, lanes, mut qp, accepting, .. } = p;
            let e = accepting.abandon(&mut qp);
            self.lane_failed(nonce, lane, lanes, qp, e.into());
        }
        self.incoming.pending.end(pass);
        for nonce in all {
            self.forget_settled(nonce);
        }
    }
}

/// Disconnects a lane that is up and drops its connection-manager side (on `soft`, that moves
/// its QP to ERR).
pub(super) fn retire<C: Connection>(mut cm: C) {
    let _ = cm.disconnect();
    drop(cm);
}
