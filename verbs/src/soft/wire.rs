//! The messages `soft` processes on one named fabric exchange (see [`super::port`]): requests
//! and their responses, as a NIC's requester and responder exchange packets, and the connection
//! manager's messages. A frame is a little-endian `u32` length and a body; [`Msg::decode`]
//! checks every field (a peer is a process of the same user, but a bad frame must not crash
//! this one: fuzzed by `fuzz/fuzz_targets/soft_wire.rs`).

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::types::{Gid, QpType, RemoteAddr, WcStatus};

/// The largest frame body accepted: a 2 GiB message (`limits::MAX_MSG`) and its header.
pub(crate) const MAX_FRAME: usize = (1 << 31) + 256;

/// What a request asks of the target QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireOp {
    /// A send (its payload in the frame), with an immediate.
    Send(Option<u32>),
    /// A send that invalidates the target's window with this rkey.
    SendInv(u32),
    /// A write (its payload in the frame), with an immediate.
    Write(RemoteAddr, Option<u32>),
    /// A read of this many bytes.
    Read(RemoteAddr, u32),
    /// Compare and swap.
    CompSwap(RemoteAddr, u64, u64),
    /// Fetch and add.
    FetchAdd(RemoteAddr, u64),
    /// A UD send to the QP with this GID and qkey, with an immediate.
    UdSend { gid: Gid, qkey: u32, imm: Option<u32> },
}

impl WireOp {
    /// The remote right the target's QP and key must grant (none for sends).
    pub(crate) fn rights(&self) -> crate::types::AccessFlags {
        use crate::types::AccessFlags;
        match self {
            WireOp::Write(..) => AccessFlags::REMOTE_WRITE,
            WireOp::Read(..) => AccessFlags::REMOTE_READ,
            WireOp::CompSwap(..) | WireOp::FetchAdd(..) => AccessFlags::REMOTE_ATOMIC,
            _ => AccessFlags::empty(),
        }
    }
}

/// What the responder answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Done with this status and byte count (a read's or an atomic's data in the frame).
    Done(WcStatus, u32),
    /// No receive was posted: the requester tries again after this many microseconds.
    Rnr(u64),
}

/// One message between two processes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Msg {
    /// A request from QP `src_qpn` (of type `src_type`) to QP `dst_qpn`; `seq` 0: no response
    /// is wanted (UC, UD).
    Req { seq: u64, dst_qpn: u32, src_qpn: u32, src_type: QpType, op: WireOp, payload: Vec<u8> },
    /// The response to request `seq`.
    Resp { seq: u64, outcome: Outcome, data: Vec<u8> },
    /// A connect request (`attempt` is the connector's number for it) to the listener at
    /// `listener`, from QP `qpn` on the port with `gid`.
    ConnReq {
        attempt: u64,
        listener: SocketAddr,
        gid: Gid,
        qpn: u32,
        qp_type: QpType,
        private_data: Vec<u8>,
    },
    /// Attempt `attempt` accepted by QP `qpn` on the port with `gid`; `plan`: the listener's
    /// fault plan (`soft::faults::plan_at`), the connector's QP's too.
    Accepted {
        attempt: u64,
        qpn: u32,
        gid: Gid,
        private_data: Vec<u8>,
        plan: Option<super::faults::FaultPlan>,
    },
    /// Attempt `attempt` rejected.
    Rejected { attempt: u64, private_data: Vec<u8> },
    /// The connector of `attempt` is up.
    Ready { attempt: u64 },
    /// One end gave `attempt` up; `to_connector`: the message goes to the connector.
    Abandoned { attempt: u64, to_connector: bool },
    /// One end of the connection made by `attempt` disconnected.
    Disconnect { attempt: u64, to_connector: bool },
    /// The first frame on a stream, from its acceptor: the descriptor of its published table
    /// (`soft::shm`; `u32::MAX`: none).
    Hello { table_fd: u32 },
    /// The first frame on a stream, from its connector: the descriptor of its mailbox for
    /// this peer (`soft::shm::Mailbox`; `u32::MAX`: none).
    Mailbox { fd: u32 },
    /// The connector left a request in its mailbox and the peer did not take it up soon:
    /// serve the mailbox now.
    Nudge,
}

