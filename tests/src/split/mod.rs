//! [`Split`]: the `soft` provider with some devices in a second process, so that the suite's
//! cases run with their two sides in two processes, unchanged.
//!
//! A device opened as `peer:<name>` (see [`PEER_PREFIX`]) lives in a peer process, this
//! program started again with [`PEER_ENV`] set (and the arguments of [`set_peer_args`]), which
//! must call [`serve_if_peer`] first thing. Every object of such a device stays in the peer;
//! here it is a handle, and each verb on it is one call over a Unix socket pair, answered
//! before the next (so an object's verbs run in the order the case calls them, and a blocking
//! verb, such as a wait for a connection request, holds the others back until it returns).
//! Addresses and keys are the peer's: scatter/gather lists posted on a peer QP name the
//! peer's registered memory, inline ones included. Any other device is `soft`'s own, in this
//! process. Both processes join one `soft` fabric ([`corelink_verbs::soft::FABRIC_ENV`]), so
//! what passes between the two sides is `soft` across processes: shared segments, its port
//! and its connection manager.
//!
//! Objects of the two processes do not mix: a QP of one side with a CQ of the other is
//! [`Error::ForeignObject`]. A peer listener's wait cannot be ended early by its
//! [`Listener::waker`] (the waker does nothing).

mod peer;
mod wire;

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use corelink_verbs::soft::{
    Soft, SoftAccepting, SoftAh, SoftCmWaiter, SoftConnRequest, SoftConnecting, SoftConnection,
    SoftContext, SoftCq, SoftListener, SoftMr, SoftMw, SoftPd, SoftQp, SoftSrq,
};
use corelink_verbs::{
    Accepting, AccessFlags, AhAttr, AsyncEvent, CmEvent, ConnRequest, Connecting, Connection,
    Context, Cq, DeviceAttr, DeviceInfo, Error, Gid, Listener, Mr, Mw, Pd, PortAttr, Progress,
    Provider, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType, RecvWr, Result, SendOp, SendWr, Srq,
    SrqAttr, UdDest, Waker, Watch, Wc,
};
use serde::de::DeserializeOwned;

use wire::{Call, Id, MrInfo, QpInfo, RemoteError, WireOp, WireRecv, WireSend};

/// The environment variable that makes a process the peer (see [`serve_if_peer`]).
pub const PEER_ENV: &str = "CORELINK_SPLIT_PEER";

/// A device name starting with this opens the rest of the name in a new peer process.
pub const PEER_PREFIX: &str = "peer:";

/// How long the end of a peer waits for the process to exit before killing it.
const EXIT_WAIT: Duration = Duration::from_secs(10);

static PEER_ARGS: OnceLock<Vec<String>> = OnceLock::new();

/// The arguments a peer process is started with (this program's own path is the command):
/// a test binary's own peer test, say `["--exact", "peer", "--nocapture"]`. Set once, before
/// the first peer device opens; later calls are ignored. Default: none.
pub fn set_peer_args(args: &[&str]) {
    let _ = PEER_ARGS.set(args.iter().map(|a| a.to_string()).collect());
}

/// In a process started as a peer ([`PEER_ENV`] set): serves its runner on standard input
/// until the runner closes it, and returns what that came to; elsewhere `None` at once.
pub fn serve_if_peer() -> Option<io::Result<()>> {
    std::env::var_os(PEER_ENV)?;
    Some(io::stdin().as_fd().try_clone_to_owned().and_then(|fd| peer::serve(UnixStream::from(fd))))
}

/// Joins this process (and so the peers it starts) to a `soft` fabric of its own, unless the
/// environment already names one.
fn on_fabric() {
    corelink_verbs::soft::default_fabric(&format!("split-{}", std::process::id()));
}

/// `soft`, with devices named `peer:...` in peer processes (see the module).
#[derive(Debug)]
pub struct Split;

/// An object of this process (`soft`'s own) or one held by the peer.
#[derive(Debug)]
enum Side<L, R> {
    Local(L),
    Remote(R),
}

/// The socket to one peer process, and the process.
#[derive(Debug)]
struct Link {
    io: Mutex<UnixStream>,
    child: Mutex<Child>,
}

impl Link {
    fn spawn() -> io::Result<Arc<Link>> {
        let (ours, theirs) = UnixStream::pair()?;
        let args = PEER_ARGS.get().map(Vec::as_slice).unwrap_or_default();
        let child = Command::new(std::env::current_exe()?)
            .args(args)
            .env(PEER_ENV, "1")
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .spawn()?;
        Ok(Arc::new(Link { io: Mutex::new(ours), child: Mutex::new(child) }))
    }

