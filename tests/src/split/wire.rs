//! What the runner and its peer process say to each other: one [`Call`] per verb on an object
//! of side B, answered by a `Result<R, RemoteError>` whose `R` the call's variant fixes (noted
//! at each). Frames are a little-endian `u32` length and a postcard body (the workspace's
//! binary format, as the RPC layer's typed messages use it).

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use corelink_verbs::{
    AccessFlags, AhAttr, Error, QpAttr, QpCap, QpState, QpType, SendFlags, Sge, SrqAttr,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// A peer object's number (0 is never used).
pub(crate) type Id = u32;

/// Frames longer than this are refused (the largest real one is a region's bytes).
const MAX_FRAME: usize = 64 << 20;

/// A send request as the peer rebuilds it: objects by id, addresses in the peer's memory.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WireSend {
    pub wr_id: u64,
    pub op: WireOp,
    pub sgl: Vec<Sge>,
    pub flags: SendFlags,
    /// Address handle, QP number and Q_Key of a UD destination.
    pub ud: Option<(Id, u32, u32)>,
}

/// [`corelink_verbs::SendOp`] with its objects by id.
#[derive(Debug, Serialize, Deserialize)]
#[allow(missing_docs)]
pub(crate) enum WireOp {
    Send,
    SendWithImm(u32),
    SendWithInv(u32),
    Write(u64, u32),
    WriteWithImm(u64, u32, u32),
    Read(u64, u32),
    CompareSwap { addr: u64, rkey: u32, compare: u64, swap: u64 },
    FetchAdd { addr: u64, rkey: u32, add: u64 },
    BindMw { mw: Id, mr: Id, addr: u64, len: u64, access: AccessFlags },
    LocalInv(u32),
}

/// A receive request.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WireRecv {
    pub wr_id: u64,
    pub sgl: Vec<Sge>,
}

/// A region as created: what its `Mr` methods answer without asking.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct MrInfo {
    pub id: Id,
    pub addr: u64,
    pub len: usize,
    pub lkey: u32,
    pub rkey: u32,
    pub access: AccessFlags,
}

/// A QP as created.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct QpInfo {
    pub id: Id,
    pub qpn: u32,
    pub qp_type: QpType,
    pub cap: QpCap,
}

/// A connection request as it arrived.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RequestInfo {
    pub id: Id,
    pub private_data: Vec<u8>,
    pub peer_addr: SocketAddr,
}

/// An established connection.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ConnInfo {
    pub id: Id,
    pub peer_private_data: Vec<u8>,
}

/// What a connect or accept in progress came to: `Ok`: connected; `Err`: still pending (the
/// same id).
pub(crate) type Progress = Result<ConnInfo, Id>;

/// One verb on side B. The answer's type follows each variant's name.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Call {
    /// Id.
    Open { name: String },
    /// Id.
    OpenSibling { ctx: Id },
    /// DeviceAttr.
    QueryDevice { ctx: Id },
    /// PortAttr.
    QueryPort { ctx: Id, port: u8 },
    /// Gid.
    QueryGid { ctx: Id, port: u8, index: u32 },
    /// Id.
    AllocPd { ctx: Id },
    /// (Id, depth, handle).
    CreateCq { ctx: Id, depth: u32 },
    /// Option<AsyncEvent>.
    PollAsyncEvent { ctx: Id },
    /// (Id, local address).
    Listen { ctx: Id, addr: SocketAddr },
    /// Id.
    ConnectStart {
        ctx: Id,
        addr: SocketAddr,
        qp: Id,
        attr: QpAttr,
        private_data: Vec<u8>,
        timeout: Duration,
    },
    /// MrInfo.
    Register { pd: Id, len: usize, access: AccessFlags },
    /// (Id, rkey).
    AllocMw { pd: Id },
    /// (Id, handle).
    CreateSrq { pd: Id, attr: SrqAttr },
    /// QpInfo.
    CreateQp {
        pd: Id,
        qp_type: QpType,
        send_cq: Id,
        recv_cq: Id,
        srq: Option<Id>,
        cap: QpCap,
        sq_sig_all: bool,
    },
    /// Id.
    CreateAh { pd: Id, attr: AhAttr },
    /// ().
    MrWrite { mr: Id, offset: usize, data: Vec<u8> },
    /// Vec<u8>.
    MrRead { mr: Id, offset: usize, len: usize },
    /// u64.
    MrReadU64 { mr: Id, offset: usize },
    /// ().
    MrWriteU64 { mr: Id, offset: usize, value: u64 },
    /// u32.
    MwRkey { mw: Id },
    /// Vec<Wc>.
    Poll { cq: Id, max: usize },
    /// ().
    SrqPostRecv { srq: Id, wrs: Vec<WireRecv> },
    /// QpState.
    QpState { qp: Id },
    /// ().
    Modify { qp: Id, attr: QpAttr },
    /// ().
    PostSend { qp: Id, wrs: Vec<WireSend> },
    /// ().
    PostRecv { qp: Id, wrs: Vec<WireRecv> },
    /// Option<RequestInfo>.
    GetRequest { listener: Id, timeout: Duration },
    /// Id (of the Accepting).
    AcceptStart { request: Id, qp: Id, attr: QpAttr, private_data: Vec<u8> },
    /// ().
    Reject { request: Id, private_data: Vec<u8> },
    /// Progress.
    AcceptingPoll { accepting: Id, qp: Id, timeout: Duration },
    /// RemoteError (the error to report).
    AcceptingAbandon { accepting: Id, qp: Id },
    /// Progress.
    ConnectingPoll { connecting: Id, qp: Id, timeout: Duration },
    /// Option<CmEvent>.
    PollEvent { connection: Id, timeout: Duration },
    /// ().
    Disconnect { connection: Id },
    /// (): the object is destroyed.
    Drop { id: Id },
}

