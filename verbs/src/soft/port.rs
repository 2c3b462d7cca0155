//! `soft` across processes: the port of this process on a named fabric.
//!
//! Processes that set `CORELINK_SOFT_FABRIC` to the same name (of one user, on one host) see
//! each other's QPs and listeners. Each has a port: an abstract Unix socket named
//! `corelink-soft/<fabric>/<pid>` (abstract: nothing on the file system, gone with the process,
//! even after `kill -9`). Two processes talk over one stream between them (a [`PeerLink`]),
//! made at the first need: a QP connected to a QP of the other process, a connect to one of its
//! listeners. A listener also binds `corelink-soft/<fabric>/listen/<addr>`, so that an address
//! is one process's on the whole fabric, and a connector finds the owner by it.
//!
//! The link carries what a NIC's wire would: a requester's request, executed by the other
//! process's reader thread with the same responder code as in one process (`exec::serve`), and
//! its response (an RC request's post waits for it, as `soft` completes each request at its
//! post); the connection manager's messages. Both ends check that the other runs as the same
//! user (`SO_PEERCRED`): a process of another user cannot join.
//!
//! A peer that dies closes its end: the link's reader sees the end at once, requests waiting
//! for a response end with `RetryExcErr`, later ones too (the peer's QPs are unreachable), and
//! every connection made over the link hears `Disconnected`. A peer that lives but does not
//! answer (stopped) is given up after [`ACK_TIMEOUT`].

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::wire::{Msg, Outcome, MAX_FRAME};
use crate::error::{Error, Result};
use crate::types::Gid;

/// The environment variable that names the fabric a process's `soft` contexts join.
pub const FABRIC_ENV: &str = "CORELINK_SOFT_FABRIC";

/// Puts this process (and the processes it starts, which inherit its environment) on the
/// fabric `name`, unless [`FABRIC_ENV`] names one already. The first call decides; later ones
/// do nothing. Call it before the first `soft` device opens.
pub fn default_fabric(name: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os(FABRIC_ENV).is_none() {
            std::env::set_var(FABRIC_ENV, name);
        }
    });
}

/// How long an RC request waits for its response from another process before it ends with
/// `RetryExcErr` (a peer that died is noticed at once; this bounds one that hangs).
pub const ACK_TIMEOUT: Duration = Duration::from_secs(4);

/// How long a request left in a peer's mailbox waits for the peer's polls before its port's
/// thread is asked to serve it (a peer whose threads do not poll a CQ, or are busy).
const NUDGE_AFTER: Duration = Duration::from_micros(20);

/// A waiting [`Ticket`] looks at the clock once in this many polls.
const CLOCK_EVERY: u32 = 32;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// This process's port on its fabric.
#[derive(Debug)]
pub(crate) struct Port {
    pub(crate) fabric: String,
    pub(crate) pid: u32,
    uid: u32,
    links: Mutex<HashMap<u32, Arc<PeerLink>>>,
    next_link: AtomicU64,
}

/// The port, when `CORELINK_SOFT_FABRIC` names a fabric (the error, when it cannot be joined).
static PORT: OnceLock<std::result::Result<Option<Port>, (String, io::ErrorKind, String)>> =
    OnceLock::new();

fn start() -> std::result::Result<Option<Port>, (String, io::ErrorKind, String)> {
    let Ok(name) = std::env::var(FABRIC_ENV) else { return Ok(None) };
    let fail = |e: io::Error| (name.clone(), e.kind(), e.to_string());
    if name.is_empty()
        || name.len() > 64
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(fail(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a fabric name is 1 to 64 letters, digits, '-', '_' or '.'",
        )));
    }
    let pid = std::process::id();
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    let addr = UnixAddr::from_abstract_name(port_name(&name, pid)).map_err(fail)?;
    let listener = UnixListener::bind_addr(&addr).map_err(fail)?;
    let port = Port {
        fabric: name.clone(),
        pid,
        uid,
        links: Mutex::new(HashMap::new()),
        next_link: AtomicU64::new(1),
    };
    std::thread::Builder::new()
        .name("soft-port".into())
        .spawn(move || accept_loop(listener))
        .map_err(fail)?;
    Ok(Some(port))
}

