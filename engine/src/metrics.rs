//! Per-worker metrics: operations and bytes by opcode, completions by status, poll iterations
//! and empty polls, ring occupancy, and the worker thread's context switches.
//!
//! A worker updates its own [`Metrics`] (plain integers, no atomics, no sharing) and publishes
//! a copy when asked; the copy prints as a table.
//!
//! The control core's own counters (engine connections and QPs, by worker) are
//! [`ControlMetrics`].

use std::fmt;

use corelink_verbs::{WcOpcode, WcStatus};

/// Opcodes counted, in [`Metrics::ops`] order.
pub const OPCODES: [WcOpcode; 9] = [
    WcOpcode::Send,
    WcOpcode::RdmaWrite,
    WcOpcode::RdmaRead,
    WcOpcode::CompSwap,
    WcOpcode::FetchAdd,
    WcOpcode::BindMw,
    WcOpcode::LocalInv,
    WcOpcode::Recv,
    WcOpcode::RecvRdmaWithImm,
];

fn opcode_index(op: WcOpcode) -> usize {
    // A match, not a search: this runs once per completion.
    match op {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::CompSwap => 3,
        WcOpcode::FetchAdd => 4,
        WcOpcode::BindMw => 5,
        WcOpcode::LocalInv => 6,
        WcOpcode::Recv => 7,
        WcOpcode::RecvRdmaWithImm => 8,
    }
}

/// Voluntary and involuntary context switches of the calling thread (getrusage(RUSAGE_THREAD)).
pub fn thread_context_switches() -> (u64, u64) {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a valid, writable rusage; RUSAGE_THREAD reports on the calling thread.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
    if rc != 0 {
        return (0, 0);
    }
    // SAFETY: getrusage succeeded and filled the struct (it was zeroed before anyway).
    let ru = unsafe { ru.assume_init() };
    (ru.ru_nvcsw.max(0) as u64, ru.ru_nivcsw.max(0) as u64)
}

/// One worker's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Worker index.
    pub worker: usize,
    /// Successful operations by opcode ([`OPCODES`] order).
    pub ops: [u64; 9],
    /// Bytes moved by opcode ([`OPCODES`] order).
    pub bytes: [u64; 9],
    /// Completions by status (`WcStatus` C order).
    pub statuses: [u64; 22],
    /// Loop iterations.
    pub polls: u64,
    /// Iterations whose poll found no completion.
    pub empty_polls: u64,
    /// Work requests posted.
    pub posted: u64,
    /// Doorbells rung (post calls).
    pub doorbells: u64,
    /// Work requests posted that asked for a completion.
    pub signalled: u64,
    /// Reads that rode on an identical read in flight (each saved a work request).
    pub merged_reads: u64,
    /// Writes that went in another write's gather list (each saved a work request).
    pub coalesced_writes: u64,
    /// Items waiting in the worker's inbound rings at the last look.
    pub ring_occupancy: u64,
    /// Whether the worker thread is pinned to its core (`pin = "warn"` lets it run unpinned).
    pub pinned: bool,
    /// Whether the worker's PD, CQ, QPs and buffers are on a device context of its own, with
    /// doorbells no other worker rings (false: a context of its own could not be opened, as
    /// the line at start said, and it shares the control core's).
    pub own_context: bool,
    /// CQ polls that failed (the verbs call returned an error).
    pub poll_errors: u64,
    /// Receives that could not be posted (each closes its connection with
    /// `CloseReason::RecvPostFailed`).
    pub recv_post_errors: u64,
    /// Messages that arrived before their connection was the worker's: on receives posted
    /// before the connection manager's exchange, kept and delivered after `on_connected`
    /// (without that, each would have been a receiver-not-ready NAK to the sender).
    pub early_receives: u64,
    /// Asynchronous events the worker's device context reported (a QP's fatal error, a CQ
    /// overrun, a port or device event); the fatal ones close what they concern with
    /// `CloseReason::Device` and are said on stderr.
    pub async_events: u64,
    /// Lookups that cannot fail and did (a bug: each is also a debug assertion).
    pub invariant_misses: u64,
    /// Requests and receives the worker ended itself (as flushed, `WrFlushErr`, naming their
    /// connection's close) because their completions were lost: still posted on a connection
    /// closed by a CQ overrun or a failed device `UNTRUSTED_FLUSH_WAIT` after it.
    pub completions_made_up: u64,
    /// Completions that came for requests the worker had already ended that way.
    pub late_completions: u64,
    /// Keepalive probes posted to connections idle for `worker.keepalive_ms`.
    pub keepalive_probes: u64,
    /// Of those, the ones that failed (each closed its connection with
    /// `CloseReason::Unanswered`, or was flushed by its close).
    pub keepalive_failures: u64,
    /// Quiet requests (`Cx::send_quiet`, `Cx::write_quiet`) that succeeded, their buffers back in the pool
    /// untold (their completions are in `ops`, `bytes` and `statuses` as any request's).
    pub quiet: u64,
    /// Fences posted: signalled zero-length writes behind a closing connection's quiet
    /// requests that asked for no completion, so that one retires them.
    pub fences: u64,
    /// Parks of a worker with connections that was idle for `worker.park_after_us` (a slice
    /// each, `tunables::PARK_SLICE`).
    pub parks: u64,
    /// Voluntary context switches of the worker thread since it started.
    pub voluntary_switches: u64,
    /// Involuntary context switches of the worker thread since it started.
    pub involuntary_switches: u64,
}

