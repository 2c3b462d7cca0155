//! A request's admission on its connection: checked against the peer's receive size, stored
//! in the request slab with what it carries, and queued in its class or made ready
//! (`ready.rs`). `Cx` and `On` submit through it.

use corelink_verbs::{Provider, RemoteAddr, SendOp, Sge, WcStatus};

use super::cfg::WorkerCfg;
use super::conn::Conn;
use super::ids::ReqId;
use super::outbox::Outbox;
use super::ready::{Entry, Wire};
use super::requests::{Carried, Req, Requests};
use super::sched;
use crate::error::EngineError;
use crate::handoff::Origin;
use crate::metrics::Metrics;
use crate::pool::Buf;
use crate::request::{ConnId, Op, OpKind};

/// A request refused before it was queued: the operation and what it carried back, and why.
pub(crate) type Refusal<P, E> = (Op<Buf<P>>, E, EngineError);

/// Stores the request `make` builds from `arg` with what it carries; when the slab is full,
/// everything comes back (the operation made again from `arg` by `back`, `make` unrun) with
/// [`EngineError::TooManyRequests`].
#[allow(clippy::result_large_err)]
#[inline(always)]
fn store<P: Provider, E: Carried, A>(
    reqs: &mut Requests<P>,
    ext: E,
    arg: A,
    make: impl FnOnce(A) -> Req<P>,
    back: impl FnOnce(A) -> Op<Buf<P>>,
) -> Result<ReqId, Refusal<P, E>> {
    reqs.insert_from(ext, arg, make).map_err(|(arg, ext)| {
        let limit = reqs.len();
        (back(arg), ext, EngineError::TooManyRequests { limit })
    })
}

/// An atomic's work request (`op`, just stored as `stored`) if it is made `ready`: on its
/// slot's word.
#[inline(always)]
fn word_wire<P: Provider, E>(
    reqs: &Requests<P>,
    stored: &Result<ReqId, E>,
    ready: bool,
    op: SendOp<'static, P>,
) -> Option<(SendOp<'static, P>, Sge, bool)> {
    let id = *stored.as_ref().ok().filter(|_| ready)?;
    Some((op, reqs.words().sge(id), false))
}

/// What posting a request as it is submitted needs: `Cx`'s submissions have it (a lone request
/// on an idle lane goes at once: `sched::goes_at_once`), `On`'s runs do not (their requests
/// go in the flush's batches).
pub(crate) struct Now<'a, P: Provider> {
    pub(crate) metrics: &'a mut Metrics,
    pub(crate) outbox: &'a mut Outbox<P>,
}

