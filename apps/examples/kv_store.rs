//! A key-value store on the RPC layer: `put`, `get` and `delete` as typed RPCs, and a `get`
//! that first reads the value with one RDMA read and checks it (the optimistic read), falling
//! back to the `get` RPC when the check fails. Concurrent writers show that a torn read is
//! caught (counted) and never returned.
//!
//! ```text
//! kv_store [both] [--count N]                             # one process, soft
//! kv_store server ADDR [--provider soft|ibverbs] [--config MAP.toml] [--clients N]
//! kv_store client ADDR [--count N] [--provider soft|ibverbs]
//! ```
//!
//! The server keeps its table in memory registered with its worker: `SLOTS` slots of `SLOT`
//! bytes, each a version word (odd while the slot is being written), the key, the value's
//! length, a flag word (occupied), the value, and the FNV-1a 64 checksum of all of them
//! (version included; FNV is a few instructions per byte and needs no crate, which suits a
//! check against torn reads: it is not a defence against anyone forging a slot). A key lives
//! in slot `fnv(key) % SLOTS`, unless another key has it: then only in the server's map, and
//! `get` finds it by RPC. The server answers every RPC from its map, which is the truth; the
//! table is what one-sided readers see. The `hello` RPC answers where the table is (the
//! session's read-only grant, `Cx::grant`, made when the session was accepted) and its layout.
//!
//! A slot is written in two steps, as an in-place writer does: the `put` handler makes the
//! version odd and writes the first half; `GAP` later the server writes the rest, the
//! checksum and the even version. A reader's RDMA read that lands in between sees an odd
//! version or a checksum that does not match (on `soft`, the server's writes and the client
//! worker's read run on two threads at once; on a NIC, the NIC reads while the CPU writes).
//!
//! The client checks a put-then-get round for each of 32 keys (exact values), deletes some
//! and checks they are gone, then runs 2 writer and 3 reader threads on 4 hot keys: writers
//! `put` `--count` values each, every value self-consistent (the key, then `n` bytes all equal
//! to a generation number, `n` a function of it); readers `get` them meanwhile and check each
//! value returned. It prints the one-sided hits, the torn reads caught (odd version, checksum
//! mismatch) and the RPC fallbacks. Exit status: 0 when every check held, 1 if one did not
//! (a torn value returned, a wrong value), 2 on bad usage.

#[allow(dead_code)] // its command line and core map; not its handler pair
mod engine_common;
#[allow(dead_code)] // each RPC example uses part of it
mod rpc_common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use corelink_engine::verbs::{AccessFlags, Provider, RemoteAddr, RemoteRegion};
use corelink_engine::Memory;
use corelink_rpc::{Endpoint, EndpointConfig, Handle, Method, Reject, ReqType, Rpc, SessionId};
use engine_common::{Common, Fail, Role};
use rpc_common::{fnv1a64, rpc_fail, Ends, Example, OneSided, Serving, FNV_SEED};
use serde::{Deserialize, Serialize};

/// Slots in the table, and bytes per slot.
const SLOTS: usize = 256;
const SLOT: usize = 256;
/// Where a slot's fields are: version, key, length, flags, value, checksum.
const KEY_AT: usize = 8;
const LEN_AT: usize = 16;
const FLAGS_AT: usize = 20;
const VALUE_AT: usize = 24;
const SUM_AT: usize = SLOT - 8;
/// The longest value.
const VALUE_MAX: usize = SUM_AT - VALUE_AT;
/// The first write step ends here (half the value).
const MID: usize = VALUE_AT + VALUE_MAX / 2;
/// The occupied flag.
const OCCUPIED: u32 = 1;
/// How long a slot stays half-written.
const GAP: Duration = Duration::from_micros(100);
/// A deadline no call here reaches unless something is broken.
const CALL: Duration = Duration::from_secs(10);
/// Reject codes.
const NOT_READY: u32 = 1;
const TOO_LONG: u32 = 2;
const NO_GRANT: u32 = 3;

/// Where the table is, as `hello` answers.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct TableInfo {
    addr: u64,
    rkey: u32,
    slots: u32,
    slot: u32,
}

