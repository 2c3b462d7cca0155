//! What every case uses: the target device, opening it, PDs/CQs/MRs, connected RC/UC pairs and
//! UD pairs, posting, bounded polling, and comparisons that return a message instead of
//! panicking.
//!
//! Polling never hangs: a wait for a completion gives up after [`POLL_DEADLINE`] with a message
//! saying what was awaited. Nothing else depends on the clock, except the short
//! [`QUIET_PERIOD`] during which a case checks that *no* completion arrives.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use corelink_verbs::{
    AccessFlags, Context, Cq, Endpoint, Error, Gid, Mr, Mtu, Pd, Provider, Qp, QpAttr, QpCap,
    QpInitAttr, QpState, QpType, RecvWr, SendWr, Sge, Wc, WcOpcode, WcStatus,
};

/// What a case returns: `Err` holds a message saying what differed.
pub type CaseResult = Result<(), String>;

/// How long a case waits for a completion (or an event) before it fails.
pub const POLL_DEADLINE: Duration = Duration::from_secs(5);

/// How long a case watches a queue to conclude that nothing (more) arrives.
pub const QUIET_PERIOD: Duration = Duration::from_millis(200);

/// Returns `Err` (with file and line) from the enclosing function unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!("{}:{}: {}", file!(), line!(), format!($($fmt)+)));
        }
    };
}

/// Returns `Err` (with both values) from the enclosing function unless `got == want`.
#[macro_export]
macro_rules! ensure_eq {
    ($got:expr, $want:expr, $($fmt:tt)+) => {{
        let (got, want) = (&$got, &$want);
        if got != want {
            return Err(format!(
                "{}:{}: {}: got {:?}, expected {:?}",
                file!(),
                line!(),
                format!($($fmt)+),
                got,
                want
            ));
        }
    }};
}

/// The device a suite runs against and how to address it.
#[derive(Clone, Debug)]
pub struct Target {
    /// Device name for [`Provider::open`].
    pub device: String,
    /// Port (from 1).
    pub port: u8,
    /// GID index; `None`: the first IPv4-mapped GID of the port, else 0.
    pub gid_index: Option<u32>,
    /// IP address the connection-manager cases listen on; `None`: the IPv4 address of the GID.
    pub cm_ip: Option<IpAddr>,
    /// Device of side B where it is not [`Target::device`]: `peer:soft0` puts side B in a
    /// second process ([`crate::split`]).
    pub peer_device: Option<String>,
}

impl Target {
    /// The `soft` provider's device (any address is an in-process rendezvous name for its CM).
    pub fn soft() -> Target {
        Target {
            device: "soft0".into(),
            port: 1,
            gid_index: Some(0),
            cm_ip: Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))),
            peer_device: None,
        }
    }

    /// The `soft` provider's device with side B in a second process: for
    /// [`crate::split::Split`], whose cases then cross `soft`'s fabric between two processes.
    pub fn soft_two_processes() -> Target {
        let peer = format!("{}{}", crate::split::PEER_PREFIX, corelink_verbs::soft::DEVICE_NAME);
        Target { peer_device: Some(peer), ..Target::soft() }
    }

    /// The device named by `CORELINK_IBV_DEVICE`, with `CORELINK_IBV_PORT`,
    /// `CORELINK_IBV_GID_INDEX` and `CORELINK_IBV_ADDR` (or `CORELINK_IP`, as
    /// `tests/rxe-guest/run` sets it) when set; `Err` says why there is none.
    pub fn from_env() -> Result<Target, String> {
        let device = std::env::var("CORELINK_IBV_DEVICE")
            .ok()
            .filter(|d| !d.is_empty())
            .ok_or_else(|| "CORELINK_IBV_DEVICE not set".to_string())?;
        fn var<T: std::str::FromStr>(name: &str) -> Result<Option<T>, String> {
            match std::env::var(name) {
                Ok(v) if !v.is_empty() => {
                    v.parse().map(Some).map_err(|_| format!("{name}={v:?} does not parse"))
                }
                _ => Ok(None),
            }
        }
        Ok(Target {
            device,
            port: var("CORELINK_IBV_PORT")?.unwrap_or(1),
            gid_index: var("CORELINK_IBV_GID_INDEX")?,
            cm_ip: match var("CORELINK_IBV_ADDR")? {
                Some(ip) => Some(ip),
                None => var("CORELINK_IP")?,
            },
            peer_device: None,
        })
    }
}

/// Maps a verbs error to the suite's message, with its chain of causes.
pub trait Ctx<T> {
    /// `Err(e)` becomes `Err("what: e: cause: ...")`.
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T> Ctx<T> for corelink_verbs::Result<T> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {}", chain(&e)))
    }
}

