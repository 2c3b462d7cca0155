//! Provider-neutral value types: flags, opcodes, statuses, scatter/gather entries, completions,
//! QP capabilities and attributes, device and port attributes, async events.
//!
//! Nothing here holds a pointer or a provider object; work requests, which name provider objects
//! (address handles, memory windows), live in [`crate::wr`].

use std::fmt;

bitflags::bitflags! {
    /// Access rights of a memory region, a memory window or a QP's remote access.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
    pub struct AccessFlags: u32 {
        /// The local device may write the memory (receives, RDMA read results, atomics' old values).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA-write it.
        const REMOTE_WRITE = 1 << 1;
        /// Peers may RDMA-read it.
        const REMOTE_READ = 1 << 2;
        /// Peers may run atomics on it.
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to it.
        const MW_BIND = 1 << 4;
    }
}

impl AccessFlags {
    /// Every remote right.
    pub const REMOTE_ALL: Self =
        Self::REMOTE_WRITE.union(Self::REMOTE_READ).union(Self::REMOTE_ATOMIC);

    /// Verbs requires LOCAL_WRITE whenever REMOTE_WRITE or REMOTE_ATOMIC is asked for.
    pub fn is_valid_for_mr(self) -> bool {
        !self.intersects(Self::REMOTE_WRITE | Self::REMOTE_ATOMIC)
            || self.contains(Self::LOCAL_WRITE)
    }
}

bitflags::bitflags! {
    /// Flags of a send work request.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
    pub struct SendFlags: u32 {
        /// Ask for a completion even when the QP does not signal every request.
        const SIGNALED = 1;
        /// Wait for earlier RDMA reads and atomics to complete before this request starts.
        const FENCE = 1 << 1;
        /// Ask the receiver for a solicited event.
        const SOLICITED = 1 << 2;
        /// Copy the payload into the work request at post time: the buffer is reusable at once
        /// and needs no lkey.
        const INLINE = 1 << 3;
    }
}

/// Transport of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum QpType {
    /// Reliable connected: every primitive, in order, acknowledged.
    Rc,
    /// Unreliable connected: send and write only; a lost message is lost.
    Uc,
    /// Unreliable datagram: send only, one MTU per message, any peer.
    Ud,
}

impl QpType {
    /// Lower-case name (`rc`, `uc`, `ud`).
    pub fn as_str(self) -> &'static str {
        match self {
            QpType::Rc => "rc",
            QpType::Uc => "uc",
            QpType::Ud => "ud",
        }
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// State of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum QpState {
    /// Just created or reset: nothing may be posted.
    #[default]
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained (reported by real devices; never entered by `soft`).
    Sqd,
    /// Send queue error (UC/UD).
    Sqe,
    /// Error: every outstanding and later work request completes with a flush error.
    Err,
}

impl QpState {
    /// Whether verbs allows `self -> to` through modify-QP.
    pub fn can_move_to(self, to: QpState) -> bool {
        use QpState::*;
        matches!(
            (self, to),
            (_, Reset)
                | (_, Err)
                | (Reset, Init)
                | (Init, Init)
                | (Init, Rtr)
                | (Rtr, Rts)
                | (Rts, Rts)
                | (Rts, Sqd)
                | (Sqd, Rts)
                | (Sqe, Rts)
        )
    }
}

/// Path MTU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    #[default]
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl Mtu {
    /// The MTU in bytes.
    pub fn bytes(self) -> u32 {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }

    /// The largest MTU not above `bytes`, if any.
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512, Mtu::Mtu256]
            .into_iter()
            .find(|m| m.bytes() <= bytes)
    }
}

/// Bytes reserved for the global route header at the start of every UD receive buffer.
pub const GRH_BYTES: u32 = 40;

/// A completion's status, named as `ibv_wc_status` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[allow(missing_docs)] // each variant is documented by its `ibv_wc_status` name, see `name()`
pub enum WcStatus {
    #[default]
    Success,
    LocLenErr,
    LocQpOpErr,
    LocEecOpErr,
    LocProtErr,
    WrFlushErr,
    MwBindErr,
    BadRespErr,
    LocAccessErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    LocRddViolErr,
    RemInvRdReqErr,
    RemAbortErr,
    InvEecnErr,
    InvEecStateErr,
    FatalErr,
    RespTimeoutErr,
    GeneralErr,
}

