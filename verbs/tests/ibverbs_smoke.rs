//! Smoke test of the `ibverbs` provider against a real device.
//!
//! Every test is `#[ignore]`d and returns at once unless `CORELINK_IBV_DEVICE` names a device:
//!
//! ```text
//! CORELINK_IBV_DEVICE=rxe0 RXE_GID_INDEX=1 RXE_IP=10.77.0.1 \
//!     ibverbs_smoke-<hash> --ignored --test-threads=1 --nocapture
//! ```
//!
//! `RXE_GID_INDEX` (default 1) is the GID used to connect QPs by hand and `RXE_IP` the address
//! used for the connection-manager tests (skipped when unset). `error_status_table` prints the
//! completions the device gives for each error case. `CORELINK_IBV_DEVICE2`, a second device
//! (e.g. another rxe), lets `cm_refuses_a_qp_of_another_device` run.
#![cfg(feature = "ibverbs")]

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use corelink_verbs::ibverbs::{IbvContext, IbvCq, IbvMr, IbvPd, IbvQp, Ibverbs};
use corelink_verbs::{
    AccessFlags, AhAttr, CmEvent, ConnRequest, Connection, Context, Cq, Error, Listener, Mr, Mw,
    Pd, Provider, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType, RecvWr, RemoteAddr, SendFlags,
    SendOp, SendWr, UdDest, Wc, DEFAULT_QKEY, GRH_BYTES,
};

const PORT: u8 = 1;

fn device() -> Option<String> {
    std::env::var("CORELINK_IBV_DEVICE").ok().filter(|s| !s.is_empty())
}

fn gid_index() -> u32 {
    std::env::var("RXE_GID_INDEX").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
}

fn ip() -> Option<IpAddr> {
    std::env::var("RXE_IP").ok().and_then(|s| s.parse().ok())
}

fn open() -> Option<IbvContext> {
    let dev = device()?;
    Some(Ibverbs::open(&dev).expect("open"))
}

fn base_attr() -> QpAttr {
    QpAttr { sgid_index: gid_index() as u8, ..QpAttr::default() }
}

fn create_qp(pd: &IbvPd, cq: &IbvCq, qp_type: QpType) -> IbvQp {
    pd.create_qp(&QpInitAttr {
        qp_type,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap::default(),
        sq_sig_all: false,
    })
    .expect("create_qp")
}

/// Two QPs of one device, each with its own CQ and a 64 KiB region.
struct Pair {
    a: IbvQp,
    acq: IbvCq,
    amr: IbvMr,
    b: IbvQp,
    bcq: IbvCq,
    bmr: IbvMr,
}

fn pair(ctx: &IbvContext, pd: &IbvPd, t: QpType, attr_a: QpAttr, attr_b: QpAttr) -> Pair {
    let acq = ctx.create_cq(256).expect("cq");
    let bcq = ctx.create_cq(256).expect("cq");
    let mut a = create_qp(pd, &acq, t);
    let mut b = create_qp(pd, &bcq, t);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ALL | AccessFlags::MW_BIND;
    let amr = pd.register(65536, access).expect("reg");
    let bmr = pd.register(65536, access).expect("reg");
    let ea = ctx.endpoint(&a, PORT, gid_index()).expect("endpoint");
    let eb = ctx.endpoint(&b, PORT, gid_index()).expect("endpoint");
    a.connect_to(eb, &attr_a).expect("connect a");
    b.connect_to(ea, &attr_b).expect("connect b");
    assert_eq!(a.state(), QpState::Rts);
    assert_eq!(b.state(), QpState::Rts);
    Pair { a, acq, amr, b, bcq, bmr }
}