/// The port, if this process is on a named fabric (and could join it).
pub(crate) fn get() -> Option<&'static Port> {
    PORT.get_or_init(start).as_ref().ok().and_then(Option::as_ref)
}

/// Joins the fabric named by `CORELINK_SOFT_FABRIC`, if any: the error `Soft::open` reports.
pub(crate) fn check() -> Result<()> {
    match PORT.get_or_init(start) {
        Ok(_) => Ok(()),
        Err((name, kind, msg)) => Err(Error::SoftFabric {
            name: name.clone(),
            source: io::Error::new(*kind, msg.clone()),
        }),
    }
}

fn port_name(fabric: &str, pid: u32) -> Vec<u8> {
    format!("corelink-soft/{fabric}/{pid}").into_bytes()
}

fn listener_name(fabric: &str, addr: std::net::SocketAddr) -> Vec<u8> {
    format!("corelink-soft/{fabric}/listen/{addr}").into_bytes()
}

/// The process id a GID of a context on a named fabric carries (bytes 8..12; 0 in a process
/// on no fabric).
pub(crate) fn pid_of(gid: &Gid) -> u32 {
    u32::from_be_bytes(gid.0[8..12].try_into().expect("4 bytes"))
}

/// The (pid, uid) of the other end of a Unix stream.
fn peer_cred(s: &impl AsRawFd) -> io::Result<(u32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given; the fd is open.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid as u32, cred.uid))
}

/// Lets the calling thread run on every CPU: the port's threads are the NIC of this process
/// and must not inherit the pinning of the thread that happened to start them (a worker,
/// whose core is busy polling).
fn unpin() {
    // SAFETY: `set` is a plain bit set, zeroed, then filled for the online CPUs; the calls read
    // and write only it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let n = libc::sysconf(libc::_SC_NPROCESSORS_ONLN).clamp(1, libc::CPU_SETSIZE as i64);
        for cpu in 0..n as usize {
            libc::CPU_SET(cpu, &mut set);
        }
        // (a failure leaves the thread where it was: slower, not wrong)
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn accept_loop(listener: UnixListener) {
    unpin();
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let Some(port) = get() else { return };
        match peer_cred(&stream) {
            // Only processes of this user join.
            Ok((pid, uid)) if uid == port.uid => {
                let _ = std::thread::Builder::new()
                    .name(format!("soft-serve-{pid}"))
                    .spawn(move || serve_loop(port, pid, stream));
            }
            _ => drop(stream),
        }
    }
}