impl WcStatus {
    /// Every status, in `ibv_wc_status` order (the index is the C value).
    pub const ALL: [WcStatus; 22] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
    ];

    /// The C enumerator's name, e.g. `IBV_WC_REM_ACCESS_ERR`.
    pub fn name(self) -> &'static str {
        const NAMES: [&str; 22] = [
            "IBV_WC_SUCCESS",
            "IBV_WC_LOC_LEN_ERR",
            "IBV_WC_LOC_QP_OP_ERR",
            "IBV_WC_LOC_EEC_OP_ERR",
            "IBV_WC_LOC_PROT_ERR",
            "IBV_WC_WR_FLUSH_ERR",
            "IBV_WC_MW_BIND_ERR",
            "IBV_WC_BAD_RESP_ERR",
            "IBV_WC_LOC_ACCESS_ERR",
            "IBV_WC_REM_INV_REQ_ERR",
            "IBV_WC_REM_ACCESS_ERR",
            "IBV_WC_REM_OP_ERR",
            "IBV_WC_RETRY_EXC_ERR",
            "IBV_WC_RNR_RETRY_EXC_ERR",
            "IBV_WC_LOC_RDD_VIOL_ERR",
            "IBV_WC_REM_INV_RD_REQ_ERR",
            "IBV_WC_REM_ABORT_ERR",
            "IBV_WC_INV_EECN_ERR",
            "IBV_WC_INV_EEC_STATE_ERR",
            "IBV_WC_FATAL_ERR",
            "IBV_WC_RESP_TIMEOUT_ERR",
            "IBV_WC_GENERAL_ERR",
        ];
        NAMES[self as usize]
    }

    /// The status with C value `v` (`GeneralErr` for an unknown value).
    #[inline]
    pub fn from_raw(v: u32) -> WcStatus {
        // (GeneralErr is the last: an unknown value clamps to it, with no branch, which in the
        // emulated guest is a block of translated code to find on each completion's path)
        const _: () =
            assert!(matches!(WcStatus::ALL[WcStatus::ALL.len() - 1], WcStatus::GeneralErr));
        Self::ALL[(v as usize).min(Self::ALL.len() - 1)]
    }

    /// Whether this is [`WcStatus::Success`].
    pub fn is_success(self) -> bool {
        self == WcStatus::Success
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a completion completes, named as `ibv_wc_opcode` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum WcOpcode {
    /// A send or send-with-immediate (sender side).
    #[default]
    Send,
    /// An RDMA write or write-with-immediate (initiator side).
    RdmaWrite,
    /// An RDMA read.
    RdmaRead,
    /// An atomic compare-and-swap.
    CompSwap,
    /// An atomic fetch-and-add.
    FetchAdd,
    /// A memory-window bind.
    BindMw,
    /// A local invalidate.
    LocalInv,
    /// A receive consumed by a send (receiver side).
    Recv,
    /// A receive consumed by a write-with-immediate (receiver side).
    RecvRdmaWithImm,
}

impl WcOpcode {
    /// The C enumerator's name, e.g. `IBV_WC_RDMA_READ`.
    pub fn name(self) -> &'static str {
        match self {
            WcOpcode::Send => "IBV_WC_SEND",
            WcOpcode::RdmaWrite => "IBV_WC_RDMA_WRITE",
            WcOpcode::RdmaRead => "IBV_WC_RDMA_READ",
            WcOpcode::CompSwap => "IBV_WC_COMP_SWAP",
            WcOpcode::FetchAdd => "IBV_WC_FETCH_ADD",
            WcOpcode::BindMw => "IBV_WC_BIND_MW",
            WcOpcode::LocalInv => "IBV_WC_LOCAL_INV",
            WcOpcode::Recv => "IBV_WC_RECV",
            WcOpcode::RecvRdmaWithImm => "IBV_WC_RECV_RDMA_WITH_IMM",
        }
    }

    /// Whether the completion belongs to a receive queue.
    pub fn is_recv(self) -> bool {
        matches!(self, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
    }
}

impl fmt::Display for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One work completion.
///
/// For an error status only `wr_id`, `status`, `qp_num` and `opcode` are meaningful (real
/// devices leave the rest undefined).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Wc {
    /// The work request's `wr_id`.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Provider-specific detail of an error (0 when none).
    pub vendor_err: u32,
    /// Bytes received (receives), read, or 8 for atomics.
    pub byte_len: u32,
    /// The immediate, for a receive consumed by a send- or write-with-immediate.
    pub imm: Option<u32>,
    /// The rkey the message invalidated, for a receive consumed by a send-with-invalidate
    /// (the window it named is revoked by then).
    pub invalidated_rkey: Option<u32>,
    /// Local QP number of the work request.
    pub qp_num: u32,
    /// Source QP number (UD receives).
    pub src_qp: u32,
    /// The message came with a global route header (every successful receive on RoCE, as rxe
    /// reports it, RC and UC included); on UD the header is placed in the first 40 bytes of
    /// the receive buffer. `false` on error completions and send-queue completions.
    pub grh: bool,
}

