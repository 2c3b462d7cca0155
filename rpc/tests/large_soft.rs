//! Large messages on `soft` (the checks are in `common/large.rs`, shared with
//! `rpc_ibverbs.rs`): payloads beyond a receive travel as a descriptor and are read by the
//! receiver with one RDMA read from the sender's arena (requests and responses alike), checked
//! byte for byte up to 8 MiB; the arena's slots are a resource of their own (a large call
//! waits for one); a session's requests run in order across large ones.

mod common;

use common::{large, Site};
use corelink_engine::verbs::soft::Soft;

#[test]
fn large_requests_and_responses_arrive_byte_for_byte() {
    large::large_requests_and_responses_arrive_byte_for_byte::<Soft>(&Site::soft("10.98.16.1"));
}

#[test]
fn a_large_call_waits_for_an_arena_slot_when_all_are_out() {
    large::a_large_call_waits_for_an_arena_slot_when_all_are_out::<Soft>(
        &Site::soft("10.98.16.2"),
        &Site::soft("10.98.16.3"),
    );
}

#[test]
fn requests_run_in_session_order_across_large_ones() {
    let m =
        large::requests_run_in_session_order_across_large_ones::<Soft>(&Site::soft("10.98.16.4"));
    // On soft every request reaches the server before the first large payload is read.
    assert!(m.held >= 2, "{m:?}");
}

#[test]
fn a_large_call_waiting_for_a_slot_times_out_once() {
    large::a_large_call_waiting_for_a_slot_times_out_once::<Soft>(
        &Site::soft("10.98.16.5"),
        &Site::soft("10.98.16.6"),
    );
}

#[test]
fn a_response_without_a_slot_says_its_request_ran() {
    large::a_response_without_a_slot_says_its_request_ran::<Soft>(
        &Site::soft("10.98.16.7"),
        &Site::soft("10.98.16.8"),
    );
}
