//! An endpoint's counters.

/// What an endpoint counted since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RpcMetrics {
    /// Calls accepted.
    pub calls: u64,
    /// Calls that waited in the endpoint for a credit (backpressure) before they went.
    pub waited: u64,
    /// Large calls made while every slot of the arena was out: they waited (in `waited`
    /// too) until a slot was free.
    pub slot_waits: u64,
    /// Calls merged with an identical one in flight (`Endpoint::set_mergeable`): not sent,
    /// ended with that one's outcome.
    pub merged: u64,
    /// Calls placed on a member of a group ([`crate::Rpc::call_group`]; also in `calls`).
    pub balanced: u64,
    /// Calls on a group refused because none of its members was up
    /// ([`crate::RpcError::NoServer`]; not in `calls`).
    pub no_server: u64,
    /// Calls ended with a response.
    pub responses: u64,
    /// Calls ended with an error (any [`crate::RpcError`]).
    pub errors: u64,
    /// Calls ended by their deadline.
    pub timeouts: u64,
    /// Requests whose handler ran.
    pub handled: u64,
    /// Requests held back to keep their session's order: they came while a large request
    /// before them on the session was still being read, and ran after it.
    pub held: u64,
    /// Requests seen again (same slot and sequence number), answered from the stored response
    /// without running the handler.
    pub duplicates: u64,
    /// Messages for a call that is over (a response after its timeout, an older request).
    pub stale: u64,
    /// Messages refused by the decoder or the session's checks (see [`crate::Malformed`]).
    pub malformed: u64,
    /// Connections refused as sessions (no hello, or more credits than receives).
    pub refused: u64,
    /// Messages dropped because no buffer was free for the answer.
    pub no_buffer: u64,
    /// Answers the engine refused to send (the connection closing, its request table full).
    pub send_refused: u64,
    /// Calls sent again on a resumable session's new connection (they were in flight when the
    /// last one was lost).
    pub resent: u64,
    /// Server sessions carried over to their client's new connection (by the key of its
    /// hello): their record kept, so that requests sent again run at most once.
    pub resumed: u64,
    /// Requests sent again that found no record of their slot (the session was new to this
    /// server): answered [`crate::RpcError::OutcomeUnknown`], not run.
    pub lost: u64,
    /// Server sessions whose client did not come back within `EndpointConfig::resume`: ended,
    /// with their records.
    pub expired: u64,
    /// Sends that carried several messages packed (`EndpointConfig::pack_max`).
    pub packs: u64,
    /// Messages that went in those sends.
    pub packed: u64,
    /// States the endpoint's bookkeeping rules out, met (0 unless there is a bug).
    pub invariant_misses: u64,
}
