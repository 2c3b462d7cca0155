//! The `ibverbs` device the tests run against, from the environment `tests/rxe-guest/run` sets:
//! `CORELINK_IBV_DEVICE` (e.g. Soft-RoCE's `rxe0`), `CORELINK_IBV_PORT` (default 1),
//! `CORELINK_IBV_GID_INDEX` (default 0) and `CORELINK_IP` (the device's address, to listen on).

use std::net::IpAddr;

/// The core map's provider lines (provider, device, port, GID index) and the device's IP
/// address; `None`, after printing `skipped: CORELINK_IBV_DEVICE not set`, without a device.
pub fn target() -> Option<(String, IpAddr)> {
    let device = std::env::var("CORELINK_IBV_DEVICE").ok().filter(|d| !d.is_empty());
    let Some(device) = device else {
        println!("skipped: CORELINK_IBV_DEVICE not set");
        return None;
    };
    let var = |name: &str, default: &str| {
        std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_owned())
    };
    let port: u8 = var("CORELINK_IBV_PORT", "1").parse().expect("CORELINK_IBV_PORT");
    let gid: u32 = var("CORELINK_IBV_GID_INDEX", "0").parse().expect("CORELINK_IBV_GID_INDEX");
    let ip: IpAddr = std::env::var("CORELINK_IP")
        .expect("CORELINK_IP: the device's IP address, to listen on")
        .parse()
        .expect("CORELINK_IP");
    let provider =
        format!("provider = \"ibverbs\"\ndevice = \"{device}\"\nport = {port}\ngid_index = {gid}");
    Some((provider, ip))
}
