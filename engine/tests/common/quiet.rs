//! Quiet sends (`Cx::send_quiet`), generic over the provider: they arrive, their successes are
//! not told (no `on_completion`, the buffers back in the pool), a close behind a quiet tail
//! that asked for no completion still drains (the worker's fence), and quiet sends a close
//! flushes before they were posted are told as any request.
//!
//! Included (with `#[path]`) by `engine_soft.rs` and `engine_ibverbs.rs`.

use std::net::SocketAddr;
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::{AccessFlags, Provider, RemoteRegion, WcStatus};
use corelink_engine::*;

/// How long a step may take before the test calls it a hang.
const HANG: Duration = Duration::from_secs(30);
/// Quiet sends on the first connection (fewer than `signal_every`: the last asks for none).
const N: usize = 5;
/// The token of the loud send that keeps the second connection's lane busy.
const BUSY_TOKEN: u64 = 99;
/// The accepting side's answer once it has the `N` quiet messages.
const GOT: &[u8] = b"got them";

/// What the connecting side saw.
#[derive(Debug, PartialEq)]
enum Seen {
    /// A request's completion (its token and status).
    Done(u64, WcStatus),
    /// The accepting side had every quiet message.
    Got,
    /// A connection of this side closed.
    Closed(CloseReason),
}

struct Quiet {
    /// The engine's own listening address, once it is known.
    addr: Arc<OnceLock<SocketAddr>>,
    /// Connections asked for so far (two: the quiet tail's, then the flushed ones').
    dialed: u32,
    /// Quiet messages the accepting side has had.
    heard: usize,
    told: mpsc::Sender<Seen>,
}

impl<P: Provider> Handler<P> for Quiet {
    fn poll(&mut self, cx: &mut Cx<P>) {
        if let (0, Some(&addr)) = (self.dialed, self.addr.get()) {
            self.dialed = 1;
            cx.connect(addr, b"", 1).unwrap();
        }
    }

    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        if !info.initiated {
            return;
        }
        let n = if info.token == 1 { N } else { 3 };
        if info.token == 2 {
            // A loud send first: the lane is busy, so the quiet sends after it wait for the
            // flush (an idle lane takes a lone request at once).
            let mut b = cx.alloc(8).unwrap();
            b.fill(b"busy now").unwrap();
            cx.send(conn, b, None, BUSY_TOKEN).map_err(|(_, e)| e).unwrap();
        }
        for i in 0..n {
            let mut b = cx.alloc(8).unwrap();
            b.fill(&(i as u64).to_le_bytes()).unwrap();
            cx.send_quiet(conn, b, 100 + i as u64).map_err(|(_, e)| e).unwrap();
        }
        if info.token == 2 {
            // Closed before the worker posts them: each is flushed, and told so.
            cx.close(conn).unwrap();
        }
    }

    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        if msg.data == GOT {
            let _ = self.told.send(Seen::Got);
            // The quiet tail asked for no completion: the close drains it all the same.
            cx.close(conn).unwrap();
            return;
        }
        self.heard += 1;
        if self.heard == N {
            let mut b = cx.alloc(GOT.len()).unwrap();
            b.fill(GOT).unwrap();
            cx.send(conn, b, None, 7).map_err(|(_, e)| e).unwrap();
        }
    }

    fn on_completion(&mut self, _cx: &mut Cx<P>, done: Done<Buf<P>>) {
        if done.token != 7 {
            let _ = self.told.send(Seen::Done(done.token, done.status));
        }
    }

    fn on_closed(&mut self, cx: &mut Cx<P>, _conn: ConnId, reason: &CloseReason) {
        // (the connecting side's closes: the accepting side's end closes with `Peer`)
        if *reason != CloseReason::Local {
            return;
        }
        let _ = self.told.send(Seen::Closed(*reason));
        if let (1, Some(&addr)) = (self.dialed, self.addr.get()) {
            self.dialed = 2;
            cx.connect(addr, b"", 2).unwrap();
        }
    }
}

