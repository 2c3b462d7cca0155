//! A soak run on `soft`: RPC calls and one-sided requests, both under a fault plan that
//! changes every phase (none, drops and duplicates, reordering and delay, an RNR storm, drops
//! that exhaust `retry_cnt` and close connections, completions lost to CQ overruns, all of
//! them), for as long as asked.
//!
//! ```text
//! soak [--seconds S] [--phase-ms MS]
//! ```
//!
//! Two pairs of engines in one process. One pair runs RPC: the client's service keeps 8 ECHO
//! calls in flight (2 s deadlines) on a session it opens again whenever one ends. The other
//! runs the engine directly: the client's handler keeps 16 requests in flight (send, write,
//! read, fetch-and-add, compare-and-swap in turn) on memory its peer granted, and connects
//! again after a close. At each phase the new plan is set on both servers' listeners and both
//! clients close their connection, so that the next one draws the new plan.
//!
//! Each phase prints its plan, the requests' ends by status, the calls' outcomes, the fault
//! counts and the process's resident memory. At the end both clients stop issuing, every
//! request and call must have ended exactly once (issued = ended), and the resident memory of
//! the last phase is compared with the first's. Exit status: 0 when nothing was lost, 1 if
//! something was, 2 on bad usage.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use corelink_config::{parse, StaticTopology, Validated};
use corelink_engine::verbs::soft::faults::{self, FaultCounts, FaultPlan};
use corelink_engine::verbs::soft::Soft;
use corelink_engine::verbs::{chain, AccessFlags, RemoteRegion};
use corelink_engine::*;
use corelink_rpc::{
    Endpoint, EndpointConfig, Reject, ReqType, Rpc, RpcError, RpcHandler, Service, SessionEvent,
    SessionId,
};

#[derive(Parser, Debug)]
#[command(name = "soak", about = "RPC and one-sided load under a rotating fault plan, on soft")]
struct Cli {
    /// How long to run.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// How long each fault plan lasts.
    #[arg(long, default_value_t = 2000)]
    phase_ms: u64,
}

const ECHO: ReqType = ReqType(1);
const CALLS_IN_FLIGHT: u32 = 8;
const REQUESTS_IN_FLIGHT: u32 = 16;
const DEADLINE: Duration = Duration::from_secs(2);
/// The immediate of the message that tells the peer where the granted memory is.
const GRANT_IMM: u32 = 0x6772_6e74;
const BYTES: usize = 1 << 16;

/// The plans, in turn.
fn plans() -> Vec<(&'static str, FaultPlan)> {
    let p = FaultPlan::default;
    vec![
        ("none", p()),
        ("drop 5 %, dup 2 %", FaultPlan { seed: 1, drop: 0.05, dup: 0.02, ..p() }),
        ("reorder 10 %, delay 50 us", FaultPlan { seed: 2, reorder: 0.1, delay_us: 50, ..p() }),
        ("rnr 10 %", FaultPlan { seed: 3, rnr: 0.1, ..p() }),
        ("drop 15 % (closes)", FaultPlan { seed: 4, drop: 0.15, ..p() }),
        (
            "cq overrun 0.1 % (closes, lost completions made up)",
            FaultPlan { seed: 6, cq_overrun: 0.001, ..p() },
        ),
        (
            "everything",
            FaultPlan {
                seed: 5,
                drop: 0.1,
                dup: 0.05,
                reorder: 0.05,
                delay_us: 20,
                rnr: 0.05,
                ..p()
            },
        ),
    ]
}

/// What both clients count (shared with the main thread).
#[derive(Default)]
struct Counts {
    requests_issued: AtomicU64,
    calls_issued: AtomicU64,
    /// Requests' ends by status, calls' outcomes by kind.
    ends: Mutex<BTreeMap<String, u64>>,
    requests_ended: AtomicU64,
    calls_ended: AtomicU64,
    /// Bumped at each phase: the clients close their connection when they see it change.
    phase: AtomicU64,
    stop: AtomicBool,
}

impl Counts {
    fn end(&self, what: String) {
        *self.ends.lock().unwrap().entry(what).or_default() += 1;
    }
}

