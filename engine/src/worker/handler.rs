//! What an application runs on each worker: the [`Handler`] trait.

use corelink_verbs::Provider;

use super::completions::Completions;
use super::cx::Cx;
use super::redial::Redial;
use crate::error::EngineError;
use crate::pool::Buf;
use crate::request::{CloseReason, ConnId, ConnInfo, Done, Message};

/// What an application runs on each worker (thread-per-core): told of connections, messages,
/// completions of its own requests, closes and timers, it issues requests through [`Cx`].
/// It lives and runs on its worker's thread only, so it need not be `Send`.
#[allow(unused_variables)]
pub trait Handler<P: Provider>: 'static {
    /// Once, on the worker's thread, before its loop's first iteration: set-up that should
    /// not run among requests, such as registering the memory the handler will expose
    /// (a registration allocates and faults its pages in, and may sleep doing so).
    fn on_start(&mut self, cx: &mut Cx<P>) {}
    /// A connection is open on this worker (accepted, or made by `Cx::connect`).
    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {}
    /// A `Cx::connect` failed (print `error` with [`corelink_verbs::chain`] for its causes).
    fn on_connect_failed(&mut self, cx: &mut Cx<P>, token: u64, error: &EngineError) {}
    /// A connect made with a reconnect policy ([`Cx::connect_with`]) is about to be tried
    /// again: after its connection closed (which `on_closed` said just before), or after a
    /// try failed (`step.failed`). Once the policy's tries are spent, `on_connect_failed`
    /// tells the last try's error; a new connection comes as `on_connected` with the token.
    fn on_redial(&mut self, cx: &mut Cx<P>, step: &Redial<'_>) {}
    /// A send arrived, or a write-with-immediate's notice.
    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {}
    /// One of this handler's requests completed (or failed, or flushed).
    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {}
    /// Several of this handler's requests on one connection succeeded together (the requests
    /// one send-queue completion retired, with selective signalling up to
    /// `worker.batching.signal_every` of them), in post order. By default each goes to
    /// [`Handler::on_completion`]; a handler that streams requests can take them as a batch
    /// (one dispatch for all, e.g. posting the next window). Every request still ends exactly
    /// once: through one of the two calls, never both.
    fn on_completions(&mut self, cx: &mut Cx<P>, done: Completions<'_, P>) {
        for d in done {
            self.on_completion(cx, d);
        }
    }
    /// A connection closed; nothing of it is in flight any more.
    fn on_closed(&mut self, cx: &mut Cx<P>, conn: ConnId, reason: &CloseReason) {}
    /// A timer set with `Cx::set_timer` fired.
    fn on_timer(&mut self, cx: &mut Cx<P>, token: u64) {}
    /// Called once per loop iteration, after the completions: run-to-completion work.
    fn poll(&mut self, cx: &mut Cx<P>) {}
}
