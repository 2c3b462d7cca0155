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
/// Every cm id is on the process's one channel; after each wait the waiter reads it into its
/// ids' queues and keeps which ids have events, so that [`CmWaiter::ready`] names exactly the
/// objects to look at (a pass over a hundred connects in progress looks at the one that had
/// an event, not at all hundred).
#[derive(Debug)]
pub struct IbvCmWaiter {
    wake: Arc<OwnedFd>,
    /// The descriptors of one wait (kept: a wait allocates only when the set grows).
    fds: Vec<libc::pollfd>,
    /// The ids (watch keys) with events queued after the last wait, sorted.
    ready: Vec<usize>,
    /// Events ever queued, as the last wait saw it.
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
        Ok(IbvCmWaiter { wake, fds: Vec::new(), ready: Vec::new(), seen: 0 })
    }

    /// Whether watch key `key` had events queued at the last look.
    fn has_events(&self, key: usize) -> bool {
        self.ready.binary_search(&key).is_ok()
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
        // Each descriptor once (every cm id is on the process's one channel).
        for fd in watched.iter().filter_map(|w| w.fd).filter(|fd| *fd >= 0) {
            if !self.fds[1..].iter().any(|p| p.fd == fd) {
                self.fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
            }
        }
        // Events read off the channel since the last look (by another reader, or by this
        // waiter's owner looking at one object) for a watched object: look, do not sleep (the
        // descriptor no longer shows them). (Not for events queued before: an object whose
        // owner leaves one there must not keep its owner from sleeping.)
        super::channel::set_drained(false);
        let (ever, _) =
            super::channel::queued_keys(false, &mut self.ready).map_err(Error::CmWait)?;
        let queued =
            ever != self.seen && watched.iter().any(|w| w.fd.is_some() && self.has_events(w.key));
        let timeout = if queued { Duration::ZERO } else { timeout };
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
        // What the channel has now goes to its ids' queues; the ids with events are ready.
        // Read empty (or not readable when the wait ended), it needs no read from this
        // thread's looks until the next wait.
        let readable = self.fds[1..].iter().any(|p| p.revents != 0);
        let (seen, emptied) =
            super::channel::queued_keys(readable, &mut self.ready).map_err(Error::CmWait)?;
        self.seen = seen;
        super::channel::set_drained(emptied || (rc >= 0 && self.fds.len() > 1 && !readable));
        Ok(())
    }

    fn ready(&self, w: Watch) -> bool {
        match w.fd {
            Some(fd) if fd >= 0 => self.has_events(w.key),
            _ => true,
        }
    }
}
