//! The open device: queries, PD and CQ creation, async events.

use std::ffi::CStr;
use std::net::SocketAddr;
use std::sync::{Arc, Once, OnceLock};
use std::time::Duration;

use rdma_sys::{ibv_context, ibv_device_attr, ibv_gid, ibv_port_attr};

use super::cm::{self, IbvListener};
use super::convert::{
    async_element_kind, async_kind_from_ibv, last_err, link_layer_from_ibv, mtu_from_ibv,
    port_state_from_ibv, ret_err, AsyncElementKind,
};
use super::cq::IbvCq;
use super::pd::IbvPd;
use super::qp::IbvQp;
use super::{device_name, DeviceList, Ibverbs, Listing};
use crate::error::{Error, Result};
use crate::provider::Context;
use crate::types::{AsyncElement, AsyncEvent, DeviceAttr, Gid, LinkLayer, PortAttr, QpAttr};

/// Who owns the `ibv_context`.
enum Owner {
    /// librdmacm: the context is one of `rdma_get_devices`' list, kept (refcounted) until the
    /// list is freed with `rdma_free_devices`.
    RdmaCm(*mut *mut ibv_context),
    /// We opened it with `ibv_open_device` and close it.
    Opened,
}

/// The shared state of an open device.
pub(crate) struct CtxInner {
    pub(crate) ctx: *mut ibv_context,
    /// The device (`ctx`'s `device`): what tells whether two contexts are of one device.
    device: *mut rdma_sys::ibv_device,
    pub(crate) name: String,
    owner: Owner,
    /// librdmacm lists the device, so rdma_cm can listen and connect on this context (it came
    /// from `rdma_get_devices`, or is a sibling of one that did).
    cm: bool,
    /// Outstanding reads/atomics as target, per QP (clamps `max_dest_rd_atomic`).
    pub(crate) max_qp_rd_atom: u8,
    /// Outstanding reads/atomics as initiator, per QP (clamps `max_rd_atomic`).
    pub(crate) max_qp_init_rd_atom: u8,
    /// The `wc_flags` bit that says a receive's message invalidated an rkey (see
    /// [`wc_inv_flag`]).
    pub(crate) wc_inv_flag: u32,
    /// Sets the async fd non-blocking once.
    async_nonblock: Once,
    /// Each port's link layer once looked up: a port's, fixed by its device, is asked at every
    /// connection's RTR, and a query is a system call.
    link_layers: [OnceLock<LinkLayer>; CACHED_PORTS],
}

/// Ports whose link layer a context remembers (1..CACHED_PORTS; others are queried each time).
const CACHED_PORTS: usize = 8;

// SAFETY: libibverbs contexts are thread-safe (every verb may be called from any thread); the
// pointers are only read after construction.
unsafe impl Send for CtxInner {}
// SAFETY: as above.
unsafe impl Sync for CtxInner {}

impl CtxInner {
    /// Whether this context can be used with rdma_cm (librdmacm lists its device).
    pub(crate) fn is_rdma_cm(&self) -> bool {
        self.cm
    }

    /// Whether `other` is of this context's device: the same `ibv_device` (libibverbs keeps
    /// one per device, which every device list and every context of it points to).
    pub(crate) fn same_device(&self, other: &CtxInner) -> bool {
        self.device == other.device
    }

    /// Whether `verbs` (a cm id's context: live, or null while the id is unbound) is of this
    /// context's device.
    pub(crate) fn is_device_of(&self, verbs: *mut ibv_context) -> bool {
        // SAFETY: a live context's device pointer is valid while it is open; null is checked.
        !verbs.is_null() && unsafe { (*verbs).device } == self.device
    }

    /// The link layer of `port` (queried once per port).
    pub(crate) fn link_layer(&self, port: u8) -> Result<LinkLayer> {
        let slot = self.link_layers.get(usize::from(port));
        if let Some(&l) = slot.and_then(OnceLock::get) {
            return Ok(l);
        }
        let l = self.port_attr(port)?.link_layer;
        if let Some(s) = slot {
            let _ = s.set(l); // (another thread may have set the same value first)
        }
        Ok(l)
    }

