//! The peer process: side B's `soft` objects in a table, each [`Call`] run on them as it comes.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::net::UnixStream;

use corelink_verbs::soft::{
    Soft, SoftAccepting, SoftAh, SoftConnRequest, SoftConnecting, SoftConnection, SoftContext,
    SoftCq, SoftListener, SoftMr, SoftMw, SoftPd, SoftQp, SoftSrq,
};
use corelink_verbs::{
    Accepting, ConnRequest, Connecting, Connection, Context, Cq, Error, Listener, Mr, Mw, Pd,
    Progress, Provider, Qp, QpInitAttr, RecvWr, RemoteAddr, Result, SendOp, SendWr, Sge, Srq,
    UdDest, Wc,
};
use serde::Serialize;

use super::wire::{self, Call, ConnInfo, Id, MrInfo, QpInfo, RemoteError, RequestInfo, WireOp};

enum Obj {
    Ctx(SoftContext),
    Pd(SoftPd),
    Mr(SoftMr),
    Mw(SoftMw),
    Cq(SoftCq),
    Srq(SoftSrq),
    Qp(SoftQp),
    Ah(SoftAh),
    Listener(SoftListener),
    Request(SoftConnRequest),
    Accepting(SoftAccepting),
    Connecting(SoftConnecting),
    Connection(SoftConnection),
}

/// Side B's objects by id, and the next id.
#[derive(Default)]
struct Table {
    objs: BTreeMap<Id, Obj>,
    last: Id,
}

fn missing(kind: &str, id: Id) -> Error {
    Error::InvalidArgument(format!("the peer process holds no {kind} {id}"))
}

/// A shared reference to object `$id` of kind `$v`, or the error.
macro_rules! get {
    ($t:expr, $id:expr, $v:ident) => {
        match $t.objs.get(&$id) {
            Some(Obj::$v(o)) => o,
            _ => return Err(missing(stringify!($v), $id)),
        }
    };
}

/// Object `$id` of kind `$v`, out of the table.
macro_rules! take {
    ($t:expr, $id:expr, $v:ident) => {
        match $t.objs.remove(&$id) {
            Some(Obj::$v(o)) => o,
            Some(other) => {
                $t.objs.insert($id, other);
                return Err(missing(stringify!($v), $id));
            }
            None => return Err(missing(stringify!($v), $id)),
        }
    };
}

fn reply<T: Serialize>(r: Result<T>) -> Vec<u8> {
    let r: std::result::Result<T, RemoteError> = r.map_err(RemoteError::from);
    postcard::to_stdvec(&r).unwrap_or_default()
}

fn recvs(wrs: &[wire::WireRecv]) -> Vec<RecvWr<'_>> {
    wrs.iter().map(|w| RecvWr { wr_id: w.wr_id, sgl: &w.sgl }).collect()
}

fn progress(t: &mut Table, p: Progress<Soft, impl Into<Obj>>) -> wire::Progress {
    match p {
        Progress::Ready(c) => {
            let peer_private_data = c.peer_private_data().to_vec();
            Ok(ConnInfo { id: t.put(Obj::Connection(c)), peer_private_data })
        }
        Progress::Pending(p) => Err(t.put(p.into())),
    }
}

fn open_accepting(o: Obj) -> Option<SoftAccepting> {
    match o {
        Obj::Accepting(a) => Some(a),
        _ => None,
    }
}

impl From<SoftAccepting> for Obj {
    fn from(a: SoftAccepting) -> Obj {
        Obj::Accepting(a)
    }
}

impl From<SoftConnecting> for Obj {
    fn from(c: SoftConnecting) -> Obj {
        Obj::Connecting(c)
    }
}

impl Table {
    fn put(&mut self, o: Obj) -> Id {
        self.last += 1;
        self.objs.insert(self.last, o);
        self.last
    }

    /// Puts `o` back under `id` (after a call that needed it by value or `&mut`).
    fn back(&mut self, id: Id, o: Obj) {
        self.objs.insert(id, o);
    }

