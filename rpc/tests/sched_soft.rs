//! Service-level scheduling on `soft` (the checks are in `common/sched.rs`, shared with
//! `rpc_ibverbs.rs`): identical in-flight calls of a mergeable type execute once and every
//! caller gets the response (counted), other bytes and other types are not merged, a merged
//! call ends with its leader (closed session included); request classes per type reach the
//! engine's scheduler: an urgent call made after a burst of bulk ones on the same session ends
//! first, where without classes it ends last.

mod common;

use common::{addr, sched, Site};
use corelink_engine::verbs::soft::Soft;

#[test]
fn identical_calls_in_flight_execute_once_and_all_get_the_response() {
    sched::identical_calls_in_flight_execute_once_and_all_get_the_response::<Soft>(&Site::soft(
        "10.98.23.1",
    ));
}

#[test]
fn merged_calls_end_with_their_leader_when_the_session_closes() {
    sched::merged_calls_end_with_their_leader_when_the_session_closes::<Soft>(
        &Site::soft("10.98.23.2"),
        addr("10.98.23.98"),
    );
}

#[test]
fn request_classes_reach_the_engines_scheduler() {
    sched::request_classes_reach_the_engines_scheduler::<Soft>(
        &Site::soft("10.98.23.3"),
        &Site::soft("10.98.23.4"),
    );
}