    /// Sends `call` and waits for its answer.
    fn call<R: DeserializeOwned>(
        &self,
        call: &Call,
    ) -> io::Result<std::result::Result<R, RemoteError>> {
        let mut io = self.io.lock().unwrap_or_else(|p| p.into_inner());
        wire::send(&mut *io, call)?;
        wire::recv(&mut *io)?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "the peer process went away")
        })
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let io = self.io.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = io.shutdown(std::net::Shutdown::Both);
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        let deadline = Instant::now() + EXIT_WAIT;
        while matches!(child.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// One object of the peer: destroyed there when this is dropped.
#[derive(Debug)]
struct Handle {
    link: Arc<Link>,
    id: Id,
}

impl Handle {
    fn new(link: &Arc<Link>, id: Id) -> Handle {
        Handle { link: link.clone(), id }
    }

    /// Asks the peer `call`; a broken link or the peer's error becomes the verb's error,
    /// made by `err` where the peer's error has no variant of its own.
    fn ask<R: DeserializeOwned>(&self, call: Call, err: impl Fn(io::Error) -> Error) -> Result<R> {
        match self.link.call::<R>(&call) {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(e.into_error(err)),
            Err(e) => Err(err(e)),
        }
    }

    /// Whether `other` is an object of the same peer.
    fn same_peer(&self, other: &Handle) -> bool {
        Arc::ptr_eq(&self.link, &other.link)
    }

    /// The object was consumed in the peer by the last call (an accept, a reject, a poll
    /// that answered with a new object): nothing to destroy.
    fn consumed(mut self) {
        self.id = 0;
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if self.id != 0 {
            let _ = self.link.call::<()>(&Call::Drop { id: self.id });
        }
    }
}

fn foreign(what: &'static str) -> Error {
    Error::ForeignObject { what, device: "a split device (the other process's)".into() }
}

fn peer_io(what: &str) -> impl Fn(io::Error) -> Error + '_ {
    move |e| Error::InvalidArgument(format!("{what} in the peer process: {e}"))
}

/// An open device of this process or of a peer.
#[derive(Debug)]
pub struct SplitContext(Side<SoftContext, RemoteCtx>);

#[derive(Debug)]
struct RemoteCtx {
    h: Handle,
    name: String,
}

impl Provider for Split {
    type Context = SplitContext;
    type Pd = SplitPd;
    type Mr = SplitMr;
    type Mw = SplitMw;
    type Cq = SplitCq;
    type Srq = SplitSrq;
    type Qp = SplitQp;
    type Ah = SplitAh;
    type Listener = SplitListener;
    type ConnRequest = SplitConnRequest;
    type Accepting = SplitAccepting;
    type Connecting = SplitConnecting;
    type Connection = SplitConnection;
    type CmWaiter = SoftCmWaiter;

    /// The same device as `soft`'s, so the same expectations.
    const NAME: &'static str = "soft";

    fn devices() -> Result<Vec<DeviceInfo>> {
        let mut d = Soft::devices()?;
        let peers: Vec<DeviceInfo> = d
            .iter()
            .map(|i| DeviceInfo { name: format!("{PEER_PREFIX}{}", i.name), ..i.clone() })
            .collect();
        d.extend(peers);
        Ok(d)
    }

    fn open(name: &str) -> Result<SplitContext> {
        on_fabric();
        let Some(dev) = name.strip_prefix(PEER_PREFIX) else {
            return Soft::open(name).map(|c| SplitContext(Side::Local(c)));
        };
        let open_err = |source| Error::Open { device: name.to_owned(), source };
        let link = Link::spawn().map_err(open_err)?;
        let id = match link.call::<Id>(&Call::Open { name: dev.to_owned() }) {
            Ok(Ok(id)) => id,
            Ok(Err(e)) => return Err(e.into_error(open_err)),
            Err(e) => return Err(open_err(e)),
        };
        Ok(SplitContext(Side::Remote(RemoteCtx { h: Handle::new(&link, id), name: name.into() })))
    }

    fn cm_waiter() -> Result<SoftCmWaiter> {
        Soft::cm_waiter()
    }
}

impl Context<Split> for SplitContext {
    fn name(&self) -> &str {
        match &self.0 {
            Side::Local(c) => c.name(),
            Side::Remote(r) => &r.name,
        }
    }

    fn open_sibling(&self) -> Result<SplitContext> {
        match &self.0 {
            Side::Local(c) => c.open_sibling().map(|c| SplitContext(Side::Local(c))),
            Side::Remote(r) => {
                let id = r.h.ask(Call::OpenSibling { ctx: r.h.id }, |source| Error::Open {
                    device: r.name.clone(),
                    source,
                })?;
                let h = Handle::new(&r.h.link, id);
                Ok(SplitContext(Side::Remote(RemoteCtx { h, name: r.name.clone() })))
            }
        }
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        match &self.0 {
            Side::Local(c) => c.query_device(),
            Side::Remote(r) => r.h.ask(Call::QueryDevice { ctx: r.h.id }, |source| {
                Error::QueryDevice { device: r.name.clone(), source }
            }),
        }
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        match &self.0 {
            Side::Local(c) => c.query_port(port),
            Side::Remote(r) => r.h.ask(Call::QueryPort { ctx: r.h.id, port }, |source| {
                Error::QueryPort { device: r.name.clone(), port, source }
            }),
        }
    }

    fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        match &self.0 {
            Side::Local(c) => c.query_gid(port, index),
            Side::Remote(r) => r.h.ask(Call::QueryGid { ctx: r.h.id, port, index }, |source| {
                Error::QueryGid { port, index, source }
            }),
        }
    }

    fn alloc_pd(&self) -> Result<SplitPd> {
        match &self.0 {
            Side::Local(c) => c.alloc_pd().map(|p| SplitPd(Side::Local(p))),
            Side::Remote(r) => {
                let id = r.h.ask(Call::AllocPd { ctx: r.h.id }, Error::AllocPd)?;
                Ok(SplitPd(Side::Remote(Handle::new(&r.h.link, id))))
            }
        }
    }

    fn create_cq(&self, depth: u32) -> Result<SplitCq> {
        match &self.0 {
            Side::Local(c) => c.create_cq(depth).map(|q| SplitCq(Side::Local(q))),
            Side::Remote(r) => {
                let (id, depth, handle) =
                    r.h.ask(Call::CreateCq { ctx: r.h.id, depth }, |source| Error::CreateCq {
                        depth,
                        source,
                    })?;
                let h = Handle::new(&r.h.link, id);
                Ok(SplitCq(Side::Remote(RemoteCq { h, depth, handle })))
            }
        }
    }

    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        match &self.0 {
            Side::Local(c) => c.poll_async_event(),
            Side::Remote(r) => r.h.ask(Call::PollAsyncEvent { ctx: r.h.id }, Error::AsyncEvent),
        }
    }

    fn listen(&self, addr: SocketAddr) -> Result<SplitListener> {
        match &self.0 {
            Side::Local(c) => c.listen(addr).map(|l| SplitListener(Side::Local(l))),
            Side::Remote(r) => {
                let (id, local) = r.h.ask(Call::Listen { ctx: r.h.id, addr }, |source| {
                    Error::Cm { op: "listen", addr, source }
                })?;
                let h = Handle::new(&r.h.link, id);
                Ok(SplitListener(Side::Remote((h, local))))
            }
        }
    }

    fn connect_start(
        &self,
        addr: SocketAddr,
        qp: &mut SplitQp,
        attr: &QpAttr,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<SplitConnecting> {
        match (&self.0, &mut qp.0) {
            (Side::Local(c), Side::Local(q)) => c
                .connect_start(addr, q, attr, private_data, timeout)
                .map(|c| SplitConnecting(Side::Local(c))),
            (Side::Remote(r), Side::Remote(q)) if r.h.same_peer(&q.h) => {
                let call = Call::ConnectStart {
                    ctx: r.h.id,
                    addr,
                    qp: q.h.id,
                    attr: *attr,
                    private_data: private_data.to_vec(),
                    timeout,
                };
                let id = r.h.ask(call, |source| Error::Cm { op: "connect", addr, source })?;
                Ok(SplitConnecting(Side::Remote(Handle::new(&r.h.link, id))))
            }
            _ => Err(foreign("QP to connect")),
        }
    }
}

/// A protection domain.
#[derive(Debug)]
pub struct SplitPd(Side<SoftPd, Handle>);

impl Pd<Split> for SplitPd {
    fn register(&self, len: usize, access: AccessFlags) -> Result<SplitMr> {
        match &self.0 {
            Side::Local(p) => p.register(len, access).map(|m| SplitMr(Side::Local(m))),
            Side::Remote(h) => {
                let info: MrInfo = h.ask(Call::Register { pd: h.id, len, access }, |source| {
                    Error::RegMr { len, access, source }
                })?;
                Ok(SplitMr(Side::Remote((Handle::new(&h.link, info.id), info))))
            }
        }
    }

    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<SplitMr> {
        match &self.0 {
            Side::Local(p) => {
                // SAFETY: forwarded to the caller.
                unsafe { p.register_raw(addr, len, access) }.map(|m| SplitMr(Side::Local(m)))
            }
            Side::Remote(_) => Err(Error::Unsupported {
                what: "registering this process's memory on a peer process's device",
                provider: "split",
            }),
        }
    }

    fn alloc_mw(&self) -> Result<SplitMw> {
        match &self.0 {
            Side::Local(p) => p.alloc_mw().map(|m| SplitMw(Side::Local(m))),
            Side::Remote(h) => {
                let (id, rkey): (Id, u32) = h.ask(Call::AllocMw { pd: h.id }, Error::AllocMw)?;
                Ok(SplitMw(Side::Remote((Handle::new(&h.link, id), Mutex::new(rkey)))))
            }
        }
    }

