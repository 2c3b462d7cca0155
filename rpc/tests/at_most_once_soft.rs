//! At-most-once execution and the decoder at a server endpoint, on `soft` (the checks are in
//! `common/at_most_once.rs`, shared with `rpc_ibverbs.rs`): a raw engine client speaks the wire
//! format by hand to an endpoint's server session, so that it can duplicate requests, replay
//! old ones and send malformed ones (no test hook in the endpoint).

mod common;

use common::{at_most_once, Site};
use corelink_engine::verbs::soft::Soft;

#[test]
fn a_duplicated_request_runs_once_and_is_answered_again() {
    at_most_once::a_duplicated_request_runs_once_and_is_answered_again::<Soft>(&Site::soft(
        "10.98.14.1",
    ));
}

#[test]
fn a_connection_without_a_hello_or_with_too_many_credits_is_refused() {
    at_most_once::a_connection_without_a_hello_or_with_too_many_credits_is_refused::<Soft>(
        &Site::soft("10.98.14.2"),
    );
}

#[test]
fn a_resumable_sessions_record_survives_its_connection() {
    at_most_once::a_resumable_sessions_record_survives_its_connection::<Soft>(&Site::soft(
        "10.98.14.3",
    ));
}