/// The whole story on one engine (core map `map`) connected to itself.
pub fn quiet_sends_arrive_untold_and_a_close_drains_them<P: Provider>(map: &str) {
    let v = parse(map).unwrap().validate(&MachineTopology::load().unwrap()).unwrap();
    let (tx, rx) = mpsc::channel();
    let addr = Arc::new(OnceLock::new());
    let a = addr.clone();
    let engine = Engine::<P>::start(&v, Placement::RoundRobin, move |_| Quiet {
        addr: a.clone(),
        dialed: 0,
        heard: 0,
        told: tx.clone(),
    })
    .unwrap();
    addr.set(engine.listen_addr().unwrap()).unwrap();
    let next = || rx.recv_timeout(HANG).expect("the engine went quiet");
    // The first connection: every quiet message arrived, none told; the close drained.
    assert_eq!(next(), Seen::Got, "no completion of a quiet send before the answer");
    assert_eq!(next(), Seen::Closed(CloseReason::Local), "the close drained the quiet tail");
    // The second: three quiet sends flushed by the close before they went, each told.
    // (the loud send before them is told too, done or flushed: whichever the close allowed)
    let mut flushed: Vec<Seen> = (0..5).map(|_| next()).collect();
    flushed.retain(|s| !matches!(s, Seen::Closed(CloseReason::Local) | Seen::Done(BUSY_TOKEN, _)));
    let want: Vec<Seen> = (100..103).map(|t| Seen::Done(t, WcStatus::WrFlushErr)).collect();
    assert_eq!(flushed, want, "a quiet request that failed is told");
    let m = engine.shutdown().unwrap();
    assert_eq!(m[0].quiet, N as u64, "{}", m[0]);
    assert!(m[0].fences >= 1, "{}", m[0]);
    assert_eq!(m[0].invariant_misses, 0, "{}", m[0]);
}

/// Quiet writes on the connection (fewer than `signal_every`: the last asks for none).
const WRITES: usize = 5;
/// Bytes of the accepting side's memory granted to its peer (one word per quiet write).
const GRANTED: usize = WRITES * 8;
/// The connecting side's message once its quiet writes are posted: "look now" (a send after
/// the writes, on the connection's one lane, arrives after them).
const LOOK: &[u8] = b"look";
/// The token of the "look" message's send.
const LOOK_TOKEN: u64 = 7;
/// Writes' request class by default (`worker.scheduler.classes.write`).
const WRITE_CLASS: u8 = 2;
/// The token of the quiet write past the grant.
const PAST_TOKEN: u64 = 200;

/// What the quiet-writes story saw.
#[derive(Debug, PartialEq)]
enum Wrote {
    /// The accepting side's memory after the quiet writes: its granted words, then the word
    /// just past the grant.
    Landed(Vec<u64>, u64),
    /// A request's completion on the connecting side (its token and status).
    Done(u64, WcStatus),
}

struct QuietWrites<P: Provider> {
    addr: Arc<OnceLock<SocketAddr>>,
    dialed: bool,
    /// The accepting side's memory (granted in part to its peer).
    mem: Option<Memory<P>>,
    /// The connecting side's grant from its peer.
    region: Option<RemoteRegion>,
    told: mpsc::Sender<Wrote>,
}

