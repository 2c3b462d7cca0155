//! # corelink-apps
//!
//! corelink's applications and the code they share:
//! - `corelink-conformance` (`src/bin/`): the fidelity report, the conformance suite's
//!   scenarios run on a chosen provider, one JSON object per scenario ([`fidelity`]);
//! - examples in `examples/`: `primitives` (every primitive on `soft`), `cm_pair` (a server and a
//!   client process connected with the connection manager).
//!
//! The benchmark tool `corelink-perf` arrives with its issue.
#![deny(missing_docs)]

pub mod fidelity;
pub mod perf;