/// Makes `op` a request on connection `c` (id `conn`, open and taking requests), with an
/// external client's vector `ext`, queued in queue `queue` (a class's, [`WorkerCfg::queue`])
/// if one is given, or made ready (`worker/ready.rs`), or with `now`, if it goes at once,
/// posted; returns its id and whether the connection is to be marked dirty (it has requests to
/// post now, or its post failed and it is to close), or everything back with why.
#[allow(clippy::result_large_err, clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn admit<P: Provider, E: Carried>(
    c: &mut Conn<P>,
    reqs: &mut Requests<P>,
    cfg: &WorkerCfg,
    conn: ConnId,
    op: Op<Buf<P>>,
    token: u64,
    origin: Origin,
    ext: E,
    queue: Option<usize>,
    quiet: bool,
    now: Option<Now<'_, P>>,
) -> Result<(ReqId, bool), Refusal<P, E>> {
    if let (Op::Send { buf, .. }, Some(max)) = (&op, c.info.peer_recv_size) {
        if buf.len() > max as usize {
            let len = buf.len();
            return Err((op, ext, EngineError::MessageTooLarge { conn, len, max }));
        }
    }
    // Its class's queue, or (nothing waiting, room on the connection's one lane) made a
    // work request at once, here where its kind is known (`worker/ready.rs`): `ready`; and
    // with `now`, alone on an idle lane, posted at once (`sched::goes_at_once`, which implies
    // the room that `Ready::admits` checks).
    let (ready, at_once) = match (queue, c.lanes.as_slice()) {
        (Some(k), [lane]) => {
            let kind = op.kind();
            // (reads that may merge and writes that may coalesce are the plan's to make)
            let merges = kind == OpKind::Read && cfg.merge_reads;
            let coalesces = cfg.coalesce_writes && matches!(op, Op::Write { imm: None, .. });
            let plain = !merges && !coalesces;
            let at_once = plain && now.is_some() && sched::goes_at_once(c, k);
            let admits = || c.ready.admits(k, kind.is_rd_atomic(), c.waiting.len, &lane.sq, cfg);
            (at_once || (plain && admits()), at_once)
        }
        _ => (false, false),
    };
    let inline = |buf: &Buf<P>| buf.len() <= cfg.max_inline as usize;
    // Each arm has its record built straight into its slot (never copied). Atomics carry no
    // buffer (their old value lands in their slot's word: `Requests::words`); a request moves its
    // buffer's bytes.
    let req = |kind, buf: Option<Buf<P>>, len, remote, imm, arg, swap| Req {
        conn,
        lane: 0,
        kind,
        len,
        buf,
        remote,
        imm,
        arg,
        swap,
        token,
        origin,
        next: None,
        merge_epoch: None,
        quiet,
    };
    let (stored, wire) = match op {
        Op::Write { buf, remote, imm } => {
            let op = imm.map_or(SendOp::Write(remote), |imm| SendOp::WriteWithImm(remote, imm));
            let wire = ready.then(|| (op, buf.sge(false), inline(&buf)));
            let stored = store(
                reqs,
                ext,
                (buf, remote, imm),
                |(buf, remote, imm)| {
                    let len = buf.len() as u32;
                    req(OpKind::Write, Some(buf), len, remote, imm, 0, 0)
                },
                |(buf, remote, imm)| Op::Write { buf, remote, imm },
            );
            (stored, wire)
        }
        Op::Send { buf, imm } => {
            let op = imm.map_or(SendOp::Send, SendOp::SendWithImm);
            let wire = ready.then(|| (op, buf.sge(false), inline(&buf)));
            let stored = store(
                reqs,
                ext,
                (buf, imm),
                |(buf, imm)| {
                    let len = buf.len() as u32;
                    req(OpKind::Send, Some(buf), len, RemoteAddr::default(), imm, 0, 0)
                },
                |(buf, imm)| Op::Send { buf, imm },
            );
            (stored, wire)
        }
        Op::Read { buf, remote } => {
            let wire = ready.then(|| (SendOp::Read(remote), buf.sge(false), false));
            let stored = store(
                reqs,
                ext,
                (buf, remote),
                |(buf, remote)| {
                    let len = buf.len() as u32;
                    req(OpKind::Read, Some(buf), len, remote, None, 0, 0)
                },
                |(buf, remote)| Op::Read { buf, remote },
            );
            (stored, wire)
        }
        // (an atomic's local target is its slot's word, `Requests::words`: known once it is
        // stored)
        Op::FetchAdd { remote, add } => {
            let stored = store(
                reqs,
                ext,
                (),
                |()| req(OpKind::FetchAdd, None, 8, remote, None, add, 0),
                |()| Op::FetchAdd { remote, add },
            );
            let op = SendOp::FetchAdd { remote, add };
            let wire = word_wire(reqs, &stored, ready, op);
            (stored, wire)
        }
        Op::CompareSwap { remote, compare, swap } => {
            let stored = store(
                reqs,
                ext,
                (),
                |()| req(OpKind::CompareSwap, None, 8, remote, None, compare, swap),
                |()| Op::CompareSwap { remote, compare, swap },
            );
            let op = SendOp::CompareSwap { remote, compare, swap };
            let wire = word_wire(reqs, &stored, ready, op);
            (stored, wire)
        }
    };
    let id = stored?;
    let Some(k) = queue else { return Ok((id, false)) };
    if let Some((op, sge, inline)) = wire {
        if let (true, Some(now), [lane]) = (at_once, now, c.lanes.as_mut_slice()) {
            let (w, m, o) = (&mut c.waiting, now.metrics, now.outbox);
            let wire = Wire { id, op, sge, inline, quiet };
            let posted = sched::post_lone(wire, lane, w, reqs, m, o, cfg);
            if !posted {
                c.note_error(WcStatus::GeneralErr);
            }
            return Ok((id, !posted));
        }
        c.ready.push(k, Entry::new(Wire { id, op, sge, inline, quiet }));
        Ok((id, c.ready.len() == 1))
    } else {
        c.waiting.queues[k].push(reqs.slab_mut(), id);
        c.waiting.len += 1;
        Ok((id, c.waiting.len == 1))
    }
}
