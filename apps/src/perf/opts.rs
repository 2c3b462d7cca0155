//! What a `corelink-perf` run is asked to do, and the checks that turn forbidden or not yet
//! supported combinations into clear errors before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// perftest's default TCP port, used when `SERVER_ADDR` has none.
pub const DEFAULT_PORT: u16 = 18515;

/// Requests a `*_bw` test keeps in flight by default (perftest's TX depth).
pub const DEFAULT_TX_DEPTH: usize = 128;

/// Bytes a `*_bw` test keeps in flight at most (the window shrinks for large messages so that
/// the registered pools stay small).
pub const MAX_BYTES_IN_FLIGHT: usize = 16 << 20;

/// Receives the engine keeps posted per connection: a `send_bw` window never exceeds it (more
/// would only meet receiver-not-ready retries).
pub const SEND_WINDOW: usize = corelink_engine::tunables::RECVS_PER_CONN;

/// The raw baselines (`corelink-perf baseline raw_TEST`): each test but the RPC ones as a
/// verbs loop on RC, no engine (`raw_write` is `write_bw`'s).
pub const RAW_BASELINES: &str = "raw_write, raw_write_lat, raw_read_bw, raw_read_lat, \
     raw_send_bw, raw_send_lat, raw_atomic_bw, raw_atomic_lat";

/// The largest one-sided message: the memory each side of an engine run registers and grants
/// its peer (`corelink-perf` exposes 1 MiB; the engine itself grants any size).
pub const MAX_ONE_SIDED: usize = 1 << 20;

/// The eight tests of perftest, and the two of the RPC layer (`rpc_lat`, `rpc_bw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Test {
    /// RDMA write bandwidth.
    WriteBw,
    /// RDMA write ping-pong latency (write-with-immediate; one-way).
    WriteLat,
    /// RDMA read bandwidth.
    ReadBw,
    /// RDMA read latency (full round trip).
    ReadLat,
    /// Send bandwidth.
    SendBw,
    /// Send ping-pong latency (one-way).
    SendLat,
    /// Fetch-and-add bandwidth.
    AtomicBw,
    /// Fetch-and-add latency (full round trip).
    AtomicLat,
    /// `send_lat` through corelink-rpc: one echo call at a time (one-way, half the round
    /// trip, as `send_lat`).
    RpcLat,
    /// `send_bw` through corelink-rpc: a window of calls in flight, each answered with an
    /// empty response; the message rate counts calls.
    RpcBw,
}

/// What a test's requests are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// RDMA write.
    Write,
    /// RDMA read.
    Read,
    /// Send.
    Send,
    /// Atomic (fetch-and-add).
    Atomic,
}

impl Test {
    /// Every test, in the order of the usage text.
    pub const ALL: [Test; 8] = [
        Test::WriteBw,
        Test::WriteLat,
        Test::ReadBw,
        Test::ReadLat,
        Test::SendBw,
        Test::SendLat,
        Test::AtomicBw,
        Test::AtomicLat,
    ];

    /// The RPC layer's tests (on the engine only; not in [`Test::ALL`], perftest's eight).
    pub const RPC: [Test; 2] = [Test::RpcLat, Test::RpcBw];

    /// A test of the RPC layer?
    pub fn is_rpc(self) -> bool {
        matches!(self, Test::RpcLat | Test::RpcBw)
    }