    /// Runs `call`; returns the encoded answer.
    fn run(&mut self, call: Call) -> Vec<u8> {
        match call {
            Call::Open { name } => reply(Soft::open(&name).map(|c| self.put(Obj::Ctx(c)))),
            Call::OpenSibling { ctx } => {
                reply(self.with_ctx(ctx, |c| c.open_sibling()).map(|c| self.put(Obj::Ctx(c))))
            }
            Call::QueryDevice { ctx } => reply(self.with_ctx(ctx, |c| c.query_device())),
            Call::QueryPort { ctx, port } => reply(self.with_ctx(ctx, |c| c.query_port(port))),
            Call::QueryGid { ctx, port, index } => {
                reply(self.with_ctx(ctx, |c| c.query_gid(port, index)))
            }
            Call::AllocPd { ctx } => {
                reply(self.with_ctx(ctx, |c| c.alloc_pd()).map(|pd| self.put(Obj::Pd(pd))))
            }
            Call::CreateCq { ctx, depth } => reply(
                self.with_ctx(ctx, |c| c.create_cq(depth))
                    .map(|cq| (cq.depth(), cq.handle(), cq))
                    .map(|(d, h, cq)| (self.put(Obj::Cq(cq)), d, h)),
            ),
            Call::PollAsyncEvent { ctx } => reply(self.with_ctx(ctx, |c| c.poll_async_event())),
            Call::Listen { ctx, addr } => reply(
                self.with_ctx(ctx, |c| c.listen(addr))
                    .map(|l| (l.local_addr(), l))
                    .map(|(a, l)| (self.put(Obj::Listener(l)), a)),
            ),
            Call::ConnectStart { ctx, addr, qp, attr, private_data, timeout } => {
                reply(self.connect_start(ctx, addr, qp, &attr, &private_data, timeout))
            }
            Call::Register { pd, len, access } => reply(self.register(pd, len, access)),
            Call::AllocMw { pd } => reply(self.alloc_mw(pd)),
            Call::CreateSrq { pd, attr } => reply(self.create_srq(pd, &attr)),
            Call::CreateQp { pd, qp_type, send_cq, recv_cq, srq, cap, sq_sig_all } => {
                reply(self.create_qp(pd, qp_type, send_cq, recv_cq, srq, cap, sq_sig_all))
            }
            Call::CreateAh { pd, attr } => reply(self.create_ah(pd, &attr)),
            Call::MrWrite { mr, offset, data } => reply(self.mr(mr, |m| m.write_at(offset, &data))),
            Call::MrRead { mr, offset, len } => reply(self.mr(mr, |m| {
                let mut v = vec![0; len];
                m.read_at(offset, &mut v).map(|()| v)
            })),
            Call::MrReadU64 { mr, offset } => reply(self.mr(mr, |m| m.read_u64(offset))),
            Call::MrWriteU64 { mr, offset, value } => {
                reply(self.mr(mr, |m| m.write_u64(offset, value)))
            }
            Call::MwRkey { mw } => reply(self.mw_rkey(mw)),
            Call::Poll { cq, max } => reply(self.poll(cq, max)),
            Call::SrqPostRecv { srq, wrs } => reply(self.srq_post_recv(srq, &wrs)),
            Call::QpState { qp } => reply(self.qp(qp, |q| Ok(q.state()))),
            Call::Modify { qp, attr } => reply(self.qp(qp, |q| q.modify(&attr))),
            Call::PostSend { qp, wrs } => reply(self.post_send(qp, &wrs)),
            Call::PostRecv { qp, wrs } => reply(self.qp(qp, |q| {
                // SAFETY: the buffers are the peer's registered memory, named by the runner,
                // whose case keeps each region alive until its requests completed (the
                // `post_recv` contract, which the runner's caller took on).
                unsafe { q.post_recv(&recvs(&wrs)) }
            })),
            Call::GetRequest { listener, timeout } => reply(self.get_request(listener, timeout)),
            Call::AcceptStart { request, qp, attr, private_data } => {
                reply(self.accept_start(request, qp, &attr, &private_data))
            }
            Call::Reject { request, private_data } => reply(self.reject(request, &private_data)),
            Call::AcceptingPoll { accepting, qp, timeout } => {
                reply(self.accepting_poll(accepting, qp, timeout))
            }
            Call::AcceptingAbandon { accepting, qp } => {
                reply(self.accepting_abandon(accepting, qp).map(RemoteError::from))
            }
            Call::ConnectingPoll { connecting, qp, timeout } => {
                reply(self.connecting_poll(connecting, qp, timeout))
            }
            Call::PollEvent { connection, timeout } => {
                reply(self.connection(connection, |c| c.poll_event(timeout)))
            }
            Call::Disconnect { connection } => {
                reply(self.connection(connection, |c| c.disconnect()))
            }
            Call::Drop { id } => {
                self.objs.remove(&id);
                reply(Ok(()))
            }
        }
    }

    fn with_ctx<T>(&self, ctx: Id, f: impl FnOnce(&SoftContext) -> Result<T>) -> Result<T> {
        f(get!(self, ctx, Ctx))
    }

    fn mr<T>(&self, mr: Id, f: impl FnOnce(&SoftMr) -> Result<T>) -> Result<T> {
        f(get!(self, mr, Mr))
    }

    fn qp<T>(&mut self, id: Id, f: impl FnOnce(&mut SoftQp) -> Result<T>) -> Result<T> {
        let mut qp = take!(self, id, Qp);
        let r = f(&mut qp);
        self.back(id, Obj::Qp(qp));
        r
    }