impl Port {
    /// The link to process `pid` (made now if there is none, or the last one died).
    pub(crate) fn link_to(&'static self, pid: u32) -> io::Result<Arc<PeerLink>> {
        let mut links = lock(&self.links);
        if let Some(l) = links.get(&pid).filter(|l| !l.is_dead()) {
            return Ok(l.clone());
        }
        let addr = UnixAddr::from_abstract_name(port_name(&self.fabric, pid))?;
        let stream = UnixStream::connect_addr(&addr)?;
        let (_, uid) = peer_cred(&stream)?;
        if uid != self.uid {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("process {pid} of the fabric runs as user {uid}"),
            ));
        }
        let reader = stream.try_clone()?;
        // (without a mailbox, every request goes over the stream)
        let mailbox = super::shm::Mailbox::new().ok();
        let fd = mailbox.as_ref().map_or(u32::MAX, |m| m.fd());
        (&stream).write_all(&Msg::Mailbox { fd }.encode())?;
        // The acceptor's first frame says where its table is: read here, so that the direct
        // path is open from the link's first request.
        let view = read_hello(&stream, pid);
        let link = Arc::new(PeerLink {
            mailbox,
            id: self.next_link.fetch_add(1, Ordering::Relaxed),
            pid,
            writer: Mutex::new(stream),
            calls: Mutex::new(HashMap::new()),
            answered: Condvar::new(),
            dead: AtomicBool::new(false),
            next_seq: AtomicU64::new(1),
            view,
            zombies: Mutex::new(Vec::new()),
        });
        let l = link.clone();
        std::thread::Builder::new()
            .name(format!("soft-link-{pid}"))
            .spawn(move || read_loop(self, l, reader))?;
        links.insert(pid, link.clone());
        Ok(link)
    }

    /// The link to the process whose listener is bound to `addr`, if one is.
    pub(crate) fn listener_owner(
        &'static self,
        addr: std::net::SocketAddr,
    ) -> Option<Arc<PeerLink>> {
        let probe = super::cm::bound_to(addr).find_map(|a| {
            let name = UnixAddr::from_abstract_name(listener_name(&self.fabric, a)).ok()?;
            UnixStream::connect_addr(&name).ok()
        })?;
        let (pid, uid) = peer_cred(&probe).ok()?;
        drop(probe);
        if uid != self.uid || pid == self.pid {
            return None;
        }
        self.link_to(pid).ok()
    }

    /// Claims `addr` on the whole fabric for a listener of this process (`None`: another
    /// process holds it).
    pub(crate) fn claim(&self, addr: std::net::SocketAddr) -> io::Result<ListenerName> {
        let name = UnixAddr::from_abstract_name(listener_name(&self.fabric, addr))?;
        let l = UnixListener::bind_addr(&name)?;
        l.set_nonblocking(true)?;
        Ok(ListenerName(l))
    }

    fn forget(&self, link: &Arc<PeerLink>) {
        let mut links = lock(&self.links);
        if links.get(&link.pid).is_some_and(|l| Arc::ptr_eq(l, link)) {
            links.remove(&link.pid);
        }
    }
}

/// A listener's address, held on the fabric (released when dropped). Connectors that looked
/// its owner up queue here unaccepted: [`ListenerName::drain`] lets them go.
#[derive(Debug)]
pub(crate) struct ListenerName(UnixListener);

impl ListenerName {
    /// Drops the probes of connectors that looked this listener up.
    pub(crate) fn drain(&self) {
        while self.0.accept().is_ok() {}
    }
}

/// What a response brings: the responder's outcome and a read's or atomic's data.
pub(crate) type Answer = (Outcome, Vec<u8>);

/// A stream between this process and another of the fabric.
#[derive(Debug)]
pub(crate) struct PeerLink {
    /// This process's number for it.
    pub(crate) id: u64,
    /// The other process.
    pub(crate) pid: u32,
    writer: Mutex<UnixStream>,
    /// Requests waiting for their response, by sequence number.
    calls: Mutex<HashMap<u64, Option<Answer>>>,
    answered: Condvar,
    dead: AtomicBool,
    next_seq: AtomicU64,
    /// The other process's published table, mapped here (`soft::shm`), if its hello said
    /// where and it could be mapped.
    view: Option<super::shm::PeerView>,
    /// Where this process leaves its RC requests for the other one.
    mailbox: Option<super::shm::Mailbox>,
    /// Mailbox slots of requests given up while the peer served them (freed once answered).
    zombies: Mutex<Vec<usize>>,
}

/// Where a request's answer will be.
#[derive(Debug, Clone, Copy)]
enum At {
    /// In this mailbox slot.
    Slot(usize),
    /// Among the stream's responses, with this sequence number.
    Seq(u64),
}

/// An RC request on its way to another process: its answer, when it comes. Dropped before
/// (its QP flushed it), it gives the request up.
#[derive(Debug)]
pub(crate) struct Ticket {
    link: Arc<PeerLink>,
    at: At,
    since: Instant,
    /// Polls without an answer so far.
    polls: std::sync::atomic::AtomicU32,
    nudged: AtomicBool,
    done: AtomicBool,
}

