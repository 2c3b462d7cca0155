//! The wire format: one fixed little-endian header before every payload (its table is in the
//! crate's docs), the error messages' argument, and the hello a session's connect carries.

use crate::error::Malformed;
use crate::ids::{ReqType, SessionId};

/// Bytes of the header.
pub const HEADER: usize = 28;
/// The format's magic number (bytes `R`, `C` on the wire).
pub const MAGIC: u16 = u16::from_le_bytes(*b"RC");
/// The format's version.
pub const VERSION: u8 = 1;
/// Payload bytes of an error message (its two arguments).
pub const ERROR_PAYLOAD: usize = 8;
/// Bytes of the hello a session's connect carries in its private data.
pub const HELLO: usize = 6;
/// Bytes of the hello of a resumable session (the hello and its key).
pub const HELLO_RESUME: usize = HELLO + 8;
/// Hello flag: the session is resumable; its key follows.
pub const RESUME: u8 = 1;
/// Flag: the payload is a [`Descriptor`] of the message's payload, for the receiver to read.
pub const LARGE: u16 = 1;
/// Flag (requests only): the request was sent before, on an earlier connection of its
/// resumable session; a server with no record of its slot answers [`Status::Lost`].
pub const RESENT: u16 = 2;
/// Flag: another message follows this one in the same receive (a packed send: see
/// [`unpack`]); set by the sender's packer, never by [`Header::encode`].
pub const PACKED: u16 = 4;
/// Bytes of a [`Descriptor`].
pub const DESCRIPTOR: usize = 16;

/// What a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A call's request (client to server).
    Request = 1,
    /// Its response (server to client).
    Response = 2,
    /// Its error (server to client): the status says which.
    Error = 3,
}

/// Why a server answered with an error (the header's `status`; 0 in requests and responses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Not an error (requests and responses).
    Ok = 0,
    /// No handler for the request type (arguments: the type, 0).
    NoSuchType = 1,
    /// The response would not fit in the client's receive (arguments: its length, the most).
    TooLarge = 2,
    /// The handler rejected the request (arguments: its code, 0).
    Rejected = 3,
    /// The server had no buffer: for the request, which did not run (arguments: 0, 0), or for
    /// the response of a request that ran (arguments: [`RAN`], 0).
    Busy = 4,
    /// A request sent again after a reconnect reached a server with no record of its slot
    /// (it restarted, or kept the session less than its resume time): it may have run
    /// (arguments: 0, 0).
    Lost = 5,
}

/// The first argument of a [`Status::Busy`] error whose request ran (its response found no
/// buffer).
pub const RAN: u32 = 1;

impl Status {
    fn from_wire(v: u16) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::NoSuchType,
            2 => Status::TooLarge,
            3 => Status::Rejected,
            4 => Status::Busy,
            5 => Status::Lost,
            _ => return None,
        })
    }
}

/// A message's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the message is.
    pub kind: Kind,
    /// The request type.
    pub ty: ReqType,
    /// The session's slot the call occupies.
    pub slot: u16,
    /// The client's session id (a response echoes its request's).
    pub session: SessionId,
    /// The slot's sequence number (from 1; a response echoes its request's).
    pub seq: u64,
    /// Payload bytes after the header.
    pub len: u32,
    /// An error message's reason; [`Status::Ok`] otherwise.
    pub status: Status,
    /// The payload is a [`Descriptor`] (flag [`LARGE`]): the message's payload is in the
    /// sender's memory, for the receiver to read.
    pub large: bool,
    /// A request sent again after a reconnect (flag [`RESENT`]).
    pub resent: bool,
}

impl Header {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = VERSION;
        b[3] = self.kind as u8;
        b[4..6].copy_from_slice(&self.ty.0.to_le_bytes());
        b[6..8].copy_from_slice(&self.slot.to_le_bytes());
        b[8..12].copy_from_slice(&self.session.to_wire().to_le_bytes());
        b[12..20].copy_from_slice(&self.seq.to_le_bytes());
        b[20..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..26].copy_from_slice(&(self.status as u16).to_le_bytes());
        let flags = if self.large { LARGE } else { 0 } | if self.resent { RESENT } else { 0 };
        b[26..28].copy_from_slice(&flags.to_le_bytes());
        b
    }

    /// Writes the header at the start of `msg`; false (nothing written) when `msg` is shorter.
    pub(crate) fn write_to(&self, msg: &mut [u8]) -> bool {
        match msg.get_mut(..HEADER) {
            Some(h) => {
                h.copy_from_slice(&self.encode());
                true
            }
            None => false,
        }
    }
}

