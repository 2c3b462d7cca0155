//! The wire decoder on arbitrary bytes: it never panics, and what it accepts is exactly a
//! header that re-encodes to the message's first bytes and a payload of the header's length.
//! A receive's messages (`unpack`, packed ones included) likewise, each in turn, and they
//! cover the receive when none is refused. The hello decoder likewise.
#![no_main]

use corelink_rpc::wire::{decode, unpack, Hello, HEADER, PACKED};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((h, payload)) = decode(data) {
        assert_eq!(&h.encode()[..], &data[..HEADER]);
        assert_eq!(payload.len(), h.len as usize);
        assert_eq!(HEADER + payload.len(), data.len());
    }
    let mut at = 0;
    let mut refused = false;
    for m in unpack(data) {
        let Ok((h, payload)) = m else {
            refused = true;
            break;
        };
        // Its header re-encodes to its bytes, less the packed flag (which `encode` never sets).
        let mut head = [0u8; HEADER];
        head.copy_from_slice(&data[at..at + HEADER]);
        let flags = u16::from_le_bytes([head[26], head[27]]) & !PACKED;
        head[26..28].copy_from_slice(&flags.to_le_bytes());
        assert_eq!(h.encode(), head);
        assert_eq!(payload, &data[at + HEADER..at + HEADER + h.len as usize]);
        at += HEADER + payload.len();
    }
    assert!(refused || at == data.len());
    if let Ok(hello) = Hello::decode(data) {
        assert_eq!(&hello.encode()[..], data);
    }
});
