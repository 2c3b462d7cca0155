//! The messages between the control core and the workers (each way over its own SPSC ring),
//! and between a worker and an external client.

use std::net::SocketAddr;

use arrayvec::ArrayVec;
use corelink_verbs::Provider;

use crate::client::{ClientRequest, Event, Overflow};
use crate::request::{ConnId, ConnInfo};
use crate::ring::{Consumer, Producer};
use crate::tunables::{MAX_PRIVATE_DATA, MAX_QPS_PER_CONN};

/// Who issued a request, or owns a connection (hears its messages and its close): the worker's
/// own handler, or external client number `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Origin {
    Handler,
    Client(u16),
    /// The worker's own keepalive probe (nobody is told how it ended; a failure closes its
    /// connection).
    Keepalive,
    /// The worker's own fence: a signalled zero-length write posted on a closing connection's
    /// lane behind quiet requests that asked for no completion, so that one comes and retires
    /// them (nobody is told how it ended).
    Fence,
}

/// The QPs of one connection (its lanes, in lane order).
pub(crate) type Qps<P> = ArrayVec<<P as Provider>::Qp, MAX_QPS_PER_CONN>;

/// Which connection set-up of the control core a prime belongs to (the worker hands it back
/// with its answer, unread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PrimeFor {
    /// The connect with this number.
    Connect(u64),
    /// The accepted connection with this nonce.
    Accept(u64),
}

/// One QP of a connection, in RTS, with the control core's key for its connection-manager side.
pub(crate) struct NewLane<P: Provider> {
    pub(crate) qp: P::Qp,
    pub(crate) cm_key: u64,
}

/// Control core → worker.
///
/// A connection comes up in two steps, so that its receives are posted before its peer can
/// send: `Prime` lends the worker its QPs (in INIT) to post them on (the worker keeps a slot for
/// it and answers `ToControl::Primed` with the QPs), then, once the connection manager's
/// exchange is done, `NewConn` hands it over, or `Unprime` gives the QPs back to flush.
pub(crate) enum ToWorker<P: Provider> {
    /// Post a coming connection's receives on these QPs (its lanes, in INIT).
    Prime { prime: PrimeFor, qps: Qps<P> },
    /// A connection, now the worker's (primed as `conn`): its QPs (lanes; at least one), all
    /// in RTS. `told`: its client (`origin`) heard of it from the control core already.
    NewConn {
        conn: ConnId,
        lanes: ArrayVec<NewLane<P>, MAX_QPS_PER_CONN>,
        info: ConnInfo,
        origin: Origin,
        told: bool,
    },
    /// The connection primed as `conn` did not come up: its QPs back, to flush and release.
    Unprime { conn: ConnId, qps: Qps<P> },
    /// A `connect` failed.
    ConnectFailed { token: u64, origin: Origin, error: crate::EngineError },
    /// The peer of the lane with this key disconnected (the whole connection closes).
    PeerClosed { cm_key: u64 },
    /// A new external client: the worker's ends of its two rings, and where its events go
    /// that the ring could not take when the worker stops.
    AddClient {
        /// Its number (clients are numbered in the order they are made, from 0).
        number: u16,
        requests: Consumer<ClientRequest>,
        events: Producer<Event>,
        overflow: Overflow,
        waiter: std::sync::Arc<crate::client::Waiter>,
    },
    /// An asynchronous event of the control core's context, which this worker shares (see
    /// `WorkerLink::shares_context`).
    DeviceEvent(corelink_verbs::AsyncEvent),
    /// Finish in-flight requests, close every connection, stop.
    Shutdown,
}

/// A connect's private data, as a worker hands it to the control core.
pub(crate) type ConnectData = ArrayVec<u8, MAX_PRIVATE_DATA>;

/// Worker → control core.
pub(crate) enum ToControl<P: Provider> {
    /// The answer to a `Prime`: the QPs back, with their receives posted for connection
    /// `conn` (or the reason the worker takes no connection now).
    Primed { prime: PrimeFor, conn: Result<ConnId, crate::EngineError>, qps: Qps<P> },
    /// QPs of a connection that never came up, flushed: back to the pool.
    Return { qps: Qps<P> },
    /// Connect to `addr` on behalf of this worker.
    Connect { addr: SocketAddr, private_data: ConnectData, token: u64, origin: Origin },
    /// Disconnect the lane with this key (the worker is closing its connection).
    Disconnect { cm_key: u64 },
    /// The worker is done with the lane: drop its connection-manager state; reset the QP for
    /// reuse (or destroy it).
    Release { cm_key: u64, qp: P::Qp },
    /// The worker has closed everything and stops.
    Stopped,
}
