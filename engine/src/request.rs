//! What applications ask of a connection and what they are told back.

use std::fmt;

use corelink_verbs::{RemoteAddr, WcStatus};

/// A connection, as the worker owning it numbers it (slot and generation).
#[derive(Clone, Copy, Debug, Eq, PartialOrd, Ord)]
#[repr(C)]
pub struct ConnId {
    /// The owning worker's index.
    pub worker: u16,
    pub(crate) slot: u16,
    pub(crate) generation: u32,
}

impl ConnId {
    /// Its slot on its worker, below the worker's `worker.max_conns`: for tables indexed by
    /// connection (a slot is reused by later connections, which have other generations: keep
    /// the whole id beside the entry to tell them apart).
    #[inline(always)]
    pub fn index(self) -> usize {
        usize::from(self.slot)
    }

    /// All three fields in one word (its memory layout, so that a comparison is one load).
    #[inline(always)]
    fn word(self) -> u64 {
        u64::from(self.worker) | u64::from(self.slot) << 16 | u64::from(self.generation) << 32
    }
}

impl PartialEq for ConnId {
    /// Equal when every field is (as derived), compared as one word.
    #[inline(always)]
    fn eq(&self, other: &Self) -> bool {
        self.word() == other.word()
    }
}

impl std::hash::Hash for ConnId {
    /// The word equality compares (so equal ids hash alike).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.word());
    }
}

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}c{}.{}", self.worker, self.slot, self.generation)
    }
}

/// The kinds of request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Send (with or without an immediate).
    Send,
    /// RDMA write (with or without an immediate).
    Write,
    /// RDMA read.
    Read,
    /// Atomic fetch-and-add.
    FetchAdd,
    /// Atomic compare-and-swap.
    CompareSwap,
}

/// A request on a connection: the operation, with the local buffer `B` it uses. One vocabulary
/// for every issuer: a handler's buffers are registered [`Buf`](crate::Buf)s (`Op<Buf<P>>`, zero-copy), an
/// external [`crate::Client`]'s are plain vectors (`Op<Vec<u8>>`, copied into registered
/// buffers by the worker as it takes the request off the client's ring).
#[derive(Debug)]
pub enum Op<B> {
    /// Send `buf`'s bytes, with an optional immediate.
    Send {
        /// Payload (its length is what is sent).
        buf: B,
        /// Immediate.
        imm: Option<u32>,
    },
    /// Write `buf`'s bytes to `remote`, with an optional immediate.
    Write {
        /// Payload.
        buf: B,
        /// Where, in the peer's memory.
        remote: RemoteAddr,
        /// Immediate (consumes a receive at the peer).
        imm: Option<u32>,
    },
    /// Read `buf.len()` bytes at `remote` into `buf`.
    Read {
        /// Destination (its length is what is read).
        buf: B,
        /// Where, in the peer's memory.
        remote: RemoteAddr,
    },
    /// Add `add` to the 8-byte word at `remote`; the old value comes back.
    FetchAdd {
        /// The 8-byte-aligned word.
        remote: RemoteAddr,
        /// Addend.
        add: u64,
    },
    /// Store `swap` at `remote` if it holds `compare`; the old value comes back.
    CompareSwap {
        /// The 8-byte-aligned word.
        remote: RemoteAddr,
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
}

impl OpKind {
    /// Its position in `[Send, Write, Read, FetchAdd, CompareSwap]`.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether it counts against a QP's outstanding reads and atomics (`max_rd_atomic`).
    #[inline(always)]
    pub(crate) fn is_rd_atomic(self) -> bool {
        matches!(self, OpKind::Read | OpKind::FetchAdd | OpKind::CompareSwap)
    }
}

impl<B> Op<B> {
    /// The kind.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Send { .. } => OpKind::Send,
            Op::Write { .. } => OpKind::Write,
            Op::Read { .. } => OpKind::Read,
            Op::FetchAdd { .. } => OpKind::FetchAdd,
            Op::CompareSwap { .. } => OpKind::CompareSwap,
        }
    }

    /// The same operation with its buffer made a `C` by `f` (atomics have none).
    pub fn map_buf<C>(self, f: impl FnOnce(B) -> C) -> Op<C> {
        match self {
            Op::Send { buf, imm } => Op::Send { buf: f(buf), imm },
            Op::Write { buf, remote, imm } => Op::Write { buf: f(buf), remote, imm },
            Op::Read { buf, remote } => Op::Read { buf: f(buf), remote },
            Op::FetchAdd { remote, add } => Op::FetchAdd { remote, add },
            Op::CompareSwap { remote, compare, swap } => Op::CompareSwap { remote, compare, swap },
        }
    }

    /// The same operation with its buffer made a `C` by `f` (atomics have none); when `f`
    /// fails, the operation comes back whole with `f`'s error.
    #[allow(clippy::result_large_err)]
    pub fn try_map_buf<C, E>(
        self,
        f: impl FnOnce(B) -> Result<C, (B, E)>,
    ) -> Result<Op<C>, (Op<B>, E)> {
        Ok(match self {
            Op::Send { buf, imm } => match f(buf) {
                Ok(buf) => Op::Send { buf, imm },
                Err((buf, e)) => return Err((Op::Send { buf, imm }, e)),
            },
            Op::Write { buf, remote, imm } => match f(buf) {
                Ok(buf) => Op::Write { buf, remote, imm },
                Err((buf, e)) => return Err((Op::Write { buf, remote, imm }, e)),
            },
            Op::Read { buf, remote } => match f(buf) {
                Ok(buf) => Op::Read { buf, remote },
                Err((buf, e)) => return Err((Op::Read { buf, remote }, e)),
            },
            Op::FetchAdd { remote, add } => Op::FetchAdd { remote, add },
            Op::CompareSwap { remote, compare, swap } => Op::CompareSwap { remote, compare, swap },
        })
    }
}