#[inline(always)]
fn u16_at(b: &[u8; HEADER], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// Splits a message into its header and payload, checking every field: any message that is
/// not exactly what [`Header::encode`] and a payload of the header's length make is refused
/// with what is wrong (never a panic).
///
/// # Examples
///
/// ```
/// use corelink_rpc::wire::{decode, Header, Kind, Status, HEADER};
/// use corelink_rpc::{Malformed, ReqType, SessionId};
///
/// let h = Header {
///     kind: Kind::Request,
///     ty: ReqType(7),
///     slot: 3,
///     session: SessionId::from_wire(1),
///     seq: 1,
///     len: 2,
///     status: Status::Ok,
///     large: false,
///     resent: false,
/// };
/// let mut msg = h.encode().to_vec();
/// msg.extend_from_slice(b"hi");
/// assert_eq!(decode(&msg), Ok((h, &b"hi"[..])));
/// assert_eq!(decode(&msg[..HEADER]), Err(Malformed::Length { said: 2, got: 0 }));
/// ```
pub fn decode(msg: &[u8]) -> Result<(Header, &[u8]), Malformed> {
    let (h, payload, rest, packed) = decode_first(msg)?;
    if !rest.is_empty() {
        return Err(Malformed::Length { said: h.len, got: msg.len() - HEADER });
    }
    if packed {
        return Err(Malformed::Flags(u16_at(head_of(msg), 26)));
    }
    Ok((h, payload))
}

/// A message's first [`HEADER`] bytes (`msg` is at least that long).
fn head_of(msg: &[u8]) -> &[u8; HEADER] {
    msg.first_chunk::<HEADER>().expect("a decoded message holds a header")
}

/// A receive's first message: its header, its payload, the bytes after it, and whether it is
/// flagged [`PACKED`].
pub(crate) type First<'a> = (Header, &'a [u8], &'a [u8], bool);

/// The message at the start of `recv` as [`decode`] checks it, the bytes after it, and whether
/// it is flagged [`PACKED`].
#[inline(always)]
fn decode_first(recv: &[u8]) -> Result<First<'_>, Malformed> {
    let Some((head, after)) = recv.split_first_chunk::<HEADER>() else {
        return Err(Malformed::Truncated { len: recv.len() });
    };
    // Most messages: a small request or response, flagged at most packed. Its first word
    // (magic, version, kind) and its status-and-flags word are checked whole; anything else
    // takes the field-by-field checks, which accept these the same.
    let kind = match u32_at(head, 0) {
        REQUEST_WORD => Kind::Request,
        RESPONSE_WORD => Kind::Response,
        _ => return decode_checked(head, after),
    };
    let status_flags = u32_at(head, 24);
    let len = u32_at(head, 20);
    let seq = seq_of(head);
    if status_flags & !(u32::from(PACKED) << 16) != 0 || len as usize > after.len() || seq == 0 {
        return decode_checked(head, after);
    }
    let (payload, rest) = after.split_at(len as usize);
    let header = Header { status: Status::Ok, large: false, resent: false, ..ids_of(head, kind) };
    Ok((header, payload, rest, status_flags != 0))
}

/// A header's sequence number (bytes 12..20).
#[inline(always)]
fn seq_of(head: &[u8; HEADER]) -> u64 {
    u64::from(u32_at(head, 12)) | u64::from(u32_at(head, 16)) << 32
}

/// The header `head` holds for a message of kind `kind`: its numbers (type, slot, session,
/// sequence number, length) as they read, with status `Ok` and no flags (the caller puts in
/// those it checked).
#[inline(always)]
fn ids_of(head: &[u8; HEADER], kind: Kind) -> Header {
    Header {
        kind,
        ty: ReqType(u16_at(head, 4)),
        slot: u16_at(head, 6),
        session: SessionId::from_wire(u32_at(head, 8)),
        seq: seq_of(head),
        len: u32_at(head, 20),
        status: Status::Ok,
        large: false,
        resent: false,
    }
}

/// The first word of a request's header, and of a response's (magic, version, kind).
const REQUEST_WORD: u32 = word0(Kind::Request);
const RESPONSE_WORD: u32 = word0(Kind::Response);

