//! A connection's lanes while they come up, on both sides.
//!
//! Connecting: [`Control::start_connect`] takes `worker.qps.per_conn` QPs from the worker's
//! pool and starts one connect per lane (`Context::connect_start`), each sending the same
//! header but for its lane index; the control core takes each lane's next step as its events
//! come (`finish_connects`, once per loop: no thread, no wait); when every lane has reported,
//! the connection goes to the worker whole, or, if
//! any lane failed, the lanes that came up are disconnected and recycled and the connect fails
//! with the first cause.
//!
//! Accepting: lanes are grouped by their header's nonce. The first lane of a group decides
//! its worker (the placement rule runs once per connection), every lane is accepted with a QP
//! from that worker's pool (the accept goes out at once; its connector's confirmation is
//! polled once per loop, so that a slow or half-open peer delays no other), and the group
//! goes to the worker when its last lane is up (the
//! lane count is the connector's, whatever this side's `per_conn`). A group whose lane fails
//! (no QP within `worker.qps.max`, a failed accept, a lane disconnected) or that waits longer
//! than twice `connect_timeout_ms` is dropped: its lanes are disconnected and recycled, and its late
//! lanes rejected with the reason.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use corelink_verbs::{
    Accepting as _, CmEvent, CmWaiter as _, ConnRequest, Connecting as _, Connection, Context,
    Listener, Progress, Provider, Watch, ACCEPT_WAIT,
};

use super::header::{nonce, reject_data, reject_reason, Header, MAX_APP_PRIVATE_DATA};
use super::{Control, Reservation};
use crate::error::EngineError;
use crate::handoff::{Origin, ToWorker};
use crate::request::ConnInfo;

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

    /// Adds what a waiter watches of each lane connecting.
    pub(super) fn watch(&self, out: &mut Vec<Watch>) {
        out.extend(self.lanes.iter().map(|l| l.connecting.watch()));
    }
}

