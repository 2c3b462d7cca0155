//! A server and a client connected by the connection manager, exchanging every primitive.
//!
//! ```text
//! cm_pair server ADDR [--provider ibverbs] [--device DEV]    # listens, accepts one client
//! cm_pair client ADDR [--provider ibverbs] [--device DEV]    # connects, runs every primitive
//! cm_pair both ADDR                                          # both, as two threads (soft)
//! ```
//!
//! The server exposes a region (its address, length and rkey travel in the accept's private
//! data) and posts receives. The client sends, sends with an immediate, writes, writes with an
//! immediate, reads, fetch-and-adds and compare-and-swaps, then sends "bye" and disconnects. The
//! server checks its memory after "bye" and waits for the disconnect event. Each side prints
//! what it saw and exits non-zero on anything unexpected. With `soft`, whose connection manager is
//! in-process, use `both`; with `ibverbs`, run the two sides as two processes
//! (`tests/rxe-guest/cm-pair.sh` does, in the Soft-RoCE guest).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use corelink_verbs::{
    AccessFlags, CmEvent, ConnRequest, Connection, Context, Cq, Listener, Mr, Pd, Provider, Qp,
    QpAttr, QpCap, QpInitAttr, QpType, RecvWr, RemoteRegion, SendOp, SendWr, Wc, WcOpcode,
    WcStatus,
};

type Res<T> = Result<T, String>;
const TIMEOUT: Duration = Duration::from_secs(10);
const REGION: usize = 4096;
/// Offsets in the server's region: the fetch-and-add word, the compare-and-swap word, where the
/// client writes, where it writes with an immediate, and what it reads.
const FAA_WORD: usize = 0;
const CAS_WORD: usize = 8;
const WRITE_AT: usize = 64;
const WRITE_IMM_AT: usize = 512;
const READ_AT: usize = 1024;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

fn check<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> Res<T> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// Device, PD, CQ, an RC QP in RESET and a region.
struct End<P: Provider> {
    ctx: P::Context,
    mr: P::Mr,
    cq: P::Cq,
    qp: P::Qp,
    _pd: P::Pd,
}

impl<P: Provider> End<P> {
    fn new(device: &str, access: AccessFlags) -> Res<Self> {
        let ctx = check(P::open(device), "open")?;
        let pd = check(ctx.alloc_pd(), "alloc_pd")?;
        let cq = check(ctx.create_cq(64), "create_cq")?;
        let mr = check(pd.register(REGION, access), "register")?;
        let attr = QpInitAttr::<P> {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: true,
        };
        let qp = check(pd.create_qp(&attr), "create_qp")?;
        Ok(End { ctx, mr, cq, qp, _pd: pd })
    }

    fn wait(&self, what: &str) -> Res<Wc> {
        let deadline = Instant::now() + TIMEOUT;
        let mut wc = [Wc::default()];
        loop {
            if check(self.cq.poll(&mut wc), "poll")? == 1 {
                let w = wc[0];
                if w.status != WcStatus::Success {
                    return Err(format!("{what}: {} (wr {})", w.status, w.wr_id));
                }
                return Ok(w);
            }
            if Instant::now() > deadline {
                return Err(format!("{what}: no completion after {TIMEOUT:?}"));
            }
            std::thread::yield_now();
        }
    }
}

