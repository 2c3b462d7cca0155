//! `soft` across processes, the direct path: memory a peer process reaches without this
//! process's CPU, as a NIC's DMA would.
//!
//! On a named fabric, the memory `Pd::register` allocates lives in a shared segment (a memfd,
//! mapped here; a peer maps the same file through `/proc/<pid>/fd/<fd>`, which the kernel lets a
//! process of the same user open). Each process also publishes, in a table of its own (one more
//! memfd), what a requester must check before it touches that memory: its QPs (state, type,
//! remote rights, PD) and its regions' keys (PD, rights, range, segment). A peer's RC write or
//! read then checks the table and copies to or from its mapping of the segment, with no message
//! and no work in this process. Anything else (a key the table does not show: a window, a region
//! of the caller's own memory outside any segment; a check that fails; atomics, sends, writes
//! with an immediate) goes over the link to this process's responder, whose answer is then the
//! exact one (`exec::serve`), as in one process.
//!
//! Table entries are written under a sequence lock (odd while changing) and read with it, every
//! field an atomic: a reader never sees half an entry.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::types::{AccessFlags, QpType};

/// Keys the table publishes (key slots above it are reached through the responder).
const KEYS: usize = 1 << 14;
/// QPs the table publishes (by QP number modulo this).
const QPS: usize = 1 << 12;
/// Segments the table names.
const SEGS: usize = 1 << 12;

/// A published key: a region's.
#[repr(C)]
#[derive(Default)]
struct PubKey {
    seq: AtomicU32,
    key: AtomicU32,
    access: AtomicU32,
    seg: AtomicU32,
    pd: AtomicU64,
    addr: AtomicU64,
    len: AtomicU64,
    /// Offset of `addr` in the segment.
    seg_off: AtomicU64,
}

/// A published QP.
#[repr(C)]
#[derive(Default)]
struct PubQp {
    seq: AtomicU32,
    qpn: AtomicU32,
    /// State, type, remote rights: `state | type << 8 | access << 16`.
    bits: AtomicU32,
    _pad: AtomicU32,
    pd: AtomicU64,
}

/// A published segment: its file descriptor in the owner and its length (0: free).
#[repr(C)]
#[derive(Default)]
struct PubSeg {
    seq: AtomicU32,
    fd: AtomicU32,
    len: AtomicU64,
    /// Changes each time the slot is reused (a mapping of the old file is stale).
    generation: AtomicU64,
}

#[repr(C)]
struct Table {
    keys: [PubKey; KEYS],
    qps: [PubQp; QPS],
    segs: [PubSeg; SEGS],
}

/// Writes an entry under its sequence lock.
fn write_locked(seq: &AtomicU32, f: impl FnOnce()) {
    seq.fetch_add(1, Ordering::AcqRel); // odd: changing
    fence(Ordering::Release);
    f();
    seq.fetch_add(1, Ordering::Release);
}

/// Reads an entry under its sequence lock (`None`: it kept changing).
fn read_locked<T>(seq: &AtomicU32, f: impl Fn() -> T) -> Option<T> {
    for _ in 0..64 {
        let s = seq.load(Ordering::Acquire);
        if s & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let v = f();
        fence(Ordering::Acquire);
        if seq.load(Ordering::Relaxed) == s {
            return Some(v);
        }
    }
    None
}

/// A shared mapping of a file.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access to it goes through raw pointers by
// the callers' own synchronisation (atomics for the table, the RDMA contract for data).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(file: &File, len: usize) -> std::io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of `len` bytes of `file` (at least that long); the
        // result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast(), len: len.max(1) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` is this mapping's, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn memfd(name: &str, len: usize) -> std::io::Result<File> {
    let cname = std::ffi::CString::new(name).expect("no NUL");
    // SAFETY: `cname` is a valid C string; the result is checked.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor this function owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len as u64)?;
    Ok(file)
}

/// This process's published table.
struct Local {
    file: File,
    map: Mapping,
    /// Segment slots in use.
    segs: Mutex<Vec<bool>>,
}

impl Local {
    fn table(&self) -> &Table {
        // SAFETY: the mapping holds a zero-initialised `Table` (all atomics, valid at zero) for
        // the process's lifetime.
        unsafe { &*(self.map.ptr as *const Table) }
    }
}

