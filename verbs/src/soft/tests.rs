//! Unit tests of `soft`'s mechanics (the conformance suite in `tests/` covers the semantics).

use super::*;
use crate::*;

struct Side {
    _ctx: SoftContext,
    pd: SoftPd,
    cq: SoftCq,
    qp: SoftQp,
    mr: SoftMr,
}

fn side(ctx: SoftContext, qp_type: QpType) -> Side {
    side_with(ctx, qp_type, QpCap::default())
}

fn side_with(ctx: SoftContext, qp_type: QpType, cap: QpCap) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let attr = QpInitAttr::<Soft> {
        qp_type,
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        cap,
        sq_sig_all: false,
    };
    let qp = pd.create_qp(&attr).unwrap();
    let mr = pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ALL).unwrap();
    Side { _ctx: ctx, pd, cq, qp, mr }
}

fn pair(qp_type: QpType, attr: QpAttr) -> (Side, Side) {
    pair_with(qp_type, attr, QpCap::default())
}

fn pair_with(qp_type: QpType, attr: QpAttr, cap: QpCap) -> (Side, Side) {
    let mut a = side_with(Soft::open(DEVICE_NAME).unwrap(), qp_type, cap);
    let mut b = side_with(Soft::open(DEVICE_NAME).unwrap(), qp_type, cap);
    let (ea, eb) = (a._ctx.endpoint(&a.qp, 1, 0).unwrap(), b._ctx.endpoint(&b.qp, 1, 0).unwrap());
    a.qp.connect_to(eb, &attr).unwrap();
    b.qp.connect_to(ea, &attr).unwrap();
    (a, b)
}

fn poll_one(cq: &SoftCq) -> Wc {
    let mut wc = [Wc::default(); 1];
    for _ in 0..1_000_000 {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        std::thread::yield_now();
    }
    panic!("no completion");
}

#[test]
fn rc_write_read_atomics_send() {
    let (mut a, b) = pair(QpType::Rc, QpAttr::default());
    a.mr.write_at(0, b"hello, world").unwrap();
    let sge = [a.mr.sge(0, 12).unwrap()];
    // SAFETY: the regions outlive the completions polled below.
    unsafe { a.qp.post_send(&[SendWr::new(1, SendOp::Write(b.mr.remote(100)), &sge)]).unwrap() };
    assert_eq!(poll_one(&a.cq).status, WcStatus::Success);
    let mut out = [0u8; 12];
    b.mr.read_at(100, &mut out).unwrap();
    assert_eq!(&out, b"hello, world");

    let sge = [a.mr.sge(200, 12).unwrap()];
    // SAFETY: as above.
    unsafe { a.qp.post_send(&[SendWr::new(2, SendOp::Read(b.mr.remote(100)), &sge)]).unwrap() };
    let wc = poll_one(&a.cq);
    assert_eq!((wc.status, wc.opcode, wc.byte_len), (WcStatus::Success, WcOpcode::RdmaRead, 12));
    a.mr.read_at(200, &mut out).unwrap();
    assert_eq!(&out, b"hello, world");

    b.mr.write_u64(512, 40).unwrap();
    let sge = [a.mr.sge(1024, 8).unwrap()];
    let faa = SendOp::FetchAdd { remote: b.mr.remote(512), add: 2 };
    // SAFETY: as above.
    unsafe { a.qp.post_send(&[SendWr::new(3, faa, &sge)]).unwrap() };
    assert_eq!(poll_one(&a.cq).opcode, WcOpcode::FetchAdd);
    assert_eq!((a.mr.read_u64(1024).unwrap(), b.mr.read_u64(512).unwrap()), (40, 42));
}

#[test]
fn rnr_then_flush() {
    let attr = QpAttr { rnr_retry: 0, ..QpAttr::default() };
    let (mut a, b) = pair(QpType::Rc, attr);
    let sge = [a.mr.sge(0, 8).unwrap()];
    let wrs = [SendWr::new(1, SendOp::Send, &sge), SendWr::new(2, SendOp::Send, &sge)];
    // SAFETY: the region outlives the completions polled below.
    unsafe { a.qp.post_send(&wrs).unwrap() };
    let wc = poll_one(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RnrRetryExcErr));
    let wc = poll_one(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushErr));
    assert_eq!(a.qp.state(), QpState::Err);
    drop(b);
}