    /// The engine's test an RPC test is measured beside (`send_lat`, `send_bw`).
    pub fn send_counterpart(self) -> Option<Test> {
        match self {
            Test::RpcLat => Some(Test::SendLat),
            Test::RpcBw => Some(Test::SendBw),
            _ => None,
        }
    }

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write_bw",
            Test::WriteLat => "write_lat",
            Test::ReadBw => "read_bw",
            Test::ReadLat => "read_lat",
            Test::SendBw => "send_bw",
            Test::SendLat => "send_lat",
            Test::AtomicBw => "atomic_bw",
            Test::AtomicLat => "atomic_lat",
            Test::RpcLat => "rpc_lat",
            Test::RpcBw => "rpc_bw",
        }
    }

    /// The test called `name`.
    pub fn from_name(name: &str) -> Option<Test> {
        Test::ALL.into_iter().chain(Test::RPC).find(|t| t.name() == name)
    }

    /// A latency test (one request in flight, each timed)?
    pub fn is_lat(self) -> bool {
        matches!(
            self,
            Test::WriteLat | Test::ReadLat | Test::SendLat | Test::AtomicLat | Test::RpcLat
        )
    }

    /// The kind of request.
    pub fn verb(self) -> Verb {
        match self {
            Test::WriteBw | Test::WriteLat => Verb::Write,
            Test::ReadBw | Test::ReadLat => Verb::Read,
            Test::SendBw | Test::SendLat | Test::RpcBw | Test::RpcLat => Verb::Send,
            Test::AtomicBw | Test::AtomicLat => Verb::Atomic,
        }
    }

    /// What a latency sample (a round trip) is divided by: 2 for the ping-pongs (`send_lat`,
    /// `write_lat`: perftest reports half the round trip), 1 for `read_lat` and `atomic_lat`
    /// (perftest reports their full round trip).
    pub fn lat_divisor(self) -> f64 {
        match self.verb() {
            Verb::Send | Verb::Write => 2.0,
            Verb::Read | Verb::Atomic => 1.0,
        }
    }

    /// perftest's title for the header block.
    pub fn title(self) -> &'static str {
        match self {
            Test::WriteBw => "RDMA_Write BW Test",
            Test::WriteLat => "RDMA_Write Latency Test (write-with-immediate ping-pong)",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::ReadLat => "RDMA_Read Latency Test",
            Test::SendBw => "Send BW Test",
            Test::SendLat => "Send Latency Test",
            Test::AtomicBw => "Atomic FETCH_AND_ADD BW Test",
            Test::AtomicLat => "Atomic FETCH_AND_ADD Latency Test",
            Test::RpcLat => "RPC Latency Test (corelink-rpc echo calls)",
            Test::RpcBw => "RPC BW Test (corelink-rpc calls, empty responses)",
        }
    }

    /// A one-byte code for the connection's private data.
    pub fn code(self) -> u8 {
        Test::ALL.iter().chain(&Test::RPC).position(|&t| t == self).unwrap_or(0) as u8
    }

    /// The test with code `c`.
    pub fn from_code(c: u8) -> Option<Test> {
        Test::ALL.iter().chain(&Test::RPC).nth(c as usize).copied()
    }
}

/// Transport (`-c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Reliable connection.
    Rc,
    /// Unreliable connection.
    Uc,
    /// Unreliable datagram.
    Ud,
}

impl Transport {
    /// `RC`, `UC` or `UD`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Ud => "UD",
        }
    }

    /// Parses `-c`'s value (any case).
    pub fn parse(s: &str) -> Option<Transport> {
        match s.to_ascii_uppercase().as_str() {
            "RC" => Some(Transport::Rc),
            "UC" => Some(Transport::Uc),
            "UD" => Some(Transport::Ud),
            _ => None,
        }
    }
}

/// Provider (`--provider`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prov {
    /// The in-process software provider.
    Soft,
    /// libibverbs / librdmacm.
    Ibverbs,
}

impl Prov {
    /// `soft` or `ibverbs`.
    pub fn name(self) -> &'static str {
        match self {
            Prov::Soft => "soft",
            Prov::Ibverbs => "ibverbs",
        }
    }
}

/// Which part of the exchange this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Accept a client and serve it until it disconnects.
    Server,
    /// Connect to a server and run the test.
    Client(SocketAddr),
    /// Both, on one engine connected to itself.
    Loopback,
}

/// How a run fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PerfError {
    /// Bad usage, including what verbs forbids (exit 2).
    Usage(String),
    /// Something the engine cannot do yet (exit 2).
    Unsupported(String),
    /// A failure at run time (exit 1).
    Run(String),
}