/// A scatter/gather entry: `length` bytes at `addr` inside the memory region named by `lkey`.
///
/// Laid out as `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Sge {
    /// Virtual address.
    pub addr: u64,
    /// Bytes.
    pub length: u32,
    /// Local key of the memory region holding the bytes.
    pub lkey: u32,
}

/// A remote memory location: virtual address and remote key of the peer's region or window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RemoteAddr {
    /// Virtual address in the peer's address space.
    pub addr: u64,
    /// Remote key of the peer's memory region or window.
    pub rkey: u32,
}

impl RemoteAddr {
    /// `self` moved `off` bytes further.
    pub fn offset(self, off: u64) -> RemoteAddr {
        RemoteAddr { addr: self.addr.wrapping_add(off), rkey: self.rkey }
    }
}

/// A remote region: where it starts, how long it is and its key (what peers exchange in
/// connection private data).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RemoteRegion {
    /// Virtual address of its first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteRegion {
    /// Bytes in the wire form of [`RemoteRegion::to_bytes`].
    pub const WIRE_BYTES: usize = 20;

    /// The location `off` bytes into the region.
    pub fn at(&self, off: u64) -> RemoteAddr {
        RemoteAddr { addr: self.addr.wrapping_add(off), rkey: self.rkey }
    }

    /// Little-endian wire form (address, length, rkey), for private data.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_BYTES] {
        let mut b = [0u8; Self::WIRE_BYTES];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Parses [`RemoteRegion::to_bytes`]'s form; `None` when `b` is too short.
    pub fn from_bytes(b: &[u8]) -> Option<RemoteRegion> {
        let b = b.get(..Self::WIRE_BYTES)?;
        Some(RemoteRegion {
            addr: u64::from_le_bytes(b[0..8].try_into().ok()?),
            len: u64::from_le_bytes(b[8..16].try_into().ok()?),
            rkey: u32::from_le_bytes(b[16..20].try_into().ok()?),
        })
    }
}

/// A 16-byte global identifier.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4-mapped GID (`::ffff:a.b.c.d`), as RoCEv2 uses for IPv4 addresses.
    pub fn from_ipv4(ip: std::net::Ipv4Addr) -> Gid {
        Gid(ip.to_ipv6_mapped().octets())
    }

    /// Whether every byte is zero.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&std::net::Ipv6Addr::from(self.0), f)
    }
}

/// Sizes of a QP's queues and its per-request limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpCap {
    /// Send-queue depth.
    pub max_send_wr: u32,
    /// Receive-queue depth (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive request.
    pub max_recv_sge: u32,
    /// Bytes a send request may carry inline.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        QpCap {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        }
    }
}

/// How to reach a connected QP's peer: what two sides exchange before RTR when they connect
/// without a connection manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Endpoint {
    /// The peer's QP number.
    pub qpn: u32,
    /// The peer's first packet sequence number.
    pub psn: u32,
    /// The peer's port LID (0 on RoCE).
    pub lid: u16,
    /// The peer's GID.
    pub gid: Gid,
}

