//! Faults `soft` injects into its wire, deterministically from a seed: for every process by
//! the environment (`CORELINK_SOFT_FAULTS=seed=7,drop=0.01,dup=0.001`, read when the first
//! soft device opens), for the connections a test's listener accepts ([`plan_at`]), or for
//! one QP ([`super::SoftQp::set_fault_plan`]). A message is packets of the path MTU: a packet dropped loses a UC or UD
//! message, and makes RC send the message again (once per retry, `retry_cnt` of them; then
//! `RetryExcErr`; `retry_cnt = 7` retries for ever, as on rxe). A duplicated packet is thrown
//! away by RC's and UC's sequence numbers (counted) and delivered twice on UD. A delay
//! (`delay_us`) holds every message that long before it reaches its target, in order (it runs
//! when the sender's CQ is polled then, as RNR retries do; on RC its completion comes with
//! it). Each QP draws from its own generator (the seed and its QP number), so that one QP's
//! posts meet the same fates in every run. With no plan the data path pays one predictable
//! branch. A reordered message (`reorder`) is overtaken by the QP's next one: RC sees the gap,
//! and its go-back-N retransmission delivers both in order (counted as a retransmission); UC
//! loses a message of several packets whose packets came out of order, and delivers a message
//! of one packet, as UD does, after the next one (or on the sender's next CQ poll at least
//! 100 us later, if none follows); the sender's completions stay in post order.
//!
//! A plan's `rnr` has a message that needs a receive find none now and then, as if its receiver
//! withheld them (an RNR storm): RC waits and tries again, within its `rnr_retry`.
//!
//! A plan's `cm_drop` loses the connection manager's word of a disconnect to the far end now
//! and then: that end hears nothing, as when the message is lost on a real fabric.
//!
//! A plan's `cm_delay_us` makes every connection-manager message reach the far end late.
//!
//! A plan's `cq_overrun` loses a completion now and then as an overrun of its CQ does: a
//! send-queue completion (and with it the news of the unsignalled requests it would have
//! retired) or a receive's (its message is gone with it); the CQ's context raises
//! `IBV_EVENT_CQ_ERR`, each time.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};

pub use super::cm::{cut, fail_qps, raise_at};

/// The environment variable a whole program's plan comes from.
pub const ENV: &str = "CORELINK_SOFT_FAULTS";

/// What goes wrong on the wire, and how often (the default: nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultPlan {
    /// The generators' seed.
    pub seed: u64,
    /// Probability that a packet is dropped, `0.0..=1.0`.
    pub drop: f64,
    /// Probability that a packet arrives twice, `0.0..=1.0`.
    pub dup: f64,
    /// Microseconds every message takes to reach its target (at most [`MAX_DELAY_US`]).
    pub delay_us: u32,
    /// Probability that a message is overtaken by the next one, `0.0..=1.0`.
    pub reorder: f64,
    /// Probability that a message that needs a receive finds none (as if the receiver withheld
    /// its receives: an RNR storm), `0.0..=1.0`: RC waits the responder's RNR timer and tries
    /// again (`rnr_retry` times, 7 for ever; then `RnrRetryExcErr`), UC and UD drop it.
    pub rnr: f64,
    /// Probability that a connection-manager event for the far end of a connection (its
    /// peer's disconnect) is lost, `0.0..=1.0`: that end hears nothing and finds out as a NIC
    /// would let it (its next request, or a keepalive probe, is not answered).
    pub cm_drop: f64,
    /// Microseconds every connection-manager message takes to reach the other side (at most
    /// [`MAX_DELAY_US`]): a connection request, its accept, the connector's confirmation and
    /// a disconnect reach the far end that much later (a reject does not wait).
    pub cm_delay_us: u32,
    /// Probability that a completion of a QP (of its send queue, or of a receive) is lost as
    /// in an overrun of its CQ, `0.0..=1.0`: the completion is gone and the CQ raises
    /// `IBV_EVENT_CQ_ERR`.
    pub cq_overrun: f64,
}

/// The longest `delay_us` a plan may give (10 s).
pub const MAX_DELAY_US: u32 = 10_000_000;

