//! A worker's timers: `(due, token)` in a heap sized at start; at most
//! [`MAX_TIMERS`](crate::tunables::MAX_TIMERS), beyond which setting one is refused.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// Due times and their tokens, soonest first.
#[derive(Debug)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    max: usize,
}

impl Timers {
    /// Room for `max` timers, reserved now.
    pub(crate) fn new(max: usize) -> Self {
        Timers { heap: BinaryHeap::with_capacity(max), max }
    }

    /// Sets a timer for `token` at `due`; refused (with the count held) when `max` are set.
    pub(crate) fn set(&mut self, due: Instant, token: u64) -> Result<(), usize> {
        if self.heap.len() >= self.max {
            return Err(self.heap.len());
        }
        self.heap.push(Reverse((due, token)));
        Ok(())
    }

    /// The token of the soonest timer due at `now`, taken out.
    pub(crate) fn next_due(&mut self, now: Instant) -> Option<u64> {
        let Reverse((due, token)) = *self.heap.peek()?;
        if due > now {
            return None;
        }
        self.heap.pop();
        Some(token)
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
        t.set(ms(30), 3).unwrap();
        t.set(ms(10), 1).unwrap();
        t.set(ms(20), 2).unwrap();
        assert_eq!(t.set(ms(5), 4), Err(3));
        assert_eq!(t.next_due(ms(0)), None);
        assert_eq!(t.next_due(ms(25)), Some(1));
        assert_eq!(t.next_due(ms(25)), Some(2));
        assert_eq!(t.next_due(ms(25)), None);
        assert_eq!(t.next_due(ms(30)), Some(3));
        assert!(t.is_empty());
    }
}
