//! Starting and stopping an engine: the control core, the pinned workers, the rings between
//! them, and a graceful shutdown that joins every thread.

use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use corelink_config::{PinPolicy, Validated};
use corelink_verbs::{Context, Provider, QpAttr, QpCap};

use crate::client::Client;
use crate::control::{Budget, Command, Control, ControlCfg, Placement, QpPool, WorkerLink};
use crate::device::WorkerContext;
use crate::error::{EngineError, Result};
use crate::handoff::ToWorker;
use crate::metrics::{ControlMetrics, Metrics};
use crate::ring::ring;
use crate::tunables::{CLIENT_RING, CONTROL_RING, MAX_CLIENTS_PER_WORKER, MAX_POLL_BATCH, MAX_SGE};
use crate::worker::{Handler, Owned, Worker, WorkerCfg};

/// A running engine.
pub struct Engine<P: Provider> {
    commands: mpsc::Sender<Command<P>>,
    /// Clients' connects, straight to the control core.
    connects: mpsc::Sender<crate::client::ConnectOrder>,
    /// Ends the control core's wait (after a command).
    wake: corelink_verbs::Waker,
    control: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    threads: Vec<std::thread::Thread>,
    metrics: Vec<Arc<Mutex<Metrics>>>,
    control_metrics: Arc<Mutex<ControlMetrics>>,
    clients: Vec<usize>,
    listen_addr: Option<SocketAddr>,
}

impl<P: Provider> std::fmt::Debug for Engine<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("workers", &self.workers.len())
            .field("listen", &self.listen_addr)
            .finish()
    }
}

/// Pins the calling thread to `core`; with `pin = "require"` a failure is an error, else it
/// is said on stderr and the thread runs unpinned. Returns whether it is pinned.
fn pin(what: &str, core: usize, policy: PinPolicy) -> Result<bool> {
    if core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        return Ok(true);
    }
    match policy {
        PinPolicy::Require => Err(EngineError::Pin { what: what.into(), core }),
        _ => {
            eprintln!(
                "corelink: {what} cannot be pinned to core {core}: it runs unpinned (pin = \
                 \"require\" refuses to start instead)"
            );
            Ok(false)
        }
    }
}

fn spawn_err(what: String) -> impl FnOnce(std::io::Error) -> EngineError {
    move |source| EngineError::Spawn { what, source }
}