/// Polls until `n` completions or `timeout`.
fn wait(cq: &IbvCq, n: usize, timeout: Duration) -> Vec<Wc> {
    let end = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut buf = [Wc::default(); 8];
    while out.len() < n && Instant::now() < end {
        let k = cq.poll(&mut buf).expect("poll");
        out.extend_from_slice(&buf[..k]);
        if k == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    out
}

fn wait1(cq: &IbvCq) -> Wc {
    let v = wait(cq, 1, Duration::from_secs(5));
    assert_eq!(v.len(), 1, "expected one completion");
    v[0]
}

fn ok(wc: Wc) -> Wc {
    assert!(wc.status.is_success(), "completion failed: {wc:?}");
    wc
}

fn post_send(qp: &mut IbvQp, wrs: &[SendWr<'_, Ibverbs>]) -> Result<(), Error> {
    // SAFETY: the buffers are registered regions that outlive the completions polled after.
    unsafe { qp.post_send(wrs) }
}

fn post_recv(qp: &mut IbvQp, wrs: &[RecvWr<'_>]) {
    // SAFETY: as above.
    unsafe { qp.post_recv(wrs) }.expect("post_recv")
}

#[test]
#[ignore = "needs an RDMA device: set CORELINK_IBV_DEVICE"]
fn device_queries_and_objects() {
    let Some(ctx) = open() else { return };
    let devs = Ibverbs::devices().expect("devices");
    println!("devices: {devs:?}");
    assert!(devs.iter().any(|d| d.name == ctx.name()));
    let dev = ctx.query_device().expect("query_device");
    println!("device: {dev:?}");
    assert!(dev.max_qp > 0 && dev.phys_port_cnt >= 1);
    let port = ctx.query_port(PORT).expect("query_port");
    println!("port: {port:?}");
    let gid = ctx.query_gid(PORT, gid_index()).expect("query_gid");
    println!("gid[{}]: {gid}", gid_index());
    assert!(!gid.is_zero());
    assert!(matches!(ctx.query_port(99), Err(Error::QueryPort { .. })));
    let pd = ctx.alloc_pd().expect("pd");
    let mr = pd.register(10_000, AccessFlags::LOCAL_WRITE).expect("mr");
    assert_eq!(mr.len(), 10_000);
    assert_eq!(mr.addr() % 4096, 0);
    mr.write_at(9_990, b"0123456789").unwrap();
    let mut back = [0u8; 10];
    mr.read_at(9_990, &mut back).unwrap();
    assert_eq!(&back, b"0123456789");
    assert!(matches!(pd.register(4096, AccessFlags::REMOTE_WRITE), Err(Error::RegMr { .. })));
    assert!(matches!(pd.register(0, AccessFlags::LOCAL_WRITE), Err(Error::RegMr { .. })));
    let cq = ctx.create_cq(100).expect("cq");
    assert!(cq.depth() >= 100);
    assert_eq!(ctx.poll_async_event().expect("async"), None);
    assert!(matches!(Ibverbs::open("nosuchdev0"), Err(Error::NoSuchDevice { .. })));
}

#[test]
#[ignore = "needs an RDMA device: set CORELINK_IBV_DEVICE"]
fn rc_data_path() {
    let Some(ctx) = open() else { return };
    let pd = ctx.alloc_pd().unwrap();
    let mut p = pair(&ctx, &pd, QpType::Rc, base_attr(), base_attr());

    // Send / receive.
    p.amr.write_at(0, b"hello, rxe").unwrap();
    let rsge = [p.bmr.sge(0, 64).unwrap()];
    post_recv(&mut p.b, &[RecvWr { wr_id: 10, sgl: &rsge }]);
    let ssge = [p.amr.sge(0, 10).unwrap()];
    post_send(&mut p.a, &[SendWr::new(1, SendOp::Send, &ssge)]).unwrap();
    let wc = ok(wait1(&p.acq));
    assert_eq!((wc.wr_id, wc.opcode), (1, corelink_verbs::WcOpcode::Send));
    let wc = ok(wait1(&p.bcq));
    assert_eq!((wc.wr_id, wc.byte_len, wc.imm), (10, 10, None));
    let mut got = [0u8; 10];
    p.bmr.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"hello, rxe");

    // Send with immediate, inline, batched with an unsignalled write before it.
    p.amr.write_at(100, b"inline!").unwrap();
    post_recv(&mut p.b, &[RecvWr { wr_id: 11, sgl: &rsge }]);
    let wsge = [p.amr.sge(0, 10).unwrap()];
    let isge = [p.amr.sge(100, 7).unwrap()];
    post_send(
        &mut p.a,
        &[
            SendWr::new(2, SendOp::Write(p.bmr.remote(1000)), &wsge).flags(SendFlags::empty()),
            SendWr::new(3, SendOp::SendWithImm(0xdead_beef), &isge)
                .flags(SendFlags::SIGNALED | SendFlags::INLINE),
        ],
    )
    .unwrap();
    assert_eq!(ok(wait1(&p.acq)).wr_id, 3);
    let wc = ok(wait1(&p.bcq));
    assert_eq!((wc.wr_id, wc.byte_len, wc.imm), (11, 7, Some(0xdead_beef)));
    p.bmr.read_at(1000, &mut got).unwrap();
    assert_eq!(&got, b"hello, rxe");

    // RDMA read.
    p.bmr.write_at(2000, b"read me back").unwrap();
    let rd = [p.amr.sge(3000, 12).unwrap()];
    post_send(&mut p.a, &[SendWr::new(4, SendOp::Read(p.bmr.remote(2000)), &rd)]).unwrap();
    let wc = ok(wait1(&p.acq));
    assert_eq!((wc.opcode, wc.byte_len), (corelink_verbs::WcOpcode::RdmaRead, 12));
    let mut got12 = [0u8; 12];
    p.amr.read_at(3000, &mut got12).unwrap();
    assert_eq!(&got12, b"read me back");

    // Atomics.
    p.bmr.write_u64(4096, 40).unwrap();
    let res = [p.amr.sge(4096, 8).unwrap()];
    post_send(
        &mut p.a,
        &[SendWr::new(5, SendOp::FetchAdd { remote: p.bmr.remote(4096), add: 2 }, &res)],
    )
    .unwrap();
    let wc = ok(wait1(&p.acq));
    assert_eq!(wc.opcode, corelink_verbs::WcOpcode::FetchAdd);
    assert_eq!(p.amr.read_u64(4096).unwrap(), 40);
    assert_eq!(p.bmr.read_u64(4096).unwrap(), 42);
    let op = SendOp::CompareSwap { remote: p.bmr.remote(4096), compare: 42, swap: 7 };
    post_send(&mut p.a, &[SendWr::new(6, op, &res)]).unwrap();
    assert_eq!(ok(wait1(&p.acq)).opcode, corelink_verbs::WcOpcode::CompSwap);
    assert_eq!(p.amr.read_u64(4096).unwrap(), 42);
    assert_eq!(p.bmr.read_u64(4096).unwrap(), 7);
    let op = SendOp::CompareSwap { remote: p.bmr.remote(4096), compare: 1, swap: 9 };
    post_send(&mut p.a, &[SendWr::new(7, op, &res)]).unwrap();
    ok(wait1(&p.acq));
    assert_eq!(p.bmr.read_u64(4096).unwrap(), 7, "compare failed: unchanged");

    // Write with immediate.
    post_recv(&mut p.b, &[RecvWr { wr_id: 12, sgl: &[] }]);
    let sge = [p.amr.sge(0, 5).unwrap()];
    post_send(&mut p.a, &[SendWr::new(8, SendOp::WriteWithImm(p.bmr.remote(5000), 77), &sge)])
        .unwrap();
    assert_eq!(ok(wait1(&p.acq)).opcode, corelink_verbs::WcOpcode::RdmaWrite);
    let wc = ok(wait1(&p.bcq));
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.imm),
        (12, corelink_verbs::WcOpcode::RecvRdmaWithImm, Some(77))
    );
    let mut got5 = [0u8; 5];
    p.bmr.read_at(5000, &mut got5).unwrap();
    assert_eq!(&got5, b"hello");

    // A batch larger than the send queue: the first max_send_wr are posted.
    let n = p.a.cap().max_send_wr as usize;
    let wrs: Vec<_> = (0..n + 3)
        .map(|i| SendWr::new(100 + i as u64, SendOp::Write(p.bmr.remote(0)), &sge))
        .collect();
    match post_send(&mut p.a, &wrs) {
        Err(Error::PostSend { index, .. }) => assert_eq!(index, n),
        other => panic!("expected PostSend at {n}, got {other:?}"),
    }
    assert_eq!(wait(&p.acq, n, Duration::from_secs(10)).len(), n);

    // Too many SGEs: refused at post, with the index.
    let many = vec![sge[0]; p.a.cap().max_send_sge as usize + 1];
    let wrs = [
        SendWr::new(1, SendOp::Write(p.bmr.remote(0)), &sge[..]),
        SendWr::new(2, SendOp::Write(p.bmr.remote(0)), &many),
    ];
    match post_send(&mut p.a, &wrs) {
        Err(Error::PostSend { index: 1, .. }) => {}
        other => panic!("expected PostSend at 1, got {other:?}"),
    }
    ok(wait1(&p.acq));

    // Disconnect by hand: ERR flushes posted receives.
    post_recv(&mut p.b, &[RecvWr { wr_id: 13, sgl: &rsge }]);
    p.b.modify(&QpAttr { state: QpState::Err, ..base_attr() }).unwrap();
    let wc = wait1(&p.bcq);
    assert_eq!((wc.wr_id, wc.status), (13, corelink_verbs::WcStatus::WrFlushErr));
    assert_eq!(p.b.state(), QpState::Err);
    p.b.modify(&QpAttr { state: QpState::Reset, ..base_attr() }).unwrap();
    assert_eq!(p.b.state(), QpState::Reset);
    println!("async event after the run: {:?}", ctx.poll_async_event().unwrap());
}

