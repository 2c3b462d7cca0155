//! What a measuring loop checks while it waits: the run's deadline, a stop asked by the other
//! side's thread, and (client only) a stall: no progress for [`STALL`], which on UC and UD means
//! a message was lost (they do not retransmit).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corelink_verbs::{Cq, Wc};

/// How long a client waits without progress before it gives up.
pub const STALL: Duration = Duration::from_secs(10);

/// Idle polls between two checks.
pub const CHECK_EVERY: u32 = 1024;

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

/// A waiting loop's idle polls since its last progress: every [`CHECK_EVERY`]th is due for
/// the guard's check, with the time the wait is counted from, read at the first check (a wait
/// that ends sooner reads no clock: in the Soft-RoCE guest a read costs microseconds).
#[derive(Debug, Default)]
pub struct Idle {
    polls: u32,
    since: Option<Instant>,
}

impl Idle {
    /// One more idle poll: `Some(since)` when the guard is to be checked.
    #[inline]
    pub fn due(&mut self) -> Option<Instant> {
        self.polls = self.polls.wrapping_add(1);
        (self.polls % CHECK_EVERY == 0).then(|| *self.since.get_or_insert_with(Instant::now))
    }

    /// Progress: the wait starts again.
    #[inline]
    pub fn reset(&mut self) {
        *self = Idle::default();
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

/// Retires until at most `keep` requests are outstanding.
pub fn retire_until<C: Cq>(
    cq: &C,
    outstanding: &mut usize,
    keep: usize,
    g: &Guard,
    what: &str,
) -> Result<(), String> {
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