/// An accepted connection waiting for its lanes (or, failed, rejecting its late ones).
struct Accepting<P: Provider> {
    worker: usize,
    deadline: Instant,
    info: ConnInfo,
    lanes: Vec<Option<Up<P>>>,
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
    /// Starts worker `w`'s connect to `addr`: `per_conn` lanes, each on its connector thread.
    pub(super) fn start_connect(
        &mut self,
        w: usize,
        addr: SocketAddr,
        app: &[u8],
        token: u64,
        origin: Origin,
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
        let qps = match self.workers[w].qps.take(k) {
            Ok(qps) => qps,
            Err(error) => {
                self.workers[w].budget.release(reservation);
                return self.send(w, ToWorker::ConnectFailed { token, origin, error });
            }
        };
        let id = self.next_conn;
        self.next_conn += 1;
        let lanes = (0..k).map(|_| None).collect();
        let group = Connecting {
            worker: w,
            token,
            origin,
            lanes,
            waiting: k,
            error: None,
            addr,
            reservation,
        };
        self.outgoing.groups.insert(id, group);
        let nonce = nonce();
        for (lane, mut qp) in qps.into_iter().enumerate() {
            let hdr = Header {
                nonce,
                lane: lane as u8,
                lanes: k as u8,
                recv_size: Some(self.cfg.recv_size),
                app: app.to_vec(),
            }
            .to_bytes();
            match self.ctx.connect_start(
                addr,
                &mut qp,
                &self.cfg.attr,
                &hdr,
                self.cfg.connect_timeout,
            ) {
                Ok(connecting) => {
                    self.outgoing.lanes.push(LaneConnecting { conn: id, lane, qp, connecting })
                }
                Err(e) => self.lane_connected(id, lane, qp, Err(describe(e))),
            }
        }
        self.finish_connect(id);
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
            let LaneConnecting { conn, lane, mut qp, connecting } = l;
            match connecting.poll(&mut qp, Duration::ZERO) {
                Ok(Progress::Pending(connecting)) => {
                    self.outgoing.lanes.push(LaneConnecting { conn, lane, qp, connecting })
                }
                Ok(Progress::Ready(cm)) => {
                    any = true;
                    self.lane_connected(conn, lane, qp, Ok(cm));
                    self.finish_connect(conn);
                }
                Err(e) => {
                    any = true;
                    self.lane_connected(conn, lane, qp, Err(describe(e)));
                    self.finish_connect(conn);
                }
            }
        }
        self.outgoing.lanes.end(pass);
        any
    }

    /// Lane `lane` of connect `conn` finished: up (with its QP), or failed (its QP goes back to
    /// the pool).
    fn lane_connected(
        &mut self,
        conn: u64,
        lane: usize,
        qp: P::Qp,
        result: Result<P::Connection, EngineError>,
    ) {
        let Some(g) = self.outgoing.groups.get_mut(&conn) else { return };
        let w = g.worker;
        g.waiting -= 1;
        match result {
            Ok(cm) => g.lanes[lane] = Some((qp, cm)),
            Err(e) => {
                let (addr, lanes) = (g.addr, g.lanes.len());
                let e = EngineError::Connect { addr, lane, lanes, source: Box::new(e) };
                g.error.get_or_insert(e);
                self.workers[w].qps.give_back(qp, &self.cfg.attr);
            }
        }
    }

    /// Once every lane of connect `id` has reported: hands the connection over, or fails it.
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
        if let Some(error) = error {
            for (qp, cm) in up {
                self.recycle(w, qp, cm);
            }
            self.workers[w].budget.release(g.reservation);
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
        // (lanes and receives: filled in by the worker, which posts them)
        let info = ConnInfo {
            private_data,
            peer_recv_size,
            initiated: true,
            token,
            lanes: 0,
            recvs_per_lane: 0,
        };
        self.hand_off(w, up, info, origin, g.reservation);
    }

    /// Accepts one lane if a request is waiting; returns whether one was.
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
        let w = match self.incoming.groups.get(&nonce) {
            Some(g) => {
                let refuse = match &g.failed {
                    Some(why) => Some(why.clone()),
                    None if g.lanes.len() != k || g.lanes[lane].is_some() => {
                        Some(format!("lane {lane} of {k} does not fit its connection"))
                    }
                    None => None,
                };
                if let Some(why) = refuse {
                    let _ = req.reject(&reject_data(&why));
                    return true;
                }
                g.worker
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
                    lanes: (0..k).map(|_| None).collect(),
                    failed: None,
                    reservation: Some(reservation),
                };
                self.incoming.groups.insert(nonce, group);
                w
            }
        };
        let mut qp = match self.workers[w].qps.take(1).map(|mut v| v.pop()) {
            Ok(Some(qp)) => qp,
            Ok(None) => return true, // `take(1)` gives one QP
            Err(e) => {
                let why = reason(&e);
                let _ = req.reject(&reject_data(&why));
                self.fail_incoming(nonce, lane_text(lane, k, why));
                return true;
            }
        };
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
        // The accept goes out now; the connector's confirmation is waited for by
        // `finish_accepts`, one poll per loop, so that a slow or half-open peer delays no one.
        match req.accept_start(&mut qp, &self.cfg.attr, &answer) {
            Ok(accepting) => {
                let deadline = Instant::now() + ACCEPT_WAIT.min(self.cfg.group_timeout());
                let p = PendingLane { nonce, lane, lanes: k, worker: w, qp, accepting, deadline };
                self.incoming.pending.push(p);
            }
            Err(e) => self.lane_failed(nonce, lane, k, w, qp, e.into()),
        }
        true
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
                    self.lane_failed(nonce, lane, lanes, worker, qp, e.into());
                }
                Err(e) => {
                    any = true;
                    self.lane_failed(nonce, lane, lanes, worker, qp, e.into());
                }
            }
        }
        self.incoming.pending.end(pass);
        any
    }

    /// Lane `lane` of accepted group `nonce` is up (on worker `w`); the group goes to its
    /// worker once every lane is.
    fn lane_accepted(&mut self, nonce: u64, lane: usize, w: usize, qp: P::Qp, cm: P::Connection) {
        match self.incoming.groups.get_mut(&nonce) {
            Some(g) if g.failed.is_none() => {
                g.lanes[lane] = Some((qp, cm));
                if g.lanes.iter().all(Option::is_some) {
                    if let Some(g) = self.incoming.groups.remove(&nonce) {
                        let up = g.lanes.into_iter().flatten().collect();
                        match g.reservation {
                            Some(r) => self.hand_off(g.worker, up, g.info, Origin::Handler, r),
                            // (a group that failed takes no lanes, so never gets here)
                            None => up.into_iter().for_each(|(qp, cm)| self.recycle(w, qp, cm)),
                        }
                    }
                }
            }
            // The group failed (or expired) while this lane was being confirmed.
            _ => self.recycle(w, qp, cm),
        }
    }

    /// Lane `lane` (of `lanes`) of accepted group `nonce` could not be accepted: its QP goes
    /// back to worker `w`'s pool and the group fails.
    fn lane_failed(
        &mut self,
        nonce: u64,
        lane: usize,
        lanes: usize,
        w: usize,
        qp: P::Qp,
        e: EngineError,
    ) {
        self.workers[w].qps.give_back(qp, &self.cfg.attr);
        self.fail_incoming(nonce, lane_text(lane, lanes, reason(&e)));
    }

    /// Drops accepted group `nonce`: its lanes are disconnected and recycled, and (for a group
    /// of several lanes) its late lanes rejected with `why` until its deadline.
    fn fail_incoming(&mut self, nonce: u64, why: String) {
        let Some(g) = self.incoming.groups.get_mut(&nonce) else { return };
        if g.failed.is_some() {
            return;
        }
        let w = g.worker;
        let up: Vec<Up<P>> = g.lanes.iter_mut().filter_map(Option::take).collect();
        let reservation = g.reservation.take();
        if g.lanes.len() == 1 {
            // No lane will follow (and peers without a header all share nonce 0).
            self.incoming.groups.remove(&nonce);
        } else {
            g.failed = Some(why);
        }
        if let Some(r) = reservation {
            self.workers[w].budget.release(r);
        }
        for (qp, cm) in up {
            self.recycle(w, qp, cm);
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

    /// Drops accepted groups past their deadline (and forgets failed ones then).
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
            self.incoming.groups.remove(&nonce);
        }
    }

    /// Drops every accepted group still waiting (at shutdown).
    pub(super) fn drop_incoming(&mut self) {
        let all: Vec<u64> = self.incoming.groups.keys().copied().collect();
        for nonce in all {
            self.fail_incoming(nonce, "the engine is shutting down".into());
        }
        self.incoming.groups.clear();
    }
}
