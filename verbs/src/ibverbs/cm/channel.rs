//! RAII wrappers over librdmacm's raw objects: the event channel ([`Channel`]), the cm id
//! ([`Id`]) and the cm event ([`Event`]); and the process's one event channel that every
//! cm id is on ([`Mux`]), each id's owner holding a [`Binding`] to it.
//!
//! One channel for every id, as librdmacm's own tools use it (`cmtime`): a connection costs
//! no file descriptor of its own (a thousand connections in one process held two thousand
//! before, past the usual limit of 1,024), and a waiter watches one descriptor, not one per
//! connection. Whoever reads the channel takes the events of its own id and queues the others
//! for their owners' next look ([`Mux::next`]); a waiter reads the channel into those queues
//! and tells which ids have events ([`queued_keys`]), so that its owner looks at those only,
//! and does not sleep while a watched id has one.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use rdma_sys::{
    rdma_cm_event, rdma_cm_event_type as Ev, rdma_cm_id, rdma_conn_param, rdma_event_channel,
    rdma_port_space,
};

use crate::ibverbs::convert::{err_text, errno_err, last_err, sockaddr_to, timeout_ms};

/// An event channel, non-blocking, destroyed on drop.
pub(super) struct Channel(pub(super) *mut rdma_event_channel);

impl Channel {
    pub(super) fn new() -> io::Result<Channel> {
        // SAFETY: no arguments; NULL on failure.
        let ch = unsafe { rdma_sys::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(last_err());
        }
        let ch = Channel(ch);
        let fd = ch.fd();
        // SAFETY: fcntl on the channel's valid descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(last_err());
        }
        Ok(ch)
    }

    fn fd(&self) -> c_int {
        // SAFETY: a live channel.
        unsafe { (*self.0).fd }
    }

    /// The next event the channel has now, if any (it is non-blocking).
    fn take(&self) -> io::Result<Option<Event>> {
        loop {
            let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
            // SAFETY: a live channel; the fd is non-blocking, so this returns at once.
            let ret = unsafe { rdma_sys::rdma_get_cm_event(self.0, &mut ev) };
            if ret == 0 && !ev.is_null() {
                return Ok(Some(Event(ev)));
            }
            let e = last_err();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => return Ok(None),
                Some(libc::EINTR) => {}
                _ => return Err(e),
            }
        }
    }

    /// Waits until the channel is readable, or until `deadline` passes (`None`: never) or
    /// `wake` (an eventfd) is readable, taking its count.
    fn wait_readable(
        &self,
        deadline: Option<Instant>,
        wake: Option<c_int>,
    ) -> io::Result<Readable> {
        let wait_ms = match deadline {
            None => -1,
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return Ok(Readable::TimedOut);
                }
                timeout_ms(d - now)
            }
        };
        let mut pfd = [
            libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: wake.unwrap_or(-1), events: libc::POLLIN, revents: 0 },
        ];
        let n = if wake.is_some() { 2 } else { 1 };
        // SAFETY: `n` valid pollfds (a negative fd is ignored by poll).
        let rc = unsafe { libc::poll(pfd.as_mut_ptr(), n, wait_ms) };
        if rc < 0 {
            let e = last_err();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
            return Ok(Readable::Yes); // (look again)
        }
        if let (Some(fd), true) = (wake, pfd[1].revents & libc::POLLIN != 0) {
            take_wake(fd);
            return Ok(Readable::Woken);
        }
        Ok(if rc > 0 { Readable::Yes } else { Readable::TimedOut })
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: created by rdma_create_event_channel; every id on it is destroyed first
        // (ids are declared before their channel in every owner).
        unsafe { rdma_sys::rdma_destroy_event_channel(self.0) };
    }
}

/// The process's one event channel, and the events read off it for ids other than the
/// reader's, by id (a connect request's by its listener's id), unacknowledged until taken.
pub(super) struct Mux {
    ch: Channel,
    state: Mutex<MuxState>,
    /// Signalled when an event is queued or the leader steps down.
    cv: Condvar,
    /// When a read last found the channel empty (nanoseconds after `epoch`; 0: not known to
    /// be): a look within [`DRAIN_GAP`] of it reads nothing, so that a pass over a thousand
    /// lanes costs a thousand lookups, not a thousand `rdma_get_cm_event` system calls.
    empty_at: AtomicU64,
    epoch: Instant,
}