impl std::fmt::Display for PerfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PerfError::Usage(m) => write!(f, "{m}"),
            PerfError::Unsupported(m) => write!(f, "not supported yet: {m}"),
            PerfError::Run(m) => write!(f, "FAILED: {m}"),
        }
    }
}

impl std::error::Error for PerfError {}

/// A whole `corelink-perf TEST` run.
#[derive(Debug, Clone)]
pub struct PerfOpts {
    /// The test.
    pub test: Test,
    /// `-c`.
    pub transport: Transport,
    /// Message sizes (`-s`, or `-a`'s).
    pub sizes: Vec<usize>,
    /// `-n`: iterations per size (ignored with `duration`).
    pub iters: u64,
    /// `-D`: run each size this long instead.
    pub duration: Option<Duration>,
    /// `-q`: queue pairs per worker.
    pub qps: u32,
    /// `-l`: requests per doorbell.
    pub post_list: u32,
    /// `-Q`: completions per signalled request.
    pub cq_mod: u32,
    /// `-I`: inline bytes (the core map's `worker.max_inline`).
    pub inline: Option<u32>,
    /// `--use-srq`.
    pub use_srq: bool,
    /// `-t`: requests a `*_bw` test keeps in flight.
    pub tx_depth: usize,
    /// `-d`.
    pub device: Option<String>,
    /// `-i`.
    pub port: Option<u8>,
    /// `-x`.
    pub gid_index: Option<u32>,
    /// `--provider` (default: the core map's, else `soft`).
    pub provider: Option<Prov>,
    /// `--config`.
    pub config: Option<PathBuf>,
    /// `-T`: workers, each running one client (and, in loopback, serving one).
    pub workers: usize,
    /// Server, client or loopback.
    pub role: Role,
    /// Server: where to listen (the port is `-p`'s).
    pub bind: Option<SocketAddr>,
    /// Give up after this long (`None`: never; a server waits for its client indefinitely).
    pub timeout: Option<Duration>,
    /// Print a progress line per size to stderr.
    pub progress: bool,
    /// The engine's scheduler knobs (`--flat`, `--no-merge`, `--no-priority`, ...).
    pub sched: SchedOpts,
    /// `baseline raw_TEST` (`raw_write` for `write_bw`): the test as a hand-written verbs loop
    /// on RC (the verbs runner, no engine), with the same `-s`, `-l`, `-Q` and `-t`: the floor
    /// any engine on that provider can reach. Reported as `baseline_raw_write`,
    /// `baseline_raw_read_lat`, ...
    pub raw: bool,
    /// `rpc_lat` / `rpc_bw`: every message in a send of its own (`--no-pack`:
    /// `corelink_rpc::EndpointConfig::pack_max` 0), instead of a pass's small messages to
    /// one peer packed into one send.
    pub no_pack: bool,
    /// Which of `-l`, `-Q` and `-q` were given on the command line: with `--config` only those
    /// override the core map's batching and lanes (the others keep the map's values).
    pub explicit: Explicit,
}

/// Options given on the command line rather than left at their defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Explicit {
    /// `-l`.
    pub post_list: bool,
    /// `-Q`.
    pub cq_mod: bool,
    /// `-q`.
    pub qps: bool,
}

/// How the engine runner drives the engine's scheduler (issue 6's experiments).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedOpts {
    /// `--flat`: post each request at once (`Cx::post_now`), bypassing the scheduler.
    pub flat: bool,
    /// `--no-merge`: no read merging (the engine merges only with `--hot-records`: plain tests
    /// keep perftest's meaning of one work request per iteration).
    pub no_merge: bool,
    /// `--no-priority`: requests in arrival order.
    pub no_priority: bool,
    /// `--hot-records N`: reads go to one of N hot records 9 times in 10 (a skewed workload),
    /// else anywhere in the peer's region; merging is on unless `--no-merge`.
    pub hot_records: u32,
    /// `--bg-writes N`: during a read test, N writes of `bg_size` bytes stay in flight on the
    /// same connection (a mixed load).
    pub bg_writes: usize,
    /// `--bg-size`: bytes per background write.
    pub bg_size: usize,
    /// `--max-outstanding N`: work requests per QP on the device at most (more wait in the
    /// engine, where priorities apply).
    pub max_outstanding: Option<u32>,
    /// `--quiet`: a ping-pong's (send_lat's, write_lat's) pings and pongs go quiet
    /// (`Cx::send_quiet`, `Cx::write_quiet`): each answer says its request arrived, so one
    /// completion in `-Q` is asked for (perftest, and the default, ask for each).
    pub quiet: bool,
}