#[test]
#[ignore = "needs an RDMA device: set CORELINK_IBV_DEVICE"]
fn ud_send() {
    let Some(ctx) = open() else { return };
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let mut a = create_qp(&pd, &cq, QpType::Ud);
    let mut b = create_qp(&pd, &cq, QpType::Ud);
    let attr = base_attr();
    a.connect_to(Default::default(), &attr).unwrap();
    b.connect_to(Default::default(), &attr).unwrap();
    let mr = pd.register(8192, AccessFlags::LOCAL_WRITE).unwrap();
    let port = ctx.query_port(PORT).unwrap();
    let ah = pd
        .create_ah(&AhAttr {
            port: PORT,
            dlid: port.lid,
            dgid: ctx.query_gid(PORT, gid_index()).unwrap(),
            sgid_index: gid_index() as u8,
            hop_limit: 64,
        })
        .unwrap();
    let rsge = [mr.sge(4096, 1024 + GRH_BYTES).unwrap()];
    post_recv(&mut b, &[RecvWr { wr_id: 20, sgl: &rsge }]);
    mr.write_at(0, b"datagram").unwrap();
    let ssge = [mr.sge(0, 8).unwrap()];
    let dest = UdDest { ah: &ah, qpn: b.qp_num(), qkey: DEFAULT_QKEY };
    post_send(&mut a, &[SendWr::new(21, SendOp::SendWithImm(5), &ssge).to(dest)]).unwrap();
    let wcs = wait(&cq, 2, Duration::from_secs(5));
    assert_eq!(wcs.len(), 2, "{wcs:?}");
    let r = wcs.iter().find(|w| w.wr_id == 20).copied().unwrap();
    let r = ok(r);
    assert_eq!((r.byte_len, r.src_qp, r.imm), (8 + GRH_BYTES, a.qp_num(), Some(5)));
    println!("UD receive: {r:?}");
    let mut got = [0u8; 8];
    mr.read_at(4096 + GRH_BYTES as usize, &mut got).unwrap();
    assert_eq!(&got, b"datagram");
    // A UD send without a destination is refused at post.
    assert!(matches!(
        post_send(&mut a, &[SendWr::new(22, SendOp::Send, &ssge)]),
        Err(Error::PostSend { index: 0, .. })
    ));
}

