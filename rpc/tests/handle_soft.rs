//! Calls from other threads through a `Handle` on `soft` (the checks are in `common/handle.rs`,
//! shared with `rpc_ibverbs.rs`): blocking calls in order, the errors of refused and failed
//! calls, many `Future`s in flight at once under a multi-threaded tokio runtime (more than the
//! ring and the credits hold), and `WorkerGone` once the worker stopped.

mod common;

use common::{addr, handle, Site};
use corelink_engine::verbs::soft::Soft;

#[test]
fn blocking_calls_from_another_thread_end_in_order_and_name_their_errors() {
    handle::blocking_calls_from_another_thread_end_in_order_and_name_their_errors::<Soft>(
        &Site::soft("10.98.20.1"),
        addr("10.98.20.99"),
    );
}

#[test]
fn many_futures_in_flight_under_tokio_all_end_with_their_answer() {
    handle::many_futures_in_flight_under_tokio_all_end_with_their_answer::<Soft>(&Site::soft(
        "10.98.20.2",
    ));
}