impl Metrics {
    /// Counts one completion.
    #[inline]
    pub fn completion(&mut self, opcode: WcOpcode, status: WcStatus, bytes: u32) {
        self.statuses[status as usize] += 1;
        if status == WcStatus::Success {
            let i = opcode_index(opcode);
            self.ops[i] += 1;
            self.bytes[i] += u64::from(bytes);
        }
    }

    /// A request of `kind` succeeded, moving `bytes` ([`Metrics::completion`] with its
    /// opcode, looked up rather than matched: this runs once per request retired).
    #[inline(always)]
    pub(crate) fn success(&mut self, kind: crate::request::OpKind, bytes: u32) {
        // `opcode_index` of each kind's opcode, by `OpKind::index`.
        const INDEX: [usize; 5] = [0, 1, 2, 4, 3];
        self.statuses[WcStatus::Success as usize] += 1;
        let i = INDEX[kind.index()];
        self.ops[i] += 1;
        self.bytes[i] += u64::from(bytes);
    }

    /// The counts since `earlier` (a copy taken before): every counter's difference, the
    /// gauges (pinned, own context, ring occupancy) as now. For measuring one phase of a run.
    pub fn since(&self, earlier: &Metrics) -> Metrics {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let sub = |now: &mut [u64], then: &[u64]| {
            now.iter_mut().zip(then).for_each(|(x, e)| *x = x.saturating_sub(*e))
        };
        let mut m = self.clone();
        sub(&mut m.ops, &earlier.ops);
        sub(&mut m.bytes, &earlier.bytes);
        sub(&mut m.statuses, &earlier.statuses);
        m.polls = d(m.polls, earlier.polls);
        m.empty_polls = d(m.empty_polls, earlier.empty_polls);
        m.posted = d(m.posted, earlier.posted);
        m.doorbells = d(m.doorbells, earlier.doorbells);
        m.signalled = d(m.signalled, earlier.signalled);
        m.merged_reads = d(m.merged_reads, earlier.merged_reads);
        m.coalesced_writes = d(m.coalesced_writes, earlier.coalesced_writes);
        m.poll_errors = d(m.poll_errors, earlier.poll_errors);
        m.recv_post_errors = d(m.recv_post_errors, earlier.recv_post_errors);
        m.early_receives = d(m.early_receives, earlier.early_receives);
        m.async_events = d(m.async_events, earlier.async_events);
        m.invariant_misses = d(m.invariant_misses, earlier.invariant_misses);
        m.completions_made_up = d(m.completions_made_up, earlier.completions_made_up);
        m.late_completions = d(m.late_completions, earlier.late_completions);
        m.keepalive_probes = d(m.keepalive_probes, earlier.keepalive_probes);
        m.keepalive_failures = d(m.keepalive_failures, earlier.keepalive_failures);
        m.quiet = d(m.quiet, earlier.quiet);
        m.fences = d(m.fences, earlier.fences);
        m.parks = d(m.parks, earlier.parks);
        m.voluntary_switches = d(m.voluntary_switches, earlier.voluntary_switches);
        m.involuntary_switches = d(m.involuntary_switches, earlier.involuntary_switches);
        m
    }

