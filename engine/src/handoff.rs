//! The messages between the control core and the workers (each way over its own SPSC ring),
//! and between a worker and an external client.

use std::net::SocketAddr;

use arrayvec::ArrayVec;
use corelink_verbs::Provider;

use crate::client::{ClientRequest, Event, Overflow};
use crate::request::ConnInfo;
use crate::ring::{Consumer, Producer};
use crate::tunables::{MAX_PRIVATE_DATA, MAX_QPS_PER_CONN};

/// Who issued a request, or owns a connection (hears its messages and its close): the worker's
/// own handler, or external client number `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    Handler,
    Client(u16),
    /// The worker's own keepalive probe (nobody is told how it ended; a failure closes its
    /// connection).
    Keepalive,
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
