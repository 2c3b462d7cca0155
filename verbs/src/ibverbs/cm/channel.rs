//! RAII wrappers over librdmacm's raw objects: the event channel ([`Channel`]), the cm id
//! ([`Id`]) and the cm event ([`Event`]).

use std::io;
use std::net::SocketAddr;
use std::os::raw::c_int;
use std::time::Instant;

use rdma_sys::{rdma_cm_event, rdma_cm_id, rdma_conn_param, rdma_event_channel, rdma_port_space};

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

    /// What a [`crate::CmWaiter`] watches of it.
    pub(super) fn watch(&self) -> crate::Watch {
        crate::Watch(Some(self.fd()))
    }

    fn fd(&self) -> c_int {
        // SAFETY: a live channel.
        unsafe { (*self.0).fd }
    }

    /// The next event, waiting until `deadline` (`None`: forever). `Ok(None)` on timeout.
    pub(super) fn wait(&self, deadline: Option<Instant>) -> io::Result<Option<Event>> {
        self.wait_or(deadline, None)
    }

    /// As [`Channel::wait`], and ends early (`Ok(None)`) once `wake` (an eventfd) is readable,
    /// taking its count.
    pub(super) fn wait_or(
        &self,
        deadline: Option<Instant>,
        wake: Option<c_int>,
    ) -> io::Result<Option<Event>> {
        loop {
            let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
            // SAFETY: a live channel; the fd is non-blocking, so this returns at once.
            let ret = unsafe { rdma_sys::rdma_get_cm_event(self.0, &mut ev) };
            if ret == 0 && !ev.is_null() {
                return Ok(Some(Event(ev)));
            }
            let e = last_err();
            match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => {}
                _ => return Err(e),
            }
            let wait_ms = match deadline {
                None => -1,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(None);
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
            }
            if let (Some(fd), true) = (wake, pfd[1].revents & libc::POLLIN != 0) {
                let mut count = 0u64;
                // SAFETY: an eventfd; reading its 8-byte counter into `count` (non-blocking).
                let _ = unsafe { libc::read(fd, (&mut count as *mut u64).cast(), 8) };
                return Ok(None);
            }
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: created by rdma_create_event_channel; every id on it is destroyed first
        // (ids are declared before their channel in every owner).
        unsafe { rdma_sys::rdma_destroy_event_channel(self.0) };
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
        // SAFETY: a live id whose events have all been acked (Event acks on drop).
        let ret = unsafe { rdma_sys::rdma_destroy_id(self.0) };
        if ret != 0 {
            eprintln!("corelink ibverbs: rdma_destroy_id failed: {}", last_err());
        }
    }
}

/// A cm event, acknowledged on drop.
pub(super) struct Event(*mut rdma_cm_event);

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
