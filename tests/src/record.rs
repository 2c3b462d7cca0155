//! What a case observed, recorded provider-independently for the fidelity report
//! (`corelink-conformance`): every completion the harness polled, in order, the bytes of memory
//! it read back (as one checksum), the old values atomics returned, and whether the case had to
//! declare itself unsupported on this device.
//!
//! Recording is per thread and off unless [`start`] was called, so the test suite pays nothing
//! for it. Nothing recorded depends on the provider or the run: no QP numbers, keys, addresses
//! or times.

use std::cell::RefCell;

use corelink_verbs::Wc;

/// One case's observations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Completions in the order the case polled them.
    pub completions: Vec<Wc>,
    /// FNV-1a (64-bit) of every byte the case read back from registered memory, in order.
    pub memory_fnv1a: u64,
    /// Bytes read back.
    pub memory_bytes: u64,
    /// Old values returned by atomics.
    pub atomic_values: Vec<u64>,
    /// Set when the device cannot run the case as written, with the reason.
    pub unsupported: Option<String>,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

thread_local! {
    static LOG: RefCell<Option<Observation>> = const { RefCell::new(None) };
}

fn with(f: impl FnOnce(&mut Observation)) {
    LOG.with(|l| {
        if let Some(o) = l.borrow_mut().as_mut() {
            f(o)
        }
    });
}

/// Starts recording on this thread (dropping anything recorded before).
pub fn start() {
    LOG.with(|l| {
        *l.borrow_mut() = Some(Observation { memory_fnv1a: FNV_OFFSET, ..Default::default() })
    });
}

/// Stops recording and returns what was recorded (empty if [`start`] was not called).
pub fn take() -> Observation {
    LOG.with(|l| l.borrow_mut().take()).unwrap_or_default()
}

/// Records a polled completion.
pub fn completion(wc: &Wc) {
    with(|o| o.completions.push(*wc));
}

/// Records bytes read back from registered memory.
pub fn memory(bytes: &[u8]) {
    with(|o| {
        for b in bytes {
            o.memory_fnv1a = (o.memory_fnv1a ^ u64::from(*b)).wrapping_mul(FNV_PRIME);
        }
        o.memory_bytes += bytes.len() as u64;
    });
}

/// Records the old value an atomic returned.
pub fn atomic_value(v: u64) {
    with(|o| o.atomic_values.push(v));
}

/// Declares the case unsupported on this device (the case may still check what the device
/// does instead; the report shows the reason rather than the observations).
pub fn unsupported(reason: &str) {
    with(|o| o.unsupported = Some(reason.to_owned()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_unless_started() {
        memory(b"abc");
        assert_eq!(take(), Observation::default());
        start();
        memory(b"a");
        atomic_value(7);
        let o = take();
        assert_eq!(o.memory_fnv1a, 0xaf63_dc4c_8601_ec8c, "FNV-1a of \"a\"");
        assert_eq!((o.memory_bytes, o.atomic_values), (1, vec![7]));
        assert_eq!(take(), Observation::default());
    }
}