#[test]
#[ignore = "needs an RDMA device: set CORELINK_IBV_DEVICE"]
fn memory_window_bind_read_invalidate() {
    let Some(ctx) = open() else { return };
    let pd = ctx.alloc_pd().unwrap();
    let mut p = pair(&ctx, &pd, QpType::Rc, base_attr(), base_attr());
    let mw = pd.alloc_mw().unwrap();
    let k0 = mw.rkey();
    p.bmr.write_at(512, b"window").unwrap();
    let bind = SendOp::BindMw {
        mw: &mw,
        mr: &p.bmr,
        addr: p.bmr.addr(),
        len: 4096,
        access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
    };
    post_send(&mut p.b, &[SendWr::new(30, bind, &[])]).unwrap();
    let wc = ok(wait1(&p.bcq));
    assert_eq!(wc.opcode, corelink_verbs::WcOpcode::BindMw);
    let k1 = mw.rkey();
    assert_ne!(k0, k1);
    println!("MW rkey {k0:#x} -> {k1:#x}");
    let rd = [p.amr.sge(0, 6).unwrap()];
    let remote = RemoteAddr { addr: p.bmr.addr() + 512, rkey: k1 };
    post_send(&mut p.a, &[SendWr::new(31, SendOp::Read(remote), &rd)]).unwrap();
    ok(wait1(&p.acq));
    let mut got = [0u8; 6];
    p.amr.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"window");
    post_send(&mut p.b, &[SendWr::new(32, SendOp::LocalInv(k1), &[])]).unwrap();
    let wc = ok(wait1(&p.bcq));
    assert_eq!(wc.opcode, corelink_verbs::WcOpcode::LocalInv);
    post_send(&mut p.a, &[SendWr::new(33, SendOp::Read(remote), &rd)]).unwrap();
    let req = wait1(&p.acq);
    let resp = wait(&p.bcq, 1, Duration::from_millis(500));
    println!(
        "ROW | read through a revoked (LOCAL_INV) MW | {} | {} | a={:?} b={:?} |",
        fmt_wc(Some(req)),
        fmt_wc(resp.first().copied()),
        p.a.state(),
        p.b.state()
    );
    assert!(!req.status.is_success());
}

fn fmt_wc(wc: Option<Wc>) -> String {
    match wc {
        None => "none".into(),
        Some(w) => format!(
            "{} ({}, len {}, vendor_err {:#x})",
            w.status, w.opcode, w.byte_len, w.vendor_err
        ),
    }
}

/// Runs one error case on a fresh pair and prints a table row: requester completion,
/// responder completion, and the QP states afterwards.
fn row(name: &str, p: &mut Pair, post: impl FnOnce(&mut Pair) -> Result<(), Error>) {
    match post(p) {
        Err(e) => {
            let src = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
            println!(
                "ROW | {name} | refused at post: {e} ({src}) | - | a={:?} b={:?} |",
                p.a.state(),
                p.b.state()
            );
        }
        Ok(()) => {
            let req = wait(&p.acq, 1, Duration::from_secs(5));
            let resp = wait(&p.bcq, 1, Duration::from_millis(500));
            println!(
                "ROW | {name} | {} | {} | a={:?} b={:?} |",
                fmt_wc(req.first().copied()),
                fmt_wc(resp.first().copied()),
                p.a.state(),
                p.b.state()
            );
        }
    }
}