impl Ticket {
    /// The answer if it came: `Some(Some(answer))`; `Some(None)`: none will (the link died, or
    /// [`ACK_TIMEOUT`] passed); `None`: not yet (the peer is nudged after 20 us of waiting in
    /// its mailbox).
    pub(crate) fn poll(&self) -> Option<Option<Answer>> {
        if self.done.load(Ordering::Relaxed) {
            return Some(None);
        }
        let got = match self.at {
            At::Slot(slot) => self.link.mailbox.as_ref().and_then(|mb| {
                mb.answer(slot, |f| match f.get(4..).map(Msg::decode) {
                    Some(Ok(Msg::Resp { outcome, data, .. })) => Some((outcome, data)),
                    _ => None,
                })
            }),
            At::Seq(seq) => {
                let mut calls = lock(&self.link.calls);
                match calls.get(&seq) {
                    Some(Some(_)) => Some(calls.remove(&seq).flatten()),
                    _ => None,
                }
            }
        };
        if let Some(answer) = got {
            self.done.store(true, Ordering::Relaxed);
            return Some(answer);
        }
        if self.link.is_dead() {
            return Some(None);
        }
        // The clock is read once in CLOCK_EVERY polls (a poll of a busy-polled CQ is
        // otherwise a few loads; a clock read costs more than the rest of it).
        // (a ticket is polled by its QP's owner only, under the send queue's lock: no
        // read-modify-write needed)
        let polls = self.polls.load(Ordering::Relaxed);
        self.polls.store(polls.wrapping_add(1), Ordering::Relaxed);
        if polls % CLOCK_EVERY != CLOCK_EVERY - 1 {
            return None;
        }
        let waited = self.since.elapsed();
        if waited >= ACK_TIMEOUT {
            return Some(None);
        }
        if waited >= NUDGE_AFTER {
            if matches!(self.at, At::Slot(_)) && !self.nudged.swap(true, Ordering::Relaxed) {
                self.link.send(&Msg::Nudge);
            }
            // A peer this slow may share this core (two busy-polling processes on one core):
            // let it run.
            std::thread::yield_now();
        }
        None
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.done.load(Ordering::Relaxed) {
            return;
        }
        match self.at {
            At::Slot(slot) => {
                if let Some(mb) = &self.link.mailbox {
                    if !mb.abandon(slot) {
                        lock(&self.link.zombies).push(slot);
                    }
                }
            }
            At::Seq(seq) => {
                lock(&self.link.calls).remove(&seq);
            }
        }
    }
}

impl PeerLink {
    /// The other process's table, if it is mapped.
    #[inline]
    pub(crate) fn view(&self) -> Option<&super::shm::PeerView> {
        self.view.as_ref()
    }

    /// Whether the other process is gone (or the stream broke).
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Sends `msg` (nothing when the link is dead; a failed write kills it).
    pub(crate) fn send(&self, msg: &Msg) -> bool {
        self.send_frame(&msg.encode())
    }

    /// Sends a frame (as [`PeerLink::send`]).
    pub(crate) fn send_frame(&self, frame: &[u8]) -> bool {
        if self.is_dead() {
            return false;
        }
        let mut w = lock(&self.writer);
        if w.write_all(frame).is_err() {
            drop(w);
            self.kill();
            return false;
        }
        true
    }

    /// A sequence number for the next request that wants a response.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends request `frame` (numbered `seq` by [`PeerLink::next_seq`]), whose response's
    /// frame is at most `reply_max` bytes: through the mailbox when it has room, else over the
    /// stream. The ticket says when the answer came (`None`: the link is dead).
    pub(crate) fn start(
        self: &Arc<Self>,
        seq: u64,
        frame: &[u8],
        reply_max: usize,
    ) -> Option<Arc<Ticket>> {
        self.reap();
        let ticket = |at| {
            Arc::new(Ticket {
                link: self.clone(),
                at,
                since: Instant::now(),
                polls: std::sync::atomic::AtomicU32::new(0),
                nudged: AtomicBool::new(false),
                done: AtomicBool::new(false),
            })
        };
        if let (Some(mb), true) = (&self.mailbox, reply_max <= super::shm::MAILBOX_FRAME) {
            if let Some(slot) = mb.post(frame) {
                return Some(ticket(At::Slot(slot)));
            }
        }
        lock(&self.calls).insert(seq, None);
        if !self.send_frame(frame) {
            lock(&self.calls).remove(&seq);
            return None;
        }
        Some(ticket(At::Seq(seq)))
    }

