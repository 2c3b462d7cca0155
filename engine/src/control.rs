//! The control core: one pinned thread that owns connection management. It listens and
//! accepts, runs connects (each blocking rdma_cm connect on a short-lived connector thread of the
//! control plane, so that one slow peer stalls nothing), creates each QP on the chosen worker's
//! PD and CQ, exchanges the workers' region descriptors in private data, hands finished QPs to
//! workers over SPSC rings, watches connection events, disconnects and destroys what workers
//! release, and runs the shutdown.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use corelink_verbs::{
    CmEvent, ConnRequest, Connection, Context, Listener, Pd, Provider, QpAttr, QpCap, QpInitAttr,
    QpType, RemoteRegion,
};

use crate::handoff::{NewLane, Origin, ToControl, ToWorker};
use crate::request::ConnInfo;
use crate::ring::{Consumer, Producer};

/// How long an outgoing connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one look for a connection request waits (the control loop's pace when idle).
const LISTEN_SLICE: Duration = Duration::from_millis(1);

/// Bytes of the engine's own header at the start of private data: the sender's region
/// descriptor and the length of the application's part.
pub(crate) const HEADER: usize = RemoteRegion::WIRE_BYTES + 1;

/// An application's placement rule: from the connector's private data (its part) and each
/// worker's connection count, the worker to use.
pub type PlaceFn = Box<dyn Fn(&[u8], &[usize]) -> usize + Send>;

/// Which worker gets an accepted connection.
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
    pub(crate) pd: Arc<P::Pd>,
    pub(crate) cq: Arc<P::Cq>,
    pub(crate) region: RemoteRegion,
    pub(crate) to: Producer<ToWorker<P>>,
    pub(crate) from: Consumer<ToControl<P>>,
    pub(crate) thread: std::thread::Thread,
    pub(crate) conns: usize,
    pub(crate) stopped: bool,
}

struct CtlConn<P: Provider> {
    cm: P::Connection,
    worker: usize,
}

struct Connected<P: Provider> {
    worker: usize,
    token: u64,
    origin: Origin,
    result: Result<(P::Qp, P::Connection), String>,
}

/// The control core's state.
pub(crate) struct Control<P: Provider> {
    pub(crate) ctx: Arc<P::Context>,
    pub(crate) listener: Option<P::Listener>,
    pub(crate) workers: Vec<WorkerLink<P>>,
    pub(crate) commands: mpsc::Receiver<Command<P>>,
    pub(crate) placement: Placement,
    pub(crate) cap: QpCap,
    pub(crate) attr: QpAttr,
    pub(crate) next_worker: usize,
    conns: HashMap<u64, CtlConn<P>>,
    next_key: u64,
    connects: (mpsc::Sender<Connected<P>>, mpsc::Receiver<Connected<P>>),
    connecting: usize,
    shutting_down: bool,
}

fn header(region: &RemoteRegion, app: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + app.len());
    v.extend_from_slice(&region.to_bytes());
    v.push(app.len() as u8);
    v.extend_from_slice(app);
    v
}

/// The peer's region and application data from private data made by [`header`] (rdma_cm may
/// pad it with zeros, hence the length byte).
fn parse_header(pd: &[u8]) -> (Option<RemoteRegion>, Vec<u8>) {
    let region = RemoteRegion::from_bytes(pd).filter(|r| r.len > 0);
    let len = pd.get(RemoteRegion::WIRE_BYTES).copied().unwrap_or(0) as usize;
    let app = pd.get(HEADER..HEADER + len).unwrap_or_default().to_vec();
    (region, app)
}

impl<P: Provider> Control<P> {
    pub(crate) fn new(
        ctx: Arc<P::Context>,
        listener: Option<P::Listener>,
        workers: Vec<WorkerLink<P>>,
        commands: mpsc::Receiver<Command<P>>,
        placement: Placement,
        cap: QpCap,
        attr: QpAttr,
    ) -> Self {
        Control {
            ctx,
            listener,
            workers,
            commands,
            placement,
            cap,
            attr,
            next_worker: 0,
            conns: HashMap::new(),
            next_key: 1,
            connects: mpsc::channel(),
            connecting: 0,
            shutting_down: false,
        }
    }

    /// Runs until every worker has stopped after a shutdown.
    pub(crate) fn run(mut self) {
        loop {
            self.commands();
            self.accept_one();
            self.worker_messages();
            self.finish_connects();
            self.watch_events();
            if self.shutting_down && self.connecting == 0 && self.workers.iter().all(|w| w.stopped)
            {
                break;
            }
            if self.listener.is_none() {
                std::thread::sleep(LISTEN_SLICE);
            }
        }
        self.conns.clear();
    }

    fn send(&mut self, w: usize, m: ToWorker<P>) {
        let link = &mut self.workers[w];
        let mut m = m;
        // The ring is sized for bursts; a full one means the worker is behind: wait for it.
        loop {
            match link.to.push(m) {
                Ok(()) => break,
                Err(back) => {
                    m = back;
                    link.thread.unpark();
                    std::thread::yield_now();
                }
            }
        }
        link.thread.unpark();
    }

    fn commands(&mut self) {
        while let Ok(c) = self.commands.try_recv() {
            match c {
                Command::Shutdown => {
                    if !self.shutting_down {
                        self.shutting_down = true;
                        self.listener = None; // stop accepting
                        for w in 0..self.workers.len() {
                            self.send(w, ToWorker::Shutdown);
                        }
                    }
                }
                Command::ToWorker(w, m) => self.send(w, m),
            }
        }
    }