#[test]
fn rnr_retry_succeeds_once_a_receive_is_posted() {
    let attr = QpAttr { rnr_retry: 7, min_rnr_timer: 1, ..QpAttr::default() };
    let (mut a, mut b) = pair(QpType::Rc, attr);
    let sge = [a.mr.sge(0, 8).unwrap()];
    // SAFETY: the regions outlive the completions polled below.
    unsafe { a.qp.post_send(&[SendWr::new(1, SendOp::SendWithImm(7), &sge)]).unwrap() };
    let mut wc = [Wc::default(); 4];
    assert_eq!(a.cq.poll(&mut wc).unwrap(), 0);
    let rsge = [b.mr.sge(0, 64).unwrap()];
    // SAFETY: as above.
    unsafe { b.qp.post_recv(&[RecvWr { wr_id: 9, sgl: &rsge }]).unwrap() };
    let wc = poll_one(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    let wc = poll_one(&b.cq);
    assert_eq!((wc.wr_id, wc.opcode, wc.imm, wc.byte_len), (9, WcOpcode::Recv, Some(7), 8));
    drop(b.pd);
}

/// A request that waits behind an RNR retry is kept as a copy: its inline payload is taken at
/// post (the caller's buffer is reused at once), its SGEs by value, and it runs in order.
#[test]
fn requests_behind_an_rnr_wait_keep_their_inline_payload() {
    let attr = QpAttr { rnr_retry: 7, min_rnr_timer: 1, ..QpAttr::default() };
    let (mut a, mut b) = pair(QpType::Rc, attr);
    let sge = [a.mr.sge(0, 8).unwrap()];
    // SAFETY: the regions outlive the completions polled below.
    unsafe { a.qp.post_send(&[SendWr::new(1, SendOp::Send, &sge)]).unwrap() };
    let mut payload = *b"0123456789abcdef";
    let (head, tail) = payload.split_at(5);
    let inline = [
        Sge { addr: head.as_ptr() as u64, length: 5, lkey: 0 },
        Sge { addr: 0, length: 0, lkey: 0 },
        Sge { addr: tail.as_ptr() as u64, length: 11, lkey: 0 },
    ];
    let wr = SendWr::new(2, SendOp::Write(b.mr.remote(200)), &inline)
        .flags(SendFlags::INLINE | SendFlags::SIGNALED);
    let write = SendWr::new(3, SendOp::Write(b.mr.remote(300)), &sge);
    // SAFETY: the inline SGEs are readable now; `a.mr` outlives the completions.
    unsafe { a.qp.post_send(&[wr, write]).unwrap() };
    payload.fill(b'x');
    assert_eq!(payload[0], b'x');
    let rsge = [b.mr.sge(0, 64).unwrap()];
    // SAFETY: as above.
    unsafe { b.qp.post_recv(&[RecvWr { wr_id: 9, sgl: &rsge }]).unwrap() };
    for id in 1..=3 {
        let wc = poll_one(&a.cq);
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    }
    let mut out = [0u8; 16];
    b.mr.read_at(200, &mut out).unwrap();
    assert_eq!(&out, b"0123456789abcdef");
}

#[test]
fn bad_rkey_moves_both_sides_to_err() {
    let (mut a, mut b) = pair(QpType::Rc, QpAttr::default());
    let rsge = [b.mr.sge(0, 64).unwrap()];
    // SAFETY: the regions outlive the completions polled below.
    unsafe { b.qp.post_recv(&[RecvWr { wr_id: 5, sgl: &rsge }]).unwrap() };
    let sge = [a.mr.sge(0, 8).unwrap()];
    let bad = RemoteAddr { addr: b.mr.addr(), rkey: b.mr.rkey() ^ 0x100 };
    // SAFETY: as above.
    unsafe {
        a.qp.post_send(&[SendWr::new(1, SendOp::Write(bad), &sge).flags(SendFlags::empty())])
            .unwrap()
    };
    assert_eq!(poll_one(&a.cq).status, WcStatus::RemAccessErr);
    let wc = poll_one(&b.cq);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::WrFlushErr));
    assert_eq!((a.qp.state(), b.qp.state()), (QpState::Err, QpState::Err));
}