    fn create_srq(&self, attr: &SrqAttr) -> Result<SplitSrq> {
        match &self.0 {
            Side::Local(p) => p.create_srq(attr).map(|s| SplitSrq(Side::Local(s))),
            Side::Remote(h) => {
                let (id, handle) = h.ask(Call::CreateSrq { pd: h.id, attr: *attr }, |source| {
                    Error::CreateSrq { max_wr: attr.max_wr, source }
                })?;
                Ok(SplitSrq(Side::Remote((Handle::new(&h.link, id), handle))))
            }
        }
    }

    fn create_qp(&self, attr: &QpInitAttr<'_, Split>) -> Result<SplitQp> {
        match &self.0 {
            Side::Local(p) => {
                let (send_cq, recv_cq) = (local_cq(attr.send_cq)?, local_cq(attr.recv_cq)?);
                let srq = match attr.srq.map(|s| &s.0) {
                    None => None,
                    Some(Side::Local(s)) => Some(s),
                    Some(Side::Remote(_)) => return Err(foreign("shared receive queue")),
                };
                p.create_qp(&QpInitAttr::<Soft> {
                    qp_type: attr.qp_type,
                    send_cq,
                    recv_cq,
                    srq,
                    cap: attr.cap,
                    sq_sig_all: attr.sq_sig_all,
                })
                .map(|q| SplitQp(Side::Local(q)))
            }
            Side::Remote(h) => {
                let cq = |c: &SplitCq| match &c.0 {
                    Side::Remote(r) if r.h.same_peer(h) => Ok(r.h.id),
                    _ => Err(foreign("completion queue")),
                };
                let srq = match attr.srq.map(|s| &s.0) {
                    None => None,
                    Some(Side::Remote((s, _))) if s.same_peer(h) => Some(s.id),
                    Some(_) => return Err(foreign("shared receive queue")),
                };
                let call = Call::CreateQp {
                    pd: h.id,
                    qp_type: attr.qp_type,
                    send_cq: cq(attr.send_cq)?,
                    recv_cq: cq(attr.recv_cq)?,
                    srq,
                    cap: attr.cap,
                    sq_sig_all: attr.sq_sig_all,
                };
                let info: QpInfo = h.ask(call, |source| Error::CreateQp {
                    qp_type: attr.qp_type,
                    cap: attr.cap,
                    source,
                })?;
                Ok(SplitQp(Side::Remote(RemoteQp { h: Handle::new(&h.link, info.id), info })))
            }
        }
    }

    fn create_ah(&self, attr: &AhAttr) -> Result<SplitAh> {
        match &self.0 {
            Side::Local(p) => p.create_ah(attr).map(|a| SplitAh(Side::Local(a))),
            Side::Remote(h) => {
                let id = h.ask(Call::CreateAh { pd: h.id, attr: *attr }, Error::CreateAh)?;
                Ok(SplitAh(Side::Remote(Handle::new(&h.link, id))))
            }
        }
    }
}

fn local_cq(c: &SplitCq) -> Result<&SoftCq> {
    match &c.0 {
        Side::Local(c) => Ok(c),
        Side::Remote(_) => Err(foreign("completion queue")),
    }
}

/// A registered memory region (a peer's: its address is in the peer's memory, and its bytes
/// are copied in and out by calls).
#[derive(Debug)]
pub struct SplitMr(Side<SoftMr, (Handle, MrInfo)>);

impl Mr for SplitMr {
    fn addr(&self) -> u64 {
        match &self.0 {
            Side::Local(m) => m.addr(),
            Side::Remote((_, i)) => i.addr,
        }
    }

    fn len(&self) -> usize {
        match &self.0 {
            Side::Local(m) => m.len(),
            Side::Remote((_, i)) => i.len,
        }
    }

    fn lkey(&self) -> u32 {
        match &self.0 {
            Side::Local(m) => m.lkey(),
            Side::Remote((_, i)) => i.lkey,
        }
    }

    fn rkey(&self) -> u32 {
        match &self.0 {
            Side::Local(m) => m.rkey(),
            Side::Remote((_, i)) => i.rkey,
        }
    }

    fn access(&self) -> AccessFlags {
        match &self.0 {
            Side::Local(m) => m.access(),
            Side::Remote((_, i)) => i.access,
        }
    }

    /// Null for a peer's region: its memory is not mapped here.
    fn as_ptr(&self) -> *mut u8 {
        match &self.0 {
            Side::Local(m) => m.as_ptr(),
            Side::Remote(_) => std::ptr::null_mut(),
        }
    }

    fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        match &self.0 {
            Side::Local(m) => m.write_at(offset, data),
            Side::Remote((h, _)) => h.ask(
                Call::MrWrite { mr: h.id, offset, data: data.to_vec() },
                peer_io("writing a region"),
            ),
        }
    }

    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        match &self.0 {
            Side::Local(m) => m.read_at(offset, out),
            Side::Remote((h, _)) => {
                let v: Vec<u8> = h.ask(
                    Call::MrRead { mr: h.id, offset, len: out.len() },
                    peer_io("reading a region"),
                )?;
                out.copy_from_slice(&v);
                Ok(())
            }
        }
    }

    fn read_u64(&self, offset: usize) -> Result<u64> {
        match &self.0 {
            Side::Local(m) => m.read_u64(offset),
            Side::Remote((h, _)) => {
                h.ask(Call::MrReadU64 { mr: h.id, offset }, peer_io("reading a word"))
            }
        }
    }

    fn write_u64(&self, offset: usize, value: u64) -> Result<()> {
        match &self.0 {
            Side::Local(m) => m.write_u64(offset, value),
            Side::Remote((h, _)) => {
                h.ask(Call::MrWriteU64 { mr: h.id, offset, value }, peer_io("writing a word"))
            }
        }
    }
}

/// A memory window (a peer's rkey is asked for each time: a bind changes it).
#[derive(Debug)]
pub struct SplitMw(Side<SoftMw, (Handle, Mutex<u32>)>);

impl Mw for SplitMw {
    fn rkey(&self) -> u32 {
        match &self.0 {
            Side::Local(m) => m.rkey(),
            Side::Remote((h, last)) => {
                let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
                // A broken link keeps the last rkey known (the next verb reports the link).
                if let Ok(k) = h.ask(Call::MwRkey { mw: h.id }, peer_io("a window's rkey")) {
                    *last = k;
                }
                *last
            }
        }
    }
}

/// A completion queue.
#[derive(Debug)]
pub struct SplitCq(Side<SoftCq, RemoteCq>);

#[derive(Debug)]
struct RemoteCq {
    h: Handle,
    depth: u32,
    handle: u64,
}

impl Cq for SplitCq {
    fn poll(&self, out: &mut [Wc]) -> Result<usize> {
        match &self.0 {
            Side::Local(c) => c.poll(out),
            Side::Remote(r) => {
                let got: Vec<Wc> =
                    r.h.ask(Call::Poll { cq: r.h.id, max: out.len() }, Error::PollCq)?;
                let n = got.len().min(out.len());
                out[..n].copy_from_slice(&got[..n]);
                Ok(n)
            }
        }
    }

    fn depth(&self) -> u32 {
        match &self.0 {
            Side::Local(c) => c.depth(),
            Side::Remote(r) => r.depth,
        }
    }

    fn handle(&self) -> u64 {
        match &self.0 {
            Side::Local(c) => c.handle(),
            Side::Remote(r) => r.handle,
        }
    }
}

fn wire_recvs(wrs: &[RecvWr<'_>]) -> Vec<WireRecv> {
    wrs.iter().map(|w| WireRecv { wr_id: w.wr_id, sgl: w.sgl.to_vec() }).collect()
}

/// A shared receive queue.
#[derive(Debug)]
pub struct SplitSrq(Side<SoftSrq, (Handle, u64)>);

impl Srq for SplitSrq {
    unsafe fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        match &self.0 {
            // SAFETY: forwarded to the caller.
            Side::Local(s) => unsafe { s.post_recv(wrs) },
            Side::Remote((h, _)) => h
                .ask(Call::SrqPostRecv { srq: h.id, wrs: wire_recvs(wrs) }, |source| {
                    Error::PostSrqRecv { index: 0, source }
                }),
        }
    }

    fn handle(&self) -> u64 {
        match &self.0 {
            Side::Local(s) => s.handle(),
            Side::Remote((_, handle)) => *handle,
        }
    }
}

/// A UD address handle.
#[derive(Debug)]
pub struct SplitAh(Side<SoftAh, Handle>);

/// A queue pair.
#[derive(Debug)]
pub struct SplitQp(Side<SoftQp, RemoteQp>);

#[derive(Debug)]
struct RemoteQp {
    h: Handle,
    info: QpInfo,
}

