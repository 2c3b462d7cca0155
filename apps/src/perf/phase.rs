//! Markers of a size's timed part, for profilers: both runners call [`timed_phase_begin`] just
//! before the first timed request of a size and [`timed_phase_end`] once its last one has
//! completed, on the thread that posts and polls (the engine's worker, the verbs runner's
//! client thread). Neither is inlined, so callgrind can cut a run at them:
//! `valgrind --tool=callgrind --separate-threads=yes --dump-before='*timed_phase_begin*'
//! --dump-before='*timed_phase_end*'` writes each thread's instructions before, during and
//! after the timed part as three parts (`benches/instructions.sh` reads them).

/// Called once just before the first timed request of a size.
#[inline(never)]
pub fn timed_phase_begin(size: usize) {
    // Something the optimiser must keep, so that the call (and the symbol) stays.
    std::hint::black_box(size);
}

/// Called once when the last timed request of a size has completed.
#[inline(never)]
pub fn timed_phase_end(size: usize) {
    std::hint::black_box(size);
}