/// Attributes given to [`crate::Qp::modify`]; `state` is the state to move to and the other
/// fields are read as that transition needs them (INIT: port, pkey index, access, qkey;
/// RTR: dest, path MTU, rq PSN, max_dest_rd_atomic, min RNR timer, sgid index;
/// RTS: sq PSN, timeout, retry count, RNR retry, max_rd_atomic).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpAttr {
    /// Target state.
    pub state: QpState,
    /// Port number (from 1).
    pub port: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// Remote operations the QP accepts (RC/UC).
    pub access: AccessFlags,
    /// Queue key (UD).
    pub qkey: u32,
    /// Path MTU (RC/UC).
    pub path_mtu: Mtu,
    /// The peer (RC/UC, at RTR).
    pub dest: Endpoint,
    /// Source GID index used to reach `dest` (RoCE).
    pub sgid_index: u8,
    /// Hop limit of the route to `dest`.
    pub hop_limit: u8,
    /// Expected PSN of the first incoming packet.
    pub rq_psn: u32,
    /// PSN of the first outgoing packet.
    pub sq_psn: u32,
    /// Outstanding RDMA reads and atomics this QP may initiate.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads and atomics this QP accepts as target.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (IB spec table; 12 is 0.64 ms, 0 is 655.36 ms).
    pub min_rnr_timer: u8,
    /// Local ACK timeout code (4.096 µs × 2^timeout; 0 is infinite).
    pub timeout: u8,
    /// Transport retries before a retry-exceeded error.
    pub retry_cnt: u8,
    /// RNR retries before an RNR-retry-exceeded error (7 is infinite).
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            state: QpState::Init,
            port: 1,
            pkey_index: 0,
            access: AccessFlags::REMOTE_ALL,
            qkey: DEFAULT_QKEY,
            path_mtu: Mtu::Mtu1024,
            dest: Endpoint::default(),
            sgid_index: 0,
            hop_limit: 64,
            rq_psn: 0,
            sq_psn: 0,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }
}

/// The qkey corelink uses by default on UD QPs.
pub const DEFAULT_QKEY: u32 = 0x1111_1111;

/// Microseconds of an RNR NAK timer code (InfiniBand spec, table 45).
pub fn rnr_timer_us(code: u8) -> u64 {
    const US: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    US[(code & 31) as usize]
}

/// Shape of a shared receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SrqAttr {
    /// Receive requests it holds.
    pub max_wr: u32,
    /// Scatter/gather entries per receive request.
    pub max_sge: u32,
}

impl Default for SrqAttr {
    fn default() -> Self {
        SrqAttr { max_wr: 256, max_sge: 4 }
    }
}

/// Where a UD address handle leads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AhAttr {
    /// Local port.
    pub port: u8,
    /// Destination LID (0 on RoCE).
    pub dlid: u16,
    /// Destination GID.
    pub dgid: Gid,
    /// Local GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
}

impl Default for AhAttr {
    fn default() -> Self {
        AhAttr { port: 1, dlid: 0, dgid: Gid::default(), sgid_index: 0, hop_limit: 64 }
    }
}

/// What a device can do.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID.
    pub node_guid: u64,
    /// Largest registrable region, in bytes.
    pub max_mr_size: u64,
    /// QPs the device supports.
    pub max_qp: u32,
    /// Depth of one work queue.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per request.
    pub max_sge: u32,
    /// Depth of one CQ.
    pub max_cqe: u32,
    /// Memory regions.
    pub max_mr: u32,
    /// Memory windows.
    pub max_mw: u32,
    /// Outstanding reads/atomics as target, per QP.
    pub max_qp_rd_atom: u32,
    /// Outstanding reads/atomics as initiator, per QP.
    pub max_qp_init_rd_atom: u32,
    /// Shared receive queues.
    pub max_srq: u32,
    /// Depth of one SRQ.
    pub max_srq_wr: u32,
    /// Physical ports.
    pub phys_port_cnt: u8,
    /// Atomics are supported.
    pub atomics: bool,
}

/// Logical state of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum PortState {
    /// No link.
    Down,
    /// Link up, not yet configured.
    Init,
    /// Configured, not yet active.
    Armed,
    /// Usable.
    Active,
    /// Another state (`ibv_port_state` value).
    Other(u32),
}

