//! Latency tests on verbs, one request at a time on one queue pair, each timed:
//! - `send_lat`: a send ping-pong; the server answers each receive with a send of the same size.
//! - `write_lat`: an RDMA-write ping-pong, as perftest's: each side polls the last byte of its
//!   region until the peer's write of the iteration's value lands there, then writes back.
//! - `read_lat`, `atomic_lat`: one read (fetch-and-add) and its completion.
//!
//! A sample is the whole round trip; the report divides it as `Test::lat_divisor` says
//! (half for the ping-pongs).

use std::net::TcpStream;
use std::time::Instant;

use corelink_verbs::DEFAULT_QKEY;
use corelink_verbs::{Cq, Mr, Provider, Qp, SendFlags, SendOp, SendWr, Sge, UdDest, Wc};

use super::bw::Measured;
use super::guard::{retire, retire_until, Guard, Idle};
use super::plan::{Plan, LAT_SQ_SLACK};
use super::setup::Side;
use super::wire::{poll_ctl, Ctl, Info};
use crate::perf::clock::Clock;
use crate::perf::opts::Verb;
use crate::perf::phase;

/// Where the ping-pong of writes of `size` bytes watches: the 8-byte word holding the last
/// byte, and that byte's shift in it.
fn watch(size: usize) -> (usize, u32) {
    let last = size.max(1) - 1;
    (last & !7, 8 * (last % 8) as u32)
}

/// The byte `watch` names, read atomically.
fn watched<M: Mr>(mr: &M, (off, shift): (usize, u32)) -> Result<u8, String> {
    mr.read_u64(off).map(|w| (w >> shift) as u8).map_err(|e| format!("reading the region: {e}"))
}