struct Hello;
impl Method for Hello {
    const TYPE: ReqType = ReqType(1);
    type Request<'a> = ();
    type Response<'a> = TableInfo;
}
struct Put;
impl Method for Put {
    const TYPE: ReqType = ReqType(2);
    /// The key and the value, read in place by the server (borrowed: no copy until it is
    /// stored).
    type Request<'a> = (u64, &'a [u8]);
    type Response<'a> = ();
}
struct Get;
impl Method for Get {
    const TYPE: ReqType = ReqType(3);
    type Request<'a> = u64;
    type Response<'a> = Option<Vec<u8>>;
}
struct Delete;
impl Method for Delete {
    const TYPE: ReqType = ReqType(4);
    type Request<'a> = u64;
    /// Whether the key was there.
    type Response<'a> = bool;
}

#[derive(Parser, Debug)]
#[command(name = "kv_store", about = "A key-value store with optimistic one-sided reads")]
struct Cli {
    #[command(flatten)]
    common: Common,
}

fn slot_of(key: u64, slots: usize) -> usize {
    (fnv1a64(FNV_SEED, &key.to_le_bytes()) % slots as u64) as usize
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// A slot's image at `version` (even): `key` and `value`, or empty.
fn image(version: u64, entry: Option<(u64, &[u8])>) -> [u8; SLOT] {
    let mut s = [0u8; SLOT];
    s[..8].copy_from_slice(&version.to_le_bytes());
    let len = match entry {
        Some((key, value)) => {
            s[KEY_AT..KEY_AT + 8].copy_from_slice(&key.to_le_bytes());
            s[LEN_AT..LEN_AT + 4].copy_from_slice(&(value.len() as u32).to_le_bytes());
            s[FLAGS_AT..FLAGS_AT + 4].copy_from_slice(&OCCUPIED.to_le_bytes());
            s[VALUE_AT..VALUE_AT + value.len()].copy_from_slice(value);
            value.len()
        }
        None => 0,
    };
    let sum = fnv1a64(FNV_SEED, &s[..VALUE_AT + len]);
    s[SUM_AT..].copy_from_slice(&sum.to_le_bytes());
    s
}

/// What a one-sided read of a slot found.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// The key's value, checked.
    Value(Vec<u8>),
    /// A consistent slot that does not hold the key (empty, or another key's).
    Elsewhere,
    /// Caught mid-write: the version is odd.
    Odd,
    /// Caught mid-write: the checksum does not match.
    Torn,
}

fn inspect(b: &[u8], key: u64) -> Seen {
    if b.len() != SLOT {
        return Seen::Torn;
    }
    if u64_at(b, 0) % 2 == 1 {
        return Seen::Odd;
    }
    let len = u32_at(b, LEN_AT) as usize;
    if len > VALUE_MAX || fnv1a64(FNV_SEED, &b[..VALUE_AT + len]) != u64_at(b, SUM_AT) {
        return Seen::Torn;
    }
    if u32_at(b, FLAGS_AT) & OCCUPIED == 0 || u64_at(b, KEY_AT) != key {
        return Seen::Elsewhere;
    }
    Seen::Value(b[VALUE_AT..VALUE_AT + len].to_vec())
}

/// A self-consistent value of `key` at generation `generation`: the key, then `n` bytes equal
/// to the generation, `n` a function of it.
fn value(key: u64, generation: u8) -> Vec<u8> {
    let n = 8 + usize::from(generation) * 37 % (VALUE_MAX - 16);
    let mut v = key.to_le_bytes().to_vec();
    v.resize(8 + n, generation);
    v
}

fn consistent(key: u64, v: &[u8]) -> bool {
    v.len() > 8 && v[..8] == key.to_le_bytes() && v == value(key, v[8])
}

/// The server's counters, for its summary.
#[derive(Default)]
struct Counts {
    puts: AtomicU64,
    gets: AtomicU64,
    deletes: AtomicU64,
    slot_writes: AtomicU64,
    outside: AtomicU64,
}

/// The server's state on its worker: the table, the map (the truth), the grants.
struct Store<P: Provider> {
    mem: Option<Memory<P>>,
    map: HashMap<u64, Vec<u8>>,
    /// The key each slot publishes.
    owner: Vec<Option<u64>>,
    versions: Vec<u64>,
    /// Slots half-written: the slot, its final image, when the first step went.
    pending: Vec<(usize, [u8; SLOT], Instant)>,
    grants: HashMap<SessionId, RemoteRegion>,
    counts: Arc<Counts>,
}