fn server<P: Provider>(device: &str, addr: SocketAddr) -> Res<()> {
    let mut e = End::<P>::new(device, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ALL)?;
    e.mr.write_at(READ_AT, &pattern(3, 256)).map_err(|x| x.to_string())?;
    check(e.mr.write_u64(FAA_WORD, 100), "write_u64")?;
    check(e.mr.write_u64(CAS_WORD, 5), "write_u64")?;
    let mut listener = check(e.ctx.listen(addr), "listen")?;
    println!("server: listening on {}", listener.local_addr());
    let req = check(listener.get_request(Duration::from_secs(60)), "get_request")?
        .ok_or("no connection request within 60 s")?;
    println!(
        "server: request from {} with {:?}",
        req.peer_addr(),
        String::from_utf8_lossy(trim(req.private_data()))
    );
    // Four receives ("hello", the send with immediate, the write with immediate, "bye"), posted
    // in INIT, before the accept lets the client send.
    check(
        e.qp.modify(&QpAttr { state: corelink_verbs::QpState::Init, ..QpAttr::default() }),
        "modify to INIT",
    )?;
    let sgl: Vec<_> = (0..4)
        .map(|i| e.mr.sge(2048 + i * 256, 256))
        .collect::<Result<_, _>>()
        .map_err(|x| x.to_string())?;
    for (i, s) in sgl.iter().enumerate() {
        let wr = [RecvWr { wr_id: 100 + i as u64, sgl: std::slice::from_ref(s) }];
        // SAFETY: the region outlives the QP's receives (both live to the end of this function).
        check(unsafe { e.qp.post_recv(&wr) }, "post_recv")?;
    }
    let mut conn =
        check(req.accept(&mut e.qp, &QpAttr::default(), &e.mr.region().to_bytes()), "accept")?;
    println!("server: established, region of {REGION} bytes sent in private data");
    let mut seen = Vec::new();
    for _ in 0..4 {
        let wc = e.wait("receive")?;
        let off = 2048 + (wc.wr_id - 100) as usize * 256;
        let mut data =
            vec![0; if wc.opcode == WcOpcode::Recv { wc.byte_len.min(256) as usize } else { 0 }];
        e.mr.read_at(off, &mut data).map_err(|x| x.to_string())?;
        println!(
            "server: {} {} bytes imm={:?} {:?}",
            wc.opcode,
            wc.byte_len,
            wc.imm,
            String::from_utf8_lossy(&data)
        );
        seen.push((wc.opcode, wc.imm));
    }
    let want = [
        (WcOpcode::Recv, None),
        (WcOpcode::Recv, Some(0xc0ffee)),
        (WcOpcode::RecvRdmaWithImm, Some(0xbeef)),
        (WcOpcode::Recv, None),
    ];
    if seen != want {
        return Err(format!("server: saw {seen:?}, expected {want:?}"));
    }
    let mut w = vec![0; 256];
    e.mr.read_at(WRITE_AT, &mut w).map_err(|x| x.to_string())?;
    let words = (check(e.mr.read_u64(FAA_WORD), "read")?, check(e.mr.read_u64(CAS_WORD), "read")?);
    if w != pattern(9, 256) || words != (105, 9) {
        return Err(format!(
            "server: memory after the client's one-sided operations is wrong: words {words:?}"
        ));
    }
    println!("server: written bytes and atomic words (105, 9) are right");
    loop {
        match check(conn.poll_event(TIMEOUT), "poll_event")? {
            Some(CmEvent::Disconnected) => break,
            Some(ev) => println!("server: event {ev:?}"),
            None => return Err("server: no disconnect within the timeout".into()),
        }
    }
    println!("server: client disconnected; done");
    Ok(())
}

fn trim(b: &[u8]) -> &[u8] {
    let end = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    &b[..end]
}

