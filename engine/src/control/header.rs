//! The engine's header at the start of connection private data.
//!
//! A connect request carries at most [`MAX_PRIVATE_DATA`] bytes (rdma_cm over the TCP port
//! space: 56). The engine takes [`HEADER`] of them, in this order (little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 2 | the engine's mark, `cL` (a request without it is a foreign peer's) |
//! | 8 | group nonce: the same in every lane of one engine connection, random per connection |
//! | 1 | lane index, `0..lanes` |
//! | 1 | lane count (`worker.qps.per_conn` of the connecting side; 0 reads as 1) |
//! | 4 | the sender's receive size (`worker.recv_size`: the largest send it takes; 0: unknown) |
//! | 1 | length of the application's part |
//!
//! and the application's part follows: at most [`MAX_APP_PRIVATE_DATA`] bytes
//! (`Cx::connect` checks it). Every lane carries the whole header, the application's part
//! included. An accept answers with the same layout (the lane's nonce, index and count echoed,
//! its own receive size, no application part). No memory is exposed here: an application
//! grants its peer memory itself (`Cx::grant`) and says where in a message. rdma_cm may pad private data with zeros, hence the
//! length byte.

use crate::tunables::{MAX_PRIVATE_DATA, MAX_QPS_PER_CONN};

/// What every engine header starts with.
const MARK: [u8; 2] = *b"cL";
const NONCE_AT: usize = MARK.len();
const LANE_AT: usize = NONCE_AT + 8;
const LANES_AT: usize = LANE_AT + 1;
const RECV_SIZE_AT: usize = LANES_AT + 1;
const LEN_AT: usize = RECV_SIZE_AT + 4;

/// Bytes of the engine's own header at the start of private data.
pub const HEADER: usize = LEN_AT + 1;

/// Bytes of private data an application may pass to `Cx::connect` (or an external client's
/// connect): what rdma_cm carries in a connect request less the engine's header.
pub const MAX_APP_PRIVATE_DATA: usize = MAX_PRIVATE_DATA - HEADER;

// `Cx::connect` documents the application's budget as 39 bytes.
const _: () = assert!(MAX_APP_PRIVATE_DATA == 39 && MAX_QPS_PER_CONN <= u8::MAX as usize);

/// The engine's header of one lane, with the application's part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// The engine connection the lane belongs to (chosen by the connecting side).
    pub(crate) nonce: u64,
    /// This lane's index, `0..lanes`.
    pub(crate) lane: u8,
    /// Lanes of the engine connection, `1..=MAX_QPS_PER_CONN`.
    pub(crate) lanes: u8,
    /// The sender's receive buffer size (`None`: a peer that did not say).
    pub(crate) recv_size: Option<u32>,
    /// The application's part.
    pub(crate) app: Vec<u8>,
}

impl Header {
    /// The wire form (the application's part is cut at 255 bytes; callers check its length
    /// against [`MAX_APP_PRIVATE_DATA`] first).
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let app = &self.app[..self.app.len().min(u8::MAX as usize)];
        let mut v = Vec::with_capacity(HEADER + app.len());
        v.extend_from_slice(&MARK);
        v.extend_from_slice(&self.nonce.to_le_bytes());
        v.push(self.lane);
        v.push(self.lanes);
        v.extend_from_slice(&self.recv_size.unwrap_or(0).to_le_bytes());
        v.push(app.len() as u8);
        v.extend_from_slice(app);
        v
    }

    /// Parses private data made by [`Header::to_bytes`], tolerating zero padding; `None` when
    /// it does not start with the engine's mark (a foreign peer: no data, zeros, or anything
    /// else). Fails on a lane count above [`MAX_QPS_PER_CONN`] or a lane index not below the
    /// count.
    pub(crate) fn parse(pd: &[u8]) -> Result<Option<Header>, String> {
        if !pd.starts_with(&MARK) {
            return Ok(None);
        }
        let nonce = pd
            .get(NONCE_AT..LANE_AT)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .unwrap_or(0);
        let lane = pd.get(LANE_AT).copied().unwrap_or(0);
        let lanes = pd.get(LANES_AT).copied().unwrap_or(0).max(1);
        if lanes as usize > MAX_QPS_PER_CONN || lane >= lanes {
            return Err(format!(
                "lane {lane} of {lanes}: a connection has 1 to {MAX_QPS_PER_CONN} lanes"
            ));
        }
        let recv_size = pd
            .get(RECV_SIZE_AT..LEN_AT)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .filter(|&n| n > 0);
        let len = pd.get(LEN_AT).copied().unwrap_or(0) as usize;
        let app = pd.get(HEADER..HEADER + len).unwrap_or_default().to_vec();
        Ok(Some(Header { nonce, lane, lanes, recv_size, app }))
    }
}

/// What an engine's reject starts with, before its reason in text.
pub(crate) const REJECT_PREFIX: &[u8] = b"corelink: ";
/// Private data bytes a reject carries (rdma_cm over the TCP port space).
pub(crate) const MAX_REJECT: usize = 148;