fn map(listen: &str) -> Result<Validated, String> {
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000\nyield_after_empty_polls = 64\nretry_cnt = 2\n\
         rnr_retry = 7\nmin_rnr_timer = 1"
    );
    let m = parse(&text).map_err(|e| e.to_string())?;
    m.validate(&StaticTopology::uniform(2)).map_err(|e| e.to_string())
}

/// The one-sided server: grants its memory to each connection, echoes sends.
#[derive(Default)]
struct Granter(Option<Memory<Soft>>);

impl Handler<Soft> for Granter {
    fn on_connected(&mut self, cx: &mut Cx<Soft>, conn: ConnId, _info: &ConnInfo) {
        let mem = match &mut self.0 {
            Some(m) => m,
            None => match cx.register_memory(BYTES, false) {
                Ok(m) => self.0.insert(m),
                Err(_) => return,
            },
        };
        let Ok(g) = cx.grant(conn, mem, 0, BYTES, AccessFlags::REMOTE_ALL) else { return };
        let Ok(mut b) = cx.alloc(RemoteRegion::WIRE_BYTES) else { return };
        if b.fill(&g.region.to_bytes()).is_ok() {
            let _ = cx.send(conn, b, Some(GRANT_IMM), 0);
        }
    }

    fn on_message(&mut self, cx: &mut Cx<Soft>, conn: ConnId, msg: &Message<'_>) {
        let Ok(mut b) = cx.alloc(msg.data.len()) else { return };
        if b.fill(msg.data).is_ok() {
            let _ = cx.send(conn, b, None, 0);
        }
    }
}

/// The one-sided client.
struct Issuer {
    to: SocketAddr,
    at: Option<(ConnId, RemoteRegion)>,
    next: u64,
    in_flight: u32,
    phase: u64,
    counts: Arc<Counts>,
}

impl Issuer {
    fn fill(&mut self, cx: &mut Cx<Soft>) {
        let Some((conn, region)) = self.at else { return };
        while self.in_flight < REQUESTS_IN_FLIGHT && !self.counts.stop.load(Relaxed) {
            let i = self.next;
            let slot = (i % 512) * 64;
            let Ok(buf) = cx.alloc(64) else { return };
            let op = match i % 5 {
                0 => Op::Send { buf, imm: None },
                1 => Op::Write { buf, remote: region.at(slot), imm: None },
                2 => Op::Read { buf, remote: region.at(slot) },
                3 => Op::FetchAdd { remote: region.at(slot), add: 1 },
                _ => Op::CompareSwap { remote: region.at(slot + 8), compare: 0, swap: i },
            };
            if cx.submit(conn, op, i).is_err() {
                self.at = None; // (closing: the next connection goes on)
                return;
            }
            self.next += 1;
            self.in_flight += 1;
            self.counts.requests_issued.fetch_add(1, Relaxed);
        }
    }
}

impl Handler<Soft> for Issuer {
    fn poll(&mut self, cx: &mut Cx<Soft>) {
        if cx.metrics().polls == 1 {
            let _ = cx.connect(self.to, b"", 0);
        }
        let phase = self.counts.phase.load(Relaxed);
        if phase != self.phase {
            self.phase = phase;
            if let Some((conn, _)) = self.at.take() {
                let _ = cx.close(conn);
            }
        }
    }

    fn on_connect_failed(&mut self, cx: &mut Cx<Soft>, _token: u64, _error: &EngineError) {
        let _ = cx.connect(self.to, b"", 0);
    }

    fn on_message(&mut self, cx: &mut Cx<Soft>, conn: ConnId, msg: &Message<'_>) {
        if msg.imm == Some(GRANT_IMM) {
            if let Some(region) = RemoteRegion::from_bytes(msg.data) {
                self.at = Some((conn, region));
                self.fill(cx);
            }
        }
    }

    fn on_completion(&mut self, cx: &mut Cx<Soft>, done: Done<Buf<Soft>>) {
        self.in_flight -= 1;
        self.counts.requests_ended.fetch_add(1, Relaxed);
        self.counts.end(format!("request {:?}", done.status));
        self.fill(cx);
    }

