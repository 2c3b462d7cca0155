//! The conformance suite on `soft` with each case's two sides in two processes: side B's
//! objects live in a peer process (this test binary started again, running only `peer`), and
//! everything between the sides crosses `soft`'s fabric between processes
//! (`corelink_tests::split`). One `#[test]` per case, `conformance_<case>`.

use corelink_tests::split;

/// The target; first tells `split` how to start this binary as a peer.
fn target() -> Result<corelink_tests::Target, String> {
    split::set_peer_args(&["--exact", "peer", "--nocapture", "--test-threads=1"]);
    Ok(corelink_tests::Target::soft_two_processes())
}

corelink_tests::conformance_tests!(split::Split, target());

/// The peer's side: serves its runner when started as a peer, passes at once otherwise.
#[test]
fn peer() {
    if let Some(Err(e)) = split::serve_if_peer() {
        panic!("the peer process stopped serving: {e}");
    }
}

/// Side B really is another process: its GID names another process, and A's write into B's
/// region takes `soft`'s path into another process's memory.
#[test]
fn split_side_b_is_another_process() {
    let t = target().expect("target");
    let (da, db) = corelink_tests::harness::devs::<split::Split>(&t).expect("devices");
    let (ga, gb) = (da.gid().expect("A's GID"), db.gid().expect("B's GID"));
    assert_ne!(ga, gb, "both sides report one GID: side B is in this process");
    let before = corelink_verbs::soft::direct_accesses();
    corelink_tests::cases::rc_write::<split::Split>(&t).expect("rc_write");
    assert!(
        corelink_verbs::soft::direct_accesses() > before,
        "A's write into B's region did not cross into another process"
    );
}
