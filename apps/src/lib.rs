//! # corelink-apps
//!
//! corelink's applications and the code they share:
//! - `corelink-conformance` (`src/bin/`): the fidelity report, the conformance suite's
//!   scenarios run on a chosen provider, one JSON object per scenario ([`fidelity`]);
//! - examples in `examples/`: `primitives` (every primitive on `soft`), `cm_pair` (a server and a
//!   client process connected with the connection manager).
//! - `corelink-perf` (`src/bin/`, [`perf`]): perftest-style benchmarks through the engine, and
//!   baselines (memcpy, a cross-core ring ping-pong, TCP) in the same binary;
//! - the engine examples `echo` and `one_sided`, and the RPC examples `kv_store`, `sequencer`
//!   and `file_read` (services on `corelink-rpc`);
//! - [`pair::Pair`]: the handler of a worker that serves and connects, shared by all of them.
#![deny(missing_docs)]

pub mod fidelity;
pub mod pair;
pub mod perf;