    fn connection<T>(
        &mut self,
        id: Id,
        f: impl FnOnce(&mut SoftConnection) -> Result<T>,
    ) -> Result<T> {
        let mut c = take!(self, id, Connection);
        let r = f(&mut c);
        self.back(id, Obj::Connection(c));
        r
    }

    fn connect_start(
        &mut self,
        ctx: Id,
        addr: std::net::SocketAddr,
        qp_id: Id,
        attr: &corelink_verbs::QpAttr,
        private_data: &[u8],
        timeout: std::time::Duration,
    ) -> Result<Id> {
        let mut qp = take!(self, qp_id, Qp);
        let r = match self.objs.get(&ctx) {
            Some(Obj::Ctx(c)) => c.connect_start(addr, &mut qp, attr, private_data, timeout),
            _ => Err(missing("Ctx", ctx)),
        };
        self.back(qp_id, Obj::Qp(qp));
        r.map(|c| self.put(Obj::Connecting(c)))
    }

    fn register(
        &mut self,
        pd: Id,
        len: usize,
        access: corelink_verbs::AccessFlags,
    ) -> Result<MrInfo> {
        let mr = get!(self, pd, Pd).register(len, access)?;
        let info = MrInfo {
            id: 0,
            addr: mr.addr(),
            len: mr.len(),
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            access: mr.access(),
        };
        Ok(MrInfo { id: self.put(Obj::Mr(mr)), ..info })
    }

    fn alloc_mw(&mut self, pd: Id) -> Result<(Id, u32)> {
        let mw = get!(self, pd, Pd).alloc_mw()?;
        let rkey = mw.rkey();
        Ok((self.put(Obj::Mw(mw)), rkey))
    }

    fn create_srq(&mut self, pd: Id, attr: &corelink_verbs::SrqAttr) -> Result<(Id, u64)> {
        let srq = get!(self, pd, Pd).create_srq(attr)?;
        let handle = srq.handle();
        Ok((self.put(Obj::Srq(srq)), handle))
    }

    #[allow(clippy::too_many_arguments)]
    fn create_qp(
        &mut self,
        pd: Id,
        qp_type: corelink_verbs::QpType,
        send_cq: Id,
        recv_cq: Id,
        srq: Option<Id>,
        cap: corelink_verbs::QpCap,
        sq_sig_all: bool,
    ) -> Result<QpInfo> {
        let srq = match srq {
            Some(id) => Some(get!(self, id, Srq)),
            None => None,
        };
        let attr = QpInitAttr::<Soft> {
            qp_type,
            send_cq: get!(self, send_cq, Cq),
            recv_cq: get!(self, recv_cq, Cq),
            srq,
            cap,
            sq_sig_all,
        };
        let qp = get!(self, pd, Pd).create_qp(&attr)?;
        let info = QpInfo { id: 0, qpn: qp.qp_num(), qp_type: qp.qp_type(), cap: qp.cap() };
        Ok(QpInfo { id: self.put(Obj::Qp(qp)), ..info })
    }

    fn create_ah(&mut self, pd: Id, attr: &corelink_verbs::AhAttr) -> Result<Id> {
        let ah = get!(self, pd, Pd).create_ah(attr)?;
        Ok(self.put(Obj::Ah(ah)))
    }

    fn mw_rkey(&self, mw: Id) -> Result<u32> {
        Ok(get!(self, mw, Mw).rkey())
    }

    fn poll(&self, cq: Id, max: usize) -> Result<Vec<Wc>> {
        let mut out = vec![Wc::default(); max.min(4096)];
        let n = get!(self, cq, Cq).poll(&mut out)?;
        out.truncate(n);
        Ok(out)
    }

    fn srq_post_recv(&self, srq: Id, wrs: &[wire::WireRecv]) -> Result<()> {
        // SAFETY: as for a QP's receives (see `run`).
        unsafe { get!(self, srq, Srq).post_recv(&recvs(wrs)) }
    }

    fn post_send(&mut self, id: Id, wrs: &[wire::WireSend]) -> Result<()> {
        let mut qp = take!(self, id, Qp);
        let r = self.build_sends(wrs).and_then(|wrs| {
            // SAFETY: as for receives (see `run`): every buffer is the peer's registered memory
            // (inline requests too: the runner names the peer's memory), kept alive by the case.
            unsafe { qp.post_send(&wrs) }
        });
        self.back(id, Obj::Qp(qp));
        r
    }

