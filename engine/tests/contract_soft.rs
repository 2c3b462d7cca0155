//! The engine's contract under a seeded fault plan (`soft::faults`): every submitted request
//! ends exactly once, for both kinds of issuer (a handler on the worker, an external
//! `Client`), over a long run of mixed operations (send, write, read, fetch-and-add,
//! compare-and-swap) on a wire that drops 10 % of packets with `retry_cnt = 2` (so that now and
//! then a request fails with `RetryExcErr` and its connection closes), duplicates, reorders,
//! delays and withholds receives. Each issuer reconnects after a close and goes on until it has
//! submitted its share; the ledger then holds every token once, and each request flushed by a
//! close names that close as its cause (`Done::closed_by`).

#[path = "common/grant.rs"]
mod grant;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::soft::faults::{self, FaultPlan};
use corelink_engine::verbs::soft::Soft;
use corelink_engine::verbs::{RemoteRegion, WcStatus};
use corelink_engine::*;

const HANG: Duration = Duration::from_secs(120);
/// Requests each issuer submits.
const PER_ISSUER: u64 = 10_000;
/// In flight per issuer.
const WINDOW: u32 = 16;
/// The client's tokens start here (the handler's at 0).
const CLIENT_BASE: u64 = 1 << 32;

/// How each request ended, by token (`None`: refused by the worker, its connection closing).
#[derive(Default)]
struct Ledger {
    ends: HashMap<u64, Option<WcStatus>>,
    /// Tokens that ended twice (must stay empty).
    twice: Vec<u64>,
    /// Submissions handed back at once (their connection was closing): tried again on the
    /// next connection, never counted as requests.
    handed_back: u64,
    /// Flushes that did not name their close.
    unexplained_flushes: u64,
    closes: u64,
}

impl Ledger {
    fn end(&mut self, token: u64, status: Option<WcStatus>, closed_by: Option<CloseReason>) {
        if self.ends.insert(token, status).is_some() {
            self.twice.push(token);
        }
        if status == Some(WcStatus::WrFlushErr) && closed_by.is_none() {
            self.unexplained_flushes += 1;
        }
    }
}

/// The `i`-th request of an issuer: the five operations in turn, on the granted region.
fn op_for<B>(i: u64, region: &RemoteRegion, buf: impl FnOnce(usize) -> B) -> Op<B> {
    let slot = (i % 1024) * 64;
    match i % 5 {
        0 => Op::Send { buf: buf(8), imm: None },
        1 => Op::Write { buf: buf(64), remote: region.at(slot), imm: None },
        2 => Op::Read { buf: buf(64), remote: region.at(slot) },
        3 => Op::FetchAdd { remote: region.at(slot), add: 1 },
        _ => Op::CompareSwap { remote: region.at(slot + 8), compare: 0, swap: i },
    }
}

/// The accepting side: grants its memory to each connection, echoes sends.
#[derive(Default)]
struct Server(grant::Granter<Soft>);

impl Handler<Soft> for Server {
    fn on_connected(&mut self, cx: &mut Cx<Soft>, conn: ConnId, _info: &ConnInfo) {
        self.0.grant(cx, conn);
    }

    fn on_message(&mut self, cx: &mut Cx<Soft>, conn: ConnId, msg: &Message<'_>) {
        let Ok(mut b) = cx.alloc(msg.data.len()) else { return };
        if b.fill(msg.data).is_ok() {
            let _ = cx.send(conn, b, None, 0);
        }
    }
}

/// The handler that issues: connects at start and again after each close, and keeps
/// `WINDOW` requests in flight once its peer granted memory.
struct Issuer {
    to: SocketAddr,
    at: Option<(ConnId, RemoteRegion)>,
    next: u64,
    in_flight: u32,
    ledger: Arc<Mutex<Ledger>>,
}

impl Issuer {
    fn fill(&mut self, cx: &mut Cx<Soft>) {
        let Some((conn, region)) = self.at else { return };
        while self.in_flight < WINDOW && self.next < PER_ISSUER {
            let token = self.next;
            let op = op_for(token, &region, |n| cx.alloc(n).unwrap());
            match cx.submit(conn, op, token) {
                Ok(()) => {
                    self.next += 1;
                    self.in_flight += 1;
                }
                Err(_) => {
                    // Closing: this one goes on the next connection.
                    self.ledger.lock().unwrap().handed_back += 1;
                    self.at = None;
                    return;
                }
            }
        }
    }
}

impl Handler<Soft> for Issuer {
    fn poll(&mut self, cx: &mut Cx<Soft>) {
        if cx.metrics().polls == 1 {
            cx.connect(self.to, b"", 1).unwrap();
        }
    }

