//! The two sides of a verbs run, each on its own (pinned) thread: the server accepts one client
//! on its TCP socket, checks that it runs the same test, exchanges endpoints, connects its
//! queue pairs and serves each size the client starts; the client connects, exchanges
//! endpoints, and measures each size, sending what it measured to the main thread.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use corelink_verbs::{Gid, Provider};

use super::bw::{self, Measured};
use super::guard::Guard;
use super::lat;
use super::plan::Plan;
use super::setup::{Dev, DevCfg, Side};
use super::wire::{self, Ctl, Info};
use crate::perf::opts::{Test, Verb};

/// How long the client waits for the server's answer to a control message.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// What a side's thread tells the main thread.
#[derive(Debug)]
pub enum Event {
    /// The side opened its device (and, for a server, listens).
    Started(Started),
    /// The client measured size `index`; the server saw `received` messages of it.
    Size { index: usize, bytes: usize, m: Measured, received: u64 },
    /// The client finished.
    ClientDone(Result<(), String>),
    /// The server finished.
    ServerDone(Result<(), String>),
}

/// The device a side opened.
#[derive(Debug, Clone)]
pub struct Started {
    /// Device name.
    pub device: String,
    /// Port.
    pub port: u8,
    /// GID index.
    pub gid_index: u32,
    /// GID.
    pub gid: Gid,
    /// The port's active MTU in bytes.
    pub mtu: u32,
}

fn started<P: Provider>(cfg: &DevCfg, d: &Dev<P>) -> Started {
    Started {
        device: cfg.name.clone(),
        port: d.port,
        gid_index: d.gid_index,
        gid: d.gid,
        mtu: d.mtu.bytes(),
    }
}

/// Pins the calling thread to `core`, if one was chosen.
pub fn pin(core: Option<usize>) {
    if let Some(id) = core {
        if !core_affinity::set_for_current(core_affinity::CoreId { id }) {
            eprintln!("corelink-perf: warning: could not pin a thread to core {id}");
        }
    }
}

/// Why the server refuses a client, if it does.
fn refusal(plan: &Plan, peer: &Info) -> Option<String> {
    let t = plan.test;
    if peer.test != t.code() {
        let c = Test::from_code(peer.test).map_or("an unknown test", Test::name);
        return Some(format!("the client runs {c}, this server {}", t.name()));
    }
    if peer.transport != plan.transport as u8 || peer.srq != plan.use_srq {
        return Some(format!(
            "the client's -c or --use-srq differs from this server's (-c {}{})",
            plan.transport.name(),
            if plan.use_srq { " --use-srq" } else { "" }
        ));
    }
    if peer.qps.len() != plan.qps {
        return Some(format!("the client has -q {}, this server -q {}", peer.qps.len(), plan.qps));
    }
    if peer.max_size > plan.max_size() as u64 {
        return Some(format!(
            "the client sends up to {} B, this server was started for {} B (give both the \
             same -s / -a)",
            peer.max_size,
            plan.max_size()
        ));
    }
    None
}

/// The server's thread: serves one client on `listener`, then returns.
pub fn server<P: Provider>(
    listener: TcpListener,
    plan: &Plan,
    cfg: &DevCfg,
    tx: &Sender<Event>,
    announce: bool,
    g: &Guard,
) -> Result<(), String> {
    let dev = Dev::<P>::open(cfg)?;
    let info = started(cfg, &dev);
    let mut side = Side::new(dev, plan, plan.test.verb() == Verb::Send)?;
    if announce {
        let _ = tx.send(Event::Started(info));
    }
    let (mut sock, from) = listener.accept().map_err(|e| format!("accepting a client: {e}"))?;
    drop(listener);
    let _ = sock.set_nodelay(true);
    wire::keep_alive(&sock)?;
    let peer = wire::recv_info(&mut sock).map_err(|e| format!("client {from}: {e}"))?;
    if let Some(why) = refusal(plan, &peer) {
        let _ = wire::send_answer(&mut sock, Err(&why));
        return Err(why);
    }
    wire::send_answer(&mut sock, Ok(&side.info(plan)))?;
    side.connect(&peer)?;
    loop {
        let size = match wire::recv_ctl(&mut sock)? {
            Ctl::Start(s) if s > 0 && s <= plan.max_size() as u64 => s as usize,
            Ctl::Start(s) => return Err(format!("the client started {s} B messages")),
            Ctl::Bye => return Ok(()),
            c => return Err(format!("an unexpected {c:?} from the client")),
        };
        if plan.test == Test::WriteLat {
            lat::clear_watch(&side.dst, size)?;
        }
        wire::send_ctl(&mut sock, Ctl::Ready)?;
        let got = match plan.test {
            Test::SendBw => bw::receive(&mut side, &mut sock, g)?,
            Test::SendLat | Test::WriteLat => {
                lat::answer(&mut side, &mut sock, &peer, plan, size, g)?
            }
            _ => match wire::recv_ctl(&mut sock)? {
                Ctl::End(_) => 0,
                c => return Err(format!("an unexpected {c:?} from the client")),
            },
        };
        wire::send_ctl(&mut sock, Ctl::Stats(got))?;
    }
}

/// Connects to the server, retrying for a few seconds while nothing listens yet.
fn connect(addr: SocketAddr, g: &Guard) -> Result<TcpStream, String> {
    let since = Instant::now();
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(s) => return Ok(s),
            Err(e) if since.elapsed() < Duration::from_secs(5) => {
                g.check(since, "the server").map_err(|_| format!("connecting to {addr}: {e}"))?;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(format!("connecting to {addr}: {e}")),
        }
    }
}

fn expect(sock: &mut TcpStream, what: &str) -> Result<Ctl, String> {
    wire::recv_ctl(sock).map_err(|e| format!("waiting for the server's {what}: {e}"))
}

/// The client's thread: measures every size against the server at `addr`.
pub fn client<P: Provider>(
    addr: SocketAddr,
    plan: &Plan,
    cfg: &DevCfg,
    tx: &Sender<Event>,
    g: &Guard,
) -> Result<(), String> {
    let dev = Dev::<P>::open(cfg)?;
    let _ = tx.send(Event::Started(started(cfg, &dev)));
    let mut side = Side::new(dev, plan, plan.test == Test::SendLat)?;
    let mut sock = connect(addr, g)?;
    let _ = sock.set_nodelay(true);
    wire::keep_alive(&sock)?;
    sock.set_read_timeout(Some(ANSWER_WITHIN)).map_err(|e| format!("the socket: {e}"))?;
    wire::send_info(&mut sock, &side.info(plan))?;
    let peer = wire::recv_answer(&mut sock)?;
    side.connect(&peer)?;
    for (index, &size) in plan.sizes.iter().enumerate() {
        if plan.test == Test::WriteLat {
            lat::clear_watch(&side.dst, size)?;
        }
        wire::send_ctl(&mut sock, Ctl::Start(size as u64))?;
        match expect(&mut sock, "ready")? {
            Ctl::Ready => {}
            c => return Err(format!("the server answered {c:?} to a start")),
        }
        let m = match plan.test.is_lat() {
            true => lat::client(&mut side, &peer, plan, size, g)?,
            false => bw::client(&mut side, &peer, plan, size, g)?,
        };
        wire::send_ctl(&mut sock, Ctl::End(m.iterations))?;
        let received = match expect(&mut sock, "count")? {
            Ctl::Stats(n) => n,
            c => return Err(format!("the server answered {c:?} to an end")),
        };
        let _ = tx.send(Event::Size { index, bytes: size, m, received });
    }
    wire::send_ctl(&mut sock, Ctl::Bye)
}
