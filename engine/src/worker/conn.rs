//! A connection as its worker holds it: the QP, posted receives, requests queued this
//! iteration, and how many are in flight.

use std::collections::VecDeque;

use corelink_verbs::{Provider, RemoteAddr, WcStatus};

use crate::handoff::Origin;
use crate::pool::Buf;
use crate::request::{ConnId, ConnInfo, OpKind};

/// A request accepted by `Cx`, waiting for the next flush.
#[derive(Debug)]
pub(crate) struct Queued<P: Provider> {
    pub(crate) kind: OpKind,
    pub(crate) buf: Option<Buf<P>>,
    pub(crate) remote: RemoteAddr,
    pub(crate) imm: Option<u32>,
    /// Addend (fetch-and-add) or compare value (compare-and-swap).
    pub(crate) arg: u64,
    /// Swap value (compare-and-swap).
    pub(crate) swap: u64,
    pub(crate) token: u64,
    pub(crate) origin: Origin,
    /// For external clients: the caller's vector, given back in the completion.
    pub(crate) ext_data: Option<Vec<u8>>,
}

/// A request on the device.
#[derive(Debug)]
pub(crate) struct InFlight<P: Provider> {
    pub(crate) conn: ConnId,
    pub(crate) kind: OpKind,
    pub(crate) buf: Option<Buf<P>>,
    pub(crate) token: u64,
    pub(crate) origin: Origin,
    pub(crate) ext_data: Option<Vec<u8>>,
}

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Open,
    /// Closing: nothing new is accepted; waiting for in-flight requests and receives to flush.
    Closing,
}

/// A connection.
#[derive(Debug)]
pub(crate) struct Conn<P: Provider> {
    pub(crate) id: ConnId,
    pub(crate) qp: P::Qp,
    pub(crate) cm_key: u64,
    pub(crate) info: ConnInfo,
    /// Receive buffers, by receive index; `None` while handed to the handler or after a flush.
    pub(crate) recvs: Vec<Option<Buf<P>>>,
    /// Receives posted and not yet completed.
    pub(crate) recvs_posted: usize,
    pub(crate) queued: VecDeque<Queued<P>>,
    /// Requests on the device.
    pub(crate) outstanding: u32,
    pub(crate) phase: Phase,
    /// Why it is closing.
    pub(crate) reason: Option<crate::request::CloseReason>,
    /// Set once the control core has been asked to disconnect.
    pub(crate) disconnect_sent: bool,
}

impl<P: Provider> Conn<P> {
    /// Whether everything posted has come back, so the connection can be released.
    pub(crate) fn drained(&self) -> bool {
        self.outstanding == 0 && self.recvs_posted == 0 && self.queued.is_empty()
    }

    /// The first error status of a failed request closes the connection with it.
    pub(crate) fn note_error(&mut self, status: WcStatus) {
        if self.reason.is_none() {
            self.reason = Some(crate::request::CloseReason::Error(status));
        }
        self.phase = Phase::Closing;
    }
}
