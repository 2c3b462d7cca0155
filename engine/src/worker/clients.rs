//! A worker's external clients: each one's submission ring, its event ring, and the events its
//! ring could not take yet (they wait here, in order, and go to the client's overflow when the
//! worker stops, so that none is lost).

use std::collections::VecDeque;

use std::sync::Arc;

use crate::client::{ClientRequest, Event, Overflow, Waiter};
use crate::ring::{Consumer, Producer};
use crate::tunables::CLIENT_RING;

/// One client's ends, as its worker holds them.
struct End {
    requests: Consumer<ClientRequest>,
    events: Producer<Event>,
    /// Events waiting for room in `events` (everything after the first one waits too).
    backlog: VecDeque<Event>,
    overflow: Overflow,
    /// Wakes the client if it waits for an event.
    waiter: Arc<Waiter>,
    /// Vectors the client gave back ([`crate::Client::recycle`]) for its next messages (at
    /// most `CLIENT_RING`, reserved at start).
    spares: Vec<Vec<u8>>,
    /// A request taken that waits (for its connection, still coming up), before the ring's.
    held: Option<ClientRequest>,
}

impl Drop for End {
    fn drop(&mut self) {
        // The worker stops: what the ring could not take goes to the client (before the ring
        // end drops, which is how the client knows to look).
        if !self.backlog.is_empty() {
            if let Ok(mut o) = self.overflow.lock() {
                o.extend(self.backlog.drain(..));
            }
        }
        self.waiter.wake();
    }
}

/// The clients of one worker, by number (a request's `Origin::Client(n)`).
pub(crate) struct Clients {
    ends: Vec<End>,
    /// Events now waiting in backlogs, over every client.
    waiting: usize,
}

impl Clients {
    /// Room for `capacity` clients, reserved now.
    pub(crate) fn new(capacity: usize) -> Self {
        Clients { ends: Vec::with_capacity(capacity), waiting: 0 }
    }

    /// Adds a client; returns its number.
    pub(crate) fn add(
        &mut self,
        requests: Consumer<ClientRequest>,
        events: Producer<Event>,
        overflow: Overflow,
        waiter: Arc<Waiter>,
    ) -> u16 {
        let backlog = VecDeque::with_capacity(CLIENT_RING);
        let spares = Vec::with_capacity(CLIENT_RING);
        self.ends.push(End { requests, events, backlog, overflow, waiter, spares, held: None });
        (self.ends.len() - 1) as u16
    }

    /// Clients.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub(crate) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Client `n`'s next submission, if any (vectors it gave back are kept on the way, for
    /// its next messages: [`Clients::copy_for`]).
    pub(crate) fn next_request(&mut self, n: usize) -> Option<ClientRequest> {
        let end = self.ends.get_mut(n)?;
        if let Some(req) = end.held.take() {
            return Some(req);
        }
        loop {
            match end.requests.pop()? {
                ClientRequest::Spare(data) => {
                    // (at most CLIENT_RING kept: the rest are dropped)
                    if end.spares.len() < CLIENT_RING {
                        end.spares.push(data);
                    }
                }
                req => return Some(req),
            }
        }
    }

    /// Keeps client `n`'s request `req` (just taken) to be taken again first, next time.
    pub(crate) fn hold(&mut self, n: usize, req: ClientRequest) {
        if let Some(end) = self.ends.get_mut(n) {
            end.held = Some(req);
        }
    }

    /// A copy of `bytes` for client `n`: in a vector it gave back if it has one (no
    /// allocation when that holds them), else in a new one.
    pub(crate) fn copy_for(&mut self, n: u16, bytes: &[u8]) -> Vec<u8> {
        let spare = self.ends.get_mut(usize::from(n)).and_then(|e| e.spares.pop());
        let Some(mut v) = spare else { return bytes.to_vec() };
        v.clear();
        v.extend_from_slice(bytes);
        v
    }

    /// Tells client `n` `e` (in order after everything told before).
    pub(crate) fn tell(&mut self, n: u16, e: Event) {
        let Some(end) = self.ends.get_mut(usize::from(n)) else { return };
        if end.backlog.is_empty() {
            match end.events.push(e) {
                Ok(()) => return end.waiter.wake(),
                Err(e) => end.backlog.push_back(e),
            }
        } else {
            end.backlog.push_back(e);
        }
        self.waiting += 1;
    }

