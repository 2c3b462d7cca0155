//! The engine's private-data header (`engine/src/control/header.rs`) and its reject reasons on
//! arbitrary bytes. Parsing never panics. A header it accepts has 1 to `MAX_QPS_PER_CONN`
//! lanes and a lane index below the count, no receive size of 0 and at most 255 bytes of
//! application part, and re-encodes to bytes that parse to the same header (and that are the
//! input's own first bytes when the input was exactly the header). A reject's reason comes back
//! as written, cut to what fits (at a character boundary, and at a NUL, which ends it on the
//! wire); a reason read from arbitrary bytes never panics.
#![no_main]

use corelink_engine::fuzz_support::{
    header_bytes, parse_header, reject_data, reject_reason, MAX_REJECT, REJECT_PREFIX,
};
use corelink_engine::tunables::MAX_QPS_PER_CONN;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse_header(data) {
        Ok(Some(h)) => {
            let (_, lane, lanes, recv_size, ref app) = h;
            assert!((1..=MAX_QPS_PER_CONN).contains(&(lanes as usize)), "{lanes} lanes");
            assert!(lane < lanes, "lane {lane} of {lanes}");
            assert_ne!(recv_size, Some(0));
            assert!(app.len() <= u8::MAX as usize);
            let bytes = header_bytes(&h);
            assert_eq!(parse_header(&bytes), Ok(Some(h.clone())), "{bytes:?}");
            if bytes.len() == data.len() && data[11] != 0 && usize::from(data[16]) == app.len() {
                // A whole header (a non-zero lane count, its whole application part) is its
                // own encoding.
                assert_eq!(bytes, data);
            }
        }
        Ok(None) => assert!(!data.starts_with(b"cL")),
        Err(e) => assert!(!e.is_empty()),
    }

    let _ = reject_reason(data);
    if let Ok(why) = std::str::from_utf8(data) {
        let pd = reject_data(why);
        assert!(pd.len() <= MAX_REJECT && pd.starts_with(REJECT_PREFIX));
        let got = reject_reason(&pd).expect("an engine's reject has a reason");
        // The longest prefix of `why` before any NUL, cut at a character boundary to fit.
        let budget = MAX_REJECT - REJECT_PREFIX.len();
        let mut want = 0;
        for (i, c) in why.char_indices() {
            if c == '\0' || i + c.len_utf8() > budget {
                break;
            }
            want = i + c.len_utf8();
        }
        assert_eq!(got, why[..want], "reason {why:?}");
    }
});
