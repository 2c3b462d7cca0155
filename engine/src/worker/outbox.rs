//! What a worker has to tell others, apart from the completions it dispatches as they come:
//! notices for its handler and clients (closes, failed connects, requests that ended off the
//! device), delivered at fixed points of the loop; and messages to the control core, which go
//! over their SPSC ring, or, while the ring is full, wait in a backlog, in order. Nothing put
//! in the outbox is dropped: the worker stops only once its backlog is empty.

use std::collections::VecDeque;

use corelink_verbs::{Provider, Waker};

use super::notice::Notice;
use crate::handoff::ToControl;
use crate::ring::Producer;

/// A worker's outbox.
pub(crate) struct Outbox<P: Provider> {
    notices: VecDeque<Notice<P>>,
    to_control: Producer<ToControl<P>>,
    /// Messages the ring had no room for, oldest first (the ring's contents are older still).
    backlog: VecDeque<ToControl<P>>,
    /// Ends the control core's wait once a message is on the ring (it waits on its listener).
    wake: Option<Waker>,
}

impl<P: Provider> Outbox<P> {
    /// An outbox on the ring to the control core, with room reserved for `notices` notices
    /// and `backlog` messages before either queue grows.
    pub(crate) fn new(to_control: Producer<ToControl<P>>, notices: usize, backlog: usize) -> Self {
        Outbox {
            notices: VecDeque::with_capacity(notices),
            to_control,
            backlog: VecDeque::with_capacity(backlog),
            wake: None,
        }
    }

    /// The same, waking the control core with `wake` whenever a message reaches the ring.
    pub(crate) fn waking(self, wake: Waker) -> Self {
        Outbox { wake: Some(wake), ..self }
    }

    /// Queues a notice for the handler or a client.
    pub(crate) fn notify(&mut self, n: Notice<P>) {
        self.notices.push_back(n);
    }

    /// The oldest notice not yet delivered.
    pub(crate) fn next_notice(&mut self) -> Option<Notice<P>> {
        self.notices.pop_front()
    }

    /// Whether notices wait.
    #[inline(always)]
    pub(crate) fn has_notices(&self) -> bool {
        !self.notices.is_empty()
    }

    /// Sends `m` to the control core: over the ring, unless older messages wait (order) or
    /// the ring is full, then into the backlog.
    pub(crate) fn tell_control(&mut self, m: ToControl<P>) {
        if !self.backlog.is_empty() {
            self.backlog.push_back(m);
            return;
        }
        match self.to_control.push(m) {
            Ok(()) => self.wake_control(),
            Err(m) => self.backlog.push_back(m),
        }
    }

    fn wake_control(&self) {
        if let Some(w) = &self.wake {
            w.wake();
        }
    }

    /// Moves what the ring now has room for out of the backlog; returns whether the backlog
    /// is empty (everything told has reached the ring).
    pub(crate) fn flush_control(&mut self) -> bool {
        let before = self.backlog.len();
        while let Some(m) = self.backlog.pop_front() {
            if let Err(m) = self.to_control.push(m) {
                self.backlog.push_front(m);
                break;
            }
        }
        if self.backlog.len() < before {
            self.wake_control();
        }
        self.backlog.is_empty()
    }

    /// Whether messages wait in the backlog.
    #[inline(always)]
    pub(crate) fn control_waiting(&self) -> bool {
        !self.backlog.is_empty()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::ring::ring;
    use corelink_verbs::soft::Soft;

    fn key(m: ToControl<Soft>) -> u64 {
        match m {
            ToControl::Disconnect { cm_key } => cm_key,
            ToControl::Stopped => u64::MAX,
            _ => panic!("unexpected message"),
        }
    }

    #[test]
    fn nothing_told_is_lost_or_reordered_however_full_the_ring() {
        let (tx, mut rx) = ring::<ToControl<Soft>>(4);
        let mut out = Outbox::<Soft>::new(tx, 0, 0);
        for k in 0..300 {
            out.tell_control(ToControl::Disconnect { cm_key: k });
        }
        out.tell_control(ToControl::Stopped);
        assert!(out.control_waiting());
        let mut got = Vec::new();
        // The control core takes a little at a time; the worker flushes between.
        while !out.flush_control() || got.last() != Some(&u64::MAX) {
            if let Some(m) = rx.pop() {
                got.push(key(m));
            }
        }
        while let Some(m) = rx.pop() {
            got.push(key(m));
        }
        let want: Vec<u64> = (0..300).chain([u64::MAX]).collect();
        assert_eq!(got, want);
        assert!(!out.control_waiting());
    }

    #[test]
    fn a_message_told_while_others_wait_goes_after_them() {
        let (tx, mut rx) = ring::<ToControl<Soft>>(2);
        let mut out = Outbox::<Soft>::new(tx, 0, 0);
        for k in 0..3 {
            out.tell_control(ToControl::Disconnect { cm_key: k });
        }
        assert_eq!(rx.pop().map(key), Some(0)); // the ring has room again, the backlog waits
        out.tell_control(ToControl::Disconnect { cm_key: 3 });
        assert!(!out.flush_control());
        let got: Vec<u64> = std::iter::from_fn(|| rx.pop().map(key)).collect();
        assert_eq!(got, [1, 2]);
        assert!(out.flush_control());
        let got: Vec<u64> = std::iter::from_fn(|| rx.pop().map(key)).collect();
        assert_eq!(got, [3]);
    }
}
