//! The messages between the control core and the workers (each way over its own SPSC ring),
//! and between a worker and an external client.

use std::net::SocketAddr;

use arrayvec::ArrayVec;
use corelink_verbs::{Provider, RemoteAddr, WcStatus};

use crate::request::{ConnId, ConnInfo};
use crate::ring::{Consumer, Producer};
use crate::tunables::{MAX_PRIVATE_DATA, MAX_QPS_PER_CONN};

/// Who issued a request: the worker's own handler, or external client number `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    Handler,
    Client(u16),
}

/// One QP of a connection, in RTS, with the control core's key for its connection-manager side.
pub(crate) struct NewLane<P: Provider> {
    pub(crate) qp: P::Qp,
    pub(crate) cm_key: u64,
}

/// Control core → worker.
pub(crate) enum ToWorker<P: Provider> {
    /// A connection, now the worker's: its QPs (lanes; at least one), all in RTS.
    NewConn { lanes: ArrayVec<NewLane<P>, MAX_QPS_PER_CONN>, info: ConnInfo, origin: Origin },
    /// A `connect` failed.
    ConnectFailed { token: u64, origin: Origin, error: crate::EngineError },
    /// The peer of the lane with this key disconnected (the whole connection closes).
    PeerClosed { cm_key: u64 },
    /// A new external client: the worker's ends of its two rings.
    AddClient { submit: Consumer<ExtRequest>, done: Producer<ExtCompletion> },
    /// Finish in-flight requests, close every connection, stop.
    Shutdown,
}

/// Worker → control core.
pub(crate) enum ToControl<P: Provider> {
    /// Connect to `addr` on behalf of this worker.
    Connect {
        addr: SocketAddr,
        private_data: ArrayVec<u8, MAX_PRIVATE_DATA>,
        token: u64,
        origin: Origin,
    },
    /// Disconnect the lane with this key (the worker is closing its connection).
    Disconnect { cm_key: u64 },
    /// The worker is done with the lane: drop its connection-manager state; reset the QP for
    /// reuse (or destroy it).
    Release { cm_key: u64, qp: P::Qp },
    /// The worker has closed everything and stops.
    Stopped,
}

/// What an external client asks of a worker.
#[derive(Debug)]
pub enum ExtOp {
    /// Connect to `addr` (the completion's `conn` names the new connection).
    Connect {
        /// Where.
        addr: SocketAddr,
    },
    /// Send `data`.
    Send {
        /// Immediate.
        imm: Option<u32>,
    },
    /// Write `data` to `remote`.
    Write {
        /// Where.
        remote: RemoteAddr,
        /// Immediate.
        imm: Option<u32>,
    },
    /// Read `len` bytes at `remote` into `data` (which needs that much capacity).
    Read {
        /// Where.
        remote: RemoteAddr,
        /// Bytes.
        len: usize,
    },
    /// Fetch-and-add on the word at `remote`.
    FetchAdd {
        /// Where.
        remote: RemoteAddr,
        /// Addend.
        add: u64,
    },
    /// Compare-and-swap on the word at `remote`.
    CompareSwap {
        /// Where.
        remote: RemoteAddr,
        /// Expected.
        compare: u64,
        /// New.
        swap: u64,
    },
}

/// A request from an external client. `data` is the payload (sends, writes, the private data
/// of a connect) or the destination (reads); it comes back in the completion, so the worker
/// neither allocates nor frees it.
#[derive(Debug)]
pub struct ExtRequest {
    /// The connection (ignored by `Connect`).
    pub conn: Option<ConnId>,
    /// What to do.
    pub op: ExtOp,
    /// Payload or destination.
    pub data: Vec<u8>,
    /// The client's token, returned in the completion.
    pub token: u64,
}

/// The outcome of an external request.
#[derive(Debug)]
pub struct ExtCompletion {
    /// The request's token.
    pub token: u64,
    /// The connection (for a `Connect`: the new one, if it succeeded).
    pub conn: Option<ConnId>,
    /// Outcome (`GeneralErr` for a refused or failed connect, see `error`).
    pub status: WcStatus,
    /// The request's `data`, back; a read's holds the bytes read.
    pub data: Vec<u8>,
    /// An atomic's old value.
    pub old_value: Option<u64>,
    /// Why a request failed before reaching the device (or why a connect failed).
    pub error: Option<crate::EngineError>,
}