impl PerfOpts {
    /// Options with perftest's defaults for `test` (5000 iterations for bandwidth, 1000 for
    /// latency; 65536 B for bandwidth, 2 B for latency; 8 B for atomics), in loopback on soft.
    pub fn new(test: Test) -> PerfOpts {
        let size = match (test.verb(), test.is_lat()) {
            (Verb::Atomic, _) => 8,
            (_, true) => 2,
            (_, false) => 65536,
        };
        PerfOpts {
            test,
            transport: Transport::Rc,
            sizes: vec![size],
            iters: if test.is_lat() { 1000 } else { 5000 },
            duration: None,
            qps: 1,
            post_list: 1,
            cq_mod: 1,
            inline: None,
            use_srq: false,
            tx_depth: DEFAULT_TX_DEPTH,
            device: None,
            port: None,
            gid_index: None,
            provider: None,
            config: None,
            workers: 1,
            role: Role::Loopback,
            bind: None,
            timeout: Some(Duration::from_secs(600)),
            progress: false,
            sched: SchedOpts { bg_size: 4096, ..SchedOpts::default() },
            raw: false,
            no_pack: false,
            explicit: Explicit::default(),
        }
    }

    /// Checks what verbs forbids (usage errors) and what the engine cannot do yet; may drop
    /// sizes the engine cannot run from an `-a` list (`all_sizes`), returning a note saying so.
    pub fn check(&mut self, all_sizes: bool) -> Result<Vec<String>, PerfError> {
        let mut notes = Vec::new();
        let t = self.test;
        if self.raw {
            self.check_raw()?;
        }
        match (self.transport, t.verb()) {
            (Transport::Uc, Verb::Read | Verb::Atomic) => {
                return Err(PerfError::Usage(format!(
                    "{}: UC supports sends and RDMA writes only (verbs forbids RDMA reads and \
                     atomics on UC)",
                    t.name()
                )))
            }
            (Transport::Ud, v) if v != Verb::Send => {
                return Err(PerfError::Usage(format!(
                    "{}: UD supports sends only (verbs forbids RDMA writes, reads and atomics \
                     on UD)",
                    t.name()
                )))
            }
            _ => {}
        }
        if t.is_rpc() {
            self.check_rpc(all_sizes, &mut notes)?;
        }
        // -c UC/UD and --use-srq run on verbs (`verbs_run`, which checks its own limits).
        let engine = !self.on_verbs();
        let lim = corelink_config::limits::MAX_QPS_PER_CONN;
        if self.qps == 0 || self.qps > lim {
            return Err(PerfError::Usage(format!("-q {}: 1..={lim} queue pairs", self.qps)));
        }
        let lim = corelink_config::limits::MAX_POST_LIST;
        if self.post_list == 0 || self.post_list > lim {
            return Err(PerfError::Usage(format!("-l {}: 1..={lim} per doorbell", self.post_list)));
        }
        if self.cq_mod == 0 {
            return Err(PerfError::Usage("-Q 0: at least 1".into()));
        }
        if self.sched.quiet && (!matches!(t, Test::SendLat | Test::WriteLat) || !engine) {
            return Err(PerfError::Usage(format!(
                "{}: --quiet is for the engine's ping-pongs (send_lat, write_lat on RC)",
                t.name()
            )));
        }
        if self.sched.quiet && self.sched.flat {
            return Err(PerfError::Usage(
                "--quiet and --flat: the flat path signals each request".into(),
            ));
        }
        let reads = matches!(t.verb(), Verb::Read);
        if (self.sched.hot_records > 0 || self.sched.bg_writes > 0) && !reads {
            return Err(PerfError::Usage(
                "--hot-records and --bg-writes go with read_bw / read_lat".into(),
            ));
        }
        if self.workers == 0 {
            return Err(PerfError::Usage("-T 0: at least one worker".into()));
        }
        if self.iters == 0 {
            return Err(PerfError::Usage("-n 0: at least one iteration".into()));
        }
        if self.tx_depth == 0 {
            return Err(PerfError::Usage("-t 0: at least one request in flight".into()));
        }
        if let Some(d) = self.duration {
            if d.is_zero() {
                return Err(PerfError::Usage("-D 0: at least one second".into()));
            }
        }
        if t.verb() == Verb::Atomic {
            if self.sizes.iter().any(|&s| s != 8) {
                notes.push("atomics are 8 bytes: -s / -a ignored".into());
            }
            self.sizes = vec![8];
        }
        if self.sizes.contains(&0) {
            return Err(PerfError::Usage("-s 0: messages of at least 1 byte".into()));
        }
        if engine && matches!(t.verb(), Verb::Write | Verb::Read) {
            let too_big: Vec<usize> =
                self.sizes.iter().copied().filter(|&s| s > MAX_ONE_SIDED).collect();
            if !too_big.is_empty() {
                let why = format!(
                    "one-sided messages over {} B: corelink-perf grants its peer {} B of memory per side",
                    MAX_ONE_SIDED, MAX_ONE_SIDED
                );
                if !all_sizes {
                    return Err(PerfError::Unsupported(format!("-s {}: {why}", too_big[0])));
                }
                self.sizes.retain(|&s| s <= MAX_ONE_SIDED);
                notes.push(format!("sizes {too_big:?} skipped: {why}"));
            }
        }
        Ok(notes)
    }

