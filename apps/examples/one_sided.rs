//! The one-sided patterns on the engine: an atomic sequencer, a compare-and-swap lock, and
//! optimistic reads of records that the server updates in place.
//!
//! ```text
//! one_sided [both] [--count N]                             # one process, soft
//! one_sided server ADDR [--provider soft|ibverbs] [--config MAP.toml] [--clients N]
//! one_sided client ADDR [--count N] [--window W] [--provider soft|ibverbs]
//! ```
//!
//! The server registers memory with its worker (`Cx::register_memory`) holding a 64-bit
//! sequence word, a lock word and a table of records, each a payload and the FNV-1a 64 checksum
//! of that payload, and grants it to each client that connects (`Cx::grant`: reads and atomics,
//! no writes), telling it where in a message (immediate `GRANT_IMM`). From a timer the server rewrites one record's payload, and 40 us later its
//! checksum: in between, the record is inconsistent, as it is for a moment under any in-place
//! writer. The client takes `--count` sequence numbers with fetch-and-add (checking that they
//! strictly increase), takes and releases the lock with compare-and-swap (0 -> 1, 1 -> 0; a
//! second take while held must be refused), then RDMA-reads `--count` whole records, verifies
//! each checksum and payload, and reads again a record whose checksum does not match (an update
//! caught mid-way; counted). Exit status: 0 when everything checked out, 1 if not, 2 on bad usage.

mod engine_common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::Parser;
use corelink_engine::{
    Buf, CloseReason, ConnId, ConnInfo, Cx, Done, Handler, Memory, Message, OpKind,
};
use corelink_verbs::{AccessFlags, Provider, RemoteRegion};
use engine_common::{latency, Common, Link};

/// The immediate of the message that tells a client where the server's memory is.
const GRANT_IMM: u32 = 0x6772_6e74;
/// The token of that message's send.
const GRANT_TOKEN: u64 = u64::MAX;

/// Offsets in the server's memory: the sequence word, the lock word, the record table.
const SEQ_WORD: u64 = 0;
const LOCK_WORD: u64 = 8;
const TABLE: usize = 64;
const RECORDS: usize = 16;
/// A record: `PAYLOAD` bytes (index, version, filler) and the payload's checksum.
const RECORD: usize = 256;
const PAYLOAD: usize = RECORD - 8;
/// The server updates a record every `PERIOD`; its checksum follows `GAP` after its payload.
const PERIOD: Duration = Duration::from_micros(100);
const GAP: Duration = Duration::from_micros(40);
const T_PAYLOAD: u64 = 1;
const T_CHECKSUM: u64 = 2;

#[derive(Parser, Debug)]
#[command(name = "one_sided", about = "One-sided patterns on the corelink engine")]
struct Cli {
    #[command(flatten)]
    common: Common,
}