fn local() -> Option<&'static Local> {
    static LOCAL: OnceLock<Option<Local>> = OnceLock::new();
    LOCAL
        .get_or_init(|| {
            super::port::get()?;
            let len = std::mem::size_of::<Table>();
            let file = memfd("corelink-soft-table", len).ok()?;
            let map = Mapping::new(&file, len).ok()?;
            Some(Local { file, map, segs: Mutex::new(vec![false; SEGS]) })
        })
        .as_ref()
}

/// The descriptor of this process's table (what a peer opens as `/proc/<pid>/fd/<fd>`), when
/// this process is on a fabric.
pub(crate) fn table_fd() -> Option<u32> {
    local().map(|l| l.file.as_raw_fd() as u32)
}

/// Memory a region allocated in a shared segment.
#[derive(Debug)]
pub(crate) struct Segment {
    _file: File,
    map: Mapping,
    slot: u32,
}

impl Segment {
    /// `len` zeroed bytes in a new shared segment (`None`: not on a fabric, or no slot or
    /// file could be had: the caller allocates on the heap as in one process).
    pub(crate) fn new(len: usize) -> Option<Segment> {
        let l = local()?;
        let slot = {
            let mut segs = l.segs.lock().unwrap_or_else(|e| e.into_inner());
            let i = segs.iter().position(|used| !used)?;
            segs[i] = true;
            i as u32
        };
        let made = memfd("corelink-soft-mr", len.max(1))
            .and_then(|f| Mapping::new(&f, len.max(1)).map(|m| (f, m)));
        let Ok((file, map)) = made else {
            l.segs.lock().unwrap_or_else(|e| e.into_inner())[slot as usize] = false;
            return None;
        };
        let s = &l.table().segs[slot as usize];
        write_locked(&s.seq, || {
            s.fd.store(file.as_raw_fd() as u32, Ordering::Relaxed);
            s.len.store(map.len as u64, Ordering::Relaxed);
            s.generation.fetch_add(1, Ordering::Relaxed);
        });
        registry().lock().unwrap_or_else(|e| e.into_inner()).push((
            map.ptr as u64,
            map.len as u64,
            slot,
        ));
        Some(Segment { _file: file, map, slot })
    }

    /// Its first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.map.ptr
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        let Some(l) = local() else { return };
        registry().lock().unwrap_or_else(|e| e.into_inner()).retain(|e| e.2 != self.slot);
        let s = &l.table().segs[self.slot as usize];
        write_locked(&s.seq, || s.len.store(0, Ordering::Relaxed));
        l.segs.lock().unwrap_or_else(|e| e.into_inner())[self.slot as usize] = false;
    }
}

/// This process's segments: (address, length, slot).
fn registry() -> &'static Mutex<Vec<(u64, u64, u32)>> {
    static REG: Mutex<Vec<(u64, u64, u32)>> = Mutex::new(Vec::new());
    &REG
}

/// The segment and offset `addr..addr+len` lies in, if one holds it all.
pub(crate) fn segment_of(addr: u64, len: u64) -> Option<(u32, u64)> {
    local()?;
    let reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    reg.iter()
        .find(|(a, l, _)| addr >= *a && addr.checked_add(len).is_some_and(|end| end <= a + l))
        .map(|(a, _, slot)| (*slot, addr - a))
}

/// What a published region says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyView {
    pub(crate) access: AccessFlags,
    pub(crate) pd: u64,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) seg: u32,
    pub(crate) seg_off: u64,
}

/// Publishes region key `key` (in segment `seg` at `seg_off`, its first byte at `addr`).
pub(crate) fn publish_key(key: u32, view: KeyView) {
    let Some(l) = local() else { return };
    let Some(e) = l.table().keys.get((key >> 8) as usize) else { return };
    write_locked(&e.seq, || {
        e.key.store(key, Ordering::Relaxed);
        e.access.store(view.access.bits(), Ordering::Relaxed);
        e.seg.store(view.seg, Ordering::Relaxed);
        e.pd.store(view.pd, Ordering::Relaxed);
        e.addr.store(view.addr, Ordering::Relaxed);
        e.len.store(view.len, Ordering::Relaxed);
        e.seg_off.store(view.seg_off, Ordering::Relaxed);
    });
}

