//! The typed layer on `soft` (the end-to-end check is in `common/typed.rs`, shared with
//! `rpc_ibverbs.rs`): methods registered and called on the worker and through a handle
//! (blocking and as a future), structured values byte-exact through postcard, a request that
//! does not decode rejected with `UNDECODABLE`, a response that does not decode ending the call
//! with `Codec`, and raw calls beside typed ones on the same session; and the codec's own
//! refusal of trailing and missing bytes (no provider in it: here only).

mod common;

use common::{typed, Site};
use corelink_engine::verbs::soft::Soft;
use corelink_rpc::RpcError;

#[test]
fn typed_calls_on_the_worker_and_through_a_handle() {
    typed::typed_calls_on_the_worker_and_through_a_handle::<Soft>(&Site::soft("10.98.22.1"));
}

#[test]
fn decode_takes_every_byte_and_refuses_trailing_ones() {
    let bytes = corelink_rpc::encode(&(7u32, String::from("x"))).unwrap();
    assert_eq!(corelink_rpc::encoded_len(&(7u32, String::from("x"))).unwrap(), bytes.len());
    let v: (u32, String) = corelink_rpc::decode(&bytes).unwrap();
    assert_eq!(v, (7, "x".into()));
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(corelink_rpc::decode::<(u32, String)>(&longer), Err(RpcError::Codec(_))));
    for n in 0..bytes.len() {
        assert!(corelink_rpc::decode::<(u32, String)>(&bytes[..n]).is_err(), "{n} bytes");
    }
}