    /// Frees the mailbox slots of requests given up while their peer served them, once it
    /// has answered.
    fn reap(&self) {
        let Some(mb) = &self.mailbox else { return };
        let mut z = lock(&self.zombies);
        z.retain(|&slot| !mb.abandon(slot));
    }

    fn answer(&self, seq: u64, answer: Answer) {
        let mut calls = lock(&self.calls);
        if let Some(slot) = calls.get_mut(&seq) {
            *slot = Some(answer);
            self.answered.notify_all();
        }
    }

    /// Marks it dead and ends the stream (its reader then sees the end).
    fn kill(&self) {
        self.dead.store(true, Ordering::Release);
        let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
        let _g = lock(&self.calls);
        self.answered.notify_all();
    }
}

/// Reads the hello an acceptor sends first on a stream, and maps the table it names (`None`:
/// none came within a second, or it names none, or it cannot be mapped: every request then
/// goes to the responder).
fn read_hello(mut stream: &UnixStream, pid: u32) -> Option<super::shm::PeerView> {
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut frame = [0u8; 9];
    let got = stream.read_exact(&mut frame);
    let _ = stream.set_read_timeout(None);
    got.ok()?;
    match Msg::decode(&frame[4..]) {
        Ok(Msg::Hello { table_fd }) if table_fd != u32::MAX => {
            super::shm::PeerView::open(pid, table_fd).ok()
        }
        _ => None,
    }
}

/// The next message on `stream` (`None`: it ended, or broke the protocol: said on stderr,
/// naming process `pid`).
fn read_frame(stream: &mut UnixStream, pid: u32) -> Option<Msg> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).ok()?;
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_FRAME {
        eprintln!("corelink soft: process {pid} sent a frame of {n} bytes; its stream closed");
        return None;
    }
    let mut body = vec![0u8; n];
    stream.read_exact(&mut body).ok()?;
    match Msg::decode(&body) {
        Ok(msg) => Some(msg),
        Err(e) => {
            eprintln!("corelink soft: bad frame from process {pid}: {e}; its stream closed");
            None
        }
    }
}

/// Reads `link`'s frames until the stream ends, then buries it.
fn read_loop(port: &'static Port, link: Arc<PeerLink>, mut stream: UnixStream) {
    unpin();
    while let Some(msg) = read_frame(&mut stream, link.pid) {
        match msg {
            Msg::Resp { seq, outcome, data } => link.answer(seq, (outcome, data)),
            // (a hello later than `read_hello` waited: the link goes without the direct path)
            Msg::Hello { .. } => {}
            other => {
                eprintln!("corelink soft: process {} answered {other:?}; link closed", link.pid);
                break;
            }
        }
    }
    link.kill();
    port.forget(&link);
    super::cm::link_died(&link);
}