/// An error and its sources, joined by `: `.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// An open device with one protection domain.
#[derive(Debug)]
pub struct Dev<P: Provider> {
    /// The protection domain everything of the case lives in.
    pub pd: P::Pd,
    /// The device context.
    pub ctx: P::Context,
    /// Port in use.
    pub port: u8,
    /// GID index in use.
    pub gid_index: u32,
    /// The port's active MTU.
    pub mtu: Mtu,
    /// The port's LID.
    pub lid: u16,
}

impl<P: Provider> Dev<P> {
    /// Opens `t`'s device and allocates a PD.
    pub fn open(t: &Target) -> Result<Dev<P>, String> {
        Dev::open_named(t, &t.device)
    }

    /// Opens the device called `device` with `t`'s port and GID and allocates a PD.
    pub fn open_named(t: &Target, device: &str) -> Result<Dev<P>, String> {
        let ctx = P::open(device).ctx(&format!("open {device}"))?;
        let port = ctx.query_port(t.port).ctx("query_port")?;
        let gid_index = match t.gid_index {
            Some(i) => i,
            None => first_ipv4_gid::<P>(&ctx, t.port, port.gid_tbl_len).map_or(0, |(i, _)| i),
        };
        let pd = ctx.alloc_pd().ctx("alloc_pd")?;
        Ok(Dev { pd, ctx, port: t.port, gid_index, mtu: port.active_mtu, lid: port.lid })
    }

    /// The GID in use.
    pub fn gid(&self) -> Result<Gid, String> {
        self.ctx.query_gid(self.port, self.gid_index).ctx("query_gid")
    }

    /// A CQ of at least `depth` completions.
    pub fn cq(&self, depth: u32) -> Result<P::Cq, String> {
        self.ctx.create_cq(depth).ctx("create_cq")
    }

    /// A fresh zeroed region of `len` bytes in this device's PD.
    pub fn mr(&self, len: usize, access: AccessFlags) -> Result<P::Mr, String> {
        self.pd.register(len, access).ctx(&format!("register {len} bytes {access:?}"))
    }