impl<P: Provider> Engine<P> {
    /// Starts an engine from a validated core map: opens the device, pins the control core
    /// and one worker per core, and (with `listen` set) accepts connections. `handler` makes
    /// each worker's handler on that worker's thread.
    ///
    /// The control core keeps the context it opened for the connection manager (listen,
    /// connect, accept); each worker's PD, CQ, QPs and buffers are on a device context of its
    /// own ([`corelink_verbs::Context::open_sibling`]), so that workers share no doorbell. A
    /// worker whose context cannot be opened shares the control core's: it says so on stderr
    /// at start, with the reason, and in [`Metrics::own_context`].
    pub fn start<H, F>(cfg: &Validated, placement: Placement, handler: F) -> Result<Engine<P>>
    where
        H: Handler<P>,
        F: Fn(usize) -> H + Send + Sync + 'static,
    {
        let map = &cfg.map;
        let want = match map.provider {
            corelink_config::ProviderKind::Soft => "soft",
            corelink_config::ProviderKind::Ibverbs => "ibverbs",
        };
        if want != P::NAME {
            return Err(EngineError::WrongProvider { map: want, engine: P::NAME });
        }
        let device = match &cfg.device {
            Some(d) => d.clone(),
            None => P::devices()?
                .first()
                .map(|d| d.name.clone())
                .ok_or(EngineError::NoDevice { provider: P::NAME })?,
        };
        let ctx = Arc::new(P::open(&device)?);
        let w = &map.worker;
        let attr = QpAttr {
            port: map.port,
            // (validated: 0..=255)
            sgid_index: u8::try_from(map.gid_index).unwrap_or(u8::MAX),
            min_rnr_timer: w.min_rnr_timer,
            rnr_retry: w.rnr_retry,
            timeout: w.timeout,
            retry_cnt: w.retry_cnt,
            // The scheduler keeps at most this many reads and atomics on a QP: the QP takes as
            // many, as initiator and as target (the device's caps clamp both; validated:
            // 1..=255).
            max_rd_atomic: u8::try_from(w.scheduler.max_rd_atomic).unwrap_or(u8::MAX),
            max_dest_rd_atomic: u8::try_from(w.scheduler.max_rd_atomic).unwrap_or(u8::MAX),
            ..QpAttr::default()
        };
        let cap = QpCap {
            max_send_wr: w.send_queue_depth,
            max_recv_wr: w.recv_queue_depth,
            max_send_sge: if w.scheduler.coalesce_writes { MAX_SGE as u32 } else { 1 },
            max_recv_sge: 1,
            max_inline_data: w.max_inline,
        };
        let listener = match cfg.listen {
            Some(a) => Some(ctx.listen(a)?),
            None => None,
        };
        let listen_addr = listener.as_ref().map(corelink_verbs::Listener::local_addr);
        // The control core sleeps until a connection-manager object of its own has an event,
        // or a worker or the application tells it something (they wake it with `wake`).
        let waiter = P::cm_waiter()?;
        let wake = corelink_verbs::CmWaiter::waker(&waiter);
        let handler = Arc::new(handler);
        let wcfg = WorkerCfg::from_map(w, (w.poll_budget as usize).clamp(1, MAX_POLL_BATCH));
        let pin_policy = map.pin;

        let mut links = Vec::new();
        let mut workers = Vec::new();
        let mut threads = Vec::new();
        let mut metrics = Vec::new();
        for (i, &core) in cfg.workers.iter().enumerate() {
            let wctx = if w.own_context {
                WorkerContext::open(i, &ctx, |c| c.open_sibling())
            } else {
                WorkerContext::shared(&ctx)
            };
            let pd = Arc::new(wctx.ctx.alloc_pd()?);
            let cq = Arc::new(wctx.ctx.create_cq(w.cq_depth)?);
            let own_context = wctx.own;
            // (a context shared with the control core: its events are not the worker's)
            let own = own_context.then(|| wctx.ctx.clone());
            // The worker's QPs, made ahead on its PD and CQ (ready in INIT until a connection).
            let qps = QpPool::new(
                i,
                (pd.clone(), cq.clone()),
                cap,
                &attr,
                w.qps.pool as usize,
                w.qps.max as usize,
            )?;
            let (to_w, from_c) = ring(CONTROL_RING);
            let (to_c, from_w) = ring(CONTROL_RING);
            let published =
                Arc::new(Mutex::new(Metrics { worker: i, own_context, ..Metrics::default() }));
            metrics.push(published.clone());
            let (h, pd2, cq2, wcfg) = (handler.clone(), pd.clone(), cq.clone(), wcfg.clone());
            let wake2 = wake.clone();
            let res = w.clone();
            let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
            let jh = std::thread::Builder::new()
                .name(format!("corelink-worker-{i}"))
                .spawn(move || {
                    let pinned = match pin(&format!("worker {i}"), core, pin_policy) {
                        Ok(p) => p,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    // Everything the worker owns is made here, on its own core (first touch).
                    let built = Worker::new(
                        i,
                        &res,
                        wcfg,
                        Owned {
                            cq: cq2,
                            pd: pd2,
                            own_context: own,
                            to_control: to_c,
                            from_control: from_c,
                            wake: wake2,
                        },
                        published,
                        pinned,
                        h(i),
                    );
                    let worker = match built {
                        Ok(w) => w,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    worker.run();
                })
                .map_err(spawn_err(format!("worker {i} on core {core}")))?;
            ready_rx
                .recv()
                .map_err(|_| EngineError::Panicked { what: format!("worker {i}") })??;
            threads.push(jh.thread().clone());
            links.push(WorkerLink {
                to: to_w,
                from: from_w,
                thread: jh.thread().clone(),
                qps,
                budget: Budget::new(i, w),
                lanes: 0,
                stopped: false,
                wake: false,
                shares_context: !own_context,
            });
            workers.push(jh);
        }
        let (tx, rx) = mpsc::channel();
        let (connects, connects_rx) = mpsc::channel();
        let control_metrics = Arc::new(Mutex::new(ControlMetrics::default()));
        let cfg = ControlCfg {
            placement,
            attr,
            per_conn: w.qps.per_conn as usize,
            recv_size: w.recv_size,
            accept_foreign: map.accept_foreign,
            connect_timeout: std::time::Duration::from_millis(map.connect_timeout_ms.into()),
        };
        let control = Control::new(
            ctx,
            listener,
            waiter,
            links,
            (rx, connects_rx),
            cfg,
            control_metrics.clone(),
        );
        let control_core = map.control_core;
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let control = std::thread::Builder::new()
            .name("corelink-control".into())
            .spawn(move || match pin("the control core", control_core, pin_policy) {
                Ok(_) => {
                    let _ = ready_tx.send(Ok(()));
                    control.run();
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(spawn_err(format!("control core {control_core}")))?;
        ready_rx.recv().map_err(|_| EngineError::Panicked { what: "control core".into() })??;
        let n = workers.len();
        Ok(Engine {
            commands: tx,
            connects,
            wake,
            control: Some(control),
            workers,
            threads,
            metrics,
            control_metrics,
            clients: vec![0; n],
            listen_addr,
        })
    }

    /// The address the control core listens on (with its port chosen, if the map said 0).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listen_addr
    }

    /// Workers.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// A new external client of worker `worker`.
    pub fn client(&mut self, worker: usize) -> Result<Client> {
        let workers = self.threads.len();
        let thread = self
            .threads
            .get(worker)
            .cloned()
            .ok_or(EngineError::NoSuchWorker { worker, workers })?;
        if self.clients[worker] >= MAX_CLIENTS_PER_WORKER {
            return Err(EngineError::Limit {
                worker,
                limit: crate::error::Limit::Clients,
                max: MAX_CLIENTS_PER_WORKER as u64,
                in_use: self.clients[worker] as u64,
                need: 1,
            });
        }
        let number = self.clients[worker] as u16;
        self.clients[worker] += 1;
        let (submit, requests) = ring(CLIENT_RING);
        let (w_events, events) = ring(CLIENT_RING);
        let overflow = crate::client::Overflow::default();
        let waiter = Arc::<crate::client::Waiter>::default();
        let add = ToWorker::AddClient {
            number,
            requests,
            events: w_events,
            overflow: overflow.clone(),
            waiter: waiter.clone(),
        };
        self.commands
            .send(Command::ToWorker(worker, add))
            .map_err(|_| EngineError::ShuttingDown)?;
        self.wake.wake();
        let (connects, wake) = (self.connects.clone(), self.wake.clone());
        Ok(Client {
            worker,
            submit,
            events,
            overflow,
            thread,
            waiter,
            number,
            connects,
            wake,
            held: None,
        })
    }

    /// Every worker's metrics, as last published (every few thousand iterations and at exit).
    pub fn metrics(&self) -> Vec<Metrics> {
        self.metrics.iter().map(|m| m.lock().map(|m| m.clone()).unwrap_or_default()).collect()
    }

    /// The control core's counters (connections and QPs by worker), as last published (when
    /// they change).
    pub fn control_metrics(&self) -> ControlMetrics {
        self.control_metrics.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Stops accepting, lets in-flight requests finish (or flush after a grace period),
    /// disconnects every connection, and joins every thread.
    pub fn shutdown(mut self) -> Result<Vec<Metrics>> {
        self.stop()
    }

    fn stop(&mut self) -> Result<Vec<Metrics>> {
        let _ = self.commands.send(Command::Shutdown);
        self.wake.wake();
        if let Some(c) = self.control.take() {
            for t in &self.threads {
                t.unpark();
            }
            c.join().map_err(|_| EngineError::Panicked { what: "control core".into() })?;
        }
        for (i, w) in self.workers.drain(..).enumerate() {
            w.join().map_err(|_| EngineError::Panicked { what: format!("worker {i}") })?;
        }
        Ok(self.metrics())
    }
}

impl<P: Provider> Drop for Engine<P> {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