    /// What the RPC tests refuse: anything but the engine on RC, the scheduler's read and
    /// flat-path options, and messages over [`MAX_ONE_SIDED`] (they travel in sends here, one
    /// receive each; dropped from `-a` with a note).
    fn check_rpc(&mut self, all_sizes: bool, notes: &mut Vec<String>) -> Result<(), PerfError> {
        let t = self.test.name();
        if self.raw || self.transport != Transport::Rc || self.use_srq {
            return Err(PerfError::Usage(format!(
                "{t} runs on the engine (RC, receives per connection): not with -c UC/UD, \
                 --use-srq or a baseline"
            )));
        }
        if self.sched.flat {
            return Err(PerfError::Usage(format!(
                "{t}: --flat does not apply (the RPC layer submits through the scheduler)"
            )));
        }
        let too_big: Vec<usize> =
            self.sizes.iter().copied().filter(|&s| s > MAX_ONE_SIDED).collect();
        if !too_big.is_empty() {
            let why = format!(
                "{t} sends messages of at most {MAX_ONE_SIDED} B here (each in one receive; \
                 large messages by RDMA read are not part of this benchmark)"
            );
            if !all_sizes {
                return Err(PerfError::Unsupported(format!("-s {}: {why}", too_big[0])));
            }
            self.sizes.retain(|&s| s <= MAX_ONE_SIDED);
            notes.push(format!("sizes {too_big:?} skipped: {why}"));
        }
        Ok(())
    }

