//! The posting half of the loop: queued requests become one linked list of work requests per
//! connection (one doorbell), receives are reposted, external submissions become requests,
//! and shutdown closes connections once their requests are done.

use arrayvec::ArrayVec;
use corelink_verbs::{
    Error as VerbsError, Provider, Qp, RecvWr, SendFlags, SendOp, SendWr, Sge, WcStatus,
};

use super::conn::{InFlight, Phase, Queued};
use super::cx::{Cx, Notice};
use super::recv_id;
use crate::handoff::{ExtCompletion, ExtOp, ExtRequest, Origin};
use crate::request::{CloseReason, ConnId, Done, OpKind};
use crate::tunables::MAX_POST_LIST;

/// How long a shutting-down worker lets requests in flight finish before it closes anyway.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The notice telling a request's issuer that it ended with `status` before reaching the device.
fn failed<P: Provider>(conn: ConnId, q: Queued<P>, status: WcStatus) -> Notice<P> {
    match q.origin {
        Origin::Handler => Notice::Done(Done {
            conn,
            token: q.token,
            kind: q.kind,
            status,
            buf: q.buf,
            old_value: None,
        }),
        Origin::Client(n) => Notice::Client(
            n,
            ExtCompletion {
                token: q.token,
                conn: Some(conn),
                status,
                data: q.ext_data.unwrap_or_default(),
                old_value: None,
                error: None,
            },
        ),
    }
}

fn inflight_failed<P: Provider>(f: InFlight<P>, status: WcStatus) -> Notice<P> {
    let q = Queued {
        kind: f.kind,
        buf: f.buf,
        remote: Default::default(),
        imm: None,
        arg: 0,
        swap: 0,
        token: f.token,
        origin: f.origin,
        ext_data: f.ext_data,
    };
    failed(f.conn, q, status)
}

impl<P: Provider> Cx<P> {
    /// Posts what the connections queued; returns whether anything was posted.
    pub(crate) fn flush(&mut self) -> bool {
        if self.stopping {
            self.close_for_shutdown();
        }
        let Cx { conns, inflight, notices, metrics, cfg, dirty, .. } = self;
        let mut posted_any = false;
        for &slot in dirty.iter() {
            let Some(c) = conns[slot as usize].as_mut() else { continue };
            if c.phase == Phase::Closing {
                while let Some(q) = c.queued.pop_front() {
                    notices.push_back(failed(c.id, q, WcStatus::WrFlushErr));
                }
                continue;
            }
            while !c.queued.is_empty() && c.outstanding < cfg.sq_depth {
                let room = (cfg.sq_depth - c.outstanding) as usize;
                let n = c.queued.len().min(MAX_POST_LIST).min(room);
                let mut sges = ArrayVec::<Sge, MAX_POST_LIST>::new();
                let mut ops = ArrayVec::<(u64, Queued<P>), MAX_POST_LIST>::new();
                for _ in 0..n {
                    let Some(mut q) = c.queued.pop_front() else { break };
                    let sge = match (&q.buf, q.kind) {
                        (Some(b), OpKind::FetchAdd | OpKind::CompareSwap) => {
                            Sge { length: 8, ..b.sge(true) }
                        }
                        (Some(b), _) => b.sge(false),
                        (None, _) => Sge::default(),
                    };
                    let f = InFlight {
                        conn: c.id,
                        kind: q.kind,
                        buf: q.buf.take(),
                        token: q.token,
                        origin: q.origin,
                        ext_data: q.ext_data.take(),
                    };
                    match inflight.insert(f) {
                        Ok(id) => {
                            sges.push(sge);
                            ops.push((id, q));
                        }
                        Err(f) => notices.push_back(inflight_failed(f, WcStatus::GeneralErr)),
                    }
                }
                let wrs: ArrayVec<SendWr<'_, P>, MAX_POST_LIST> = ops
                    .iter()
                    .zip(sges.chunks(1))
                    .map(|((id, q), sgl)| {
                        let op = match q.kind {
                            OpKind::Send => q.imm.map_or(SendOp::Send, SendOp::SendWithImm),
                            OpKind::Write => match q.imm {
                                Some(imm) => SendOp::WriteWithImm(q.remote, imm),
                                None => SendOp::Write(q.remote),
                            },
                            OpKind::Read => SendOp::Read(q.remote),
                            OpKind::FetchAdd => SendOp::FetchAdd { remote: q.remote, add: q.arg },
                            OpKind::CompareSwap => SendOp::CompareSwap {
                                remote: q.remote,
                                compare: q.arg,
                                swap: q.swap,
                            },
                        };
                        let inline = matches!(q.kind, OpKind::Send | OpKind::Write)
                            && sgl[0].length <= cfg.max_inline;
                        let flags = if inline {
                            SendFlags::SIGNALED | SendFlags::INLINE
                        } else {
                            SendFlags::SIGNALED
                        };
                        SendWr { wr_id: *id, op, sgl, flags, ud: None }
                    })
                    .collect();
                // SAFETY: every buffer a request names is held by its in-flight slot (not by the
                // application) until the request's completion is dispatched.
                let res = unsafe { c.qp.post_send(&wrs) };
                let k = match res {
                    Ok(()) => wrs.len(),
                    Err(VerbsError::PostSend { index, .. }) => index,
                    Err(_) => 0,
                };
                drop(wrs);
                c.outstanding += k as u32;
                metrics.posted += k as u64;
                metrics.doorbells += 1;
                posted_any |= k > 0;
                if k < ops.len() {
                    for (id, _) in &ops[k..] {
                        if let Some(f) = inflight.remove(*id) {
                            notices.push_back(inflight_failed(f, WcStatus::GeneralErr));
                        }
                    }
                    c.note_error(WcStatus::GeneralErr);
                    break;
                }
            }
        }
        posted_any
    }

