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

/// The two ends of the runner's second wire (`tests/rxe-guest/run --wire`: `CORELINK_WIRE=1`,
/// `CORELINK_WIRE_{A,B}_DEVICE`, `_GID_INDEX` and `_IP`), each as core-map provider lines and
/// its address; `None`, after printing why, without it.
#[allow(dead_code)]
pub fn wire() -> Option<[(String, IpAddr); 2]> {
    if std::env::var("CORELINK_WIRE").ok().as_deref() != Some("1") {
        println!("skipped: no second wire (CORELINK_WIRE=1, tests/rxe-guest/run --wire)");
        return None;
    }
    let end = |e: &str| {
        let var = |k: &str| {
            std::env::var(format!("CORELINK_WIRE_{e}_{k}"))
                .unwrap_or_else(|_| panic!("CORELINK_WIRE_{e}_{k}"))
        };
        let ip: IpAddr = var("IP").parse().expect("the wire end's IP address");
        let provider = format!(
            "provider = \"ibverbs\"\ndevice = \"{}\"\nport = 1\ngid_index = {}",
            var("DEVICE"),
            var("GID_INDEX")
        );
        (provider, ip)
    };
    Some([end("A"), end("B")])
}
