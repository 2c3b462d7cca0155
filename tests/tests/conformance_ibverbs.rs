//! The conformance suite on the `ibverbs` provider, against the device named by
//! `CORELINK_IBV_DEVICE` (e.g. `rxe0`; see `Target::from_env` for the other variables).
//! Without it every test prints `skipped: CORELINK_IBV_DEVICE not set` and passes, so that
//! `cargo test` stays green on a host without RDMA.
#![cfg(feature = "ibverbs")]

corelink_tests::conformance_tests!(
    corelink_verbs::ibverbs::Ibverbs,
    corelink_tests::Target::from_env()
);
