//! # corelink-apps
//!
//! corelink's applications and the code they share. The examples live in `examples/`; the
//! benchmark tool `corelink-perf` and the fidelity report `corelink-conformance` arrive with
//! their issues.
#![deny(missing_docs)]