impl FaultPlan {
    /// A plan from its text: `key=value` pairs separated by commas, keys `seed`, `drop`,
    /// `dup`, `reorder`, `delay_us`, `rnr`, `cm_drop`, `cm_delay_us` and `cq_overrun` (as in
    /// `seed=7,drop=0.01,reorder=0.1,delay_us=50`); anything else is refused with why.
    pub fn parse(text: &str) -> Result<FaultPlan> {
        let bad = |why: String| Error::BadFaultPlan { text: text.to_owned(), why };
        let mut plan = FaultPlan::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(bad(format!("`{item}` is not key=value")));
            };
            let (key, value) = (key.trim(), value.trim());
            let p = || match value.parse::<f64>() {
                Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
                _ => Err(bad(format!("{key} = `{value}`: a probability is 0.0 to 1.0"))),
            };
            match key {
                "seed" => {
                    plan.seed = value
                        .parse()
                        .map_err(|_| bad(format!("seed = `{value}`: not an unsigned integer")))?
                }
                "drop" => plan.drop = p()?,
                "dup" => plan.dup = p()?,
                "delay_us" | "cm_delay_us" => {
                    let us = match value.parse::<u32>() {
                        Ok(us) if us <= MAX_DELAY_US => us,
                        _ => {
                            return Err(bad(format!(
                                "{key} = `{value}`: microseconds, 0 to {MAX_DELAY_US}"
                            )))
                        }
                    };
                    if key == "delay_us" {
                        plan.delay_us = us;
                    } else {
                        plan.cm_delay_us = us;
                    }
                }
                "reorder" => plan.reorder = p()?,
                "rnr" => plan.rnr = p()?,
                "cm_drop" => plan.cm_drop = p()?,
                "cq_overrun" => plan.cq_overrun = p()?,
                _ => {
                    return Err(bad(format!(
                        "unknown key `{key}` (seed, drop, dup, reorder, delay_us, rnr, cm_drop, \
                         cm_delay_us, cq_overrun)"
                    )))
                }
            }
        }
        Ok(plan)
    }

    /// Whether it does anything.
    fn active(&self) -> bool {
        self.drop > 0.0
            || self.dup > 0.0
            || self.reorder > 0.0
            || self.delay_us > 0
            || self.rnr > 0.0
            || self.cm_drop > 0.0
            || self.cm_delay_us > 0
            || self.cq_overrun > 0.0
    }

    /// How late a connection-manager message arrives.
    pub(crate) fn cm_delay(&self) -> std::time::Duration {
        std::time::Duration::from_micros(u64::from(self.cm_delay_us))
    }

    /// Whether the `n`-th connection-manager event of a connection is lost (counted).
    pub(crate) fn loses_cm_event(&self, n: u64) -> bool {
        if self.cm_drop <= 0.0 {
            return false;
        }
        let lost =
            unit(self.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xc0ff_ee00) < self.cm_drop;
        if lost {
            CM_LOST.fetch_add(1, Ordering::Relaxed);
        }
        lost
    }
}

/// The whole program's plan, from [`ENV`] (read once; a bad one is the first open's error).
pub(crate) fn global() -> Result<Option<FaultPlan>> {
    static GLOBAL: OnceLock<std::result::Result<Option<FaultPlan>, Error>> = OnceLock::new();
    let r = GLOBAL.get_or_init(|| match std::env::var(ENV) {
        Ok(text) => FaultPlan::parse(&text).map(|p| Some(p).filter(FaultPlan::active)),
        Err(_) => Ok(None),
    });
    match r {
        Ok(p) => Ok(*p),
        Err(Error::BadFaultPlan { text, why }) => {
            Err(Error::BadFaultPlan { text: text.clone(), why: why.clone() })
        }
        Err(_) => Ok(None),
    }
}

/// Plans for the connections accepted at a listener (tests), by the listener's address.
static AT: Mutex<Vec<(SocketAddr, FaultPlan)>> = Mutex::new(Vec::new());

/// Applies `plan` to the connections the listener bound to `listener` accepts from now on
/// (both ends' QPs), until [`clear_at`].
pub fn plan_at(listener: SocketAddr, plan: FaultPlan) {
    let mut at = AT.lock().unwrap_or_else(|e| e.into_inner());
    at.retain(|(a, _)| *a != listener);
    at.push((listener, plan));
}

/// Takes the plan of `listener` away (connections made since keep theirs).
pub fn clear_at(listener: SocketAddr) {
    AT.lock().unwrap_or_else(|e| e.into_inner()).retain(|(a, _)| *a != listener);
}