/// The private data of a reject saying why, cut to what a reject carries at a character
/// boundary (a cut through a character would reach the peer as U+FFFD) and at a NUL (which
/// ends the reason on the wire, as rdma_cm's zero padding does).
pub(crate) fn reject_data(why: &str) -> Vec<u8> {
    let why = why.split('\0').next().unwrap_or_default();
    let mut end = why.len().min(MAX_REJECT - REJECT_PREFIX.len());
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    let mut v = REJECT_PREFIX.to_vec();
    v.extend_from_slice(&why.as_bytes()[..end]);
    v
}

/// The reason in a reject made by [`reject_data`] (`None` for any other private data).
pub(crate) fn reject_reason(pd: &[u8]) -> Option<String> {
    let text = pd.strip_prefix(REJECT_PREFIX)?;
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    Some(String::from_utf8_lossy(&text[..end]).into_owned())
}

/// A fresh group nonce: random per process (std's hasher keys) and distinct per call.
pub(crate) fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            nonce: 0x0123_4567_89ab_cdef,
            lane: 2,
            lanes: 4,
            recv_size: Some(4096),
            app: b"app".to_vec(),
        }
    }

    #[test]
    fn round_trips_and_tolerates_padding() {
        let h = sample();
        let mut b = h.to_bytes();
        assert_eq!(b.len(), HEADER + 3);
        b.resize(MAX_PRIVATE_DATA, 0);
        assert_eq!(Header::parse(&b), Ok(Some(h)));
        let none = Header { app: vec![], lane: 0, lanes: 1, recv_size: None, ..sample() };
        assert_eq!(Header::parse(&none.to_bytes()), Ok(Some(none)));
    }

    #[test]
    fn the_largest_application_part_fits() {
        let h = Header { app: vec![0xa5; MAX_APP_PRIVATE_DATA], ..sample() };
        let b = h.to_bytes();
        assert_eq!(b.len(), MAX_PRIVATE_DATA);
        assert_eq!(Header::parse(&b), Ok(Some(h)));
    }

    #[test]
    fn private_data_without_the_mark_is_a_foreign_peers() {
        for foreign in [&b""[..], &[0; 56], b"GET / HTTP/1.1\r\n", b"c", &sample().to_bytes()[1..]]
        {
            assert_eq!(Header::parse(foreign), Ok(None), "{foreign:?}");
        }
    }

    #[test]
    fn short_headers_read_as_one_lane() {
        // The mark, a part of a nonce and nothing else.
        let short = Header::parse(&sample().to_bytes()[..NONCE_AT + 3]).unwrap().unwrap();
        assert_eq!((short.nonce, short.lanes, short.app, short.recv_size), (0, 1, vec![], None));
        // A length byte beyond the data: no application part, no panic.
        let mut b = sample().to_bytes();
        b[LEN_AT] = 200;
        assert_eq!(Header::parse(&b).unwrap().unwrap().app, Vec::<u8>::new());
    }

    #[test]
    fn bad_lane_numbers_are_refused() {
        let mut b = sample().to_bytes();
        b[LANE_AT] = 4; // index == count
        assert!(Header::parse(&b).is_err());
        b[LANE_AT] = 0;
        b[LANES_AT] = MAX_QPS_PER_CONN as u8 + 1;
        assert!(Header::parse(&b).unwrap_err().contains(&format!("1 to {MAX_QPS_PER_CONN} lanes")));
    }

    #[test]
    fn reject_reasons_round_trip_padded_and_cut() {
        let mut b = reject_data("worker.qps.max reached");
        b.resize(MAX_REJECT, 0);
        assert_eq!(reject_reason(&b).as_deref(), Some("worker.qps.max reached"));
        assert_eq!(reject_reason(b"someone else's data"), None);
        assert_eq!(reject_data(&"x".repeat(500)).len(), MAX_REJECT);
    }

    /// Found by the `header` fuzz target: a reason cut through a multi-byte character came
    /// back ending in U+FFFD, and one with a NUL came back cut there but sent whole.
    #[test]
    fn reject_reasons_are_cut_at_a_character_boundary_and_a_nul() {
        let fits = MAX_REJECT - REJECT_PREFIX.len();
        let why = format!("{}\u{f36b}", "x".repeat(fits - 1));
        let b = reject_data(&why);
        assert_eq!(b.len(), MAX_REJECT - 1);
        assert_eq!(reject_reason(&b).as_deref(), Some(&why[..fits - 1]));
        let b = reject_data("refused\0hidden");
        assert_eq!(b, b"corelink: refused");
        assert_eq!(reject_reason(&b).as_deref(), Some("refused"));
    }

    #[test]
    fn nonces_differ() {
        let a: std::collections::HashSet<u64> = (0..1000).map(|_| nonce()).collect();
        assert_eq!(a.len(), 1000);
    }
}