    /// Whether events wait for room in their client's ring.
    pub(crate) fn backlogged(&self) -> bool {
        self.waiting > 0
    }

    /// Moves waiting events into their rings while there is room.
    pub(crate) fn flush(&mut self) {
        for end in &mut self.ends {
            while let Some(e) = end.backlog.pop_front() {
                if let Err(e) = end.events.push(e) {
                    end.backlog.push_front(e);
                    break;
                }
                self.waiting -= 1;
                end.waiter.wake();
            }
        }
    }

    /// Submissions queued in the clients' rings now.
    pub(crate) fn queued(&self) -> usize {
        self.ends.iter().map(|e| e.requests.len() + usize::from(e.held.is_some())).sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::request::{CloseReason, ConnId};
    use crate::ring::ring;

    fn closed(slot: u16) -> Event {
        Event::Closed {
            conn: ConnId { worker: 0, slot, generation: 1 },
            reason: CloseReason::Local,
        }
    }

    fn slot(e: Option<Event>) -> u16 {
        match e {
            Some(Event::Closed { conn, .. }) => conn.slot,
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn events_beyond_the_ring_wait_in_order_and_reach_the_client_at_stop() {
        let (_submit, requests) = ring(2);
        let (events, mut client) = ring(2);
        let overflow = Overflow::default();
        let mut c = Clients::new(1);
        let n = c.add(requests, events, overflow.clone(), Arc::default());
        for s in 1..=5 {
            c.tell(n, closed(s));
        }
        assert!(c.backlogged());
        assert_eq!(slot(client.pop()), 1);
        c.flush();
        assert_eq!((slot(client.pop()), slot(client.pop())), (2, 3));
        assert!(c.backlogged());
        drop(c);
        assert!(client.pop().is_none());
        let o: Vec<u16> = overflow.lock().unwrap().drain(..).map(|e| slot(Some(e))).collect();
        assert_eq!(o, [4, 5]);
    }

    #[test]
    fn a_message_goes_in_a_vector_the_client_gave_back_else_in_a_new_one() {
        let (mut submit, requests) = ring(2);
        let (events, _client) = ring(2);
        let mut c = Clients::new(1);
        let n = c.add(requests, events, Overflow::default(), Arc::default());
        let spare = Vec::with_capacity(64);
        let at = spare.as_ptr();
        submit.push(ClientRequest::Spare(spare)).unwrap();
        assert!(c.next_request(usize::from(n)).is_none(), "a spare is kept, not handed on");
        let v = c.copy_for(n, b"hello");
        assert_eq!((v.as_slice(), v.as_ptr(), v.capacity()), (&b"hello"[..], at, 64), "reused");
        assert_eq!(c.copy_for(n, b"again"), b"again", "none left: a new one");
        // At most CLIENT_RING are kept (the rest are dropped).
        for _ in 0..CLIENT_RING + 5 {
            submit.push(ClientRequest::Spare(Vec::new())).unwrap();
            assert!(c.next_request(usize::from(n)).is_none());
        }
        assert_eq!(c.ends[0].spares.len(), CLIENT_RING);
    }

    #[test]
    fn a_held_request_comes_again_first_and_counts_as_queued() {
        let (mut submit, requests) = ring(4);
        let (events, _client) = ring(2);
        let mut c = Clients::new(1);
        let n = usize::from(c.add(requests, events, Overflow::default(), Arc::default()));
        let close = |slot| ClientRequest::Close { conn: ConnId { worker: 0, slot, generation: 1 } };
        submit.push(close(1)).unwrap();
        submit.push(close(2)).unwrap();
        let first = c.next_request(n).unwrap();
        assert_eq!(first.conn().map(|c| c.slot), Some(1));
        c.hold(n, first);
        assert_eq!(c.queued(), 2, "the held one and the one in the ring");
        let slots: Vec<u16> = std::iter::from_fn(|| c.next_request(n))
            .filter_map(|r| r.conn())
            .map(|c| c.slot)
            .collect();
        assert_eq!(slots, [1, 2]);
        assert_eq!(c.queued(), 0);
    }
}
