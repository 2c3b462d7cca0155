//! A worker's timers: `(due, what)` in a heap sized at start; at most
//! [`MAX_TIMERS`](crate::tunables::MAX_TIMERS), beyond which setting one is refused. A timer
//! is the handler's (`Cx::set_timer`) or the next try of a reconnect policy.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// What a timer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Due {
    /// The handler's `on_timer(token)`.
    Handler(u64),
    /// The next try of a connect under a reconnect policy.
    Redial(super::redial::DialKey),
}

/// Due times and what is due then, soonest first.
#[derive(Debug)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, Due)>>,
    max: usize,
}

impl Timers {
    /// Room for `max` timers, reserved now.
    pub(crate) fn new(max: usize) -> Self {
        Timers { heap: BinaryHeap::with_capacity(max), max }
    }

    /// Sets a timer for `what` at `due`; refused (with the count held) when `max` are set.
    pub(crate) fn set(&mut self, due: Instant, what: Due) -> Result<(), usize> {
        if self.heap.len() >= self.max {
            return Err(self.heap.len());
        }
        self.heap.push(Reverse((due, what)));
        Ok(())
    }

    /// The soonest timer due at `now`, taken out.
    pub(crate) fn next_due(&mut self, now: Instant) -> Option<Due> {
        let Reverse((due, what)) = *self.heap.peek()?;
        if due > now {
            return None;
        }
        self.heap.pop();
        Some(what)
    }

    /// Whether no timer is set.
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timers_fire_in_due_order_and_a_full_set_refuses() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut t = Timers::new(3);
        t.set(ms(30), Due::Handler(3)).unwrap();
        t.set(ms(10), Due::Handler(1)).unwrap();
        t.set(ms(20), Due::Redial(super::super::redial::DialKey::handler(2))).unwrap();
        assert_eq!(t.set(ms(5), Due::Handler(4)), Err(3));
        assert_eq!(t.next_due(ms(0)), None);
        assert_eq!(t.next_due(ms(25)), Some(Due::Handler(1)));
        assert_eq!(
            t.next_due(ms(25)),
            Some(Due::Redial(super::super::redial::DialKey::handler(2)))
        );
        assert_eq!(t.next_due(ms(25)), None);
        assert_eq!(t.next_due(ms(30)), Some(Due::Handler(3)));
        assert!(t.is_empty());
    }
}
