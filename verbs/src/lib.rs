//! # corelink-verbs
//!
//! One safe, provider-neutral Rust API for the objects and primitives of RDMA: devices,
//! protection domains, memory regions and windows, completion queues, shared receive queues,
//! address handles, RC/UC/UD queue pairs, work requests with scatter/gather lists, async events
//! and connection management.
//!
//! Two providers implement it:
//! - [`soft`]: a userspace device with the semantics of a real one, for hosts without an RDMA NIC;
//! - `ibverbs` (feature `ibverbs`, on by default): real devices through libibverbs and librdmacm.
//!
//! Code above this layer is generic over [`Provider`]; the data path (`post_send`, `post_recv`,
//! `poll`) is statically dispatched and allocation-free. Raw pointers and `rdma-sys` types never
//! leave this crate except through an explicit `as_raw()`.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod error;
mod pages;
pub mod provider;
pub mod soft;
#[cfg(feature = "guest-stamps")]
#[doc(hidden)]
pub mod stamps;
pub mod types;
pub mod wr;

#[cfg(feature = "ibverbs")]
pub mod ibverbs;

/// `cond` tested with one branch: the conditions it was or-ed or and-ed from (with `|` and
/// `&`, each a load and a compare) stay one value, which the compiler would otherwise split
/// into a branch each again. On a hot path in the emulated guest each branch taken ends a
/// block of translated code that the round trip pays to find; the checks that gate rare work
/// are most of them. (For corelink's own layers: not part of the verbs API.)
#[doc(hidden)]
#[inline(always)]
pub fn one_test(cond: bool) -> bool {
    std::hint::black_box(cond as u8) != 0
}

pub use error::{chain, Chain, Error, Result};
pub use pages::{Pages, HUGE_PAGE};
pub use provider::{
    Accepting, CmEvent, CmWaiter, ConnRequest, Connecting, Connection, Context, Cq, Listener, Mr,
    Mw, Pd, Progress, Provider, Qp, QpInitAttr, Srq, Waker, Watch, ACCEPT_WAIT,
};
pub use types::*;
pub use wr::{RecvWr, SendOp, SendWr, UdDest};
