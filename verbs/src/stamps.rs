//! Time stamps for `benches/guest-stamps.sh` (feature `guest-stamps`, not part of the API):
//! the ibverbs provider reads the time-stamp counter at each doorbell, each poll that finds a
//! completion and each empty poll, so that a ping-pong's round trip can be split between the
//! user code on each side and the kernel's path from a doorbell to the peer's completion. At
//! exit the stamps are written to `$CORELINK_STAMPS/<pid>.bin` (pairs of little-endian `u64`:
//! counter, [`Point`]); nothing is written without that variable.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Stamps kept at most (the later ones are dropped): a few seconds of a ping-pong.
const CAP: usize = 1 << 21;
/// Counter and point of each stamp, in the order taken.
static STAMPS: [[AtomicU64; 2]; CAP] = [const { [AtomicU64::new(0), AtomicU64::new(0)] }; CAP];
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Where a stamp is taken.
#[derive(Clone, Copy, Debug)]
#[repr(u64)]
pub enum Point {
    /// Before `ibv_post_send` (the doorbell's system call on rxe).
    DoorbellIn = 1,
    /// After `ibv_post_send`.
    DoorbellOut = 2,
    /// A poll found a receive's completion.
    Recv = 3,
    /// A poll found a send queue's completion.
    Send = 4,
    /// A poll found nothing.
    Empty = 5,
    /// Before `ibv_post_recv`.
    RepostIn = 6,
    /// After `ibv_post_recv`.
    RepostOut = 7,
}

/// Takes a stamp at `point`.
#[inline(always)]
pub fn stamp(point: Point) {
    // SAFETY: rdtsc reads the time-stamp counter and touches nothing else.
    let t = unsafe { core::arch::x86_64::_rdtsc() };
    let i = NEXT.fetch_add(1, Relaxed);
    if i == 0 {
        // SAFETY: `dump` takes no arguments and returns nothing, as atexit wants; it only
        // reads the stamps and writes a file.
        unsafe { libc::atexit(dump) };
    }
    if let Some([tsc, p]) = STAMPS.get(i) {
        tsc.store(t, Relaxed);
        p.store(point as u64, Relaxed);
    }
}

/// Writes the stamps out at exit (see the module's documentation).
extern "C" fn dump() {
    let Some(dir) = std::env::var_os("CORELINK_STAMPS") else { return };
    let n = NEXT.load(Relaxed).min(CAP);
    let mut out = Vec::with_capacity(n * 16);
    for [tsc, p] in &STAMPS[..n] {
        out.extend_from_slice(&tsc.load(Relaxed).to_le_bytes());
        out.extend_from_slice(&p.load(Relaxed).to_le_bytes());
    }
    let path = std::path::Path::new(&dir).join(format!("{}.bin", std::process::id()));
    if let Err(e) = std::fs::write(&path, out) {
        eprintln!("corelink: writing the stamps to {}: {e}", path.display());
    }
}
