//! The connection manager: listen, connect with private data both ways, traffic, disconnect
//! seen by the peer; connecting where nothing listens; a rejected request; a waiter over
//! several objects.

use std::time::{Duration, Instant};

use corelink_verbs::{
    AccessFlags, CmEvent, CmWaiter, ConnRequest, Connecting, Connection, Context, Error, Listener,
    Mr, Progress, Provider, Qp, QpAttr, QpCap, QpState, QpType, RemoteRegion, SendOp, SendWr,
    WcOpcode, WcStatus,
};

use crate::expect;
use crate::harness::*;
use crate::{ensure, ensure_eq, CaseResult, Target};

const TIMEOUT: Duration = Duration::from_secs(5);

/// Waits for the next request on `l`.
fn request<P: Provider>(l: &mut P::Listener) -> Result<P::ConnRequest, String> {
    l.get_request(TIMEOUT)
        .ctx("get_request")?
        .ok_or_else(|| format!("no connection request within {TIMEOUT:?}"))
}

/// Listens on `t`'s CM address with a free port (port 0: the provider picks one, so that cases
/// running in parallel never share an address).
fn listen<P: Provider>(t: &Target, d: &Dev<P>) -> Result<P::Listener, String> {
    let addr = d.cm_addr(t, 0)?;
    let l = d.ctx.listen(addr).ctx(&format!("listen on {addr}"))?;
    let got = l.local_addr();
    ensure!(
        got.port() != 0,
        "a listener on port 0 reports port 0 ({got}): no free port was picked"
    );
    Ok(l)
}

