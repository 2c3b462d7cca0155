//! The RPC layer end to end on the `soft` provider, in one process (the checks are in
//! `common/calls.rs`, shared with `rpc_ibverbs.rs`): each test's engine has one worker whose
//! endpoint opens sessions to itself (its client and server sides on one worker), listening on
//! its own address of the process-wide soft fabric. Nothing here reads the clock for an
//! assertion: timeouts are hang guards only.

mod common;

use common::{balance, calls, Site};
use corelink_engine::verbs::soft::Soft;

#[test]
fn calls_on_one_session_end_in_the_order_they_were_made() {
    calls::calls_on_one_session_end_in_the_order_they_were_made::<Soft>(&Site::soft("10.98.13.1"));
}

#[test]
fn calls_beyond_the_credits_wait_and_all_succeed() {
    calls::calls_beyond_the_credits_wait_and_all_succeed::<Soft>(&Site::soft("10.98.13.2"));
}

#[test]
fn a_server_that_never_answers_times_calls_out_and_gets_no_more_than_the_credits() {
    calls::a_server_that_never_answers_times_calls_out_and_gets_no_more_than_the_credits::<Soft>(
        &Site::soft("10.98.13.3"),
        &Site::soft("10.98.13.4"),
    );
}

#[test]
fn errors_name_why_no_response_came() {
    calls::errors_name_why_no_response_came::<Soft>(&Site::soft("10.98.13.5"));
}

#[test]
fn closing_a_session_ends_each_of_its_calls_once() {
    calls::closing_a_session_ends_each_of_its_calls_once::<Soft>(&Site::soft("10.98.13.6"));
}

#[test]
fn a_connect_to_nowhere_ends_its_calls_closed() {
    calls::a_connect_to_nowhere_ends_its_calls_closed::<Soft>(
        &Site::soft("10.98.13.7"),
        common::addr("10.98.13.99"),
    );
}

#[test]
fn one_byte_and_four_kib_messages_arrive_byte_for_byte() {
    calls::one_byte_and_four_kib_messages_arrive_byte_for_byte::<Soft>(&Site::soft("10.98.13.8"));
}

#[test]
fn small_calls_of_one_pass_go_packed_in_order() {
    calls::small_calls_of_one_pass_go_packed_in_order::<Soft>(&Site::soft("10.98.13.30"));
}

#[test]
fn a_hundred_sessions_on_one_server() {
    calls::a_hundred_sessions_on_one_server::<Soft>(&Site::soft("10.98.13.9"));
}

#[test]
fn a_thousand_sessions_on_one_server() {
    calls::many_sessions_on_one_server::<Soft>(
        &Site::soft("10.98.13.12"),
        &Site::soft("10.98.13.13"),
        1000,
    );
}

#[test]
fn a_full_call_table_refuses_and_its_deadlines_stay_bounded() {
    calls::a_full_call_table_refuses_and_its_deadlines_stay_bounded::<Soft>(&Site::soft(
        "10.98.13.10",
    ));
}

#[test]
fn sessions_across_two_workers_keep_their_order_at_full_credit() {
    calls::sessions_across_two_workers_keep_their_order_at_full_credit::<Soft>(&Site::soft(
        "10.98.13.11",
    ));
}

#[test]
fn a_group_spreads_calls_and_avoids_a_downed_server() {
    let servers = [Site::soft("10.98.34.1"), Site::soft("10.98.34.2"), Site::soft("10.98.34.3")];
    let [a, b, c] = &servers;
    balance::a_group_spreads_calls_and_avoids_a_downed_server::<Soft>(
        [a, b, c],
        &Site::soft("10.98.34.4"),
    );
}