    /// Reads the context switches of the calling thread (the worker's own) into the counters,
    /// relative to `base` (the counts when the worker started).
    pub fn sample_switches(&mut self, base: (u64, u64)) {
        let (v, i) = thread_context_switches();
        self.voluntary_switches = v.saturating_sub(base.0);
        self.involuntary_switches = i.saturating_sub(base.1);
    }
}

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "worker {}", self.worker)?;
        writeln!(f, "  {:<28} {:>14} {:>16}", "opcode", "ops", "bytes")?;
        for (i, op) in OPCODES.iter().enumerate() {
            if self.ops[i] > 0 {
                writeln!(f, "  {:<28} {:>14} {:>16}", op.name(), self.ops[i], self.bytes[i])?;
            }
        }
        for (i, n) in self.statuses.iter().enumerate() {
            if *n > 0 {
                writeln!(f, "  {:<28} {:>14}", WcStatus::ALL[i].name(), n)?;
            }
        }
        writeln!(f, "  {:<28} {:>14}", "poll iterations", self.polls)?;
        writeln!(f, "  {:<28} {:>14}", "empty polls", self.empty_polls)?;
        writeln!(f, "  {:<28} {:>14}", "work requests posted", self.posted)?;
        writeln!(f, "  {:<28} {:>14}", "doorbells", self.doorbells)?;
        writeln!(f, "  {:<28} {:>14}", "signalled", self.signalled)?;
        writeln!(f, "  {:<28} {:>14}", "merged reads", self.merged_reads)?;
        writeln!(f, "  {:<28} {:>14}", "coalesced writes", self.coalesced_writes)?;
        writeln!(f, "  {:<28} {:>14}", "ring occupancy", self.ring_occupancy)?;
        if !self.pinned {
            writeln!(f, "  {:<28} {:>14}", "pinned", "no")?;
        }
        if !self.own_context {
            writeln!(f, "  {:<28} {:>14}", "own device context", "no")?;
        }
        for (what, n) in [
            ("poll errors", self.poll_errors),
            ("receive post errors", self.recv_post_errors),
            ("early receives", self.early_receives),
            ("device events", self.async_events),
            ("invariant misses", self.invariant_misses),
            ("completions made up", self.completions_made_up),
            ("late completions", self.late_completions),
            ("keepalive probes", self.keepalive_probes),
            ("keepalive probes failed", self.keepalive_failures),
            ("quiet requests", self.quiet),
            ("fences", self.fences),
            ("parks with connections", self.parks),
        ] {
            if n > 0 {
                writeln!(f, "  {what:<28} {n:>14}")?;
            }
        }
        writeln!(f, "  {:<28} {:>14}", "voluntary ctx switches", self.voluntary_switches)?;
        write!(f, "  {:<28} {:>14}", "involuntary ctx switches", self.involuntary_switches)
    }
}

/// The control core's counters of one worker: its engine connections and its QPs (see
/// `engine::Engine::control_metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerCounts {
    /// Engine connections of the worker (a connection of several lanes counts once), including
    /// accepted ones still waiting for their lanes.
    pub connections: u64,
    /// QPs of the worker that exist now: in use and pooled (at most `worker.qps.max`).
    pub qps_live: u64,
    /// QPs in the worker's pool now (ready in INIT, or given back and made ready when the loop idles).
    pub qps_pooled: u64,
    /// QPs created since start: the pool's at start, refills, and lanes that found the pool
    /// empty.
    pub qps_created: u64,
    /// Lanes that got a QP a connection had used before (reset and pooled).
    pub qps_reused: u64,
    /// QPs destroyed: given back to a full pool, failed to reset, or lost with a connector
    /// thread that could not start.
    pub qps_destroyed: u64,
    /// Connects and accepts refused because they would exceed `worker.qps.max`.
    pub qps_refused: u64,
    /// Connects and accepts refused because they would exceed `worker.max_conns`, the
    /// receive buffers or the CQ (`worker.cq_depth`).
    pub conns_refused: u64,
    /// Lanes handed to the worker since start (`worker.qps.per_conn` of the connecting side
    /// per connection).
    pub lanes: u64,
}

