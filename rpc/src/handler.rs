//! `RpcHandler`: the engine handler that runs an endpoint and its service on a worker.

use corelink_engine::verbs::Provider;
use corelink_engine::{
    Buf, CloseReason, ConnId, ConnInfo, Cx, Done, EngineError, Handler, Message,
};

use crate::endpoint::{Endpoint, Rpc};
use crate::handle::Inbox;
use crate::ids::SessionId;
use crate::service::{Service, SessionEnd, SessionEvent};

/// A worker's engine handler for RPC: it owns the worker's [`Endpoint`] and the [`Service`]
/// that uses it, turns the engine's connections and messages into sessions and calls, and
/// checks the calls' deadlines (every [`crate::EXPIRE_EVERY`] loop iterations).
pub struct RpcHandler<P: Provider, S: Service<P>> {
    endpoint: Endpoint<P>,
    service: S,
    /// The worker's ends of the handles' rings.
    inboxes: Vec<Inbox>,
}

impl<P: Provider, S: Service<P>> std::fmt::Debug for RpcHandler<P, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcHandler").field("endpoint", &self.endpoint).finish()
    }
}

impl<P: Provider, S: Service<P>> RpcHandler<P, S> {
    /// `endpoint` (its request handlers registered) run with `service`.
    pub fn new(endpoint: Endpoint<P>, service: S) -> Self {
        RpcHandler { endpoint, service, inboxes: Vec::new() }
    }

    /// The same, also carrying out the calls of the [`crate::Handle`] whose ring `inbox` ends
    /// (from [`crate::handle`]): up to [`crate::HANDLE_BATCH`] orders each loop iteration,
    /// before the service's [`Service::poll`].
    pub fn with_inbox(mut self, inbox: Inbox) -> Self {
        self.inboxes.push(inbox);
        self
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint<P> {
        &self.endpoint
    }

    /// After a session's `Closed`, why it ended.
    fn tell_end(
        &mut self,
        cx: &mut Cx<P>,
        event: Option<(SessionId, SessionEvent)>,
        end: SessionEnd<'_>,
    ) {
        if let Some((session, SessionEvent::Closed)) = event {
            let mut rpc = Rpc { ep: &mut self.endpoint, cx };
            self.service.on_session_end(&mut rpc, session, end);
        }
    }

    fn tell(&mut self, cx: &mut Cx<P>, event: Option<(SessionId, SessionEvent)>) {
        if let Some((session, event)) = event {
            let mut rpc = Rpc { ep: &mut self.endpoint, cx };
            self.service.on_session(&mut rpc, session, event);
        }
    }
}

impl<P: Provider, S: Service<P>> Handler<P> for RpcHandler<P, S> {
    // Messages sent while the loop dispatches completions (`on_message`, `on_completion`)
    // wait to go packed at the end of the pass (`poll`, which the loop runs right after);
    // the other events come elsewhere in the loop and send what they made before returning.

    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        let event = self.endpoint.on_connected(cx, conn, info);
        self.tell(cx, event);
        self.endpoint.flush_sends(cx);
    }

    fn on_connect_failed(&mut self, cx: &mut Cx<P>, token: u64, error: &EngineError) {
        let event = self.endpoint.on_connect_failed(cx, token);
        self.tell(cx, event);
        self.tell_end(cx, event, SessionEnd::ConnectFailed(error));
        self.endpoint.flush_sends(cx);
    }

    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        self.endpoint.on_message(cx, conn, msg.data);
    }

    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        if let Some(done) = self.endpoint.on_completion(cx, done) {
            let mut rpc = Rpc { ep: &mut self.endpoint, cx };
            self.service.on_completion(&mut rpc, done);
        }
    }

    fn on_closed(&mut self, cx: &mut Cx<P>, conn: ConnId, reason: &CloseReason) {
        let event = self.endpoint.on_closed(cx, conn, reason);
        self.tell(cx, event);
        self.tell_end(cx, event, SessionEnd::Closed(reason));
        self.endpoint.flush_sends(cx);
    }

    fn on_timer(&mut self, cx: &mut Cx<P>, token: u64) {
        let mut rpc = Rpc { ep: &mut self.endpoint, cx };
        self.service.on_timer(&mut rpc, token);
        self.endpoint.flush_sends(cx);
    }

    fn on_start(&mut self, cx: &mut Cx<P>) {
        // The large messages' arena, registered before any connection comes (a registration
        // blocks the worker, which a new connection's peer cannot wait for); had it failed,
        // the first session or large call tries again and says why.
        let _ = self.endpoint.prepare(cx);
    }

    fn poll(&mut self, cx: &mut Cx<P>) {
        self.endpoint.expire(cx);
        self.endpoint.slot_freed(cx);
        if self.endpoint.any_ended() {
            for (session, reason) in self.endpoint.take_ended() {
                let event = Some((session, SessionEvent::Closed));
                self.tell(cx, event);
                self.tell_end(cx, event, SessionEnd::Closed(&reason));
            }
        }
        let mut rpc = Rpc { ep: &mut self.endpoint, cx };
        for inbox in &mut self.inboxes {
            inbox.drain(&mut rpc);
        }
        self.service.poll(&mut rpc);
        self.endpoint.flush_sends(cx);
    }
}
