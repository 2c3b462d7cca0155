//! What a verbs run prints: its header block (perftest's, with what verbs adds: device, port,
//! GID and MTU, queue pairs, receives) and each size's [`Report`], with the engine runner's keys.

use std::net::SocketAddr;

use super::bw::Measured;
use crate::perf::opts::{PerfOpts, Role, Test, Verb};
use crate::perf::{Latency, Report};

/// What the header block says about a verbs run.
#[derive(Debug, Clone)]
pub struct VerbsInfo {
    /// `soft` or `ibverbs`.
    pub provider: &'static str,
    /// The device a side opened, its port, GID index, GID and MTU.
    pub device: String,
    /// Port.
    pub port: u8,
    /// GID index.
    pub gid_index: u32,
    /// GID.
    pub gid: String,
    /// The port's active MTU in bytes.
    pub mtu: u32,
    /// The sizes measured (UD's limited to the MTU).
    pub sizes: Vec<usize>,
    /// The client's and the server's cores (`None`: not pinned, or not in this process).
    pub cores: (Option<usize>, Option<usize>),
    /// The server's socket address (a server's own, a client's target).
    pub addr: Option<SocketAddr>,
    /// Notes for the header (on top of the option checks' notes).
    pub notes: Vec<String>,
}

/// One size's report, with the engine runner's keys (`workers`: 1).
pub fn report(o: &PerfOpts, provider: &str, bytes: usize, m: Measured) -> Report {
    let mut rep = Report {
        test: o.report_name(),
        transport: Some(o.transport.name().into()),
        provider: Some(provider.into()),
        workers: Some(1),
        bytes,
        iterations: m.iterations,
        ..Report::default()
    };
    if o.test.is_lat() {
        let mut samples = m.samples;
        rep.lat = Latency::from_ns(&mut samples, o.test.lat_divisor());
    } else {
        let rate = m.iterations as f64 / m.elapsed.as_secs_f64().max(1e-9);
        rep.bw_avg_mbps = Some(rate * bytes as f64 / 1e6);
        rep.bw_peak_mbps = Some(m.peak_rate.max(rate) * bytes as f64 / 1e6);
        rep.msg_rate_mpps = Some(rate / 1e6);
    }
    rep
}

/// perftest's header block for a verbs run.
pub fn header_block(o: &PerfOpts, info: &VerbsInfo, notes: &[String]) -> String {
    let line = "-".repeat(87);
    let core = |c: Option<usize>| c.map_or("unpinned".to_string(), |c| format!("core {c}"));
    let addr = info.addr.map_or("-".into(), |a| a.to_string());
    let mode = match o.role {
        Role::Loopback => format!(
            "loopback: server and client threads in this process (client {}, server {}), \
             endpoints exchanged over {addr}",
            core(info.cores.0),
            core(info.cores.1)
        ),
        Role::Server => format!(
            "server ({}), listening on {addr}; serves one client until it is done",
            core(info.cores.1)
        ),
        Role::Client(a) => format!("client ({}) of {a}", core(info.cores.0)),
    };
    let depth = match o.test.is_lat() {
        true => "1 (latency test)".to_string(),
        false => {
            format!("{} per QP, post list {}, CQ moderation {}", o.tx_depth, o.post_list, o.cq_mod)
        }
    };
    let recv = match (o.test.verb(), o.use_srq) {
        (Verb::Send, true) => "one SRQ per side",
        (Verb::Send, false) => "per QP",
        (_, true) => "none (SRQ attached, unused)",
        (_, false) => "none",
    };
    let mut s = format!(
        "{line}\n{:^87}\n Provider        : {:<14} Device : {} port {} GID index {} ({})\n \
         Transport type  : {:<14} QPs    : {} (verbs, connected by hand), MTU {} B\n \
         Mode            : {mode}\n \
         TX depth        : {depth}\n \
         Receives        : {recv}\n \
         Max inline      : {} B\n \
         {}\n \
         Sizes           : {}\n",
        match o.test {
            _ if o.raw && o.test == Test::WriteBw => {
                "RDMA_Write BW baseline (raw_write: a verbs loop, no engine)"
            }
            // Polled in memory here, as perftest's (the engine's uses write-with-immediate).
            Test::WriteLat => "RDMA_Write Latency Test",
            t => t.title(),
        },
        info.provider,
        info.device,
        info.port,
        info.gid_index,
        info.gid,
        o.transport.name(),
        o.qps,
        info.mtu,
        o.inline.unwrap_or(0),
        match o.duration {
            Some(d) => format!("Duration        : {} s per size", d.as_secs()),
            None => format!("Iterations      : {} per size", o.iters),
        },
        match info.sizes.as_slice() {
            [one] => one.to_string(),
            [first, .., last] => format!("{first} .. {last} ({} sizes)", info.sizes.len()),
            [] => "-".into(),
        },
    );
    if o.test.is_lat() {
        let how = match o.test.lat_divisor() {
            d if d > 1.0 => "one-way (half the round trip)",
            _ => "full round trip",
        };
        s.push_str(&format!(" Latency         : {how}\n"));
    }
    for n in notes.iter().chain(&info.notes) {
        s.push_str(&format!(" Note            : {n}\n"));
    }
    s.push_str(&line);
    s
}