impl<P: Provider> Store<P> {
    fn write(&self, at: usize, bytes: &[u8]) {
        if let Some(mem) = &self.mem {
            // In bounds: the table is SLOTS * SLOT bytes and `at` is within a slot.
            let _ = mem.write_at(at, bytes);
        }
    }

    /// Republishes `slot` from the map: the version odd and the first half now, the rest at
    /// `finish`. A slot still half-written is finished first.
    fn begin(&mut self, slot: usize) {
        if let Some(i) = self.pending.iter().position(|p| p.0 == slot) {
            self.finish(i);
        }
        self.versions[slot] += 2;
        let entry = self.owner[slot].and_then(|k| self.map.get(&k).map(|v| (k, v.as_slice())));
        let img = image(self.versions[slot], entry);
        let at = slot * SLOT;
        self.write(at, &(self.versions[slot] - 1).to_le_bytes());
        self.write(at + KEY_AT, &img[KEY_AT..MID]);
        self.pending.push((slot, img, Instant::now()));
        self.counts.slot_writes.fetch_add(1, Relaxed);
    }

    /// The second step of pending write `i`: the rest, the checksum, the even version.
    fn finish(&mut self, i: usize) {
        let (slot, img, _) = self.pending.swap_remove(i);
        let at = slot * SLOT;
        self.write(at + MID, &img[MID..]);
        self.write(at, &img[..8]);
    }

    fn put(&mut self, key: u64, value: &[u8]) -> Result<(), Reject> {
        if value.len() > VALUE_MAX {
            return Err(Reject(TOO_LONG));
        }
        if self.mem.is_none() {
            return Err(Reject(NOT_READY));
        }
        self.counts.puts.fetch_add(1, Relaxed);
        // (an existing key's vector is reused)
        let kept = self.map.entry(key).or_default();
        kept.clear();
        kept.extend_from_slice(value);
        let slot = slot_of(key, SLOTS);
        if self.owner[slot].is_none_or(|k| k == key) {
            self.owner[slot] = Some(key);
            self.begin(slot);
        } else {
            self.counts.outside.fetch_add(1, Relaxed);
        }
        Ok(())
    }

    fn delete(&mut self, key: u64) -> bool {
        self.counts.deletes.fetch_add(1, Relaxed);
        let was = self.map.remove(&key).is_some();
        let slot = slot_of(key, SLOTS);
        if self.owner[slot] == Some(key) {
            self.owner[slot] = None;
            self.begin(slot);
        }
        was
    }
}

/// The server part: the table's memory, the grants, the second write steps.
struct KvServer<P: Provider>(Rc<RefCell<Store<P>>>);

impl<P: Provider> KvServer<P> {
    fn ensure_memory(&self, rpc: &mut Rpc<'_, P>) {
        let mut s = self.0.borrow_mut();
        if s.mem.is_some() {
            return;
        }
        match rpc.cx().register_memory(SLOTS * SLOT, false) {
            Ok(m) => {
                for slot in 0..SLOTS {
                    let _ = m.write_at(slot * SLOT, &image(0, None));
                }
                s.mem = Some(m);
            }
            Err(e) => eprintln!("kv_store server: registering the table: {e}"),
        }
    }
}

impl<P: Provider> Serving<P> for KvServer<P> {
    fn poll(&mut self, rpc: &mut Rpc<'_, P>) {
        self.ensure_memory(rpc);
        let mut s = self.0.borrow_mut();
        if s.pending.is_empty() {
            return;
        }
        let now = Instant::now();
        while let Some(i) = s.pending.iter().position(|p| now - p.2 >= GAP) {
            s.finish(i);
        }
    }

    fn accepted(&mut self, rpc: &mut Rpc<'_, P>, session: SessionId) {
        self.ensure_memory(rpc);
        let mut s = self.0.borrow_mut();
        let (Some(mem), Some(conn)) = (s.mem.as_ref(), rpc.conn(session)) else { return };
        match rpc.cx().grant(conn, mem, 0, SLOTS * SLOT, AccessFlags::REMOTE_READ) {
            Ok(g) => {
                s.grants.insert(session, g.region);
            }
            Err(e) => eprintln!("kv_store server: granting {conn} the table: {e}"),
        }
    }