impl RemoteQp {
    fn wire_send(&self, w: &SendWr<'_, Split>) -> Result<WireSend> {
        let of_peer = |h: &Handle, what| {
            if h.same_peer(&self.h) {
                Ok(h.id)
            } else {
                Err(foreign(what))
            }
        };
        let op = match w.op {
            SendOp::Send => WireOp::Send,
            SendOp::SendWithImm(i) => WireOp::SendWithImm(i),
            SendOp::SendWithInv(k) => WireOp::SendWithInv(k),
            SendOp::Write(r) => WireOp::Write(r.addr, r.rkey),
            SendOp::WriteWithImm(r, i) => WireOp::WriteWithImm(r.addr, r.rkey, i),
            SendOp::Read(r) => WireOp::Read(r.addr, r.rkey),
            SendOp::CompareSwap { remote, compare, swap } => {
                WireOp::CompareSwap { addr: remote.addr, rkey: remote.rkey, compare, swap }
            }
            SendOp::FetchAdd { remote, add } => {
                WireOp::FetchAdd { addr: remote.addr, rkey: remote.rkey, add }
            }
            SendOp::BindMw { mw, mr, addr, len, access } => {
                let mw = match &mw.0 {
                    Side::Remote((h, _)) => of_peer(h, "memory window")?,
                    Side::Local(_) => return Err(foreign("memory window")),
                };
                let mr = match &mr.0 {
                    Side::Remote((h, _)) => of_peer(h, "memory region")?,
                    Side::Local(_) => return Err(foreign("memory region")),
                };
                WireOp::BindMw { mw, mr, addr, len, access }
            }
            SendOp::LocalInv(k) => WireOp::LocalInv(k),
        };
        let ud = match w.ud {
            None => None,
            Some(d) => match &d.ah.0 {
                Side::Remote(h) => Some((of_peer(h, "address handle")?, d.qpn, d.qkey)),
                Side::Local(_) => return Err(foreign("address handle")),
            },
        };
        Ok(WireSend { wr_id: w.wr_id, op, sgl: w.sgl.to_vec(), flags: w.flags, ud })
    }
}

/// `w` with `soft`'s own objects, or `None` if it names one of a peer.
fn local_send<'a>(w: &SendWr<'a, Split>) -> Option<SendWr<'a, Soft>> {
    let op = match w.op {
        SendOp::Send => SendOp::Send,
        SendOp::SendWithImm(i) => SendOp::SendWithImm(i),
        SendOp::SendWithInv(k) => SendOp::SendWithInv(k),
        SendOp::Write(r) => SendOp::Write(r),
        SendOp::WriteWithImm(r, i) => SendOp::WriteWithImm(r, i),
        SendOp::Read(r) => SendOp::Read(r),
        SendOp::CompareSwap { remote, compare, swap } => {
            SendOp::CompareSwap { remote, compare, swap }
        }
        SendOp::FetchAdd { remote, add } => SendOp::FetchAdd { remote, add },
        SendOp::BindMw { mw, mr, addr, len, access } => match (&mw.0, &mr.0) {
            (Side::Local(mw), Side::Local(mr)) => SendOp::BindMw { mw, mr, addr, len, access },
            _ => return None,
        },
        SendOp::LocalInv(k) => SendOp::LocalInv(k),
    };
    let ud = match w.ud {
        None => None,
        Some(d) => match &d.ah.0 {
            Side::Local(ah) => Some(UdDest { ah, qpn: d.qpn, qkey: d.qkey }),
            Side::Remote(_) => return None,
        },
    };
    Some(SendWr { wr_id: w.wr_id, op, sgl: w.sgl, flags: w.flags, ud })
}

impl Qp<Split> for SplitQp {
    fn qp_num(&self) -> u32 {
        match &self.0 {
            Side::Local(q) => q.qp_num(),
            Side::Remote(r) => r.info.qpn,
        }
    }

    fn qp_type(&self) -> QpType {
        match &self.0 {
            Side::Local(q) => q.qp_type(),
            Side::Remote(r) => r.info.qp_type,
        }
    }

    /// A peer QP's state is asked for; a broken link reports ERR.
    fn state(&self) -> QpState {
        match &self.0 {
            Side::Local(q) => q.state(),
            Side::Remote(r) => {
                r.h.ask(Call::QpState { qp: r.h.id }, peer_io("a QP's state"))
                    .unwrap_or(QpState::Err)
            }
        }
    }

    fn cap(&self) -> QpCap {
        match &self.0 {
            Side::Local(q) => q.cap(),
            Side::Remote(r) => r.info.cap,
        }
    }

    fn modify(&mut self, attr: &QpAttr) -> Result<()> {
        match &mut self.0 {
            Side::Local(q) => q.modify(attr),
            Side::Remote(r) => {
                let qpn = r.info.qpn;
                r.h.ask(Call::Modify { qp: r.h.id, attr: *attr }, |source| Error::ModifyQp {
                    qpn,
                    from: QpState::Reset,
                    to: attr.state,
                    source,
                })
            }
        }
    }