#[test]
fn cm_connect_accept_disconnect() {
    let server_ctx = Soft::open(DEVICE_NAME).unwrap();
    let addr: std::net::SocketAddr = "10.9.9.9:4791".parse().unwrap();
    let mut listener = server_ctx.listen(addr).unwrap();
    let t = std::thread::spawn(move || {
        let mut c = side(Soft::open(DEVICE_NAME).unwrap(), QpType::Rc);
        let ctx = c._ctx.clone();
        let conn = ctx.connect(
            addr,
            &mut c.qp,
            &QpAttr::default(),
            b"hi",
            std::time::Duration::from_secs(5),
        );
        (
            conn.map(|mut conn| {
                let d = conn.peer_private_data().to_vec();
                let first = conn.poll_event(std::time::Duration::ZERO).unwrap();
                let second = conn.poll_event(std::time::Duration::from_secs(5)).unwrap();
                (d, first, second)
            }),
            c.qp.state(),
        )
    });
    let req = listener.get_request(std::time::Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(req.private_data(), b"hi");
    let mut s = side(server_ctx, QpType::Rc);
    let mut conn = req.accept(&mut s.qp, &QpAttr::default(), b"welcome").unwrap();
    assert_eq!(s.qp.state(), QpState::Rts);
    assert_eq!(conn.poll_event(std::time::Duration::ZERO).unwrap(), Some(CmEvent::Established));
    conn.disconnect().unwrap();
    let (r, _) = t.join().unwrap();
    let (d, first, second) = r.unwrap();
    assert_eq!(d, b"welcome");
    assert_eq!(first, Some(CmEvent::Established));
    assert_eq!(second, Some(CmEvent::Disconnected));
    let ctx = Soft::open(DEVICE_NAME).unwrap();
    let mut c = side(ctx.clone(), QpType::Rc);
    let none: std::net::SocketAddr = "10.9.9.9:1".parse().unwrap();
    let r =
        ctx.connect(none, &mut c.qp, &QpAttr::default(), b"", std::time::Duration::from_secs(1));
    assert!(matches!(r, Err(Error::Rejected { .. })), "{r:?}");
    drop(s.mr);
}

/// Receives of 4 scatter entries (kept in place) and of 6 (kept on the heap) each scatter a
/// send over all their entries, in order.
#[test]
fn receives_scatter_in_order_in_place_and_on_the_heap() {
    let cap = QpCap { max_recv_sge: 8, ..QpCap::default() };
    let (mut a, mut b) = pair_with(QpType::Rc, QpAttr::default(), cap);
    for (wr_id, entries) in [(7u64, 4usize), (8, 6)] {
        let len = 10 * entries - 6;
        let msg: Vec<u8> = (0..len as u8).map(|x| x ^ wr_id as u8).collect();
        a.mr.write_at(0, &msg).unwrap();
        let rsgl: Vec<Sge> = (0..entries).map(|i| b.mr.sge(1000 + 100 * i, 10).unwrap()).collect();
        // SAFETY: both regions outlive the completions polled below.
        unsafe { b.qp.post_recv(&[RecvWr { wr_id, sgl: &rsgl }]).unwrap() };
        let sge = [a.mr.sge(0, len as u32).unwrap()];
        // SAFETY: as above.
        unsafe { a.qp.post_send(&[SendWr::new(1, SendOp::Send, &sge)]).unwrap() };
        assert_eq!(poll_one(&a.cq).status, WcStatus::Success);
        let wc = poll_one(&b.cq);
        assert_eq!((wc.wr_id, wc.status, wc.byte_len), (wr_id, WcStatus::Success, len as u32));
        for (i, chunk) in msg.chunks(10).enumerate() {
            let mut got = vec![0u8; chunk.len()];
            b.mr.read_at(1000 + 100 * i, &mut got).unwrap();
            assert_eq!(got, chunk, "receive {wr_id}, scatter entry {i}");
        }
    }
}

/// A sibling is the same port with its own objects: QPs of two siblings connect by hand and
/// through either sibling's connection manager, and reach each other's memory; objects of two
/// siblings do not combine; a QP of another port (another `Soft::open`) is refused by the
/// connection manager.
#[test]
fn siblings_are_one_device() {
    let cm = Soft::open(DEVICE_NAME).unwrap();
    let (s1, s2) = (cm.open_sibling().unwrap(), cm.open_sibling().unwrap());
    assert_eq!(s1.name(), cm.name());
    assert_eq!(s1.query_gid(1, 0).unwrap(), cm.query_gid(1, 0).unwrap());
    assert_eq!(s1.query_port(1).unwrap().lid, cm.query_port(1).unwrap().lid);
    assert_eq!(s1.query_device().unwrap().node_guid, cm.query_device().unwrap().node_guid);

    // By hand: a write and a read between QPs of the two siblings.
    let (mut a, mut b) = (side(s1.clone(), QpType::Rc), side(s2.clone(), QpType::Rc));
    let (ea, eb) = (s1.endpoint(&a.qp, 1, 0).unwrap(), s2.endpoint(&b.qp, 1, 0).unwrap());
    a.qp.connect_to(eb, &QpAttr::default()).unwrap();
    b.qp.connect_to(ea, &QpAttr::default()).unwrap();
    a.mr.write_at(0, b"sibling").unwrap();
    let sge = [a.mr.sge(0, 7).unwrap()];
    // SAFETY: the regions outlive the completions polled below.
    unsafe { a.qp.post_send(&[SendWr::new(1, SendOp::Write(b.mr.remote(64)), &sge)]).unwrap() };
    assert_eq!(poll_one(&a.cq).status, WcStatus::Success);
    let mut out = [0u8; 7];
    b.mr.read_at(64, &mut out).unwrap();
    assert_eq!(&out, b"sibling");
    let sge = [b.mr.sge(128, 7).unwrap()];
    // SAFETY: as above.
    unsafe { b.qp.post_send(&[SendWr::new(2, SendOp::Read(a.mr.remote(0)), &sge)]).unwrap() };
    assert_eq!(poll_one(&b.cq).status, WcStatus::Success);
    b.mr.read_at(128, &mut out).unwrap();
    assert_eq!(&out, b"sibling");

    // Through the connection manager of `cm`: the connector's QP on s1, the acceptor's on s2.
    let addr: std::net::SocketAddr = "10.9.9.10:4791".parse().unwrap();
    let mut listener = cm.listen(addr).unwrap();
    let mut c = side(s1.clone(), QpType::Rc);
    let mut s = side(s2.clone(), QpType::Rc);
    std::thread::scope(|scope| {
        let cm2 = cm.clone();
        let t = scope.spawn(move || {
            let conn = cm2.connect(
                addr,
                &mut c.qp,
                &QpAttr::default(),
                b"hi",
                std::time::Duration::from_secs(5),
            );
            (conn, c)
        });
        let req = listener.get_request(std::time::Duration::from_secs(5)).unwrap().unwrap();
        let _conn = req.accept(&mut s.qp, &QpAttr::default(), b"welcome").unwrap();
        // (Dropping a connection disconnects it: keep both until the write is done.)
        let (r, mut c) = t.join().unwrap();
        let _peer = r.unwrap();
        c.mr.write_at(0, b"via cm").unwrap();
        let sge = [c.mr.sge(0, 6).unwrap()];
        // SAFETY: the regions outlive the completion polled below.
        unsafe { c.qp.post_send(&[SendWr::new(3, SendOp::Write(s.mr.remote(8)), &sge)]).unwrap() };
        assert_eq!(poll_one(&c.cq).status, WcStatus::Success);
        let mut out = [0u8; 6];
        s.mr.read_at(8, &mut out).unwrap();
        assert_eq!(&out, b"via cm");
    });

    // Objects of two siblings do not combine.
    let pd = s1.alloc_pd().unwrap();
    let cq = s2.create_cq(16).unwrap();
    let attr = QpInitAttr::<Soft> {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        cap: QpCap::default(),
        sq_sig_all: false,
    };
    let r = pd.create_qp(&attr);
    assert!(matches!(r, Err(Error::ForeignObject { what: "send CQ", .. })), "{r:?}");

    // A QP of another port is refused by this port's connection manager, connecting and
    // accepting, with the devices named.
    let other = Soft::open(DEVICE_NAME).unwrap();
    let mut o = side(other.clone(), QpType::Rc);
    let r = cm.connect(addr, &mut o.qp, &QpAttr::default(), b"", std::time::Duration::from_secs(1));
    match r {
        Err(e @ Error::WrongDevice { op: "rdma_connect", .. }) => {
            let text = e.to_string();
            assert!(text.contains(&format!("QP {}", o.qp.qp_num())), "{text}");
        }
        r => panic!("expected WrongDevice, got {r:?}"),
    }
    assert_eq!(o.qp.state(), QpState::Reset, "a refused QP is left alone");
    std::thread::scope(|scope| {
        let t = scope.spawn(|| {
            let mut c = side(s1.clone(), QpType::Rc);
            cm.connect(addr, &mut c.qp, &QpAttr::default(), b"", std::time::Duration::from_secs(5))
                .map(|_| ())
        });
        let req = listener.get_request(std::time::Duration::from_secs(5)).unwrap().unwrap();
        let r = req.accept(&mut o.qp, &QpAttr::default(), b"");
        assert!(matches!(r, Err(Error::WrongDevice { op: "rdma_accept", .. })), "{r:?}");
        // The refused request is rejected, so the connector does not wait in vain.
        let r = t.join().unwrap();
        assert!(matches!(r, Err(Error::Rejected { .. })), "{r:?}");
    });
    drop(other);
}

/// A cut wire (`faults::cut`): a write from either end fails with retry exceeded (the other
/// end's memory untouched), and a disconnect reaches only the side that made it.
#[test]
fn a_cut_wire_delivers_nothing_and_tells_nobody() {
    let server_ctx = Soft::open(DEVICE_NAME).unwrap();
    let addr: std::net::SocketAddr = "10.9.9.77:4791".parse().unwrap();
    let mut listener = server_ctx.listen(addr).unwrap();
    let t = std::thread::spawn(move || {
        let mut c = side(Soft::open(DEVICE_NAME).unwrap(), QpType::Rc);
        let ctx = c._ctx.clone();
        let conn = ctx.connect(
            addr,
            &mut c.qp,
            &QpAttr::default(),
            b"",
            std::time::Duration::from_secs(5),
        );
        (c, conn.unwrap())
    });
    let req = listener.get_request(std::time::Duration::from_secs(5)).unwrap().unwrap();
    let mut s = side(server_ctx, QpType::Rc);
    let mut sconn = req.accept(&mut s.qp, &QpAttr::default(), b"").unwrap();
    let (mut c, mut cconn) = t.join().unwrap();
    // Before the cut, a write arrives.
    c.mr.write_at(0, b"before").unwrap();
    let sge = [c.mr.sge(0, 6).unwrap()];
    // SAFETY: the regions outlive the completions polled below.
    unsafe { c.qp.post_send(&[SendWr::new(1, SendOp::Write(s.mr.remote(0)), &sge)]).unwrap() };
    assert_eq!(poll_one(&c.cq).status, WcStatus::Success);
    assert_eq!(faults::cut(addr), 1);
    c.mr.write_at(0, b"after!").unwrap();
    // SAFETY: as above.
    unsafe { c.qp.post_send(&[SendWr::new(2, SendOp::Write(s.mr.remote(0)), &sge)]).unwrap() };
    assert_eq!(poll_one(&c.cq).status, WcStatus::RetryExcErr);
    let sge = [s.mr.sge(0, 6).unwrap()];
    // SAFETY: as above.
    unsafe { s.qp.post_send(&[SendWr::new(3, SendOp::Write(c.mr.remote(100)), &sge)]).unwrap() };
    assert_eq!(poll_one(&s.cq).status, WcStatus::RetryExcErr);
    let mut out = [0u8; 6];
    s.mr.read_at(0, &mut out).unwrap();
    assert_eq!(&out, b"before");
    let drain = |conn: &mut SoftConnection| {
        while let Some(e) = conn.poll_event(std::time::Duration::ZERO).unwrap() {
            assert_eq!(e, CmEvent::Established);
        }
    };
    drain(&mut sconn);
    drain(&mut cconn);
    sconn.disconnect().unwrap();
    assert_eq!(sconn.poll_event(std::time::Duration::ZERO).unwrap(), Some(CmEvent::Disconnected));
    assert_eq!(cconn.poll_event(std::time::Duration::from_millis(20)).unwrap(), None);
    // A QP reset for reuse is whole again.
    s.qp.modify(&QpAttr { state: QpState::Reset, ..QpAttr::default() }).unwrap();
    assert!(!s.qp.shared.is_cut());
}

/// A fault plan that duplicates every packet: a UD send lands in two receives (RC and UC
/// throw duplicates away by their sequence numbers); one that drops every packet loses UD
/// sends silently (the sender still succeeds).
#[test]
fn a_plans_duplicates_reach_ud_twice_and_its_drops_lose_ud() {
    use crate::wr::UdDest;
    let (mut a, mut b) = pair(QpType::Ud, QpAttr::default());
    let gid = b._ctx.query_gid(1, 0).unwrap();
    let ah_attr = AhAttr { port: 1, dlid: 0, dgid: gid, sgid_index: 0, hop_limit: 64 };
    let ah = a.pd.create_ah(&ah_attr).unwrap();
    let post_recv = |b: &mut Side, id: u64| {
        let sge = [b.mr.sge(0, 4096).unwrap()];
        // SAFETY: the region outlives the receives (it is `b`'s).
        unsafe { b.qp.post_recv(&[RecvWr { wr_id: id, sgl: &sge }]).unwrap() };
    };
    post_recv(&mut b, 1);
    post_recv(&mut b, 2);
    post_recv(&mut b, 3);
    a.qp.set_fault_plan(Some(faults::FaultPlan { seed: 3, dup: 1.0, ..Default::default() }));
    a.mr.write_at(0, b"twice").unwrap();
    let sge = [a.mr.sge(0, 5).unwrap()];
    let dest = UdDest { ah: &ah, qpn: b.qp.qp_num(), qkey: DEFAULT_QKEY };
    // SAFETY: the region outlives the completions polled below.
    unsafe { a.qp.post_send(&[SendWr::new(9, SendOp::Send, &sge).to(dest)]).unwrap() };
    assert_eq!(poll_one(&a.cq).status, WcStatus::Success);
    let (r1, r2) = (poll_one(&b.cq), poll_one(&b.cq));
    assert_eq!((r1.wr_id, r2.wr_id), (1, 2));
    assert_eq!((r1.status, r2.status), (WcStatus::Success, WcStatus::Success));
    a.qp.set_fault_plan(Some(faults::FaultPlan { seed: 3, drop: 1.0, ..Default::default() }));
    let dest = UdDest { ah: &ah, qpn: b.qp.qp_num(), qkey: DEFAULT_QKEY };
    // SAFETY: as above.
    unsafe { a.qp.post_send(&[SendWr::new(10, SendOp::Send, &sge).to(dest)]).unwrap() };
    assert_eq!(poll_one(&a.cq).status, WcStatus::Success);
    let mut wc = [Wc::default(); 1];
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 0, "a dropped UD send takes no receive");
    a.qp.set_fault_plan(None);
}

