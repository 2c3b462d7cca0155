//! The conformance suite on the `soft` provider: one `#[test]` per case, `conformance_<case>`.

corelink_tests::conformance_tests!(corelink_verbs::soft::Soft, Ok(corelink_tests::Target::soft()));
