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

/// A bandwidth test's peak rate: the best completions per second over an interval of at
/// least [`crate::perf::engine_run::PEAK_INTERVAL`], sampled on the tick clock (no OS clock
/// read on a loop's path).
#[derive(Clone, Copy, Debug)]
pub struct Peak {
    clock: Clock,
    /// The interval in ticks.
    interval: u64,
    /// Since when (a tick), and the completions then.
    mark: (u64, u64),
    best: f64,
}

impl Peak {
    /// None yet, the first interval starting at tick `t`.
    pub fn new(clock: Clock, t: u64) -> Peak {
        let interval = clock.ticks_for(crate::perf::engine_run::PEAK_INTERVAL);
        Peak { clock, interval, mark: (t, 0), best: 0.0 }
    }

    /// At tick `t`, `done` completions since the start: an interval long enough ends here.
    #[inline]
    pub fn sample(&mut self, t: u64, done: u64) {
        if t.wrapping_sub(self.mark.0) >= self.interval {
            let secs = self.clock.ns_between(self.mark.0, t) as f64 / 1e9;
            self.best = self.best.max(done.saturating_sub(self.mark.1) as f64 / secs);
            self.mark = (t, done);
        }
    }

    /// The best rate so far (messages per second; 0 before a whole interval).
    pub fn rate(&self) -> f64 {
        self.best
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

    #[test]
    fn a_peak_is_the_best_whole_interval() {
        let c = Clock { ns_per_tick: 1.0, origin: Some(Instant::now()) };
        let ms = 1_000_000;
        let mut p = Peak::new(c, 0);
        p.sample(ms / 2, 10); // (no whole interval yet)
        assert_eq!(p.rate(), 0.0);
        p.sample(ms, 100); // 100 in 1 ms
        p.sample(3 * ms, 150); // 50 in 2 ms
        assert_eq!(p.rate(), 100_000.0);
    }
}