    pub(crate) fn port_attr(&self, port: u8) -> Result<PortAttr> {
        // SAFETY: ibv_port_attr is plain old data; all-zero is valid.
        let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `a` is a valid out-pointer of the full struct size.
        let ret = unsafe { rdma_sys::___ibv_query_port(self.ctx, port, &mut a) };
        if ret != 0 {
            return Err(Error::QueryPort { device: self.name.clone(), port, source: ret_err(ret) });
        }
        Ok(PortAttr {
            state: port_state_from_ibv(a.state),
            max_mtu: mtu_from_ibv(a.max_mtu),
            active_mtu: mtu_from_ibv(a.active_mtu),
            lid: a.lid,
            gid_tbl_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
            max_msg_sz: a.max_msg_sz,
            link_layer: link_layer_from_ibv(a.link_layer),
        })
    }

    fn device_attr(&self) -> Result<ibv_device_attr> {
        // SAFETY: plain old data; all-zero is valid.
        let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `a` is a valid out-pointer.
        let ret = unsafe { rdma_sys::ibv_query_device(self.ctx, &mut a) };
        if ret != 0 {
            return Err(Error::QueryDevice { device: self.name.clone(), source: ret_err(ret) });
        }
        Ok(a)
    }
}

impl Drop for CtxInner {
    fn drop(&mut self) {
        match self.owner {
            // SAFETY: the list came from rdma_get_devices and is freed once; librdmacm keeps
            // the context itself open for the other users of its list.
            Owner::RdmaCm(list) => unsafe { rdma_sys::rdma_free_devices(list) },
            Owner::Opened => {
                // SAFETY: we opened the context and every child (holding an Arc to us) is gone.
                let ret = unsafe { rdma_sys::ibv_close_device(self.ctx) };
                if ret != 0 {
                    eprintln!("corelink ibverbs: ibv_close_device({}) failed: {ret}", self.name);
                }
            }
        }
    }
}

/// An open RDMA device.
pub struct IbvContext {
    pub(crate) inner: Arc<CtxInner>,
}

impl std::fmt::Debug for IbvContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvContext")
            .field("name", &self.inner.name)
            .field("rdma_cm", &self.inner.is_rdma_cm())
            .field("own", &matches!(self.inner.owner, Owner::Opened))
            .finish()
    }
}

impl IbvContext {
    /// The underlying `ibv_context` (valid while `self` lives).
    pub fn as_raw(&self) -> *mut ibv_context {
        self.inner.ctx
    }

    /// Looks `name` up in librdmacm's device list; `None` if librdmacm has no such device (or
    /// no devices at all, e.g. without `rdma_ucm`).
    pub(crate) fn open_from_rdma_cm(name: &str) -> Result<Option<IbvContext>> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below or by CtxInner's Drop.
        let list = unsafe { rdma_sys::rdma_get_devices(&mut n) };
        if list.is_null() {
            return Ok(None);
        }
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: the list holds `n` valid contexts, then NULL.
            let ctx = unsafe { *list.add(i) };
            if ctx.is_null() {
                break;
            }
            // SAFETY: an open context's device pointer is valid while the context is.
            let dev_name = unsafe { device_name((*ctx).device) };
            if dev_name == name {
                return Self::finish(ctx, name, Owner::RdmaCm(list), true).map(Some);
            }
        }
        // SAFETY: the list came from rdma_get_devices and is not used again.
        unsafe { rdma_sys::rdma_free_devices(list) };
        Ok(None)
    }

    /// Opens `dev` (a valid device of a live device list) with `ibv_open_device`; `cm` says
    /// whether librdmacm lists it.
    pub(crate) fn open_device(
        name: &str,
        dev: *mut rdma_sys::ibv_device,
        cm: bool,
    ) -> Result<IbvContext> {
        // SAFETY: `dev` is a valid device of a live device list (caller).
        let ctx = unsafe { rdma_sys::ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(Error::Open { device: name.to_string(), source: last_err() });
        }
        Self::finish(ctx, name, Owner::Opened, cm)
    }

    /// [`Context::open_sibling`]: `ibv_open_device` on this context's device, found in
    /// `ibv_get_device_list` by its pointer (the list holds the device while it is opened).
    fn sibling(&self) -> Result<IbvContext> {
        let name = &self.inner.name;
        let list = match DeviceList::get()? {
            Listing::Devices(list) => list,
            Listing::Unsupported(e) => return Err(Error::Open { device: name.clone(), source: e }),
        };
        let Some(i) = (0..list.len()).find(|&i| list.raw(i) == self.inner.device) else {
            return Err(Error::NoSuchDevice {
                name: name.clone(),
                available: format!(
                    "the device of this context is no longer in ibv_get_device_list's ({})",
                    (0..list.len()).map(|i| list.name(i)).collect::<Vec<_>>().join(", ")
                ),
            });
        };
        Self::open_device(name, list.raw(i), self.inner.cm)
    }

    fn finish(ctx: *mut ibv_context, name: &str, owner: Owner, cm: bool) -> Result<IbvContext> {
        let mut inner = CtxInner {
            ctx,
            // SAFETY: a freshly opened context; its device pointer is valid while it is open.
            device: unsafe { (*ctx).device },
            name: name.to_string(),
            owner,
            cm,
            max_qp_rd_atom: 0,
            max_qp_init_rd_atom: 0,
            wc_inv_flag: 0,
            async_nonblock: Once::new(),
            link_layers: Default::default(),
        };
        // On error `inner` drops here and releases the context.
        let attr = inner.device_attr()?;
        inner.max_qp_rd_atom = u8::try_from(attr.max_qp_rd_atom.max(0)).unwrap_or(u8::MAX);
        inner.max_qp_init_rd_atom =
            u8::try_from(attr.max_qp_init_rd_atom.max(0)).unwrap_or(u8::MAX);
        inner.wc_inv_flag = wc_inv_flag(attr.vendor_id);
        Ok(IbvContext { inner: Arc::new(inner) })
    }
}