const fn word0(kind: Kind) -> u32 {
    MAGIC as u32 | (VERSION as u32) << 16 | (kind as u32) << 24
}

/// [`decode_first`] of a header (`head`, then the receive's bytes `after` it), every field
/// checked on its own.
#[inline(never)]
fn decode_checked<'a>(head: &[u8; HEADER], after: &'a [u8]) -> Result<First<'a>, Malformed> {
    let magic = u16_at(head, 0);
    if magic != MAGIC {
        return Err(Malformed::Magic(magic));
    }
    if head[2] != VERSION {
        return Err(Malformed::Version(head[2]));
    }
    let kind = match head[3] {
        1 => Kind::Request,
        2 => Kind::Response,
        3 => Kind::Error,
        k => return Err(Malformed::Kind(k)),
    };
    let flags = u16_at(head, 26);
    if flags & !(LARGE | RESENT | PACKED) != 0 || (flags & RESENT != 0 && kind != Kind::Request) {
        return Err(Malformed::Flags(flags));
    }
    let large = flags & LARGE != 0;
    let resent = flags & RESENT != 0;
    let len = u32_at(head, 20);
    if len as usize > after.len() {
        return Err(Malformed::Length { said: len, got: after.len() });
    }
    let (payload, rest) = after.split_at(len as usize);
    let raw_status = u16_at(head, 24);
    let status = Status::from_wire(raw_status).ok_or(Malformed::Status(raw_status))?;
    let fits = match kind {
        Kind::Request | Kind::Response => status == Status::Ok,
        Kind::Error => status != Status::Ok,
    };
    if !fits {
        return Err(Malformed::Status(raw_status));
    }
    if kind == Kind::Error && large {
        return Err(Malformed::Flags(flags));
    }
    let want = match (kind, large) {
        (Kind::Error, _) => Some(ERROR_PAYLOAD),
        (_, true) => Some(DESCRIPTOR),
        _ => None,
    };
    if want.is_some_and(|n| n != payload.len()) {
        return Err(Malformed::Length { said: len, got: payload.len() });
    }
    if seq_of(head) == 0 {
        return Err(Malformed::Sequence);
    }
    let header = Header { status, large, resent, ..ids_of(head, kind) };
    Ok((header, payload, rest, flags & PACKED != 0))
}

/// The messages of one receive, in order: one, or several packed back to back (each but the
/// last flagged [`PACKED`]). Each is checked as [`decode`] checks a message; the first
/// malformed one ends the iteration with its error (what follows it cannot be framed).
///
/// # Examples
///
/// ```
/// use corelink_rpc::wire::{unpack, Header, Kind, Status, PACKED};
/// use corelink_rpc::{ReqType, SessionId};
///
/// let h = |slot, len| Header {
///     kind: Kind::Request,
///     ty: ReqType(7),
///     slot,
///     session: SessionId::from_wire(1),
///     seq: 1,
///     len,
///     status: Status::Ok,
///     large: false,
///     resent: false,
/// };
/// let mut first = h(0, 2).encode();
/// first[26..28].copy_from_slice(&PACKED.to_le_bytes());
/// let mut recv = first.to_vec();
/// recv.extend_from_slice(b"hi");
/// recv.extend_from_slice(&h(1, 0).encode());
/// let got: Vec<_> = unpack(&recv).collect();
/// assert_eq!(got, vec![Ok((h(0, 2), &b"hi"[..])), Ok((h(1, 0), &b""[..]))]);
/// // A receive that ends where its last message says another follows is malformed.
/// assert!(unpack(&recv[..30]).last().unwrap().is_err());
/// ```
pub fn unpack(recv: &[u8]) -> Unpack<'_> {
    Unpack { rest: recv, done: false }
}

/// The iterator [`unpack`] returns.
#[derive(Clone, Debug)]
pub struct Unpack<'a> {
    rest: &'a [u8],
    done: bool,
}