    unsafe fn post_send(&mut self, wrs: &[SendWr<'_, Split>]) -> Result<()> {
        match &mut self.0 {
            Side::Local(q) => {
                let local: Option<Vec<SendWr<'_, Soft>>> = wrs.iter().map(local_send).collect();
                let local = local.ok_or_else(|| foreign("object named by a send request"))?;
                // SAFETY: forwarded to the caller.
                unsafe { q.post_send(&local) }
            }
            Side::Remote(r) => {
                let wire = wrs.iter().map(|w| r.wire_send(w)).collect::<Result<Vec<_>>>()?;
                let qpn = r.info.qpn;
                r.h.ask(Call::PostSend { qp: r.h.id, wrs: wire }, |source| Error::PostSend {
                    qpn,
                    index: 0,
                    source,
                })
            }
        }
    }

    unsafe fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<()> {
        match &mut self.0 {
            // SAFETY: forwarded to the caller.
            Side::Local(q) => unsafe { q.post_recv(wrs) },
            Side::Remote(r) => {
                let qpn = r.info.qpn;
                r.h.ask(Call::PostRecv { qp: r.h.id, wrs: wire_recvs(wrs) }, |source| {
                    Error::PostRecv { qpn, index: 0, source }
                })
            }
        }
    }
}

/// The peer QP `qp`'s id on `h`'s peer, or the error for a QP of the other process.
fn peer_qp(h: &Handle, qp: &SplitQp) -> Result<Id> {
    match &qp.0 {
        Side::Remote(r) if r.h.same_peer(h) => Ok(r.h.id),
        _ => Err(foreign("QP")),
    }
}

fn local_qp(qp: &mut SplitQp) -> Result<&mut SoftQp> {
    match &mut qp.0 {
        Side::Local(q) => Ok(q),
        Side::Remote(_) => Err(foreign("QP")),
    }
}

/// A connection-manager listener.
#[derive(Debug)]
pub struct SplitListener(Side<SoftListener, (Handle, SocketAddr)>);

impl Listener<Split> for SplitListener {
    fn local_addr(&self) -> SocketAddr {
        match &self.0 {
            Side::Local(l) => l.local_addr(),
            Side::Remote((_, a)) => *a,
        }
    }

    fn get_request(&mut self, timeout: Duration) -> Result<Option<SplitConnRequest>> {
        match &mut self.0 {
            Side::Local(l) => Ok(l.get_request(timeout)?.map(|r| SplitConnRequest(Side::Local(r)))),
            Side::Remote((h, addr)) => {
                let addr = *addr;
                let got: Option<wire::RequestInfo> =
                    h.ask(Call::GetRequest { listener: h.id, timeout }, |source| Error::Cm {
                        op: "get_request",
                        addr,
                        source,
                    })?;
                Ok(got.map(|r| {
                    let h = Handle::new(&h.link, r.id);
                    SplitConnRequest(Side::Remote((h, r.private_data, r.peer_addr)))
                }))
            }
        }
    }

    fn waker(&self) -> Waker {
        match &self.0 {
            Side::Local(l) => l.waker(),
            Side::Remote(_) => Waker::new(|| {}),
        }
    }

    fn watch(&self) -> Watch {
        match &self.0 {
            Side::Local(l) => l.watch(),
            Side::Remote(_) => Watch::none(),
        }
    }
}

/// A connection request.
#[derive(Debug)]
pub struct SplitConnRequest(Side<SoftConnRequest, (Handle, Vec<u8>, SocketAddr)>);

impl ConnRequest<Split> for SplitConnRequest {
    fn private_data(&self) -> &[u8] {
        match &self.0 {
            Side::Local(r) => r.private_data(),
            Side::Remote((_, d, _)) => d,
        }
    }

    fn peer_addr(&self) -> SocketAddr {
        match &self.0 {
            Side::Local(r) => r.peer_addr(),
            Side::Remote((_, _, a)) => *a,
        }
    }

    fn accept_start(
        self,
        qp: &mut SplitQp,
        attr: &QpAttr,
        private_data: &[u8],
    ) -> Result<SplitAccepting> {
        match self.0 {
            Side::Local(r) => r
                .accept_start(local_qp(qp)?, attr, private_data)
                .map(|a| SplitAccepting(Side::Local(a))),
            Side::Remote((h, _, addr)) => {
                let call = Call::AcceptStart {
                    request: h.id,
                    qp: peer_qp(&h, qp)?,
                    attr: *attr,
                    private_data: private_data.to_vec(),
                };
                let res = h.ask(call, |source| Error::Cm { op: "accept", addr, source });
                let link = h.link.clone();
                h.consumed();
                Ok(SplitAccepting(Side::Remote(Handle::new(&link, res?))))
            }
        }
    }

