//! Every RDMA primitive on the `soft` provider, one line each.
//!
//! Opens two contexts (A and B: two ports of the in-process fabric), connects an RC, a UC and a
//! UD pair between them, and runs send, send-with-immediate, write, write-with-immediate, read,
//! fetch-and-add, compare-and-swap, and a memory-window grant and revoke. Each line says what
//! completed (opcode, status, bytes, immediate or old value), whether the data is right, and how
//! long it took from post to completion (printed, never judged). The exit code is non-zero if
//! anything unexpected happened.
//!
//! ```text
//! cargo run --release -p corelink-apps --example primitives
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use corelink_verbs::soft::{Soft, SoftContext, SoftCq, SoftPd, SoftQp};
use corelink_verbs::{
    AccessFlags, AhAttr, Context, Cq, Endpoint, Mr, Mw, Pd, Provider, Qp, QpAttr, QpCap,
    QpInitAttr, QpType, RecvWr, RemoteAddr, SendOp, SendWr, UdDest, Wc, WcStatus, DEFAULT_QKEY,
    GRH_BYTES,
};

type Res<T> = Result<T, String>;

/// Adds what failed to an error.
trait Ctx<T> {
    fn ctx(self, what: &str) -> Res<T>;
}

impl<T, E: std::fmt::Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Res<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// A QP and its CQs.
struct Side {
    qp: SoftQp,
    scq: SoftCq,
    rcq: SoftCq,
}

/// Prints the lines and counts what was unexpected.
struct Report {
    t: QpType,
    bad: usize,
}

impl Report {
    /// One operation: what completed (`done`: completion and ns), whether it had the status
    /// `want` and whether its effect `ok`, and what it showed.
    fn line(&mut self, op: &str, done: (Wc, u128), want: WcStatus, ok: bool, detail: &str) {
        let (wc, ns) = done;
        let good = ok && wc.status == want;
        self.bad += usize::from(!good);
        println!(
            "{:<3} {op:<19} {:<25} {:<22} {:>5} B  {detail:<34} {ns:>8} ns  {}",
            self.t,
            wc.opcode.name(),
            wc.status.name(),
            wc.byte_len,
            if good { "ok" } else { "UNEXPECTED" }
        );
    }
}

/// Polls one completion, giving up after 5 s.
fn poll1(cq: &SoftCq) -> Res<Wc> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut wc = [Wc::default()];
    while cq.poll(&mut wc).ctx("poll")? == 0 {
        if Instant::now() > deadline {
            return Err("no completion within 5 s".into());
        }
        std::hint::spin_loop();
    }
    Ok(wc[0])
}

/// Posts `wr` on `s` and polls its completion; returns it and the nanoseconds it took.
fn run(s: &mut Side, wr: SendWr<'_, Soft>) -> Res<(Wc, u128)> {
    let start = Instant::now();
    // SAFETY: every buffer the demo names lives in a region created before the QPs and
    // dropped after them, and the completion is polled before this returns.
    unsafe { s.qp.post_send(&[wr]) }.ctx("post_send")?;
    let wc = poll1(&s.scq)?;
    Ok((wc, start.elapsed().as_nanos()))
}

/// Posts a receive of `len` bytes at `off` of `mr` on `s`.
fn recv(s: &mut Side, mr: &impl Mr, off: usize, len: u32) -> Res<()> {
    let sgl = [mr.sge(off, len).ctx("sge")?];
    // SAFETY: `mr` is created before the QPs and dropped after them.
    unsafe { s.qp.post_recv(&[RecvWr { wr_id: 0, sgl: &sgl }]) }.ctx("post_recv")
}

fn read(mr: &impl Mr, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    mr.read_at(off, &mut v).map(|_| v).unwrap_or_default()
}

fn side(ctx: &SoftContext, pd: &SoftPd, qp_type: QpType) -> Res<Side> {
    let (scq, rcq) = (ctx.create_cq(64).ctx("create_cq")?, ctx.create_cq(64).ctx("create_cq")?);
    let (cap, srq) = (QpCap::default(), None);
    let attr = QpInitAttr { qp_type, send_cq: &scq, recv_cq: &rcq, srq, cap, sq_sig_all: true };
    let qp = pd.create_qp(&attr).ctx("create_qp")?;
    Ok(Side { qp, scq, rcq })
}

