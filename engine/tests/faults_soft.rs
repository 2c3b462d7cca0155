//! The engine under `soft`'s injected faults (`soft::faults::plan_at`, deterministic from a
//! seed): with 10 % of packets dropped and 5 % duplicated each way, RC resends what was lost
//! and throws duplicates away, so every one of 2,000 messages is echoed once, in order (and
//! so with every message held 500 us each way and 20 % reordered); with
//! every packet dropped, the first send fails with `RetryExcErr` after the lane's retries, the
//! two behind it are flushed as its consequences (`Done::closed_by`), and the connection closes
//! with that reason.

#[path = "common/echo.rs"]
mod echo;

use std::net::SocketAddr;
use std::time::Duration;

use corelink_engine::verbs::soft::faults::{self, FaultPlan};
use corelink_engine::verbs::soft::Soft;
use corelink_engine::verbs::WcStatus;
use corelink_engine::*;
use echo::connect;

const HANG: Duration = Duration::from_secs(60);

fn engine(listen: &str) -> Engine<Soft> {
    engine_with(listen, "")
}

/// An echoing engine listening on `listen`, with `worker` added to its `[worker]` table.
fn engine_with(listen: &str, worker: &str) -> Engine<Soft> {
    echo::engine(listen, worker).0
}

/// Echoes `n` messages over a connection to `server_at` (whose accepted connections get
/// `plan`) from an engine at `client_at`, 16 in flight: each is echoed once, in order. Returns
/// the fault counts before and after.
fn echo_all(
    server_at: &str,
    client_at: &str,
    plan: FaultPlan,
    n: u32,
) -> (faults::FaultCounts, faults::FaultCounts) {
    echo_all_with(server_at, client_at, plan, n, "")
}

/// [`echo_all`] with `worker` added to both engines' `[worker]` tables.
fn echo_all_with(
    server_at: &str,
    client_at: &str,
    plan: FaultPlan,
    n: u32,
    worker: &str,
) -> (faults::FaultCounts, faults::FaultCounts) {
    let addr: SocketAddr = server_at.parse().unwrap();
    faults::plan_at(addr, plan);
    let server = engine_with(server_at, worker);
    let mut client_engine = engine_with(client_at, worker);
    let (mut c, conn) = connect(&mut client_engine, addr);
    let before = faults::counts();
    const WINDOW: u32 = 16;
    let (mut sent, mut echoed) = (0u32, 0u32);
    let send = |c: &mut Client, i: u32| {
        let op = Op::Send { buf: i.to_le_bytes().to_vec(), imm: Some(i) };
        c.submit(conn, op, u64::from(i)).unwrap();
    };
    while sent < WINDOW.min(n) {
        send(&mut c, sent);
        sent += 1;
    }
    while echoed < n {
        match c.wait(HANG) {
            Some(Event::Done(d)) => assert_eq!(d.status, WcStatus::Success, "send {}", d.token),
            Some(Event::Message { data, imm, .. }) => {
                assert_eq!((imm, data), (Some(echoed), echoed.to_le_bytes().to_vec()));
                echoed += 1;
                if sent < n {
                    send(&mut c, sent);
                    sent += 1;
                }
            }
            other => panic!("after {echoed} echoes: {other:?}"),
        }
    }
    let after = faults::counts();
    faults::clear_at(addr);
    drop(c);
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
    (before, after)
}

#[test]
fn drops_and_duplicates_cost_retries_not_messages() {
    let plan = FaultPlan { seed: 11, drop: 0.1, dup: 0.05, ..Default::default() };
    let (before, after) = echo_all("10.83.0.1:7000", "10.83.0.2:7000", plan, 2000);
    assert!(after.dropped > before.dropped && after.retransmitted > before.retransmitted);
    assert!(after.duplicates_discarded > before.duplicates_discarded, "{after:?}");
}

/// A wire that holds every message 500 us each way, reorders 20 % and drops 5 % costs time
/// (RC resends from each gap), not messages or their order.
#[test]
fn a_delay_and_reordering_cost_time_not_messages_or_their_order() {
    let plan =
        FaultPlan { seed: 12, drop: 0.05, delay_us: 500, reorder: 0.2, ..Default::default() };
    let (before, after) = echo_all("10.83.0.5:7000", "10.83.0.6:7000", plan, 300);
    assert!(after.delayed >= before.delayed + 600, "{after:?}: each message and its echo held");
    assert!(after.reordered > before.reordered, "{after:?}");
}