/// A plan's delay holds RC sends until it has passed and the sender's CQ is polled: nothing
/// reaches the receiver at the post, then all arrive, in order, each completing at the sender
/// with it; a QP that goes to ERR meanwhile flushes what it holds, and none of it arrives.
#[test]
fn a_plans_delay_holds_messages_in_order_and_an_error_flushes_them() {
    let (mut a, mut b) = pair(QpType::Rc, QpAttr::default());
    for id in 1..=3 {
        let sge = [b.mr.sge(id as usize * 64, 64).unwrap()];
        // SAFETY: the region outlives the receives (it is `b`'s).
        unsafe { b.qp.post_recv(&[RecvWr { wr_id: id, sgl: &sge }]).unwrap() };
    }
    let before = faults::counts().delayed;
    a.qp.set_fault_plan(Some(faults::FaultPlan { seed: 1, delay_us: 2_000, ..Default::default() }));
    for id in 1..=3u64 {
        a.mr.write_at(id as usize * 8, &[id as u8; 8]).unwrap();
        let sge = [a.mr.sge(id as usize * 8, 8).unwrap()];
        // SAFETY: the region outlives the completions polled below.
        unsafe { a.qp.post_send(&[SendWr::new(id, SendOp::Send, &sge)]).unwrap() };
    }
    let mut wc = [Wc::default(); 4];
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 0, "held: nothing arrived at the post");
    let sent: Vec<(u64, WcStatus)> =
        (0..3).map(|_| poll_one(&a.cq)).map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(sent, (1..=3).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>());
    for id in 1..=3u64 {
        let r = poll_one(&b.cq);
        assert_eq!((r.wr_id, r.status, r.byte_len), (id, WcStatus::Success, 8), "in order");
        let mut got = [0u8; 8];
        b.mr.read_at(id as usize * 64, &mut got).unwrap();
        assert_eq!(got, [id as u8; 8]);
    }
    assert!(faults::counts().delayed >= before + 3);
    // Held for a second, then the QP errs: both flush, neither arrives.
    a.qp.set_fault_plan(Some(faults::FaultPlan {
        seed: 1,
        delay_us: 1_000_000,
        ..Default::default()
    }));
    for id in 4..=5u64 {
        let sge = [a.mr.sge(0, 8).unwrap()];
        // SAFETY: as above.
        unsafe { a.qp.post_send(&[SendWr::new(id, SendOp::Send, &sge)]).unwrap() };
    }
    a.qp.modify(&QpAttr { state: QpState::Err, ..QpAttr::default() }).unwrap();
    let flushed: Vec<(u64, WcStatus)> =
        (0..2).map(|_| poll_one(&a.cq)).map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(flushed, vec![(4, WcStatus::WrFlushErr), (5, WcStatus::WrFlushErr)]);
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 0, "nothing held reached the receiver");
    a.qp.set_fault_plan(None);
}

