//! What a measuring loop checks while it waits: the run's deadline, a stop asked by the other
//! side's thread, and (client only) a stall: no progress for [`STALL`], which on UC and UD means
//! a message was lost (they do not retransmit).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corelink_verbs::{Cq, Wc};

use crate::perf::clock::Clock;

/// How long a client waits without progress before it gives up.
pub const STALL: Duration = Duration::from_secs(10);

/// Idle polls between two looks at the tick clock.
pub const CHECK_EVERY: u32 = 1024;

/// How often a waiting loop checks its guard at most (its deadline, a stop, a stall; the
/// servers also their control connection): rarely enough that the check's OS clock read and
/// system calls cost a spinning loop nothing, often enough against the guard's seconds.
pub const CHECK_PACE: Duration = Duration::from_millis(2);

/// The limits of a waiting loop.
#[derive(Debug, Clone)]
pub struct Guard {
    /// Give up at this instant.
    pub deadline: Option<Instant>,
    /// Set when the run is being abandoned.
    pub stop: Arc<AtomicBool>,
    /// Give up after this long without progress.
    pub stall: Option<Duration>,
    /// UC or UD: a stall names message loss as the likely cause.
    pub unreliable: bool,
}

impl Guard {
    /// `Err` if the loop must give up; `since` is its last progress, `what` what it awaits.
    pub fn check(&self, since: Instant, what: &str) -> Result<(), String> {
        if self.stop.load(Ordering::Relaxed) {
            return Err("stopped: the other side failed".into());
        }
        let now = Instant::now();
        if self.deadline.is_some_and(|d| now >= d) {
            return Err(format!("timed out waiting for {what}"));
        }
        match self.stall {
            Some(s) if now.duration_since(since) > s => Err(format!(
                "nothing for {} s while waiting for {what}{}",
                s.as_secs(),
                if self.unreliable {
                    " (UC and UD do not retransmit: a message was probably lost)"
                } else {
                    ""
                }
            )),
            _ => Ok(()),
        }
    }
}

/// A waiting loop's idle polls since its last progress. Every [`CHECK_EVERY`]th looks at the
/// tick clock (the time-stamp counter: no system call), and once [`CHECK_PACE`] has passed
/// since the wait began or since its last check, the guard is due, with the time the wait is
/// counted from (read at its first check). A wait shorter than that reads no OS clock: in the
/// Soft-RoCE guest a read costs about 2.8 us, and a spin on memory or on a CQ makes
/// `CHECK_EVERY` polls in a few microseconds, so that a look at the OS clock every
/// `CHECK_EVERY` polls cost the raw loop several reads a round trip.
#[derive(Debug, Default)]
pub struct Idle {
    polls: u32,
    clock: Clock,
    /// No check before this tick (`None`: the wait's first look sets it).
    next: Option<u64>,
    since: Option<Instant>,
}

impl Idle {
    /// One more idle poll: `Some(since)` when the guard is to be checked.
    #[inline]
    pub fn due(&mut self) -> Option<Instant> {
        self.polls = self.polls.wrapping_add(1);
        if self.polls % CHECK_EVERY != 0 {
            return None;
        }
        self.look()
    }

    #[inline(never)]
    fn look(&mut self) -> Option<Instant> {
        let now = self.clock.ticks();
        let due = self.next.is_some_and(|t| now >= t);
        if due || self.next.is_none() {
            self.next = Some(now.wrapping_add(self.clock.ticks_for(CHECK_PACE)));
        }
        due.then(|| *self.since.get_or_insert_with(Instant::now))
    }

    /// Progress: the wait starts again.
    #[inline]
    pub fn reset(&mut self) {
        (self.polls, self.next, self.since) = (0, None, None);
    }
}

/// Polls `cq` once for signalled send completions, each retiring one request; fails on an
/// error status. Returns how many it retired.
pub fn retire<C: Cq>(cq: &C, wcs: &mut [Wc], what: &str) -> Result<usize, String> {
    let n = cq.poll(wcs).map_err(|e| format!("polling the send CQ: {e}"))?;
    for wc in &wcs[..n] {
        if !wc.status.is_success() {
            return Err(format!("{what}: a send completed with {}", wc.status));
        }
    }
    Ok(n)
}

/// Retires until at most `keep` requests are outstanding (nothing to do, nothing done: the
/// latency loops call it once a round trip).
pub fn retire_until<C: Cq>(
    cq: &C,
    outstanding: &mut usize,
    keep: usize,
    g: &Guard,
    what: &str,
) -> Result<(), String> {
    if *outstanding <= keep {
        return Ok(());
    }
    let mut wcs = [Wc::default(); 16];
    let mut idle = Idle::default();
    while *outstanding > keep {
        let n = retire(cq, &mut wcs, what)?;
        *outstanding = outstanding.saturating_sub(n);
        if n == 0 {
            if let Some(since) = idle.due() {
                g.check(since, &format!("the completions of {what}"))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait's checks come only every `CHECK_EVERY` polls and once `CHECK_PACE` has passed
    /// (its first look only starts the pace), always with the same `since`; progress resets.
    /// (Only lower bounds on time are relied on: a slow machine just sleeps longer.)
    #[test]
    fn idle_checks_at_the_pace_only() {
        let mut idle = Idle::default();
        let polls = |idle: &mut Idle| (0..CHECK_EVERY).filter_map(|_| idle.due()).count();
        assert_eq!(polls(&mut idle), 0, "the first look starts the pace");
        std::thread::sleep(CHECK_PACE * 2);
        let first = (0..CHECK_EVERY).find_map(|_| idle.due()).expect("due after the pace");
        std::thread::sleep(CHECK_PACE * 2);
        let again = (0..CHECK_EVERY).find_map(|_| idle.due()).expect("due again");
        assert_eq!(first, again, "a wait keeps its start");
        idle.reset();
        assert_eq!(polls(&mut idle), 0, "progress starts a new wait");
    }
}