/// Takes key `key` out of the table.
pub(crate) fn unpublish_key(key: u32) {
    let Some(l) = local() else { return };
    let Some(e) = l.table().keys.get((key >> 8) as usize) else { return };
    if e.key.load(Ordering::Relaxed) == key {
        write_locked(&e.seq, || e.key.store(0, Ordering::Relaxed));
    }
}

/// What a published QP says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpView {
    pub(crate) state: u8,
    pub(crate) qp_type: QpType,
    pub(crate) access: AccessFlags,
    pub(crate) pd: u64,
}

fn type_code(t: QpType) -> u32 {
    match t {
        QpType::Rc => 0,
        QpType::Uc => 1,
        QpType::Ud => 2,
    }
}

/// Publishes QP `qpn` (`None`: it is gone).
pub(crate) fn publish_qp(qpn: u32, view: Option<QpView>) {
    let Some(l) = local() else { return };
    let e = &l.table().qps[qpn as usize % QPS];
    write_locked(&e.seq, || match view {
        Some(v) => {
            e.qpn.store(qpn, Ordering::Relaxed);
            let bits =
                u32::from(v.state) | type_code(v.qp_type) << 8 | (v.access.bits() & 0xffff) << 16;
            e.bits.store(bits, Ordering::Relaxed);
            e.pd.store(v.pd, Ordering::Relaxed);
        }
        None => {
            if e.qpn.load(Ordering::Relaxed) == qpn {
                e.qpn.store(0, Ordering::Relaxed);
            }
        }
    });
}

/// A peer process's table, mapped here, and the segments of it mapped so far.
#[derive(Debug)]
pub(crate) struct PeerView {
    pid: u32,
    table: Mapping,
    /// Its segments mapped here, by slot.
    segs: Mutex<Vec<Option<Mapped>>>,
}

/// A peer's segment mapped here, with the generation of its slot when it was mapped.
type Mapped = (u64, Arc<Mapping>);

fn open_peer_fd(pid: u32, fd: u32) -> std::io::Result<File> {
    std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/{pid}/fd/{fd}"))
}

impl PeerView {
    /// Maps the table process `pid` published as its descriptor `fd`.
    pub(crate) fn open(pid: u32, fd: u32) -> std::io::Result<PeerView> {
        let file = open_peer_fd(pid, fd)?;
        let len = std::mem::size_of::<Table>();
        if file.metadata()?.len() < len as u64 {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a short table"));
        }
        let table = Mapping::new(&file, len)?;
        Ok(PeerView { pid, table, segs: Mutex::new(vec![None; SEGS]) })
    }

    fn table(&self) -> &Table {
        // SAFETY: the mapping holds the peer's `Table` (atomics only, any bit pattern valid).
        unsafe { &*(self.table.ptr as *const Table) }
    }

    /// What the table says of QP `qpn`.
    pub(crate) fn qp(&self, qpn: u32) -> Option<QpView> {
        let e = &self.table().qps[qpn as usize % QPS];
        let (n, bits, pd) = read_locked(&e.seq, || {
            (
                e.qpn.load(Ordering::Relaxed),
                e.bits.load(Ordering::Relaxed),
                e.pd.load(Ordering::Relaxed),
            )
        })?;
        if n != qpn || qpn == 0 {
            return None;
        }
        let qp_type = match (bits >> 8) & 0xff {
            0 => QpType::Rc,
            1 => QpType::Uc,
            _ => QpType::Ud,
        };
        let access = AccessFlags::from_bits_truncate(bits >> 16);
        Some(QpView { state: (bits & 0xff) as u8, qp_type, access, pd })
    }