/// A plan's reordering (at 50 %, some reordered pair among 64 messages is all but certain):
/// UD messages arrive out of order, each once (a held one goes after the next, or on a later
/// poll of the sender's CQ), while the sender's completions stay in post order; UC loses a
/// message of several packets; RC keeps its order.
#[test]
fn a_plans_reordering_permutes_ud_loses_long_uc_and_keeps_rc_in_order() {
    use crate::wr::UdDest;
    let (mut a, mut b) = pair(QpType::Ud, QpAttr::default());
    let gid = b._ctx.query_gid(1, 0).unwrap();
    let ah_attr = AhAttr { port: 1, dlid: 0, dgid: gid, sgid_index: 0, hop_limit: 64 };
    let ah = a.pd.create_ah(&ah_attr).unwrap();
    const N: u64 = 64;
    for i in 0..N {
        let sge = [b.mr.sge(i as usize * 64, 64).unwrap()];
        // SAFETY: the region outlives the receives (it is `b`'s).
        unsafe { b.qp.post_recv(&[RecvWr { wr_id: i, sgl: &sge }]).unwrap() };
    }
    let before = faults::counts().reordered;
    a.qp.set_fault_plan(Some(faults::FaultPlan { seed: 5, reorder: 0.5, ..Default::default() }));
    for i in 0..N {
        a.mr.write_at(i as usize * 8, &i.to_le_bytes()).unwrap();
        let sge = [a.mr.sge(i as usize * 8, 8).unwrap()];
        let dest = UdDest { ah: &ah, qpn: b.qp.qp_num(), qkey: DEFAULT_QKEY };
        // SAFETY: the region outlives the completions polled below.
        unsafe { a.qp.post_send(&[SendWr::new(i, SendOp::Send, &sge).to(dest)]).unwrap() };
    }
    let sent: Vec<u64> = (0..N).map(|_| poll_one(&a.cq).wr_id).collect();
    assert_eq!(sent, (0..N).collect::<Vec<_>>(), "the sender completes in post order");
    // (the last one held goes on a later poll of the sender's CQ)
    let mut arrived = Vec::new();
    let mut wc = [Wc::default(); 1];
    for _ in 0..10_000 {
        if arrived.len() as u64 == N {
            break;
        }
        let _ = a.cq.poll(&mut wc).unwrap();
        if b.cq.poll(&mut wc).unwrap() == 1 {
            assert_eq!(wc[0].status, WcStatus::Success);
            let mut got = [0u8; 8];
            b.mr.read_at(wc[0].wr_id as usize * 64 + 40, &mut got).unwrap();
            arrived.push(u64::from_le_bytes(got));
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
    let mut sorted = arrived.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..N).collect::<Vec<_>>(), "each once: {arrived:?}");
    assert_ne!(arrived, sorted, "some out of order");
    assert!(faults::counts().reordered > before);
    a.qp.set_fault_plan(None);

    // UC: a message of 4 packets reordered is lost; RC delivers in order.
    let every = faults::FaultPlan { seed: 5, reorder: 1.0, ..Default::default() };
    let attr = QpAttr { path_mtu: Mtu::Mtu1024, ..QpAttr::default() };
    let (mut a, mut b) = pair(QpType::Uc, attr);
    let sge = [b.mr.sge(0, 4096).unwrap()];
    // SAFETY: as above.
    unsafe { b.qp.post_recv(&[RecvWr { wr_id: 1, sgl: &sge }]).unwrap() };
    a.qp.set_fault_plan(Some(every));
    let sge = [a.mr.sge(0, 4096).unwrap()];
    // SAFETY: as above.
    unsafe { a.qp.post_send(&[SendWr::new(1, SendOp::Send, &sge)]).unwrap() };
    assert_eq!(poll_one(&a.cq).status, WcStatus::Success);
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 0, "UC lost the message");
    let (mut a, mut b) = pair(QpType::Rc, QpAttr::default());
    for i in 0..4u64 {
        let sge = [b.mr.sge(i as usize * 64, 64).unwrap()];
        // SAFETY: as above.
        unsafe { b.qp.post_recv(&[RecvWr { wr_id: i, sgl: &sge }]).unwrap() };
    }
    a.qp.set_fault_plan(Some(every));
    for i in 0..4u64 {
        let sge = [a.mr.sge(i as usize * 8, 8).unwrap()];
        // SAFETY: as above.
        unsafe { a.qp.post_send(&[SendWr::new(i, SendOp::Send, &sge)]).unwrap() };
    }
    let rc: Vec<u64> = (0..4).map(|_| poll_one(&b.cq).wr_id).collect();
    assert_eq!(rc, vec![0, 1, 2, 3], "RC in order");
}