    /// Puts receive buffer `idx` of connection `slot` back on the device.
    pub(crate) fn repost(&mut self, slot: usize, idx: usize, buf: crate::pool::Buf<P>) {
        let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) else { return };
        if c.phase != Phase::Open {
            return;
        }
        let sge = [buf.sge(true)];
        let wr = [RecvWr { wr_id: recv_id(slot as u16, idx), sgl: &sge }];
        // SAFETY: the buffer goes into `recvs` right below and stays there until its completion.
        if unsafe { c.qp.post_recv(&wr) }.is_ok() {
            c.recvs_posted += 1;
        }
        c.recvs[idx] = Some(buf);
    }

    /// Turns an external client's request into a queued one (or its immediate failure).
    pub(crate) fn submit_external(
        &mut self,
        n: u16,
        req: ExtRequest,
    ) -> Result<(), Box<ExtCompletion>> {
        let fail = |req: ExtRequest, error: String| {
            Box::new(ExtCompletion {
                token: req.token,
                conn: req.conn,
                status: WcStatus::GeneralErr,
                data: req.data,
                old_value: None,
                error: Some(error),
            })
        };
        if let ExtOp::Connect { addr } = req.op {
            if let Err(e) = self.connect_from(addr, &req.data, req.token, Origin::Client(n)) {
                return Err(fail(req, e.to_string()));
            }
            self.ext_connects.push((n, req.token, req.data));
            return Ok(());
        }
        let Some(conn) = req.conn else { return Err(fail(req, "no connection given".into())) };
        if let Err(e) = self.conn(conn).and_then(|c| match c.phase {
            _ if self.stopping => Err(crate::EngineError::ShuttingDown),
            Phase::Open => Ok(()),
            Phase::Closing => Err(crate::EngineError::ConnectionClosing(conn)),
        }) {
            return Err(fail(req, e.to_string()));
        }
        let (kind, len, remote, imm, arg, swap) = match req.op {
            ExtOp::Send { imm } => (OpKind::Send, req.data.len(), Default::default(), imm, 0, 0),
            ExtOp::Write { remote, imm } => (OpKind::Write, req.data.len(), remote, imm, 0, 0),
            ExtOp::Read { remote, len } => {
                if req.data.capacity() < len {
                    return Err(fail(
                        req,
                        format!("a read of {len} bytes needs a vector of that capacity"),
                    ));
                }
                (OpKind::Read, len, remote, None, 0, 0)
            }
            ExtOp::FetchAdd { remote, add } => (OpKind::FetchAdd, 8, remote, None, add, 0),
            ExtOp::CompareSwap { remote, compare, swap } => {
                (OpKind::CompareSwap, 8, remote, None, compare, swap)
            }
            ExtOp::Connect { .. } => return Ok(()),
        };
        let mut buf = match self.pool.get(len) {
            Ok(b) => b,
            Err(e) => return Err(fail(req, e.to_string())),
        };
        if matches!(kind, OpKind::Send | OpKind::Write) {
            if let Err(e) = buf.fill(&req.data) {
                return Err(fail(req, e.to_string()));
            }
        }
        let q = Queued {
            kind,
            buf: Some(buf),
            remote,
            imm,
            arg,
            swap,
            token: req.token,
            origin: Origin::Client(n),
            ext_data: Some(req.data),
        };
        self.enqueue(conn, q);
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
            self.shutdown_deadline = Some(self.now + SHUTDOWN_GRACE);
        }
    }

    fn close_for_shutdown(&mut self) {
        let late = self.shutdown_deadline.is_some_and(|d| self.now >= d);
        let ready: ArrayVec<ConnId, 64> = self
            .conns
            .iter()
            .flatten()
            .filter(|c| {
                c.phase == Phase::Open && (late || (c.outstanding == 0 && c.queued.is_empty()))
            })
            .map(|c| c.id)
            .take(64)
            .collect();
        for id in ready {
            let _ = self.begin_close(id, CloseReason::Shutdown);
        }
    }
}