    fn closed(&mut self, _rpc: &mut Rpc<'_, P>, session: SessionId) {
        self.0.borrow_mut().grants.remove(&session);
    }
}

/// The server's endpoint: the four methods on one store.
fn server_endpoint<P: Provider>(
    res: &corelink_config::WorkerResources,
    counts: Arc<Counts>,
) -> corelink_rpc::Result<(Endpoint<P>, KvServer<P>)> {
    let mut ep = Endpoint::new(EndpointConfig::for_worker(res), res)?;
    let store = Rc::new(RefCell::new(Store {
        mem: None,
        map: HashMap::new(),
        owner: vec![None; SLOTS],
        versions: vec![0; SLOTS],
        pending: Vec::new(),
        grants: HashMap::new(),
        counts,
    }));
    let s = store.clone();
    ep.register_method::<Hello>(move |req, ()| {
        let s = s.borrow();
        let g = s.grants.get(&req.session).ok_or(Reject(NO_GRANT))?;
        Ok(TableInfo { addr: g.addr, rkey: g.rkey, slots: SLOTS as u32, slot: SLOT as u32 })
    })?;
    let s = store.clone();
    ep.register_method::<Put>(move |_, (key, value)| s.borrow_mut().put(key, value))?;
    let s = store.clone();
    ep.register_method::<Get>(move |_, key| {
        let s = s.borrow();
        s.counts.gets.fetch_add(1, Relaxed);
        Ok(s.map.get(&key).cloned())
    })?;
    let s = store.clone();
    ep.register_method::<Delete>(move |_, key| Ok(s.borrow_mut().delete(key)))?;
    Ok((ep, KvServer(store)))
}

/// How a client's gets went.
#[derive(Default, Clone, Copy)]
struct Stats {
    gets: u64,
    hits: u64,
    odd: u64,
    torn: u64,
    elsewhere: u64,
    fallbacks: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.gets += o.gets;
        self.hits += o.hits;
        self.odd += o.odd;
        self.torn += o.torn;
        self.elsewhere += o.elsewhere;
        self.fallbacks += o.fallbacks;
    }
}

/// A client thread's way to the store.
struct Kv {
    rpc: Handle,
    os: OneSided,
    /// Why sessions ended, for the failures.
    ends: Ends,
    session: SessionId,
    table: TableInfo,
    stats: Stats,
}

impl Kv {
    fn new(rpc: Handle, os: OneSided, ends: &Ends, session: SessionId, table: TableInfo) -> Kv {
        Kv { rpc, os, ends: ends.clone(), session, table, stats: Stats::default() }
    }

    fn put(&mut self, key: u64, v: Vec<u8>) -> Result<(), Fail> {
        let fail = self.ends.fail("put", self.session);
        self.rpc.call_method::<Put>(self.session, &(key, &v[..]), CALL).map_err(fail)
    }

    fn delete(&mut self, key: u64) -> Result<bool, Fail> {
        let fail = self.ends.fail("delete", self.session);
        self.rpc.call_method::<Delete>(self.session, &key, CALL).map_err(fail)
    }

    /// One RDMA read of the key's slot, checked; the `get` RPC if the check fails.
    fn get(&mut self, key: u64) -> Result<Option<Vec<u8>>, Fail> {
        self.stats.gets += 1;
        let slot = slot_of(key, self.table.slots as usize) as u64;
        let at = RemoteAddr {
            addr: self.table.addr + slot * u64::from(self.table.slot),
            rkey: self.table.rkey,
        };
        let bytes = self
            .os
            .read(self.session, at, self.table.slot as usize)
            .map_err(|e| Fail::Run(format!("reading slot {slot}: {e}")))?;
        match inspect(&bytes, key) {
            Seen::Value(v) => {
                self.stats.hits += 1;
                return Ok(Some(v));
            }
            Seen::Odd => self.stats.odd += 1,
            Seen::Torn => self.stats.torn += 1,
            Seen::Elsewhere => self.stats.elsewhere += 1,
        }
        self.stats.fallbacks += 1;
        let fail = self.ends.fail("get", self.session);
        self.rpc.call_method::<Get>(self.session, &key, CALL).map_err(fail)
    }
}

const WRITERS: usize = 2;
const READERS: usize = 3;
const HOT: [u64; 4] = [1001, 1002, 1003, 1004];