/// A plan's `rnr`: an RC send that never finds a receive fails with `RnrRetryExcErr` after the
/// QP's `rnr_retry`, its receive untaken; the plan counts each try.
#[test]
fn a_plans_rnr_storm_exhausts_rc_retries_and_drops_ud() {
    let attr = QpAttr { rnr_retry: 2, min_rnr_timer: 1, ..QpAttr::default() };
    let (mut a, mut b) = pair(QpType::Rc, attr);
    let sge = [b.mr.sge(0, 64).unwrap()];
    // SAFETY: the region outlives the receive (it is `b`'s).
    unsafe { b.qp.post_recv(&[RecvWr { wr_id: 1, sgl: &sge }]).unwrap() };
    let before = faults::counts().rnr_naks;
    a.qp.set_fault_plan(Some(faults::FaultPlan { seed: 4, rnr: 1.0, ..Default::default() }));
    let sge = [a.mr.sge(0, 8).unwrap()];
    // SAFETY: the region outlives the completion polled below.
    unsafe { a.qp.post_send(&[SendWr::new(7, SendOp::Send, &sge)]).unwrap() };
    let wc = poll_one(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::RnrRetryExcErr));
    assert_eq!(faults::counts().rnr_naks, before + 3, "the first try and 2 retries");
    let mut got = [Wc::default(); 1];
    assert_eq!(b.cq.poll(&mut got).unwrap(), 0, "the receive was never taken");
}