/// Serves a stream process `pid` connected: its requests (answered on the same stream, by
/// this thread alone) and its connection manager's messages.
///
/// (The streams' roles keep two processes from blocking each other: a stream's connector
/// writes requests and connection-manager messages on it and reads only responses, which it
/// always takes at once; its acceptor's thread writes only responses.)
fn serve_loop(port: &'static Port, pid: u32, mut stream: UnixStream) {
    unpin();
    let table_fd = super::shm::table_fd().unwrap_or(u32::MAX);
    if stream.write_all(&Msg::Hello { table_fd }.encode()).is_err() {
        return;
    }
    let mut inbox: Option<Arc<Inbox>> = None;
    while let Some(msg) = read_frame(&mut stream, pid) {
        match msg {
            Msg::Req { seq, dst_qpn, src_qpn, src_type, op, mut payload } => {
                let (outcome, data) =
                    super::exec::serve(src_qpn, src_type, dst_qpn, op, &mut payload);
                if seq != 0 && stream.write_all(&Msg::Resp { seq, outcome, data }.encode()).is_err()
                {
                    break;
                }
            }
            Msg::Resp { .. } => {
                eprintln!("corelink soft: process {pid} sent a response unasked; stream closed");
                break;
            }
            Msg::Mailbox { fd } => {
                if let (None, Ok(mailbox)) = (&inbox, super::shm::Mailbox::open(pid, fd)) {
                    let i = Arc::new(Inbox {
                        mailbox,
                        seen: AtomicU64::new(0),
                        busy: AtomicBool::new(false),
                    });
                    lock(&INBOXES).push(i.clone());
                    ANY_INBOX.store(true, Ordering::Release);
                    inbox = Some(i);
                }
            }
            Msg::Nudge => {
                if let Some(i) = &inbox {
                    i.drain();
                }
            }
            cm => match port.link_to(pid) {
                Ok(link) => super::cm::remote_message(&link, cm),
                Err(_) => break, // (it is gone)
            },
        }
    }
    // Its end closed: the process died or closed its link. The link this side made to it
    // (if any) sees the end too, and buries what used it.
    if let Some(i) = inbox {
        let mut all = lock(&INBOXES);
        all.retain(|x| !Arc::ptr_eq(x, &i));
        ANY_INBOX.store(!all.is_empty(), Ordering::Release);
    }
}

/// A peer's mailbox, mapped here, served by this process.
struct Inbox {
    mailbox: super::shm::Mailbox,
    /// Posts served (or seen served) so far.
    seen: AtomicU64,
    /// Someone serves it now (one at a time).
    busy: AtomicBool,
}

impl Inbox {
    /// Serves what was posted since the last time.
    fn drain(&self) {
        let posted = self.mailbox.posted();
        if posted == self.seen.load(Ordering::Relaxed) {
            return;
        }
        if self.busy.swap(true, Ordering::Acquire) {
            return;
        }
        self.seen.store(posted, Ordering::Relaxed);
        self.mailbox.serve_all(|frame| {
            let resp = match frame.get(4..).map(Msg::decode) {
                Some(Ok(Msg::Req { seq, dst_qpn, src_qpn, src_type, op, mut payload })) => {
                    let (outcome, data) =
                        super::exec::serve(src_qpn, src_type, dst_qpn, op, &mut payload);
                    Msg::Resp { seq, outcome, data }
                }
                // (a requester puts only requests there: anything else is refused)
                _ => Msg::Resp {
                    seq: 0,
                    outcome: Outcome::Done(crate::types::WcStatus::RemInvReqErr, 0),
                    data: Vec::new(),
                },
            };
            resp.encode()
        });
        self.busy.store(false, Ordering::Release);
    }
}

/// The mailboxes of peers this process serves.
static INBOXES: Mutex<Vec<Arc<Inbox>>> = Mutex::new(Vec::new());
/// Whether there are any (one load on every CQ poll).
static ANY_INBOX: AtomicBool = AtomicBool::new(false);

/// Serves the requests peers left in their mailboxes for this process: run by every CQ poll
/// here (as a NIC's responder runs beside the host), one load when there is no peer.
#[inline]
pub(crate) fn serve_inboxes() {
    if !ANY_INBOX.load(Ordering::Relaxed) {
        return;
    }
    serve_all_inboxes();
}

#[cold]
fn serve_all_inboxes() {
    // (a poll never waits for another thread's serving)
    let Ok(all) = INBOXES.try_lock() else { return };
    for i in all.iter() {
        i.drain();
    }
}