    fn build_sends<'a>(&'a self, wrs: &'a [wire::WireSend]) -> Result<Vec<SendWr<'a, Soft>>> {
        wrs.iter()
            .map(|w| {
                let op = match w.op {
                    WireOp::Send => SendOp::Send,
                    WireOp::SendWithImm(i) => SendOp::SendWithImm(i),
                    WireOp::SendWithInv(k) => SendOp::SendWithInv(k),
                    WireOp::Write(addr, rkey) => SendOp::Write(RemoteAddr { addr, rkey }),
                    WireOp::WriteWithImm(addr, rkey, i) => {
                        SendOp::WriteWithImm(RemoteAddr { addr, rkey }, i)
                    }
                    WireOp::Read(addr, rkey) => SendOp::Read(RemoteAddr { addr, rkey }),
                    WireOp::CompareSwap { addr, rkey, compare, swap } => {
                        SendOp::CompareSwap { remote: RemoteAddr { addr, rkey }, compare, swap }
                    }
                    WireOp::FetchAdd { addr, rkey, add } => {
                        SendOp::FetchAdd { remote: RemoteAddr { addr, rkey }, add }
                    }
                    WireOp::BindMw { mw, mr, addr, len, access } => SendOp::BindMw {
                        mw: get!(self, mw, Mw),
                        mr: get!(self, mr, Mr),
                        addr,
                        len,
                        access,
                    },
                    WireOp::LocalInv(k) => SendOp::LocalInv(k),
                };
                let ud = match w.ud {
                    Some((ah, qpn, qkey)) => Some(UdDest { ah: get!(self, ah, Ah), qpn, qkey }),
                    None => None,
                };
                let sgl: &[Sge] = &w.sgl;
                Ok(SendWr { wr_id: w.wr_id, op, sgl, flags: w.flags, ud })
            })
            .collect()
    }

    fn get_request(
        &mut self,
        listener: Id,
        timeout: std::time::Duration,
    ) -> Result<Option<RequestInfo>> {
        let mut l = take!(self, listener, Listener);
        let r = l.get_request(timeout);
        self.back(listener, Obj::Listener(l));
        Ok(r?.map(|req| {
            let (private_data, peer_addr) = (req.private_data().to_vec(), req.peer_addr());
            RequestInfo { id: self.put(Obj::Request(req)), private_data, peer_addr }
        }))
    }

    /// Runs `f` with object `id` (taken out for good: `f` consumes it), which `open` finds of
    /// its kind `kind`, and QP `qp_id` (put back after).
    fn consume<T, R>(
        &mut self,
        (id, kind): (Id, &str),
        qp_id: Id,
        open: fn(Obj) -> Option<T>,
        f: impl FnOnce(T, &mut SoftQp) -> Result<R>,
    ) -> Result<R> {
        let mut qp = take!(self, qp_id, Qp);
        let r = match self.objs.remove(&id).and_then(open) {
            Some(o) => f(o, &mut qp),
            None => Err(missing(kind, id)),
        };
        self.back(qp_id, Obj::Qp(qp));
        r
    }

    fn accept_start(
        &mut self,
        request: Id,
        qp_id: Id,
        attr: &corelink_verbs::QpAttr,
        private_data: &[u8],
    ) -> Result<Id> {
        let open = |o| match o {
            Obj::Request(r) => Some(r),
            _ => None,
        };
        self.consume((request, "Request"), qp_id, open, |r, qp| {
            r.accept_start(qp, attr, private_data)
        })
        .map(|a| self.put(Obj::Accepting(a)))
    }

    fn reject(&mut self, request: Id, private_data: &[u8]) -> Result<()> {
        take!(self, request, Request).reject(private_data)
    }

    fn accepting_poll(
        &mut self,
        accepting: Id,
        qp_id: Id,
        timeout: std::time::Duration,
    ) -> Result<wire::Progress> {
        self.consume((accepting, "Accepting"), qp_id, open_accepting, |a, qp| a.poll(qp, timeout))
            .map(|p| progress(self, p))
    }

    fn accepting_abandon(&mut self, accepting: Id, qp_id: Id) -> Result<Error> {
        self.consume((accepting, "Accepting"), qp_id, open_accepting, |a, qp| Ok(a.abandon(qp)))
    }

    fn connecting_poll(
        &mut self,
        connecting: Id,
        qp_id: Id,
        timeout: std::time::Duration,
    ) -> Result<wire::Progress> {
        let open = |o| match o {
            Obj::Connecting(c) => Some(c),
            _ => None,
        };
        self.consume((connecting, "Connecting"), qp_id, open, |c, qp| c.poll(qp, timeout))
            .map(|p| progress(self, p))
    }
}

/// Serves calls on `link` until the runner closes it; then destroys what is left, newest
/// first.
pub(crate) fn serve(mut link: UnixStream) -> io::Result<()> {
    let mut t = Table::default();
    let res = loop {
        let call: Call = match wire::recv(&mut link) {
            Ok(Some(c)) => c,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        if let Err(e) = wire::write_frame(&mut link, &t.run(call)) {
            break Err(e);
        }
    };
    while let Some((_, o)) = t.objs.pop_last() {
        drop(o);
    }
    res
}