impl<'a> Iterator for Unpack<'a> {
    type Item = Result<(Header, &'a [u8]), Malformed>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let got = split_first(self.rest);
        match got {
            Ok((h, payload, rest)) => {
                (self.rest, self.done) = (rest, rest.is_empty());
                Some(Ok((h, payload)))
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// The first message of a receive, checked as [`unpack`] checks each, and the bytes after
/// it: the next messages when it is flagged [`PACKED`], none when it is not (a checked
/// message is flagged exactly when bytes follow it).
#[inline(always)]
pub(crate) fn split_first(recv: &[u8]) -> Result<(Header, &[u8], &[u8]), Malformed> {
    let (h, payload, rest, packed) = decode_first(recv)?;
    match (packed, rest.is_empty()) {
        (true, false) | (false, true) => Ok((h, payload, rest)),
        (true, true) => Err(Malformed::PackedEnd),
        (false, false) => Err(Malformed::Trailing { len: rest.len() }),
    }
}

/// Where a large message's payload is: `len` bytes at `addr` of the sender's memory, under
/// `rkey` (granted to the receiver for reads). Little-endian: address, key, length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// Address of the payload's first byte, in the sender's address space.
    pub addr: u64,
    /// The remote key of the sender's grant.
    pub rkey: u32,
    /// Payload bytes.
    pub len: u32,
}

impl Descriptor {
    /// Its bytes.
    pub fn encode(&self) -> [u8; DESCRIPTOR] {
        let mut b = [0u8; DESCRIPTOR];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// The descriptor in `b` (a large message's payload, checked by [`decode`]).
    pub fn decode(b: &[u8]) -> Result<Descriptor, Malformed> {
        let Some(b) = b.first_chunk::<DESCRIPTOR>().filter(|_| b.len() == DESCRIPTOR) else {
            return Err(Malformed::Length { said: DESCRIPTOR as u32, got: b.len() });
        };
        let addr = u64::from(u32_at(b, 0)) | u64::from(u32_at(b, 4)) << 32;
        Ok(Descriptor { addr, rkey: u32_at(b, 8), len: u32_at(b, 12) })
    }
}

/// Flags the message `msg` (its header at the start) [`PACKED`]: another follows it in its
/// send.
pub(crate) fn mark_packed(msg: &mut [u8]) {
    if let Some(f) = msg.get_mut(26..28) {
        let flags = u16::from_le_bytes([f[0], f[1]]) | PACKED;
        f.copy_from_slice(&flags.to_le_bytes());
    }
}

/// An error message's two arguments (see [`Status`]).
pub fn error_args(payload: &[u8]) -> (u32, u32) {
    match payload.get(..ERROR_PAYLOAD) {
        Some(p) => (u32_at(p, 0), u32_at(p, 4)),
        None => (0, 0),
    }
}

/// The hello a session's connect carries (in the connection's private data): the magic, the
/// version, the credits (slots) the client will use (a server with fewer receives per
/// connection refuses the session), a flags byte, and a resumable session's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The client's slots.
    pub credits: u16,
    /// A resumable session's key (flag [`RESUME`]): the same on each of its connections, so
    /// that the server carries the session's record (its slots' last sequence numbers and
    /// responses) over to the new connection.
    pub resume: Option<u64>,
}

impl Hello {
    /// Its bytes: [`HELLO`] of them, or [`HELLO_RESUME`] with a key.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_RESUME);
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.push(VERSION);
        b.extend_from_slice(&self.credits.to_le_bytes());
        match self.resume {
            Some(key) => {
                b.push(RESUME);
                b.extend_from_slice(&key.to_le_bytes());
            }
            None => b.push(0),
        }
        b
    }

    /// The hello in `data`, or what is wrong with it.
    pub fn decode(data: &[u8]) -> Result<Hello, Malformed> {
        let Some(b) = data.first_chunk::<HELLO>() else {
            return Err(Malformed::Truncated { len: data.len() });
        };
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(Malformed::Magic(magic));
        }
        if b[2] != VERSION {
            return Err(Malformed::Version(b[2]));
        }
        let credits = u16::from_le_bytes([b[3], b[4]]);
        let resume = match (b[5], &data[HELLO..]) {
            (0, []) => None,
            (RESUME, key) => {
                let key: [u8; 8] =
                    key.try_into().map_err(|_| Malformed::Length { said: 8, got: key.len() })?;
                Some(u64::from_le_bytes(key))
            }
            (0, rest) => return Err(Malformed::Length { said: 0, got: rest.len() }),
            (flags, _) => return Err(Malformed::Reserved(u16::from(flags))),
        };
        Ok(Hello { credits, resume })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_headers_shortcut_decodes_as_the_field_by_field_checks() {
        // Every kind byte, status, flag set, a zero and a non-zero sequence number, and
        // lengths that fit, fall short and leave bytes after: the same answer either way.
        let mut n = 0;
        for kind in 0..5u8 {
            for status in 0..7u16 {
                for flags in 0..9u16 {
                    for seq in [0u64, 1, u64::MAX] {
                        for (len, extra) in [(0u32, 0usize), (8, 8), (16, 16), (8, 4), (8, 40)] {
                            let mut m = sample(Kind::Request, Status::Ok, len).encode();
                            m[3] = kind;
                            m[12..20].copy_from_slice(&seq.to_le_bytes());
                            m[24..26].copy_from_slice(&status.to_le_bytes());
                            m[26..28].copy_from_slice(&flags.to_le_bytes());
                            let mut msg = m.to_vec();
                            msg.resize(HEADER + extra, 0x5a);
                            let (head, after) = msg.split_first_chunk::<HEADER>().unwrap();
                            assert_eq!(decode_first(&msg), decode_checked(head, after));
                            n += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(n, 5 * 7 * 9 * 3 * 5);
    }

    fn sample(kind: Kind, status: Status, len: u32) -> Header {
        Header {
            kind,
            ty: ReqType(0x1234),
            slot: 31,
            session: SessionId::from_wire(0x0007_0002),
            seq: 0x0102_0304_0506_0708,
            len,
            status,
            large: false,
            resent: false,
        }
    }

    fn message(h: &Header) -> Vec<u8> {
        let mut m = h.encode().to_vec();
        m.extend((0..h.len).map(|i| i as u8));
        m
    }

    #[test]
    fn every_kind_round_trips_with_its_payload() {
        for h in [
            sample(Kind::Request, Status::Ok, 5),
            sample(Kind::Response, Status::Ok, 0),
            sample(Kind::Error, Status::NoSuchType, 8),
            sample(Kind::Error, Status::TooLarge, 8),
            sample(Kind::Error, Status::Rejected, 8),
            sample(Kind::Error, Status::Busy, 8),
            sample(Kind::Error, Status::Lost, 8),
            Header { resent: true, ..sample(Kind::Request, Status::Ok, 3) },
        ] {
            let m = message(&h);
            let (got, payload) = decode(&m).unwrap();
            assert_eq!(got, h);
            assert_eq!(payload, &m[HEADER..]);
        }
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let b = sample(Kind::Request, Status::Ok, 5).encode();
        assert_eq!(&b[0..2], b"RC");
        assert_eq!((b[2], b[3]), (VERSION, 1));
        assert_eq!(&b[4..6], &[0x34, 0x12]);
        assert_eq!(&b[6..8], &[31, 0]);
        assert_eq!(&b[8..12], &[2, 0, 7, 0]);
        assert_eq!(&b[12..20], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[20..24], &[5, 0, 0, 0]);
        assert_eq!(&b[24..28], &[0, 0, 0, 0]);
    }

    #[test]
    fn every_truncation_of_a_valid_message_is_refused() {
        for h in [sample(Kind::Request, Status::Ok, 5), sample(Kind::Error, Status::Busy, 8)] {
            let m = message(&h);
            for cut in 0..m.len() {
                let err = decode(&m[..cut]).unwrap_err();
                if cut < HEADER {
                    assert_eq!(err, Malformed::Truncated { len: cut });
                } else {
                    assert_eq!(err, Malformed::Length { said: h.len, got: cut - HEADER });
                }
            }
            // And one byte too many.
            let mut long = m.clone();
            long.push(0);
            assert!(matches!(decode(&long), Err(Malformed::Length { .. })));
        }
    }

    #[test]
    fn corrupted_fields_are_refused_with_what_is_wrong() {
        let good = message(&sample(Kind::Request, Status::Ok, 4));
        let with = |at: usize, bytes: &[u8]| {
            let mut m = good.clone();
            m[at..at + bytes.len()].copy_from_slice(bytes);
            decode(&m).map(|(h, _)| h)
        };
        assert_eq!(with(0, b"XC"), Err(Malformed::Magic(u16::from_le_bytes(*b"XC"))));
        assert_eq!(with(2, &[2]), Err(Malformed::Version(2)));
        assert_eq!(with(2, &[0]), Err(Malformed::Version(0)));
        for k in [0u8, 4, 255] {
            assert_eq!(with(3, &[k]), Err(Malformed::Kind(k)));
        }
        assert_eq!(with(26, &[4, 0]), Err(Malformed::Flags(4)));
        // Only a request is ever sent again.
        let resent_response = Header { resent: true, ..sample(Kind::Response, Status::Ok, 4) };
        assert_eq!(decode(&message(&resent_response)), Err(Malformed::Flags(RESENT)));
        assert_eq!(with(27, &[0x80]), Err(Malformed::Flags(0x8000)));
        // Large: the payload must be a descriptor, and an error is never large.
        assert_eq!(with(26, &[1, 0]), Err(Malformed::Length { said: 4, got: 4 }));
        let large_error = Header { large: true, ..sample(Kind::Error, Status::Busy, 8) };
        assert_eq!(decode(&message(&large_error)), Err(Malformed::Flags(1)));
        assert_eq!(with(20, &[9, 0, 0, 0]), Err(Malformed::Length { said: 9, got: 4 }));
        assert_eq!(
            with(20, &[0xff, 0xff, 0xff, 0xff]),
            Err(Malformed::Length { said: u32::MAX, got: 4 })
        );
        // A request with an error's status, an unknown status, an error without one.
        assert_eq!(with(24, &[1, 0]), Err(Malformed::Status(1)));
        assert_eq!(with(24, &[5, 0]), Err(Malformed::Status(5)));
        assert_eq!(with(24, &[6, 0]), Err(Malformed::Status(6)));
        assert_eq!(with(3, &[3]), Err(Malformed::Status(0)));
        assert_eq!(with(12, &[0; 8]), Err(Malformed::Sequence));
        // An error message whose payload is not its two arguments.
        let short_error = message(&sample(Kind::Error, Status::Rejected, 4));
        assert_eq!(decode(&short_error), Err(Malformed::Length { said: 4, got: 4 }));
    }

    #[test]
    fn every_single_byte_corruption_decodes_or_is_refused() {
        // No panic, and a header that decodes re-encodes to exactly its bytes.
        let good = message(&sample(Kind::Error, Status::TooLarge, 8));
        for at in 0..HEADER {
            for v in 0..=255u8 {
                let mut m = good.clone();
                m[at] = v;
                if let Ok((h, p)) = decode(&m) {
                    assert_eq!(&h.encode()[..], &m[..HEADER]);
                    assert_eq!(p.len(), h.len as usize);
                }
            }
        }
    }

    #[test]
    fn large_messages_carry_a_descriptor() {
        let d = Descriptor { addr: 0x1122_3344_5566_7788, rkey: 0xaabb_ccdd, len: 8 << 20 };
        for kind in [Kind::Request, Kind::Response] {
            let h = Header { large: true, ..sample(kind, Status::Ok, DESCRIPTOR as u32) };
            let mut m = h.encode().to_vec();
            m.extend_from_slice(&d.encode());
            let (got, payload) = decode(&m).unwrap();
            assert_eq!(got, h);
            assert_eq!(Descriptor::decode(payload), Ok(d));
            for cut in HEADER..m.len() {
                assert!(decode(&m[..cut]).is_err());
            }
        }
        assert!(Descriptor::decode(&[0; 15]).is_err());
        assert!(Descriptor::decode(&[0; 17]).is_err());
    }

    #[test]
    fn hellos_round_trip_and_others_are_refused() {
        let plain = Hello { credits: 32, resume: None };
        assert_eq!(plain.encode().len(), HELLO);
        assert_eq!(Hello::decode(&plain.encode()), Ok(plain));
        let resumable = Hello { credits: 8, resume: Some(0x0102_0304_0506_0708) };
        assert_eq!(resumable.encode().len(), HELLO_RESUME);
        assert_eq!(Hello::decode(&resumable.encode()), Ok(resumable));
        assert_eq!(Hello::decode(b""), Err(Malformed::Truncated { len: 0 }));
        assert_eq!(Hello::decode(b"hello!"), Err(Malformed::Magic(u16::from_le_bytes(*b"he"))));
        let mut long = plain.encode();
        long.push(0);
        assert_eq!(Hello::decode(&long), Err(Malformed::Length { said: 0, got: 1 }));
        // A resumable hello without its whole key, or with more.
        let key = resumable.encode();
        for cut in HELLO..key.len() {
            assert!(Hello::decode(&key[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = key.clone();
        longer.push(0);
        assert!(Hello::decode(&longer).is_err());
        let mut flags = plain.encode();
        flags[5] = 2;
        assert_eq!(Hello::decode(&flags), Err(Malformed::Reserved(2)));
        let mut v2 = plain.encode();
        v2[2] = 2;
        assert_eq!(Hello::decode(&v2), Err(Malformed::Version(2)));
    }

    /// `msgs` packed as a sender's packer packs them.
    fn packed(msgs: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, m) in msgs.iter().enumerate() {
            let at = out.len();
            out.extend_from_slice(m);
            if i + 1 < msgs.len() {
                mark_packed(&mut out[at..]);
            }
        }
        out
    }

    #[test]
    fn packed_messages_unpack_in_order() {
        let hs = [
            sample(Kind::Response, Status::Ok, 3),
            sample(Kind::Error, Status::Busy, 8),
            Header { large: true, ..sample(Kind::Response, Status::Ok, DESCRIPTOR as u32) },
            sample(Kind::Response, Status::Ok, 0),
        ];
        let msgs: Vec<Vec<u8>> = hs.iter().map(message).collect();
        let recv = packed(&msgs);
        let got: Vec<_> = unpack(&recv).map(Result::unwrap).collect();
        assert_eq!(got.len(), hs.len());
        for ((h, p), (want, m)) in got.iter().zip(hs.iter().zip(&msgs)) {
            assert_eq!(h, want);
            assert_eq!(*p, &m[HEADER..]);
        }
        // One message alone unpacks as `decode` reads it; a packed one is not a message alone.
        assert_eq!(unpack(&msgs[0]).collect::<Vec<_>>(), vec![decode(&msgs[0])]);
        assert_eq!(decode(&recv[..msgs[0].len()]), Err(Malformed::Flags(PACKED)));
    }

    #[test]
    fn every_truncation_of_a_packed_receive_ends_in_an_error() {
        let msgs = vec![
            message(&sample(Kind::Request, Status::Ok, 5)),
            message(&sample(Kind::Request, Status::Ok, 0)),
            message(&sample(Kind::Request, Status::Ok, 2)),
        ];
        let recv = packed(&msgs);
        for cut in 0..recv.len() {
            let got: Vec<_> = unpack(&recv[..cut]).collect();
            let last = got.last().expect("an empty receive is an error too");
            assert!(last.is_err(), "cut at {cut}: {got:?}");
            assert!(got[..got.len() - 1].iter().all(Result::is_ok));
        }
        // Bytes after the last message, flagged or not.
        let mut long = recv.clone();
        long.push(0);
        assert_eq!(unpack(&long).last(), Some(Err(Malformed::Trailing { len: 1 })));
        let mut unflagged = packed(&msgs[..1]);
        unflagged.extend_from_slice(&msgs[1]);
        let got: Vec<_> = unpack(&unflagged).collect();
        assert_eq!(got.last(), Some(&Err(Malformed::Trailing { len: msgs[1].len() })));
        let mut flagged_last = recv.clone();
        let at = msgs[0].len() + msgs[1].len();
        mark_packed(&mut flagged_last[at..]);
        assert_eq!(unpack(&flagged_last).last(), Some(Err(Malformed::PackedEnd)));
    }

    #[test]
    fn every_single_byte_corruption_of_a_packed_receive_unpacks_or_is_refused() {
        let msgs = vec![
            message(&sample(Kind::Response, Status::Ok, 4)),
            message(&sample(Kind::Error, Status::Rejected, 8)),
        ];
        let recv = packed(&msgs);
        for at in 0..recv.len() {
            for v in [0u8, 1, 4, 0x7f, 0xff] {
                let mut m = recv.clone();
                m[at] = v;
                let mut used = 0;
                for got in unpack(&m) {
                    let Ok((h, p)) = got else { break };
                    assert_eq!(h.encode()[..26], m[used..used + 26]);
                    used += HEADER + p.len();
                }
                assert!(used <= m.len());
            }
        }
    }

    #[test]
    fn error_arguments_read_back() {
        let mut p = [0u8; 8];
        p[..4].copy_from_slice(&7u32.to_le_bytes());
        p[4..].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(error_args(&p), (7, 9));
        assert_eq!(error_args(&p[..3]), (0, 0));
    }
}