    fn on_connect_failed(&mut self, cx: &mut Cx<Soft>, _token: u64, _error: &EngineError) {
        cx.connect(self.to, b"", 1).unwrap();
    }

    fn on_message(&mut self, cx: &mut Cx<Soft>, conn: ConnId, msg: &Message<'_>) {
        if let Some(region) = grant::granted(msg) {
            self.at = Some((conn, region));
            self.fill(cx);
        }
    }

    fn on_completion(&mut self, cx: &mut Cx<Soft>, done: Done<Buf<Soft>>) {
        if done.token >= CLIENT_BASE {
            return; // (the server's echoes land as messages, never here)
        }
        self.ledger.lock().unwrap().end(done.token, Some(done.status), done.closed_by);
        self.in_flight -= 1;
        self.fill(cx);
    }

    fn on_closed(&mut self, cx: &mut Cx<Soft>, conn: ConnId, _reason: &CloseReason) {
        if self.at.is_some_and(|(c, _)| c == conn) {
            self.at = None;
        }
        self.ledger.lock().unwrap().closes += 1;
        if self.next < PER_ISSUER || self.in_flight > 0 {
            cx.connect(self.to, b"", 1).unwrap();
        }
    }
}

fn map(listen: &str) -> corelink_config::Validated {
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000\nretry_cnt = 2\nrnr_retry = 7\nmin_rnr_timer = 1"
    );
    parse(&text).unwrap().validate(&MachineTopology::load().unwrap()).unwrap()
}

/// The client's run: connects, waits for the grant, keeps `WINDOW` in flight, reconnects after
/// each close, until it has submitted its share and every request ended.
fn client_run(c: &mut Client, to: SocketAddr, ledger: &Mutex<Ledger>) {
    let deadline = Instant::now() + HANG;
    let (mut next, mut in_flight) = (0u64, 0u32);
    let mut at: Option<(ConnId, RemoteRegion)> = None;
    c.connect(to, b"", 2).unwrap();
    while next < PER_ISSUER || in_flight > 0 {
        assert!(Instant::now() < deadline, "the client's run hung at {next} ({in_flight} out)");
        if let Some((conn, region)) = at {
            while in_flight < WINDOW && next < PER_ISSUER {
                let token = CLIENT_BASE + next;
                let op = op_for(next, &region, |n| vec![0u8; n]);
                match c.submit(conn, op, token) {
                    Ok(()) => {
                        next += 1;
                        in_flight += 1;
                    }
                    Err(_) => {
                        ledger.lock().unwrap().handed_back += 1;
                        break;
                    }
                }
            }
        }
        match c.wait(Duration::from_secs(5)) {
            Some(Event::Done(d)) => {
                ledger.lock().unwrap().end(d.token, Some(d.status), d.closed_by);
                in_flight -= 1;
            }
            Some(Event::Refused { conn, token, .. }) => {
                // The worker refused it as it took it (its connection was closing): its end.
                // (A refusal may come after the next connection's grant, for a request made
                // on the last one: only a refusal on the connection in use stops its use.)
                ledger.lock().unwrap().end(token, None, None);
                in_flight -= 1;
                if at.is_some_and(|(c, _)| c == conn) {
                    at = None;
                }
            }
            Some(e @ Event::Message { .. }) => {
                if let Some(region) = grant::granted_event(&e) {
                    if let Event::Message { conn, .. } = e {
                        at = Some((conn, region));
                    }
                }
            }
            Some(Event::Closed { conn, .. }) => {
                if at.is_some_and(|(c, _)| c == conn) {
                    at = None;
                }
                ledger.lock().unwrap().closes += 1;
                c.connect(to, b"", 2).unwrap();
            }
            Some(Event::ConnectFailed { .. }) => c.connect(to, b"", 2).unwrap(),
            Some(_) | None => {}
        }
    }
}

/// What a run came to.
struct Outcome {
    by_status: HashMap<Option<WcStatus>, u64>,
    closes: u64,
    faults: faults::FaultCounts,
    made_up: u64,
}