/// The outcome of a request, told to whoever issued it (with the issuer's kind of buffer `B`,
/// as in [`Op`]).
#[derive(Debug)]
pub struct Done<B> {
    /// The connection.
    pub conn: ConnId,
    /// The issuer's token.
    pub token: u64,
    /// What it was.
    pub kind: OpKind,
    /// How it ended (`WrFlushErr` when the connection closed first).
    pub status: WcStatus,
    /// The request's buffer, back (a read's holds the bytes read).
    pub buf: Option<B>,
    /// An atomic's old value.
    pub old_value: Option<u64>,
    /// For a request flushed (`WrFlushErr`) because its connection closed: why it closed, the
    /// root cause (a failed request among them ended with that status itself, and `None`
    /// here). A consequence, not a failure of its own.
    pub closed_by: Option<CloseReason>,
}

/// An incoming message: a send, or a write-with-immediate's notice.
#[derive(Debug)]
pub struct Message<'a> {
    /// The payload of a send (empty for a write-with-immediate, whose data is in memory).
    pub data: &'a [u8],
    /// The immediate, if one came.
    pub imm: Option<u32>,
    /// Bytes the peer wrote, for a write-with-immediate.
    pub written: Option<u32>,
}

/// What a worker knows of a connection when it gets it.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// The peer's private data (after the engine's own header).
    pub private_data: Vec<u8>,
    /// The largest send the peer takes (its receive buffers, `worker.recv_size`; `None` for a
    /// peer that did not say): a larger send is refused at submit.
    pub peer_recv_size: Option<u32>,
    /// Whether this side connected (else it accepted).
    pub initiated: bool,
    /// The token of the `connect` that made it (0 when accepted).
    pub token: u64,
    /// Its lanes (QPs it stripes requests over).
    pub lanes: u32,
    /// Receives this side keeps posted on each lane (`worker.recvs_per_conn` shared over the
    /// lanes): how many messages the peer may have in flight towards one lane without one
    /// finding no receive (credits, for a protocol on top).
    pub recvs_per_lane: u32,
}

