//! # corelink-tests
//!
//! The conformance suite, written once and generic over the provider, and the integration
//! tests that run it against `soft` (always) and `ibverbs` (against the device named by
//! `CORELINK_IBV_DEVICE`, e.g. Soft-RoCE's `rxe0` in the guest).
//!
//! Every case is a `pub fn case<P: Provider>(t: &Target) -> Result<(), String>` in
//! [`cases`]; the one list of them is [`conformance_tests!`], which turns it into one `#[test]`
//! per case (named `conformance_<case>`) for a provider, and [`all`] hands it out at run time
//! (for a conformance tool). Expected statuses of the error cases live in one table,
//! [`expect`], so that a real device's answers can correct them in one place.
//!
//! ## The cases
//! | area | cases |
//! |---|---|
//! | send | `rc_send`, `rc_send_with_imm`, `uc_send`, `uc_send_with_imm` |
//! | write | `rc_write`, `rc_write_with_imm`, `uc_write`, `uc_write_with_imm`, `rc_zero_length_write_without_key` |
//! | read | `rc_read` |
//! | atomic | `rc_cmp_swap_success`, `rc_cmp_swap_mismatch`, `rc_fetch_add` |
//! | UD | `ud_send`, `ud_send_with_imm`, `ud_wrong_qkey_dropped`, `ud_larger_than_mtu`, `ud_no_recv_dropped`, `ud_write_not_allowed` |
//! | scatter/gather | `sgl_send_3_into_2`, `sgl_write_gather_2`, `sgl_read_scatter_2`, `sgl_too_many_sges_refused` |
//! | inline | `inline_send_buffer_reusable`, `inline_write`, `inline_too_large_refused` |
//! | signalling | `unsignalled_writes_one_completion`, `unsignalled_error_then_flush` |
//! | SRQ | `srq_shared_by_two_qps` |
//! | memory windows | `mw_bind_access_inside`, `mw_access_outside_range`, `mw_local_inv_revokes`, `mw_read_only_refuses_write` |
//! | errors | `write_bad_rkey`, `read_bad_rkey`, `atomic_bad_rkey`, `write_stale_rkey`, `read_stale_rkey`, `write_out_of_bounds`, `read_out_of_bounds`, `write_read_only_mr`, `read_write_only_mr`, `atomic_without_remote_atomic`, `write_other_pd_mr`, `send_bad_lkey`, `atomic_misaligned`, `rc_rnr_retry_exceeded`, `rc_send_too_long`, `uc_read_not_allowed`, `uc_atomic_not_allowed`, `cq_overrun_async_event` |
//! | queues and states | `rq_overflow_refused`, `qp_invalid_transition_refused`, `rc_rnr_wait_then_receive` |
//! | CM | `cm_connect_send_disconnect`, `cm_no_listener`, `cm_reject`, `cm_waiter_ready` |
//!
//! Every error case also checks, as [`expect`] says, whether the requester's QP reports
//! `QpState::Err` (then a request posted afterwards completes with `WrFlushErr` and its own
//! `wr_id`), whether the responder's does (then its posted receives flush), that nothing more
//! completes, and that the target memory was left untouched, byte for byte.
//!
//! Run on `soft` by `cargo test`, in one process and, with [`split::Split`], with each case's
//! side B in a second process (`tests/conformance_soft_processes.rs`); on a device with
//! `CORELINK_IBV_DEVICE=rxe0 cargo test -p corelink-tests --test conformance_ibverbs`
//! (see [`Target::from_env`] for the other variables, and `tests/rxe-guest/run`).
#![deny(missing_docs)]

pub mod cases;
pub mod expect;
pub mod harness;
pub mod record;
pub mod split;

pub use harness::{CaseResult, Target};

use corelink_verbs::Provider;

/// A conformance case for provider `P`.
pub type CaseFn = fn(&Target) -> CaseResult;

/// One named case, as [`all`] lists them.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// The case's name (`rc_send`, ...), without the `conformance_` prefix.
    pub name: &'static str,
    /// Runs it.
    pub run: CaseFn,
}

/// Runs one case as a test: skips (printing why) without a target, says so when the device
/// cannot run the case as written, panics with the case's message when it fails.
pub fn run_case(name: &str, run: CaseFn, target: Result<Target, String>) {
    match target {
        Err(why) => println!("skipped: {why}"),
        Ok(t) => {
            record::start();
            let res = run(&t);
            if let Some(why) = record::take().unsupported {
                println!("unsupported on {}: {why}", t.device);
            }
            if let Err(e) = res {
                panic!("conformance case {name} on {}: {e}", t.device);
            }
        }
    }
}

