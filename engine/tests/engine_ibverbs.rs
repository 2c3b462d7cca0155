//! The engine end to end on the `ibverbs` provider (the checks are in `common/e2e.rs`,
//! `common/sched.rs`, `common/memory.rs`, `common/quiet.rs` and `common/contexts.rs`, shared with `engine_soft.rs`,
//! `sched_soft.rs`, `memory_soft.rs` and `contexts_soft.rs`), against the device named by
//! `CORELINK_IBV_DEVICE` (e.g. Soft-RoCE's `rxe0`), on port `CORELINK_IBV_PORT` (default 1)
//! with GID index `CORELINK_IBV_GID_INDEX` (default 0), listening on `CORELINK_IP` with a port
//! the connection manager picks.
//! `tests/rxe-guest/run` sets them all:
//!
//! ```text
//! tests/rxe-guest/run --timeout 300 -- cargo test --offline -p corelink-engine --test engine_ibverbs
//! ```
//!
//! Without `CORELINK_IBV_DEVICE` every test prints `skipped: CORELINK_IBV_DEVICE not set` and
//! passes, so that `cargo test` stays green on a host without RDMA.
#![cfg(feature = "ibverbs")]

#[path = "common/contexts.rs"]
mod contexts;
#[path = "common/e2e.rs"]
mod e2e;
#[path = "common/grant.rs"]
mod grant;
#[path = "common/ibverbs_env.rs"]
mod ibverbs_env;
#[path = "common/memory.rs"]
mod memory;
#[path = "common/quiet.rs"]
mod quiet;
#[path = "common/sched.rs"]
mod sched;

use std::net::{IpAddr, SocketAddr};

use corelink_verbs::ibverbs::Ibverbs;

/// The device's core map (listening on its address, port chosen by the connection manager)
/// and its IP address.
fn target() -> Option<(String, IpAddr)> {
    let (provider, ip) = ibverbs_env::target()?;
    Some((e2e::core_map(&provider, SocketAddr::new(ip, 0)), ip))
}

#[test]
fn every_request_kind_through_the_engine() {
    let Some((map, _)) = target() else { return };
    e2e::every_request_kind_through_the_engine::<Ibverbs>(&map);
}

#[test]
fn quiet_sends_arrive_untold_and_a_close_drains_them() {
    let Some((map, _)) = target() else { return };
    quiet::quiet_sends_arrive_untold_and_a_close_drains_them::<Ibverbs>(&map);
}

#[test]
fn quiet_writes_land_untold_and_a_failure_is_told() {
    let Some((map, _)) = target() else { return };
    quiet::quiet_writes_land_untold_and_a_failure_is_told::<Ibverbs>(&map);
}

#[test]
fn a_client_closes_its_connection() {
    let Some((map, _)) = target() else { return };
    e2e::a_client_closes_its_connection::<Ibverbs>(&map);
}

#[test]
fn every_acknowledged_message_reaches_the_handler_before_its_close() {
    let Some((map, _)) = target() else { return };
    e2e::every_acknowledged_message_reaches_the_handler_before_its_close::<Ibverbs>(&map);
}

/// Defect 1's race across the runner's second wire (rxea accepts, rxeb connects), 50 runs.
#[test]
fn every_acknowledged_message_reaches_the_handler_across_the_wire() {
    let Some([(a, a_ip), (b, b_ip)]) = ibverbs_env::wire() else { return };
    let server = e2e::core_map(&a, SocketAddr::new(a_ip, 0));
    let client = e2e::core_map(&b, SocketAddr::new(b_ip, 0))
        .replace("control_core = 0", "control_core = 1")
        .replace("workers = [1]", "workers = [0]");
    e2e::every_acknowledged_message_reaches_the_handler_across::<Ibverbs>(&server, &client, 50);
}

#[test]
fn shutdown_with_requests_in_flight_completes_each_once() {
    let Some((map, _)) = target() else { return };
    e2e::shutdown_with_requests_in_flight_completes_each_once::<Ibverbs>(&map);
}

#[test]
fn connect_to_nowhere_fails_cleanly() {
    let Some((map, ip)) = target() else { return };
    // Port 1 of the device's own address: nothing listens there, so the peer's connection
    // manager rejects the request.
    e2e::connect_to_nowhere_fails_cleanly::<Ibverbs>(&map, SocketAddr::new(ip, 1), "rejected");
}

/// The device's provider lines and an address on it (port chosen by the connection manager).
fn sched_target() -> Option<(String, SocketAddr)> {
    let (provider, ip) = ibverbs_env::target()?;
    Some((provider, SocketAddr::new(ip, 0)))
}

#[test]
fn sched_reads_overtake_queued_writes() {
    let Some((p, a)) = sched_target() else { return };
    sched::reads_overtake_queued_writes::<Ibverbs>(&p, a, a);
}

#[test]
fn sched_no_starvation_under_a_read_flood() {
    let Some((p, a)) = sched_target() else { return };
    sched::no_starvation_under_a_read_flood::<Ibverbs>(&p, a);
}

#[test]
fn sched_identical_reads_merge() {
    let Some((p, a)) = sched_target() else { return };
    sched::identical_reads_merge::<Ibverbs>(&p, a, a);
}

#[test]
fn sched_adjacent_writes_coalesce() {
    let Some((p, a)) = sched_target() else { return };
    sched::adjacent_writes_coalesce::<Ibverbs>(&p, a);
}

#[test]
fn sched_error_inside_an_unsignalled_run() {
    let Some((p, a)) = sched_target() else { return };
    sched::error_inside_an_unsignalled_run::<Ibverbs>(&p, a);
}

#[test]
fn sched_completions_come_in_batches() {
    let Some((p, a)) = sched_target() else { return };
    sched::completions_come_in_batches::<Ibverbs>(&p, a);
}

#[test]
fn grants_give_exactly_their_ranges_and_rights() {
    let Some((p, a)) = sched_target() else { return };
    memory::grants_give_exactly_their_ranges_and_rights::<Ibverbs>(&p, a);
}

#[test]
fn workers_have_contexts_of_their_own() {
    let Some((p, a)) = sched_target() else { return };
    let (map_a, map_b) = (contexts::core_map(&p, a, 2), contexts::core_map(&p, a, 1));
    contexts::workers_have_contexts_of_their_own::<Ibverbs>(&map_a, &map_b);
}