/// The plan for connections accepted at `listener`, if any.
pub(crate) fn at(listener: SocketAddr) -> Option<FaultPlan> {
    let at = AT.lock().unwrap_or_else(|e| e.into_inner());
    at.iter().find(|(a, _)| *a == listener).map(|(_, p)| *p).filter(FaultPlan::active)
}

/// The plan for the connection-manager messages of connections to the listener at
/// `listener`: its own ([`plan_at`]), else the whole program's ([`ENV`]).
pub(crate) fn for_cm(listener: SocketAddr) -> Option<FaultPlan> {
    at(listener).or_else(|| global().ok().flatten().filter(FaultPlan::active))
}

/// `late`, for one connection-manager message (counted when it is late).
pub(crate) fn counted_late(late: std::time::Duration) -> std::time::Duration {
    if !late.is_zero() {
        CM_DELAYED.fetch_add(1, Ordering::Relaxed);
    }
    late
}

/// How late a connection-manager message to or from the listener at `listener` arrives.
pub(crate) fn cm_late(listener: SocketAddr) -> std::time::Duration {
    counted_late(for_cm(listener).map_or(std::time::Duration::ZERO, |p| p.cm_delay()))
}

/// Totals over the process: packets dropped, RC messages sent again, duplicates thrown away
/// (RC, UC) or delivered twice (UD).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Packets dropped.
    pub dropped: u64,
    /// RC messages sent again after a drop.
    pub retransmitted: u64,
    /// RC messages that gave up (`RetryExcErr`).
    pub retry_exceeded: u64,
    /// Duplicates thrown away by sequence numbers (RC, UC).
    pub duplicates_discarded: u64,
    /// UD messages delivered twice.
    pub duplicates_delivered: u64,
    /// Messages held for a plan's `delay_us`.
    pub delayed: u64,
    /// Messages overtaken by the next one (`reorder`; RC's also count as retransmitted).
    pub reordered: u64,
    /// Messages that found no receive for a plan's `rnr` (each try counts).
    pub rnr_naks: u64,
    /// Connection-manager events lost (`cm_drop`).
    pub cm_events_lost: u64,
    /// Connection-manager messages held for a plan's `cm_delay_us`.
    pub cm_events_delayed: u64,
    /// Completions lost to a plan's `cq_overrun`.
    pub cq_overruns: u64,
}

static DROPPED: AtomicU64 = AtomicU64::new(0);
static RETRANSMITTED: AtomicU64 = AtomicU64::new(0);
static RETRY_EXCEEDED: AtomicU64 = AtomicU64::new(0);
static DUP_DISCARDED: AtomicU64 = AtomicU64::new(0);
static DUP_DELIVERED: AtomicU64 = AtomicU64::new(0);
static DELAYED: AtomicU64 = AtomicU64::new(0);
static REORDERED: AtomicU64 = AtomicU64::new(0);
static RNR_NAKS: AtomicU64 = AtomicU64::new(0);
static CM_LOST: AtomicU64 = AtomicU64::new(0);
static CM_DELAYED: AtomicU64 = AtomicU64::new(0);
static CQ_OVERRUNS: AtomicU64 = AtomicU64::new(0);

/// The process's totals so far.
pub fn counts() -> FaultCounts {
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    FaultCounts {
        dropped: l(&DROPPED),
        retransmitted: l(&RETRANSMITTED),
        retry_exceeded: l(&RETRY_EXCEEDED),
        duplicates_discarded: l(&DUP_DISCARDED),
        duplicates_delivered: l(&DUP_DELIVERED),
        delayed: l(&DELAYED),
        reordered: l(&REORDERED),
        rnr_naks: l(&RNR_NAKS),
        cm_events_lost: l(&CM_LOST),
        cm_events_delayed: l(&CM_DELAYED),
        cq_overruns: l(&CQ_OVERRUNS),
    }
}

/// A QP's plan and its generator (splitmix64), and the message it holds back for the next one
/// to overtake.
#[derive(Debug)]
pub(crate) struct QpFaults {
    plan: FaultPlan,
    state: u64,
    pub(crate) held: Option<super::exec::Held>,
}

/// splitmix64's finish: `z` to a uniform value in `0.0..1.0`.
fn unit(mut z: u64) -> f64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// A message as a plan's draw sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Msg {
    pub(crate) len: u64,
    /// The path MTU.
    pub(crate) mtu: u64,
    /// RC (with `retry_cnt` retries, 7 for ever).
    pub(crate) reliable: bool,
    pub(crate) retry_cnt: u8,
    /// UD (a duplicate is delivered).
    pub(crate) datagram: bool,
    /// Not held for a delay before.
    pub(crate) fresh: bool,
    /// It takes a receive at its target.
    pub(crate) needs_recv: bool,
}