/// Receivers that withhold their receives 30 % of the time (an RNR storm) cost RNR waits and
/// retries (`rnr_retry = 7`: for ever), not messages or their order.
#[test]
fn an_rnr_storm_costs_waits_not_messages() {
    let plan = FaultPlan { seed: 13, rnr: 0.3, ..Default::default() };
    let keys = "rnr_retry = 7\nmin_rnr_timer = 1";
    let (before, after) = echo_all_with("10.83.0.7:7000", "10.83.0.8:7000", plan, 500, keys);
    assert!(after.rnr_naks > before.rnr_naks, "{after:?}");
}

#[test]
fn a_wire_that_drops_everything_fails_the_first_send_after_its_retries() {
    let addr: SocketAddr = "10.83.0.3:7000".parse().unwrap();
    faults::plan_at(addr, FaultPlan { seed: 1, drop: 1.0, ..Default::default() });
    let server = engine("10.83.0.3:7000");
    let mut client_engine = engine("10.83.0.4:7000");
    let (mut c, conn) = connect(&mut client_engine, addr);
    for token in 5..8 {
        c.submit(conn, Op::Send { buf: b"lost".to_vec(), imm: None }, token).unwrap();
    }
    let mut ends = Vec::new();
    loop {
        match c.wait(HANG) {
            Some(Event::Done(d)) => ends.push((d.token, d.status, d.closed_by)),
            Some(Event::Closed { conn: x, reason }) => {
                assert_eq!((x, reason), (conn, CloseReason::Error(WcStatus::RetryExcErr)));
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    // The root cause as such; the two behind it as its consequences.
    let cause = Some(CloseReason::Error(WcStatus::RetryExcErr));
    assert_eq!(
        ends,
        vec![
            (5, WcStatus::RetryExcErr, None),
            (6, WcStatus::WrFlushErr, cause),
            (7, WcStatus::WrFlushErr, cause)
        ]
    );
    faults::clear_at(addr);
    drop(c);
    client_engine.shutdown().unwrap();
    server.shutdown().unwrap();
}

/// Under a plan that drops 30 % and duplicates 20 % of packets, 300 sends submitted at once
/// and the client's engine shut down while they are in flight: every request ends exactly
/// once (a success, its lane's retries exceeded, or flushed by the close), and the shutdown
/// ends.
#[test]
fn every_request_ends_once_under_faults_and_a_shutdown_in_flight() {
    let addr: SocketAddr = "10.83.0.5:7000".parse().unwrap();
    faults::plan_at(addr, FaultPlan { seed: 5, drop: 0.3, dup: 0.2, ..Default::default() });
    let server = engine("10.83.0.5:7000");
    let mut client_engine = engine("10.83.0.6:7000");
    let (mut c, conn) = connect(&mut client_engine, addr);
    const N: u64 = 300;
    for i in 0..N {
        c.submit(conn, Op::Send { buf: i.to_le_bytes().to_vec(), imm: None }, i).unwrap();
    }
    let stopper = std::thread::spawn(move || client_engine.shutdown().map(|_| ()));
    let mut ended = vec![0u32; N as usize];
    let deadline = std::time::Instant::now() + HANG;
    while ended.contains(&0) {
        assert!(std::time::Instant::now() < deadline, "requests never ended: {ended:?}");
        match c.wait(Duration::from_millis(100)) {
            Some(Event::Done(d)) => {
                let ok = [WcStatus::Success, WcStatus::RetryExcErr, WcStatus::WrFlushErr];
                assert!(ok.contains(&d.status), "request {}: {}", d.token, d.status);
                ended[d.token as usize] += 1;
            }
            Some(Event::Refused { token, .. }) => ended[token as usize] += 1,
            Some(Event::Message { .. } | Event::Closed { .. }) | None => {}
            Some(other) => panic!("{other:?}"),
        }
    }
    assert!(ended.iter().all(|&n| n == 1), "each request ends once: {ended:?}");
    stopper.join().unwrap().unwrap();
    faults::clear_at(addr);
    server.shutdown().unwrap();
}
