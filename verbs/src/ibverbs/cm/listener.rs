//! The passive side's listener: `rdma_listen` and the CONNECT_REQUESTs it hands out.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;
use std::time::Duration;

use rdma_sys::{rdma_cm_event_type as Ev, rdma_cm_id};

use super::channel::Binding;
use super::request::IbvConnRequest;
use super::{check_cm_ctx, cm_err, ctx_name, deadline, other};
use crate::error::{Error, Result};
use crate::ibverbs::context::CtxInner;
use crate::ibverbs::convert::{last_err, sockaddr_from};
use crate::ibverbs::Ibverbs;
use crate::provider::Listener;

/// [`crate::Context::listen`].
pub(crate) fn listen(ctx: &Arc<CtxInner>, addr: SocketAddr) -> Result<IbvListener> {
    check_cm_ctx(ctx, "rdma_listen", addr)?;
    let cm = Binding::create().map_err(cm_err("rdma_create_id", addr))?;
    let id = cm.id();
    let (mut ss, _) = sockaddr_from(addr);
    // SAFETY: a live id; `ss` holds a valid socket address.
    let ret =
        unsafe { rdma_sys::rdma_bind_addr(id.0, (&mut ss as *mut libc::sockaddr_storage).cast()) };
    if ret != 0 {
        return Err(Error::Cm { op: "rdma_bind_addr", addr, source: last_err() });
    }
    let v = id.verbs();
    if !v.is_null() && !ctx.is_device_of(v) {
        return Err(Error::Cm {
            op: "rdma_bind_addr",
            addr,
            source: other(format!(
                "{addr} belongs to RDMA device {}, not {}",
                ctx_name(v),
                ctx.name
            )),
        });
    }
    // SAFETY: a bound id.
    if unsafe { rdma_sys::rdma_listen(id.0, 128) } != 0 {
        return Err(Error::Cm { op: "rdma_listen", addr, source: last_err() });
    }
    let local = id.local_addr().unwrap_or(addr);
    // SAFETY: no pointers; a new non-blocking eventfd, or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::Cm { op: "eventfd", addr, source: last_err() });
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let wake = Arc::new(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
    Ok(IbvListener { cm, ctx: ctx.clone(), local, wake })
}

/// A connection-manager listener. Bound to a wildcard address it hears requests arriving on
/// any device; [`IbvConnRequest::accept`] then refuses a QP of another device.
///
/// [`IbvConnRequest::accept`]: crate::provider::ConnRequest::accept
pub struct IbvListener {
    cm: Binding,
    ctx: Arc<CtxInner>,
    local: SocketAddr,
    /// Its waker's eventfd (see [`crate::Listener::waker`]).
    wake: Arc<std::os::fd::OwnedFd>,
}

// SAFETY: librdmacm ids and channels may be used from any thread; the listener is used by one
// owner at a time (`&mut self`).
unsafe impl Send for IbvListener {}

impl std::fmt::Debug for IbvListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvListener")
            .field("device", &self.ctx.name)
            .field("local", &self.local)
            .finish()
    }
}

impl IbvListener {
    /// The listening `rdma_cm_id` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut rdma_cm_id {
        self.cm.id().0
    }
}

impl Listener<Ibverbs> for IbvListener {
    fn watch(&self) -> crate::Watch {
        self.cm.watch()
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn waker(&self) -> crate::Waker {
        let fd = self.wake.clone();
        crate::Waker::new(move || {
            let one = 1u64;
            // SAFETY: an eventfd kept open by `fd`; writing its 8-byte increment (non-blocking:
            // a full counter, which cannot happen here, only drops this wake).
            let _ = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        })
    }

    fn get_request(&mut self, timeout: Duration) -> Result<Option<IbvConnRequest>> {
        let addr = self.local;
        let dl = deadline(timeout);
        let wake = Some(self.wake.as_raw_fd());
        loop {
            let Some(ev) = self.cm.next_or(dl, wake).map_err(cm_err("rdma_get_cm_event", addr))?
            else {
                return Ok(None);
            };
            if ev.kind() != Ev::RDMA_CM_EVENT_CONNECT_REQUEST {
                continue; // acked on drop
            }
            let private_data = ev.private_data();
            let (responder_resources, initiator_depth) =
                (ev.conn().responder_resources, ev.conn().initiator_depth);
            // The new id is on the listener's channel (the process's): no migration.
            let cm = self.cm.adopt(ev.id());
            drop(ev);
            let peer = cm.id().peer_addr().unwrap_or(addr);
            return Ok(Some(IbvConnRequest {
                cm,
                private_data,
                peer,
                responder_resources,
                initiator_depth,
            }));
        }
    }
}
