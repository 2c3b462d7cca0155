//! Intake and upkeep: receives are reposted, external clients' requests become the worker's, and
//! shutdown closes connections once their requests are done. (Posting is `sched.rs`.)

use arrayvec::ArrayVec;
use corelink_verbs::Provider;

use super::conn::Phase;
use super::cx::Cx;
use super::ids::RecvId;
use crate::client::{ClientRequest, Event};
use crate::handoff::Origin;
use crate::request::{CloseReason, ConnId, OpKind};

/// How long a shutting-down worker lets requests in flight finish before it closes anyway.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

impl<P: Provider> Cx<P> {
    /// Gives receive `id`'s buffer back to its lane, whose buffers back are posted again
    /// when due ([`super::recvs::Recvs::due`]); a failed post closes the connection. A
    /// closing connection's buffer goes back to the pool.
    pub(crate) fn repost(&mut self, id: RecvId, buf: crate::pool::Buf<P>) {
        let Some(c) = self.conns.at_mut(id.slot) else { return };
        if c.phase != Phase::Open || !id.is_of(c.id) {
            return;
        }
        let conn = c.id;
        let Some(lane) = c.lanes.get_mut(usize::from(id.lane)) else { return };
        lane.recvs.give_back(id.index, buf);
        if lane.recvs.due() && lane.recvs.post(&mut lane.qp, conn, id.lane).is_err() {
            self.metrics.recv_post_errors += 1;
            let _ = self.begin_close(conn, CloseReason::RecvPostFailed);
        }
    }

    /// Takes an external client's request (converted here, at the ring, into the worker's
    /// vocabulary: its vector's bytes go into a registered buffer); returns what the client is
    /// told at once when it is refused.
    pub(crate) fn client_request(&mut self, n: u16, req: ClientRequest) -> Option<Event> {
        let origin = Origin::Client(n);
        let (conn, op, token, class) = match req {
            ClientRequest::Close { conn } => {
                let error = self.begin_close(conn, CloseReason::Local).err()?;
                return Some(Event::CloseFailed { conn, error });
            }
            ClientRequest::Submit { conn, op, token, class } => (conn, op, token, class),
            ClientRequest::Dial { addr, private_data, token, policy } => {
                let error = self.dial(origin, addr, &private_data, token, policy).err()?;
                return Some(Event::ConnectFailed { token, error });
            }
            ClientRequest::StopDial { token } => {
                self.redials.stop(super::redial::DialKey { origin, token });
                return None;
            }
            // (never here: `Clients::next_request` keeps given-back vectors for the client)
            ClientRequest::Spare(_) => return None,
        };
        // Checked before a buffer is taken for it.
        if let Err(error) = self.check_open(conn) {
            return Some(Event::Refused { conn, token, op, error });
        }
        let kind = op.kind();
        let class = class.unwrap_or(self.cfg.classes[kind.index()]);
        let mut vector = Vec::new();
        let pool = &self.pool;
        let op = op.try_map_buf(|v: Vec<u8>| {
            let filled = pool.get(v.len()).and_then(|mut buf| {
                match kind {
                    OpKind::Read => buf.set_len(v.len())?,
                    _ => buf.fill(&v)?,
                }
                Ok(buf)
            });
            match filled {
                Ok(buf) => {
                    vector = v;
                    Ok(buf)
                }
                Err(e) => Err((v, e)),
            }
        });
        let op = match op {
            Ok(op) => op,
            Err((op, error)) => return Some(Event::Refused { conn, token, op, error }),
        };
        let queue = Some(self.cfg.queue(class));
        match self.accept_with(conn, op, token, origin, vector, queue, false) {
            Ok(_) => None,
            Err((op, vector, error)) => {
                // The registered buffer goes back to the pool; the client's vector to it.
                let op = op.map_buf(|_| vector);
                Some(Event::Refused { conn, token, op, error })
            }
        }
    }

    /// Starts a graceful shutdown: no new requests; each connection closes once its requests
    /// are done (or after a grace period).
    pub(crate) fn begin_shutdown(&mut self) {
        if !self.stopping {
            self.stopping = true;
            self.shutdown_deadline = Some(self.now() + SHUTDOWN_GRACE);
        }
    }

    pub(crate) fn close_for_shutdown(&mut self) {
        let late = self.shutdown_deadline.is_some_and(|d| self.now() >= d);
        let ready: ArrayVec<ConnId, 64> = self
            .conns
            .iter()
            .filter(|c| {
                // (a close waiting for its peer's disconnect waits no longer)
                let idle = || !c.has_waiting() && c.lanes.iter().all(|l| l.sq.posted.is_empty());
                c.awaits_peer() || (c.phase == Phase::Open && (late || idle()))
            })
            .map(|c| c.id)
            .take(64)
            .collect();
        for id in ready {
            let _ = self.begin_close(id, CloseReason::Shutdown);
        }
    }
}
