//! The worker's coarse clock, for its periodic checks (keepalive passes, the looks that are
//! system calls): `CLOCK_MONOTONIC_COARSE`, the kernel's time at its last tick (1-10 ms ago),
//! read from the vDSO without reading the clocksource. Those checks need milliseconds; where
//! the clocksource is slow (the Soft-RoCE guest's HPET: a system call and about 2.8 us a
//! read), a fine clock read every `KEEPALIVE_EVERY` iterations took a busy worker's time.

use std::time::Duration;

/// The coarse clock: time since an arbitrary origin (the same for every thread).
pub(crate) fn now() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec that the call only writes.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    // (Linux has had the clock since 2.6.32; without it the checks would never be due: so
    // that they are, a reading of the fine clock, from a process-wide origin.)
    if rc != 0 {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        return ORIGIN.get_or_init(std::time::Instant::now).elapsed();
    }
    Duration::new(ts.tv_sec.unsigned_abs(), u32::try_from(ts.tv_nsec).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_coarse_clock_moves_forward_within_a_tick_of_the_fine_one() {
        // (read in this order, the coarse span is at least the fine one less a tick, however
        // long the thread waits between the reads; a tick is 10 ms at most: HZ = 100)
        let c0 = super::now();
        let f0 = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let f1 = std::time::Instant::now();
        let c1 = super::now();
        assert!(c1 > c0);
        let (dc, df) = (c1 - c0, f1 - f0);
        assert!(dc + std::time::Duration::from_millis(21) > df, "{dc:?} against {df:?}");
    }
}