/// Link layer under a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum LinkLayer {
    /// InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE).
    Ethernet,
    /// In-process (the `soft` provider).
    Soft,
}

/// A port's attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// Entries in the GID table.
    pub gid_tbl_len: u32,
    /// Largest message, in bytes.
    pub max_msg_sz: u32,
    /// Link layer.
    pub link_layer: LinkLayer,
}

/// What an asynchronous event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum AsyncEventKind {
    /// A CQ overran: completions were lost (`IBV_EVENT_CQ_ERR`).
    CqErr,
    /// A QP hit an error it could not report in a completion (`IBV_EVENT_QP_FATAL`).
    QpFatal,
    /// Invalid request on a QP (`IBV_EVENT_QP_REQ_ERR`).
    QpReqErr,
    /// Access violation on a QP (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessErr,
    /// First packet arrived on a QP in RTR (`IBV_EVENT_COMM_EST`).
    CommEst,
    /// Send queue drained (`IBV_EVENT_SQ_DRAINED`).
    SqDrained,
    /// Last WQE of a QP attached to an SRQ reached (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached,
    /// SRQ error (`IBV_EVENT_SRQ_ERR`).
    SrqErr,
    /// SRQ fell below its limit (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached,
    /// Port became active (`IBV_EVENT_PORT_ACTIVE`).
    PortActive,
    /// Port went down (`IBV_EVENT_PORT_ERR`).
    PortErr,
    /// LID changed (`IBV_EVENT_LID_CHANGE`).
    LidChange,
    /// GID table changed (`IBV_EVENT_GID_CHANGE`).
    GidChange,
    /// The device failed (`IBV_EVENT_DEVICE_FATAL`).
    DeviceFatal,
    /// Any other event (`ibv_event_type` value).
    Other(u32),
}

/// The object an asynchronous event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum AsyncElement {
    /// A QP, by number.
    Qp(u32),
    /// A CQ, by provider-assigned handle.
    Cq(u64),
    /// An SRQ, by provider-assigned handle.
    Srq(u64),
    /// A port, by number.
    Port(u8),
    /// The device itself.
    Device,
}

/// An asynchronous event of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// To what.
    pub element: AsyncElement,
}

/// A device in the list of [`crate::Provider::devices`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeviceInfo {
    /// Name to pass to [`crate::Provider::open`].
    pub name: String,
    /// Node GUID.
    pub guid: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_follow_c_order() {
        for (i, s) in WcStatus::ALL.iter().enumerate() {
            assert_eq!(WcStatus::from_raw(i as u32), *s);
        }
        assert_eq!(WcStatus::RemAccessErr.name(), "IBV_WC_REM_ACCESS_ERR");
        assert_eq!(WcStatus::from_raw(10), WcStatus::RemAccessErr);
        assert_eq!(WcStatus::from_raw(999), WcStatus::GeneralErr);
    }

    #[test]
    fn qp_state_table() {
        use QpState::*;
        assert!(Reset.can_move_to(Init));
        assert!(Init.can_move_to(Rtr));
        assert!(Rtr.can_move_to(Rts));
        assert!(Rts.can_move_to(Err));
        assert!(Err.can_move_to(Reset));
        assert!(!Reset.can_move_to(Rtr));
        assert!(!Init.can_move_to(Rts));
        assert!(!Err.can_move_to(Rts));
    }

    #[test]
    fn remote_region_round_trips() {
        let r = RemoteRegion { addr: 0xdead_beef_0000, len: 4096, rkey: 0x1234 };
        assert_eq!(RemoteRegion::from_bytes(&r.to_bytes()), Some(r));
        assert_eq!(RemoteRegion::from_bytes(&[0u8; 3]), None);
    }

    #[test]
    fn mr_access_needs_local_write_for_remote_write() {
        assert!(!AccessFlags::REMOTE_WRITE.is_valid_for_mr());
        assert!((AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE).is_valid_for_mr());
        assert!(AccessFlags::REMOTE_READ.is_valid_for_mr());
    }

    #[test]
    fn mtu_and_rnr_tables() {
        assert_eq!(Mtu::from_bytes(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_bytes(100), None);
        assert_eq!(rnr_timer_us(12), 640);
        assert_eq!(rnr_timer_us(0), 655_360);
    }
}
