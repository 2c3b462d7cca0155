//! The typed layer, generic over the provider: methods registered and called on the worker
//! and through a handle (blocking and as a future), structured values byte-exact through
//! postcard, a request that does not decode rejected with `UNDECODABLE`, a response that does
//! not decode ending the call with `Codec`, and raw calls beside typed ones on the same
//! session.
//!
//! Run by `typed_soft.rs` and `rpc_ibverbs.rs`.

use std::sync::mpsc::channel;
use std::sync::Mutex;

use super::*;
use corelink_engine::verbs::Provider;
use corelink_engine::{Engine, Placement};
use corelink_rpc::{
    handle, Endpoint, EndpointConfig, Method, Reject, ReqType, Rpc, RpcError, RpcHandler, Service,
    SessionId, UNDECODABLE,
};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Put {
    key: String,
    value: Vec<u8>,
    ttl: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Stored {
    New { len: usize },
    Replaced { old: Vec<u8> },
}

struct PutMethod;
impl Method for PutMethod {
    const TYPE: ReqType = ReqType(20);
    type Request<'a> = Put;
    type Response<'a> = Stored;
}

struct Add;
impl Method for Add {
    const TYPE: ReqType = ReqType(21);
    type Request<'a> = (u64, u64);
    type Response<'a> = u64;
}

/// The same type number as `Add`, but a response type its bytes do not decode as.
struct AddAsText;
impl Method for AddAsText {
    const TYPE: ReqType = ReqType(21);
    type Request<'a> = (u64, u64);
    type Response<'a> = (String, String, String);
}

/// On its first iteration, connects to itself and makes typed calls, telling the test.
struct Typed {
    me: std::net::SocketAddr,
    started: bool,
    told: std::sync::mpsc::Sender<(u64, Result<u64, RpcError>)>,
    /// Where the borrowed calls (`Prefix`) tell what they got (copied out to tell it).
    prefixes: std::sync::mpsc::Sender<(u8, Result<String, RpcError>)>,
}

impl<P: Provider> Service<P> for Typed {
    fn poll(&mut self, rpc: &mut Rpc<'_, P>) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let s = rpc.connect(self.me).unwrap();
        for i in 0..100u64 {
            let told = self.told.clone();
            rpc.call_method::<Add>(s, &(i, 1000), LONG, move |_, r| {
                let _ = told.send((i, r));
            })
            .unwrap();
        }
        // Request and response borrowed: the continuation's `&str` is read in place.
        for n in [0u8, 4, 13, 14] {
            let told = self.prefixes.clone();
            rpc.call_method::<Prefix>(s, &(n, "borrowed text"), LONG, move |_, r| {
                let _ = told.send((n, r.map(str::to_owned)));
            })
            .unwrap();
        }
    }
}

/// Typed calls made on the worker and through a handle (blocking and as a future), with the
/// handler's refusal, undecodable requests and responses, and raw calls beside them.
pub fn typed_calls_on_the_worker_and_through_a_handle<P: Provider>(site: &Site) {
    let map = site.map("");
    let res = map.map.worker.clone();
    let (tx, rx) = channel();
    let (htx, hrx) = channel();
    let (ptx, prx) = channel();
    let (tx, ptx) = (Mutex::new(tx), Mutex::new(ptx));
    let htx = Mutex::new(htx);
    let me = site.listen;
    let engine = Engine::<P>::start(&map, Placement::RoundRobin, move |_| {
        let mut ep = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
        serve(&mut ep);
        let mut table = std::collections::HashMap::<String, Vec<u8>>::new();
        ep.register_method::<PutMethod>(move |_, put| {
            let len = put.value.len();
            Ok(match table.insert(put.key, put.value) {
                Some(old) => Stored::Replaced { old },
                None => Stored::New { len },
            })
        })
        .unwrap();
        ep.register_method::<Add>(|_, (a, b)| a.checked_add(b).ok_or(Reject(9))).unwrap();
        let (h, inbox) = handle(16);
        htx.lock().unwrap().send(h).unwrap();
        let (told, prefixes) = (tx.lock().unwrap().clone(), ptx.lock().unwrap().clone());
        let svc = Typed { me, started: false, told, prefixes };
        RpcHandler::new(ep, svc).with_inbox(inbox)
    })
    .unwrap();

    // On the worker: every call decoded, each its own sum.
    let mut got: Vec<_> = (0..100).map(|_| rx.recv_timeout(HANG).unwrap()).collect();
    got.sort_by_key(|(i, _)| *i);
    for (i, r) in got {
        assert_eq!(r.unwrap(), i + 1000, "call {i}");
    }
    let mut got: Vec<_> = (0..4).map(|_| prx.recv_timeout(HANG).unwrap()).collect();
    got.sort_by_key(|(n, _)| *n);
    let (ok, refused): (Vec<_>, Vec<_>) = got.into_iter().partition(|(n, _)| *n <= 13);
    let ok: Vec<_> = ok.into_iter().map(|(n, r)| (n, r.unwrap())).collect();
    let want = [(0, ""), (4, "borr"), (13, "borrowed text")].map(|(n, t)| (n, t.to_owned()));
    assert_eq!(ok, want, "borrowed request and response");
    assert!(matches!(refused[0].1, Err(RpcError::Rejected { code: 3 })), "{refused:?}");

    // Through a handle.
    let mut h = hrx.recv_timeout(HANG).unwrap();
    let s: SessionId = h.connect(me).unwrap();
    let put = Put { key: "k".into(), value: vec![1, 2, 3], ttl: Some(5) };
    assert_eq!(h.call_method::<PutMethod>(s, &put, LONG).unwrap(), Stored::New { len: 3 });
    let put2 = Put { value: (0..=255).collect(), ttl: None, ..put };
    let f = h.call_method_async::<PutMethod>(s, &put2, LONG);
    let r = corelink_rpc::block_on(f).unwrap();
    assert_eq!(r, Stored::Replaced { old: vec![1, 2, 3] });
    // The handler's own refusal, and one the endpoint makes for bytes that do not decode.
    let e = h.call_method::<Add>(s, &(u64::MAX, 1), LONG).unwrap_err();
    assert!(matches!(e, RpcError::Rejected { code: 9 }), "{e}");
    let e = h.call(s, Add::TYPE, &[0xff; 3], LONG).unwrap_err();
    assert!(matches!(e, RpcError::Rejected { code: UNDECODABLE }), "{e}");
    // A response that does not decode as the caller's type.
    let e = h.call_method::<AddAsText>(s, &(1, 2), LONG).unwrap_err();
    assert!(matches!(e, RpcError::Codec(_)), "{e}");
    // Raw calls beside the typed ones, on the same session.
    assert_eq!(h.call(s, ECHO, b"raw", LONG).unwrap(), b"raw");
    let raw = corelink_rpc::encode(&(40u64, 2u64)).unwrap();
    let sum: u64 = corelink_rpc::decode(&h.call(s, Add::TYPE, &raw, LONG).unwrap()).unwrap();
    assert_eq!(sum, 42);
    drop(h);
    engine.shutdown().unwrap();
}
