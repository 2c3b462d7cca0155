//! The `ibverbs` provider: real RDMA devices through libibverbs and librdmacm (`rdma-sys`).
//!
//! Layout: [`Ibverbs`] (this file) lists and opens devices; `context` holds the open device,
//! `pd` protection domains, memory regions and windows and address handles, `cq` completion
//! queues (creation and polling), `srq` shared receive queues, `qp` queue-pair creation and
//! state changes, `post` the data path (`post_send`, `post_recv`, SRQ `post_recv`), `cm` the
//! connection manager and `convert` the value conversions.
//!
//! Every object is a handle over an `Arc` of its inner state, and each inner state holds its
//! parent's `Arc` (a PD its context, an MR its PD, a QP its PD, CQs and SRQ), so parents are
//! destroyed after their children whatever order the program drops them in. Raw pointers leave
//! this module only through each object's `as_raw()`.
//!
//! Contexts are taken from librdmacm's device list (`rdma_get_devices`) when it has the device,
//! so that connection-manager ids on that device share the context and QPs created here with
//! plain `ibv_create_qp` can be connected through rdma_cm. A sibling
//! ([`crate::Context::open_sibling`]) is opened with `ibv_open_device` on the same device, so
//! that it has doorbell pages of its own; rdma_cm drives any QP of the device (it only needs the
//! QP number, and the attributes `rdma_init_qp_attr` gives are the device's), so the connection
//! manager compares devices (`ibv_context.device`), never contexts.

mod cm;
mod context;
mod convert;
mod cq;
mod pd;
mod post;
mod qp;
mod srq;

use std::ffi::CStr;
use std::io;

pub use cm::{
    IbvAccepting, IbvCmWaiter, IbvConnRequest, IbvConnecting, IbvConnection, IbvListener,
};
pub use context::IbvContext;
pub use cq::IbvCq;
pub use pd::{IbvAh, IbvMr, IbvMw, IbvPd};
pub use qp::IbvQp;
pub use srq::IbvSrq;

use crate::error::{Error, Result};
use crate::provider::Provider;
use crate::types::DeviceInfo;
use convert::{err_text, last_err};

/// The provider name, as [`Provider::NAME`] and in [`Error::Unsupported`].
pub(crate) const NAME: &str = "ibverbs";

/// The `ibverbs` provider.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ibverbs;

impl Provider for Ibverbs {
    type Context = IbvContext;
    type Pd = IbvPd;
    type Mr = IbvMr;
    type Mw = IbvMw;
    type Cq = IbvCq;
    type Srq = IbvSrq;
    type Qp = IbvQp;
    type Ah = IbvAh;
    type Listener = IbvListener;
    type ConnRequest = IbvConnRequest;
    type Accepting = IbvAccepting;
    type Connecting = IbvConnecting;
    type Connection = IbvConnection;
    type CmWaiter = IbvCmWaiter;

    const NAME: &'static str = NAME;

    /// The devices libibverbs sees. On a host without RDMA support (no `ib_uverbs`, where
    /// `ibv_get_device_list` fails with `ENOSYS`) the list is empty.
    fn devices() -> Result<Vec<DeviceInfo>> {
        match DeviceList::get()? {
            Listing::Unsupported(_) => Ok(Vec::new()),
            Listing::Devices(list) => Ok(list.infos()),
        }
    }

    fn cm_waiter() -> Result<IbvCmWaiter> {
        IbvCmWaiter::new()
    }

    /// Opens `name`, through librdmacm's device list when it has it (so rdma_cm can be used on
    /// the context), else with `ibv_open_device`.
    fn open(name: &str) -> Result<IbvContext> {
        if let Some(ctx) = context::IbvContext::open_from_rdma_cm(name)? {
            return Ok(ctx);
        }
        match DeviceList::get()? {
            Listing::Unsupported(e) => Err(Error::NoSuchDevice {
                name: name.to_string(),
                available: format!(
                    "none: this host has no RDMA support (ibv_get_device_list: {})",
                    err_text(&e)
                ),
            }),
            Listing::Devices(list) => {
                for i in 0..list.len() {
                    if list.name(i) == name {
                        return IbvContext::open_device(name, list.raw(i), false);
                    }
                }
                let names: Vec<String> = (0..list.len()).map(|i| list.name(i)).collect();
                Err(Error::NoSuchDevice {
                    name: name.to_string(),
                    available: if names.is_empty() { "none".to_string() } else { names.join(", ") },
                })
            }
        }
    }
}