/// A send-with-invalidate naming a key that is no window bound through the receiving QP is an
/// invalidation error (class J, as rxe's responder has it): the message was acknowledged (the
/// send succeeds), the receive fails with `RemInvReqErr` and the responder's QP goes to ERR.
/// On UC the operation does not exist: the requester fails it with `LocQpOpErr`.
#[test]
fn send_with_invalidate_of_a_bad_key() {
    let (mut a, mut b) = pair(QpType::Rc, QpAttr::default());
    let rsge = [b.mr.sge(0, 64).unwrap()];
    // SAFETY: the regions outlive the completions polled below.
    unsafe { b.qp.post_recv(&[RecvWr { wr_id: 9, sgl: &rsge }]).unwrap() };
    let sge = [a.mr.sge(0, 8).unwrap()];
    let wr = SendWr::new(1, SendOp::SendWithInv(b.mr.rkey()), &sge);
    // SAFETY: as above.
    unsafe { a.qp.post_send(&[wr]).unwrap() };
    let wc = poll_one(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    let wc = poll_one(&b.cq);
    assert_eq!((wc.wr_id, wc.status, wc.invalidated_rkey), (9, WcStatus::RemInvReqErr, None));
    assert_eq!(b.qp.state(), QpState::Err);

    let (mut a, b) = pair(QpType::Uc, QpAttr::default());
    let sge = [a.mr.sge(0, 8).unwrap()];
    let wr = SendWr::new(2, SendOp::SendWithInv(b.mr.rkey()), &sge);
    // SAFETY: as above.
    unsafe { a.qp.post_send(&[wr]).unwrap() };
    let wc = poll_one(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::LocQpOpErr));
}

