//! The scheduler end to end, generic over the provider: one engine connects to itself and its
//! handler issues a scripted burst on the connection, recording the order and outcome of the
//! completions. Priority order, aging under a read flood, merged reads, coalesced writes, and
//! an error inside an unsignalled run. Included by `sched_soft.rs` (and `engine_ibverbs.rs`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::{Provider, RemoteAddr, RemoteRegion, WcStatus};
use corelink_engine::Metrics;
use corelink_engine::*;

/// How long a scenario may take before the test calls it a hang (not a performance bound).
const HANG: Duration = Duration::from_secs(60);

/// What the handler does once connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Script {
    /// 10 writes (tokens 100..) then 5 reads (tokens 200..), in one iteration.
    WritesThenReads,
    /// 4 writes (tokens 100..) and a flood of reads (tokens 1000..) kept 16 deep until 2000
    /// reads have completed.
    ReadFlood,
    /// 8 identical 64-byte reads (tokens 200..) in one iteration.
    IdenticalReads,
    /// 8 writes of 16 bytes to adjacent ranges (tokens 100..) in one iteration, then a read
    /// of the 128 bytes (token 300).
    AdjacentWrites,
    /// 5 writes, one with a bad key, 5 writes (tokens 100..110), in one iteration.
    ErrorInRun,
    /// 40 writes of 8 bytes (tokens 100..140) in one iteration.
    Window,
}

use crate::grant::{granted, Granter};

/// What the handler saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Completions in order: token and status.
    pub order: Vec<(u64, WcStatus)>,
    /// The bytes of each successful read, by token.
    pub reads: Vec<(u64, Vec<u8>)>,
    /// The sizes of the batches told through `on_completions`.
    pub batches: Vec<usize>,
    /// The worker's metrics over the script (from its start to its end).
    pub metrics: Option<Metrics>,
    /// Set when the script ended.
    pub done: bool,
}

type Shared = Arc<Mutex<Seen>>;

struct Sched<P: Provider> {
    script: Script,
    seen: Shared,
    /// The accepting end's memory, granted to the initiating end.
    granter: Granter<P>,
    /// The worker's metrics when the script started.
    base: Metrics,
    peer: Option<(ConnId, RemoteRegion)>,
    /// Where to connect, once the test knows the engine's address (the handler connects: the
    /// connection is its own, so the grant comes to it).
    dial: Arc<Mutex<Option<SocketAddr>>>,
    reads_done: u64,
    reads_issued: u64,
    expect: usize,
}

/// Offset in the region the scenarios use.
const BASE: u64 = 4096;

fn pattern(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 31 + j * 7) as u8).collect()
}

impl<P: Provider> Sched<P> {
    fn write(&self, cx: &mut Cx<P>, at: RemoteAddr, data: &[u8], token: u64) {
        let (conn, _) = self.peer.unwrap();
        let mut b = cx.alloc(data.len()).unwrap();
        b.fill(data).unwrap();
        cx.write(conn, b, at, None, token).map_err(|(_, e)| e).unwrap();
    }

    fn read(&mut self, cx: &mut Cx<P>, at: RemoteAddr, len: usize, token: u64) {
        let (conn, _) = self.peer.unwrap();
        let mut b = cx.alloc(len).unwrap();
        b.set_len(len).unwrap();
        cx.read(conn, b, at, token).map_err(|(_, e)| e).unwrap();
        self.reads_issued += 1;
    }
}

