//! A request's admission on its connection: checked against the peer's receive size, stored
//! in the request slab with what it carries, and queued in its class or made ready
//! (`ready.rs`). `Cx` and `On` submit through it.

use corelink_verbs::{Provider, RemoteAddr, SendOp, Sge};

use super::cfg::WorkerCfg;
use super::conn::Conn;
use super::ids::ReqId;
use super::ready::Entry;
use super::requests::{Carried, Req, Requests};
use crate::error::EngineError;
use crate::handoff::Origin;
use crate::pool::{Buf, Pool};
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

/// Makes `op` a request on connection `c` (id `conn`, open and taking requests), with an
/// external client's vector `ext`, queued in queue `queue` (a class's, [`WorkerCfg::queue`])
/// if one is given, or made ready
/// (`worker/ready.rs`); returns its id and whether it is the first the connection has to post
/// (the connection is then to be marked dirty), or everything back with why.
#[allow(clippy::result_large_err, clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn admit<P: Provider, E: Carried>(
    c: &mut Conn<P>,
    reqs: &mut Requests<P>,
    pool: &Pool<P>,
    cfg: &WorkerCfg,
    conn: ConnId,
    op: Op<Buf<P>>,
    token: u64,
    origin: Origin,
    ext: E,
    queue: Option<usize>,
    quiet: bool,
) -> Result<(ReqId, bool), Refusal<P, E>> {
    if let (Op::Send { buf, .. }, Some(max)) = (&op, c.info.peer_recv_size) {
        if buf.len() > max as usize {
            let len = buf.len();
            return Err((op, ext, EngineError::MessageTooLarge { conn, len, max }));
        }
    }
    // Its class's queue, or (nothing waiting, room on the connection's one lane) made a
    // work request at once, here where its kind is known (`worker/ready.rs`): `ready`.
    let ready = match (queue, c.lanes.as_slice()) {
        (Some(k), [lane]) => {
            let kind = op.kind();
            // (reads that may merge and writes that may coalesce are the plan's to make)
            let merges = kind == OpKind::Read && cfg.merge_reads;
            let coalesces = cfg.coalesce_writes && matches!(op, Op::Write { imm: None, .. });
            !merges
                && !coalesces
                && c.ready.admits(k, kind.is_rd_atomic(), c.waiting.len, &lane.sq, cfg)
        }
        _ => false,
    };
    let inline = |buf: &Buf<P>| buf.len() <= cfg.max_inline as usize;
    // Each arm has its record built straight into its slot (never copied). Atomics get an
    // 8-byte buffer for the old value (taken in their own arms, so that other requests
    // carry no buffer to drop); a request moves its buffer's bytes.
    let req = |kind, buf: Buf<P>, remote, imm, arg, swap| Req {
        conn,
        lane: 0,
        kind,
        len: buf.len() as u32,
        buf: Some(buf),
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
                |(buf, remote, imm)| req(OpKind::Write, buf, remote, imm, 0, 0),
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
                |(buf, imm)| req(OpKind::Send, buf, RemoteAddr::default(), imm, 0, 0),
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
                |(buf, remote)| req(OpKind::Read, buf, remote, None, 0, 0),
                |(buf, remote)| Op::Read { buf, remote },
            );
            (stored, wire)
        }
        Op::FetchAdd { remote, add } => match pool.get(8) {
            Ok(b) => {
                let op = SendOp::FetchAdd { remote, add };
                let wire = ready.then(|| (op, Sge { length: 8, ..b.sge(true) }, false));
                let stored = store(
                    reqs,
                    ext,
                    b,
                    |b| req(OpKind::FetchAdd, b, remote, None, add, 0),
                    |_| Op::FetchAdd { remote, add },
                );
                (stored, wire)
            }
            Err(e) => return Err((Op::FetchAdd { remote, add }, ext, e)),
        },
        Op::CompareSwap { remote, compare, swap } => match pool.get(8) {
            Ok(b) => {
                let op = SendOp::CompareSwap { remote, compare, swap };
                let wire = ready.then(|| (op, Sge { length: 8, ..b.sge(true) }, false));
                let stored = store(
                    reqs,
                    ext,
                    b,
                    |b| req(OpKind::CompareSwap, b, remote, None, compare, swap),
                    |_| Op::CompareSwap { remote, compare, swap },
                );
                (stored, wire)
            }
            Err(e) => return Err((Op::CompareSwap { remote, compare, swap }, ext, e)),
        },
    };
    let id = stored?;
    let Some(k) = queue else { return Ok((id, false)) };
    if let Some((op, sge, inline)) = wire {
        c.ready.push(k, Entry::new(id, op, sge, inline, quiet));
        Ok((id, c.ready.len() == 1))
    } else {
        c.waiting.queues[k].push(reqs.slab_mut(), id);
        c.waiting.len += 1;
        Ok((id, c.waiting.len == 1))
    }
}
