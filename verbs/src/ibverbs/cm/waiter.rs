//! The control core's wait on its connection-manager objects: `ppoll` over their channels'
//! descriptors (the process's one channel, see `channel.rs`, once) and an eventfd that the
//! waker writes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::ibverbs::convert::last_err;
use crate::provider::{CmWaiter, Waker, Watch};

/// `ibverbs`' [`CmWaiter`]: `ppoll` over the watched event channels and its waker's eventfd.
#[derive(Debug)]
pub struct IbvCmWaiter {
    wake: Arc<OwnedFd>,
    /// The descriptors of one wait (kept: a wait allocates only when the set grows).
    fds: Vec<libc::pollfd>,
    /// The descriptors that were readable at the last wait, as a bit set by number.
    ready: Vec<u64>,
    /// Events were queued for their owners on the process's channel since the wait before:
    /// every object is ready after this wait (its owner looks, and takes its own).
    queued: bool,
    /// The queue generation that wait saw.
    seen: u64,
}

impl IbvCmWaiter {
    pub(crate) fn new() -> Result<IbvCmWaiter> {
        // SAFETY: no pointers; a new non-blocking eventfd, or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::CmWait(last_err()));
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(IbvCmWaiter { wake, fds: Vec::new(), ready: Vec::new(), queued: false, seen: 0 })
    }
}

impl CmWaiter for IbvCmWaiter {
    fn waker(&self) -> Waker {
        let fd = self.wake.clone();
        Waker::new(move || {
            let one = 1u64;
            // SAFETY: an eventfd kept open by `fd`; writing its 8-byte increment (non-blocking:
            // a full counter, which cannot happen here, only drops this wake).
            let _ = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        })
    }

    fn wait(&mut self, watched: &[Watch], timeout: Duration) -> Result<()> {
        let wake = self.wake.as_raw_fd();
        self.fds.clear();
        self.fds.push(libc::pollfd { fd: wake, events: libc::POLLIN, revents: 0 });
        // Each descriptor once (every cm id is on the process's one channel), marked in
        // `ready` as it is added (cleared again below).
        for fd in watched.iter().filter_map(|w| w.0).filter(|fd| *fd >= 0) {
            let (word, bit) = (fd as usize / 64, fd as usize % 64);
            if word >= self.ready.len() {
                self.ready.resize(word + 1, 0);
            }
            if self.ready[word] & (1 << bit) == 0 {
                self.ready[word] |= 1 << bit;
                self.fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
            }
        }
        // Events already read off the channel for others: look, do not sleep.
        let generation = super::channel::queue_generation();
        self.queued = generation != self.seen;
        self.seen = generation;
        let timeout = if self.queued { Duration::ZERO } else { timeout };
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
        };
        // SAFETY: `fds` holds `len` valid pollfds; `ts` is a valid timespec; no signal mask.
        let rc = unsafe {
            libc::ppoll(
                self.fds.as_mut_ptr(),
                self.fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if rc < 0 {
            let e = last_err();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(Error::CmWait(e));
            }
        }
        if self.fds[0].revents & libc::POLLIN != 0 {
            let mut count = 0u64;
            // SAFETY: an eventfd; reading its 8-byte counter into `count` (non-blocking).
            let _ = unsafe { libc::read(wake, (&mut count as *mut u64).cast(), 8) };
        }
        self.ready.iter_mut().for_each(|w| *w = 0);
        for p in self.fds.iter().skip(1).filter(|p| p.revents != 0 && p.fd >= 0) {
            super::channel::note_readable(p.fd);
            let (word, bit) = (p.fd as usize / 64, p.fd as usize % 64);
            if word >= self.ready.len() {
                self.ready.resize(word + 1, 0);
            }
            self.ready[word] |= 1 << bit;
        }
        Ok(())
    }

    fn ready(&self, w: Watch) -> bool {
        let Some(fd) = w.0.filter(|fd| *fd >= 0) else { return true };
        if self.queued {
            return true;
        }
        let (word, bit) = (fd as usize / 64, fd as usize % 64);
        self.ready.get(word).is_some_and(|w| w & (1 << bit) != 0)
    }
}