    fn reject(self, private_data: &[u8]) -> Result<()> {
        match self.0 {
            Side::Local(r) => r.reject(private_data),
            Side::Remote((h, _, addr)) => {
                let call = Call::Reject { request: h.id, private_data: private_data.to_vec() };
                let res = h.ask(call, |source| Error::Cm { op: "reject", addr, source });
                h.consumed();
                res
            }
        }
    }
}

/// What a peer's accept or connect poll came to, as `Progress`.
fn remote_progress<T>(
    link: &Arc<Link>,
    p: wire::Progress,
    pending: impl FnOnce(Handle) -> T,
) -> Progress<Split, T> {
    match p {
        Ok(c) => Progress::Ready(SplitConnection(Side::Remote((
            Handle::new(link, c.id),
            c.peer_private_data,
        )))),
        Err(id) => Progress::Pending(pending(Handle::new(link, id))),
    }
}

fn local_progress<T, U>(p: Progress<Soft, T>, pending: impl FnOnce(T) -> U) -> Progress<Split, U> {
    match p {
        Progress::Ready(c) => Progress::Ready(SplitConnection(Side::Local(c))),
        Progress::Pending(t) => Progress::Pending(pending(t)),
    }
}

/// An accept waiting for the connector's confirmation.
#[derive(Debug)]
pub struct SplitAccepting(Side<SoftAccepting, Handle>);

impl Accepting<Split> for SplitAccepting {
    fn poll(self, qp: &mut SplitQp, timeout: Duration) -> Result<Progress<Split, SplitAccepting>> {
        match self.0 {
            Side::Local(a) => Ok(local_progress(a.poll(local_qp(qp)?, timeout)?, |a| {
                SplitAccepting(Side::Local(a))
            })),
            Side::Remote(h) => {
                let call = Call::AcceptingPoll { accepting: h.id, qp: peer_qp(&h, qp)?, timeout };
                let res = h.ask(call, peer_io("an accept"));
                let link = h.link.clone();
                h.consumed();
                Ok(remote_progress(&link, res?, |h| SplitAccepting(Side::Remote(h))))
            }
        }
    }

    fn abandon(self, qp: &mut SplitQp) -> Error {
        match self.0 {
            Side::Local(a) => match local_qp(qp) {
                Ok(q) => a.abandon(q),
                Err(e) => e,
            },
            Side::Remote(h) => {
                let qp = match peer_qp(&h, qp) {
                    Ok(id) => id,
                    Err(e) => return e,
                };
                let res: Result<RemoteError> =
                    h.ask(Call::AcceptingAbandon { accepting: h.id, qp }, peer_io("an accept"));
                h.consumed();
                match res {
                    Ok(e) => e.into_error(peer_io("an abandoned accept")),
                    Err(e) => e,
                }
            }
        }
    }

    fn watch(&self) -> Watch {
        match &self.0 {
            Side::Local(a) => a.watch(),
            Side::Remote(_) => Watch::none(),
        }
    }
}

/// A connect in progress.
#[derive(Debug)]
pub struct SplitConnecting(Side<SoftConnecting, Handle>);

impl Connecting<Split> for SplitConnecting {
    fn poll(self, qp: &mut SplitQp, timeout: Duration) -> Result<Progress<Split, SplitConnecting>> {
        match self.0 {
            Side::Local(c) => Ok(local_progress(c.poll(local_qp(qp)?, timeout)?, |c| {
                SplitConnecting(Side::Local(c))
            })),
            Side::Remote(h) => {
                let call = Call::ConnectingPoll { connecting: h.id, qp: peer_qp(&h, qp)?, timeout };
                let res = h.ask(call, peer_io("a connect"));
                let link = h.link.clone();
                h.consumed();
                Ok(remote_progress(&link, res?, |h| SplitConnecting(Side::Remote(h))))
            }
        }
    }

    fn watch(&self) -> Watch {
        match &self.0 {
            Side::Local(c) => c.watch(),
            Side::Remote(_) => Watch::none(),
        }
    }
}

/// An established connection's connection-manager side.
#[derive(Debug)]
pub struct SplitConnection(Side<SoftConnection, (Handle, Vec<u8>)>);

impl Connection for SplitConnection {
    fn peer_private_data(&self) -> &[u8] {
        match &self.0 {
            Side::Local(c) => c.peer_private_data(),
            Side::Remote((_, d)) => d,
        }
    }

    fn poll_event(&mut self, timeout: Duration) -> Result<Option<CmEvent>> {
        match &mut self.0 {
            Side::Local(c) => c.poll_event(timeout),
            Side::Remote((h, _)) => {
                h.ask(Call::PollEvent { connection: h.id, timeout }, peer_io("a connection event"))
            }
        }
    }

    fn disconnect(&mut self) -> Result<()> {
        match &mut self.0 {
            Side::Local(c) => c.disconnect(),
            Side::Remote((h, _)) => {
                h.ask(Call::Disconnect { connection: h.id }, peer_io("a disconnect"))
            }
        }
    }

    fn watch(&self) -> Watch {
        match &self.0 {
            Side::Local(c) => c.watch(),
            Side::Remote(_) => Watch::none(),
        }
    }
}
