//! Conversions between corelink's provider-neutral types and `ibv_*` / `rdma_cm` values, and the
//! errno helpers every verb uses.
//!
//! Everything here is a pure function (except the errno readers), so it is unit-tested on hosts
//! without any RDMA device.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::raw::{c_int, c_uint};

use rdma_sys::{
    ibv_access_flags, ibv_event_type, ibv_mtu, ibv_port_state, ibv_qp_state, ibv_qp_type,
    ibv_send_flags, ibv_sge, ibv_wc, ibv_wc_flags, ibv_wc_opcode,
};

use crate::types::{
    AccessFlags, AsyncEventKind, LinkLayer, Mtu, PortState, QpState, QpType, SendFlags, Sge, Wc,
    WcOpcode, WcStatus,
};

// `Sge` is documented as laid out like `struct ibv_sge`: the data path hands the caller's
// scatter/gather slices to the device as they are, so check the claim at compile time.
const _: () = {
    assert!(std::mem::size_of::<Sge>() == std::mem::size_of::<ibv_sge>());
    assert!(std::mem::align_of::<Sge>() == std::mem::align_of::<ibv_sge>());
    assert!(std::mem::offset_of!(Sge, addr) == std::mem::offset_of!(ibv_sge, addr));
    assert!(std::mem::offset_of!(Sge, length) == std::mem::offset_of!(ibv_sge, length));
    assert!(std::mem::offset_of!(Sge, lkey) == std::mem::offset_of!(ibv_sge, lkey));
};

/// `IBV_LINK_LAYER_ETHERNET` (an anonymous enum in `verbs.h`, so not in the bindings).
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// The error of a call that returned `NULL` or `-1` and set `errno`.
pub(crate) fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// The error of a verb that returned `ret != 0`.
///
/// libibverbs is not uniform: most verbs return the errno as a positive value
/// (`ibv_modify_qp`, `ibv_post_send`, ...), some return `-1` and set `errno`, and some providers
/// return a negated errno. All three are handled.
pub(crate) fn ret_err(ret: c_int) -> io::Error {
    match ret {
        -1 => last_err(),
        r if r < 0 => io::Error::from_raw_os_error(r.saturating_neg()),
        r => io::Error::from_raw_os_error(r),
    }
}