/// The control core's counters, by worker: published by the control core whenever they
/// change (the control core is not on the data path, so a lock there costs nothing that
/// matters); read them with `Engine::control_metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControlMetrics {
    /// By worker index.
    pub workers: Vec<WorkerCounts>,
    /// Connection requests without the engine's header, rejected (the map's
    /// `accept_foreign` is off).
    pub foreign_refused: u64,
    /// Lanes accepted and waiting for their connectors' confirmation now (a half-open peer's
    /// stays here until it confirms or its accept times out; it delays no other).
    pub accepts_waiting: u64,
    /// Waits for connection-manager events that failed (the loop slept a slice instead),
    /// and failed reads of the control core's device events.
    pub wait_errors: u64,
    /// Asynchronous events of the control core's own context (port and device events; the
    /// QP and CQ events of workers that share it, which are handed to them).
    pub async_events: u64,
}

impl fmt::Display for ControlMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "  {:<8} {:>11} {:>8} {:>8} {:>8} {:>9} {:>8} {:>10} {:>8} {:>13}",
            "worker",
            "connections",
            "lanes",
            "qps",
            "pooled",
            "created",
            "reused",
            "destroyed",
            "refused",
            "conns refused"
        )?;
        for (i, w) in self.workers.iter().enumerate() {
            write!(
                f,
                "\n  {:<8} {:>11} {:>8} {:>8} {:>8} {:>9} {:>8} {:>10} {:>8} {:>13}",
                i,
                w.connections,
                w.lanes,
                w.qps_live,
                w.qps_pooled,
                w.qps_created,
                w.qps_reused,
                w.qps_destroyed,
                w.qps_refused,
                w.conns_refused
            )?;
        }
        if self.accepts_waiting > 0 {
            write!(f, "\n  accepts waiting for their connectors: {}", self.accepts_waiting)?;
        }
        if self.foreign_refused > 0 {
            write!(f, "\n  foreign requests refused: {}", self.foreign_refused)?;
        }
        if self.wait_errors > 0 {
            write!(f, "\n  failed waits for connection-manager events: {}", self.wait_errors)?;
        }
        if self.async_events > 0 {
            write!(f, "\n  device events on the control core's context: {}", self.async_events)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_index_follows_opcodes() {
        for (i, op) in OPCODES.iter().enumerate() {
            assert_eq!(opcode_index(*op), i);
        }
    }

    #[test]
    fn a_success_counts_as_its_opcode() {
        use crate::request::OpKind;
        let kinds = [
            (OpKind::Send, WcOpcode::Send),
            (OpKind::Write, WcOpcode::RdmaWrite),
            (OpKind::Read, WcOpcode::RdmaRead),
            (OpKind::FetchAdd, WcOpcode::FetchAdd),
            (OpKind::CompareSwap, WcOpcode::CompSwap),
        ];
        for (kind, opcode) in kinds {
            let (mut a, mut b) = (Metrics::default(), Metrics::default());
            a.success(kind, 8);
            b.completion(opcode, WcStatus::Success, 8);
            assert_eq!((a.ops, a.bytes, a.statuses), (b.ops, b.bytes, b.statuses), "{kind:?}");
        }
    }

    #[test]
    fn counts_and_prints() {
        let mut m = Metrics::default();
        m.completion(WcOpcode::RdmaWrite, WcStatus::Success, 64);
        m.completion(WcOpcode::RdmaWrite, WcStatus::Success, 64);
        m.completion(WcOpcode::Send, WcStatus::RemAccessErr, 0);
        assert_eq!(m.ops[1], 2);
        assert_eq!(m.bytes[1], 128);
        assert_eq!(m.statuses[WcStatus::RemAccessErr as usize], 1);
        let t = m.to_string();
        assert!(t.contains("IBV_WC_RDMA_WRITE") && t.contains("IBV_WC_REM_ACCESS_ERR"), "{t}");
    }

    #[test]
    fn control_counters_print_by_worker() {
        let m = ControlMetrics {
            foreign_refused: 0,
            accepts_waiting: 0,
            wait_errors: 0,
            async_events: 0,
            workers: vec![WorkerCounts {
                connections: 2,
                qps_reused: 7,
                ..WorkerCounts::default()
            }],
        };
        let t = m.to_string();
        assert!(t.contains("reused") && t.lines().count() == 2, "{t}");
        assert!(t.lines().nth(1).unwrap().split_whitespace().any(|w| w == "7"), "{t}");
    }

    #[test]
    fn context_switches_are_readable() {
        let base = thread_context_switches();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let mut m = Metrics::default();
        m.sample_switches(base);
        assert!(m.voluntary_switches >= 1, "sleeping is a voluntary switch");
    }
}