impl<P: Provider> Handler<P> for Sched<P> {
    fn poll(&mut self, cx: &mut Cx<P>) {
        if let Some(addr) = self.dial.try_lock().ok().and_then(|mut d| d.take()) {
            cx.connect(addr, b"", 1).unwrap();
        }
    }

    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        if !info.initiated {
            self.granter.grant(cx, conn);
        }
    }

    /// The initiating end runs the script once the accepting end's grant arrives.
    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        let Some(region) = granted(msg) else { return };
        self.peer = Some((conn, region));
        self.base = cx.metrics().clone();
        match self.script {
            Script::WritesThenReads => {
                for i in 0..10 {
                    self.write(cx, region.at(BASE + 8 * i), &pattern(i, 8), 100 + i);
                }
                for i in 0..5 {
                    self.read(cx, region.at(BASE), 8, 200 + i);
                }
                self.expect = 15;
            }
            Script::ReadFlood => {
                for i in 0..4 {
                    self.write(cx, region.at(BASE + 8 * i), &pattern(i, 8), 100 + i);
                }
                for _ in 0..16 {
                    let t = 1000 + self.reads_issued;
                    self.read(cx, region.at(BASE + 4096), 8, t);
                }
                self.expect = usize::MAX;
            }
            Script::IdenticalReads => {
                // Loopback: the granted memory is this handler's own.
                let mem = self.granter.memory().expect("the memory granted");
                mem.write_at(BASE as usize, &pattern(9, 64)).unwrap();
                for i in 0..8 {
                    self.read(cx, region.at(BASE), 64, 200 + i);
                }
                self.expect = 8;
            }
            Script::AdjacentWrites => {
                for i in 0..8 {
                    self.write(cx, region.at(BASE + 16 * i), &pattern(i, 16), 100 + i);
                }
                self.expect = 8;
            }
            Script::ErrorInRun => {
                for i in 0..11 {
                    let mut at = region.at(BASE + 8 * i);
                    if i == 5 {
                        at.rkey ^= 0x5a5a_0000;
                    }
                    self.write(cx, at, &pattern(i, 8), 100 + i);
                }
                self.expect = 11;
            }
            Script::Window => {
                for i in 0..40 {
                    self.write(cx, region.at(BASE + 8 * i), &pattern(i, 8), 100 + i);
                }
                self.expect = 40;
            }
        }
    }

    fn on_completions(&mut self, cx: &mut Cx<P>, done: Completions<'_, P>) {
        let conn = done.conn();
        self.seen.lock().unwrap().batches.push(done.len());
        for d in done {
            assert_eq!(d.conn, conn, "a batch is one connection's");
            assert!(d.status.is_success(), "a batch holds successes only: {d:?}");
            self.on_completion(cx, d);
        }
    }

    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        if done.token == crate::grant::TOKEN {
            return; // the grant's message went
        }
        let mut seen = self.seen.lock().unwrap();
        seen.order.push((done.token, done.status));
        if done.kind == OpKind::Read && done.status == WcStatus::Success {
            let bytes = done.buf.as_ref().map(|b| b.as_slice().to_vec()).unwrap_or_default();
            seen.reads.push((done.token, bytes));
        }
        drop(seen);
        let Some((_, region)) = self.peer else { return };
        if self.script == Script::ReadFlood && done.kind == OpKind::Read {
            self.reads_done += 1;
            let writes_done =
                self.seen.lock().unwrap().order.iter().filter(|(t, _)| *t < 1000).count();
            if self.reads_done < 2000 || writes_done < 4 {
                let t = 1000 + self.reads_issued;
                self.read(cx, region.at(BASE + 4096), 8, t);
            } else if self.reads_done == self.reads_issued {
                self.expect = 0;
            }
        }
        if self.script == Script::AdjacentWrites && done.token == 107 {
            self.read(cx, region.at(BASE), 128, 300);
            self.expect += 1;
        }
        let n = self.seen.lock().unwrap().order.len();
        if n >= self.expect || (self.script == Script::ReadFlood && self.expect == 0) {
            let mut seen = self.seen.lock().unwrap();
            seen.metrics = Some(cx.metrics().since(&self.base));
            seen.done = true;
        }
    }
}

/// Runs `script` on an engine made from `provider`'s lines, listening on `listen`, with `extra`
/// TOML lines in `[worker]` (the scheduler's settings); returns what the handler saw.
pub fn run<P: Provider>(provider: &str, listen: SocketAddr, extra: &str, script: Script) -> Seen {
    let text = format!(
        "{provider}\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000\n{extra}"
    );
    let v = parse(&text).unwrap().validate(&MachineTopology::load().unwrap()).unwrap();
    let seen: Shared = Arc::default();
    let s = seen.clone();
    let dial: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    let d = dial.clone();
    let e = Engine::<P>::start(&v, Placement::RoundRobin, move |_| Sched {
        script,
        dial: d.clone(),
        seen: s.clone(),
        granter: Granter::default(),
        base: Metrics::default(),
        peer: None,
        reads_done: 0,
        reads_issued: 0,
        expect: usize::MAX,
    })
    .unwrap();
    *dial.lock().unwrap() = e.listen_addr();
    let deadline = Instant::now() + HANG;
    while !seen.lock().unwrap().done {
        assert!(Instant::now() < deadline, "{script:?} hung: {:?}", seen.lock().unwrap().order);
        std::thread::sleep(Duration::from_millis(1));
    }
    e.shutdown().unwrap();
    let mut seen = seen.lock().unwrap();
    std::mem::take(&mut *seen)
}

fn tokens(seen: &Seen) -> Vec<u64> {
    seen.order.iter().map(|(t, _)| *t).collect()
}

/// Reads overtake queued writes with priorities on; arrival order with them off.
pub fn reads_overtake_queued_writes<P: Provider>(provider: &str, a: SocketAddr, b: SocketAddr) {
    let one_at_a_time = "[worker.scheduler]\nmax_outstanding = 1\n";
    let on = run::<P>(provider, a, one_at_a_time, Script::WritesThenReads);
    assert_eq!(on.order.iter().filter(|(_, s)| s.is_success()).count(), 15, "{:?}", on.order);
    let writes: Vec<u64> = (100..110).collect();
    let reads: Vec<u64> = (200..205).collect();
    let t = tokens(&on);
    assert_eq!(t[..5], reads[..], "reads first: {t:?}");
    assert_eq!(t[5..], writes[..], "then the writes in order: {t:?}");
    let off = format!("{one_at_a_time}priorities = false\n");
    let t = tokens(&run::<P>(provider, b, &off, Script::WritesThenReads));
    assert_eq!(t, [writes, reads].concat(), "arrival order without priorities");
}