#[test]
#[ignore = "needs an RDMA device: set CORELINK_IBV_DEVICE"]
fn error_status_table() {
    let Some(ctx) = open() else { return };
    let pd = ctx.alloc_pd().unwrap();
    let rc = || pair(&ctx, &pd, QpType::Rc, base_attr(), base_attr());
    println!("ROW | case | requester completion | responder completion | states after |");

    let mut p = rc();
    row("RDMA write, bad rkey", &mut p, |p| {
        let s = [p.amr.sge(0, 8).unwrap()];
        let r = RemoteAddr { addr: p.bmr.addr(), rkey: p.bmr.rkey() ^ 0x5a00 };
        post_send(&mut p.a, &[SendWr::new(1, SendOp::Write(r), &s)])
    });
    let mut p = rc();
    row("RDMA read, bad rkey", &mut p, |p| {
        let s = [p.amr.sge(0, 8).unwrap()];
        let r = RemoteAddr { addr: p.bmr.addr(), rkey: p.bmr.rkey() ^ 0x5a00 };
        post_send(&mut p.a, &[SendWr::new(1, SendOp::Read(r), &s)])
    });
    let mut p = rc();
    row("fetch-add, bad rkey", &mut p, |p| {
        let s = [p.amr.sge(0, 8).unwrap()];
        let r = RemoteAddr { addr: p.bmr.addr(), rkey: p.bmr.rkey() ^ 0x5a00 };
        post_send(&mut p.a, &[SendWr::new(1, SendOp::FetchAdd { remote: r, add: 1 }, &s)])
    });
    let mut p = rc();
    row("RDMA write, out of bounds (64 B at len-8)", &mut p, |p| {
        let s = [p.amr.sge(0, 64).unwrap()];
        let r = p.bmr.remote(p.bmr.len() - 8);
        post_send(&mut p.a, &[SendWr::new(1, SendOp::Write(r), &s)])
    });
    let mut p = rc();
    row("RDMA read, out of bounds", &mut p, |p| {
        let s = [p.amr.sge(0, 64).unwrap()];
        let r = p.bmr.remote(p.bmr.len() - 8);
        post_send(&mut p.a, &[SendWr::new(1, SendOp::Read(r), &s)])
    });
    let mut p = rc();
    let ro = pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).unwrap();
    row("RDMA write to an MR without REMOTE_WRITE", &mut p, |p| {
        let s = [p.amr.sge(0, 8).unwrap()];
        post_send(&mut p.a, &[SendWr::new(1, SendOp::Write(ro.remote(0)), &s)])
    });
    let mut p = rc();
    row("atomic on an MR without REMOTE_ATOMIC", &mut p, |p| {
        let s = [p.amr.sge(0, 8).unwrap()];
        post_send(
            &mut p.a,
            &[SendWr::new(1, SendOp::FetchAdd { remote: ro.remote(0), add: 1 }, &s)],
        )
    });
    let mut p = pair(
        &ctx,
        &pd,
        QpType::Rc,
        base_attr(),
        QpAttr { access: AccessFlags::REMOTE_READ, ..base_attr() },
    );
    row("RDMA write to a QP without REMOTE_WRITE access", &mut p, |p| {
        let s = [p.amr.sge(0, 8).unwrap()];
        post_send(&mut p.a, &[SendWr::new(1, SendOp::Write(p.bmr.remote(0)), &s)])
    });
    let mut p = pair(&ctx, &pd, QpType::Rc, QpAttr { rnr_retry: 0, ..base_attr() }, base_attr());
    row("send, no receive posted, rnr_retry=0", &mut p, |p| {
        let s = [p.amr.sge(0, 8).unwrap()];
        post_send(&mut p.a, &[SendWr::new(1, SendOp::Send, &s)])
    });
    let mut p = rc();
    row("send 64 B into a 16 B receive", &mut p, |p| {
        let r = [p.bmr.sge(0, 16).unwrap()];
        post_recv(&mut p.b, &[RecvWr { wr_id: 2, sgl: &r }]);
        let s = [p.amr.sge(0, 64).unwrap()];
        post_send(&mut p.a, &[SendWr::new(1, SendOp::Send, &s)])
    });
    let mut p = rc();
    row("fetch-add on a misaligned (addr+4) word", &mut p, |p| {
        let s = [p.amr.sge(0, 8).unwrap()];
        post_send(
            &mut p.a,
            &[SendWr::new(1, SendOp::FetchAdd { remote: p.bmr.remote(4), add: 1 }, &s)],
        )
    });
    let mut p = rc();
    row("send, bad lkey in the SGE", &mut p, |p| {
        let r = [p.bmr.sge(0, 64).unwrap()];
        post_recv(&mut p.b, &[RecvWr { wr_id: 2, sgl: &r }]);
        let mut s = [p.amr.sge(0, 8).unwrap()];
        s[0].lkey ^= 0x5a00;
        post_send(&mut p.a, &[SendWr::new(1, SendOp::Send, &s)])
    });
    let mut p = rc();
    row("RDMA write, bad lkey in the SGE", &mut p, |p| {
        let mut s = [p.amr.sge(0, 8).unwrap()];
        s[0].lkey ^= 0x5a00;
        post_send(&mut p.a, &[SendWr::new(1, SendOp::Write(p.bmr.remote(0)), &s)])
    });
    let mut p = rc();
    let mw = pd.alloc_mw().unwrap();
    row("MW bind to an MR registered without MW_BIND", &mut p, |p| {
        let op = SendOp::BindMw {
            mw: &mw,
            mr: &ro,
            addr: ro.addr(),
            len: 4096,
            access: AccessFlags::REMOTE_READ,
        };
        post_send(&mut p.a, &[SendWr::new(1, op, &[])])
    });
    let mut p = pair(&ctx, &pd, QpType::Uc, base_attr(), base_attr());
    row("RDMA read posted on a UC QP", &mut p, |p| {
        let s = [p.amr.sge(0, 8).unwrap()];
        post_send(&mut p.a, &[SendWr::new(1, SendOp::Read(p.bmr.remote(0)), &s)])
    });
    let mut p = pair(&ctx, &pd, QpType::Uc, base_attr(), base_attr());
    row("UC write (control: should succeed)", &mut p, |p| {
        let s = [p.amr.sge(0, 8).unwrap()];
        post_send(&mut p.a, &[SendWr::new(1, SendOp::Write(p.bmr.remote(0)), &s)])
    });

    // UD send larger than the MTU.
    let cq = ctx.create_cq(64).unwrap();
    let bcq = ctx.create_cq(64).unwrap();
    let mut a = create_qp(&pd, &cq, QpType::Ud);
    let mut b = create_qp(&pd, &bcq, QpType::Ud);
    a.connect_to(Default::default(), &base_attr()).unwrap();
    b.connect_to(Default::default(), &base_attr()).unwrap();
    let mr = pd.register(16384, AccessFlags::LOCAL_WRITE).unwrap();
    let port = ctx.query_port(PORT).unwrap();
    let ah = pd
        .create_ah(&AhAttr {
            port: PORT,
            dlid: port.lid,
            dgid: ctx.query_gid(PORT, gid_index()).unwrap(),
            sgid_index: gid_index() as u8,
            hop_limit: 64,
        })
        .unwrap();
    let rs = [mr.sge(8192, 8192).unwrap()];
    post_recv(&mut b, &[RecvWr { wr_id: 2, sgl: &rs }]);
    let len = port.active_mtu.bytes() + 1;
    let s = [mr.sge(0, len).unwrap()];
    let dest = UdDest { ah: &ah, qpn: b.qp_num(), qkey: DEFAULT_QKEY };
    let name = format!("UD send of {len} B (active MTU {})", port.active_mtu.bytes());
    match post_send(&mut a, &[SendWr::new(1, SendOp::Send, &s).to(dest)]) {
        Err(e) => {
            let src = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
            println!(
                "ROW | {name} | refused at post: {e} ({src}) | - | a={:?} b={:?} |",
                a.state(),
                b.state()
            );
        }
        Ok(()) => {
            let req = wait(&cq, 1, Duration::from_secs(5));
            let resp = wait(&bcq, 1, Duration::from_millis(500));
            println!(
                "ROW | {name} | {} | {} | a={:?} b={:?} |",
                fmt_wc(req.first().copied()),
                fmt_wc(resp.first().copied()),
                a.state(),
                b.state()
            );
        }
    }
    let mut ev = Vec::new();
    while let Some(e) = ctx.poll_async_event().unwrap() {
        ev.push(e);
    }
    println!("async events after the error cases: {ev:?}");
}

fn recv_one(qp: &mut IbvQp, mr: &IbvMr, wr_id: u64) {
    let s = [mr.sge(0, 256).unwrap()];
    post_recv(qp, &[RecvWr { wr_id, sgl: &s }]);
}