fn main() -> ExitCode {
    match demo() {
        Ok(0) => ExitCode::SUCCESS,
        Ok(n) => {
            eprintln!("{n} unexpected result(s)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn demo() -> Res<usize> {
    const ALL: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_ALL);
    let (ca, cb) = (Soft::open("soft0").ctx("open")?, Soft::open("soft0").ctx("open")?);
    let (pa, pb) = (ca.alloc_pd().ctx("alloc_pd")?, cb.alloc_pd().ctx("alloc_pd")?);
    // A's buffer: [0, 1024) what it sends and writes, [1024, 2048) what it reads, [2048] the
    // atomics' old value, [3072, 4096) a window for B. B's buffer: [0, 1024) receives,
    // [1024, 2048) write target, [2048, 3072) read source, [3072] the atomic word.
    let am = pa.register(4096, ALL | AccessFlags::MW_BIND).ctx("register")?;
    let bm = pb.register(4096, ALL).ctx("register")?;
    let payload: Vec<u8> = (0..256u32).map(|i| (i * 7 + 1) as u8).collect();
    for (mr, off) in [(&am, 0), (&bm, 2048), (&am, 3072)] {
        mr.write_at(off, &payload).ctx("write_at")?;
    }
    let mw = pa.alloc_mw().ctx("alloc_mw")?;
    let dgid = cb.query_gid(1, 0).ctx("query_gid")?;
    let ah = pa.create_ah(&AhAttr { dgid, ..AhAttr::default() }).ctx("create_ah")?;

    // The QPs come after the memory they name, so they are dropped first.
    let mut pairs = Vec::new();
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let (mut a, mut b) = (side(&ca, &pa, t)?, side(&cb, &pb, t)?);
        let (mut ea, mut eb) = (Endpoint::default(), Endpoint::default());
        if t != QpType::Ud {
            (ea, eb) = (ca.endpoint(&a.qp, 1, 0).ctx("ep")?, cb.endpoint(&b.qp, 1, 0).ctx("ep")?);
        }
        a.qp.connect_to(eb, &QpAttr::default()).ctx("connect A")?;
        b.qp.connect_to(ea, &QpAttr::default()).ctx("connect B")?;
        pairs.push((t, a, b));
    }

    let mut r = Report { t: QpType::Rc, bad: 0 };
    println!(
        "{:<3} {:<19} {:<25} {:<22} {:>7}  {:<34} {:>11}",
        "qp", "operation", "completion", "status", "bytes", "what happened", "post->poll"
    );
    let src = [am.sge(0, 256).ctx("sge")?];
    for (t, a, b) in &mut pairs {
        r.t = *t;
        let grh = if r.t == QpType::Ud { GRH_BYTES as usize } else { 0 };
        for (name, imm) in [("send", None), ("send_with_imm", Some(0x1234_5678))] {
            recv(b, &bm, 0, 1024)?;
            let mut wr = SendWr::new(1, imm.map_or(SendOp::Send, SendOp::SendWithImm), &src);
            if r.t == QpType::Ud {
                wr = wr.to(UdDest { ah: &ah, qpn: b.qp.qp_num(), qkey: DEFAULT_QKEY });
            }
            let done = run(a, wr)?;
            let rc = poll1(&b.rcq)?;
            let ok = rc.imm == imm && rc.byte_len as usize == 256 + grh;
            let ok = ok && read(&bm, grh, 256) == payload;
            let detail = format!("recv {} B imm {:x?}", rc.byte_len, rc.imm);
            r.line(name, done, WcStatus::Success, ok, &detail);
        }
        if r.t == QpType::Ud {
            continue;
        }
        for (name, imm) in [("write", None), ("write_with_imm", Some(0x9abc_def0))] {
            bm.write_at(1024, &[0; 256]).ctx("write_at")?;
            let to = bm.remote(1024);
            let op = imm.map_or(SendOp::Write(to), |i| SendOp::WriteWithImm(to, i));
            if imm.is_some() {
                recv(b, &bm, 0, 64)?;
            }
            let done = run(a, SendWr::new(2, op, &src))?;
            let got = if imm.is_some() { poll1(&b.rcq)?.imm } else { None };
            let ok = got == imm && read(&bm, 1024, 256) == payload;
            r.line(name, done, WcStatus::Success, ok, &format!("target matches, imm {got:x?}"));
        }
        if r.t == QpType::Uc {
            continue;
        }
        let dst = [am.sge(1024, 256).ctx("sge")?];
        let done = run(a, SendWr::new(3, SendOp::Read(bm.remote(2048)), &dst))?;
        let ok = read(&am, 1024, 256) == payload;
        r.line("read", done, WcStatus::Success, ok, "local copy matches");

        let old = [am.sge(2048, 8).ctx("sge")?];
        let word = || (am.read_u64(2048).unwrap_or(0), bm.read_u64(3072).unwrap_or(0));
        bm.write_u64(3072, 40).ctx("write_u64")?;
        let faa = SendOp::FetchAdd { remote: bm.remote(3072), add: 2 };
        let done = run(a, SendWr::new(4, faa, &old))?;
        let (o, w) = word();
        let detail = format!("old {o}, word now {w}");
        r.line("fetch_add +2", done, WcStatus::Success, o == 40 && w == 42, &detail);
        let cas = SendOp::CompareSwap { remote: bm.remote(3072), compare: 42, swap: 7 };
        let done = run(a, SendWr::new(5, cas, &old))?;
        let (o, w) = word();
        let detail = format!("old {o}, word now {w}");
        r.line("cmp_swap 42->7", done, WcStatus::Success, o == 42 && w == 7, &detail);

        // Memory window: A grants B read access to [3072, 4096) of its buffer, then revokes it.
        let access = AccessFlags::REMOTE_READ;
        let bind = SendOp::BindMw { mw: &mw, mr: &am, addr: am.addr() + 3072, len: 1024, access };
        let done = run(a, SendWr::new(6, bind, &[]))?;
        let detail = format!("window rkey {:#x}", mw.rkey());
        r.line("bind_mw (grant)", done, WcStatus::Success, true, &detail);
        let window = RemoteAddr { addr: am.addr() + 3072, rkey: mw.rkey() };
        let into = [bm.sge(0, 64).ctx("sge")?];
        let done = run(b, SendWr::new(7, SendOp::Read(window), &into))?;
        let ok = read(&bm, 0, 64) == payload[..64];
        r.line("  B reads window", done, WcStatus::Success, ok, "data through the window");
        let done = run(a, SendWr::new(8, SendOp::LocalInv(window.rkey), &[]))?;
        r.line("local_inv (revoke)", done, WcStatus::Success, true, "window invalidated");
        bm.write_at(0, &[0; 64]).ctx("write_at")?;
        let done = run(b, SendWr::new(9, SendOp::Read(window), &into))?;
        let ok = read(&bm, 0, 64) == [0; 64];
        r.line("  B reads again", done, WcStatus::RemAccessErr, ok, "refused, nothing read");
    }
    Ok(r.bad)
}