    /// What the table says of region key `key`.
    pub(crate) fn key(&self, key: u32) -> Option<KeyView> {
        let e = self.table().keys.get((key >> 8) as usize)?;
        let (k, v) = read_locked(&e.seq, || {
            let v = KeyView {
                access: AccessFlags::from_bits_truncate(e.access.load(Ordering::Relaxed)),
                pd: e.pd.load(Ordering::Relaxed),
                addr: e.addr.load(Ordering::Relaxed),
                len: e.len.load(Ordering::Relaxed),
                seg: e.seg.load(Ordering::Relaxed),
                seg_off: e.seg_off.load(Ordering::Relaxed),
            };
            (e.key.load(Ordering::Relaxed), v)
        })?;
        (k == key && key != 0).then_some(v)
    }

    /// Segment `slot` mapped here (mapped now if it was not, or was reused since).
    pub(crate) fn segment(&self, slot: u32) -> Option<Arc<Mapping>> {
        let e = self.table().segs.get(slot as usize)?;
        let (fd, len, generation) = read_locked(&e.seq, || {
            (
                e.fd.load(Ordering::Relaxed),
                e.len.load(Ordering::Relaxed),
                e.generation.load(Ordering::Relaxed),
            )
        })?;
        if len == 0 {
            return None;
        }
        let mut segs = self.segs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((g, m)) = &segs[slot as usize] {
            if *g == generation && m.len as u64 >= len {
                return Some(m.clone());
            }
        }
        let file = open_peer_fd(self.pid, fd).ok()?;
        if file.metadata().ok()?.len() < len {
            return None;
        }
        let m = Arc::new(Mapping::new(&file, len as usize).ok()?);
        segs[slot as usize] = Some((generation, m.clone()));
        Some(m)
    }
}

impl Mapping {
    /// `len` bytes at `off`, if inside.
    pub(crate) fn at(&self, off: u64, len: u64) -> Option<*mut u8> {
        let end = off.checked_add(len)?;
        // SAFETY: `off + len` is within the mapping (checked), so the pointer stays inside.
        (end <= self.len as u64).then(|| unsafe { self.ptr.add(off as usize) })
    }
}

/// Requests a mailbox holds at once.
const SLOTS: usize = 64;
/// Bytes of one slot: its head and a frame of at most [`MAILBOX_FRAME`] bytes.
const SLOT_BYTES: usize = 8192;
/// The largest frame a mailbox slot carries (a request, or its response).
pub(crate) const MAILBOX_FRAME: usize = SLOT_BYTES - 16;

/// A slot's states: free, being written by the requester, posted, being served, answered.
const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const POSTED: u32 = 2;
const SERVING: u32 = 3;
const ANSWERED: u32 = 4;

/// A mailbox's shared layout: how many requests were ever posted, then the slots.
#[repr(C)]
struct MailboxHead {
    posted: AtomicU64,
    _pad: [u64; 7],
}

#[repr(C)]
struct SlotHead {
    state: AtomicU32,
    len: AtomicU32,
    _pad: u64,
}

/// Where a requester process leaves its RC requests for one peer process, and finds their
/// responses: shared memory the peer drains when it polls a CQ (or, when it does not soon,
/// its port's thread on a nudge). A request then costs no system call and no thread wake-up
/// while the peer polls, as a NIC's doorbell and its completion would.
#[derive(Debug)]
pub(crate) struct Mailbox {
    file: File,
    map: Mapping,
}

impl Mailbox {
    const LEN: usize = std::mem::size_of::<MailboxHead>() + SLOTS * SLOT_BYTES;

    /// A new mailbox, in a memfd.
    pub(crate) fn new() -> std::io::Result<Mailbox> {
        let file = memfd("corelink-soft-mailbox", Self::LEN)?;
        let map = Mapping::new(&file, Self::LEN)?;
        Ok(Mailbox { file, map })
    }

    /// The requester's mailbox, mapped in the peer (process `pid`, its descriptor `fd`).
    pub(crate) fn open(pid: u32, fd: u32) -> std::io::Result<Mailbox> {
        let file = open_peer_fd(pid, fd)?;
        if file.metadata()?.len() < Self::LEN as u64 {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a short mailbox"));
        }
        let map = Mapping::new(&file, Self::LEN)?;
        Ok(Mailbox { file, map })
    }

    /// Its descriptor in this process.
    pub(crate) fn fd(&self) -> u32 {
        self.file.as_raw_fd() as u32
    }

