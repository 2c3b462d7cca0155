//! QP pools and multi-QP connections on the `soft` provider (the checks are in
//! `common/lanes.rs`, shared with `qp_pool_ibverbs.rs`). Each test listens on its own addresses
//! of the process-wide soft fabric.

#[path = "common/grant.rs"]
mod grant;
#[path = "common/lanes.rs"]
mod lanes;

use corelink_verbs::soft::Soft;

const SOFT: &str = "provider = \"soft\"";

#[test]
fn connections_reuse_pooled_qps() {
    lanes::connections_reuse_pooled_qps::<Soft>(SOFT, "10.99.3.1:0".parse().unwrap());
}

#[test]
fn the_qp_limit_refuses_a_connect() {
    lanes::the_qp_limit_refuses_then_makes_room::<Soft>(SOFT, "10.99.3.2:0".parse().unwrap(), 2);
}

#[test]
fn the_qp_limit_refuses_an_accept() {
    lanes::the_qp_limit_refuses_then_makes_room::<Soft>(SOFT, "10.99.3.3:0".parse().unwrap(), 3);
}

#[test]
fn a_connection_of_four_lanes() {
    lanes::a_connection_of_four_lanes::<Soft>(
        SOFT,
        "10.99.3.4:0".parse().unwrap(),
        "10.99.3.5:0".parse().unwrap(),
    );
}

#[test]
fn a_refused_lane_fails_the_whole_connection() {
    lanes::a_refused_lane_fails_the_whole_connection::<Soft>(
        SOFT,
        "10.99.3.6:0".parse().unwrap(),
        "10.99.3.7:0".parse().unwrap(),
    );
}