/// Why a frame did not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    /// It ends before its last field.
    #[error("the frame ends early")]
    Short,
    /// A tag or enumerated field has no meaning.
    #[error("unknown {0} {1}")]
    Unknown(&'static str, u64),
    /// Bytes are left after the last field.
    #[error("{0} bytes after the message")]
    Trailing(usize),
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Short);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn bool(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(WireError::Unknown("flag", u64::from(v))),
        }
    }
    fn opt_u32(&mut self) -> Result<Option<u32>, WireError> {
        let some = self.bool()?;
        let v = self.u32()?;
        match (some, v) {
            (true, v) => Ok(Some(v)),
            (false, 0) => Ok(None),
            (false, v) => Err(WireError::Unknown("value of an absent field", u64::from(v))),
        }
    }
    fn gid(&mut self) -> Result<Gid, WireError> {
        Ok(Gid(self.take(16)?.try_into().expect("16 bytes")))
    }
    fn remote(&mut self) -> Result<RemoteAddr, WireError> {
        let addr = self.u64()?;
        let rkey = self.u32()?;
        Ok(RemoteAddr { addr, rkey })
    }
    fn qp_type(&mut self) -> Result<QpType, WireError> {
        match self.u8()? {
            0 => Ok(QpType::Rc),
            1 => Ok(QpType::Uc),
            2 => Ok(QpType::Ud),
            v => Err(WireError::Unknown("QP type", u64::from(v))),
        }
    }
    fn addr(&mut self) -> Result<SocketAddr, WireError> {
        let ip = Ipv6Addr::from(<[u8; 16]>::try_from(self.take(16)?).expect("16 bytes"));
        let port = self.u16()?;
        // (IPv4 addresses travel mapped)
        let ip = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
        Ok(SocketAddr::new(ip, port))
    }
    /// The rest of the frame.
    fn rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0).to_vec()
    }
    /// A length-prefixed byte string.
    /// A probability of a fault plan: `0.0..=1.0` (its bits), anything else refused.
    fn prob(&mut self) -> Result<f64, WireError> {
        let bits = self.u64()?;
        let p = f64::from_bits(bits);
        if (0.0..=1.0).contains(&p) {
            Ok(p)
        } else {
            Err(WireError::Unknown("probability", bits))
        }
    }

    /// A plan's delay in microseconds, at most `MAX_DELAY_US`.
    fn delay(&mut self) -> Result<u32, WireError> {
        let us = self.u32()?;
        if us <= super::faults::MAX_DELAY_US {
            Ok(us)
        } else {
            Err(WireError::Unknown("delay", u64::from(us)))
        }
    }

    /// A fault plan, if one is there (a flag, then its fields).
    fn plan(&mut self) -> Result<Option<super::faults::FaultPlan>, WireError> {
        if !self.bool()? {
            return Ok(None);
        }
        Ok(Some(super::faults::FaultPlan {
            seed: self.u64()?,
            drop: self.prob()?,
            dup: self.prob()?,
            delay_us: self.delay()?,
            reorder: self.prob()?,
            rnr: self.prob()?,
            cm_drop: self.prob()?,
            cm_delay_us: self.delay()?,
            cq_overrun: self.prob()?,
        }))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, WireError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
}

struct Writer(Vec<u8>);

impl Writer {
    /// A request's fields before its payload.
    fn req_head(&mut self, seq: u64, dst_qpn: u32, src_qpn: u32, src_type: QpType, op: &WireOp) {
        self.u8(1);
        self.u64(seq);
        self.u32(dst_qpn);
        self.u32(src_qpn);
        self.qp_type(src_type);
        match op {
            WireOp::Send(imm) => {
                self.u8(0);
                self.opt_u32(*imm);
            }
            WireOp::SendInv(rkey) => {
                self.u8(1);
                self.u32(*rkey);
            }
            WireOp::Write(r, imm) => {
                self.u8(2);
                self.remote(r);
                self.opt_u32(*imm);
            }
            WireOp::Read(r, len) => {
                self.u8(3);
                self.remote(r);
                self.u32(*len);
            }
            WireOp::CompSwap(r, cmp, swap) => {
                self.u8(4);
                self.remote(r);
                self.u64(*cmp);
                self.u64(*swap);
            }
            WireOp::FetchAdd(r, add) => {
                self.u8(5);
                self.remote(r);
                self.u64(*add);
            }
            WireOp::UdSend { gid, qkey, imm } => {
                self.u8(6);
                self.gid(gid);
                self.u32(*qkey);
                self.opt_u32(*imm);
            }
        }
    }

    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn opt_u32(&mut self, v: Option<u32>) {
        self.u8(u8::from(v.is_some()));
        self.u32(v.unwrap_or(0));
    }
    fn gid(&mut self, g: &Gid) {
        self.0.extend_from_slice(&g.0);
    }
    fn remote(&mut self, r: &RemoteAddr) {
        self.u64(r.addr);
        self.u32(r.rkey);
    }
    fn qp_type(&mut self, t: QpType) {
        self.u8(match t {
            QpType::Rc => 0,
            QpType::Uc => 1,
            QpType::Ud => 2,
        });
    }
    fn addr(&mut self, a: &SocketAddr) {
        let ip = match a.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        self.0.extend_from_slice(&ip.octets());
        self.u16(a.port());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }

