//! The verbs layer's one error type: a variant per failing verb, with its context and the
//! operating system's (or the `soft` provider's equivalent) error as `source`.

use std::io;
use std::net::SocketAddr;

use crate::types::{QpState, QpType};

/// Result of a verbs call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What failed, where, and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Listing devices failed (on a host without RDMA support the list is empty instead).
    #[error("cannot list RDMA devices")]
    DeviceList(#[source] io::Error),
    /// No device has this name.
    #[error("no RDMA device named {name:?} (devices: {available})")]
    NoSuchDevice {
        /// The name asked for.
        name: String,
        /// The devices there are, comma-separated, or a note that there are none and why.
        available: String,
    },
    /// Opening a device failed.
    #[error("cannot open RDMA device {device:?}")]
    Open {
        /// Device name.
        device: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// `query_device` failed.
    #[error("cannot query device {device:?}")]
    QueryDevice {
        /// Device name.
        device: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// `query_port` failed.
    #[error("cannot query port {port} of {device:?}")]
    QueryPort {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// `query_gid` failed.
    #[error("cannot query GID {index} of port {port}")]
    QueryGid {
        /// Port number.
        port: u8,
        /// GID index.
        index: u32,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Allocating a protection domain failed.
    #[error("cannot allocate a protection domain")]
    AllocPd(#[source] io::Error),
    /// Registering memory failed.
    #[error("cannot register {len} bytes with access {access:?}")]
    RegMr {
        /// Bytes asked for.
        len: usize,
        /// Access asked for.
        access: crate::AccessFlags,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Allocating a memory window failed.
    #[error("cannot allocate a memory window")]
    AllocMw(#[source] io::Error),
    /// Creating a completion queue failed.
    #[error("cannot create a completion queue of depth {depth}")]
    CreateCq {
        /// Depth asked for.
        depth: u32,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Creating a shared receive queue failed.
    #[error("cannot create a shared receive queue of {max_wr} requests")]
    CreateSrq {
        /// Depth asked for.
        max_wr: u32,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Creating a queue pair failed.
    #[error(
        "cannot create a {qp_type} queue pair (send queue {}, receive queue {}, {} send and {} \
         receive scatter entries, {} bytes inline)",
        cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge, cap.max_inline_data
    )]
    CreateQp {
        /// Transport asked for.
        qp_type: QpType,
        /// Capacities asked for.
        cap: crate::QpCap,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Creating an address handle failed.
    #[error("cannot create an address handle")]
    CreateAh(#[source] io::Error),
    /// Modifying a QP failed.
    #[error("cannot move QP {qpn} from {from:?} to {to:?}")]
    ModifyQp {
        /// QP number.
        qpn: u32,
        /// State before.
        from: QpState,
        /// State asked for.
        to: QpState,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A send work request was refused at post; those before `index` were posted.
    #[error("post_send on QP {qpn} refused work request {index}")]
    PostSend {
        /// QP number.
        qpn: u32,
        /// Index in the batch of the first request not posted.
        index: usize,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A receive work request was refused at post; those before `index` were posted.
    #[error("post_recv on QP {qpn} refused work request {index}")]
    PostRecv {
        /// QP number.
        qpn: u32,
        /// Index in the batch of the first request not posted.
        index: usize,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A receive work request was refused by an SRQ; those before `index` were posted.
    #[error("post_srq_recv refused work request {index}")]
    PostSrqRecv {
        /// Index in the batch of the first request not posted.
        index: usize,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Polling a CQ failed.
    #[error("cannot poll a completion queue")]
    PollCq(#[source] io::Error),
    /// Reading async events failed.
    #[error("cannot read asynchronous events")]
    AsyncEvent(#[source] io::Error),
    /// An argument was out of range (a bound check on the caller's side).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Waiting for connection-manager events failed.
    #[error("cannot wait for connection-manager events")]
    CmWait(#[source] io::Error),
    /// A fault plan for `soft` (`CORELINK_SOFT_FAULTS`) that does not parse.
    #[error("fault plan `{text}` (CORELINK_SOFT_FAULTS): {why}")]
    BadFaultPlan {
        /// The plan's text.
        text: String,
        /// What is wrong with it.
        why: String,
    },
    /// `soft` could not join the fabric `CORELINK_SOFT_FABRIC` names (its port's socket).
    #[error("cannot join the soft fabric {name:?} (CORELINK_SOFT_FABRIC)")]
    SoftFabric {
        /// The fabric's name.
        name: String,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// A connection-manager call failed.
    #[error("connection manager: {op} failed for {addr}")]
    Cm {
        /// The rdma_cm step (`rdma_bind_addr`, `rdma_resolve_route`, ...).
        op: &'static str,
        /// The address involved.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The peer rejected the connection (or nothing listens there).
    #[error("connection to {addr} rejected ({} bytes of private data)", private_data.len())]
    Rejected {
        /// The address connected to.
        addr: SocketAddr,
        /// The peer's private data, if it gave any.
        private_data: Vec<u8>,
    },
    /// The peer cannot be reached: no route, no listener, or no answer.
    #[error("{addr} unreachable: {reason}")]
    Unreachable {
        /// The address connected to.
        addr: SocketAddr,
        /// What the connection manager reported.
        reason: String,
    },
    /// A connection-manager step did not finish in time.
    #[error("connection manager: {op} for {addr} timed out")]
    CmTimeout {
        /// The step.
        op: &'static str,
        /// The address involved.
        addr: SocketAddr,
    },
    /// A QP of one device was given to the connection manager of another (contexts of one
    /// device are interchangeable here: see [`crate::Context::open_sibling`]).
    #[error("QP {qpn} is on device {qp_device}; {op} runs on device {device}")]
    WrongDevice {
        /// The connection-manager step (`rdma_connect`, `rdma_accept`).
        op: &'static str,
        /// QP number.
        qpn: u32,
        /// The QP's device.
        qp_device: String,
        /// The connection manager's device (the listener's, or the connecting context's).
        device: String,
    },
    /// Objects of two contexts were combined: a QP's PD, CQs and SRQ must come from one
    /// context, even when two contexts are of one device (each numbers its own objects).
    #[error("the {what} belongs to another context of {device} than the protection domain")]
    ForeignObject {
        /// The object from the other context (`send CQ`, `receive CQ`, `SRQ`).
        what: &'static str,
        /// The device of the protection domain.
        device: String,
    },
    /// The provider does not implement this.
    #[error("{what} is not supported by the {provider} provider")]
    Unsupported {
        /// What was asked.
        what: &'static str,
        /// Provider name.
        provider: &'static str,
    },
}

/// An error with its whole cause chain, each cause after a colon (`{}` of an error alone
/// prints only its top line: "cannot create a queue pair" without the device's reason).
///
/// # Examples
///
/// ```
/// let e = corelink_verbs::Error::AllocPd(std::io::Error::from_raw_os_error(12));
/// let text = corelink_verbs::chain(&e).to_string();
/// assert!(text.starts_with("cannot allocate a protection domain: "), "{text}");
/// ```
pub fn chain<'a>(e: &'a (dyn std::error::Error + 'static)) -> Chain<'a> {
    Chain(e)
}

/// What [`chain`] returns: displays an error and every `source()` below it.
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut last = self.0.to_string();
        f.write_str(&last)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            // A cause whose text its error already printed (a wrapper quoting it) goes once.
            let text = c.to_string();
            if !last.ends_with(&text) {
                write!(f, ": {text}")?;
            }
            last = text;
            cause = c.source();
        }
        Ok(())
    }
}

/// `io::Error` for an errno value.
pub fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// `io::Error` of kind `InvalidInput` with a message (what `soft` gives where a device says EINVAL).
pub fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}
