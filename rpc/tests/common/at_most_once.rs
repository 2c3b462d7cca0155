//! At-most-once execution and the decoder at a server endpoint, generic over the provider: a
//! raw engine client speaks the wire format by hand to an endpoint's server session, so that
//! it can duplicate requests, replay old ones and send malformed ones (no test hook in the
//! endpoint, no fault injection in the provider: the duplicates are real sends, so the checks
//! run on `ibverbs` as they do on `soft`).
//!
//! Run by `at_most_once_soft.rs` and `rpc_ibverbs.rs`.

use super::*;
use corelink_engine::verbs::Provider;
use corelink_engine::{ConnId, Event, Op};
use corelink_rpc::wire::{decode, Header, Hello, Kind, Status};
use corelink_rpc::{ReqType, SessionId};

fn request(slot: u16, seq: u64, ty: ReqType) -> Vec<u8> {
    header(slot, seq, ty, false)
}

/// A request sent again after a reconnect (flag `RESENT`).
fn resent(slot: u16, seq: u64, ty: ReqType) -> Vec<u8> {
    header(slot, seq, ty, true)
}

fn header(slot: u16, seq: u64, ty: ReqType, resent: bool) -> Vec<u8> {
    let h = Header {
        kind: Kind::Request,
        ty,
        slot,
        session: SessionId::from_wire(0x42),
        seq,
        len: 0,
        status: Status::Ok,
        large: false,
        resent,
    };
    h.encode().to_vec()
}

fn send(c: &mut corelink_engine::Client, conn: ConnId, bytes: Vec<u8>) {
    c.submit(conn, Op::Send { buf: bytes, imm: None }, 0).map_err(|(_, e)| e).unwrap();
}

/// The next message `c` hears (completions of its sends skipped).
fn heard(c: &mut corelink_engine::Client) -> Vec<u8> {
    loop {
        match c.wait(HANG).expect("a message") {
            Event::Message { data, .. } => return data,
            Event::Done(d) => assert!(d.status.is_success(), "{d:?}"),
            e => panic!("{e:?}"),
        }
    }
}

/// The run count a COUNT response for `slot` and `seq` carries.
fn count(msg: &[u8], slot: u16, seq: u64) -> u64 {
    let (h, payload) = decode(msg).unwrap();
    assert_eq!(
        (h.kind, h.slot, h.seq, h.session),
        (Kind::Response, slot, seq, SessionId::from_wire(0x42))
    );
    u64::from_le_bytes(payload.try_into().unwrap())
}

/// A plain hello with `credits`.
fn hello(credits: u16) -> Vec<u8> {
    Hello { credits, resume: None }.encode()
}

/// Connects `c` to `at` with `private` data (token `token`); the connection.
fn open(
    c: &mut corelink_engine::Client,
    at: std::net::SocketAddr,
    private: &[u8],
    token: u64,
) -> ConnId {
    c.connect(at, private, token).unwrap();
    match c.wait(HANG) {
        Some(Event::Connected { conn, .. }) => conn,
        e => panic!("not connected: {e:?}"),
    }
}

/// Closes `conn` of `c` and waits until it is down.
fn close(c: &mut corelink_engine::Client, conn: ConnId) {
    c.close(conn).unwrap();
    loop {
        match c.wait(HANG).expect("the close") {
            Event::Closed { conn: closed, .. } if closed == conn => return,
            Event::Done(_) => {}
            e => panic!("{e:?}"),
        }
    }
}