#[test]
#[ignore = "needs an RDMA device: set CORELINK_IBV_DEVICE"]
fn connection_manager() {
    let Some(ctx) = open() else { return };
    let Some(ip) = ip() else {
        println!("RXE_IP unset: skipping the connection-manager test");
        return;
    };
    let mut listener = ctx.listen(SocketAddr::new(ip, 0)).expect("listen");
    let addr = listener.local_addr();
    println!("listening on {addr}");
    assert_ne!(addr.port(), 0);
    assert!(listener.get_request(Duration::ZERO).unwrap().is_none());

    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(64).unwrap();
            let mr = pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ALL).unwrap();
            // First request: rejected with private data.
            let req = listener.get_request(Duration::from_secs(20)).unwrap().expect("request 1");
            assert!(req.private_data().starts_with(b"first"));
            req.reject(b"go away").unwrap();
            // Second: accepted.
            let req = listener.get_request(Duration::from_secs(20)).unwrap().expect("request 2");
            println!(
                "request from {} with {} bytes of private data",
                req.peer_addr(),
                req.private_data().len()
            );
            assert!(req.private_data().starts_with(b"second"));
            let mut qp = create_qp(&pd, &cq, QpType::Rc);
            // Receives need INIT; accept takes a QP in RESET or INIT.
            qp.modify(&QpAttr { state: QpState::Init, ..QpAttr::default() }).unwrap();
            recv_one(&mut qp, &mr, 1);
            let mut conn = req.accept(&mut qp, &QpAttr::default(), b"welcome").unwrap();
            assert_eq!(qp.state(), QpState::Rts);
            assert_eq!(conn.poll_event(Duration::ZERO).unwrap(), Some(CmEvent::Established));
            let wc = ok(wait1(&cq));
            let mut got = [0u8; 4];
            mr.read_at(0, &mut got).unwrap();
            assert_eq!((&got, wc.byte_len), (b"ping", 4));
            // The client disconnects: we see it.
            let mut seen = None;
            let end = Instant::now() + Duration::from_secs(20);
            while seen.is_none() && Instant::now() < end {
                seen = conn.poll_event(Duration::from_secs(1)).unwrap();
            }
            assert_eq!(seen, Some(CmEvent::Disconnected));
            println!("server saw {seen:?}; QP is {:?}", qp.state());
            conn.disconnect().unwrap();
            assert_eq!(qp.state(), QpState::Err);
        });

        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mut qp = create_qp(&pd, &cq, QpType::Rc);
        match ctx.connect(addr, &mut qp, &QpAttr::default(), b"first", Duration::from_secs(20)) {
            Err(Error::Rejected { private_data, .. }) => {
                println!("rejected with {} bytes of private data", private_data.len());
                assert!(private_data.starts_with(b"go away"));
            }
            other => panic!("expected Rejected, got {other:?}"),
        }
        let mut qp = create_qp(&pd, &cq, QpType::Rc);
        let t = Instant::now();
        let mut conn = ctx
            .connect(addr, &mut qp, &QpAttr::default(), b"second", Duration::from_secs(20))
            .expect("connect");
        println!(
            "connected in {:?}; peer private data {} bytes",
            t.elapsed(),
            conn.peer_private_data().len()
        );
        assert!(conn.peer_private_data().starts_with(b"welcome"));
        assert_eq!(qp.state(), QpState::Rts);
        assert_eq!(conn.poll_event(Duration::ZERO).unwrap(), Some(CmEvent::Established));
        mr.write_at(0, b"ping").unwrap();
        let s = [mr.sge(0, 4).unwrap()];
        post_send(&mut qp, &[SendWr::new(9, SendOp::Send, &s)]).unwrap();
        ok(wait1(&cq));
        conn.disconnect().unwrap();
        assert_eq!(qp.state(), QpState::Err);
        let ev = conn.poll_event(Duration::from_secs(10)).unwrap();
        println!("client after disconnect: {ev:?}");
        server.join().unwrap();
    });

    // Nothing listens on this port.
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let mut qp = create_qp(&pd, &cq, QpType::Rc);
    let t = Instant::now();
    let r = ctx.connect(
        SocketAddr::new(ip, 1),
        &mut qp,
        &QpAttr::default(),
        &[],
        Duration::from_secs(15),
    );
    println!("connect to a port with no listener: {r:?} after {:?}", t.elapsed());
    assert!(matches!(r, Err(Error::Rejected { .. } | Error::Unreachable { .. })), "{r:?}");
}

#[test]
#[ignore = "needs an RDMA device: set CORELINK_IBV_DEVICE"]
fn connection_manager_uc() {
    let Some(ctx) = open() else { return };
    let Some(ip) = ip() else { return };
    let mut listener = ctx.listen(SocketAddr::new(ip, 0)).expect("listen");
    let addr = listener.local_addr();
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(64).unwrap();
            let mr =
                pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
            let req = listener.get_request(Duration::from_secs(20)).unwrap().expect("request");
            let mut qp = create_qp(&pd, &cq, QpType::Uc);
            qp.modify(&QpAttr { state: QpState::Init, ..QpAttr::default() }).unwrap();
            recv_one(&mut qp, &mr, 1);
            let r = req.accept(&mut qp, &QpAttr::default(), &[]);
            println!("UC accept: {r:?}");
            let _conn = r.unwrap();
            let wc = ok(wait1(&cq));
            println!("UC server received {wc:?}");
        });
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let mr = pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mut qp = create_qp(&pd, &cq, QpType::Uc);
        let r = ctx.connect(addr, &mut qp, &QpAttr::default(), &[], Duration::from_secs(20));
        println!("UC connect: {r:?}");
        let _conn = r.unwrap();
        let s = [mr.sge(0, 4).unwrap()];
        post_send(&mut qp, &[SendWr::new(9, SendOp::Send, &s)]).unwrap();
        ok(wait1(&cq));
        server.join().unwrap();
    });
}

