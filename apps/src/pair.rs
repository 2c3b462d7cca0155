//! A worker's handler made of two: a server part for the connections it accepted and a client
//! part for the one it made (`Cx::connect`); each hears only of its own connections,
//! completions and timers. The engine examples and `corelink-perf` run a server and a client
//! on one engine this way (loopback), or either alone.

use corelink_engine::verbs::Provider;
use corelink_engine::{
    Buf, CloseReason, Completions, ConnId, ConnInfo, Cx, Done, Handler, Message,
};

/// The two parts, routed by connection.
#[derive(Debug)]
pub struct Pair<S, C> {
    server: Option<S>,
    client: Option<C>,
    client_conn: Option<ConnId>,
    /// Timer tokens from this one up are the client's.
    client_timers: u64,
}

impl<S, C> Pair<S, C> {
    /// A handler with these parts; timers with tokens `client_timers` and up go to the client.
    pub fn new(server: Option<S>, client: Option<C>, client_timers: u64) -> Self {
        Pair { server, client, client_conn: None, client_timers }
    }

    fn is_client(&self, conn: ConnId) -> bool {
        self.client_conn == Some(conn)
    }
}

impl<P: Provider, S: Handler<P>, C: Handler<P>> Handler<P> for Pair<S, C> {
    fn on_start(&mut self, cx: &mut Cx<P>) {
        if let Some(s) = &mut self.server {
            s.on_start(cx);
        }
        if let Some(c) = &mut self.client {
            c.on_start(cx);
        }
    }

    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        if info.initiated {
            self.client_conn = Some(conn);
            if let Some(c) = &mut self.client {
                c.on_connected(cx, conn, info);
            }
        } else if let Some(s) = &mut self.server {
            s.on_connected(cx, conn, info);
        } else {
            // Nobody here serves accepted connections.
            let _ = cx.close(conn);
        }
    }

    fn on_connect_failed(
        &mut self,
        cx: &mut Cx<P>,
        token: u64,
        error: &corelink_engine::EngineError,
    ) {
        if let Some(c) = &mut self.client {
            c.on_connect_failed(cx, token, error);
        }
    }

    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        if self.is_client(conn) {
            if let Some(c) = &mut self.client {
                c.on_message(cx, conn, msg);
            }
        } else if let Some(s) = &mut self.server {
            s.on_message(cx, conn, msg);
        }
    }

    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        if self.is_client(done.conn) {
            if let Some(c) = &mut self.client {
                c.on_completion(cx, done);
            }
        } else if let Some(s) = &mut self.server {
            s.on_completion(cx, done);
        }
    }

    fn on_completions(&mut self, cx: &mut Cx<P>, done: Completions<'_, P>) {
        // (one connection's: routed once)
        if self.is_client(done.conn()) {
            if let Some(c) = &mut self.client {
                c.on_completions(cx, done);
            }
        } else if let Some(s) = &mut self.server {
            s.on_completions(cx, done);
        }
    }

    fn on_closed(&mut self, cx: &mut Cx<P>, conn: ConnId, reason: &CloseReason) {
        if self.is_client(conn) {
            if let Some(c) = &mut self.client {
                c.on_closed(cx, conn, reason);
            }
        } else if let Some(s) = &mut self.server {
            s.on_closed(cx, conn, reason);
        }
    }

    fn on_timer(&mut self, cx: &mut Cx<P>, token: u64) {
        if token >= self.client_timers {
            if let Some(c) = &mut self.client {
                c.on_timer(cx, token);
            }
        } else if let Some(s) = &mut self.server {
            s.on_timer(cx, token);
        }
    }

    #[inline(always)]
    fn poll(&mut self, cx: &mut Cx<P>) {
        if let Some(s) = &mut self.server {
            s.poll(cx);
        }
        if let Some(c) = &mut self.client {
            c.poll(cx);
        }
    }
}