/// The one list of cases: calls the macro named by the tokens before the braces with the
/// braces' contents and then `test_name => case_fn, ...`.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_case_list {
    ($($cb:tt)::+ { $($args:tt)* }) => {
        $($cb)::+! { { $($args)* }
            conformance_rc_send => rc_send,
            conformance_rc_send_with_imm => rc_send_with_imm,
            conformance_uc_send => uc_send,
            conformance_uc_send_with_imm => uc_send_with_imm,
            conformance_rc_write => rc_write,
            conformance_rc_write_with_imm => rc_write_with_imm,
            conformance_uc_write => uc_write,
            conformance_uc_write_with_imm => uc_write_with_imm,
            conformance_rc_zero_length_write_without_key => rc_zero_length_write_without_key,
            conformance_rc_read => rc_read,
            conformance_rc_cmp_swap_success => rc_cmp_swap_success,
            conformance_rc_cmp_swap_mismatch => rc_cmp_swap_mismatch,
            conformance_rc_fetch_add => rc_fetch_add,
            conformance_ud_send => ud_send,
            conformance_ud_send_with_imm => ud_send_with_imm,
            conformance_ud_wrong_qkey_dropped => ud_wrong_qkey_dropped,
            conformance_ud_larger_than_mtu => ud_larger_than_mtu,
            conformance_ud_no_recv_dropped => ud_no_recv_dropped,
            conformance_ud_write_not_allowed => ud_write_not_allowed,
            conformance_sgl_send_3_into_2 => sgl_send_3_into_2,
            conformance_sgl_write_gather_2 => sgl_write_gather_2,
            conformance_sgl_read_scatter_2 => sgl_read_scatter_2,
            conformance_sgl_too_many_sges_refused => sgl_too_many_sges_refused,
            conformance_inline_send_buffer_reusable => inline_send_buffer_reusable,
            conformance_inline_write => inline_write,
            conformance_inline_too_large_refused => inline_too_large_refused,
            conformance_unsignalled_writes_one_completion => unsignalled_writes_one_completion,
            conformance_unsignalled_error_then_flush => unsignalled_error_then_flush,
            conformance_srq_shared_by_two_qps => srq_shared_by_two_qps,
            conformance_mw_bind_access_inside => mw_bind_access_inside,
            conformance_mw_access_outside_range => mw_access_outside_range,
            conformance_mw_local_inv_revokes => mw_local_inv_revokes,
            conformance_mw_read_only_refuses_write => mw_read_only_refuses_write,
            conformance_mw_send_with_inv_revokes => mw_send_with_inv_revokes,
            conformance_write_bad_rkey => write_bad_rkey,
            conformance_read_bad_rkey => read_bad_rkey,
            conformance_atomic_bad_rkey => atomic_bad_rkey,
            conformance_write_stale_rkey => write_stale_rkey,
            conformance_read_stale_rkey => read_stale_rkey,
            conformance_write_out_of_bounds => write_out_of_bounds,
            conformance_read_out_of_bounds => read_out_of_bounds,
            conformance_write_read_only_mr => write_read_only_mr,
            conformance_read_write_only_mr => read_write_only_mr,
            conformance_atomic_without_remote_atomic => atomic_without_remote_atomic,
            conformance_write_other_pd_mr => write_other_pd_mr,
            conformance_send_bad_lkey => send_bad_lkey,
            conformance_atomic_misaligned => atomic_misaligned,
            conformance_rc_rnr_retry_exceeded => rc_rnr_retry_exceeded,
            conformance_rc_send_too_long => rc_send_too_long,
            conformance_uc_read_not_allowed => uc_read_not_allowed,
            conformance_uc_atomic_not_allowed => uc_atomic_not_allowed,
            conformance_cq_overrun_async_event => cq_overrun_async_event,
            conformance_rq_overflow_refused => rq_overflow_refused,
            conformance_qp_invalid_transition_refused => qp_invalid_transition_refused,
            conformance_rc_send_before_rts_refused => rc_send_before_rts_refused,
            conformance_rc_rnr_wait_then_receive => rc_rnr_wait_then_receive,
            conformance_cm_connect_send_disconnect => cm_connect_send_disconnect,
            conformance_cm_no_listener => cm_no_listener,
            conformance_cm_reject => cm_reject,
            conformance_cm_waiter_ready => cm_waiter_ready,
        }
    };
}

/// Generates one `#[test]` per conformance case, named `conformance_<case>`, running it on
/// provider `$p` against the target `$target` (an expression of type `Result<Target, String>`;
/// an `Err` makes every test print `skipped: <why>` and pass).
///
/// ```ignore
/// corelink_tests::conformance_tests!(corelink_verbs::soft::Soft, Ok(corelink_tests::Target::soft()));
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($p:ty, $target:expr) => {
        $crate::__with_case_list! { $crate::__conformance_tests_impl { $p, $target } }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests_impl {
    ({ $p:ty, $target:expr } $($name:ident => $case:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::run_case(stringify!($case), $crate::cases::$case::<$p>, $target);
            }
        )*
    };
}

macro_rules! __all_impl {
    ({} $($name:ident => $case:ident),* $(,)?) => {
        /// Every case, in the suite's order, for provider `P`.
        pub fn all<P: Provider>() -> Vec<Case> {
            vec![$(Case { name: stringify!($case), run: cases::$case::<P> }),*]
        }
    };
}

__with_case_list! { __all_impl {} }