/// Both issuers' runs against a server, with `plan` on the server's connections (both ends);
/// checks that every request ended exactly once, each flush naming its close.
fn run(server_addr: &str, client_addr: &str, plan: FaultPlan) -> Outcome {
    let to: SocketAddr = server_addr.parse().unwrap();
    faults::plan_at(to, plan);
    let before = faults::counts();
    let server =
        Engine::<Soft>::start(&map(server_addr), Placement::RoundRobin, |_| Server::default())
            .unwrap();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let l2 = ledger.clone();
    let mut client_engine =
        Engine::<Soft>::start(&map(client_addr), Placement::RoundRobin, move |_| Issuer {
            to,
            at: None,
            next: 0,
            in_flight: 0,
            ledger: l2.clone(),
        })
        .unwrap();
    let mut c = client_engine.client(0).unwrap();
    client_run(&mut c, to, &ledger);
    // The handler's share ends too.
    let deadline = Instant::now() + HANG;
    while ledger.lock().unwrap().ends.len() < 2 * PER_ISSUER as usize {
        assert!(Instant::now() < deadline, "the handler's run hung");
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = faults::counts();
    faults::clear_at(to);
    drop(c);
    let made_up = client_engine
        .metrics()
        .iter()
        .chain(server.metrics().iter())
        .map(|m| m.completions_made_up)
        .sum();
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
    let l = ledger.lock().unwrap();
    assert!(l.twice.is_empty(), "ended twice: {:?}", l.twice);
    for base in [0, CLIENT_BASE] {
        let mine = (base..base + PER_ISSUER).filter(|t| l.ends.contains_key(t)).count();
        assert_eq!(mine as u64, PER_ISSUER, "every request of the issuer at {base} ended");
    }
    assert_eq!(l.ends.len() as u64, 2 * PER_ISSUER, "nothing ended that was not submitted");
    assert_eq!(l.unexplained_flushes, 0, "every flush names the close it came from");
    let mut by_status: HashMap<Option<WcStatus>, u64> = HashMap::new();
    for s in l.ends.values() {
        *by_status.entry(*s).or_default() += 1;
    }
    let faults = faults::FaultCounts {
        dropped: after.dropped - before.dropped,
        retransmitted: after.retransmitted - before.retransmitted,
        retry_exceeded: after.retry_exceeded - before.retry_exceeded,
        duplicates_discarded: after.duplicates_discarded - before.duplicates_discarded,
        duplicates_delivered: after.duplicates_delivered - before.duplicates_delivered,
        delayed: after.delayed - before.delayed,
        reordered: after.reordered - before.reordered,
        rnr_naks: after.rnr_naks - before.rnr_naks,
        cm_events_lost: after.cm_events_lost - before.cm_events_lost,
        cm_events_delayed: after.cm_events_delayed - before.cm_events_delayed,
        cq_overruns: after.cq_overruns - before.cq_overruns,
    };
    println!(
        "{} requests (None: refused as taken): {by_status:?}; {} submissions handed back; \
         {} closes; {made_up} completions made up; faults {faults:?}",
        l.ends.len(),
        l.handed_back,
        l.closes,
    );
    Outcome { by_status, closes: l.closes, faults, made_up }
}

#[test]
fn every_request_of_both_issuers_ends_once_under_a_seeded_fault_plan() {
    let plan = FaultPlan {
        seed: 21,
        drop: 0.1,
        dup: 0.05,
        reorder: 0.05,
        delay_us: 20,
        rnr: 0.05,
        ..Default::default()
    };
    let o = run("10.84.0.1:7000", "10.84.0.2:7000", plan);
    assert!(o.by_status.get(&Some(WcStatus::Success)).copied().unwrap_or(0) > PER_ISSUER);
    assert!(o.closes >= 1, "the plan closed connections on the way");
}

/// Completions lost to CQ overruns (a plan's `cq_overrun`: the completion is gone, and with it
/// the news of the unsignalled requests before it; the CQ raises `IBV_EVENT_CQ_ERR`): each
/// overrun closes the worker's connections with `CloseReason::Device(CqErr)`, and what they
/// had posted, whose completions will never come, the worker ends itself after
/// `UNTRUSTED_FLUSH_WAIT` (as flushed, naming that close). Every request still ends exactly
/// once, and both engines shut down. Before, the requests of a lost completion never ended,
/// their connection never finished closing, and the run hung.
#[test]
fn every_request_ends_once_when_completions_are_lost_to_cq_overruns() {
    let plan = FaultPlan { seed: 9, cq_overrun: 0.002, ..Default::default() };
    let o = run("10.84.0.3:7000", "10.84.0.4:7000", plan);
    assert!(o.faults.cq_overruns >= 1, "the plan lost completions: {:?}", o.faults);
    assert!(o.made_up >= 1, "the workers made up for lost completions");
    assert!(o.closes >= 1, "each overrun closed connections");
    assert!(o.by_status.get(&Some(WcStatus::Success)).copied().unwrap_or(0) > PER_ISSUER);
}