#[test]
#[ignore = "needs an RDMA device: set CORELINK_IBV_DEVICE"]
fn srq_receive_and_drop_order() {
    let Some(ctx) = open() else { return };
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let srq = pd.create_srq(&corelink_verbs::SrqAttr { max_wr: 64, max_sge: 2 }).unwrap();
    let mut a = create_qp(&pd, &cq, QpType::Rc);
    let mut b = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: Some(&srq),
            cap: QpCap::default(),
            sq_sig_all: true,
        })
        .unwrap();
    let ea = ctx.endpoint(&a, PORT, gid_index()).unwrap();
    let eb = ctx.endpoint(&b, PORT, gid_index()).unwrap();
    a.connect_to(eb, &base_attr()).unwrap();
    b.connect_to(ea, &base_attr()).unwrap();
    let mr = pd.register(65536, AccessFlags::LOCAL_WRITE).unwrap();
    // 40 receives: more than one stack chunk of the SRQ post.
    let sges: Vec<[corelink_verbs::Sge; 1]> =
        (0..40).map(|i| [mr.sge(1024 * (i + 1), 64).unwrap()]).collect();
    let wrs: Vec<RecvWr<'_>> =
        sges.iter().enumerate().map(|(i, s)| RecvWr { wr_id: 500 + i as u64, sgl: s }).collect();
    // SAFETY: the region outlives the completions.
    unsafe { corelink_verbs::Srq::post_recv(&srq, &wrs) }.unwrap();
    // Too many SGEs: refused with its index.
    let three = [mr.sge(0, 8).unwrap(); 3];
    let bad = [RecvWr { wr_id: 1, sgl: &three[..1] }, RecvWr { wr_id: 2, sgl: &three }];
    // SAFETY: as above.
    match unsafe { corelink_verbs::Srq::post_recv(&srq, &bad) } {
        Err(Error::PostSrqRecv { index: 1, .. }) => {}
        other => panic!("expected PostSrqRecv at 1, got {other:?}"),
    }
    // Receives on a QP attached to an SRQ are refused.
    assert!(matches!(
        // SAFETY: as above.
        unsafe { b.post_recv(&bad[..1]) },
        Err(Error::PostRecv { index: 0, .. })
    ));
    mr.write_at(0, b"via srq").unwrap();
    let s = [mr.sge(0, 7).unwrap()];
    post_send(&mut a, &[SendWr::new(1, SendOp::Send, &s)]).unwrap();
    let wcs = wait(&cq, 2, Duration::from_secs(5));
    let r = wcs.iter().find(|w| w.opcode.is_recv()).copied().expect("receive");
    let r = ok(r);
    assert_eq!((r.wr_id, r.byte_len, r.qp_num), (500, 7, b.qp_num()));
    // Parents dropped before children: the children keep them alive.
    drop(pd);
    drop(srq);
    drop(cq);
    post_send(&mut a, &[SendWr::new(2, SendOp::Send, &s)]).unwrap();
    drop(a);
    drop(b);
    drop(mr);
    drop(ctx);
}

