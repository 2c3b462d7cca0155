//! # corelink-benches
//!
//! corelink's criterion benchmarks, in `benches/hot_path.rs` (run them with
//! `cargo bench -p corelink-benches`; all on the `soft` provider, no NIC needed):
//! - `ring/push_pop_same_thread` and `ring/echo_cross_thread`: the engine's SPSC ring, on one
//!   thread and between two pinned threads (pipelined echo);
//! - `pool/get_drop_64B`: a 64-byte buffer from a worker's pool and back;
//! - `verbs/soft_write_8B_post_poll`: one 8-byte RDMA write posted on `soft` and its
//!   completion polled, straight through the verbs layer;
//! - `engine/client_write_8B_batch`: batches of 32 8-byte writes submitted by an external
//!   `Client` to an engine on `soft` connected to itself, and their completions (per write).
//!
//! The baselines these are compared with (memcpy, a ring ping-pong, TCP) are
//! `corelink-perf baseline ...` in `corelink-apps`. This library itself holds nothing.
#![deny(missing_docs)]