/// An errno as an `io::Error`.
pub(crate) fn errno_err(code: c_int) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// `strerror`-like text of an error, without the ` (os error N)` suffix.
pub(crate) fn err_text(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// Our access flags as `ibv_access_flags` bits.
pub(crate) fn access_to_ibv(a: AccessFlags) -> c_uint {
    let mut v = 0;
    if a.contains(AccessFlags::LOCAL_WRITE) {
        v |= ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if a.contains(AccessFlags::REMOTE_WRITE) {
        v |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if a.contains(AccessFlags::REMOTE_READ) {
        v |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if a.contains(AccessFlags::REMOTE_ATOMIC) {
        v |= ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
    }
    if a.contains(AccessFlags::MW_BIND) {
        v |= ibv_access_flags::IBV_ACCESS_MW_BIND.0;
    }
    v
}

/// Our send flags as `ibv_send_flags` bits.
#[inline(always)]
pub(crate) fn send_flags_to_ibv(f: SendFlags) -> c_uint {
    let mut v = 0;
    if f.contains(SendFlags::SIGNALED) {
        v |= ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if f.contains(SendFlags::FENCE) {
        v |= ibv_send_flags::IBV_SEND_FENCE.0;
    }
    if f.contains(SendFlags::SOLICITED) {
        v |= ibv_send_flags::IBV_SEND_SOLICITED.0;
    }
    if f.contains(SendFlags::INLINE) {
        v |= ibv_send_flags::IBV_SEND_INLINE.0;
    }
    v
}

/// `ibv_qp_type` of a transport.
pub(crate) fn qp_type_to_ibv(t: QpType) -> ibv_qp_type::Type {
    match t {
        QpType::Rc => ibv_qp_type::IBV_QPT_RC,
        QpType::Uc => ibv_qp_type::IBV_QPT_UC,
        QpType::Ud => ibv_qp_type::IBV_QPT_UD,
    }
}

/// `ibv_qp_state` of a state.
pub(crate) fn qp_state_to_ibv(s: QpState) -> ibv_qp_state::Type {
    match s {
        QpState::Reset => ibv_qp_state::IBV_QPS_RESET,
        QpState::Init => ibv_qp_state::IBV_QPS_INIT,
        QpState::Rtr => ibv_qp_state::IBV_QPS_RTR,
        QpState::Rts => ibv_qp_state::IBV_QPS_RTS,
        QpState::Sqd => ibv_qp_state::IBV_QPS_SQD,
        QpState::Sqe => ibv_qp_state::IBV_QPS_SQE,
        QpState::Err => ibv_qp_state::IBV_QPS_ERR,
    }
}

/// The state of an `ibv_qp_state` (`None` for `IBV_QPS_UNKNOWN` and anything else).
pub(crate) fn qp_state_from_ibv(s: ibv_qp_state::Type) -> Option<QpState> {
    Some(match s {
        ibv_qp_state::IBV_QPS_RESET => QpState::Reset,
        ibv_qp_state::IBV_QPS_INIT => QpState::Init,
        ibv_qp_state::IBV_QPS_RTR => QpState::Rtr,
        ibv_qp_state::IBV_QPS_RTS => QpState::Rts,
        ibv_qp_state::IBV_QPS_SQD => QpState::Sqd,
        ibv_qp_state::IBV_QPS_SQE => QpState::Sqe,
        ibv_qp_state::IBV_QPS_ERR => QpState::Err,
        _ => return None,
    })
}

/// `ibv_mtu` of an MTU.
pub(crate) fn mtu_to_ibv(m: Mtu) -> ibv_mtu::Type {
    match m {
        Mtu::Mtu256 => ibv_mtu::IBV_MTU_256,
        Mtu::Mtu512 => ibv_mtu::IBV_MTU_512,
        Mtu::Mtu1024 => ibv_mtu::IBV_MTU_1024,
        Mtu::Mtu2048 => ibv_mtu::IBV_MTU_2048,
        Mtu::Mtu4096 => ibv_mtu::IBV_MTU_4096,
    }
}

/// The MTU of an `ibv_mtu` (256, the smallest, for an unknown value).
pub(crate) fn mtu_from_ibv(m: ibv_mtu::Type) -> Mtu {
    match m {
        ibv_mtu::IBV_MTU_512 => Mtu::Mtu512,
        ibv_mtu::IBV_MTU_1024 => Mtu::Mtu1024,
        ibv_mtu::IBV_MTU_2048 => Mtu::Mtu2048,
        ibv_mtu::IBV_MTU_4096 => Mtu::Mtu4096,
        _ => Mtu::Mtu256,
    }
}

/// The port state of an `ibv_port_state`.
pub(crate) fn port_state_from_ibv(s: ibv_port_state::Type) -> PortState {
    match s {
        ibv_port_state::IBV_PORT_DOWN => PortState::Down,
        ibv_port_state::IBV_PORT_INIT => PortState::Init,
        ibv_port_state::IBV_PORT_ARMED => PortState::Armed,
        ibv_port_state::IBV_PORT_ACTIVE => PortState::Active,
        other => PortState::Other(other),
    }
}

/// The link layer of a port's `link_layer` byte (unspecified means InfiniBand).
pub(crate) fn link_layer_from_ibv(l: u8) -> LinkLayer {
    if l == IBV_LINK_LAYER_ETHERNET {
        LinkLayer::Ethernet
    } else {
        LinkLayer::InfiniBand
    }
}

/// The opcode of a completion. Error completions may carry an undefined opcode; anything
/// unknown is classed by the `IBV_WC_RECV` bit (receive-queue opcodes have it). A look-up in
/// [`WC_OPCODES`], not a match: one per completion polled, and in the emulated guest each
/// branch on a round trip's path is a block of translated code to find.
#[inline(always)]
pub(crate) fn wc_opcode_from_ibv(op: ibv_wc_opcode::Type) -> WcOpcode {
    // (beyond the table only the `IBV_WC_RECV` bit counts)
    let i = if op < 256 { op } else { op & ibv_wc_opcode::IBV_WC_RECV };
    WC_OPCODES[i as usize & 0xff]
}

/// [`wc_opcode_from_ibv`] for each opcode below 256.
const WC_OPCODES: [WcOpcode; 256] = {
    use ibv_wc_opcode as O;
    let mut t = [WcOpcode::Send; 256];
    let mut i = 0;
    while i < 256 {
        if i & O::IBV_WC_RECV as usize != 0 {
            t[i] = WcOpcode::Recv;
        }
        i += 1;
    }
    t[O::IBV_WC_RDMA_WRITE as usize] = WcOpcode::RdmaWrite;
    t[O::IBV_WC_RDMA_READ as usize] = WcOpcode::RdmaRead;
    t[O::IBV_WC_COMP_SWAP as usize] = WcOpcode::CompSwap;
    t[O::IBV_WC_FETCH_ADD as usize] = WcOpcode::FetchAdd;
    t[O::IBV_WC_BIND_MW as usize] = WcOpcode::BindMw;
    t[O::IBV_WC_LOCAL_INV as usize] = WcOpcode::LocalInv;
    t[O::IBV_WC_RECV_RDMA_WITH_IMM as usize] = WcOpcode::RecvRdmaWithImm;
    t
};

/// A work completion in our form. The immediate is converted from network order, and reported
/// for receives only (as [`Wc::imm`] is defined): rxe also flags the *sender's* completion of a
/// send- or write-with-immediate, with an immediate of 0. `inv_flag` is the device's bit for a
/// send-with-invalidate's receive (`context::wc_inv_flag`). Inlined into the poll (in the
/// emulated guest a call and its return cost a look-up each).
#[inline(always)]
pub(crate) fn wc_from_ibv(wc: &ibv_wc, inv_flag: u32) -> Wc {
    let opcode = wc_opcode_from_ibv(wc.opcode);
    let with_imm = wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 && opcode.is_recv();
    let imm = if with_imm {
        // SAFETY: the union holds the immediate when IBV_WC_WITH_IMM is set; both members are
        // plain 32-bit integers, so reading either is defined anyway.
        Some(u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data }))
    } else {
        None
    };
    let with_inv = wc.wc_flags & inv_flag != 0 && opcode.is_recv();
    // SAFETY: the union holds the invalidated rkey (host order) when IBV_WC_WITH_INV is set;
    // both members are plain 32-bit integers.
    let invalidated_rkey =
        with_inv.then_some(unsafe { wc.imm_data_invalidated_rkey_union.invalidated_rkey });
    Wc {
        wr_id: wc.wr_id,
        status: WcStatus::from_raw(wc.status),
        opcode,
        vendor_err: wc.vendor_err,
        byte_len: wc.byte_len,
        imm,
        invalidated_rkey,
        qp_num: wc.qp_num,
        src_qp: wc.src_qp,
        grh: wc.wc_flags & ibv_wc_flags::IBV_WC_GRH.0 != 0,
    }
}

/// The kind of an async event, from its raw `ibv_event_type` value.
pub(crate) fn async_kind_from_ibv(t: u32) -> AsyncEventKind {
    use ibv_event_type as E;
    match t {
        x if x == E::IBV_EVENT_CQ_ERR as u32 => AsyncEventKind::CqErr,
        x if x == E::IBV_EVENT_QP_FATAL as u32 => AsyncEventKind::QpFatal,
        x if x == E::IBV_EVENT_QP_REQ_ERR as u32 => AsyncEventKind::QpReqErr,
        x if x == E::IBV_EVENT_QP_ACCESS_ERR as u32 => AsyncEventKind::QpAccessErr,
        x if x == E::IBV_EVENT_COMM_EST as u32 => AsyncEventKind::CommEst,
        x if x == E::IBV_EVENT_SQ_DRAINED as u32 => AsyncEventKind::SqDrained,
        x if x == E::IBV_EVENT_QP_LAST_WQE_REACHED as u32 => AsyncEventKind::QpLastWqeReached,
        x if x == E::IBV_EVENT_SRQ_ERR as u32 => AsyncEventKind::SrqErr,
        x if x == E::IBV_EVENT_SRQ_LIMIT_REACHED as u32 => AsyncEventKind::SrqLimitReached,
        x if x == E::IBV_EVENT_PORT_ACTIVE as u32 => AsyncEventKind::PortActive,
        x if x == E::IBV_EVENT_PORT_ERR as u32 => AsyncEventKind::PortErr,
        x if x == E::IBV_EVENT_LID_CHANGE as u32 => AsyncEventKind::LidChange,
        x if x == E::IBV_EVENT_GID_CHANGE as u32 => AsyncEventKind::GidChange,
        x if x == E::IBV_EVENT_DEVICE_FATAL as u32 => AsyncEventKind::DeviceFatal,
        other => AsyncEventKind::Other(other),
    }
}

/// What the element union of an async event holds, by event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AsyncElementKind {
    Cq,
    Qp,
    Srq,
    Port,
    Device,
}

/// Which member of `ibv_async_event.element` is valid for a raw event type.
pub(crate) fn async_element_kind(t: u32) -> AsyncElementKind {
    use ibv_event_type as E;
    match t {
        x if x == E::IBV_EVENT_CQ_ERR as u32 => AsyncElementKind::Cq,
        x if x == E::IBV_EVENT_QP_FATAL as u32
            || x == E::IBV_EVENT_QP_REQ_ERR as u32
            || x == E::IBV_EVENT_QP_ACCESS_ERR as u32
            || x == E::IBV_EVENT_COMM_EST as u32
            || x == E::IBV_EVENT_SQ_DRAINED as u32
            || x == E::IBV_EVENT_PATH_MIG as u32
            || x == E::IBV_EVENT_PATH_MIG_ERR as u32
            || x == E::IBV_EVENT_QP_LAST_WQE_REACHED as u32 =>
        {
            AsyncElementKind::Qp
        }
        x if x == E::IBV_EVENT_SRQ_ERR as u32 || x == E::IBV_EVENT_SRQ_LIMIT_REACHED as u32 => {
            AsyncElementKind::Srq
        }
        x if x == E::IBV_EVENT_PORT_ACTIVE as u32
            || x == E::IBV_EVENT_PORT_ERR as u32
            || x == E::IBV_EVENT_LID_CHANGE as u32
            || x == E::IBV_EVENT_PKEY_CHANGE as u32
            || x == E::IBV_EVENT_SM_CHANGE as u32
            || x == E::IBV_EVENT_CLIENT_REREGISTER as u32
            || x == E::IBV_EVENT_GID_CHANGE as u32 =>
        {
            AsyncElementKind::Port
        }
        _ => AsyncElementKind::Device,
    }
}

/// `ibv_inc_rkey`: the key with its low 8 bits (the consumer-owned tag) incremented.
pub(crate) fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// The inverse of [`inc_rkey`].
pub(crate) fn dec_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_sub(1) & 0xff)
}