/// The client: the put/get/delete round, then writers against readers.
fn client<P: Provider>(a: &Common, addr: SocketAddr) -> Result<(), Fail> {
    let cfg = rpc_common::map(a, None)?;
    let mut c = rpc_common::start::<P, _>("kv_store client", &cfg, 1 + WRITERS + READERS, |res| {
        Ok((Endpoint::new(EndpointConfig::for_worker(res), res)?, rpc_common::NoServer))
    })?;
    println!("kv_store client: connecting to {addr} ({})", P::NAME);
    let res = (|| {
        let mut h = c.handles.remove(0);
        let session = h.connect(addr).map_err(rpc_fail("connect"))?;
        let table =
            h.call_method::<Hello>(session, &(), CALL).map_err(c.ends.fail("hello", session))?;
        if table.slot as usize != SLOT {
            return Err(Fail::Run(format!("a slot of {} B, {SLOT} expected", table.slot)));
        }
        println!(
            "kv_store client: table at {:#x} (rkey {:#x}): {} slots of {} B, read-only",
            table.addr, table.rkey, table.slots, table.slot
        );
        let mut kv = Kv::new(h, c.one_sided.another(), &c.ends, session, table);
        let basic = round(&mut kv)?;
        let stress = torn_reads(&mut c.handles, &c.one_sided, &c.ends, session, table, a.count)?;
        kv.rpc.close(session).map_err(c.ends.fail("close", session))?;
        println!("{basic}\n{stress}");
        Ok(())
    })();
    c.shutdown()?;
    res
}

/// The check itself, on slots made here: a slot whose halves are two values' (a read that
/// overtook a writer between its steps, the version word already even) fails the checksum; an
/// odd version fails; an intact slot passes.
fn check_the_check() -> Result<(), Fail> {
    let (a, b) = (image(4, Some((9, &value(9, 1)))), image(4, Some((9, &value(9, 2)))));
    let mut spliced = a;
    spliced[MID..].copy_from_slice(&b[MID..]);
    let mut odd = b;
    odd[..8].copy_from_slice(&5u64.to_le_bytes());
    match (inspect(&spliced, 9), inspect(&odd, 9), inspect(&a, 9)) {
        (Seen::Torn, Seen::Odd, Seen::Value(v)) if v == value(9, 1) => Ok(()),
        got => Err(Fail::Run(format!("the slot check is wrong: {got:?}"))),
    }
}

/// Puts, gets (exact values), deletes.
fn round(kv: &mut Kv) -> Result<String, Fail> {
    check_the_check()?;
    let keys: Vec<u64> = (0..32).collect();
    for &k in &keys {
        kv.put(k, value(k, (k % 200) as u8 + 1))?;
    }
    for &k in &keys {
        let want = value(k, (k % 200) as u8 + 1);
        match kv.get(k)? {
            Some(v) if v == want => {}
            got => return Err(Fail::Run(format!("get {k}: {got:?}, {want:?} expected"))),
        }
    }
    let mut deleted = 0;
    for k in keys.iter().copied().filter(|k| k % 4 == 0) {
        if !kv.delete(k)? {
            return Err(Fail::Run(format!("delete {k}: it was not there")));
        }
        deleted += 1;
    }
    for &k in &keys {
        let got = kv.get(k)?;
        let ok = match k % 4 {
            0 => got.is_none(),
            _ => got == Some(value(k, (k % 200) as u8 + 1)),
        };
        if !ok {
            return Err(Fail::Run(format!("get {k} after the deletes: {got:?}")));
        }
    }
    if let Some(v) = kv.get(1 << 40)? {
        return Err(Fail::Run(format!("a key never put has a value: {v:?}")));
    }
    let s = kv.stats;
    Ok(format!(
        "kv_store client: round: {} puts, {} gets all exact ({} by one RDMA read, {} by RPC: \
         {} keys not in their slot), {deleted} deletes (gone after); the slot check refuses \
         a spliced slot (checksum) and an odd version",
        keys.len(),
        s.gets,
        s.hits,
        s.fallbacks,
        s.elsewhere
    ))
}

