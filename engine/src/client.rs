//! A handle for threads outside the engine: requests go to one worker over an SPSC ring and
//! completions come back over another. A full ring hands the request back; nothing is dropped.

use crate::handoff::{ExtCompletion, ExtRequest};
use crate::ring::{Consumer, Producer};

/// An external thread's line to one worker. `Send` (hand it to the thread that will use it),
/// not `Clone` (one producer per ring).
#[derive(Debug)]
pub struct Client {
    pub(crate) worker: usize,
    pub(crate) submit: Producer<ExtRequest>,
    pub(crate) done: Consumer<ExtCompletion>,
    pub(crate) thread: std::thread::Thread,
}

impl Client {
    /// The worker this client talks to.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// Submits a request; when the ring is full, or the worker has stopped, the request comes
    /// back (backpressure: nothing is dropped).
    pub fn submit(&mut self, req: ExtRequest) -> Result<(), ExtRequest> {
        if self.submit.is_abandoned() {
            return Err(req);
        }
        self.submit.push(req)?;
        self.thread.unpark(); // in case the worker parked (it does only without connections)
        Ok(())
    }

    /// The next completion, if one is there.
    pub fn poll(&mut self) -> Option<ExtCompletion> {
        self.done.pop()
    }

    /// Waits (spinning, then yielding) up to `timeout` for the next completion.
    pub fn wait(&mut self, timeout: std::time::Duration) -> Option<ExtCompletion> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(c) = self.done.pop() {
                return Some(c);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::yield_now();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::handoff::ExtOp;
    use crate::ring::ring;

    #[test]
    fn a_full_submission_ring_hands_the_request_back() {
        let (submit, _worker_end) = ring(2);
        let (_worker_done, done) = ring(2);
        let mut c = Client { worker: 0, submit, done, thread: std::thread::current() };
        let r = |t| ExtRequest {
            conn: None,
            op: ExtOp::Send { imm: None },
            data: vec![t as u8],
            token: t,
        };
        c.submit(r(1)).unwrap();
        c.submit(r(2)).unwrap();
        let back = c.submit(r(3)).unwrap_err();
        assert_eq!((back.token, back.data), (3, vec![3]));
        assert!(c.poll().is_none());
    }
}
