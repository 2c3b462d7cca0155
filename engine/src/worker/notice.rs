//! What a worker tells its handler and its clients outside a completion's dispatch.

use corelink_verbs::{Provider, WcStatus};

use super::ids::ReqId;
use super::requests::{Req, Retired};
use crate::client::Event;
use crate::error::EngineError;
use crate::handoff::Origin;
use crate::pool::Buf;
use crate::request::{CloseReason, ConnId, Done};

/// Something the handler (or a client) is to be told, produced outside a completion's dispatch.
#[derive(Debug)]
pub(crate) enum Notice<P: Provider> {
    Done(Done<Buf<P>>),
    Client(u16, Event),
    /// Connect `token` of this issuer failed (tried again under its policy, if it has one).
    ConnectFailed(Origin, u64, EngineError),
    /// The connection, owned by this issuer, closed (made again under its policy, if any).
    Closed(Origin, ConnId, CloseReason),
}

impl<P: Provider> Notice<P> {
    /// The notice telling the issuer of request `id` (taken out as `r`) that it ended with
    /// `status` off the device. `data` is an external client's vector (see `Requests`).
    /// `None` for the worker's own keepalive probe, which nobody waits for.
    /// `closed_by`: the close it is a consequence of, if any.
    pub(crate) fn failed(
        id: ReqId,
        r: Req<P>,
        status: WcStatus,
        data: Vec<u8>,
        closed_by: Option<CloseReason>,
    ) -> Option<Notice<P>> {
        Some(match r.origin {
            Origin::Keepalive | Origin::Fence => return None,
            Origin::Handler => Notice::Done(Done {
                conn: r.conn,
                token: r.token,
                kind: r.kind,
                status,
                buf: r.buf,
                old_value: None,
                closed_by,
            }),
            Origin::Client(n) => {
                let done = Retired::of(id, r).client_done(status, data, None, closed_by);
                Notice::Client(n, Event::Done(done))
            }
        })
    }
}