    /// A QP in RESET.
    pub fn qp(
        &self,
        qp_type: QpType,
        send_cq: &P::Cq,
        recv_cq: &P::Cq,
        srq: Option<&P::Srq>,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> Result<P::Qp, String> {
        self.pd
            .create_qp(&QpInitAttr { qp_type, send_cq, recv_cq, srq, cap, sq_sig_all })
            .ctx(&format!("create_qp {qp_type}"))
    }

    /// Where a peer connects to reach `qp`.
    pub fn endpoint(&self, qp: &P::Qp) -> Result<Endpoint, String> {
        self.ctx.endpoint(qp, self.port, self.gid_index).ctx("endpoint")
    }

    /// Default QP attributes for this device's port, GID and MTU.
    pub fn attr(&self) -> QpAttr {
        QpAttr {
            port: self.port,
            sgid_index: self.gid_index as u8,
            path_mtu: self.mtu.min(Mtu::Mtu4096),
            ..QpAttr::default()
        }
    }

    /// `t`'s connection-manager address with `port`.
    pub fn cm_addr(&self, t: &Target, port: u16) -> Result<SocketAddr, String> {
        let ip = match t.cm_ip {
            Some(ip) => ip,
            None => {
                let g = self.gid()?;
                match std::net::Ipv6Addr::from(g.0).to_ipv4_mapped() {
                    Some(v4) => IpAddr::V4(v4),
                    None => {
                        return Err(format!(
                            "GID {g} is not IPv4-mapped: set CORELINK_IBV_ADDR to the \
                             device's IP address for the CM cases"
                        ))
                    }
                }
            }
        };
        Ok(SocketAddr::new(ip, port))
    }
}

fn first_ipv4_gid<P: Provider>(ctx: &P::Context, port: u8, len: u32) -> Option<(u32, Gid)> {
    (0..len.min(256)).find_map(|i| {
        let g = ctx.query_gid(port, i).ok()?;
        std::net::Ipv6Addr::from(g.0).to_ipv4_mapped().map(|_| (i, g))
    })
}

/// Both devices of a case (two contexts of the target device, each with a PD; side B's on
/// [`Target::peer_device`] where there is one).
pub fn devs<P: Provider>(t: &Target) -> Result<(Dev<P>, Dev<P>), String> {
    Ok((Dev::open(t)?, Dev::open_named(t, t.peer_device.as_deref().unwrap_or(&t.device))?))
}

/// One side of a pair: a QP and its CQs (dropped in that order). Its device is separate, so
/// that a case creates its regions between the devices and the QPs, and they are dropped after
/// the QPs that may still name them.
#[derive(Debug)]
pub struct Side<P: Provider> {
    /// The QP, in RTS once the pair is made.
    pub qp: P::Qp,
    /// Send CQ.
    pub scq: P::Cq,
    /// Receive CQ.
    pub rcq: P::Cq,
}

/// How [`pair`] builds its two sides.
#[derive(Clone, Copy, Debug)]
pub struct PairOpts {
    /// Transport.
    pub qp_type: QpType,
    /// QP capabilities (both sides).
    pub cap: QpCap,
    /// Every send completes (both sides).
    pub sq_sig_all: bool,
    /// Depth of side A's send CQ.
    pub a_send_cq_depth: u32,
    /// RNR retries of side A (7: infinite).
    pub a_rnr_retry: u8,
}

impl PairOpts {
    /// Defaults for `qp_type`: every send signalled, CQs of 256.
    pub fn new(qp_type: QpType) -> PairOpts {
        PairOpts {
            qp_type,
            cap: QpCap::default(),
            sq_sig_all: true,
            a_send_cq_depth: 256,
            a_rnr_retry: 7,
        }
    }
}

/// Two sides, on `da` and `db`, connected to each other (RC/UC) or both in RTS (UD). Side A is
/// the requester in most cases, side B the responder.
pub fn pair<P: Provider>(
    da: &Dev<P>,
    db: &Dev<P>,
    o: &PairOpts,
) -> Result<(Side<P>, Side<P>), String> {
    let side = |dev: &Dev<P>, depth: u32| -> Result<Side<P>, String> {
        let scq = dev.cq(depth)?;
        let rcq = dev.cq(256)?;
        let qp = dev.qp(o.qp_type, &scq, &rcq, None, o.cap, o.sq_sig_all)?;
        Ok(Side { qp, scq, rcq })
    };
    let mut a = side(da, o.a_send_cq_depth)?;
    let mut b = side(db, 256)?;
    let mut a_attr = da.attr();
    a_attr.rnr_retry = o.a_rnr_retry;
    let b_attr = db.attr();
    if o.qp_type == QpType::Ud {
        a.qp.connect_to(Endpoint::default(), &a_attr).ctx("UD QP A to RTS")?;
        b.qp.connect_to(Endpoint::default(), &b_attr).ctx("UD QP B to RTS")?;
    } else {
        let (ea, eb) = (da.endpoint(&a.qp)?, db.endpoint(&b.qp)?);
        a.qp.connect_to(eb, &a_attr).ctx("connect A to B")?;
        b.qp.connect_to(ea, &b_attr).ctx("connect B to A")?;
    }
    ensure_eq!(a.qp.state(), QpState::Rts, "side A's state after connecting");
    ensure_eq!(b.qp.state(), QpState::Rts, "side B's state after connecting");
    Ok((a, b))
}

/// Posts send requests.
///
/// # Safety
/// As [`Qp::post_send`]: every buffer named by a non-inline list stays valid until the
/// request's completion (or a later signalled one's) has been polled.
pub unsafe fn post<P: Provider>(
    qp: &mut P::Qp,
    wrs: &[SendWr<'_, P>],
) -> corelink_verbs::Result<()> {
    // SAFETY: forwarded to the caller.
    unsafe { qp.post_send(wrs) }
}

/// Posts receive requests to a QP.
///
/// # Safety
/// As [`Qp::post_recv`]: the buffers stay valid until their completions have been polled.
pub unsafe fn post_recv<P: Provider>(qp: &mut P::Qp, wrs: &[RecvWr<'_>]) -> Result<(), String> {
    // SAFETY: forwarded to the caller.
    unsafe { qp.post_recv(wrs) }.ctx("post_recv")
}

/// Posts one request and polls `cq` for its completion (which must carry its `wr_id`).
///
/// # Safety
/// As [`post`]; the request is complete when this returns `Ok`.
pub unsafe fn exec<P: Provider>(
    qp: &mut P::Qp,
    cq: &P::Cq,
    wr: SendWr<'_, P>,
) -> Result<Wc, String> {
    let what = format!("{:?}", wr.op);
    // SAFETY: forwarded to the caller.
    unsafe { post::<P>(qp, &[wr]) }.ctx(&format!("post_send {what}"))?;
    let wc = poll_one(cq, &format!("the completion of {what}"))?;
    ensure_eq!(wc.wr_id, wr.wr_id, "wr_id of the completion of {what}");
    Ok(wc)
}

/// Polls `cq` until `n` completions have arrived, or fails after [`POLL_DEADLINE`].
pub fn poll<C: Cq>(cq: &C, n: usize, what: &str) -> Result<Vec<Wc>, String> {
    let deadline = Instant::now() + POLL_DEADLINE;
    let mut got = Vec::with_capacity(n);
    let mut buf = [Wc::default(); 16];
    while got.len() < n {
        let want = (n - got.len()).min(buf.len());
        let k = cq.poll(&mut buf[..want]).ctx("poll")?;
        buf[..k].iter().for_each(crate::record::completion);
        got.extend_from_slice(&buf[..k]);
        if k == 0 {
            if Instant::now() > deadline {
                return Err(format!(
                    "waiting for {what}: {} of {n} completions after {POLL_DEADLINE:?}: {got:?}",
                    got.len()
                ));
            }
            std::thread::yield_now();
        }
    }
    Ok(got)
}

/// Polls one completion.
pub fn poll_one<C: Cq>(cq: &C, what: &str) -> Result<Wc, String> {
    Ok(poll(cq, 1, what)?[0])
}

/// Watches `cq` for [`QUIET_PERIOD`] and fails if anything arrives.
pub fn expect_quiet<C: Cq>(cq: &C, what: &str) -> CaseResult {
    let end = Instant::now() + QUIET_PERIOD;
    let mut buf = [Wc::default(); 4];
    loop {
        let k = cq.poll(&mut buf).ctx("poll")?;
        buf[..k].iter().for_each(crate::record::completion);
        ensure!(k == 0, "expected no completion ({what}), got {:?}", &buf[..k]);
        if Instant::now() > end {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Checks a completion's `wr_id`, status and (on success) opcode.
pub fn check_wc(wc: &Wc, wr_id: u64, status: WcStatus, opcode: WcOpcode) -> CaseResult {
    ensure_eq!(wc.wr_id, wr_id, "wr_id of {wc:?}");
    ensure_eq!(wc.status, status, "status of wr {wr_id} ({wc:?})");
    if status.is_success() {
        ensure_eq!(wc.opcode, opcode, "opcode of wr {wr_id} ({wc:?})");
    }
    Ok(())
}

/// `len` bytes of a recognisable pattern depending on `seed`.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).wrapping_add((i >> 8) as u8))
        .collect()
}

/// Copies `len` bytes at `off` out of `mr`.
pub fn bytes<M: Mr>(mr: &M, off: usize, len: usize) -> Result<Vec<u8>, String> {
    let mut v = vec![0; len];
    mr.read_at(off, &mut v).ctx("Mr::read_at")?;
    crate::record::memory(&v);
    Ok(v)
}

/// Fills `mr` with `pattern(seed, len)` and returns the pattern.
pub fn fill<M: Mr>(mr: &M, seed: u8) -> Result<Vec<u8>, String> {
    let p = pattern(seed, mr.len());
    mr.write_at(0, &p).ctx("Mr::write_at")?;
    Ok(p)
}

/// Checks `mr` byte for byte against `want` (from offset 0), naming the first difference.
pub fn check_bytes<M: Mr>(mr: &M, off: usize, want: &[u8], what: &str) -> CaseResult {
    let got = bytes(mr, off, want.len())?;
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        return Err(format!(
            "{what}: byte {} (offset {}) is {:#04x}, expected {:#04x}",
            i,
            off + i,
            got[i],
            want[i]
        ));
    }
    Ok(())
}

/// The scatter/gather entry for `len` bytes at `off` of `mr`.
pub fn sge<M: Mr>(mr: &M, off: usize, len: u32) -> Result<Sge, String> {
    mr.sge(off, len).ctx("Mr::sge")
}

/// Whether `e` is a refusal at post of request `index`.
pub fn is_post_send_refusal(e: &Error, index: usize) -> bool {
    matches!(e, Error::PostSend { index: i, .. } if *i == index)
}

/// Posts a receive of `len` bytes at offset 0 of `mr` on `qp`.
///
/// # Safety
/// `mr` outlives the receive's completion (or the QP).
pub unsafe fn recv<P: Provider>(qp: &mut P::Qp, wr_id: u64, mr: &P::Mr, len: u32) -> CaseResult {
    let sgl = [sge(mr, 0, len)?];
    // SAFETY: forwarded to the caller; the list itself is copied at post.
    unsafe { post_recv::<P>(qp, &[RecvWr { wr_id, sgl: &sgl }]) }
}

/// Checks that `qp` reports `want`.
pub fn check_state<P: Provider>(qp: &P::Qp, want: QpState, what: &str) -> CaseResult {
    ensure_eq!(qp.state(), want, "state of {what}");
    Ok(())
}

/// Private data as received: `sent` followed by nothing, or (where the transport pads it, as
/// the IB CM does) by zeros.
pub fn check_private_data(got: &[u8], sent: &[u8], padded_ok: bool, what: &str) -> CaseResult {
    let prefix_ok = got.len() >= sent.len() && &got[..sent.len()] == sent;
    let rest_ok = if padded_ok {
        got[sent.len().min(got.len())..].iter().all(|&b| b == 0)
    } else {
        got.len() == sent.len()
    };
    ensure!(
        prefix_ok && rest_ok,
        "{what}: got {got:?}, expected {sent:?}{}",
        if padded_ok { " (zero-padded)" } else { "" }
    );
    Ok(())
}
