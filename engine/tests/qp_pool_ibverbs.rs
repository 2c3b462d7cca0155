//! QP pools and multi-QP connections on the `ibverbs` provider (the checks are in
//! `common/lanes.rs`, shared with `qp_pool_soft.rs`): QPs reset and reconnected through
//! rdma_cm, the limit, and 4 lanes between two engines, against the device named by
//! `CORELINK_IBV_DEVICE` (see `engine_ibverbs.rs` for the environment; `tests/rxe-guest/run`
//! sets it):
//!
//! ```text
//! tests/rxe-guest/run --timeout 300 -- cargo test --offline -p corelink-engine --test qp_pool_ibverbs
//! ```
//!
//! Without `CORELINK_IBV_DEVICE` every test prints `skipped: CORELINK_IBV_DEVICE not set` and
//! passes.
#![cfg(feature = "ibverbs")]

#[path = "common/grant.rs"]
mod grant;
#[path = "common/ibverbs_env.rs"]
mod ibverbs_env;
#[path = "common/lanes.rs"]
mod lanes;

use std::net::SocketAddr;

use corelink_verbs::ibverbs::Ibverbs;

/// The provider lines and the device's address (port chosen by the connection manager).
fn target() -> Option<(String, SocketAddr)> {
    let (provider, ip) = ibverbs_env::target()?;
    Some((provider, SocketAddr::new(ip, 0)))
}

#[test]
fn connections_reuse_pooled_qps() {
    let Some((provider, addr)) = target() else { return };
    lanes::connections_reuse_pooled_qps::<Ibverbs>(&provider, addr);
}

#[test]
fn the_qp_limit_refuses_a_connect() {
    let Some((provider, addr)) = target() else { return };
    lanes::the_qp_limit_refuses_then_makes_room::<Ibverbs>(&provider, addr, 2);
}

#[test]
fn the_qp_limit_refuses_an_accept() {
    let Some((provider, addr)) = target() else { return };
    lanes::the_qp_limit_refuses_then_makes_room::<Ibverbs>(&provider, addr, 3);
}

#[test]
fn a_connection_of_four_lanes() {
    let Some((provider, addr)) = target() else { return };
    lanes::a_connection_of_four_lanes::<Ibverbs>(&provider, addr, addr);
}

#[test]
fn a_refused_lane_fails_the_whole_connection() {
    let Some((provider, addr)) = target() else { return };
    lanes::a_refused_lane_fails_the_whole_connection::<Ibverbs>(&provider, addr, addr);
}