/// How long after the channel was found empty a look (a zero timeout) does not read it again:
/// what a caller polling without a waiter may see an event late by.
const DRAIN_GAP: std::time::Duration = std::time::Duration::from_micros(20);

/// The process's channel, once made.
static MUX: OnceLock<Arc<Mux>> = OnceLock::new();

thread_local! {
    /// When this thread's waiter read the channel empty, if it did since its last wait
    /// began: until its next wait (for [`DRAINED_FOR`] at most), a look of this thread (a
    /// zero timeout) takes what is queued and reads nothing (what comes meanwhile makes the
    /// descriptor readable, and the next wait reads it), so that a pass over the objects a
    /// waiter named costs no `rdma_get_cm_event` system call beyond the waiter's own.
    static DRAINED: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// How long after its waiter's wait a thread's looks rely on it (a pass of a control loop
/// takes far less): a thread that stops waiting reads the channel again on its own after it.
const DRAINED_FOR: std::time::Duration = std::time::Duration::from_millis(5);

/// For a waiter: this thread's waiter read the channel empty now (`true`), or its looks read
/// the channel again (see [`DRAINED`]).
pub(crate) fn set_drained(drained: bool) {
    DRAINED.with(|d| d.set(drained.then(Instant::now)));
}

/// Whether a look of this thread at `now` may leave the channel unread (see [`DRAINED`]).
fn drained_at(now: Instant) -> bool {
    DRAINED.with(|d| d.get()).is_some_and(|t| now.saturating_duration_since(t) < DRAINED_FOR)
}

/// For a waiter: reads what the process's channel has now into its ids' queues (with `drain`,
/// unless another thread is reading it, which queues them itself), then puts in `out`, sorted,
/// the ids (as [`crate::Watch`] keys) that have events queued. Returns how many events were
/// ever queued (a waiter that sees it moved knows that events came which the channel's
/// descriptor no longer shows).
/// With `drain`, it also says whether it read the channel empty itself.
pub(crate) fn queued_keys(drain: bool, out: &mut Vec<usize>) -> io::Result<(u64, bool)> {
    out.clear();
    let Some(m) = MUX.get() else { return Ok((0, drain)) };
    let read = if drain { m.drain() } else { Ok(false) };
    let st = m.lock();
    out.extend(st.queues.keys().copied());
    let ever = st.queued_ever;
    drop(st);
    out.sort_unstable();
    read.map(|emptied| (ever, emptied))
}

/// How long a waiter waits for the leader before it looks again (its `wake`, or to lead).
const FOLLOW_SLICE: std::time::Duration = std::time::Duration::from_millis(5);
/// How long the leader waits on the channel before it looks again (and lets others lead).
const LEAD_SLICE: std::time::Duration = std::time::Duration::from_millis(50);

/// What a leader's turn found.
enum Lead {
    Mine(Event),
    Again,
    Done,
}

/// What a wait on the channel saw.
enum Readable {
    Yes,
    TimedOut,
    Woken,
}

/// Takes an eventfd's count if it has one (non-blocking): whether it was written.
fn take_wake(fd: c_int) -> bool {
    let mut count = 0u64;
    // SAFETY: an eventfd; reading its 8-byte counter into `count` (non-blocking).
    unsafe { libc::read(fd, (&mut count as *mut u64).cast(), 8) == 8 }
}

#[derive(Default)]
struct MuxState {
    /// Someone reads the channel (see [`Mux::next`]).
    leader: bool,
    /// Threads waiting on the condition variable (none: nobody to wake, no system call).
    sleepers: usize,
    /// Events read for ids other than their reader's, by id; an id with none has no entry.
    queues: HashMap<usize, VecDeque<Event>>,
    /// Events ever queued.
    queued_ever: u64,
    /// Ids being destroyed: their events are acknowledged as they are read (a destroy waits
    /// for every event of its id read so far to be acknowledged).
    dying: HashSet<usize>,
}

impl MuxState {
    /// Id `key`'s next queued event (its entry goes with its last).
    fn pop(&mut self, key: usize) -> Option<Event> {
        let q = self.queues.get_mut(&key)?;
        let ev = q.pop_front();
        if q.is_empty() {
            self.queues.remove(&key);
        }
        ev
    }
}

// SAFETY: librdmacm channels may be read, and its events acknowledged, from any thread; the
// queues are behind the mutex.
unsafe impl Send for Mux {}
// SAFETY: as above.
unsafe impl Sync for Mux {}

impl Mux {
    /// The process's channel, made on first use.
    pub(super) fn get() -> io::Result<Arc<Mux>> {
        if let Some(m) = MUX.get() {
            return Ok(m.clone());
        }
        let ch = Channel::new()?;
        let mux = || Mux {
            ch,
            state: Mutex::default(),
            cv: Condvar::new(),
            empty_at: AtomicU64::new(0),
            epoch: Instant::now(),
        };
        Ok(MUX.get_or_init(|| Arc::new(mux())).clone())
    }

    /// Nanoseconds since `epoch` (at least 1: 0 means "not known to be empty").
    fn stamp(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.epoch).as_nanos() as u64).max(1)
    }

    fn lock(&self) -> MutexGuard<'_, MuxState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whose event `ev` is: its id's, or for a connect request its listener's.
    fn key_of(ev: &Event) -> usize {
        if ev.kind() == Ev::RDMA_CM_EVENT_CONNECT_REQUEST {
            ev.listen_id() as usize
        } else {
            ev.id() as usize
        }
    }

    /// The next event of id `key`, waiting until `deadline` (`None`: forever) or until `wake`
    /// (an eventfd) is readable; `Ok(None)` then. One caller at a time reads the channel (the
    /// leader), queueing the events of other ids and waking their waiters; the others wait for
    /// their events to be queued, or to lead in turn.
    pub(super) fn next(
        &self,
        key: *mut rdma_cm_id,
        deadline: Option<Instant>,
        wake: Option<c_int>,
    ) -> io::Result<Option<Event>> {
        let key = key as usize;
        let mut st = self.lock();
        loop {
            if let Some(ev) = st.pop(key) {
                return Ok(Some(ev));
            }
            if wake.is_some_and(take_wake) {
                return Ok(None);
            }
            if st.leader {
                // Someone reads the channel: wait for it to queue ours, or to step down.
                let now = Instant::now();
                let until = deadline.map_or(now + FOLLOW_SLICE, |d| d.min(now + FOLLOW_SLICE));
                if deadline.is_some_and(|d| now >= d) {
                    return Ok(None);
                }
                st.sleepers += 1;
                st = self.cv.wait_timeout(st, until - now).unwrap_or_else(|e| e.into_inner()).0;
                st.sleepers -= 1;
                continue;
            }
            st.leader = true;
            drop(st);
            let read = self.lead(key, deadline, wake);
            st = self.lock();
            st.leader = false;
            self.wake_sleepers(&st);
            match read {
                Ok(Lead::Mine(ev)) => return Ok(Some(ev)),
                Ok(Lead::Again) => {}
                Ok(Lead::Done) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether a look at `now` may leave the channel unread: anyone read it empty a moment
    /// ago ([`DRAIN_GAP`]), or this thread's waiter did since its last wait ([`DRAINED`]).
    fn read_empty_lately(&self, now: Instant) -> bool {
        let empty_at = self.empty_at.load(Ordering::Acquire);
        let since_empty = self.stamp(now).saturating_sub(empty_at);
        (empty_at != 0 && since_empty < DRAIN_GAP.as_nanos() as u64) || drained_at(now)
    }

    /// As the leader: everything the channel has now (queued for its owners, or ours), then a
    /// wait for more until `deadline` or `wake`.
    fn lead(&self, key: usize, deadline: Option<Instant>, wake: Option<c_int>) -> io::Result<Lead> {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) && self.read_empty_lately(now) {
            return Ok(Lead::Done); // (a look: what came since, a waiter reads)
        }
        if let Some(ev) = self.read_now(Some(key))? {
            return Ok(Lead::Mine(ev));
        }
        // (A short wait at a time, so that a waiter with an earlier deadline leads soon.)
        let now = Instant::now();
        let until = deadline.map_or(now + LEAD_SLICE, |d| d.min(now + LEAD_SLICE));
        if deadline.is_some_and(|d| now >= d) {
            return Ok(Lead::Done);
        }
        match self.ch.wait_readable(Some(until), wake)? {
            Readable::Yes | Readable::TimedOut => Ok(Lead::Again),
            Readable::Woken => Ok(Lead::Done),
        }
    }

    /// Reads what the channel has now, queuing each event for its id's owner, until it is
    /// empty (noted: [`DRAIN_GAP`]) or an event of id `mine` comes, which is returned.
    fn read_now(&self, mine: Option<usize>) -> io::Result<Option<Event>> {
        while let Some(ev) = self.ch.take()? {
            if Some(Mux::key_of(&ev)) == mine {
                return Ok(Some(ev));
            }
            self.queue(ev);
        }
        self.empty_at.store(self.stamp(Instant::now()), Ordering::Release);
        Ok(None)
    }

    /// Queues `ev` for its id's owner (or acknowledges it, for an id being destroyed).
    fn queue(&self, ev: Event) {
        let k = Mux::key_of(&ev);
        let mut st = self.lock();
        if !st.dying.contains(&k) {
            st.queues.entry(k).or_default().push_back(ev);
            st.queued_ever += 1;
            self.wake_sleepers(&st);
        }
        // (else acked on drop, after the lock)
    }

    /// Wakes the threads waiting for an event or to lead, if any (`st` is the locked state).
    fn wake_sleepers(&self, st: &MuxState) {
        if st.sleepers > 0 {
            self.cv.notify_all();
        }
    }

    /// Reads everything the channel has now into its ids' queues, unless someone leads (who
    /// queues what comes); returns whether it read the channel empty.
    fn drain(&self) -> io::Result<bool> {
        let mut st = self.lock();
        if st.leader {
            return Ok(false);
        }
        st.leader = true;
        drop(st);
        let read = self.read_now(None);
        let mut st = self.lock();
        st.leader = false;
        self.wake_sleepers(&st);
        drop(st);
        read.map(|_| true)
    }

    /// Forgets id `key` before it is destroyed: its queued events are acknowledged (a queued
    /// connect request's new id destroyed, which rejects it), and events read for it until
    /// [`Mux::buried`] are acknowledged at once.
    fn dying(&self, key: *mut rdma_cm_id) {
        let key = key as usize;
        let queued = {
            let mut st = self.lock();
            st.dying.insert(key);
            st.queues.remove(&key)
        };
        for ev in queued.into_iter().flatten() {
            if ev.kind() == Ev::RDMA_CM_EVENT_CONNECT_REQUEST {
                let new = Id(ev.id());
                drop(ev);
                drop(new);
            }
        }
    }

    /// Id `key` is destroyed: a new id may get its address.
    fn buried(&self, key: *mut rdma_cm_id) {
        self.lock().dying.remove(&(key as usize));
    }
}

/// A cm id on the process's channel, as its owner holds it: its events come through
/// [`Binding::next`]; dropping it destroys the id (after acknowledging its queued events).
pub(super) struct Binding {
    id: Id,
    mux: Arc<Mux>,
}

impl Binding {
    /// A new id on the process's channel.
    pub(super) fn create() -> io::Result<Binding> {
        let mux = Mux::get()?;
        let id = Id::create(&mux.ch)?;
        Ok(Binding { id, mux })
    }

    /// A connect request's new id, which librdmacm put on its listener's channel (this one).
    pub(super) fn adopt(&self, raw: *mut rdma_cm_id) -> Binding {
        Binding { id: Id(raw), mux: self.mux.clone() }
    }

    /// The id.
    pub(super) fn id(&self) -> &Id {
        &self.id
    }

    /// The id's next event (see [`Mux::next`]).
    pub(super) fn next(&self, deadline: Option<Instant>) -> io::Result<Option<Event>> {
        self.mux.next(self.id.0, deadline, None)
    }

    /// The same, ending early (`Ok(None)`) once `wake` (an eventfd) is readable.
    pub(super) fn next_or(
        &self,
        deadline: Option<Instant>,
        wake: Option<c_int>,
    ) -> io::Result<Option<Event>> {
        self.mux.next(self.id.0, deadline, wake)
    }

    /// What a [`crate::CmWaiter`] watches: the process's channel, and this id's events on it.
    pub(super) fn watch(&self) -> crate::Watch {
        crate::Watch { fd: Some(self.mux.ch.fd()), key: self.id.0 as usize }
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        let raw = self.id.0;
        self.mux.dying(raw);
        // SAFETY: a live id; every event of it read so far is acknowledged (queued ones just
        // now, later ones as they are read), so the destroy does not wait for one.
        let ret = unsafe { rdma_sys::rdma_destroy_id(raw) };
        if ret != 0 {
            eprintln!("corelink ibverbs: rdma_destroy_id failed: {}", last_err());
        }
        self.id.0 = std::ptr::null_mut();
        self.mux.buried(raw);
    }
}

/// A cm id, destroyed on drop (which also rejects a pending request or disconnects).
pub(super) struct Id(pub(super) *mut rdma_cm_id);

impl Id {
    pub(super) fn create(ch: &Channel) -> io::Result<Id> {
        let mut id: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: a live channel; `id` is a valid out-pointer.
        let ret = unsafe {
            rdma_sys::rdma_create_id(
                ch.0,
                &mut id,
                std::ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        if ret != 0 || id.is_null() {
            return Err(last_err());
        }
        Ok(Id(id))
    }

    /// The verbs context the id is bound to (NULL while unbound or wildcard).
    pub(super) fn verbs(&self) -> *mut rdma_sys::ibv_context {
        // SAFETY: a live id.
        unsafe { (*self.0).verbs }
    }

    pub(super) fn port_num(&self) -> u8 {
        // SAFETY: a live id.
        unsafe { (*self.0).port_num }
    }

    pub(super) fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: a live id; src_storage is a full sockaddr_storage.
        unsafe {
            sockaddr_to(std::ptr::addr_of!((*self.0).route.addr.src_addr_union.src_storage).cast())
        }
    }

    pub(super) fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: a live id; dst_storage is a full sockaddr_storage.
        unsafe {
            sockaddr_to(std::ptr::addr_of!((*self.0).route.addr.dst_addr_union.dst_storage).cast())
        }
    }
}

impl Drop for Id {
    fn drop(&mut self) {
        if self.0.is_null() {
            return; // (destroyed by its `Binding`)
        }
        // SAFETY: a live id whose events have all been acked (Event acks on drop).
        let ret = unsafe { rdma_sys::rdma_destroy_id(self.0) };
        if ret != 0 {
            eprintln!("corelink ibverbs: rdma_destroy_id failed: {}", last_err());
        }
    }
}

/// A cm event, acknowledged on drop.
pub(super) struct Event(*mut rdma_cm_event);

// SAFETY: an event may be read and acknowledged on any thread (librdmacm locks its id).
unsafe impl Send for Event {}

impl Event {
    pub(super) fn kind(&self) -> u32 {
        // SAFETY: a live (unacked) event.
        unsafe { (*self.0).event }
    }

    pub(super) fn status(&self) -> c_int {
        // SAFETY: a live event.
        unsafe { (*self.0).status }
    }

    pub(super) fn id(&self) -> *mut rdma_cm_id {
        // SAFETY: a live event.
        unsafe { (*self.0).id }
    }

    /// A connect request's listener id.
    pub(super) fn listen_id(&self) -> *mut rdma_cm_id {
        // SAFETY: a live event.
        unsafe { (*self.0).listen_id }
    }

    /// The connection parameters (valid for connection events).
    pub(super) fn conn(&self) -> &rdma_conn_param {
        // SAFETY: a live event; `conn` is the union member for RC/UC connection events, and
        // every member is plain data, so reading it is defined for any event.
        unsafe { &(*self.0).param.conn }
    }

    pub(super) fn private_data(&self) -> Vec<u8> {
        let c = self.conn();
        if c.private_data.is_null() || c.private_data_len == 0 {
            return Vec::new();
        }
        // SAFETY: librdmacm points private_data at `private_data_len` bytes inside the event,
        // valid until the ack.
        unsafe {
            std::slice::from_raw_parts(c.private_data.cast::<u8>(), usize::from(c.private_data_len))
        }
        .to_vec()
    }

    pub(super) fn describe(&self) -> String {
        // SAFETY: rdma_event_str returns a static string for any value.
        let name = unsafe { std::ffi::CStr::from_ptr(rdma_sys::rdma_event_str(self.kind())) }
            .to_string_lossy()
            .into_owned();
        let st = self.status();
        if st < 0 {
            format!("{name} ({})", err_text(&errno_err(-st)))
        } else {
            format!("{name} (status {st})")
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: an event from rdma_get_cm_event, acked once.
        unsafe { rdma_sys::rdma_ack_cm_event(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_look_relies_on_its_threads_waiter_until_the_next_wait_and_not_for_long() {
        let now = Instant::now();
        assert!(!drained_at(now), "no wait yet: a look reads");
        set_drained(true);
        let now = Instant::now();
        assert!(drained_at(now), "right after a wait that read the channel empty");
        assert!(!drained_at(now + DRAINED_FOR), "a thread that stopped waiting reads again");
        let other = std::thread::spawn(|| drained_at(Instant::now())).join().unwrap();
        assert!(!other, "another thread's looks read the channel themselves");
        set_drained(false);
        assert!(!drained_at(Instant::now() + Duration::from_micros(1)), "a new wait began");
    }
}