    fn on_closed(&mut self, cx: &mut Cx<Soft>, conn: ConnId, _reason: &CloseReason) {
        if self.at.is_some_and(|(c, _)| c == conn) {
            self.at = None;
        }
        if !self.counts.stop.load(Relaxed) {
            let _ = cx.connect(self.to, b"", 0);
        }
    }
}

/// The RPC client's service.
struct Caller {
    to: SocketAddr,
    session: Option<SessionId>,
    in_flight: Arc<AtomicU64>,
    phase: u64,
    counts: Arc<Counts>,
}

fn outcome(r: &Result<&[u8], RpcError>) -> String {
    match r {
        Ok(_) => "call ok".into(),
        Err(RpcError::Timeout) => "call timed out".into(),
        Err(RpcError::SessionClosed) => "call: session closed".into(),
        Err(e) => format!("call failed: {e}"),
    }
}

impl Caller {
    fn fill(&mut self, rpc: &mut Rpc<'_, Soft>) {
        let Some(s) = self.session else { return };
        while self.in_flight.load(Relaxed) < u64::from(CALLS_IN_FLIGHT)
            && !self.counts.stop.load(Relaxed)
        {
            let (counts, in_flight) = (self.counts.clone(), self.in_flight.clone());
            let made = rpc.call(s, ECHO, b"soak", DEADLINE, move |_, r| {
                counts.calls_ended.fetch_add(1, Relaxed);
                counts.end(outcome(&r));
                in_flight.fetch_sub(1, Relaxed);
            });
            if made.is_err() {
                return;
            }
            self.in_flight.fetch_add(1, Relaxed);
            self.counts.calls_issued.fetch_add(1, Relaxed);
        }
    }
}

impl Service<Soft> for Caller {
    fn poll(&mut self, rpc: &mut Rpc<'_, Soft>) {
        if self.session.is_none() && !self.counts.stop.load(Relaxed) {
            self.session = rpc.connect(self.to).ok();
        }
        let phase = self.counts.phase.load(Relaxed);
        if phase != self.phase {
            self.phase = phase;
            // (a session this side closes is gone at once: its calls end, no event follows)
            if let Some(s) = self.session.take() {
                let _ = rpc.close(s);
            }
        }
        self.fill(rpc);
    }

    fn on_session(&mut self, rpc: &mut Rpc<'_, Soft>, session: SessionId, event: SessionEvent) {
        match event {
            SessionEvent::Connected => self.fill(rpc),
            SessionEvent::Closed if self.session == Some(session) => self.session = None,
            _ => {}
        }
    }
}

/// A service that only serves.
struct Serve;
impl Service<Soft> for Serve {}

fn rpc_engine<S: Service<Soft> + 'static>(
    listen: &str,
    make: impl Fn() -> S + Send + Sync + 'static,
) -> Result<Engine<Soft>, String> {
    let map = map(listen)?;
    let res = map.map.worker.clone();
    Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| {
        let mut ep = Endpoint::new(EndpointConfig::for_worker(&res), &res).expect("an endpoint");
        ep.register(ECHO, |req, resp| resp.write(req.data).map_err(|_| Reject(1))).expect("ECHO");
        RpcHandler::new(ep, make())
    })
    .map_err(|e| chain(&e).to_string())
}

/// The process's resident memory, in KiB (0 when it cannot be read).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or("");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
}

fn delta(a: &FaultCounts, b: &FaultCounts) -> String {
    format!(
        "dropped {}, resent {}, retry exceeded {}, duplicates {}, reordered {}, delayed {}, \
         rnr {}, cq overruns {}",
        b.dropped - a.dropped,
        b.retransmitted - a.retransmitted,
        b.retry_exceeded - a.retry_exceeded,
        b.duplicates_discarded + b.duplicates_delivered
            - a.duplicates_discarded
            - a.duplicates_delivered,
        b.reordered - a.reordered,
        b.delayed - a.delayed,
        b.rnr_naks - a.rnr_naks,
        b.cq_overruns - a.cq_overruns,
    )
}

