//! The RPC layer's checks on the `ibverbs` provider (the checks are in `common/*.rs`, shared
//! with the `*_soft.rs` tests), against the device named by `CORELINK_IBV_DEVICE` (e.g.
//! Soft-RoCE's `rxe0`), on port `CORELINK_IBV_PORT` (default 1) with GID index
//! `CORELINK_IBV_GID_INDEX` (default 0), each test's engines listening on `CORELINK_IP` with a
//! port of their own (the tests of this binary run at once, in one process; the ports are below
//! the connection manager's ephemeral range). `tests/rxe-guest/run` sets them all:
//!
//! ```text
//! tests/rxe-guest/run --timeout 600 -- cargo test --offline -p corelink-rpc --features ibverbs --test rpc_ibverbs
//! ```
//!
//! Without `CORELINK_IBV_DEVICE` every test prints `skipped: CORELINK_IBV_DEVICE not set` and
//! passes, so that `cargo test` stays green on a host without RDMA.
//!
//! Every end-to-end check of the soft tests runs here too: ordering per session, credits
//! exhausted and recovered, deadlines, every error kind, at-most-once under duplicated
//! delivery (a raw engine client really sends the duplicates: no fault injection, so nothing
//! soft-only about it), small and large messages byte for byte (1 B to 8 MiB), a hundred and a
//! thousand sessions on one server, merging, request classes, typed calls and the handle.
//! Soft-only, and why: `hot_path_alloc_soft.rs` (a process-wide counting allocator, a binary of
//! its own) and `typed_soft.rs`'s codec check (no provider in it).
#![cfg(feature = "ibverbs")]

mod common;
#[path = "../../engine/tests/common/ibverbs_env.rs"]
mod ibverbs_env;

use std::net::SocketAddr;

use common::{at_most_once, balance, calls, handle, large, sched, typed, Site};
use corelink_engine::verbs::ibverbs::Ibverbs;

/// A site on the device, listening on `port` of its address; `None` (after saying so) without
/// a device. Soft-RoCE's work runs on the machine's cores, which busy-polling workers share:
/// a worker with connections yields its core after 64 empty polls in a row. A connect may
/// take 60 s (the default is 10): the checks run at once, and one beside the thousand-session
/// check's connects waited longer than 10 s for its route in the emulated guest.
fn site(port: u16) -> Option<Site> {
    let (provider, ip) = ibverbs_env::target()?;
    let worker = "yield_after_empty_polls = 64\n";
    let top = "connect_timeout_ms = 60000";
    Some(Site { provider, worker, top, listen: SocketAddr::new(ip, port) })
}

/// Port 1 of the device's own address: nothing listens there, so the peer's connection
/// manager rejects the request.
fn nowhere(site: &Site) -> SocketAddr {
    SocketAddr::new(site.listen.ip(), 1)
}

#[test]
fn calls_on_one_session_end_in_the_order_they_were_made() {
    let Some(s) = site(7101) else { return };
    calls::calls_on_one_session_end_in_the_order_they_were_made::<Ibverbs>(&s);
}

#[test]
fn calls_beyond_the_credits_wait_and_all_succeed() {
    let Some(s) = site(7102) else { return };
    calls::calls_beyond_the_credits_wait_and_all_succeed::<Ibverbs>(&s);
}

#[test]
fn a_server_that_never_answers_times_calls_out_and_gets_no_more_than_the_credits() {
    let (Some(hole), Some(s)) = (site(7103), site(7104)) else { return };
    calls::a_server_that_never_answers_times_calls_out_and_gets_no_more_than_the_credits::<Ibverbs>(
        &hole, &s,
    );
}

#[test]
fn errors_name_why_no_response_came() {
    let Some(s) = site(7105) else { return };
    calls::errors_name_why_no_response_came::<Ibverbs>(&s);
}

#[test]
fn closing_a_session_ends_each_of_its_calls_once() {
    let Some(s) = site(7106) else { return };
    calls::closing_a_session_ends_each_of_its_calls_once::<Ibverbs>(&s);
}

#[test]
fn a_connect_to_nowhere_ends_its_calls_closed() {
    let Some(s) = site(7107) else { return };
    calls::a_connect_to_nowhere_ends_its_calls_closed::<Ibverbs>(&s, nowhere(&s));
}

#[test]
fn one_byte_and_four_kib_messages_arrive_byte_for_byte() {
    let Some(s) = site(7108) else { return };
    calls::one_byte_and_four_kib_messages_arrive_byte_for_byte::<Ibverbs>(&s);
}

#[test]
fn small_calls_of_one_pass_go_packed_in_order() {
    let Some(s) = site(7126) else { return };
    calls::small_calls_of_one_pass_go_packed_in_order::<Ibverbs>(&s);
}

#[test]
fn a_hundred_sessions_on_one_server() {
    let Some(s) = site(7109) else { return };
    calls::a_hundred_sessions_on_one_server::<Ibverbs>(&s);
}

