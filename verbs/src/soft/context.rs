//! The `soft` device context: one port on the in-process fabric, with its GID and its
//! asynchronous event queue.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;

use super::cm::SoftListener;
use super::cq::SoftCq;
use super::mem::SoftPd;
use super::qp::SoftQp;
use super::{limits, Soft};
use crate::error::{Error, Result};
use crate::types::*;

/// Asynchronous events a context keeps before dropping the oldest.
const ASYNC_QUEUE: usize = 256;

/// What a context's objects share.
#[derive(Debug)]
pub(crate) struct CtxShared {
    /// The port's identifier (its LID, GID and node GUID derive from it), shared by siblings:
    /// two contexts are of one device when their ids are equal.
    pub(crate) id: u64,
    pub(crate) gid: Gid,
    pub(crate) name: String,
    events: ArrayQueue<AsyncEvent>,
}

impl CtxShared {
    /// Queues an asynchronous event (the oldest is dropped when the queue is full).
    pub(crate) fn raise(&self, kind: AsyncEventKind, element: AsyncElement) {
        self.events.force_push(AsyncEvent { kind, element });
    }

    /// The device as errors name it: its name and port (every `Soft::open` is a port of its
    /// own, as a host is; siblings share theirs).
    pub(crate) fn describe(&self) -> String {
        format!("{} (port {:#x})", self.name, self.id)
    }

    /// Whether `other` is of this context's device (its port).
    pub(crate) fn same_device(&self, other: &CtxShared) -> bool {
        self.id == other.id
    }

    /// Port LID: the context id's low bits (never 0).
    pub(crate) fn lid(&self) -> u16 {
        (self.id % 0xbfff) as u16 + 1
    }
}

/// An open `soft` device: one port on the in-process fabric.
#[derive(Debug, Clone)]
pub struct SoftContext {
    pub(crate) shared: Arc<CtxShared>,
}

impl SoftContext {
    pub(crate) fn new(name: &str) -> Self {
        let id = super::fabric::Fabric::get().next_id();
        // On a named fabric the GID carries the process id (bytes 8..12), so that a peer
        // knows which process a QP of that port lives in (`soft::port`).
        let id = match super::port::get() {
            Some(port) => u64::from(port.pid) << 32 | (id & 0xffff_ffff),
            None => id,
        };
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[8..].copy_from_slice(&id.to_be_bytes());
        SoftContext {
            shared: Arc::new(CtxShared {
                id,
                gid: Gid(gid),
                name: name.to_owned(),
                events: ArrayQueue::new(ASYNC_QUEUE),
            }),
        }
    }

    fn check_port(&self, port: u8) -> Result<()> {
        if port == 1 {
            Ok(())
        } else {
            Err(Error::QueryPort {
                device: self.shared.name.clone(),
                port,
                source: crate::error::invalid("the soft device has one port, number 1"),
            })
        }
    }
}

impl crate::Context<Soft> for SoftContext {
    fn name(&self) -> &str {
        &self.shared.name
    }

    /// A new context on the same port (same GID, LID and node GUID), with its own
    /// asynchronous events.
    fn open_sibling(&self) -> Result<SoftContext> {
        let s = &self.shared;
        Ok(SoftContext {
            shared: Arc::new(CtxShared {
                id: s.id,
                gid: s.gid,
                name: s.name.clone(),
                events: ArrayQueue::new(ASYNC_QUEUE),
            }),
        })
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        Ok(DeviceAttr {
            fw_ver: env!("CARGO_PKG_VERSION").to_owned(),
            node_guid: self.shared.id,
            max_mr_size: u64::MAX,
            max_qp: 1 << 20,
            max_qp_wr: limits::MAX_QP_WR,
            max_sge: limits::MAX_SGE as u32,
            max_cqe: limits::MAX_CQE,
            max_mr: 1 << 20,
            max_mw: 1 << 20,
            max_qp_rd_atom: limits::MAX_RD_ATOMIC,
            max_qp_init_rd_atom: limits::MAX_RD_ATOMIC,
            max_srq: 1 << 16,
            max_srq_wr: limits::MAX_QP_WR,
            phys_port_cnt: 1,
            atomics: true,
        })
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.check_port(port)?;
        Ok(PortAttr {
            state: PortState::Active,
            max_mtu: limits::MTU,
            active_mtu: limits::MTU,
            lid: self.shared.lid(),
            gid_tbl_len: 1,
            max_msg_sz: limits::MAX_MSG,
            link_layer: LinkLayer::Soft,
        })
    }

    fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        self.check_port(port)?;
        if index != 0 {
            return Err(Error::QueryGid {
                port,
                index,
                source: crate::error::invalid("the soft port has one GID, index 0"),
            });
        }
        Ok(self.shared.gid)
    }

    fn alloc_pd(&self) -> Result<SoftPd> {
        Ok(SoftPd::new(self.shared.clone()))
    }

    fn create_cq(&self, depth: u32) -> Result<SoftCq> {
        SoftCq::new(&self.shared, depth)
    }

    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        Ok(self.shared.events.pop())
    }

    fn listen(&self, addr: SocketAddr) -> Result<SoftListener> {
        SoftListener::bind(self, addr)
    }

    fn connect_start(
        &self,
        addr: SocketAddr,
        qp: &mut SoftQp,
        attr: &QpAttr,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<super::SoftConnecting> {
        super::cm::connect_start(self, addr, qp, attr, private_data, timeout)
    }

    fn endpoint(&self, qp: &SoftQp, _port: u8, _gid_index: u32) -> Result<Endpoint> {
        use crate::Qp;
        Ok(Endpoint { qpn: qp.qp_num(), psn: 0, lid: self.shared.lid(), gid: self.shared.gid })
    }
}