/// An `io::Error` as far as it travels: its OS error number, else its text.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Cause {
    errno: Option<i32>,
    text: String,
}

impl Cause {
    fn of(e: &io::Error) -> Cause {
        Cause { errno: e.raw_os_error(), text: e.to_string() }
    }

    fn text(text: String) -> Cause {
        Cause { errno: None, text }
    }

    pub(crate) fn into_io(self) -> io::Error {
        match self.errno {
            Some(n) => io::Error::from_raw_os_error(n),
            None => io::Error::other(self.text),
        }
    }
}

/// A verbs error of the peer: the variants the suite tells apart keep their fields, the rest
/// their message (with its causes).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum RemoteError {
    PostSend { qpn: u32, index: usize, cause: Cause },
    PostRecv { qpn: u32, index: usize, cause: Cause },
    PostSrqRecv { index: usize, cause: Cause },
    ModifyQp { qpn: u32, from: QpState, to: QpState, cause: Cause },
    Rejected { addr: SocketAddr, private_data: Vec<u8> },
    Unreachable { addr: SocketAddr, reason: String },
    Other(Cause),
}

fn io_source(e: &Error) -> Option<&io::Error> {
    std::error::Error::source(e).and_then(|s| s.downcast_ref::<io::Error>())
}

impl From<Error> for RemoteError {
    fn from(e: Error) -> RemoteError {
        let cause = |e: &Error| io_source(e).map_or_else(|| Cause::text(e.to_string()), Cause::of);
        match e {
            Error::PostSend { qpn, index, ref source } => {
                RemoteError::PostSend { qpn, index, cause: Cause::of(source) }
            }
            Error::PostRecv { qpn, index, ref source } => {
                RemoteError::PostRecv { qpn, index, cause: Cause::of(source) }
            }
            Error::PostSrqRecv { index, ref source } => {
                RemoteError::PostSrqRecv { index, cause: Cause::of(source) }
            }
            Error::ModifyQp { qpn, from, to, ref source } => {
                RemoteError::ModifyQp { qpn, from, to, cause: Cause::of(source) }
            }
            Error::Rejected { addr, private_data } => RemoteError::Rejected { addr, private_data },
            Error::Unreachable { addr, reason } => RemoteError::Unreachable { addr, reason },
            e => {
                // The whole message travels: the variant is not rebuilt, its words are.
                let errno = cause(&e).errno;
                RemoteError::Other(Cause { errno, text: corelink_verbs::chain(&e).to_string() })
            }
        }
    }
}

impl RemoteError {
    /// The verbs error it stands for; `other` wraps what has no variant of its own as the
    /// error of the verb that failed.
    pub(crate) fn into_error(self, other: impl FnOnce(io::Error) -> Error) -> Error {
        match self {
            RemoteError::PostSend { qpn, index, cause } => {
                Error::PostSend { qpn, index, source: cause.into_io() }
            }
            RemoteError::PostRecv { qpn, index, cause } => {
                Error::PostRecv { qpn, index, source: cause.into_io() }
            }
            RemoteError::PostSrqRecv { index, cause } => {
                Error::PostSrqRecv { index, source: cause.into_io() }
            }
            RemoteError::ModifyQp { qpn, from, to, cause } => {
                Error::ModifyQp { qpn, from, to, source: cause.into_io() }
            }
            RemoteError::Rejected { addr, private_data } => Error::Rejected { addr, private_data },
            RemoteError::Unreachable { addr, reason } => Error::Unreachable { addr, reason },
            RemoteError::Other(c) => {
                other(io::Error::other(format!("in the peer process: {}", c.text)))
            }
        }
    }
}

/// Writes one frame holding `v`.
pub(crate) fn send<T: Serialize, W: Write>(w: &mut W, v: &T) -> io::Result<()> {
    write_frame(w, &postcard::to_stdvec(v).map_err(io::Error::other)?)
}

/// Writes one frame holding the encoded `body`.
pub(crate) fn write_frame<W: Write>(w: &mut W, body: &[u8]) -> io::Result<()> {
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(body);
    w.write_all(&frame)
}

/// Reads one frame and decodes it; `Ok(None)` at a clean end of stream.
pub(crate) fn recv<T: DeserializeOwned, R: Read>(r: &mut R) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes (at most {MAX_FRAME})"),
        ));
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    postcard::from_bytes(&body).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
