//! The crate's one error type, and what a malformed message got wrong.

use std::fmt;

use corelink_engine::EngineError;

use crate::ids::{GroupId, ReqType, SessionId};

/// Why a call ended without a response, or an endpoint refused something.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The call's deadline passed before its response came.
    #[error("the call's deadline passed before its response came")]
    Timeout,
    /// The session closed (or never connected) before the call's response came, or the call
    /// was made on a session that has since ended (its peer went away while no call of it
    /// was in flight, say): connecting again is the way on.
    #[error("the session closed before the call's response came")]
    SessionClosed,
    /// The call was in flight when its resumable session's connection was lost
    /// ([`crate::Rpc::connect_with`]), and the server that answered the request sent again
    /// had no record of the session (it restarted, or kept the record less time than the
    /// client took to come back, `EndpointConfig::resume`): the request may have run once,
    /// and did not run again.
    #[error(
        "the call's connection was lost, and the server had no record of the session when it \
         was sent again (it restarted, or EndpointConfig::resume passed): it may have run once"
    )]
    OutcomeUnknown,
    /// The peer's handler refused the request, with its code.
    #[error("the peer's handler rejected the request (code {code})")]
    Rejected {
        /// The handler's code.
        code: u32,
    },
    /// A request or response of `len` bytes does not fit in one message of at most `max`.
    #[error("a message of {len} bytes does not fit (at most {max})")]
    TooLarge {
        /// Payload bytes.
        len: usize,
        /// Payload bytes a message may carry here.
        max: usize,
    },
    /// The peer has no handler registered for the request type.
    #[error("the peer has no handler for {0}")]
    NoSuchType(ReqType),
    /// The peer had no buffer to take the request in (its pools were exhausted): the request
    /// did not run, and calling again is safe.
    #[error("the peer had no buffer for the request (its pools are exhausted); it did not run")]
    PeerBusy,
    /// The request ran on the peer, but its response found no buffer there (its pools or its
    /// slots for large messages were exhausted): it is not answered, and calling again runs
    /// it again.
    #[error(
        "the request ran on the peer, but its response found no buffer there (its pools or \
         large-message slots are exhausted); calling again runs it again"
    )]
    Unanswered,
    /// No open session has this id on this endpoint.
    #[error("no session {0} on this endpoint")]
    NoSuchSession(SessionId),
    /// A service's own request's token is beyond what the endpoint keeps for it.
    #[error("a service request's token {token:#x} is beyond {max:#x} (MAX_SERVICE_TOKEN)")]
    ServiceToken {
        /// The token given.
        token: u64,
        /// The largest a service may use.
        max: u64,
    },
    /// A service's own send on a session (`Rpc::submit`): messages on a session are the
    /// endpoint's (they would be taken for malformed RPC messages).
    #[error("{0}: a session's messages are the endpoint's; sends go as calls")]
    SendOnSession(SessionId),
    /// The endpoint's call table is full (`EndpointConfig::max_calls`): the call was not made.
    #[error("{max} calls are in flight on this endpoint already (EndpointConfig::max_calls)")]
    TooManyCalls {
        /// The table's size.
        max: usize,
    },
    /// The endpoint's session table is full (`EndpointConfig::max_sessions`).
    #[error("{max} sessions are open on this endpoint already (EndpointConfig::max_sessions)")]
    TooManySessions {
        /// The table's size.
        max: usize,
    },
    /// More credits per session than the engine keeps receives posted per connection.
    #[error(
        "{credits} credits per session, but a connection keeps only {recvs} receives posted \
         (worker.recvs_per_conn per lane): a client could send what the server has no receive for"
    )]
    TooManyCredits {
        /// Credits asked for.
        credits: u32,
        /// Receives posted per connection lane.
        recvs: u32,
    },
    /// A request type beyond the endpoint's table (`EndpointConfig::max_types`), or one
    /// registered twice.
    #[error("{ty} cannot be registered (beyond EndpointConfig::max_types, or registered already)")]
    BadType {
        /// The type.
        ty: ReqType,
    },
    /// Large messages of `len` bytes cannot be: no pool class of the worker holds them (the
    /// receiver reads a large payload into one), or no slots were configured.
    #[error(
        "large messages of {len} bytes need a pool class that holds them (worker.pools) and at \
         least one EndpointConfig::large_slots"
    )]
    NoLargeBuffers {
        /// Payload bytes.
        len: usize,
    },
    /// Every slot for large messages is out (`EndpointConfig::large_slots`): a handler's
    /// large response could not take one ([`crate::Response::alloc`]; its client hears
    /// [`RpcError::Unanswered`]). A large call waits for a slot instead.
    #[error("all {slots} slots for large messages are out (EndpointConfig::large_slots)")]
    LargeSlotsBusy {
        /// Slots.
        slots: usize,
    },
    /// The worker a [`crate::Handle`] calls into stopped (or dropped the handle's ring)
    /// before the call ended.
    #[error("the worker stopped before the call ended")]
    WorkerGone,
    /// The typed layer could not encode a request or response, or decode one that came
    /// (`postcard`'s reason).
    #[error("the typed layer could not encode or decode a message")]
    Codec(#[source] postcard::Error),
    /// A request class beyond the engine's (`Endpoint::set_class`).
    #[error("request class {class} does not exist (the engine has {classes})")]
    NoSuchClass {
        /// The class asked for.
        class: u8,
        /// Classes the engine has.
        classes: usize,
    },
    /// The identical call this one was merged with (`Endpoint::set_mergeable`) failed in the
    /// engine (that call has the engine's error).
    #[error("the identical call this one was merged with failed in the engine")]
    MergedEngineFailure,
    /// No member of the group is up (every one closed, failed or was removed): the call on
    /// the group was not made ([`crate::Rpc::call_group`]).
    #[error("no session of {group} is up to take the call")]
    NoServer {
        /// The group.
        group: GroupId,
    },
    /// No group has this id on this endpoint.
    #[error("no {0} on this endpoint")]
    NoSuchGroup(GroupId),
    /// The endpoint's table of groups is full (as many as `EndpointConfig::max_sessions`).
    #[error("{max} groups are on this endpoint already (as many as EndpointConfig::max_sessions)")]
    TooManyGroups {
        /// The table's size.
        max: usize,
    },
    /// A message that breaks the wire format (counted in the endpoint's metrics).
    #[error("malformed message: {0}")]
    Malformed(Malformed),
    /// The engine refused (a connect, a buffer, a send).
    #[error("the engine refused")]
    Engine(#[from] EngineError),
}

impl RpcError {
    /// The same error for a call merged with the one that got it (the engine's errors, which
    /// cannot be copied, become [`RpcError::MergedEngineFailure`]).
    pub(crate) fn again(&self) -> RpcError {
        match self {
            RpcError::Timeout => RpcError::Timeout,
            RpcError::SessionClosed => RpcError::SessionClosed,
            RpcError::OutcomeUnknown => RpcError::OutcomeUnknown,
            RpcError::Rejected { code } => RpcError::Rejected { code: *code },
            RpcError::TooLarge { len, max } => RpcError::TooLarge { len: *len, max: *max },
            RpcError::NoSuchType(t) => RpcError::NoSuchType(*t),
            RpcError::PeerBusy => RpcError::PeerBusy,
            RpcError::Unanswered => RpcError::Unanswered,
            RpcError::NoSuchSession(s) => RpcError::NoSuchSession(*s),
            RpcError::ServiceToken { token, max } => {
                RpcError::ServiceToken { token: *token, max: *max }
            }
            RpcError::SendOnSession(s) => RpcError::SendOnSession(*s),
            RpcError::TooManyCalls { max } => RpcError::TooManyCalls { max: *max },
            RpcError::TooManySessions { max } => RpcError::TooManySessions { max: *max },
            RpcError::TooManyCredits { credits, recvs } => {
                RpcError::TooManyCredits { credits: *credits, recvs: *recvs }
            }
            RpcError::BadType { ty } => RpcError::BadType { ty: *ty },
            RpcError::NoLargeBuffers { len } => RpcError::NoLargeBuffers { len: *len },
            RpcError::LargeSlotsBusy { slots } => RpcError::LargeSlotsBusy { slots: *slots },
            RpcError::WorkerGone => RpcError::WorkerGone,
            RpcError::Codec(e) => RpcError::Codec(e.clone()),
            RpcError::NoSuchClass { class, classes } => {
                RpcError::NoSuchClass { class: *class, classes: *classes }
            }
            RpcError::NoServer { group } => RpcError::NoServer { group: *group },
            RpcError::NoSuchGroup(g) => RpcError::NoSuchGroup(*g),
            RpcError::TooManyGroups { max } => RpcError::TooManyGroups { max: *max },
            RpcError::MergedEngineFailure | RpcError::Engine(_) => RpcError::MergedEngineFailure,
            RpcError::Malformed(m) => RpcError::Malformed(*m),
        }
    }
}

/// What a malformed message got wrong (see the wire format in the crate's docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// Shorter than the header.
    Truncated {
        /// Bytes received.
        len: usize,
    },
    /// The magic number is not the format's.
    Magic(u16),
    /// A version this endpoint does not speak.
    Version(u8),
    /// A message kind that does not exist.
    Kind(u8),
    /// A reserved byte is not zero (the hello's last).
    Reserved(u16),
    /// Flags that do not exist, or [`crate::wire::LARGE`] on an error message.
    Flags(u16),
    /// The header's payload length disagrees with the bytes that came.
    Length {
        /// What the header says.
        said: u32,
        /// Payload bytes that came.
        got: usize,
    },
    /// A status that does not exist, or one that does not go with the kind (a request or a
    /// response says 0, an error message a known error with its 8-byte argument).
    Status(u16),
    /// Sequence number 0 (sequences start at 1).
    Sequence,
    /// A slot beyond the session's.
    Slot(u16),
    /// A kind this side of a session does not take (a request at a client, a response at a
    /// server).
    Direction,
    /// The session field names another session.
    Session(u32),
    /// Bytes after a message that is not flagged [`crate::wire::PACKED`].
    Trailing {
        /// Bytes after it.
        len: usize,
    },
    /// A message flagged [`crate::wire::PACKED`] ends its receive: the next is missing.
    PackedEnd,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Malformed::Truncated { len } => {
                write!(f, "{len} bytes, shorter than the {}-byte header", crate::wire::HEADER)
            }
            Malformed::Magic(m) => write!(f, "magic {m:#06x} is not the format's"),
            Malformed::Version(v) => write!(f, "version {v} is not spoken here"),
            Malformed::Kind(k) => write!(f, "no message kind {k}"),
            Malformed::Reserved(r) => write!(f, "reserved field {r:#06x} is not zero"),
            Malformed::Flags(x) => write!(f, "flags {x:#06x} are not the format's"),
            Malformed::Length { said, got } => {
                write!(f, "the header says {said} payload bytes, {got} came")
            }
            Malformed::Status(s) => write!(f, "status {s} does not go with the message's kind"),
            Malformed::Sequence => f.write_str("sequence number 0"),
            Malformed::Slot(s) => write!(f, "slot {s} is beyond the session's"),
            Malformed::Direction => f.write_str("a kind this side of the session does not take"),
            Malformed::Session(s) => write!(f, "session field {s:#x} names another session"),
            Malformed::Trailing { len } => {
                write!(f, "{len} bytes after a message that is not flagged packed")
            }
            Malformed::PackedEnd => {
                f.write_str("a message flagged packed ends its receive: the next is missing")
            }
        }
    }
}

/// Results of this crate.
pub type Result<T, E = RpcError> = std::result::Result<T, E>;
