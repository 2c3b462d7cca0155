//! What the two sides of a verbs run tell each other over their TCP socket, as perftest does:
//! once, each side's [`Info`] (its queue pairs' numbers and first PSNs, its port's LID and GID,
//! and the region the peer writes, reads and runs atomics on); then small fixed-size control
//! messages ([`Ctl`]) around each measured size.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use corelink_verbs::{Gid, RemoteRegion};

const MAGIC: &[u8; 8] = b"clverbs1";

/// Bytes of [`Info`] before its queue pairs.
const HEAD: usize = 8 + 3 + 8 + 2 + 16 + RemoteRegion::WIRE_BYTES + 2;

/// The most queue pairs an [`Info`] may carry.
pub const MAX_QPS: usize = 1024;

/// One side's description of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    /// `Test::code` of the test it runs.
    pub test: u8,
    /// 0 RC, 1 UC, 2 UD.
    pub transport: u8,
    /// Whether its receives come from a shared receive queue.
    pub srq: bool,
    /// The largest message it runs.
    pub max_size: u64,
    /// Its port's LID (0 on RoCE).
    pub lid: u16,
    /// Its GID.
    pub gid: Gid,
    /// The region peers write, read and run atomics on (receives land there too).
    pub region: RemoteRegion,
    /// Its queue pairs: (QP number, first PSN).
    pub qps: Vec<(u32, u32)>,
}

impl Info {
    /// The wire form.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEAD + 8 * self.qps.len());
        v.extend_from_slice(MAGIC);
        v.extend_from_slice(&[self.test, self.transport, u8::from(self.srq)]);
        v.extend_from_slice(&self.max_size.to_le_bytes());
        v.extend_from_slice(&self.lid.to_le_bytes());
        v.extend_from_slice(&self.gid.0);
        v.extend_from_slice(&self.region.to_bytes());
        v.extend_from_slice(&(self.qps.len() as u16).to_le_bytes());
        for (qpn, psn) in &self.qps {
            v.extend_from_slice(&qpn.to_le_bytes());
            v.extend_from_slice(&psn.to_le_bytes());
        }
        v
    }

    /// Parses the part before the queue pairs; returns it (without them) and how many follow.
    fn parse_head(b: &[u8]) -> Result<(Info, usize), String> {
        if b.len() < HEAD || &b[..8] != MAGIC {
            return Err("the peer is not a corelink-perf verbs run (use the same -c and \
                        --use-srq on both sides)"
                .into());
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[21..37]);
        let region = RemoteRegion::from_bytes(&b[37..57]).ok_or("a short region")?;
        let n = u16_at(57) as usize;
        if n == 0 || n > MAX_QPS {
            return Err(format!("the peer says it has {n} queue pairs (1..={MAX_QPS})"));
        }
        let info = Info {
            test: b[8],
            transport: b[9],
            srq: b[10] != 0,
            max_size: u64_at(11),
            lid: u16_at(19),
            gid: Gid(gid),
            region,
            qps: Vec::new(),
        };
        Ok((info, n))
    }

    /// Parses the wire form.
    pub fn from_bytes(b: &[u8]) -> Result<Info, String> {
        let (mut info, n) = Info::parse_head(b)?;
        let rest = &b[HEAD..];
        if rest.len() != 8 * n {
            return Err(format!("{n} queue pairs announced, {} bytes follow", rest.len()));
        }
        info.qps = rest
            .chunks_exact(8)
            .map(|c| {
                let w = |i: usize| u32::from_le_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]]);
                (w(0), w(4))
            })
            .collect();
        Ok(info)
    }
}

fn io(what: &str) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Sends `info`.
pub fn send_info(s: &mut TcpStream, info: &Info) -> Result<(), String> {
    s.write_all(&info.to_bytes()).map_err(io("sending this side's endpoints"))
}

/// Receives the peer's [`Info`].
pub fn recv_info(s: &mut TcpStream) -> Result<Info, String> {
    let mut head = vec![0u8; HEAD];
    s.read_exact(&mut head).map_err(io("receiving the peer's endpoints"))?;
    let (_, n) = Info::parse_head(&head)?;
    head.resize(HEAD + 8 * n, 0);
    s.read_exact(&mut head[HEAD..]).map_err(io("receiving the peer's queue pairs"))?;
    Info::from_bytes(&head)
}

/// The server's answer to a client's [`Info`]: its own, or why it refuses the client.
pub fn send_answer(s: &mut TcpStream, answer: Result<&Info, &str>) -> Result<(), String> {
    let mut v = Vec::new();
    match answer {
        Ok(info) => {
            v.push(0);
            v.extend_from_slice(&info.to_bytes());
        }
        Err(why) => {
            let why = &why.as_bytes()[..why.len().min(1000)];
            v.push(1);
            v.extend_from_slice(&(why.len() as u16).to_le_bytes());
            v.extend_from_slice(why);
        }
    }
    s.write_all(&v).map_err(io("answering the client"))
}

/// Receives the server's answer: its [`Info`], or `Err` with the server's reason.
pub fn recv_answer(s: &mut TcpStream) -> Result<Info, String> {
    let mut tag = [0u8; 1];
    s.read_exact(&mut tag).map_err(io("receiving the server's answer"))?;
    if tag[0] == 0 {
        return recv_info(s);
    }
    let mut len = [0u8; 2];
    s.read_exact(&mut len).map_err(io("receiving the server's refusal"))?;
    let mut why = vec![0u8; u16::from_le_bytes(len) as usize];
    s.read_exact(&mut why).map_err(io("receiving the server's refusal"))?;
    Err(format!("the server refused: {}", String::from_utf8_lossy(&why)))
}