    fn plan(&mut self, plan: Option<&super::faults::FaultPlan>) {
        let Some(p) = plan else { return self.u8(0) };
        self.u8(1);
        self.u64(p.seed);
        self.u64(p.drop.to_bits());
        self.u64(p.dup.to_bits());
        self.u32(p.delay_us);
        self.u64(p.reorder.to_bits());
        self.u64(p.rnr.to_bits());
        self.u64(p.cm_drop.to_bits());
        self.u32(p.cm_delay_us);
        self.u64(p.cq_overrun.to_bits());
    }
}

fn status(v: u8) -> Result<WcStatus, WireError> {
    WcStatus::ALL.get(usize::from(v)).copied().ok_or(WireError::Unknown("status", u64::from(v)))
}

fn status_code(s: WcStatus) -> u8 {
    WcStatus::ALL.iter().position(|x| *x == s).unwrap_or(0) as u8
}

impl Msg {
    /// The frame of this message: its length, then its body.
    pub(crate) fn encode(&self) -> Vec<u8> {
        // (one allocation: the header is at most 64 bytes, then a payload or data)
        let body = match self {
            Msg::Req { payload, .. } => payload.len(),
            Msg::Resp { data, .. } => data.len(),
            _ => 200,
        };
        let mut w = Writer(Vec::with_capacity(68 + body));
        w.0.extend_from_slice(&[0; 4]);
        match self {
            Msg::Req { seq, dst_qpn, src_qpn, src_type, op, payload } => {
                w.req_head(*seq, *dst_qpn, *src_qpn, *src_type, op);
                w.0.extend_from_slice(payload);
            }
            Msg::Resp { seq, outcome, data } => {
                w.u8(2);
                w.u64(*seq);
                match outcome {
                    Outcome::Done(st, len) => {
                        w.u8(0);
                        w.u8(status_code(*st));
                        w.u64(u64::from(*len));
                    }
                    Outcome::Rnr(us) => {
                        w.u8(1);
                        w.u8(0);
                        w.u64(*us);
                    }
                }
                w.0.extend_from_slice(data);
            }
            Msg::ConnReq { attempt, listener, gid, qpn, qp_type, private_data } => {
                w.u8(3);
                w.u64(*attempt);
                w.addr(listener);
                w.gid(gid);
                w.u32(*qpn);
                w.qp_type(*qp_type);
                w.bytes(private_data);
            }
            Msg::Accepted { attempt, qpn, gid, private_data, plan } => {
                w.u8(4);
                w.u64(*attempt);
                w.u32(*qpn);
                w.gid(gid);
                w.bytes(private_data);
                w.plan(plan.as_ref());
            }
            Msg::Rejected { attempt, private_data } => {
                w.u8(5);
                w.u64(*attempt);
                w.bytes(private_data);
            }
            Msg::Ready { attempt } => {
                w.u8(6);
                w.u64(*attempt);
            }
            Msg::Abandoned { attempt, to_connector } => {
                w.u8(7);
                w.u64(*attempt);
                w.u8(u8::from(*to_connector));
            }
            Msg::Disconnect { attempt, to_connector } => {
                w.u8(8);
                w.u64(*attempt);
                w.u8(u8::from(*to_connector));
            }
            Msg::Hello { table_fd } => {
                w.u8(9);
                w.u32(*table_fd);
            }
            Msg::Mailbox { fd } => {
                w.u8(10);
                w.u32(*fd);
            }
            Msg::Nudge => w.u8(11),
        }
        let len = (w.0.len() - 4) as u32;
        w.0[..4].copy_from_slice(&len.to_le_bytes());
        w.0
    }

