//! Connections whose completions cannot be trusted: the worker's CQ overran, or its device
//! failed. Such a device may never report what it lost (an overrun's completions are gone, and
//! with them the news of the unsignalled requests they would have retired), so once
//! [`UNTRUSTED_FLUSH_WAIT`] has passed since the last such event the worker ends what is still
//! posted on those connections itself, as flushed (`Metrics::completions_made_up`), and a
//! completion that comes for one after that is counted (`Metrics::late_completions`), not
//! taken for a broken invariant.

use std::time::Instant;

use crate::tunables::UNTRUSTED_FLUSH_WAIT;

/// When the worker last learnt that completions were lost, and whether it ever did.
#[derive(Debug, Default)]
pub(crate) struct Untrusted {
    since: Option<Instant>,
    ever: bool,
}

impl Untrusted {
    /// Completions were lost (now): what is posted is made up for after the wait.
    pub(crate) fn struck(&mut self, now: Instant) {
        self.since = Some(now);
        self.ever = true;
    }

    /// Whether a wait is running (one check on the periodic pass).
    pub(crate) fn waiting(&self) -> bool {
        self.since.is_some()
    }

    /// Whether the wait has run out at `now` (once per wait).
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        match self.since {
            Some(t) if now >= t + UNTRUSTED_FLUSH_WAIT => {
                self.since = None;
                true
            }
            _ => false,
        }
    }

    /// Whether completions were ever lost here (a completion whose request is gone is then
    /// a late one).
    pub(crate) fn ever(&self) -> bool {
        self.ever
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn due_once_after_the_wait_from_the_last_strike() {
        let t0 = Instant::now();
        let mut u = Untrusted::default();
        assert!(!u.waiting() && !u.ever() && !u.due(t0 + UNTRUSTED_FLUSH_WAIT));
        u.struck(t0);
        assert!(u.waiting() && u.ever());
        assert!(!u.due(t0));
        // A second strike starts the wait again.
        u.struck(t0 + UNTRUSTED_FLUSH_WAIT / 2);
        assert!(!u.due(t0 + UNTRUSTED_FLUSH_WAIT));
        assert!(u.due(t0 + UNTRUSTED_FLUSH_WAIT * 2));
        assert!(!u.due(t0 + UNTRUSTED_FLUSH_WAIT * 3), "once");
        assert!(!u.waiting() && u.ever());
    }
}