    /// What `baseline raw_TEST` refuses: the RPC tests (the RPC layer runs on the engine),
    /// anything but RC without an SRQ, and the engine's scheduler options (there is no engine).
    fn check_raw(&self) -> Result<(), PerfError> {
        let name = self.report_name();
        if self.test.is_rpc() {
            return Err(PerfError::Usage(format!(
                "baseline raw_{}: the RPC layer runs on the engine; the raw baselines are {}",
                self.test.name(),
                RAW_BASELINES
            )));
        }
        if self.transport != Transport::Rc || self.use_srq {
            return Err(PerfError::Usage(format!(
                "{name} runs on RC without an SRQ (for UC: {} -c UC, which runs the same verbs \
                 loop)",
                self.test.name()
            )));
        }
        if self.sched != (SchedOpts { bg_size: self.sched.bg_size, ..SchedOpts::default() }) {
            return Err(PerfError::Usage(format!(
                "{name} has no engine: --flat, --no-merge, --no-priority, --quiet, \
                 --hot-records, --bg-writes and --max-outstanding do not apply"
            )));
        }
        Ok(())
    }

    /// Whether the run goes to the verbs runner (`verbs_run`): `-c UC`, `-c UD` or
    /// `--use-srq`, which the engine (RC, receives per connection) does not offer, and
    /// `baseline raw_TEST`, which is that runner's loop on RC.
    pub fn on_verbs(&self) -> bool {
        self.raw || self.transport != Transport::Rc || self.use_srq
    }

    /// The name reports carry: the test's, or for `baseline raw_TEST` `baseline_raw_TEST`
    /// (`baseline_raw_write` for `write_bw`, the first of them).
    pub fn report_name(&self) -> String {
        match (self.raw, self.test) {
            (false, t) => t.name().into(),
            (true, Test::WriteBw) => "baseline_raw_write".into(),
            (true, t) => format!("baseline_raw_{}", t.name()),
        }
    }

    /// The test a raw baseline's name gives: `raw_write` (`write_bw`) or `raw_TEST`.
    pub fn raw_test(kind: &str) -> Option<Test> {
        match kind.strip_prefix("raw_")? {
            "write" => Some(Test::WriteBw),
            t => Test::from_name(t),
        }
    }

    /// Requests kept in flight at `size`: 1 for latency tests; else `tx_depth`, at most
    /// [`SEND_WINDOW`] for sends, and at most [`MAX_BYTES_IN_FLIGHT`] bytes.
    pub fn window(&self, size: usize) -> usize {
        if self.test.is_lat() {
            return 1;
        }
        let mut w = self.tx_depth;
        if self.test.verb() == Verb::Send {
            w = w.min(SEND_WINDOW);
        }
        w.min((MAX_BYTES_IN_FLIGHT / size.max(1)).max(1))
    }

    /// The largest size.
    pub fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_and_unsupported_combinations() {
        let mut o = PerfOpts::new(Test::ReadBw);
        o.transport = Transport::Uc;
        assert!(matches!(o.check(false), Err(PerfError::Usage(_))));
        let mut o = PerfOpts::new(Test::WriteLat);
        o.transport = Transport::Ud;
        assert!(matches!(o.check(false), Err(PerfError::Usage(_))));
        let mut o = PerfOpts::new(Test::SendBw);
        o.transport = Transport::Ud;
        assert!(o.on_verbs());
        o.check(false).expect("UD send_bw runs on verbs");
        let mut o = PerfOpts::new(Test::WriteBw);
        o.use_srq = true;
        o.sizes = super::super::all_sizes();
        assert!(o.on_verbs());
        assert!(o.check(true).unwrap().is_empty(), "verbs registers regions of any size");
        assert_eq!(o.max_size(), 8 << 20);
        let mut o = PerfOpts::new(Test::SendBw);
        o.qps = 9;
        assert!(matches!(o.check(false), Err(PerfError::Usage(_))));
        let mut o = PerfOpts::new(Test::WriteBw);
        o.sched.hot_records = 4;
        assert!(matches!(o.check(false), Err(PerfError::Usage(_))), "hot records are for reads");
        let mut o = PerfOpts::new(Test::WriteBw);
        o.sizes = super::super::all_sizes();
        let notes = o.check(true).unwrap();
        assert_eq!(o.max_size(), MAX_ONE_SIDED);
        assert_eq!(notes.len(), 1);
        let mut o = PerfOpts::new(Test::AtomicBw);
        o.sizes = vec![64];
        o.check(false).unwrap();
        assert_eq!(o.sizes, vec![8]);
        for t in Test::ALL.into_iter().chain(Test::RPC) {
            assert_eq!(Test::from_name(t.name()), Some(t));
            assert_eq!(Test::from_code(t.code()), Some(t));
        }
        let mut o = PerfOpts::new(Test::RpcBw);
        o.transport = Transport::Uc;
        assert!(matches!(o.check(false), Err(PerfError::Usage(_))), "rpc runs on the engine");
        let mut o = PerfOpts::new(Test::RpcLat);
        o.sizes = super::super::all_sizes();
        assert_eq!(o.check(true).unwrap().len(), 1);
        assert_eq!(o.max_size(), MAX_ONE_SIDED);
    }