fn fnv1a64(data: &[u8]) -> u64 {
    data.iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// Record `r`'s payload at `version`.
fn payload(r: usize, version: u64) -> [u8; PAYLOAD] {
    let mut p = [0u8; PAYLOAD];
    p[..8].copy_from_slice(&(r as u64).to_le_bytes());
    p[8..16].copy_from_slice(&version.to_le_bytes());
    for (i, x) in p[16..].iter_mut().enumerate() {
        *x = (version as usize).wrapping_mul(13).wrapping_add(r * 29 + i) as u8;
    }
    p
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The server's memory: the words and the record table.
const MEMORY: usize = TABLE + RECORDS * RECORD;

/// Owns the records in memory it registered and updates them from a timer.
struct Store {
    link: Link,
    /// Its `Memory<P>` (held as `Any`: the example builds one handler type for every provider).
    mem: Option<Box<dyn std::any::Any>>,
    started: bool,
    next: usize,
    versions: [u64; RECORDS],
    updates: u64,
}

impl Store {
    fn new(link: Link) -> Self {
        Store { link, mem: None, started: false, next: 0, versions: [0; RECORDS], updates: 0 }
    }

    fn mem<P: Provider>(&self) -> Option<&Memory<P>> {
        self.mem.as_ref()?.downcast_ref()
    }

    fn put<P: Provider>(&mut self, r: usize, what: u64) {
        let Some(mem) = self.mem::<P>() else { return };
        let p = payload(r, self.versions[r]);
        let at = TABLE + r * RECORD;
        let res = match what {
            T_PAYLOAD => mem.write_at(at, &p),
            _ => mem.write_at(at + PAYLOAD, &fnv1a64(&p).to_le_bytes()),
        };
        if let Err(e) = res {
            self.link.report(Err(format!("writing record {r}: {e}")));
        }
    }
}

impl<P: Provider> Handler<P> for Store {
    fn poll(&mut self, cx: &mut Cx<P>) {
        if !self.started {
            self.started = true;
            match cx.register_memory(MEMORY, false) {
                Ok(m) => self.mem = Some(Box::new(m)),
                Err(e) => return self.link.report(Err(format!("registering memory: {e}"))),
            }
            for r in 0..RECORDS {
                self.put::<P>(r, T_PAYLOAD);
                self.put::<P>(r, T_CHECKSUM);
            }
            let _ = cx.set_timer(PERIOD, T_PAYLOAD);
        }
    }

    fn on_timer(&mut self, cx: &mut Cx<P>, token: u64) {
        let r = self.next;
        if token == T_PAYLOAD {
            self.versions[r] += 1;
            self.put::<P>(r, T_PAYLOAD);
            let _ = cx.set_timer(GAP, T_CHECKSUM);
        } else {
            self.put::<P>(r, T_CHECKSUM);
            self.updates += 1;
            self.next = (r + 7) % RECORDS;
            let _ = cx.set_timer(PERIOD - GAP, T_PAYLOAD);
        }
    }

    /// Grants the client the memory (reads and atomics: it never writes) and says where.
    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, _info: &ConnInfo) {
        let Some(mem) = self.mem::<P>() else { return };
        let rights = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
        let told = cx.grant(conn, mem, 0, MEMORY, rights).and_then(|g| {
            let mut b = cx.alloc(RemoteRegion::WIRE_BYTES)?;
            b.fill(&g.region.to_bytes())?;
            cx.send(conn, b, Some(GRANT_IMM), GRANT_TOKEN).map_err(|(_, e)| e)
        });
        match told {
            Ok(()) => println!(
                "one_sided server: accepted {conn}; granted {MEMORY} B (read, atomics); records \
                 are being updated in place"
            ),
            Err(e) => self.link.report(Err(format!("granting {conn} memory: {e}"))),
        }
    }

    fn on_closed(&mut self, _cx: &mut Cx<P>, conn: ConnId, reason: &CloseReason) {
        let Some(mem) = self.mem::<P>() else { return };
        let words = (mem.read_u64(SEQ_WORD as usize), mem.read_u64(LOCK_WORD as usize));
        self.link.report(match (reason, words) {
            (CloseReason::Error(s), _) => Err(format!("{conn} failed: {s}")),
            (_, (Ok(seq), Ok(lock))) => Ok(format!(
                "one_sided server: {conn} closed ({reason:?}); sequence word {seq}, lock word \
                 {lock}, {} record updates so far",
                self.updates
            )),
            (_, (Err(e), _) | (_, Err(e))) => Err(format!("reading the words: {e}")),
        });
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum Phase {
    #[default]
    Sequence,
    Lock(u8),
    Reads,
    Done,
}

/// Runs the sequencer, the lock and the optimistic reads against the server's region.
#[derive(Default)]
struct Reader {
    link: Link,
    count: u32,
    window: usize,
    asked: bool,
    conn: Option<ConnId>,
    peer: RemoteRegion,
    phase: Phase,
    issued: u32,
    /// Requests in flight: when each was issued, and the record of a read.
    pending: HashMap<u64, (Instant, usize)>,
    token: u64,
    seqs: (Option<u64>, Option<u64>),
    locks: u32,
    refused: u32,
    reads_ok: u32,
    retries: u64,
    streak: [u32; RECORDS],
    newest: [u64; RECORDS],
    lat: [Vec<Duration>; 3],
    error: Option<String>,
}

impl Reader {
    fn fail<P: Provider>(&mut self, cx: &mut Cx<P>, e: String) {
        self.error.get_or_insert(e);
        if let Some(c) = self.conn {
            let _ = cx.close(c);
        }
    }

    /// Reads record `r` again if `retry`, then issues what the phase allows: atomics or reads
    /// up to the window, one compare-and-swap at a time.
    fn issue<P: Provider>(&mut self, cx: &mut Cx<P>, retry: Option<usize>) {
        let Some(conn) = self.conn else { return };
        let mut retry = retry;
        while self.error.is_none() {
            let (room, p, t) = (self.pending.len() < self.window, self.peer, self.token + 1);
            // What to issue, for which record, and whether it is new (not a lock step or a retry).
            let (res, record, new) = match self.phase {
                Phase::Sequence if room && self.issued < self.count => {
                    (cx.fetch_add(conn, p.at(SEQ_WORD), 1, t), 0, true)
                }
                Phase::Lock(step) if self.pending.is_empty() => {
                    let (cmp, swap) = if step < 2 { (0, 1) } else { (1, 0) };
                    (cx.compare_swap(conn, p.at(LOCK_WORD), cmp, swap, t), 0, false)
                }
                Phase::Reads if retry.is_some() || (room && self.issued < self.count) => {
                    let (r, new) = match retry.take() {
                        Some(r) => (r, false),
                        None => (self.issued as usize % RECORDS, true),
                    };
                    match cx.alloc(RECORD) {
                        Ok(b) => (cx.read(conn, b, p.at((TABLE + r * RECORD) as u64), t), r, new),
                        Err(e) => return self.fail(cx, format!("a read buffer: {e}")),
                    }
                }
                _ => return,
            };
            if let Err((_, e)) = res {
                return self.fail(cx, format!("issuing in phase {:?}: {e}", self.phase));
            }
            self.token = t;
            self.pending.insert(t, (Instant::now(), record));
            self.issued += u32::from(new);
        }
    }

    /// Checks a completion; returns a record to read again, if one was caught mid-update.
    fn check(
        &mut self,
        done: &Done<Buf<impl Provider>>,
        record: usize,
    ) -> Result<Option<usize>, String> {
        let old = done.old_value;
        match (self.phase, done.kind) {
            (Phase::Sequence, OpKind::FetchAdd) => {
                let v = old.ok_or("no old value")?;
                if self.seqs.1.is_some_and(|last| v <= last) {
                    return Err(format!("sequence number {v} after {:?}", self.seqs.1));
                }
                self.seqs = (self.seqs.0.or(Some(v)), Some(v));
                if self.pending.is_empty() && self.issued == self.count {
                    (self.phase, self.issued) = (Phase::Lock(0), 0);
                }
            }
            (Phase::Lock(step), OpKind::CompareSwap) => {
                self.phase = match (step, old) {
                    (0, Some(0)) => Phase::Lock(1), // taken
                    (0, Some(1)) => Phase::Lock(0), // someone else holds it: try again
                    (1, Some(1)) => {
                        self.refused += 1; // a second take while held is refused
                        Phase::Lock(2)
                    }
                    (2, Some(1)) => {
                        self.locks += 1; // released
                        match self.locks < (self.count / 10).max(1) {
                            true => Phase::Lock(0),
                            false => Phase::Reads,
                        }
                    }
                    (s, o) => return Err(format!("lock step {s}: the word held {o:?}")),
                };
            }
            (Phase::Reads, OpKind::Read) => {
                let b = done.buf.as_ref().map_or(&[][..], |b| b.as_slice());
                if b.len() != RECORD {
                    return Err(format!("a read of {} bytes, {RECORD} expected", b.len()));
                }
                let (p, sum) = (&b[..PAYLOAD], u64_at(b, PAYLOAD));
                if fnv1a64(p) != sum {
                    self.retries += 1;
                    self.streak[record] += 1;
                    if self.streak[record] > 10_000 {
                        return Err(format!("record {record}: never consistent"));
                    }
                    return Ok(Some(record));
                }
                let version = u64_at(p, 8);
                if p != payload(record, version) || version < self.newest[record] {
                    return Err(format!("record {record}: checksum right, content wrong"));
                }
                (self.streak[record], self.newest[record]) = (0, version);
                self.reads_ok += 1;
                if self.reads_ok == self.count {
                    self.phase = Phase::Done;
                }
            }
            (ph, k) => return Err(format!("a {k:?} completion in phase {ph:?}")),
        }
        Ok(None)
    }
}

impl<P: Provider> Handler<P> for Reader {
    fn poll(&mut self, cx: &mut Cx<P>) {
        self.link.connect_once(&mut self.asked, cx, b"one_sided client");
    }

    fn on_connect_failed(
        &mut self,
        _cx: &mut Cx<P>,
        _token: u64,
        error: &corelink_engine::EngineError,
    ) {
        self.link.connect_failed(error);
    }

    fn on_connected(&mut self, _cx: &mut Cx<P>, conn: ConnId, _info: &ConnInfo) {
        self.conn = Some(conn); // it starts once the server's grant arrives
    }

    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        let grant = (msg.imm == Some(GRANT_IMM)).then(|| RemoteRegion::from_bytes(msg.data));
        match grant.flatten() {
            Some(r) if r.len as usize >= MEMORY => {
                println!(
                    "one_sided client: connected ({conn}), granted {} B of the server's",
                    r.len
                );
                self.peer = r;
                self.issue(cx, None);
            }
            r => self.fail(cx, format!("not a usable grant ({r:?})")),
        }
    }

    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        let Some((at, record)) = self.pending.remove(&done.token) else { return };
        if !done.status.is_success() {
            return self.fail(cx, format!("{:?}: {}", done.kind, done.status));
        }
        let kind = match done.kind {
            OpKind::FetchAdd => 0,
            OpKind::CompareSwap => 1,
            _ => 2,
        };
        self.lat[kind].push(at.elapsed());
        match self.check(&done, record) {
            Err(e) => self.fail(cx, e),
            Ok(_) if self.phase == Phase::Done => {
                if let Some(c) = self.conn {
                    let _ = cx.close(c);
                }
            }
            Ok(retry) => self.issue(cx, retry),
        }
    }

    fn on_closed(&mut self, _cx: &mut Cx<P>, conn: ConnId, reason: &CloseReason) {
        if let Some(e) =
            self.error.take().or((self.phase != Phase::Done).then(|| format!("{reason:?}")))
        {
            return self.link.report(Err(format!("{conn} closed early: {e}")));
        }
        let (n, [faa, cas, rd]) = (self.count, &mut self.lat);
        let (first, last) = (self.seqs.0.unwrap_or(0), self.seqs.1.unwrap_or(0));
        let v = self.newest.iter().max().copied().unwrap_or(0);
        self.link.report(Ok(format!(
            "one_sided client: sequencer: {n} fetch-and-adds, numbers {first}..={last} strictly \
             increasing; {}\none_sided client: lock: {} take/release pairs by compare-and-swap, \
             {} takes refused while held; {}\none_sided client: records: {n} reads of {RECORD} B \
             records consistent, {} retries (checksum mismatch: an update caught mid-way), \
             newest version seen {v}; {}",
            latency(faa),
            self.locks,
            self.refused,
            latency(cas),
            self.retries,
            latency(rd)
        )));
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let (count, window) = (cli.common.count, cli.common.window as usize);
    engine_common::main("one_sided", &cli.common, Store::new, move |link| Reader {
        link,
        count,
        window,
        ..Reader::default()
    })
}
