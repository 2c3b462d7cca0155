//! The wire decoder on arbitrary bytes: it never panics, and what it accepts is exactly a
//! header that re-encodes to the message's first bytes and a payload of the header's length.
//! The hello decoder likewise.
#![no_main]

use corelink_rpc::wire::{decode, Hello, HEADER};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((h, payload)) = decode(data) {
        assert_eq!(&h.encode()[..], &data[..HEADER]);
        assert_eq!(payload.len(), h.len as usize);
        assert_eq!(HEADER + payload.len(), data.len());
    }
    if let Ok(hello) = Hello::decode(data) {
        assert_eq!(&hello.encode()[..], data);
    }
});
