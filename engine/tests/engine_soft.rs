//! The engine end to end on the `soft` provider (the checks are in `common/e2e.rs`, shared with
//! `engine_ibverbs.rs`): one engine connects to itself through its control core; the worker's
//! handler echoes messages; an external client issues every request kind; shutdown with
//! requests in flight gives each exactly one completion. Each test listens on its own address
//! of the process-wide soft fabric.

#[path = "common/e2e.rs"]
mod e2e;
#[path = "common/grant.rs"]
mod grant;
#[path = "common/quiet.rs"]
mod quiet;

use corelink_verbs::soft::Soft;

fn map(listen: &str) -> String {
    e2e::core_map("provider = \"soft\"", listen.parse().unwrap())
}

#[test]
fn every_request_kind_through_the_engine() {
    e2e::every_request_kind_through_the_engine::<Soft>(&map("10.99.0.1:0"));
}

#[test]
fn shutdown_with_requests_in_flight_completes_each_once() {
    e2e::shutdown_with_requests_in_flight_completes_each_once::<Soft>(&map("10.99.0.2:0"));
}

#[test]
fn connect_to_nowhere_fails_cleanly() {
    e2e::connect_to_nowhere_fails_cleanly::<Soft>(
        &map("10.99.0.3:0"),
        "10.99.9.9:1".parse().unwrap(),
        "rejected",
    );
}

#[test]
fn a_client_closes_its_connection() {
    e2e::a_client_closes_its_connection::<Soft>(&map("10.99.0.4:0"));
}

/// Defect 1's race between two engines (two soft ports), 50 runs in a row.
#[test]
fn every_acknowledged_message_reaches_the_handler_across_two_engines() {
    let (server, client) = (map("10.99.0.6:0"), map("10.99.0.7:0"));
    e2e::every_acknowledged_message_reaches_the_handler_across::<Soft>(&server, &client, 50);
}

#[test]
fn every_acknowledged_message_reaches_the_handler_before_its_close() {
    e2e::every_acknowledged_message_reaches_the_handler_before_its_close::<Soft>(&map(
        "10.99.0.5:0",
    ));
}

#[test]
fn quiet_sends_arrive_untold_and_a_close_drains_them() {
    quiet::quiet_sends_arrive_untold_and_a_close_drains_them::<Soft>(&map("10.99.0.8:0"));
}

#[test]
fn quiet_writes_land_untold_and_a_failure_is_told() {
    quiet::quiet_writes_land_untold_and_a_failure_is_told::<Soft>(&map("10.99.0.18:0"));
}