/// `WRITERS` threads put `count` self-consistent values each on the hot keys while `READERS`
/// threads get them: every value returned must be self-consistent.
fn torn_reads(
    handles: &mut Vec<Handle>,
    os: &OneSided,
    ends: &Ends,
    session: SessionId,
    table: TableInfo,
    count: u32,
) -> Result<String, Fail> {
    let mut first = Kv::new(handles.remove(0), os.another(), ends, session, table);
    for &k in &HOT {
        first.put(k, value(k, 0))?;
    }
    handles.insert(0, first.rpc);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for (i, h) in handles.drain(..).enumerate() {
        let mut kv = Kv::new(h, os.another(), ends, session, table);
        let stop = stop.clone();
        if i < WRITERS {
            writers.push(std::thread::spawn(move || -> Result<u64, Fail> {
                for n in 0..u64::from(count) {
                    let key = HOT[(n as usize + i) % HOT.len()];
                    let generation = ((n * WRITERS as u64 + i as u64) % 250 + 1) as u8;
                    kv.put(key, value(key, generation))?;
                }
                Ok(u64::from(count))
            }));
        } else {
            readers.push(std::thread::spawn(move || -> Result<Stats, Fail> {
                let mut n = i;
                while !stop.load(Relaxed) {
                    let key = HOT[n % HOT.len()];
                    n += 1;
                    match kv.get(key)? {
                        Some(v) if consistent(key, &v) => {}
                        got => {
                            return Err(Fail::Run(format!(
                                "get {key} returned an inconsistent value: {got:?}"
                            )))
                        }
                    }
                }
                Ok(kv.stats)
            }));
        }
    }
    let mut errors = Vec::new();
    let mut puts = 0;
    for w in writers {
        match w.join() {
            Ok(Ok(n)) => puts += n,
            Ok(Err(Fail::Run(e) | Fail::Usage(e))) => errors.push(e),
            Err(_) => errors.push("a writer panicked".into()),
        }
    }
    stop.store(true, Relaxed);
    let mut s = Stats::default();
    for r in readers {
        match r.join() {
            Ok(Ok(st)) => s.add(&st),
            Ok(Err(Fail::Run(e) | Fail::Usage(e))) => errors.push(e),
            Err(_) => errors.push("a reader panicked".into()),
        }
    }
    if !errors.is_empty() {
        return Err(Fail::Run(errors.join("; ")));
    }
    let ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(format!(
        "kv_store client: torn reads: {WRITERS} writers, {READERS} readers, {puts} puts and {} \
         gets in {ms:.0} ms, every value returned self-consistent: {} one-sided hits, {} torn \
         reads caught ({} odd version, {} checksum mismatch), {} fallbacks to the get RPC",
        s.gets,
        s.hits,
        s.odd + s.torn,
        s.odd,
        s.torn,
        s.fallbacks
    ))
}

/// Serves until `clients` sessions have closed, then says what it did.
fn finish_server<P: Provider>(
    s: rpc_common::Started<P>,
    counts: &Counts,
    clients: u32,
    timeout: Duration,
) -> Result<(), Fail> {
    let waited = s.wait_closed(clients, timeout);
    let l = |c: &AtomicU64| c.load(Relaxed);
    println!(
        "kv_store server: {} puts, {} gets, {} deletes by RPC; {} slot writes (two steps each), \
         {} puts of keys whose slot another key holds (RPC only)",
        l(&counts.puts),
        l(&counts.gets),
        l(&counts.deletes),
        l(&counts.slot_writes),
        l(&counts.outside)
    );
    s.shutdown()?;
    waited
}

struct Kvs;

impl Example for Kvs {
    fn run<P: Provider>(&self, role: Role, a: &Common, addr: SocketAddr) -> Result<(), Fail> {
        let timeout = Duration::from_secs(a.timeout);
        match role {
            Role::Server => {
                let (s, counts) =
                    rpc_common::start_server("kv_store server", a, addr, server_endpoint::<P>)?;
                finish_server(s, &counts, a.clients, timeout)
            }
            Role::Client => client::<P>(a, addr),
            Role::Both => {
                let (s, counts) =
                    rpc_common::start_server("kv_store server", a, addr, server_endpoint::<P>)?;
                let c = client::<P>(a, addr);
                let wait = if c.is_ok() { timeout } else { Duration::ZERO };
                c.and(finish_server(s, &counts, 1, wait))
            }
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    rpc_common::main("kv_store", &cli.common, SocketAddr::from(([10, 99, 21, 1], 7000)), &Kvs)
}