/// The `wc_flags` bit by which a device of vendor `vendor_id` says that a receive's message
/// was a send-with-invalidate: libibverbs' `IBV_WC_WITH_INV` (bit 3), except for the software
/// devices whose kernel driver writes the completion for user space itself, with the kernel's
/// `IB_WC_WITH_INVALIDATE` (bit 2, libibverbs' `IBV_WC_IP_CSUM_OK`): rxe (vendor 0xffffff; seen
/// on rxe0: flags 0x5 and the rkey) and siw (0x626d74). Neither sets a checksum flag.
pub(crate) fn wc_inv_flag(vendor_id: u32) -> u32 {
    const KERNEL_WITH_INVALIDATE: u32 = 1 << 2;
    match vendor_id {
        0x00ff_ffff | 0x0062_6d74 => KERNEL_WITH_INVALIDATE,
        _ => rdma_sys::ibv_wc_flags::IBV_WC_WITH_INV.0,
    }
}

/// `struct ibv_async_event` with the event type as a plain integer: the kernel may report a
/// type newer than the bindings' Rust enum, which must not be read as that enum.
#[repr(C)]
struct RawAsyncEvent {
    element: RawElement,
    event_type: u32,
}

/// `ibv_async_event.element`: the object the event is about, or a port number.
#[repr(C)]
#[derive(Clone, Copy)]
union RawElement {
    ptr: *mut libc::c_void,
    port_num: libc::c_int,
}

const _: () = assert!(
    std::mem::size_of::<RawAsyncEvent>() == std::mem::size_of::<rdma_sys::ibv_async_event>()
);

impl Context<Ibverbs> for IbvContext {
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// `ibv_open_device` on this context's device: a context with its own doorbell pages and
    /// async events, usable with rdma_cm where this one is (its QPs are connected and accepted
    /// by any context of the device).
    fn open_sibling(&self) -> Result<IbvContext> {
        self.sibling()
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        let a = self.inner.device_attr()?;
        // SAFETY: fw_ver is a NUL-terminated char array (the kernel fills it); it is 64 bytes
        // and we read through a bounded CStr search.
        let fw_bytes: &[u8] =
            unsafe { std::slice::from_raw_parts(a.fw_ver.as_ptr().cast(), a.fw_ver.len()) };
        let fw_ver = CStr::from_bytes_until_nul(fw_bytes)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_else(|_| String::from_utf8_lossy(fw_bytes).into_owned());
        let u = |v: libc::c_int| u32::try_from(v).unwrap_or(0);
        Ok(DeviceAttr {
            fw_ver,
            node_guid: u64::from_be(a.node_guid),
            max_mr_size: a.max_mr_size,
            max_qp: u(a.max_qp),
            max_qp_wr: u(a.max_qp_wr),
            max_sge: u(a.max_sge),
            max_cqe: u(a.max_cqe),
            max_mr: u(a.max_mr),
            max_mw: u(a.max_mw),
            max_qp_rd_atom: u(a.max_qp_rd_atom),
            max_qp_init_rd_atom: u(a.max_qp_init_rd_atom),
            max_srq: u(a.max_srq),
            max_srq_wr: u(a.max_srq_wr),
            phys_port_cnt: a.phys_port_cnt,
            atomics: a.atomic_cap != rdma_sys::ibv_atomic_cap::IBV_ATOMIC_NONE,
        })
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.inner.port_attr(port)
    }

    fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        let idx = libc::c_int::try_from(index).map_err(|_| Error::QueryGid {
            port,
            index,
            source: super::convert::errno_err(libc::EINVAL),
        })?;
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: the context is open; `gid` is a valid out-pointer.
        let ret = unsafe { rdma_sys::ibv_query_gid(self.inner.ctx, port, idx, &mut gid) };
        if ret != 0 {
            return Err(Error::QueryGid { port, index, source: ret_err(ret) });
        }
        // SAFETY: both union members are plain bytes of the same size.
        Ok(Gid(unsafe { gid.raw }))
    }

    fn alloc_pd(&self) -> Result<IbvPd> {
        IbvPd::alloc(&self.inner)
    }

    fn create_cq(&self, depth: u32) -> Result<IbvCq> {
        IbvCq::create(&self.inner, depth)
    }

    /// Never blocks: the context's async fd is made non-blocking on first use, and `EAGAIN`
    /// means no event. Each event is acknowledged before it is returned. CQs and SRQs are named
    /// by their handles ([`crate::Cq::handle`], [`crate::Srq::handle`]: the object's address).
    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        let ctx = self.inner.ctx;
        let mut nb_err = None;
        self.inner.async_nonblock.call_once(|| {
            // SAFETY: the context is open, so async_fd is a valid descriptor.
            let fd = unsafe { (*ctx).async_fd };
            // SAFETY: fcntl on a valid descriptor with integer arguments.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
            // SAFETY: as above.
            if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0
            {
                nb_err = Some(last_err());
            }
        });
        if let Some(e) = nb_err {
            return Err(Error::AsyncEvent(e));
        }
        let mut ev =
            RawAsyncEvent { element: RawElement { ptr: std::ptr::null_mut() }, event_type: 0 };
        // SAFETY: RawAsyncEvent has ibv_async_event's layout (checked above); the fd is
        // non-blocking so this returns at once.
        let ret =
            unsafe { rdma_sys::ibv_get_async_event(ctx, (&mut ev as *mut RawAsyncEvent).cast()) };
        if ret != 0 {
            let e = last_err();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) => Ok(None),
                _ => Err(Error::AsyncEvent(e)),
            };
        }
        // SAFETY: reading the pointer member is defined whatever was written (it was
        // initialised null in full); it is only used as a pointer for object events.
        let ptr = unsafe { ev.element.ptr };
        let element = match async_element_kind(ev.event_type) {
            AsyncElementKind::Cq => AsyncElement::Cq(ptr as u64),
            AsyncElementKind::Srq => AsyncElement::Srq(ptr as u64),
            AsyncElementKind::Qp => {
                let qp = ptr.cast::<rdma_sys::ibv_qp>();
                // SAFETY: for QP events the element is the QP, alive until the event is acked.
                AsyncElement::Qp(if qp.is_null() { 0 } else { unsafe { (*qp).qp_num } })
            }
            AsyncElementKind::Port => {
                // SAFETY: for port events the union holds the port number (an int).
                let port = unsafe { ev.element.port_num };
                AsyncElement::Port(u8::try_from(port).unwrap_or(0))
            }
            AsyncElementKind::Device => AsyncElement::Device,
        };
        let kind = async_kind_from_ibv(ev.event_type);
        // SAFETY: the event was returned by ibv_get_async_event and is acked exactly once.
        unsafe { rdma_sys::ibv_ack_async_event((&mut ev as *mut RawAsyncEvent).cast()) };
        Ok(Some(AsyncEvent { kind, element }))
    }

    fn listen(&self, addr: SocketAddr) -> Result<IbvListener> {
        cm::listen(&self.inner, addr)
    }

    fn connect_start(
        &self,
        addr: SocketAddr,
        qp: &mut IbvQp,
        attr: &QpAttr,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<cm::IbvConnecting> {
        cm::connect_start(&self.inner, addr, qp, attr, private_data, timeout)
    }
}