/// Why a connection closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// This side asked.
    Local,
    /// The peer disconnected.
    Peer,
    /// The peer went away after refusing a request with this status (its memory was gone, as
    /// when its process ends, or the request reached outside what it offers, which fails the
    /// peer's queue pair too): the connection manager saw its disconnect within
    /// `worker.peer_grace_ms` of the refusal.
    PeerGone(WcStatus),
    /// A request failed and the QP went to the error state.
    Error(WcStatus),
    /// A receive could not be posted again (the verbs call failed; see the worker's metrics):
    /// the connection would run out of receives, so it closes.
    RecvPostFailed,
    /// The engine is shutting down.
    Shutdown,
    /// The connection had been idle for `worker.keepalive_ms` and the worker's probe failed
    /// with this status (`RetryExcErr`: no acknowledgement): the peer died, or its wire did.
    Unanswered(WcStatus),
    /// The device reported an error it could not put in a completion (an asynchronous event:
    /// a QP's fatal error, the worker's CQ overrun, the device failed).
    Device(corelink_verbs::AsyncEventKind),
}

impl fmt::Display for CloseReason {
    /// What a user needs to know: who ended it and how that was seen.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::Local => f.write_str("this side closed it"),
            CloseReason::Peer => f.write_str(
                "the peer went away (its side disconnected, or its process ended: the \
                 connection manager saw the disconnect)",
            ),
            CloseReason::PeerGone(s) => write!(
                f,
                "the peer went away after refusing a request with {s} (its memory was gone, \
                 as when its process ends, or the request reached outside what it offers), \
                 then the connection manager saw the disconnect"
            ),
            CloseReason::Error(s @ WcStatus::RetryExcErr) => write!(
                f,
                "a request failed with {s}: the peer stopped answering (no acknowledgement \
                 within worker.timeout, worker.retry_cnt + 1 times)"
            ),
            CloseReason::Error(s @ WcStatus::RnrRetryExcErr) => write!(
                f,
                "a request failed with {s}: the peer had no receive posted (worker.rnr_retry \
                 retries of worker.min_rnr_timer each)"
            ),
            CloseReason::Error(s) => write!(f, "a request or a receive failed with {s}"),
            CloseReason::RecvPostFailed => f.write_str("a receive could not be posted again"),
            CloseReason::Shutdown => f.write_str("the engine shut down"),
            CloseReason::Unanswered(s) => write!(
                f,
                "the peer stopped answering: the connection was idle for worker.keepalive_ms \
                 and the keepalive probe failed with {s} (no acknowledgement within \
                 worker.timeout, worker.retry_cnt + 1 times: the peer or its wire died)"
            ),
            CloseReason::Device(kind) => write!(
                f,
                "the device reported {kind:?} (an error it could not put in a completion)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ConnId;

    #[test]
    fn close_reasons_say_who_and_how() {
        use super::CloseReason;
        use corelink_verbs::WcStatus;
        assert!(CloseReason::Peer.to_string().contains("the peer went away"));
        let gone = CloseReason::PeerGone(WcStatus::RemAccessErr).to_string();
        assert!(gone.contains("the peer went away") && gone.contains("REM_ACCESS"), "{gone}");
        let retry = CloseReason::Error(WcStatus::RetryExcErr).to_string();
        assert!(retry.contains("stopped answering") && retry.contains("worker.timeout"), "{retry}");
        let flush = CloseReason::Error(WcStatus::WrFlushErr).to_string();
        assert!(flush.contains("failed with"), "{flush}");
        let idle = CloseReason::Unanswered(WcStatus::RetryExcErr).to_string();
        assert!(idle.contains("keepalive") && idle.contains("stopped answering"), "{idle}");
        assert!(!idle.contains("  "), "one space between words: {idle}");
        let dev = CloseReason::Device(corelink_verbs::AsyncEventKind::CqErr).to_string();
        assert!(dev.contains("CqErr") && dev.contains("device"), "{dev}");
    }

    #[test]
    fn conn_ids_are_equal_exactly_when_every_field_is() {
        let id = |worker, slot, generation| ConnId { worker, slot, generation };
        let a = id(1, 2, 3);
        assert_eq!(a, id(1, 2, 3));
        for b in [id(0, 2, 3), id(1, 0, 3), id(1, 2, 0), id(2, 1, 3), id(3, 2, 1)] {
            assert_ne!(a, b);
        }
        let set: std::collections::HashSet<ConnId> =
            [a, id(1, 2, 3), id(1, 2, 4), id(u16::MAX, u16::MAX, u32::MAX)].into_iter().collect();
        assert_eq!(set.len(), 3);
    }
}
