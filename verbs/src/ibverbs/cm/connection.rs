//! An established connection ([`IbvConnection`]): its events and its disconnect.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rdma_sys::{rdma_cm_event_type as Ev, rdma_cm_id};

use super::channel::Binding;
use super::{cm_err, deadline};
use crate::error::{Error, Result};
use crate::ibverbs::convert::last_err;
use crate::ibverbs::qp::QpInner;
use crate::provider::{CmEvent, Connection};

/// The connection-manager side of an established connection. Dropping it destroys the id
/// (which disconnects if still connected) and its queued events; the QP stays the caller's.
pub struct IbvConnection {
    pub(super) cm: Binding,
    pub(super) qp: Arc<QpInner>,
    pub(super) peer_private: Vec<u8>,
    pub(super) peer: SocketAddr,
    /// ESTABLISHED is reported once by the first `poll_event`.
    pub(super) pending_established: bool,
    /// A disconnect was seen or done.
    pub(super) disconnected: bool,
}

// SAFETY: librdmacm ids and channels may be used from any thread; one owner at a time.
unsafe impl Send for IbvConnection {}

impl std::fmt::Debug for IbvConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvConnection")
            .field("peer", &self.peer)
            .field("disconnected", &self.disconnected)
            .finish()
    }
}

impl IbvConnection {
    /// The connection's `rdma_cm_id` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut rdma_cm_id {
        self.cm.id().0
    }
}

impl Connection for IbvConnection {
    fn watch(&self) -> crate::Watch {
        self.cm.watch()
    }

    fn peer_private_data(&self) -> &[u8] {
        &self.peer_private
    }

    /// ESTABLISHED first (once), then DISCONNECTED / DEVICE_REMOVAL as they come; other
    /// events (TIMEWAIT_EXIT, ...) are skipped. A peer's disconnect does not touch the local
    /// QP: move it to ERR to flush it.
    fn poll_event(&mut self, timeout: Duration) -> Result<Option<CmEvent>> {
        if self.pending_established {
            self.pending_established = false;
            return Ok(Some(CmEvent::Established));
        }
        let dl = deadline(timeout);
        loop {
            let Some(ev) = self.cm.next(dl).map_err(cm_err("rdma_get_cm_event", self.peer))? else {
                return Ok(None);
            };
            match ev.kind() {
                Ev::RDMA_CM_EVENT_DISCONNECTED => {
                    self.disconnected = true;
                    return Ok(Some(CmEvent::Disconnected));
                }
                Ev::RDMA_CM_EVENT_ESTABLISHED => return Ok(Some(CmEvent::Established)),
                Ev::RDMA_CM_EVENT_DEVICE_REMOVAL => return Ok(Some(CmEvent::DeviceRemoval)),
                _ => {}
            }
        }
    }

    /// Moves the QP to ERR (its outstanding requests flush) and sends a disconnect request;
    /// the DISCONNECTED event follows on both sides. Idempotent.
    fn disconnect(&mut self) -> Result<()> {
        self.qp.to_err().map_err(cm_err("ibv_modify_qp(ERR)", self.peer))?;
        if self.disconnected {
            return Ok(());
        }
        self.disconnected = true;
        // SAFETY: a live, connected id.
        if unsafe { rdma_sys::rdma_disconnect(self.cm.id().0) } != 0 {
            let e = last_err();
            // Already disconnected by the peer (event not polled yet): nothing left to do.
            if e.raw_os_error() == Some(libc::EINVAL) {
                return Ok(());
            }
            return Err(Error::Cm { op: "rdma_disconnect", addr: self.peer, source: e });
        }
        Ok(())
    }
}