/// What `ibv_get_device_list` gave.
enum Listing {
    /// The host has no RDMA support; the error says why.
    Unsupported(io::Error),
    /// The list (possibly empty).
    Devices(DeviceList),
}

/// An `ibv_get_device_list` result, freed on drop.
struct DeviceList {
    list: *mut *mut rdma_sys::ibv_device,
    len: usize,
}

impl DeviceList {
    /// Lists the devices. `ENOSYS` (no uverbs in the kernel), `ENODEV` and `ENOENT` mean the host
    /// has no RDMA support, reported as [`Listing::Unsupported`]; other failures are errors.
    fn get() -> Result<Listing> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed in Drop.
        let list = unsafe { rdma_sys::ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = last_err();
            return match e.raw_os_error() {
                Some(libc::ENOSYS | libc::ENODEV | libc::ENOENT) | Some(0) | None => {
                    Ok(Listing::Unsupported(e))
                }
                _ => Err(Error::DeviceList(e)),
            };
        }
        Ok(Listing::Devices(DeviceList { list, len: usize::try_from(n).unwrap_or(0) }))
    }

    fn len(&self) -> usize {
        self.len
    }

    /// The device at `i < len()`.
    fn raw(&self, i: usize) -> *mut rdma_sys::ibv_device {
        assert!(i < self.len);
        // SAFETY: the list has `len` valid entries (then a NULL), and `i < len`.
        unsafe { *self.list.add(i) }
    }

    /// The name of the device at `i < len()`.
    fn name(&self, i: usize) -> String {
        // SAFETY: the device pointer is valid while the list lives.
        unsafe { device_name(self.raw(i)) }
    }

    fn infos(&self) -> Vec<DeviceInfo> {
        (0..self.len)
            .map(|i| DeviceInfo {
                name: self.name(i),
                // SAFETY: the device pointer is valid while the list lives.
                guid: u64::from_be(unsafe { rdma_sys::ibv_get_device_guid(self.raw(i)) }),
            })
            .collect()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `list` came from ibv_get_device_list and is freed once.
        unsafe { rdma_sys::ibv_free_device_list(self.list) };
    }
}

/// The name of a device.
///
/// # Safety
/// `dev` must be a valid `ibv_device` (or null).
unsafe fn device_name(dev: *mut rdma_sys::ibv_device) -> String {
    if dev.is_null() {
        return String::new();
    }
    // SAFETY: `dev` is valid (caller); the name is a NUL-terminated string inside it.
    let p = unsafe { rdma_sys::ibv_get_device_name(dev) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null, NUL-terminated, lives as long as the device.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The `Unsupported` error of this provider.
pub(crate) fn unsupported(what: &'static str) -> Error {
    Error::Unsupported { what, provider: NAME }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a host without RDMA support the list is empty, and opening says why.
    #[test]
    fn devices_and_open_without_rdma() {
        let devs = Ibverbs::devices().expect("devices() must not fail on a host without RDMA");
        if !devs.is_empty() {
            return; // a host with devices: nothing to check here
        }
        match Ibverbs::open("rxe0") {
            Err(Error::NoSuchDevice { name, available }) => {
                assert_eq!(name, "rxe0");
                assert!(available.starts_with("none"), "{available}");
            }
            other => panic!("expected NoSuchDevice, got {other:?}"),
        }
    }

    #[test]
    fn provider_name() {
        assert_eq!(<Ibverbs as Provider>::NAME, "ibverbs");
    }

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn objects_are_send_and_sync() {
        assert_send_sync::<IbvContext>();
        assert_send_sync::<IbvPd>();
        assert_send_sync::<IbvMr>();
        assert_send_sync::<IbvMw>();
        assert_send_sync::<IbvCq>();
        assert_send_sync::<IbvSrq>();
        assert_send_sync::<IbvAh>();
        assert_send::<IbvQp>();
        assert_send::<IbvListener>();
        assert_send::<IbvConnRequest>();
        assert_send::<IbvConnection>();
    }
}