/// What a plan does to a message ([`QpFaults::draw_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drawn {
    /// Held this long first (`delay_us`), its other fates drawn when it goes on.
    Later(std::time::Duration),
    /// It finds no receive this try (`rnr`).
    Withheld,
    /// What the wire did to it.
    Wire(Fate),
}

/// What the wire did to a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// It arrives (an RC one perhaps after retries).
    Arrives,
    /// It arrives twice (UD).
    Twice,
    /// Lost (UC, UD).
    Lost,
    /// RC gave up: every try lost a packet.
    RetryExceeded,
    /// Overtaken by the next message (UC of one packet, UD): its delivery is held back.
    Overtaken,
}

impl QpFaults {
    pub(crate) fn new(plan: FaultPlan, qpn: u32) -> QpFaults {
        let state = plan.seed ^ (u64::from(qpn) << 32 | u64::from(qpn));
        QpFaults { plan, state, held: None }
    }

    /// How long a message is held before it goes on (counted as a delay), if at all.
    pub(super) fn delay(&self) -> Option<std::time::Duration> {
        if self.plan.delay_us == 0 {
            return None;
        }
        DELAYED.fetch_add(1, Ordering::Relaxed);
        Some(std::time::Duration::from_micros(u64::from(self.plan.delay_us)))
    }

