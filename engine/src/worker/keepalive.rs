//! Keepalive: a connection that goes `worker.keepalive_ms` without a completion gets a probe,
//! a zero-length RDMA write (no memory, no receive and no CPU needed at the peer: its NIC
//! acknowledges it), so that a peer that died, or whose wire did, is seen on an idle
//! connection too: the probe fails with `RetryExcErr` after the lane's retries and the
//! connection closes with `CloseReason::Unanswered`.
//!
//! A pass runs every half interval: a connection not heard from (no completion of its own)
//! since the previous pass, open and with no probe out, is probed. Its last traffic was then
//! between a half and a whole interval ago, so a dead peer is seen within
//! `keepalive_ms + (retry_cnt + 1) x timeout`.

use std::time::Duration;

use crate::request::ConnId;

/// What the keepalive keeps of one connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Liveness {
    /// A completion came for it since the last pass.
    pub(crate) heard: bool,
    /// Its probe is out.
    pub(crate) probing: bool,
}

impl Liveness {
    /// A connection just opened (as heard from: the first pass starts its idle time).
    pub(crate) fn new() -> Liveness {
        Liveness { heard: true, probing: false }
    }
}

/// The worker's keepalive passes.
#[derive(Debug)]
pub(crate) struct Keepalive {
    /// Half the interval: the time between passes.
    pass: Duration,
    /// When the next pass is due, on the worker's coarse clock (`None` until the first check).
    next: Option<Duration>,
    /// The connections the current pass probes (room for all of them reserved at start).
    due: Vec<ConnId>,
}

impl Keepalive {
    /// Probes after `every` without traffic, for at most `max_conns` connections.
    pub(crate) fn new(every: Duration, max_conns: usize) -> Keepalive {
        Keepalive { pass: every / 2, next: None, due: Vec::with_capacity(max_conns) }
    }

    /// Whether a pass is due at `now`, a reading of the worker's coarse clock (the first check
    /// only starts the clock).
    pub(crate) fn due(&mut self, now: Duration) -> bool {
        match self.next {
            Some(t) if now < t => false,
            Some(_) => {
                self.next = Some(now + self.pass);
                true
            }
            None => {
                self.next = Some(now + self.pass);
                false
            }
        }
    }

    /// A pass over `conns` (each with whether it may be probed: open, and its peer an engine,
    /// since a plain rdma_cm program's QP may refuse remote writes, which would close the
    /// connection): the connections to probe now,
    /// marked as probing; every other one's `heard` is cleared for the next pass.
    pub(crate) fn pick<'a>(
        &mut self,
        conns: impl Iterator<Item = (ConnId, bool, &'a mut Liveness)>,
    ) -> &[ConnId] {
        self.due.clear();
        for (id, probed, live) in conns {
            if !probed || live.probing {
                continue;
            }
            if std::mem::take(&mut live.heard) {
                continue;
            }
            live.probing = true;
            if self.due.len() < self.due.capacity() {
                self.due.push(id);
            }
        }
        &self.due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(slot: u16) -> ConnId {
        ConnId { worker: 0, slot, generation: 1 }
    }

    #[test]
    fn a_pass_is_due_every_half_interval_from_the_first_check() {
        let t0 = Duration::from_secs(7);
        let ms = |n| t0 + Duration::from_millis(n);
        let mut k = Keepalive::new(Duration::from_millis(100), 4);
        assert!(!k.due(t0));
        assert!(!k.due(ms(49)));
        assert!(k.due(ms(50)));
        assert!(!k.due(ms(99)));
        assert!(k.due(ms(130)));
        assert!(!k.due(ms(179)));
        assert!(k.due(ms(180)));
    }

    #[test]
    fn only_open_probed_connections_unheard_for_a_whole_pass_are_probed_once() {
        let mut k = Keepalive::new(Duration::from_millis(100), 8);
        // 0: heard at open, then silent; 1: busy; 2: a plain rdma_cm peer; 3: closing.
        let mut live = [Liveness::new(); 4];
        let pass = |k: &mut Keepalive, live: &mut [Liveness; 4]| {
            let it = live.iter_mut().enumerate().map(|(i, l)| (id(i as u16), i < 2, l));
            k.pick(it).to_vec()
        };
        // The first pass only clears what was heard.
        assert_eq!(pass(&mut k, &mut live), vec![]);
        live[1].heard = true;
        assert_eq!(pass(&mut k, &mut live), vec![id(0)]);
        assert!(live[0].probing && !live[1].heard);
        // A probe out is not doubled; once it is back (and heard), the count starts again.
        live[1].heard = true;
        assert_eq!(pass(&mut k, &mut live), vec![]);
        live[0].probing = false;
        live[0].heard = true;
        live[1].heard = true;
        assert_eq!(pass(&mut k, &mut live), vec![]);
        assert_eq!(pass(&mut k, &mut live), vec![id(0), id(1)]);
        assert!(!live[2].probing && !live[3].probing);
    }
}