    fn choose_worker(&mut self, app: &[u8]) -> usize {
        let n = self.workers.len();
        let w = match &self.placement {
            Placement::RoundRobin => {
                self.next_worker = (self.next_worker + 1) % n;
                self.next_worker
            }
            Placement::LeastLoaded => (0..n).min_by_key(|&i| self.workers[i].conns).unwrap_or(0),
            Placement::Custom(f) => {
                let loads: Vec<usize> = self.workers.iter().map(|w| w.conns).collect();
                f(app, &loads)
            }
        };
        w.min(n - 1)
    }

    fn new_qp(&self, w: usize) -> Result<P::Qp, String> {
        let link = &self.workers[w];
        let attr = QpInitAttr::<P> {
            qp_type: QpType::Rc,
            send_cq: &link.cq,
            recv_cq: &link.cq,
            srq: None,
            cap: self.cap,
            sq_sig_all: false,
        };
        link.pd.create_qp(&attr).map_err(|e| e.to_string())
    }

    fn accept_one(&mut self) {
        let Some(l) = self.listener.as_mut() else { return };
        let req = match l.get_request(LISTEN_SLICE) {
            Ok(Some(r)) => r,
            _ => return,
        };
        let (peer_region, app) = parse_header(req.private_data());
        let w = self.choose_worker(&app);
        let mut qp = match self.new_qp(w) {
            Ok(qp) => qp,
            Err(_) => {
                let _ = req.reject(&[]);
                return;
            }
        };
        let hdr = header(&self.workers[w].region, &[]);
        let Ok(cm) = req.accept(&mut qp, &self.attr, &hdr) else { return };
        let key = self.next_key;
        self.next_key += 1;
        self.conns.insert(key, CtlConn { cm, worker: w });
        self.workers[w].conns += 1;
        let info = ConnInfo { private_data: app, peer_region, initiated: false, token: 0 };
        let lanes = std::iter::once(NewLane { qp, cm_key: key }).collect();
        self.send(w, ToWorker::NewConn { lanes, info, origin: Origin::Handler });
    }

    fn worker_messages(&mut self) {
        for w in 0..self.workers.len() {
            while let Some(m) = self.workers[w].from.pop() {
                match m {
                    ToControl::Connect { addr, private_data, token, origin } => {
                        self.start_connect(w, addr, &private_data, token, origin)
                    }
                    ToControl::Disconnect { cm_key } => {
                        if let Some(c) = self.conns.get_mut(&cm_key) {
                            let _ = c.cm.disconnect();
                        }
                    }
                    ToControl::Release { cm_key, qp } => {
                        if let Some(c) = self.conns.remove(&cm_key) {
                            self.workers[c.worker].conns -= 1;
                        }
                        drop(qp);
                    }
                    ToControl::Stopped => self.workers[w].stopped = true,
                }
            }
        }
    }

    fn start_connect(
        &mut self,
        w: usize,
        addr: SocketAddr,
        app: &[u8],
        token: u64,
        origin: Origin,
    ) {
        if self.shutting_down {
            let error = "the engine is shutting down".to_string();
            return self.send(w, ToWorker::ConnectFailed { token, origin, error });
        }
        let mut qp = match self.new_qp(w) {
            Ok(qp) => qp,
            Err(error) => return self.send(w, ToWorker::ConnectFailed { token, origin, error }),
        };
        let (ctx, attr, tx) = (self.ctx.clone(), self.attr, self.connects.0.clone());
        let hdr = header(&self.workers[w].region, app);
        self.connecting += 1;
        let spawned =
            std::thread::Builder::new().name("corelink-connect".into()).spawn(move || {
                let result =
                    ctx.connect(addr, &mut qp, &attr, &hdr, CONNECT_TIMEOUT).map(|cm| (qp, cm));
                let _ = tx.send(Connected {
                    worker: w,
                    token,
                    origin,
                    result: result.map_err(|e| e.to_string()),
                });
            });
        if let Err(e) = spawned {
            self.connecting -= 1;
            let error = format!("cannot start a connector thread: {e}");
            self.send(w, ToWorker::ConnectFailed { token, origin, error });
        }
    }

    fn finish_connects(&mut self) {
        while let Ok(c) = self.connects.1.try_recv() {
            self.connecting -= 1;
            match c.result {
                Ok((qp, cm)) => {
                    let (peer_region, app) = parse_header(cm.peer_private_data());
                    let key = self.next_key;
                    self.next_key += 1;
                    self.conns.insert(key, CtlConn { cm, worker: c.worker });
                    self.workers[c.worker].conns += 1;
                    let info = ConnInfo {
                        private_data: app,
                        peer_region,
                        initiated: true,
                        token: c.token,
                    };
                    let lanes = std::iter::once(NewLane { qp, cm_key: key }).collect();
                    self.send(c.worker, ToWorker::NewConn { lanes, info, origin: c.origin });
                }
                Err(error) => self.send(
                    c.worker,
                    ToWorker::ConnectFailed { token: c.token, origin: c.origin, error },
                ),
            }
        }
    }

    fn watch_events(&mut self) {
        let mut closed = Vec::new();
        for (key, c) in self.conns.iter_mut() {
            if let Ok(Some(CmEvent::Disconnected | CmEvent::DeviceRemoval)) =
                c.cm.poll_event(Duration::ZERO)
            {
                closed.push((*key, c.worker));
            }
        }
        for (key, w) in closed {
            self.send(w, ToWorker::PeerClosed { cm_key: key });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_tolerates_padding() {
        let r = RemoteRegion { addr: 0x1000, len: 64, rkey: 7 };
        let mut h = header(&r, b"app");
        h.resize(56, 0);
        assert_eq!(parse_header(&h), (Some(r), b"app".to_vec()));
        assert_eq!(parse_header(&[]), (None, vec![]));
    }
}
