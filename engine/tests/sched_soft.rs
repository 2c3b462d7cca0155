//! The scheduler on the `soft` provider (the scenarios are in `common/sched.rs`): priority
//! order, aging under a read flood, merged reads, coalesced writes, an error inside an
//! unsignalled run.

#[path = "common/grant.rs"]
mod grant;
#[path = "common/sched.rs"]
mod sched;

use corelink_verbs::soft::Soft;

const SOFT: &str = "provider = \"soft\"";

fn at(s: &str) -> std::net::SocketAddr {
    s.parse().unwrap()
}

#[test]
fn reads_overtake_queued_writes() {
    sched::reads_overtake_queued_writes::<Soft>(SOFT, at("10.98.0.1:0"), at("10.98.0.2:0"));
}

#[test]
fn no_starvation_under_a_read_flood() {
    sched::no_starvation_under_a_read_flood::<Soft>(SOFT, at("10.98.0.3:0"));
}

#[test]
fn identical_reads_merge() {
    sched::identical_reads_merge::<Soft>(SOFT, at("10.98.0.4:0"), at("10.98.0.5:0"));
}

#[test]
fn adjacent_writes_coalesce() {
    sched::adjacent_writes_coalesce::<Soft>(SOFT, at("10.98.0.6:0"));
}

#[test]
fn error_inside_an_unsignalled_run() {
    sched::error_inside_an_unsignalled_run::<Soft>(SOFT, at("10.98.0.7:0"));
}

#[test]
fn completions_come_in_batches() {
    sched::completions_come_in_batches::<Soft>(SOFT, at("10.98.0.8:0"));
}
