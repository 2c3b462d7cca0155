//! A handle for threads outside the engine: requests go to one worker over an SPSC ring and
//! completions come back over another. A full ring hands the request back; nothing is dropped.

use crate::handoff::{ExtCompletion, ExtRequest};
use crate::ring::{Consumer, Producer};

/// An external thread's line to one worker. `Send` (hand it to the thread that will use it),
/// not `Clone` (one producer per ring):
///
/// ```
/// fn is_send<T: Send>() {}
/// is_send::<corelink_engine::Client>();
/// ```
///
/// ```compile_fail,E0277
/// fn is_clone<T: Clone>() {}
/// is_clone::<corelink_engine::Client>();
/// ```
///
/// # Examples
///
/// A thread of the application connects an engine to itself and sends a message; the
/// worker's handler (here: none, [`Handler`](crate::Handler)'s defaults) receives it:
///
/// ```
/// use corelink_engine::verbs::{soft::Soft, WcStatus};
/// use corelink_engine::{Engine, ExtOp, ExtRequest, Placement};
///
/// struct Quiet;
/// impl corelink_engine::Handler<Soft> for Quiet {}
///
/// let map = corelink_config::parse(
///     "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"10.98.0.2:0\"",
/// )?
/// .validate(&corelink_config::MachineTopology::load()?)?;
/// let mut engine = Engine::<Soft>::start(&map, Placement::RoundRobin, |_| Quiet)?;
/// let addr = engine.listen_addr().unwrap();
/// let mut client = engine.client(0)?;
/// let app = std::thread::spawn(move || {
///     let wait = std::time::Duration::from_secs(30);
///     let connect = ExtRequest { conn: None, op: ExtOp::Connect { addr }, data: vec![], token: 1 };
///     client.submit(connect).unwrap();
///     let conn = client.wait(wait).and_then(|d| d.conn).expect("connected");
///     let send = ExtOp::Send { imm: Some(7) };
///     client.submit(ExtRequest { conn: Some(conn), op: send, data: b"hi".to_vec(), token: 2 })
///         .unwrap();
///     let done = client.wait(wait).expect("the send's completion");
///     assert_eq!((done.token, done.status, done.data), (2, WcStatus::Success, b"hi".to_vec()));
/// });
/// app.join().unwrap();
/// engine.shutdown()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