    #[test]
    fn raw_baselines_are_rc_verbs_loops() {
        let mut o = PerfOpts::new(Test::WriteBw);
        o.raw = true;
        o.check(false).expect("RC writes");
        assert!(o.on_verbs());
        assert_eq!(o.report_name(), "baseline_raw_write");
        let mut uc = o.clone();
        uc.transport = Transport::Uc;
        assert!(matches!(uc.check(false), Err(PerfError::Usage(_))));
        let mut flat = o.clone();
        flat.sched.flat = true;
        assert!(matches!(flat.check(false), Err(PerfError::Usage(_))));
        assert_eq!(PerfOpts::new(Test::WriteBw).report_name(), "write_bw");
        // Any test but the RPC ones has its raw loop.
        let mut read = PerfOpts::new(Test::ReadLat);
        read.raw = true;
        read.check(false).expect("a raw read_lat");
        assert!(read.on_verbs());
        assert_eq!(read.report_name(), "baseline_raw_read_lat");
        let mut quiet = PerfOpts::new(Test::SendLat);
        quiet.raw = true;
        quiet.sched.quiet = true;
        assert!(matches!(quiet.check(false), Err(PerfError::Usage(_))));
        let mut rpc = PerfOpts::new(Test::RpcLat);
        rpc.raw = true;
        assert!(matches!(rpc.check(false), Err(PerfError::Usage(_))));
        assert_eq!(PerfOpts::raw_test("raw_write"), Some(Test::WriteBw));
        assert_eq!(PerfOpts::raw_test("raw_read_lat"), Some(Test::ReadLat));
        assert_eq!(PerfOpts::raw_test("raw_rpc_lat"), Some(Test::RpcLat));
        assert_eq!(PerfOpts::raw_test("raw_nothing"), None);
        assert_eq!(PerfOpts::raw_test("read_lat"), None);
    }

    #[test]
    fn quiet_is_for_the_engines_ping_pongs() {
        for t in [Test::SendLat, Test::WriteLat] {
            let mut o = PerfOpts::new(t);
            o.sched.quiet = true;
            o.check(false).expect("a ping-pong on the engine");
            let mut flat = o.clone();
            flat.sched.flat = true;
            assert!(matches!(flat.check(false), Err(PerfError::Usage(_))));
            let mut uc = o.clone();
            uc.transport = Transport::Uc;
            assert!(matches!(uc.check(false), Err(PerfError::Usage(_))));
        }
        for t in [Test::ReadLat, Test::SendBw, Test::RpcLat] {
            let mut o = PerfOpts::new(t);
            o.sched.quiet = true;
            assert!(matches!(o.check(false), Err(PerfError::Usage(_))), "{t:?}");
        }
    }

    #[test]
    fn windows() {
        let o = PerfOpts::new(Test::WriteBw);
        assert_eq!(o.window(64), DEFAULT_TX_DEPTH);
        assert_eq!(o.window(1 << 20), 16);
        assert_eq!(PerfOpts::new(Test::SendBw).window(64), SEND_WINDOW);
        assert_eq!(PerfOpts::new(Test::SendLat).window(64), 1);
    }
}
