//! Large messages on `soft` (the checks are in `common/large.rs`, shared with
//! `rpc_ibverbs.rs`): payloads beyond a receive travel as a descriptor and are read by the
//! receiver with one RDMA read from the sender's arena (requests and responses alike), checked
//! byte for byte up to 8 MiB; the arena's slots are a resource of their own.

mod common;

use common::{large, Site};
use corelink_engine::verbs::soft::Soft;

#[test]
fn large_requests_and_responses_arrive_byte_for_byte() {
    large::large_requests_and_responses_arrive_byte_for_byte::<Soft>(&Site::soft("10.98.16.1"));
}

#[test]
fn large_slots_are_refused_when_all_are_out_and_come_back() {
    large::large_slots_are_refused_when_all_are_out_and_come_back::<Soft>(
        &Site::soft("10.98.16.2"),
        &Site::soft("10.98.16.3"),
    );
}