/// The value iteration `i` writes into the watched byte (never 0, never the previous one).
fn mark(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Clears the byte the write ping-pong of `size` watches, before it starts.
pub fn clear_watch<M: Mr>(mr: &M, size: usize) -> Result<(), String> {
    mr.write_u64(watch(size).0, 0).map_err(|e| format!("clearing the region: {e}"))
}

/// Posts one request on queue pair 0 (signalled), to the peer's QP 0 on UD.
fn post_one<P: Provider>(
    s: &mut Side<P>,
    peer: &Info,
    op: SendOp<'_, P>,
    sge: Sge,
    inline: bool,
) -> Result<(), String> {
    let flags = if inline { SendFlags::SIGNALED | SendFlags::INLINE } else { SendFlags::SIGNALED };
    let sgl = [sge];
    let mut wr = SendWr::new(0, op, &sgl).flags(flags);
    if let Some(ah) = s.ah.as_ref() {
        wr = wr.to(UdDest { ah, qpn: peer.qps[0].0, qkey: DEFAULT_QKEY });
    }
    let qp = s.qps.first_mut().ok_or("no queue pair")?;
    // SAFETY: the gather/scatter entry lies inside `src` (built by `Mr::sge`), which the same
    // `Side` drops after its queue pairs, so the buffer outlives the request; nothing holds a
    // Rust reference into the region.
    unsafe { qp.post_send(&[wr]) }.map_err(|e| format!("post_send: {e}"))
}

/// Waits for one completion on `cq`, checking `g` while idle ([`Idle`]).
fn wait_one<C: Cq>(cq: &C, g: &Guard, what: &str) -> Result<Wc, String> {
    let mut wc = [Wc::default(); 1];
    let mut idle = Idle::default();
    loop {
        if cq.poll(&mut wc).map_err(|e| format!("polling a CQ: {e}"))? == 1 {
            corelink_engine::bench_support::tail_mark();
            if !wc[0].status.is_success() {
                return Err(format!("{what} completed with {}", wc[0].status));
            }
            return Ok(wc[0]);
        }
        if let Some(since) = idle.due() {
            g.check(since, what)?;
        }
    }
}

/// The client of a latency test at `size`.
pub fn client<P: Provider>(
    s: &mut Side<P>,
    peer: &Info,
    plan: &Plan,
    size: usize,
    g: &Guard,
) -> Result<Measured, String> {
    let verb = plan.test.verb();
    let elem = plan.elem(size);
    let sge = s.src.sge(0, elem as u32).map_err(|e| format!("a {elem} B buffer: {e}"))?;
    let inline =
        matches!(verb, Verb::Send | Verb::Write) && plan.inline > 0 && size <= plan.inline as usize;
    let remote = peer.region.at(0);
    let want = if plan.duration.is_some() { 1 << 20 } else { plan.iters.min(1 << 24) as usize };
    let mut samples = Vec::with_capacity(want);
    let w = watch(size);
    let (mut outstanding, mut wcs) = (0usize, [Wc::default(); 16]);
    // Samples in ticks of the time-stamp counter, as perftest's (made nanoseconds at the end).
    let clock = Clock::new();
    phase::timed_phase_begin(size);
    let start = Instant::now();
    let deadline = plan.duration.map(|d| clock.ticks().wrapping_add(clock.ticks_for(d)));
    let mut i = 0u64;
    loop {
        let t0 = clock.ticks();
        if deadline.map_or(i >= plan.iters, |d| t0 >= d) {
            break;
        }
        match verb {
            Verb::Send => {
                post_one(s, peer, SendOp::Send, sge, inline)?;
                // (its completion retired while the answer is on its way, as perftest's)
                outstanding += 1;
                outstanding -= retire(&s.scq, &mut wcs, plan.test.name())?.min(outstanding);
                let wc = wait_one(&s.rcq, g, "the answer to a send")?;
                let (qp, slot) = s.recv_origin(wc.wr_id);
                s.post_recv(qp, slot)?;
            }
            Verb::Write => {
                let v = mark(i);
                s.src.write_at(size - 1, &[v]).map_err(|e| format!("the buffer: {e}"))?;
                post_one(s, peer, SendOp::Write(remote), sge, inline)?;
                outstanding += 1;
                outstanding -= retire(&s.scq, &mut wcs, plan.test.name())?.min(outstanding);
                let mut idle = Idle::default();
                while watched(&s.dst, w)? != v {
                    if let Some(since) = idle.due() {
                        g.check(since, "the answer to a write")?;
                    }
                }
            }
            Verb::Read | Verb::Atomic => {
                let op = match verb {
                    Verb::Read => SendOp::Read(remote),
                    _ => SendOp::FetchAdd { remote, add: 1 },
                };
                post_one(s, peer, op, sge, false)?;
                wait_one(&s.scq, g, "a request")?;
            }
        }
        samples.push(clock.ticks().wrapping_sub(t0));
        i += 1;
        retire_until(&s.scq, &mut outstanding, LAT_SQ_SLACK / 2, g, plan.test.name())?;
    }
    let elapsed = start.elapsed();
    phase::timed_phase_end(size);
    clock.to_ns(&mut samples);
    retire_until(&s.scq, &mut outstanding, 0, g, plan.test.name())?;
    Ok(Measured { iterations: samples.len() as u64, elapsed, peak_rate: 0.0, samples })
}

/// The server of `send_lat` and `write_lat` at `size`: answers each message until the
/// client's [`Ctl::End`]; returns how many it answered.
pub fn answer<P: Provider>(
    s: &mut Side<P>,
    sock: &mut TcpStream,
    peer: &Info,
    plan: &Plan,
    size: usize,
    g: &Guard,
) -> Result<u64, String> {
    let write = plan.test.verb() == Verb::Write;
    let sge = s.src.sge(0, size as u32).map_err(|e| format!("a {size} B buffer: {e}"))?;
    let inline = plan.inline > 0 && size <= plan.inline as usize;
    let w = watch(size);
    let (mut outstanding, mut wcs, mut rwc) = (0usize, [Wc::default(); 16], [Wc::default(); 1]);
    let (mut answered, mut idle) = (0u64, Idle::default());
    loop {
        let arrived = if write {
            watched(&s.dst, w)? == mark(answered)
        } else {
            let n = s.rcq.poll(&mut rwc).map_err(|e| format!("polling the receive CQ: {e}"))?;
            if n == 1 {
                corelink_engine::bench_support::tail_mark();
                if !rwc[0].status.is_success() {
                    return Err(format!("a receive completed with {}", rwc[0].status));
                }
                let (qp, slot) = s.recv_origin(rwc[0].wr_id);
                s.post_recv(qp, slot)?;
            }
            n == 1
        };
        if !arrived {
            if let Some(since) = idle.due() {
                match poll_ctl(sock)? {
                    Some(Ctl::End(_)) => break,
                    Some(c) => return Err(format!("an unexpected {c:?} during the test")),
                    None => g.check(since, "the client's messages")?,
                }
            }
            continue;
        }
        idle.reset();
        let op = if write {
            let v = mark(answered);
            s.src.write_at(size - 1, &[v]).map_err(|e| format!("the buffer: {e}"))?;
            SendOp::Write(peer.region.at(0))
        } else {
            SendOp::Send
        };
        post_one(s, peer, op, sge, inline)?;
        answered += 1;
        outstanding += 1;
        outstanding -= retire(&s.scq, &mut wcs, plan.test.name())?.min(outstanding);
        retire_until(&s.scq, &mut outstanding, LAT_SQ_SLACK / 2, g, plan.test.name())?;
    }
    retire_until(&s.scq, &mut outstanding, 0, g, plan.test.name())?;
    Ok(answered)
}