/// A plan's `cm_delay_us` makes every connection-manager message that crosses late: the
/// request, the accept, the connector's confirmation and a disconnect each reach the far end
/// no sooner than the delay after they were sent (lower bounds only: a delay cannot be beaten).
#[test]
fn cm_messages_arrive_late_under_a_plan() {
    use std::time::{Duration, Instant};
    let late = Duration::from_millis(30);
    let server_ctx = Soft::open(DEVICE_NAME).unwrap();
    let addr: std::net::SocketAddr = "10.9.9.31:4791".parse().unwrap();
    let plan = faults::FaultPlan { cm_delay_us: 30_000, ..Default::default() };
    faults::plan_at(addr, plan);
    let before = faults::counts().cm_events_delayed;
    let mut listener = server_ctx.listen(addr).unwrap();
    let t = std::thread::spawn(move || {
        let mut c = side(Soft::open(DEVICE_NAME).unwrap(), QpType::Rc);
        let ctx = c._ctx.clone();
        let start = Instant::now();
        let mut conn = ctx
            .connect(addr, &mut c.qp, &QpAttr::default(), b"hi", Duration::from_secs(5))
            .unwrap();
        let connected = start.elapsed();
        assert_eq!(conn.poll_event(Duration::ZERO).unwrap(), Some(CmEvent::Established));
        let asked = Instant::now();
        let ev = conn.poll_event(Duration::from_secs(5)).unwrap();
        (connected, ev, asked)
    });
    let start = Instant::now();
    let req = listener.get_request(Duration::from_secs(5)).unwrap().unwrap();
    let mut s = side(server_ctx, QpType::Rc);
    let accepted = Instant::now();
    let mut conn = req.accept(&mut s.qp, &QpAttr::default(), b"welcome").unwrap();
    assert!(start.elapsed() >= late, "the request came early");
    assert!(accepted.elapsed() >= late, "the confirmation came early");
    let sent = Instant::now();
    conn.disconnect().unwrap();
    let (connected, ev, _) = t.join().unwrap();
    assert_eq!(ev, Some(CmEvent::Disconnected));
    assert!(sent.elapsed() >= late, "the disconnect came early");
    assert!(connected >= 2 * late, "request and accept, each late: {connected:?}");
    assert!(faults::counts().cm_events_delayed >= before + 4);
    faults::clear_at(addr);
}

/// A plan's `cq_overrun` loses send completions as an overrun does: with probability 1 every
/// signalled write's completion is gone and the context raises `IBV_EVENT_CQ_ERR` for each; the
/// writes themselves happened, and the receiver's completions are untouched.
#[test]
fn a_plans_cq_overrun_loses_send_completions_and_raises_cq_err() {
    let (mut a, mut b) = pair(QpType::Rc, QpAttr::default());
    let before = faults::counts().cq_overruns;
    a.qp.set_fault_plan(Some(faults::FaultPlan { seed: 5, cq_overrun: 1.0, ..Default::default() }));
    a.mr.write_at(0, &[7; 8]).unwrap();
    let src = [a.mr.sge(0, 8).unwrap()];
    for i in 0..3u64 {
        let wr = SendWr::new(i, SendOp::Write(b.mr.remote(8 * i as usize)), &src);
        // SAFETY: the region outlives the requests (they execute at post).
        unsafe { a.qp.post_send(&[wr]).unwrap() };
    }
    let mut wc = [Wc::default(); 4];
    assert_eq!(a.cq.poll(&mut wc).unwrap(), 0, "every completion was lost");
    assert_eq!(faults::counts().cq_overruns, before + 3);
    for _ in 0..3 {
        let ev = a._ctx.poll_async_event().unwrap().expect("a CQ error for each");
        assert_eq!(
            ev,
            AsyncEvent { kind: AsyncEventKind::CqErr, element: AsyncElement::Cq(a.cq.handle()) }
        );
    }
    assert_eq!(b.mr.read_u64(16).unwrap(), u64::from_ne_bytes([7; 8]), "the writes happened");
    // The receiving side's own completions are its CQ's: a send still lands there.
    a.qp.set_fault_plan(None);
    let rsge = [b.mr.sge(0, 8).unwrap()];
    // SAFETY: as above.
    unsafe { b.qp.post_recv(&[RecvWr { wr_id: 4, sgl: &rsge }]).unwrap() };
    // SAFETY: as above.
    unsafe { a.qp.post_send(&[SendWr::new(5, SendOp::Send, &src)]).unwrap() };
    assert_eq!(poll_one(&b.cq).wr_id, 4);
    assert_eq!(poll_one(&a.cq).wr_id, 5, "without the plan nothing is lost");
}
