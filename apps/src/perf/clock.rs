//! The latency tests' clock, and the bandwidth tests' for their peak rate: the CPU's
//! time-stamp counter on x86-64 (what perftest reads, its `get_cycles`), calibrated once
//! against the OS clock; the OS clock elsewhere. Reading the OS clock can cost a system call
//! or an emulated device read: in the Soft-RoCE guest, whose clock source is the HPET, about
//! 2.8 us. A sample's two reads are on one pinned worker thread, so one core's counter
//! serves both.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the calibration compares the two clocks.
const CALIBRATION: Duration = Duration::from_millis(20);

/// A calibrated tick source.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// Nanoseconds per tick (1 for the OS clock).
    ns_per_tick: f64,
    /// The OS clock's origin (ticks are nanoseconds since it), when there is no counter.
    origin: Option<Instant>,
}

impl Clock {
    /// The time-stamp counter, calibrated (x86-64), or the OS clock. The calibration spins
    /// for 20 ms, once a process: the first call makes it (the runners call this on the
    /// caller's thread before they start any, so that no worker spends its start on it), and
    /// every later one copies it.
    pub fn new() -> Clock {
        static CALIBRATED: OnceLock<Clock> = OnceLock::new();
        *CALIBRATED.get_or_init(Clock::calibrate)
    }

    fn calibrate() -> Clock {
        #[cfg(target_arch = "x86_64")]
        {
            let (t0, c0) = (Instant::now(), tsc());
            while t0.elapsed() < CALIBRATION {
                std::hint::spin_loop();
            }
            let (ns, ticks) = (t0.elapsed().as_nanos() as f64, tsc().wrapping_sub(c0));
            if ticks > 0 {
                return Clock { ns_per_tick: ns / ticks as f64, origin: None };
            }
        }
        Clock { ns_per_tick: 1.0, origin: Some(Instant::now()) }
    }

    /// The current tick.
    #[inline]
    pub fn ticks(&self) -> u64 {
        match self.origin {
            Some(o) => o.elapsed().as_nanos() as u64,
            None => tsc(),
        }
    }

    /// Ticks in `d` (at least 1).
    pub fn ticks_for(&self, d: Duration) -> u64 {
        ((d.as_nanos() as f64 / self.ns_per_tick) as u64).max(1)
    }

    /// Nanoseconds between two ticks.
    #[inline]
    pub fn ns_between(&self, from: u64, to: u64) -> u64 {
        (to.wrapping_sub(from) as f64 * self.ns_per_tick) as u64
    }

    /// Spans of ticks made nanoseconds, in place (latency samples, kept in ticks on the loop's
    /// path and converted once a size ends: no floating point per round trip).
    pub fn to_ns(&self, spans: &mut [u64]) {
        for t in spans {
            *t = self.ns_between(0, *t);
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// The time-stamp counter (0 where there is none).
#[inline]
fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC exists on every x86-64 CPU and only reads the counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_measure_time() {
        let c = Clock::new();
        let a = c.ticks();
        std::thread::sleep(Duration::from_millis(5));
        let ns = c.ns_between(a, c.ticks());
        assert!(ns >= 4_000_000, "{ns} ns for a 5 ms sleep");
    }
}
