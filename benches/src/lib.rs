//! # corelink-benches
//!
//! Home of corelink's criterion benchmarks (ring push/pop, pool get/put, post+poll through
//! verbs and through the engine) and of the script that runs perftest and `corelink-perf`
//! side by side on Soft-RoCE. They arrive with the `corelink-perf` issue.
#![deny(missing_docs)]
