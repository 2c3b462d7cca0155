//! The frames `soft` processes on one fabric exchange (`verbs/src/soft/wire.rs`), as a link's
//! reader meets them: arbitrary bytes never panic the decoder, a frame longer than the limit or
//! than what is left ends the stream with an error, and every message that decodes encodes back
//! to the same bytes (`decode_frames` asserts it).
#![no_main]

use corelink_verbs::soft::decode_frames;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (n, _error) = decode_frames(data);
    assert!(n <= data.len() / 5, "{n} frames in {} bytes", data.len());
});