    /// The frame of a request (as [`Msg::encode`] makes it) whose `payload_len` bytes of
    /// payload `fill` writes in place: one buffer, no copy of the payload made first.
    pub(crate) fn req_frame(
        seq: u64,
        dst_qpn: u32,
        src_qpn: u32,
        src_type: QpType,
        op: &WireOp,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(68 + payload_len));
        w.0.extend_from_slice(&[0; 4]);
        w.req_head(seq, dst_qpn, src_qpn, src_type, op);
        let start = w.0.len();
        w.0.resize(start + payload_len, 0);
        fill(&mut w.0[start..]);
        let len = (w.0.len() - 4) as u32;
        w.0[..4].copy_from_slice(&len.to_le_bytes());
        w.0
    }

    /// Decodes a frame's body (without its length).
    pub(crate) fn decode(body: &[u8]) -> Result<Msg, WireError> {
        let mut r = Reader(body);
        let msg = match r.u8()? {
            1 => {
                let seq = r.u64()?;
                let dst_qpn = r.u32()?;
                let src_qpn = r.u32()?;
                let src_type = r.qp_type()?;
                let op = match r.u8()? {
                    0 => WireOp::Send(r.opt_u32()?),
                    1 => WireOp::SendInv(r.u32()?),
                    2 => WireOp::Write(r.remote()?, r.opt_u32()?),
                    3 => WireOp::Read(r.remote()?, r.u32()?),
                    4 => WireOp::CompSwap(r.remote()?, r.u64()?, r.u64()?),
                    5 => WireOp::FetchAdd(r.remote()?, r.u64()?),
                    6 => WireOp::UdSend { gid: r.gid()?, qkey: r.u32()?, imm: r.opt_u32()? },
                    v => return Err(WireError::Unknown("operation", u64::from(v))),
                };
                return Ok(Msg::Req { seq, dst_qpn, src_qpn, src_type, op, payload: r.rest() });
            }
            2 => {
                let seq = r.u64()?;
                let kind = r.u8()?;
                let st = r.u8()?;
                let v = r.u64()?;
                let outcome = match kind {
                    0 => {
                        let len = u32::try_from(v).map_err(|_| WireError::Unknown("length", v))?;
                        Outcome::Done(status(st)?, len)
                    }
                    1 if st == 0 => Outcome::Rnr(v),
                    1 => return Err(WireError::Unknown("status of an RNR", u64::from(st))),
                    k => return Err(WireError::Unknown("outcome", u64::from(k))),
                };
                return Ok(Msg::Resp { seq, outcome, data: r.rest() });
            }
            3 => Msg::ConnReq {
                attempt: r.u64()?,
                listener: r.addr()?,
                gid: r.gid()?,
                qpn: r.u32()?,
                qp_type: r.qp_type()?,
                private_data: r.bytes()?,
            },
            4 => Msg::Accepted {
                attempt: r.u64()?,
                qpn: r.u32()?,
                gid: r.gid()?,
                private_data: r.bytes()?,
                plan: r.plan()?,
            },
            5 => Msg::Rejected { attempt: r.u64()?, private_data: r.bytes()? },
            6 => Msg::Ready { attempt: r.u64()? },
            7 => Msg::Abandoned { attempt: r.u64()?, to_connector: r.bool()? },
            8 => Msg::Disconnect { attempt: r.u64()?, to_connector: r.bool()? },
            9 => Msg::Hello { table_fd: r.u32()? },
            10 => Msg::Mailbox { fd: r.u32()? },
            11 => Msg::Nudge,
            t => return Err(WireError::Unknown("message", u64::from(t))),
        };
        match r.0.len() {
            0 => Ok(msg),
            n => Err(WireError::Trailing(n)),
        }
    }
}

