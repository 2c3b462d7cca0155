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

pub use error::{chain, Chain, Error, Result};
pub use pages::{Pages, HUGE_PAGE};
pub use provider::{
    Accepting, CmEvent, CmWaiter, ConnRequest, Connecting, Connection, Context, Cq, Listener, Mr,
    Mw, Pd, Progress, Provider, Qp, QpInitAttr, Srq, Waker, Watch, ACCEPT_WAIT,
};
pub use types::*;
pub use wr::{RecvWr, SendOp, SendWr, UdDest};