/// A control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ctl {
    /// Client: measure messages of this many bytes next.
    Start(u64),
    /// Server: ready for the size just started.
    Ready,
    /// Client: the size is done; this many messages were sent.
    End(u64),
    /// Server: this many messages arrived during the size.
    Stats(u64),
    /// Client: all sizes done.
    Bye,
}

const CTL_BYTES: usize = 9;

impl Ctl {
    fn to_bytes(self) -> [u8; CTL_BYTES] {
        let (tag, a) = match self {
            Ctl::Start(n) => (1, n),
            Ctl::Ready => (2, 0),
            Ctl::End(n) => (3, n),
            Ctl::Stats(n) => (4, n),
            Ctl::Bye => (5, 0),
        };
        let mut b = [0u8; CTL_BYTES];
        b[0] = tag;
        b[1..].copy_from_slice(&a.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8; CTL_BYTES]) -> Result<Ctl, String> {
        let a = u64::from_le_bytes(b[1..].try_into().unwrap_or([0; 8]));
        Ok(match b[0] {
            1 => Ctl::Start(a),
            2 => Ctl::Ready,
            3 => Ctl::End(a),
            4 => Ctl::Stats(a),
            5 => Ctl::Bye,
            t => return Err(format!("an unknown control message (tag {t})")),
        })
    }
}

/// Sends a control message.
pub fn send_ctl(s: &mut TcpStream, c: Ctl) -> Result<(), String> {
    s.write_all(&c.to_bytes()).map_err(io(&format!("sending {c:?}")))
}

/// TCP keepalive on the control connection: a probe after this long without traffic...
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// ...then one this often...
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// ...and the connection is dead after this many unanswered: its peer's host or the wire
/// between is seen gone within 25 s, however long a test runs without control messages (the
/// peer's kernel answers the probes, busy or not).
const KEEPALIVE_PROBES: u32 = 3;

/// Turns TCP keepalive on for the control connection `s` (see [`KEEPALIVE_PROBES`]).
pub fn keep_alive(s: &TcpStream) -> Result<(), String> {
    let ka = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    socket2::SockRef::from(s)
        .set_tcp_keepalive(&ka)
        .map_err(io("TCP keepalive on the control socket"))
}

/// What a failed read of control connection `s` means.
fn ctl_error(e: &std::io::Error, s: &TcpStream) -> String {
    match e.kind() {
        ErrorKind::UnexpectedEof => "the peer closed the connection".to_string(),
        // (the socket's read timeout ran out: the OS says EAGAIN, which names no cause)
        ErrorKind::WouldBlock => format!(
            "no control message within {:?}: the control connection (TCP, on the same network \
             as the test) carried nothing, so the peer or the wire between is down",
            s.read_timeout().ok().flatten().unwrap_or_default()
        ),
        ErrorKind::TimedOut => format!(
            "the control connection died: the peer's host stopped answering TCP keepalives \
             ({} probes {:?} apart after {:?} idle), so it or the wire between is down",
            KEEPALIVE_PROBES, KEEPALIVE_INTERVAL, KEEPALIVE_IDLE
        ),
        _ => format!("receiving a control message: {e}"),
    }
}

/// Waits for the next control message.
pub fn recv_ctl(s: &mut TcpStream) -> Result<Ctl, String> {
    let mut b = [0u8; CTL_BYTES];
    s.read_exact(&mut b).map_err(|e| ctl_error(&e, s))?;
    Ctl::from_bytes(&b)
}

/// The next control message if a whole one has arrived; never blocks for long.
pub fn poll_ctl(s: &mut TcpStream) -> Result<Option<Ctl>, String> {
    let mut b = [0u8; CTL_BYTES];
    s.set_nonblocking(true).map_err(io("the control socket"))?;
    let peeked = s.peek(&mut b);
    s.set_nonblocking(false).map_err(io("the control socket"))?;
    match peeked {
        Ok(0) => Err("the peer closed the connection".into()),
        Ok(n) if n >= CTL_BYTES => recv_ctl(s).map(Some),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(ctl_error(&e, s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_message_that_never_comes_is_named_as_such() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_quiet, _) = l.accept().unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_millis(20))).unwrap();
        let e = recv_ctl(&mut s).unwrap_err();
        assert!(e.contains("no control message within") && e.contains("down"), "{e}");
        assert!(!e.contains("os error"), "{e}");
        let dead = std::io::Error::from(ErrorKind::TimedOut);
        let e = ctl_error(&dead, &s);
        assert!(e.contains("keepalives") && e.contains("down"), "{e}");
        keep_alive(&s).unwrap();
        assert!(socket2::SockRef::from(&s).keepalive().unwrap(), "keepalive is on");
    }

    #[test]
    fn info_and_ctl_round_trip() {
        let i = Info {
            test: 4,
            transport: 2,
            srq: true,
            max_size: 1024,
            lid: 7,
            gid: Gid([9; 16]),
            region: RemoteRegion { addr: 0x1000, len: 4096, rkey: 42 },
            qps: vec![(17, 0x123456), (18, 5)],
        };
        assert_eq!(Info::from_bytes(&i.to_bytes()), Ok(i.clone()));
        assert!(Info::from_bytes(b"not corelink").is_err());
        let mut short = i.to_bytes();
        short.pop();
        assert!(Info::from_bytes(&short).is_err());
        for c in [Ctl::Start(65536), Ctl::Ready, Ctl::End(9), Ctl::Stats(3), Ctl::Bye] {
            assert_eq!(Ctl::from_bytes(&c.to_bytes()), Ok(c));
        }
        assert!(Ctl::from_bytes(&[9; CTL_BYTES]).is_err());
    }
}