fn client<P: Provider>(device: &str, addr: SocketAddr) -> Res<()> {
    let mut e = End::<P>::new(device, AccessFlags::LOCAL_WRITE)?;
    let mut conn = check(
        e.ctx.connect(addr, &mut e.qp, &QpAttr::default(), b"cm_pair client", TIMEOUT),
        "connect",
    )?;
    let peer = RemoteRegion::from_bytes(conn.peer_private_data())
        .ok_or("no region in the server's private data")?;
    println!("client: connected; server region of {} bytes", peer.len);
    e.mr.write_at(0, b"hello").map_err(|x| x.to_string())?;
    e.mr.write_at(256, &pattern(9, 256)).map_err(|x| x.to_string())?;
    e.mr.write_at(768, b"bye").map_err(|x| x.to_string())?;
    let s = |off: usize, len: u32| e.mr.sge(off, len).map_err(|x| x.to_string());
    let (hello, blk, small, into, word, bye) =
        (s(0, 5)?, s(256, 256)?, s(256, 16)?, s(512, 256)?, s(1024, 8)?, s(768, 3)?);
    let steps: [(&str, SendOp<'_, P>, &[_]); 8] = [
        ("send", SendOp::Send, std::slice::from_ref(&hello)),
        ("send_with_imm", SendOp::SendWithImm(0xc0ffee), std::slice::from_ref(&hello)),
        ("write", SendOp::Write(peer.at(WRITE_AT as u64)), std::slice::from_ref(&blk)),
        (
            "write_with_imm",
            SendOp::WriteWithImm(peer.at(WRITE_IMM_AT as u64), 0xbeef),
            std::slice::from_ref(&small),
        ),
        ("read", SendOp::Read(peer.at(READ_AT as u64)), std::slice::from_ref(&into)),
        (
            "fetch_add",
            SendOp::FetchAdd { remote: peer.at(FAA_WORD as u64), add: 5 },
            std::slice::from_ref(&word),
        ),
        (
            "cmp_swap",
            SendOp::CompareSwap { remote: peer.at(CAS_WORD as u64), compare: 5, swap: 9 },
            std::slice::from_ref(&word),
        ),
        ("send bye", SendOp::Send, std::slice::from_ref(&bye)),
    ];
    for (i, (name, op, sgl)) in steps.into_iter().enumerate() {
        let t = Instant::now();
        // SAFETY: the region outlives the request, whose completion `wait` polls right away.
        check(unsafe { e.qp.post_send(&[SendWr::new(i as u64, op, sgl)]) }, name)?;
        let wc = e.wait(name)?;
        let extra = match name {
            "fetch_add" | "cmp_swap" => {
                format!(" old value {}", check(e.mr.read_u64(1024), "read_u64")?)
            }
            _ => String::new(),
        };
        println!(
            "client: {name:<15} {} {} bytes in {:?}{extra}",
            wc.opcode,
            wc.byte_len,
            t.elapsed()
        );
    }
    let mut got = vec![0; 256];
    e.mr.read_at(512, &mut got).map_err(|x| x.to_string())?;
    if got != pattern(3, 256) {
        return Err("client: the bytes read differ from the server's".into());
    }
    check(conn.disconnect(), "disconnect")?;
    println!("client: read bytes are right; disconnected");
    Ok(())
}

fn run<P: Provider>(role: &str, device: &str, addr: SocketAddr) -> Res<()> {
    match role {
        "server" => server::<P>(device, addr),
        "client" => client::<P>(device, addr),
        "both" => {
            let dev = device.to_owned();
            let s = std::thread::spawn(move || server::<P>(&dev, addr));
            std::thread::sleep(Duration::from_millis(50));
            let c = client::<P>(device, addr);
            let s = s.join().map_err(|_| "server thread panicked".to_string())?;
            c.and(s)
        }
        _ => Err(format!("unknown role {role:?}: server, client or both")),
    }
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let opt =
        |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let (Some(role), Some(addr)) = (args.get(1), args.get(2)) else {
        eprintln!(
            "usage: cm_pair server|client|both ADDR [--provider soft|ibverbs] [--device DEV]"
        );
        return std::process::ExitCode::from(2);
    };
    let Ok(addr) = addr.parse::<SocketAddr>() else {
        eprintln!("cm_pair: {addr:?} is not an address (IP:PORT)");
        return std::process::ExitCode::from(2);
    };
    let provider = opt("--provider").unwrap_or_else(|| "soft".into());
    let res = match provider.as_str() {
        "soft" => run::<corelink_verbs::soft::Soft>(
            role,
            &opt("--device").unwrap_or_else(|| "soft0".into()),
            addr,
        ),
        #[cfg(feature = "ibverbs")]
        "ibverbs" => {
            let dev = opt("--device")
                .or_else(|| std::env::var("CORELINK_IBV_DEVICE").ok())
                .unwrap_or_else(|| "rxe0".into());
            run::<corelink_verbs::ibverbs::Ibverbs>(role, &dev, addr)
        }
        p => Err(format!("unknown provider {p:?}")),
    };
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cm_pair {role}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