/// All 1,000 on rxe too: `calls::MANY_SESSIONS` keeps each engine within rxe's limits (1,000
/// QPs of 8 + 8 entries and a CQ of 16,384 per engine, against 65,536 QPs and CQs of 32 K
/// entries). Should a device refuse them, lower the count here, not on `soft`.
#[test]
fn a_thousand_sessions_on_one_server() {
    let (Some(server), Some(client)) = (site(7112), site(7113)) else { return };
    calls::many_sessions_on_one_server::<Ibverbs>(&server, &client, 1000);
}

#[test]
fn a_full_call_table_refuses_and_its_deadlines_stay_bounded() {
    let Some(s) = site(7110) else { return };
    calls::a_full_call_table_refuses_and_its_deadlines_stay_bounded::<Ibverbs>(&s);
}

#[test]
fn sessions_across_two_workers_keep_their_order_at_full_credit() {
    let Some(s) = site(7111) else { return };
    calls::sessions_across_two_workers_keep_their_order_at_full_credit::<Ibverbs>(&s);
}

#[test]
fn a_duplicated_request_runs_once_and_is_answered_again() {
    let Some(s) = site(7114) else { return };
    at_most_once::a_duplicated_request_runs_once_and_is_answered_again::<Ibverbs>(&s);
}

#[test]
fn a_connection_without_a_hello_or_with_too_many_credits_is_refused() {
    let Some(s) = site(7115) else { return };
    at_most_once::a_connection_without_a_hello_or_with_too_many_credits_is_refused::<Ibverbs>(&s);
}

#[test]
fn a_resumable_sessions_record_survives_its_connection() {
    let Some(s) = site(7130) else { return };
    at_most_once::a_resumable_sessions_record_survives_its_connection::<Ibverbs>(&s);
}

#[test]
fn large_requests_and_responses_arrive_byte_for_byte() {
    let Some(s) = site(7116) else { return };
    large::large_requests_and_responses_arrive_byte_for_byte::<Ibverbs>(&s);
}

#[test]
fn a_large_call_waiting_for_a_slot_times_out_once() {
    let (Some(hole), Some(client)) = (site(7141), site(7142)) else { return };
    large::a_large_call_waiting_for_a_slot_times_out_once::<Ibverbs>(&hole, &client);
}

#[test]
fn requests_run_in_session_order_across_large_ones() {
    let Some(s) = site(7140) else { return };
    large::requests_run_in_session_order_across_large_ones::<Ibverbs>(&s);
}

#[test]
fn a_response_without_a_slot_says_its_request_ran() {
    let (Some(server), Some(client)) = (site(7143), site(7144)) else { return };
    large::a_response_without_a_slot_says_its_request_ran::<Ibverbs>(&server, &client);
}

#[test]
fn a_large_call_waits_for_an_arena_slot_when_all_are_out() {
    let (Some(server), Some(client)) = (site(7117), site(7118)) else { return };
    large::a_large_call_waits_for_an_arena_slot_when_all_are_out::<Ibverbs>(&server, &client);
}

#[test]
fn identical_calls_in_flight_execute_once_and_all_get_the_response() {
    let Some(s) = site(7119) else { return };
    sched::identical_calls_in_flight_execute_once_and_all_get_the_response::<Ibverbs>(&s);
}

#[test]
fn merged_calls_end_with_their_leader_when_the_session_closes() {
    let Some(s) = site(7120) else { return };
    sched::merged_calls_end_with_their_leader_when_the_session_closes::<Ibverbs>(&s, nowhere(&s));
}

#[test]
fn request_classes_reach_the_engines_scheduler() {
    let (Some(plain), Some(classed)) = (site(7121), site(7122)) else { return };
    sched::request_classes_reach_the_engines_scheduler::<Ibverbs>(&plain, &classed);
}

#[test]
fn typed_calls_on_the_worker_and_through_a_handle() {
    let Some(s) = site(7123) else { return };
    typed::typed_calls_on_the_worker_and_through_a_handle::<Ibverbs>(&s);
}

#[test]
fn blocking_calls_from_another_thread_end_in_order_and_name_their_errors() {
    let Some(s) = site(7124) else { return };
    handle::blocking_calls_from_another_thread_end_in_order_and_name_their_errors::<Ibverbs>(
        &s,
        nowhere(&s),
    );
}

#[test]
fn many_futures_in_flight_under_tokio_all_end_with_their_answer() {
    let Some(s) = site(7125) else { return };
    handle::many_futures_in_flight_under_tokio_all_end_with_their_answer::<Ibverbs>(&s);
}

#[test]
fn a_group_spreads_calls_and_avoids_a_downed_server() {
    let (Some(a), Some(b), Some(c), Some(d)) = (site(7145), site(7146), site(7147), site(7148))
    else {
        return;
    };
    balance::a_group_spreads_calls_and_avoids_a_downed_server::<Ibverbs>([&a, &b, &c], &d);
}