fn run(cli: &Cli) -> Result<bool, String> {
    let (one_sided_at, rpc_at) = ("10.91.0.1:7000", "10.91.0.3:7000");
    let counts = Arc::new(Counts::default());
    let granter =
        Engine::<Soft>::start(&map(one_sided_at)?, Placement::RoundRobin, |_| Granter::default())
            .map_err(|e| chain(&e).to_string())?;
    let c2 = counts.clone();
    let to: SocketAddr = one_sided_at.parse().map_err(|e| format!("{e}"))?;
    let issuer = Engine::<Soft>::start(&map("10.91.0.2:7000")?, Placement::RoundRobin, move |_| {
        Issuer { to, at: None, next: 0, in_flight: 0, phase: 0, counts: c2.clone() }
    })
    .map_err(|e| chain(&e).to_string())?;
    let rpc_server = rpc_engine(rpc_at, || Serve)?;
    let c3 = counts.clone();
    let rpc_to: SocketAddr = rpc_at.parse().map_err(|e| format!("{e}"))?;
    let caller = rpc_engine("10.91.0.4:7000", move || Caller {
        to: rpc_to,
        session: None,
        in_flight: Arc::new(AtomicU64::new(0)),
        phase: 0,
        counts: c3.clone(),
    })?;
    let (plans, phase_len) = (plans(), Duration::from_millis(cli.phase_ms.max(100)));
    let end = Instant::now() + Duration::from_secs(cli.seconds);
    let mut rss = Vec::new();
    let mut phase = 0usize;
    while Instant::now() < end {
        let (name, plan) = plans[phase % plans.len()];
        faults::plan_at(one_sided_at.parse().map_err(|e| format!("{e}"))?, plan);
        faults::plan_at(rpc_to, plan);
        counts.phase.fetch_add(1, Relaxed);
        let (f0, e0) = (faults::counts(), counts.ends.lock().unwrap().clone());
        std::thread::sleep(phase_len.min(end.saturating_duration_since(Instant::now())));
        let (f1, e1) = (faults::counts(), counts.ends.lock().unwrap().clone());
        let ends: Vec<String> = e1
            .iter()
            .map(|(k, v)| (k, v - e0.get(k).copied().unwrap_or(0)))
            .filter(|(_, v)| *v > 0)
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        rss.push(rss_kib());
        println!(
            "phase {phase} ({name}): {}; faults: {}; RSS {} KiB",
            ends.join(", "),
            delta(&f0, &f1),
            rss[rss.len() - 1]
        );
        phase += 1;
    }
    // Stop issuing; what is in flight ends (deadlines bound the calls).
    counts.stop.store(true, Relaxed);
    faults::clear_at(one_sided_at.parse().map_err(|e| format!("{e}"))?);
    faults::clear_at(rpc_to);
    let settle = Instant::now() + Duration::from_secs(30);
    let settled = |c: &Counts| {
        c.requests_ended.load(Relaxed) == c.requests_issued.load(Relaxed)
            && c.calls_ended.load(Relaxed) == c.calls_issued.load(Relaxed)
    };
    while !settled(&counts) && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(10));
    }
    let ok = settled(&counts);
    println!(
        "requests: {} issued, {} ended; calls: {} issued, {} ended",
        counts.requests_issued.load(Relaxed),
        counts.requests_ended.load(Relaxed),
        counts.calls_issued.load(Relaxed),
        counts.calls_ended.load(Relaxed)
    );
    println!("ends over the run: {:?}", counts.ends.lock().unwrap());
    if let (Some(first), Some(last)) = (rss.first(), rss.last()) {
        let ratio = *last as f64 / (*first).max(1) as f64;
        println!("RSS: first phase {first} KiB, last {last} KiB ({ratio:.2} x)");
    }
    for e in [caller, rpc_server, issuer, granter] {
        e.shutdown().map_err(|e| chain(&e).to_string())?;
    }
    Ok(ok)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("soak: FAILED: something issued never ended");
            std::process::ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("soak: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
