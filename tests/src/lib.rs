//! # corelink-tests
//!
//! The conformance suite, written once and generic over the provider, and the integration
//! tests that run it against `soft` (always) and `ibverbs` (against the device named by
//! `CORELINK_IBV_DEVICE`, e.g. Soft-RoCE's `rxe0` in the guest).
#![deny(missing_docs)]