impl<P: Provider> Handler<P> for QuietWrites<P> {
    fn poll(&mut self, cx: &mut Cx<P>) {
        if let (false, Some(&addr)) = (self.dialed, self.addr.get()) {
            self.dialed = true;
            cx.connect(addr, b"", 1).unwrap();
        }
    }

    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        if info.initiated {
            return; // it waits for the grant
        }
        let mem = self.mem.insert(cx.register_memory(4096, false).unwrap());
        let grant = cx.grant(conn, mem, 0, GRANTED, AccessFlags::REMOTE_WRITE).unwrap();
        let mut msg = cx.alloc(RemoteRegion::WIRE_BYTES).unwrap();
        msg.fill(&grant.region.to_bytes()).unwrap();
        cx.send(conn, msg, None, 0).map_err(|(_, e)| e).unwrap();
    }

    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        if msg.data == LOOK {
            let mem = self.mem.as_ref().unwrap();
            let words = (0..WRITES).map(|i| mem.read_u64(i * 8).unwrap()).collect();
            let _ = self.told.send(Wrote::Landed(words, mem.read_u64(GRANTED).unwrap()));
            return;
        }
        let region = *self.region.insert(RemoteRegion::from_bytes(msg.data).unwrap());
        for i in 0..WRITES {
            let mut b = cx.alloc(8).unwrap();
            b.fill(&(i as u64 + 1).to_le_bytes()).unwrap();
            let at = region.at(i as u64 * 8);
            cx.write_quiet(conn, b, at, None, 100 + i as u64).map_err(|(_, e)| e).unwrap();
        }
        let mut b = cx.alloc(LOOK.len()).unwrap();
        b.fill(LOOK).unwrap();
        // (in the writes' class, `worker.scheduler.classes.write`'s default: requests of one
        // class go in order, so the message arrives after the writes landed)
        let op = Op::Send { buf: b, imm: None };
        cx.submit_as(conn, op, LOOK_TOKEN, WRITE_CLASS).map_err(|(_, e)| e).unwrap();
    }

    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        if done.token == 0 {
            return; // (the accepting side's grant message)
        }
        let _ = self.told.send(Wrote::Done(done.token, done.status));
        if let (LOOK_TOKEN, Some(region)) = (done.token, self.region) {
            // A quiet write past the grant: refused by the peer, and told although quiet.
            let mut b = cx.alloc(8).unwrap();
            b.fill(&u64::MAX.to_le_bytes()).unwrap();
            let past = region.at(GRANTED as u64);
            cx.write_quiet(done.conn, b, past, None, PAST_TOKEN).map_err(|(_, e)| e).unwrap();
        }
    }
}

/// Quiet writes (`Cx::write_quiet`) land in the peer's granted memory with no completion told;
/// one outside the grant fails with a remote access error, told as any request's failure, and
/// leaves the memory untouched. One engine (core map `map`) connected to itself.
pub fn quiet_writes_land_untold_and_a_failure_is_told<P: Provider>(map: &str) {
    let v = parse(map).unwrap().validate(&MachineTopology::load().unwrap()).unwrap();
    let (tx, rx) = mpsc::channel();
    let addr = Arc::new(OnceLock::new());
    let a = addr.clone();
    let engine = Engine::<P>::start(&v, Placement::RoundRobin, move |_| QuietWrites {
        addr: a.clone(),
        dialed: false,
        mem: None,
        region: None,
        told: tx.clone(),
    })
    .unwrap();
    addr.set(engine.listen_addr().unwrap()).unwrap();
    let next = || rx.recv_timeout(HANG).expect("the engine went quiet");
    let mut seen: Vec<Wrote> = (0..3).map(|_| next()).collect();
    // (the accepting side's look and the send's completion race: compare in a fixed order)
    seen.sort_by_key(|w| match w {
        Wrote::Landed(..) => 0,
        Wrote::Done(t, _) => 1 + *t,
    });
    let landed = Wrote::Landed((1..=WRITES as u64).collect(), 0);
    let want = vec![
        landed,
        Wrote::Done(LOOK_TOKEN, WcStatus::Success),
        Wrote::Done(PAST_TOKEN, WcStatus::RemAccessErr),
    ];
    assert_eq!(seen, want, "quiet writes land untold; a failed one is told");
    let m = engine.shutdown().unwrap();
    assert_eq!(m[0].quiet, WRITES as u64, "{}", m[0]);
    assert_eq!(m[0].invariant_misses, 0, "{}", m[0]);
}