/// Decodes `data` as a sequence of frames, as a reader of a link does (for the fuzz target):
/// the messages, and the error that ended it, if any.
#[doc(hidden)]
pub fn decode_frames(mut data: &[u8]) -> (usize, Option<String>) {
    let mut n = 0;
    while data.len() >= 4 {
        let len = u32::from_le_bytes(data[..4].try_into().expect("4 bytes")) as usize;
        if len > MAX_FRAME || len > data.len() - 4 {
            return (n, Some(format!("a frame of {len} bytes")));
        }
        match Msg::decode(&data[4..4 + len]) {
            Ok(m) => {
                // What decodes encodes back to the same frame.
                let again = m.encode();
                assert_eq!(&again[4..], &data[4..4 + len], "{m:?}");
                n += 1;
            }
            Err(e) => return (n, Some(e.to_string())),
        }
        data = &data[4 + len..];
    }
    (n, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let r = RemoteAddr { addr: 0x1000, rkey: 0x105 };
        let gid = Gid([7; 16]);
        let ops = [
            WireOp::Send(Some(9)),
            WireOp::Send(None),
            WireOp::SendInv(3),
            WireOp::Write(r, Some(1)),
            WireOp::Read(r, 64),
            WireOp::CompSwap(r, 1, 2),
            WireOp::FetchAdd(r, 5),
            WireOp::UdSend { gid, qkey: 0x11, imm: None },
        ];
        let mut msgs: Vec<Msg> = ops
            .iter()
            .map(|&op| Msg::Req {
                seq: 4,
                dst_qpn: 0x11,
                src_qpn: 0x12,
                src_type: QpType::Uc,
                op,
                payload: vec![1, 2, 3],
            })
            .collect();
        msgs.extend([
            Msg::Resp { seq: 1, outcome: Outcome::Done(WcStatus::RemAccessErr, 0), data: vec![] },
            Msg::Resp { seq: 2, outcome: Outcome::Rnr(640), data: vec![] },
            Msg::Resp { seq: 3, outcome: Outcome::Done(WcStatus::Success, 8), data: vec![9; 8] },
            Msg::ConnReq {
                attempt: 1,
                listener: "127.0.0.1:7000".parse().unwrap(),
                gid,
                qpn: 0x20,
                qp_type: QpType::Rc,
                private_data: b"hello".to_vec(),
            },
            Msg::ConnReq {
                attempt: 1,
                listener: "[::1]:7000".parse().unwrap(),
                gid,
                qpn: 0x20,
                qp_type: QpType::Ud,
                private_data: vec![],
            },
            Msg::Accepted { attempt: 2, qpn: 0x21, gid, private_data: vec![1], plan: None },
            Msg::Accepted {
                attempt: 3,
                qpn: 0x22,
                gid,
                private_data: vec![],
                plan: Some(super::super::faults::FaultPlan {
                    seed: 9,
                    drop: 0.25,
                    cq_overrun: 1.0,
                    cm_delay_us: 7,
                    ..Default::default()
                }),
            },
            Msg::Rejected { attempt: 3, private_data: vec![2; 148] },
            Msg::Ready { attempt: 4 },
            Msg::Abandoned { attempt: 5, to_connector: true },
            Msg::Disconnect { attempt: 6, to_connector: false },
            Msg::Hello { table_fd: 7 },
            Msg::Mailbox { fd: 8 },
            Msg::Nudge,
        ]);
        let mut stream = Vec::new();
        for m in &msgs {
            let f = m.encode();
            assert_eq!(Msg::decode(&f[4..]).as_ref(), Ok(m));
            stream.extend_from_slice(&f);
        }
        assert_eq!(decode_frames(&stream), (msgs.len(), None));
        let op = WireOp::Write(r, None);
        let m = Msg::Req {
            seq: 3,
            dst_qpn: 1,
            src_qpn: 2,
            src_type: QpType::Rc,
            op,
            payload: vec![5; 9],
        };
        let f = Msg::req_frame(3, 1, 2, QpType::Rc, &op, 9, |p| p.fill(5));
        assert_eq!(f, m.encode());
    }

    #[test]
    fn bad_frames_are_errors() {
        assert_eq!(Msg::decode(&[]), Err(WireError::Short));
        assert_eq!(Msg::decode(&[9]), Err(WireError::Short));
        assert_eq!(Msg::decode(&[12]), Err(WireError::Unknown("message", 12)));
        let f = Msg::Ready { attempt: 1 }.encode();
        let mut long = f[4..].to_vec();
        long.push(0);
        assert_eq!(Msg::decode(&long), Err(WireError::Trailing(1)));
        assert_eq!(Msg::decode(&f[4..8]), Err(WireError::Short));
        let mut bad = Msg::Abandoned { attempt: 1, to_connector: true }.encode()[4..].to_vec();
        *bad.last_mut().unwrap() = 2;
        assert_eq!(Msg::decode(&bad), Err(WireError::Unknown("flag", 2)));
        let mut st =
            Msg::Resp { seq: 1, outcome: Outcome::Done(WcStatus::Success, 0), data: vec![] }
                .encode()[4..]
                .to_vec();
        st[10] = 200;
        assert_eq!(Msg::decode(&st), Err(WireError::Unknown("status", 200)));
    }
}