/// Writes still go under a flood of reads (aging), in bounded time.
pub fn no_starvation_under_a_read_flood<P: Provider>(provider: &str, a: SocketAddr) {
    let map = "[worker.scheduler]\nmax_outstanding = 1\naging_rounds = 4\n";
    let seen = run::<P>(provider, a, map, Script::ReadFlood);
    let t = tokens(&seen);
    for w in 100..104 {
        let at = t.iter().position(|&x| x == w).unwrap_or_else(|| panic!("write {w} starved"));
        // Each write waits at most a few aging periods of reads, never the flood's 2000.
        assert!(at < 100, "write {w} completed after {at} completions: {:?}", &t[..at.min(60)]);
    }
    assert!(seen.order.iter().all(|(_, s)| s.is_success()));
}

/// Identical reads in flight share one work request and each gets the same bytes.
pub fn identical_reads_merge<P: Provider>(provider: &str, a: SocketAddr, b: SocketAddr) {
    let seen = run::<P>(provider, a, "", Script::IdenticalReads);
    assert_eq!(seen.reads.len(), 8, "{:?}", seen.order);
    for (t, bytes) in &seen.reads {
        assert_eq!(bytes, &pattern(9, 64), "read {t}");
    }
    let m = seen.metrics.unwrap();
    assert_eq!((m.merged_reads, m.posted), (7, 1), "one RDMA read for eight requests");
    let off =
        run::<P>(provider, b, "[worker.scheduler]\nmerge_reads = false\n", Script::IdenticalReads);
    let m = off.metrics.unwrap();
    assert_eq!((m.merged_reads, m.posted), (0, 8), "merging off: a read each");
}

/// Adjacent writes coalesce into one gathered write and land as the separate writes would.
pub fn adjacent_writes_coalesce<P: Provider>(provider: &str, a: SocketAddr) {
    let map = "[worker.scheduler]\ncoalesce_writes = true\n";
    let seen = run::<P>(provider, a, map, Script::AdjacentWrites);
    assert!(seen.order.iter().all(|(_, s)| s.is_success()), "{:?}", seen.order);
    let want: Vec<u8> = (0..8).flat_map(|i| pattern(i, 16)).collect();
    let got = &seen.reads.iter().find(|(t, _)| *t == 300).expect("the read back").1;
    assert_eq!(got, &want, "the bytes of the eight writes, in place");
    let m = seen.metrics.unwrap();
    assert_eq!(m.coalesced_writes, 7, "{m}");
    assert_eq!(m.posted, 2, "one write for eight, and the read");
}

/// An error inside an unsignalled run reaches its requester; earlier requests succeeded; later
/// ones flush; each request hears exactly once.
pub fn error_inside_an_unsignalled_run<P: Provider>(provider: &str, a: SocketAddr) {
    let map = "[worker.batching]\npost_list = 16\nsignal_every = 16\n";
    let seen = run::<P>(provider, a, map, Script::ErrorInRun);
    let mut order = seen.order.clone();
    order.sort_by_key(|(t, _)| *t);
    let statuses: Vec<WcStatus> = order.iter().map(|(_, s)| *s).collect();
    let tokens: Vec<u64> = order.iter().map(|(t, _)| *t).collect();
    assert_eq!(tokens, (100..111).collect::<Vec<_>>(), "each request once: {:?}", seen.order);
    assert!(statuses[..5].iter().all(|s| s.is_success()), "{statuses:?}");
    assert_eq!(statuses[5], WcStatus::RemAccessErr, "{statuses:?}");
    assert!(statuses[6..].iter().all(|s| *s == WcStatus::WrFlushErr), "{statuses:?}");
    let m = seen.metrics.unwrap();
    assert!(m.signalled < m.posted, "selective signalling was on: {m}");
}

/// A window of writes under selective signalling: the requests one completion retires are
/// told together (`Handler::on_completions`), in post order, each once.
pub fn completions_come_in_batches<P: Provider>(provider: &str, a: SocketAddr) {
    let map = "[worker.batching]\npost_list = 16\nsignal_every = 16\n";
    let seen = run::<P>(provider, a, map, Script::Window);
    assert_eq!(tokens(&seen), (100..140).collect::<Vec<_>>(), "each once, in post order");
    assert!(seen.order.iter().all(|(_, s)| s.is_success()), "{:?}", seen.order);
    // (a lone completion of its own request is told through `on_completion` directly)
    let batched: usize = seen.batches.iter().sum();
    assert!(batched <= 40, "{:?}", seen.batches);
    assert!(seen.batches.iter().any(|&n| n > 1), "no batch: {:?}", seen.batches);
    assert!(seen.batches.iter().all(|&n| n <= 16), "one completion in 16: {:?}", seen.batches);
    let m = seen.metrics.unwrap();
    assert!(m.signalled < m.posted, "selective signalling was on: {m}");
}