    /// Whether a completion is lost to an overrun of its CQ (counted).
    pub(crate) fn overruns(&mut self) -> bool {
        if self.plan.cq_overrun <= 0.0 || self.draw() >= self.plan.cq_overrun {
            return false;
        }
        CQ_OVERRUNS.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Whether a message that needs a receive finds none this try (counted).
    fn withholds(&mut self) -> bool {
        if self.plan.rnr <= 0.0 || self.draw() >= self.plan.rnr {
            return false;
        }
        RNR_NAKS.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// A uniform draw in `0.0..1.0`.
    fn draw(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        unit(self.state)
    }

    /// What the plan does to a message it sends (`fresh`: not held for a delay before;
    /// `needs_recv`: it takes a receive at its target): held for its delay, no receive found,
    /// or what the wire did to it.
    pub(crate) fn draw_for(&mut self, msg: Msg) -> Drawn {
        if msg.fresh {
            if let Some(wait) = self.delay() {
                return Drawn::Later(wait);
            }
        }
        if msg.needs_recv && self.withholds() {
            return Drawn::Withheld;
        }
        Drawn::Wire(self.fate(msg.len, msg.mtu, msg.reliable, msg.retry_cnt, msg.datagram))
    }

    /// Whether one try of a message of `packets` packets loses one of them.
    fn loses(&mut self, packets: u64) -> bool {
        let p = self.plan.drop;
        if p <= 0.0 {
            return false;
        }
        let ok = (1.0 - p).powi(packets.min(i32::MAX as u64) as i32);
        let lost = self.draw() >= ok;
        if lost {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        lost
    }

    /// The fate of a message of `len` bytes on a path of `mtu` bytes: `reliable` (RC, with
    /// `retry_cnt` retries, 7 for ever) or not, `datagram` (UD: a duplicate is delivered).
    pub(crate) fn fate(
        &mut self,
        len: u64,
        mtu: u64,
        reliable: bool,
        retry_cnt: u8,
        datagram: bool,
    ) -> Fate {
        let packets = len.div_ceil(mtu.max(1)).max(1);
        if reliable {
            let mut tries = 0u32;
            while self.loses(packets) {
                if retry_cnt != 7 && tries >= u32::from(retry_cnt) {
                    RETRY_EXCEEDED.fetch_add(1, Ordering::Relaxed);
                    return Fate::RetryExceeded;
                }
                tries += 1;
                RETRANSMITTED.fetch_add(1, Ordering::Relaxed);
            }
        } else if self.loses(packets) {
            return Fate::Lost;
        }
        if self.plan.reorder > 0.0 && self.draw() < self.plan.reorder {
            REORDERED.fetch_add(1, Ordering::Relaxed);
            if reliable {
                // The gap is NAKed and resent from: in order, a retransmission later.
                RETRANSMITTED.fetch_add(1, Ordering::Relaxed);
            } else if packets > 1 {
                return Fate::Lost; // (UC: a packet out of order inside a message drops it)
            } else {
                return Fate::Overtaken;
            }
        }
        if self.plan.dup > 0.0 && self.draw() < self.plan.dup {
            if datagram {
                DUP_DELIVERED.fetch_add(1, Ordering::Relaxed);
                return Fate::Twice;
            }
            DUP_DISCARDED.fetch_add(1, Ordering::Relaxed);
        }
        Fate::Arrives
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_and_bad_ones_say_why() {
        let p = FaultPlan::parse("seed=7,drop=0.01, dup=0.5,delay_us=20").unwrap();
        assert_eq!(
            p,
            FaultPlan { seed: 7, drop: 0.01, dup: 0.5, delay_us: 20, ..FaultPlan::default() }
        );
        assert_eq!(FaultPlan::parse("reorder=0.25").unwrap().reorder, 0.25);
        assert_eq!(FaultPlan::parse("rnr=0.5").unwrap().rnr, 0.5);
        assert_eq!(FaultPlan::parse("cm_drop=1").unwrap().cm_drop, 1.0);
        assert_eq!(FaultPlan::parse("cq_overrun=0.5").unwrap().cq_overrun, 0.5);
        assert_eq!(FaultPlan::parse("").unwrap(), FaultPlan::default());
        for (text, says) in [
            ("drop=2", "0.0 to 1.0"),
            ("drop", "not key=value"),
            ("seed=-1", "unsigned"),
            ("loss=0.1", "unknown key `loss`"),
            ("reorder=1.5", "0.0 to 1.0"),
            ("delay_us=-5", "microseconds"),
            ("delay_us=20000000", "0 to 10000000"),
        ] {
            let e = FaultPlan::parse(text).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(text), "{text}: {e}");
        }
    }

    #[test]
    fn fates_are_the_seeds_and_follow_the_rates() {
        let plan = FaultPlan { seed: 42, drop: 0.1, dup: 0.05, ..FaultPlan::default() };
        let run = |qpn| {
            let mut f = QpFaults::new(plan, qpn);
            (0..10_000).map(|_| f.fate(8, 1024, false, 0, true)).collect::<Vec<_>>()
        };
        assert_eq!(run(17), run(17), "one seed, one QP: the same fates");
        assert_ne!(run(17), run(18), "another QP draws otherwise");
        let fates = run(17);
        let lost = fates.iter().filter(|f| **f == Fate::Lost).count();
        let twice = fates.iter().filter(|f| **f == Fate::Twice).count();
        assert!((800..1200).contains(&lost), "{lost} of 10,000 lost at 10 %");
        assert!((300..700).contains(&twice), "{twice} of 9,000 doubled at 5 %");
        // A message of 16 packets is lost when any is.
        let mut f = QpFaults::new(plan, 5);
        let big = (0..10_000).filter(|_| f.fate(16 * 1024, 1024, false, 0, false) == Fate::Lost);
        let n = big.count();
        assert!((7800..8700).contains(&n), "{n}: about 1 - 0.9^16 = 81 %");
        // RC: every message arrives, after retries, unless all retry_cnt + 1 tries lose.
        let mut f = QpFaults::new(FaultPlan { seed: 1, drop: 0.5, ..FaultPlan::default() }, 9);
        let rc: Vec<Fate> = (0..10_000).map(|_| f.fate(8, 1024, true, 6, false)).collect();
        let gave_up = rc.iter().filter(|f| **f == Fate::RetryExceeded).count();
        assert!((40..120).contains(&gave_up), "{gave_up}: about 0.5^7 = 0.8 %");
        let mut f = QpFaults::new(FaultPlan { seed: 1, drop: 1.0, ..FaultPlan::default() }, 9);
        assert_eq!(f.fate(8, 1024, true, 3, false), Fate::RetryExceeded);
        // Reordering: RC keeps its order (a retransmission), UC loses a message of several
        // packets, a message of one is overtaken.
        let mut f = QpFaults::new(FaultPlan { seed: 2, reorder: 1.0, ..FaultPlan::default() }, 9);
        assert_eq!(f.fate(8, 1024, true, 6, false), Fate::Arrives);
        assert_eq!(f.fate(4096, 1024, false, 0, false), Fate::Lost);
        assert_eq!(f.fate(8, 1024, false, 0, true), Fate::Overtaken);
    }
}