/// A resumable session (a hello with a key) whose connection is lost keeps its record at the
/// server: on a new connection with the same key, a request sent again that already ran is
/// answered from it (not run), and one that never came runs. A request sent again on a
/// session the server has no record of (another key) is answered `Lost`, not run.
pub fn a_resumable_sessions_record_survives_its_connection<P: Provider>(site: &Site) {
    let mut rig = Rig::<P>::start(&site.map(""), 4, || |_: &mut _, _| {});
    let mut c = rig.engine.client(0).unwrap();
    let key = Hello { credits: 4, resume: Some(0x5eed) }.encode();
    let conn = open(&mut c, site.listen, &key, 1);
    send(&mut c, conn, request(0, 1, COUNT));
    let first = heard(&mut c);
    assert_eq!(count(&first, 0, 1), 1);
    close(&mut c, conn);
    rig.metrics_when(|m| m.handled == 1);

    // The same session on a new connection: slot 0's request again, then slot 1's first.
    let conn = open(&mut c, site.listen, &key, 2);
    send(&mut c, conn, resent(0, 1, COUNT));
    assert_eq!(heard(&mut c), first, "answered from the record, not run again");
    send(&mut c, conn, resent(1, 1, COUNT));
    assert_eq!(count(&heard(&mut c), 1, 1), 2, "never seen there: it runs");
    let m = rig.metrics_when(|m| m.resumed == 1 && m.handled == 2);
    assert_eq!((m.duplicates, m.lost), (1, 0), "{m:?}");

    // Another key: a session new to the server, which cannot know whether it ran.
    let other = Hello { credits: 4, resume: Some(0xf00d) }.encode();
    let conn = open(&mut c, site.listen, &other, 3);
    send(&mut c, conn, resent(0, 7, COUNT));
    let (h, _) = decode(&heard(&mut c)).unwrap();
    assert_eq!((h.kind, h.status, h.slot, h.seq), (Kind::Error, Status::Lost, 0, 7));
    let m = rig.metrics_when(|m| m.lost == 1);
    assert_eq!((m.handled, m.invariant_misses), (2, 0), "not run: {m:?}");
    drop(c);
    rig.engine.shutdown().unwrap();
}

/// A request duplicated by a raw client runs once and is answered again from the stored
/// response; older requests, malformed messages and a slot beyond the session's are dropped.
pub fn a_duplicated_request_runs_once_and_is_answered_again<P: Provider>(site: &Site) {
    let mut rig = Rig::<P>::start(&site.map(""), 4, || |_: &mut _, _| {});
    let mut c = rig.engine.client(0).unwrap();
    c.connect(site.listen, &hello(4), 1).unwrap();
    let conn = match c.wait(HANG) {
        Some(Event::Connected { conn, .. }) => conn,
        e => panic!("not connected: {e:?}"),
    };
    // A request, then the same again once answered: one run, the same answer twice.
    send(&mut c, conn, request(0, 1, COUNT));
    let first = heard(&mut c);
    assert_eq!(count(&first, 0, 1), 1);
    send(&mut c, conn, request(0, 1, COUNT));
    assert_eq!(heard(&mut c), first, "answered from the stored response");
    // The next request on the slot acknowledges that response and runs.
    send(&mut c, conn, request(0, 2, COUNT));
    assert_eq!(count(&heard(&mut c), 0, 2), 2);
    // An older request is dropped; malformed messages and a slot beyond the session's too.
    send(&mut c, conn, request(0, 1, COUNT));
    send(&mut c, conn, b"not an rpc".to_vec());
    send(&mut c, conn, request(9, 1, COUNT));
    // Two copies back to back (the second may come while the first answer's send is still
    // on the device): one run, two identical answers.
    send(&mut c, conn, request(2, 1, COUNT));
    send(&mut c, conn, request(2, 1, COUNT));
    let (a, b) = (heard(&mut c), heard(&mut c));
    assert_eq!(count(&a, 2, 1), 3, "the dropped ones never ran");
    assert_eq!(a, b);
    let m = rig.metrics_when(|m| m.handled == 3 && m.duplicates == 2);
    assert_eq!((m.stale, m.malformed, m.invariant_misses), (1, 2, 0), "{m:?}");
    drop(c);
    rig.engine.shutdown().unwrap();
}

/// A connection whose private data is no hello, or asks for more credits than the server's
/// receives, is closed by the server.
pub fn a_connection_without_a_hello_or_with_too_many_credits_is_refused<P: Provider>(site: &Site) {
    let mut rig = Rig::<P>::start(&site.map("recvs_per_conn = 8"), 8, || |_: &mut _, _| {});
    let mut c = rig.engine.client(0).unwrap();
    for (token, private) in [(1u64, b"hi".to_vec()), (2, hello(9).to_vec())] {
        c.connect(site.listen, &private, token).unwrap();
        let conn = match c.wait(HANG) {
            Some(Event::Connected { conn, .. }) => conn,
            e => panic!("not connected: {e:?}"),
        };
        // The server closes it: the client hears the close.
        loop {
            match c.wait(HANG).expect("the close") {
                Event::Closed { conn: closed, .. } if closed == conn => break,
                Event::Done(_) => {}
                e => panic!("{e:?}"),
            }
        }
    }
    let m = rig.metrics_when(|m| m.refused == 2);
    assert_eq!(m.handled, 0);
    drop(c);
    rig.engine.shutdown().unwrap();
}