/// Sibling contexts (`open_sibling`: `ibv_open_device` on the same device) are one device: QPs
/// of two siblings connect by hand and through rdma_cm (on the cm context or on a sibling),
/// and reach each other's memory; objects of two siblings do not combine. Also prints what
/// the device says to a thread domain (`ibv_alloc_td`).
#[test]
#[ignore = "needs an RDMA device: set CORELINK_IBV_DEVICE"]
fn sibling_contexts() {
    let Some(ctx) = open() else { return };
    let s1 = ctx.open_sibling().expect("open_sibling");
    let s2 = s1.open_sibling().expect("open_sibling of a sibling");
    println!("cm context {ctx:?}, siblings {s1:?} {s2:?}");
    assert!(s1.as_raw() != ctx.as_raw() && s2.as_raw() != s1.as_raw(), "contexts of their own");
    assert_eq!(s1.name(), ctx.name());
    let guid = |c: &IbvContext| c.query_device().expect("query_device").node_guid;
    assert_eq!((guid(&s1), guid(&s2)), (guid(&ctx), guid(&ctx)));
    let gid = |c: &IbvContext| c.query_gid(PORT, gid_index()).expect("query_gid");
    assert_eq!(gid(&s1), gid(&ctx));

    // Objects of two siblings do not combine.
    let pd1 = s1.alloc_pd().expect("pd");
    let cq2 = s2.create_cq(16).expect("cq");
    let cq1 = s1.create_cq(64).expect("cq");
    let r = pd1.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq1,
        recv_cq: &cq2,
        srq: None,
        cap: QpCap::default(),
        sq_sig_all: false,
    });
    assert!(matches!(r, Err(Error::ForeignObject { what: "receive CQ", .. })), "{r:?}");

    // By hand: a write and a read between QPs of the two siblings.
    let pd2 = s2.alloc_pd().expect("pd");
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ALL;
    let (mr1, mr2) = (pd1.register(4096, access).unwrap(), pd2.register(4096, access).unwrap());
    let cq2 = s2.create_cq(64).expect("cq");
    let (mut a, mut b) = (create_qp(&pd1, &cq1, QpType::Rc), create_qp(&pd2, &cq2, QpType::Rc));
    let ea = s1.endpoint(&a, PORT, gid_index()).unwrap();
    let eb = s2.endpoint(&b, PORT, gid_index()).unwrap();
    a.connect_to(eb, &base_attr()).expect("connect a");
    b.connect_to(ea, &base_attr()).expect("connect b");
    mr1.write_at(0, b"sibling").unwrap();
    let s = [mr1.sge(0, 7).unwrap()];
    post_send(&mut a, &[SendWr::new(1, SendOp::Write(mr2.remote(64)), &s)]).unwrap();
    ok(wait1(&cq1));
    let mut got = [0u8; 7];
    mr2.read_at(64, &mut got).unwrap();
    assert_eq!(&got, b"sibling");
    let s = [mr2.sge(128, 7).unwrap()];
    post_send(&mut b, &[SendWr::new(2, SendOp::Read(mr1.remote(0)), &s)]).unwrap();
    ok(wait1(&cq2));
    mr2.read_at(128, &mut got).unwrap();
    assert_eq!(&got, b"sibling");

    // A thread domain: what the device answers (rxe has none).
    let mut td_attr = rdma_sys::ibv_td_init_attr { comp_mask: 0 };
    // SAFETY: a live context and a valid attribute block; a TD given is deallocated below.
    let td = unsafe { rdma_sys::ibv_alloc_td(s1.as_raw(), &mut td_attr) };
    let errno = std::io::Error::last_os_error();
    match td {
        Some(td) if !td.is_null() => {
            println!("ibv_alloc_td: a thread domain");
            // SAFETY: a TD just allocated on a live context, freed once.
            assert_eq!(unsafe { rdma_sys::ibv_dealloc_td(td) }, 0);
        }
        Some(_) => println!("ibv_alloc_td: NULL, errno {errno} ({:?})", errno.raw_os_error()),
        None => println!("ibv_alloc_td: the provider has no alloc_td op (EOPNOTSUPP)"),
    }

    // Through rdma_cm: the listener on the cm context; one connection made through a sibling's
    // connect with a QP of that sibling, accepted with a QP of the other sibling.
    let Some(ip) = ip() else {
        println!("RXE_IP unset: skipping the connection-manager part");
        return;
    };
    let mut listener = ctx.listen(SocketAddr::new(ip, 0)).expect("listen");
    let addr = listener.local_addr();
    std::thread::scope(|sc| {
        let server = sc.spawn(|| {
            let req = listener.get_request(Duration::from_secs(20)).unwrap().expect("request");
            let mut qp = create_qp(&pd2, &cq2, QpType::Rc);
            let r = req.accept(&mut qp, &base_attr(), b"welcome");
            println!("accept with a sibling's QP: {r:?}");
            let conn = r.expect("accept");
            (qp, conn)
        });
        let mut qp = create_qp(&pd1, &cq1, QpType::Rc);
        let r = s1.connect(addr, &mut qp, &base_attr(), b"hi", Duration::from_secs(20));
        println!("connect through a sibling with its QP: {r:?}");
        let _conn = r.expect("connect");
        let (_peer_qp, _peer_conn) = server.join().unwrap();
        mr1.write_at(256, b"via rdma_cm").unwrap();
        let s = [mr1.sge(256, 11).unwrap()];
        post_send(&mut qp, &[SendWr::new(3, SendOp::Write(mr2.remote(512)), &s)]).unwrap();
        ok(wait1(&cq1));
        let mut got = [0u8; 11];
        mr2.read_at(512, &mut got).unwrap();
        assert_eq!(&got, b"via rdma_cm");
    });
}

/// The connection manager takes QPs of any context of its device, and refuses one of another
/// device (`CORELINK_IBV_DEVICE2`) with `Error::WrongDevice`, connecting and accepting.
#[test]
#[ignore = "needs two RDMA devices: set CORELINK_IBV_DEVICE and CORELINK_IBV_DEVICE2"]
fn cm_refuses_a_qp_of_another_device() {
    let Some(ctx) = open() else { return };
    let Some(ip) = ip() else { return };
    let Some(dev2) = std::env::var("CORELINK_IBV_DEVICE2").ok().filter(|d| !d.is_empty()) else {
        println!("CORELINK_IBV_DEVICE2 unset: skipping");
        return;
    };
    let other = Ibverbs::open(&dev2).expect("open the second device");
    let pd = other.alloc_pd().unwrap();
    let cq = other.create_cq(16).unwrap();
    let mut listener = ctx.listen(SocketAddr::new(ip, 0)).expect("listen");
    let addr = listener.local_addr();

    let mut qp = create_qp(&pd, &cq, QpType::Rc);
    let r = ctx.connect(addr, &mut qp, &base_attr(), b"", Duration::from_secs(10));
    println!("connect with a QP of {dev2}: {r:?}");
    match r {
        Err(Error::WrongDevice { op: "rdma_connect", qpn, qp_device, device }) => {
            assert_eq!(
                (qpn, qp_device.as_str(), device.as_str()),
                (qp.qp_num(), &*dev2, ctx.name())
            )
        }
        r => panic!("expected WrongDevice, got {r:?}"),
    }
    assert_eq!(qp.state(), QpState::Reset, "a refused QP is left alone");

    std::thread::scope(|s| {
        let connector = s.spawn(|| {
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(16).unwrap();
            let mut qp = create_qp(&pd, &cq, QpType::Rc);
            ctx.connect(addr, &mut qp, &base_attr(), b"", Duration::from_secs(10)).map(|_| ())
        });
        let req = listener.get_request(Duration::from_secs(20)).unwrap().expect("request");
        let r = req.accept(&mut qp, &base_attr(), b"");
        println!("accept with a QP of {dev2}: {r:?}");
        assert!(matches!(r, Err(Error::WrongDevice { op: "rdma_accept", .. })), "{r:?}");
        let r = connector.join().unwrap();
        println!("the connector of the refused request: {r:?}");
        assert!(r.is_err(), "the refused request is not connected");
    });
}
