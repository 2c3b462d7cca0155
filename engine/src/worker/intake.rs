//! Intake and upkeep: receives are reposted, external submissions become requests, and
//! shutdown closes connections once their requests are done. (Posting is `sched.rs`.)

use arrayvec::ArrayVec;
use corelink_verbs::{Provider, Qp, RecvWr, WcStatus};

use super::conn::Phase;
use super::cx::Cx;
use super::ids::{RecvId, WrId};
use crate::handoff::{ExtCompletion, ExtOp, ExtRequest, Origin};
use crate::request::{CloseReason, ConnId, Op, OpKind};

/// How long a shutting-down worker lets requests in flight finish before it closes anyway.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

impl<P: Provider> Cx<P> {
    /// Puts receive `id`'s buffer back on the device; a failed post closes the connection.
    pub(crate) fn repost(&mut self, id: RecvId, buf: crate::pool::Buf<P>) {
        let Some(c) = self.conns.at_mut(id.slot) else { return };
        if c.phase != Phase::Open {
            return;
        }
        let Some(lane) = c.lanes.get_mut(usize::from(id.lane)) else { return };
        let sge = [buf.sge(true)];
        let wr = [RecvWr { wr_id: WrId::Recv(id).encode(), sgl: &sge }];
        // SAFETY: the buffer goes into `recvs` right below and stays there until its completion.
        let ok = unsafe { lane.qp.post_recv(&wr) }.is_ok();
        if ok {
            lane.recvs_posted += 1;
        }
        if let Some(r) = lane.recvs.get_mut(usize::from(id.index)) {
            *r = Some(buf);
        }
        if !ok {
            self.metrics.recv_post_errors += 1;
            let conn = c.id;
            let _ = self.begin_close(conn, CloseReason::RecvPostFailed);
        }
    }

    /// Turns an external client's request into a queued one (or its immediate failure).
    pub(crate) fn submit_external(
        &mut self,
        n: u16,
        req: ExtRequest,
    ) -> Result<(), Box<ExtCompletion>> {
        let ExtRequest { conn, op, data, token } = req;
        let fail = |data: Vec<u8>, error: crate::EngineError| {
            Box::new(ExtCompletion {
                token,
                conn,
                status: WcStatus::GeneralErr,
                data,
                old_value: None,
                error: Some(error),
            })
        };
        if let ExtOp::Connect { addr } = op {
            if let Err(e) = self.connect_from(addr, &data, token, Origin::Client(n)) {
                return Err(fail(data, e));
            }
            self.ext_connects.push((n, token, data));
            return Ok(());
        }
        let Some(conn) = conn else {
            return Err(fail(data, crate::EngineError::BadRequest("no connection given")));
        };
        // Checked before a buffer is taken for it.
        if let Err(e) = self.check_open(conn) {
            return Err(fail(data, e));
        }
        let (kind, len, remote, imm, arg, swap) = match op {
            ExtOp::Send { imm } => (OpKind::Send, data.len(), Default::default(), imm, 0, 0),
            ExtOp::Write { remote, imm } => (OpKind::Write, data.len(), remote, imm, 0, 0),
            ExtOp::Read { remote, len } => {
                if data.capacity() < len {
                    let capacity = data.capacity();
                    return Err(fail(data, crate::EngineError::ReadCapacity { len, capacity }));
                }
                (OpKind::Read, len, remote, None, 0, 0)
            }
            ExtOp::FetchAdd { remote, add } => (OpKind::FetchAdd, 8, remote, None, add, 0),
            ExtOp::CompareSwap { remote, compare, swap } => {
                (OpKind::CompareSwap, 8, remote, None, compare, swap)
            }
            ExtOp::Connect { .. } => return Ok(()),
        };
        let op = match kind {
            OpKind::FetchAdd => Op::FetchAdd { remote, add: arg },
            OpKind::CompareSwap => Op::CompareSwap { remote, compare: arg, swap },
            _ => {
                let filled = self.pool.get(len).and_then(|mut buf| {
                    match kind {
                        OpKind::Read => buf.set_len(len)?,
                        _ => buf.fill(&data)?,
                    }
                    Ok(buf)
                });
                let buf = match filled {
                    Ok(b) => b,
                    Err(e) => return Err(fail(data, e)),
                };
                match kind {
                    OpKind::Send => Op::Send { buf, imm },
                    OpKind::Write => Op::Write { buf, remote, imm },
                    _ => Op::Read { buf, remote },
                }
            }
        };
        let class = self.cfg.classes[kind.index()];
        let id = match self.accept_with(conn, op, token, Origin::Client(n), data) {
            Ok(id) => id,
            Err((_, data, e)) => return Err(fail(data, e)),
        };
        self.enqueue(conn, id, class);
        Ok(())
    }

    /// The vector an external client gave with connect `token` (empty if none is held).
    pub(crate) fn take_ext_connect(&mut self, n: u16, token: u64) -> Vec<u8> {
        match self.ext_connects.iter().position(|(c, t, _)| *c == n && *t == token) {
            Some(i) => self.ext_connects.swap_remove(i).2,
            None => Vec::new(),
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
                c.phase == Phase::Open
                    && (late
                        || (c.waiting.len == 0 && c.lanes.iter().all(|l| l.sq.posted.is_empty())))
            })
            .map(|c| c.id)
            .take(64)
            .collect();
        for id in ready {
            let _ = self.begin_close(id, CloseReason::Shutdown);
        }
    }
}
