//! What a worker tells its handler and its clients outside a completion's dispatch.

use corelink_verbs::{Provider, WcStatus};

use super::conn::Req;
use crate::error::EngineError;
use crate::handoff::{ExtCompletion, Origin};
use crate::request::{CloseReason, ConnId, Done};

/// Something the handler (or a client) is to be told, produced outside a completion's dispatch.
#[derive(Debug)]
pub(crate) enum Notice<P: Provider> {
    Done(Done<P>),
    Client(u16, ExtCompletion),
    ConnectFailed(u64, EngineError),
    Closed(ConnId, CloseReason),
}

impl<P: Provider> Notice<P> {
    /// The notice telling a request's issuer that it ended with `status` off the device.
    /// `data` is an external client's vector (see `Requests`).
    pub(crate) fn failed(r: Req<P>, status: WcStatus, data: Vec<u8>) -> Notice<P> {
        match r.origin {
            Origin::Handler => Notice::Done(Done {
                conn: r.conn,
                token: r.token,
                kind: r.kind,
                status,
                buf: Some(r.buf),
                old_value: None,
            }),
            Origin::Client(n) => Notice::Client(
                n,
                ExtCompletion {
                    token: r.token,
                    conn: Some(r.conn),
                    status,
                    data,
                    old_value: None,
                    error: None,
                },
            ),
        }
    }
}