    fn head(&self) -> &MailboxHead {
        // SAFETY: the mapping starts with a `MailboxHead` (atomics; zero is valid).
        unsafe { &*(self.map.ptr as *const MailboxHead) }
    }

    /// Slot `i`'s head and frame bytes.
    fn slot(&self, i: usize) -> (&SlotHead, *mut u8) {
        let off = std::mem::size_of::<MailboxHead>() + i * SLOT_BYTES;
        // SAFETY: `i < SLOTS`, so the slot lies within the mapping; it starts with a
        // `SlotHead` (atomics; zero is valid) followed by its frame bytes.
        unsafe {
            let p = self.map.ptr.add(off);
            (&*(p as *const SlotHead), p.add(std::mem::size_of::<SlotHead>()))
        }
    }

    /// Leaves `frame` in a free slot and returns the slot (`None`: every slot is taken, or the
    /// frame is too long: the request goes another way).
    pub(crate) fn post(&self, frame: &[u8]) -> Option<usize> {
        if frame.len() > MAILBOX_FRAME {
            return None;
        }
        for i in 0..SLOTS {
            let (h, data) = self.slot(i);
            if h.state.load(Ordering::Relaxed) == FREE
                && h.state
                    .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // SAFETY: the slot is this thread's (claimed) and holds MAILBOX_FRAME bytes.
                unsafe { std::ptr::copy_nonoverlapping(frame.as_ptr(), data, frame.len()) };
                h.len.store(frame.len() as u32, Ordering::Relaxed);
                h.state.store(POSTED, Ordering::Release);
                self.head().posted.fetch_add(1, Ordering::Release);
                return Some(i);
            }
        }
        None
    }

    /// What `read` makes of the answer in slot `i`, if it came (the slot is free again then).
    pub(crate) fn answer<T>(&self, i: usize, read: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let (h, data) = self.slot(i);
        if h.state.load(Ordering::Acquire) != ANSWERED {
            return None;
        }
        let n = (h.len.load(Ordering::Relaxed) as usize).min(MAILBOX_FRAME);
        // SAFETY: the responder wrote `n` bytes before it marked the slot answered (release,
        // acquired above); the slot stays this thread's until it is freed below.
        let got = read(unsafe { std::slice::from_raw_parts(data, n) });
        h.state.store(FREE, Ordering::Release);
        Some(got)
    }

    /// Gives up on slot `i`: freed if its request was not taken up yet, or was answered;
    /// `false` while the peer serves it (then it stays taken until it is answered: never
    /// reused under the peer).
    pub(crate) fn abandon(&self, i: usize) -> bool {
        let (h, _) = self.slot(i);
        let free = |from| {
            h.state.compare_exchange(from, FREE, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        };
        free(POSTED) || free(ANSWERED) || h.state.load(Ordering::Acquire) == FREE
    }

    /// How many requests were ever posted (what a drain compares with what it has seen).
    pub(crate) fn posted(&self) -> u64 {
        self.head().posted.load(Ordering::Acquire)
    }

    /// Serves every posted request with `serve` (the request's frame body in, the response's
    /// whole frame out).
    pub(crate) fn serve_all(&self, mut serve: impl FnMut(&[u8]) -> Vec<u8>) {
        for i in 0..SLOTS {
            let (h, data) = self.slot(i);
            // (a load first: a slot not posted is not written, so its line stays shared)
            if h.state.load(Ordering::Relaxed) != POSTED
                || h.state
                    .compare_exchange(POSTED, SERVING, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            let n = (h.len.load(Ordering::Relaxed) as usize).min(MAILBOX_FRAME);
            // SAFETY: the requester wrote `n` bytes before it posted (release, acquired by the
            // exchange); the slot is this thread's while SERVING, and the slice is dropped
            // before the response is written over it.
            let mut resp = serve(unsafe { std::slice::from_raw_parts(data, n) });
            resp.truncate(MAILBOX_FRAME); // (the requester sized the request to fit)
                                          // SAFETY: as above; `resp` fits the slot.
            unsafe { std::ptr::copy_nonoverlapping(resp.as_ptr(), data, resp.len()) };
            h.len.store(resp.len() as u32, Ordering::Relaxed);
            h.state.store(ANSWERED, Ordering::Release);
        }
    }
}