/// A socket address in C form, with its length.
pub(crate) fn sockaddr_from(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid (unspecified) value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The socket address behind a C `sockaddr`, if it is IPv4 or IPv6.
///
/// # Safety
/// `sa` must point to a valid socket address whose storage is as large as its family says
/// (`sockaddr_in` for `AF_INET`, `sockaddr_in6` for `AF_INET6`).
pub(crate) unsafe fn sockaddr_to(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees `sa` is valid; the family field is common to every form.
    let family = c_int::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in, which the caller guarantees is there
            // in full; read_unaligned avoids any alignment assumption.
            let sin = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in>()) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Milliseconds of a duration for a C timeout (rounded up, capped at `c_int::MAX`).
pub(crate) fn timeout_ms(d: std::time::Duration) -> c_int {
    let ms = d.as_nanos().div_ceil(1_000_000);
    c_int::try_from(ms).unwrap_or(c_int::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_sys::imm_data_invalidated_rkey_union_t;
    use std::time::Duration;

    #[test]
    fn access_flags_map_to_ibv_bits() {
        assert_eq!(access_to_ibv(AccessFlags::empty()), 0);
        assert_eq!(access_to_ibv(AccessFlags::LOCAL_WRITE), 1);
        assert_eq!(access_to_ibv(AccessFlags::REMOTE_WRITE), 2);
        assert_eq!(access_to_ibv(AccessFlags::REMOTE_READ), 4);
        assert_eq!(access_to_ibv(AccessFlags::REMOTE_ATOMIC), 8);
        assert_eq!(access_to_ibv(AccessFlags::MW_BIND), 16);
        assert_eq!(access_to_ibv(AccessFlags::all()), 31);
    }

    #[test]
    fn send_flags_map_to_ibv_bits() {
        assert_eq!(send_flags_to_ibv(SendFlags::FENCE), 1);
        assert_eq!(send_flags_to_ibv(SendFlags::SIGNALED), 2);
        assert_eq!(send_flags_to_ibv(SendFlags::SOLICITED), 4);
        assert_eq!(send_flags_to_ibv(SendFlags::INLINE), 8);
        assert_eq!(send_flags_to_ibv(SendFlags::SIGNALED | SendFlags::INLINE), 10);
    }

    #[test]
    fn qp_types_and_states_round_trip() {
        assert_eq!(qp_type_to_ibv(QpType::Rc), 2);
        assert_eq!(qp_type_to_ibv(QpType::Uc), 3);
        assert_eq!(qp_type_to_ibv(QpType::Ud), 4);
        for s in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Sqe,
            QpState::Err,
        ] {
            assert_eq!(qp_state_from_ibv(qp_state_to_ibv(s)), Some(s));
        }
        assert_eq!(qp_state_from_ibv(ibv_qp_state::IBV_QPS_UNKNOWN), None);
    }

    #[test]
    fn mtus_round_trip() {
        for m in [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096] {
            assert_eq!(mtu_from_ibv(mtu_to_ibv(m)), m);
        }
        assert_eq!(mtu_to_ibv(Mtu::Mtu1024), 3);
        assert_eq!(mtu_from_ibv(0), Mtu::Mtu256);
    }

    #[test]
    fn ports_and_link_layers() {
        assert_eq!(port_state_from_ibv(4), PortState::Active);
        assert_eq!(port_state_from_ibv(1), PortState::Down);
        assert_eq!(port_state_from_ibv(5), PortState::Other(5));
        assert_eq!(link_layer_from_ibv(2), LinkLayer::Ethernet);
        assert_eq!(link_layer_from_ibv(1), LinkLayer::InfiniBand);
        assert_eq!(link_layer_from_ibv(0), LinkLayer::InfiniBand);
    }

    fn raw_wc(opcode: u32, flags: u32, imm_be: u32) -> ibv_wc {
        ibv_wc {
            wr_id: 7,
            status: 10,
            opcode,
            vendor_err: 3,
            byte_len: 42,
            imm_data_invalidated_rkey_union: imm_data_invalidated_rkey_union_t { imm_data: imm_be },
            qp_num: 17,
            src_qp: 18,
            wc_flags: flags,
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }

    #[test]
    fn completions_convert() {
        const INV: u32 = ibv_wc_flags::IBV_WC_WITH_INV.0;
        let wc = wc_from_ibv(&raw_wc(ibv_wc_opcode::IBV_WC_RECV, 0, 0), INV);
        assert_eq!(wc.wr_id, 7);
        assert_eq!(wc.status, WcStatus::RemAccessErr);
        assert_eq!(wc.opcode, WcOpcode::Recv);
        assert_eq!(wc.vendor_err, 3);
        assert_eq!(wc.byte_len, 42);
        assert_eq!(wc.imm, None);
        assert_eq!((wc.qp_num, wc.src_qp), (17, 18));
        assert!(!wc.grh);

        let flags = ibv_wc_flags::IBV_WC_WITH_IMM.0 | ibv_wc_flags::IBV_WC_GRH.0;
        let wc = wc_from_ibv(
            &raw_wc(ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM, flags, 0x1234_5678u32.to_be()),
            INV,
        );
        assert_eq!(wc.imm, Some(0x1234_5678));
        assert!(wc.grh);
        assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);

        // rxe flags the sender's completion of a write-with-immediate too: not reported.
        let wc = wc_from_ibv(&raw_wc(ibv_wc_opcode::IBV_WC_RDMA_WRITE, flags, 0), INV);
        assert_eq!(wc.imm, None);

        // A send-with-invalidate's receive: the rkey in host order, no immediate.
        let flags = ibv_wc_flags::IBV_WC_WITH_INV.0 | ibv_wc_flags::IBV_WC_GRH.0;
        let wc = wc_from_ibv(&raw_wc(ibv_wc_opcode::IBV_WC_RECV, flags, 0x0000_1a2b), INV);
        assert_eq!((wc.imm, wc.invalidated_rkey, wc.grh), (None, Some(0x1a2b), true));
        let raw = raw_wc(ibv_wc_opcode::IBV_WC_RECV, 0, 5);
        assert_eq!(wc_from_ibv(&raw, INV).invalidated_rkey, None);
        // rxe's receive of a send-with-invalidate, as seen on rxe0: the kernel's bit.
        let rxe = crate::ibverbs::context::wc_inv_flag(0x00ff_ffff);
        let wc = wc_from_ibv(&raw_wc(ibv_wc_opcode::IBV_WC_RECV, 0x5, 0x0800_01e8), rxe);
        assert_eq!((wc.invalidated_rkey, wc.grh), (Some(0x0800_01e8), true));
    }

    #[test]
    fn completion_opcodes() {
        use ibv_wc_opcode::*;
        let table = [
            (IBV_WC_SEND, WcOpcode::Send),
            (IBV_WC_RDMA_WRITE, WcOpcode::RdmaWrite),
            (IBV_WC_RDMA_READ, WcOpcode::RdmaRead),
            (IBV_WC_COMP_SWAP, WcOpcode::CompSwap),
            (IBV_WC_FETCH_ADD, WcOpcode::FetchAdd),
            (IBV_WC_BIND_MW, WcOpcode::BindMw),
            (IBV_WC_LOCAL_INV, WcOpcode::LocalInv),
            (IBV_WC_RECV, WcOpcode::Recv),
            (IBV_WC_RECV_RDMA_WITH_IMM, WcOpcode::RecvRdmaWithImm),
            (IBV_WC_TM_RECV, WcOpcode::Recv),
            (IBV_WC_TSO, WcOpcode::Send),
            // (unknown: by the receive bit, within the table and beyond it)
            (100, WcOpcode::Send),
            (200, WcOpcode::Recv),
            (257, WcOpcode::Send),
            (384, WcOpcode::Recv),
        ];
        for (raw, ours) in table {
            assert_eq!(wc_opcode_from_ibv(raw), ours, "opcode {raw}");
        }
    }

    #[test]
    fn async_events() {
        use ibv_event_type as E;
        assert_eq!(async_kind_from_ibv(E::IBV_EVENT_CQ_ERR as u32), AsyncEventKind::CqErr);
        assert_eq!(async_kind_from_ibv(E::IBV_EVENT_QP_FATAL as u32), AsyncEventKind::QpFatal);
        assert_eq!(async_kind_from_ibv(E::IBV_EVENT_PORT_ERR as u32), AsyncEventKind::PortErr);
        assert_eq!(
            async_kind_from_ibv(E::IBV_EVENT_DEVICE_FATAL as u32),
            AsyncEventKind::DeviceFatal
        );
        assert_eq!(async_kind_from_ibv(E::IBV_EVENT_PATH_MIG as u32), AsyncEventKind::Other(6));
        assert_eq!(async_kind_from_ibv(999), AsyncEventKind::Other(999));
        assert_eq!(async_element_kind(E::IBV_EVENT_CQ_ERR as u32), AsyncElementKind::Cq);
        assert_eq!(async_element_kind(E::IBV_EVENT_COMM_EST as u32), AsyncElementKind::Qp);
        assert_eq!(async_element_kind(E::IBV_EVENT_SRQ_ERR as u32), AsyncElementKind::Srq);
        assert_eq!(async_element_kind(E::IBV_EVENT_GID_CHANGE as u32), AsyncElementKind::Port);
        assert_eq!(async_element_kind(E::IBV_EVENT_DEVICE_FATAL as u32), AsyncElementKind::Device);
        assert_eq!(async_element_kind(E::IBV_EVENT_WQ_FATAL as u32), AsyncElementKind::Device);
    }

    #[test]
    fn rkey_tags_wrap_in_the_low_byte() {
        assert_eq!(inc_rkey(0x1234_5600), 0x1234_5601);
        assert_eq!(inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(inc_rkey(u32::MAX), 0xffff_ff00);
        for k in [0u32, 0xff, 0x100, 0xdead_beef, u32::MAX] {
            assert_eq!(dec_rkey(inc_rkey(k)), k);
        }
    }

    #[test]
    fn errno_helpers() {
        assert_eq!(ret_err(22).raw_os_error(), Some(22));
        assert_eq!(ret_err(-12).raw_os_error(), Some(12));
        assert_eq!(err_text(&errno_err(38)), "Function not implemented");
    }

    #[test]
    fn socket_addresses_round_trip() {
        for a in ["10.77.0.1:4791", "[fe80::1]:18515", "0.0.0.0:0"] {
            let addr: SocketAddr = a.parse().unwrap();
            let (ss, len) = sockaddr_from(addr);
            assert!(len as usize <= std::mem::size_of_val(&ss));
            // SAFETY: `ss` holds the address just written.
            let back = unsafe { sockaddr_to((&ss as *const libc::sockaddr_storage).cast()) };
            assert_eq!(back, Some(addr));
        }
        // SAFETY: a null pointer is checked first.
        assert_eq!(unsafe { sockaddr_to(std::ptr::null()) }, None);
    }

    #[test]
    fn timeouts_round_up() {
        assert_eq!(timeout_ms(Duration::ZERO), 0);
        assert_eq!(timeout_ms(Duration::from_micros(1)), 1);
        assert_eq!(timeout_ms(Duration::from_millis(1500)), 1500);
        assert_eq!(timeout_ms(Duration::from_secs(u64::MAX)), c_int::MAX);
    }
}