/// B listens; A connects an RC QP with its region in the private data; B (on another thread)
/// accepts with its own region; A writes into B's region using the address from the private
/// data, then sends; B sees both; A disconnects and B sees `Disconnected`.
pub fn cm_connect_send_disconnect<P: Provider>(t: &Target) -> CaseResult {
    let padded = expect::get::<P>(t).cm_private_data_padded;
    let (da, db) = devs::<P>(t)?;
    let asrc = da.mr(256, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let data = fill(&asrc, 31)?;
    let bdst = db.mr(256, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let brecv = db.mr(256, AccessFlags::LOCAL_WRITE)?;
    let (acq, bcq) = (da.cq(64)?, db.cq(64)?);
    let mut aqp = da.qp(QpType::Rc, &acq, &acq, None, QpCap::default(), true)?;
    let mut bqp = db.qp(QpType::Rc, &bcq, &bcq, None, QpCap::default(), true)?;
    let mut listener = listen(t, &db)?;
    let addr = listener.local_addr();
    let (a_region, b_region) = (asrc.region(), bdst.region());
    let b_attr = db.attr();

    let mut b_side = |bqp: &mut P::Qp| -> CaseResult {
        let req = request::<P>(&mut listener)?;
        check_private_data(
            req.private_data(),
            &a_region.to_bytes(),
            padded,
            "connector's private data",
        )?;
        bqp.modify(&QpAttr { state: QpState::Init, ..b_attr }).ctx("accepting QP to INIT")?;
        // SAFETY: `brecv` is declared before the QP and so outlives it.
        unsafe { recv::<P>(bqp, 7, &brecv, 256) }?;
        let mut conn = req.accept(bqp, &b_attr, &b_region.to_bytes()).ctx("accept")?;
        check_private_data(
            conn.peer_private_data(),
            &a_region.to_bytes(),
            padded,
            "accepted connection's peer data",
        )?;
        ensure_eq!(bqp.state(), QpState::Rts, "accepted QP's state");
        let r = poll_one(&bcq, "the receive of A's send")?;
        check_wc(&r, 7, WcStatus::Success, WcOpcode::Recv)?;
        ensure_eq!(r.imm, Some(0x5eed), "immediate of A's send");
        check_bytes(&brecv, 0, &data[..64], "A's send")?;
        check_bytes(&bdst, 0, &data[64..192], "A's write into B's region")?;
        let deadline = Instant::now() + TIMEOUT;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match conn.poll_event(left.min(Duration::from_millis(100))).ctx("poll_event")? {
                Some(CmEvent::Disconnected) => return Ok(()),
                Some(ev) => seen.push(ev),
                None if left.is_zero() => {
                    return Err(format!(
                        "B saw no Disconnected within {TIMEOUT:?} (events: {seen:?})"
                    ))
                }
                None => {}
            }
        }
    };

    std::thread::scope(|s| {
        let b = s.spawn(|| b_side(&mut bqp));
        let a = (|| -> CaseResult {
            let mut conn = da
                .ctx
                .connect(addr, &mut aqp, &da.attr(), &a_region.to_bytes(), TIMEOUT)
                .ctx(&format!("connect to {addr}"))?;
            ensure_eq!(aqp.state(), QpState::Rts, "connected QP's state");
            check_private_data(
                conn.peer_private_data(),
                &b_region.to_bytes(),
                padded,
                "acceptor's private data",
            )?;
            let peer = RemoteRegion::from_bytes(conn.peer_private_data())
                .ok_or("acceptor's private data is too short for a RemoteRegion")?;
            ensure_eq!(peer, b_region, "region parsed from the acceptor's private data");
            let wsgl = [sge(&asrc, 64, 128)?];
            // SAFETY: `asrc` outlives the completion, which `exec` polls.
            let wc = unsafe {
                exec::<P>(&mut aqp, &acq, SendWr::new(1, SendOp::Write(peer.at(0)), &wsgl))
            }?;
            check_wc(&wc, 1, WcStatus::Success, WcOpcode::RdmaWrite)?;
            let ssgl = [sge(&asrc, 0, 64)?];
            // SAFETY: as above.
            let wc = unsafe {
                exec::<P>(&mut aqp, &acq, SendWr::new(2, SendOp::SendWithImm(0x5eed), &ssgl))
            }?;
            check_wc(&wc, 2, WcStatus::Success, WcOpcode::Send)?;
            conn.disconnect().ctx("disconnect")?;
            ensure_eq!(aqp.state(), QpState::Err, "QP state after disconnect");
            Ok(())
        })();
        let b = b.join().map_err(|_| "B's thread panicked".to_string())?;
        a.map_err(|e| format!("A: {e}"))?;
        b.map_err(|e| format!("B: {e}"))
    })
}

/// Connecting to an address where nothing listens fails with `Rejected` or `Unreachable`,
/// not a timeout.
pub fn cm_no_listener<P: Provider>(t: &Target) -> CaseResult {
    let (da, db) = devs::<P>(t)?;
    let cq = da.cq(16)?;
    let mut qp = da.qp(QpType::Rc, &cq, &cq, None, QpCap::default(), true)?;
    let addr = listen(t, &db)?.local_addr(); // the listener is dropped at once
    let start = Instant::now();
    let res = da.ctx.connect(addr, &mut qp, &da.attr(), b"anyone?", TIMEOUT);
    let took = start.elapsed();
    match res {
        Err(Error::Rejected { .. } | Error::Unreachable { .. }) => Ok(()),
        Err(e) => Err(format!("connect to {addr} with no listener: expected Rejected or Unreachable, got {} after {took:?}", chain(&e))),
        Ok(_) => Err(format!("connect to {addr} with no listener succeeded")),
    }
}

/// A rejected request: the connector gets `Rejected` with the rejecter's private data.
pub fn cm_reject<P: Provider>(t: &Target) -> CaseResult {
    let padded = expect::get::<P>(t).cm_private_data_padded;
    let (da, db) = devs::<P>(t)?;
    let cq = da.cq(16)?;
    let mut qp = da.qp(QpType::Rc, &cq, &cq, None, QpCap::default(), true)?;
    let mut listener = listen(t, &db)?;
    let addr = listener.local_addr();
    std::thread::scope(|s| {
        let b = s.spawn(|| -> CaseResult {
            let req = request::<P>(&mut listener)?;
            check_private_data(
                req.private_data(),
                b"let me in",
                padded,
                "connector's private data",
            )?;
            req.reject(b"go away").ctx("reject")
        });
        let res = da.ctx.connect(addr, &mut qp, &da.attr(), b"let me in", TIMEOUT);
        b.join().map_err(|_| "B's thread panicked".to_string())?.map_err(|e| format!("B: {e}"))?;
        match res {
            Err(Error::Rejected { addr: got, private_data }) => {
                ensure_eq!(got, addr, "address in Rejected");
                check_private_data(&private_data, b"go away", padded, "rejecter's private data")
            }
            Err(e) => Err(format!("expected Error::Rejected, got {}", chain(&e))),
            Ok(_) => Err("a rejected connect succeeded".to_string()),
        }
    })
}

/// One waiter over two listeners and a connect in progress to the first: it wakes for the
/// connect request, says that the first listener may have an event, and (where the provider
/// can tell, `Expect::cm_waiter_exact`) that the second, which has none, does not.
pub fn cm_waiter_ready<P: Provider>(t: &Target) -> CaseResult {
    let expect = expect::get::<P>(t);
    let (da, db) = devs::<P>(t)?;
    let cq = da.cq(16)?;
    let mut qp = da.qp(QpType::Rc, &cq, &cq, None, QpCap::default(), true)?;
    let mut wanted = listen(t, &db)?;
    let idle = listen(t, &db)?;
    let mut waiter = P::cm_waiter().ctx("cm_waiter")?;
    let mut connecting = Some(
        da.ctx
            .connect_start(wanted.local_addr(), &mut qp, &da.attr(), b"knock", TIMEOUT)
            .ctx("connect_start")?,
    );
    let deadline = Instant::now() + TIMEOUT;
    loop {
        ensure!(Instant::now() < deadline, "no connect request came within {TIMEOUT:?}");
        let mut watched = vec![wanted.watch(), idle.watch()];
        watched.extend(connecting.as_ref().map(|c| c.watch()));
        waiter.wait(&watched, Duration::from_millis(50)).ctx("wait")?;
        // The connect's steps before the request (address, route) as their events come.
        if connecting.as_ref().is_some_and(|c| waiter.ready(c.watch())) {
            let Some(c) = connecting.take() else { continue };
            match c.poll(&mut qp, Duration::ZERO).ctx("connect's poll")? {
                Progress::Pending(c) => connecting = Some(c),
                Progress::Ready(_) => return Err("connected with nobody accepting".into()),
            }
        }
        if !waiter.ready(wanted.watch()) {
            continue;
        }
        let Some(req) = wanted.get_request(Duration::ZERO).ctx("get_request")? else {
            continue; // (ready says "may have")
        };
        check_private_data(
            req.private_data(),
            b"knock",
            expect.cm_private_data_padded,
            "connector's private data",
        )?;
        if expect.cm_waiter_exact {
            ensure!(
                !waiter.ready(idle.watch()),
                "the waiter says a listener with no request may have an event"
            );
        }
        return req.reject(b"").ctx("reject");
    }
}
