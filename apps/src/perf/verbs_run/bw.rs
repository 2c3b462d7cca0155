//! Bandwidth tests on verbs: the client keeps a window of requests in flight on each queue
//! pair (round robin), posting up to `-l` per `post_send` call and asking for a completion on
//! one request in `-Q` (and on each queue pair's last), and counts the rest as retired by the
//! next signalled one; the receiving server of `send_bw` reposts each receive as it completes.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use corelink_verbs::{
    Cq, Mr, Provider, Qp, SendFlags, SendOp, SendWr, Sge, UdDest, Wc, DEFAULT_QKEY,
};

use super::guard::{Guard, Idle};
use super::plan::Plan;
use super::setup::Side;
use super::wire::{poll_ctl, Ctl, Info};
use crate::perf::clock::{Clock, Peak};
use crate::perf::opts::Verb;
use crate::perf::phase;

/// What the client measured at one size.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Messages completed.
    pub iterations: u64,
    /// From the first post to the last completion.
    pub elapsed: Duration,
    /// Best messages per second over an interval of at least
    /// [`PEAK_INTERVAL`](crate::perf::engine_run::PEAK_INTERVAL).
    pub peak_rate: f64,
    /// Latency tests: each round trip, in ns.
    pub samples: Vec<u64>,
}

/// One queue pair's progress.
#[derive(Debug, Clone, Copy, Default)]
struct QpRun {
    quota: u64,
    posted: u64,
    outstanding: usize,
    unsignalled: usize,
    done: bool,
}

/// The client of `write_bw`, `read_bw`, `send_bw` and `atomic_bw` at `size` (and of `baseline
/// raw_write`): the loop that posts and polls, on the client thread. Not inlined, so that a
/// profiler can single it out (`valgrind --tool=callgrind --toggle-collect='*verbs_run::bw::client*'`).
#[inline(never)]
pub fn client<P: Provider>(
    s: &mut Side<P>,
    peer: &Info,
    plan: &Plan,
    size: usize,
    g: &Guard,
) -> Result<Measured, String> {
    let verb = plan.test.verb();
    let window = plan.window(size);
    let cq_mod = plan.cq_mod.clamp(1, window);
    let list = plan.post_list.clamp(1, window);
    let elem = plan.elem(size);
    let slots = plan.slots(size);
    let remote_slots = match verb {
        Verb::Atomic => 1,
        _ => (peer.region.len as usize / elem).max(1),
    };
    let inline = plan.inline > 0 && size <= plan.inline as usize;
    let flags = match verb {
        Verb::Send | Verb::Write if inline => SendFlags::INLINE,
        _ => SendFlags::empty(),
    };
    let Side { qps, ah, scq, src, .. } = s;
    let sges = (0..slots)
        .map(|i| src.sge(i * elem, elem as u32))
        .collect::<Result<Vec<Sge>, _>>()
        .map_err(|e| format!("a {elem} B buffer: {e}"))?;
    let ah = ah.as_ref();
    let q = qps.len() as u64;
    let timed = plan.duration.is_none();
    let mut runs: Vec<QpRun> = (0..q)
        .map(|k| {
            let quota = plan.iters / q + u64::from(k < plan.iters % q);
            QpRun { quota, done: timed && quota == 0, ..QpRun::default() }
        })
        .collect();
    let mut wrs: Vec<SendWr<'_, P>> = Vec::with_capacity(list);
    let mut wcs = [Wc::default(); 32];
    phase::timed_phase_begin(size);
    let start = Instant::now();
    let deadline = plan.duration.map(|d| start + d);
    let (mut closing, mut slot, mut completed) = (false, 0usize, 0u64);
    // The peak rate on the tick clock, as the engine's client samples it (no OS clock read on
    // the loop's path).
    let clock = Clock::new();
    let mut peak = Peak::new(clock, clock.ticks());
    let mut idle = Idle::default();
    loop {
        if deadline.is_some_and(|d| !closing && Instant::now() >= d) {
            closing = true;
        }
        for (k, r) in runs.iter_mut().enumerate() {
            let room = window - r.outstanding;
            if r.done || room == 0 {
                continue;
            }
            // How many to post now; once a -D run is over, one signalled request retires the
            // queue pair's unsignalled tail.
            let n = match (closing, timed) {
                (true, _) if r.unsignalled == 0 => {
                    r.done = true;
                    continue;
                }
                (true, _) => 1,
                (false, true) => list.min(room).min((r.quota - r.posted) as usize),
                (false, false) => list.min(room),
            };
            wrs.clear();
            for j in 0..n {
                let last = closing || (timed && r.posted + j as u64 + 1 == r.quota);
                let remote = peer.region.at(((slot % remote_slots) * elem) as u64);
                let op = match verb {
                    Verb::Write => SendOp::Write(remote),
                    Verb::Read => SendOp::Read(remote),
                    Verb::Send => SendOp::Send,
                    Verb::Atomic => SendOp::FetchAdd { remote, add: 1 },
                };
                let (wr_id, f) = if last || r.unsignalled + 1 == cq_mod {
                    let id = ((k as u64) << 32) | (r.unsignalled as u64 + 1);
                    r.unsignalled = 0;
                    (id, flags | SendFlags::SIGNALED)
                } else {
                    r.unsignalled += 1;
                    (0, flags)
                };
                let mut wr = SendWr::new(wr_id, op, std::slice::from_ref(&sges[slot % slots]));
                wr = wr.flags(f);
                if let Some(ah) = ah {
                    wr = wr.to(UdDest { ah, qpn: peer.qps[k].0, qkey: DEFAULT_QKEY });
                }
                wrs.push(wr);
                slot += 1;
            }
            // SAFETY: every gather/scatter entry lies inside `src` (built by `Mr::sge`), a field
            // of the same `Side` as the queue pairs and dropped after them, so the buffers
            // outlive the requests; nothing holds a Rust reference into the region.
            unsafe { qps[k].post_send(&wrs) }
                .map_err(|e| format!("post_send of {n} request(s) on QP {k}: {e}"))?;
            r.posted += n as u64;
            r.outstanding += n;
            if closing || (timed && r.posted == r.quota) {
                r.done = true;
            }
        }
        let got = scq.poll(&mut wcs).map_err(|e| format!("polling the send CQ: {e}"))?;
        if got > 0 {
            for wc in &wcs[..got] {
                if !wc.status.is_success() {
                    return Err(format!("a {size} B request completed with {}", wc.status));
                }
                let n = (wc.wr_id & 0xffff_ffff) as usize;
                if let Some(r) = runs.get_mut((wc.wr_id >> 32) as usize) {
                    r.outstanding = r.outstanding.saturating_sub(n);
                }
                completed += n as u64;
            }
            idle.reset();
            peak.sample(clock.ticks(), completed);
        } else if let Some(since) = idle.due() {
            g.check(since, "send completions")?;
        }
        if runs.iter().all(|r| r.done && r.outstanding == 0) {
            break;
        }
    }
    let elapsed = start.elapsed();
    phase::timed_phase_end(size);
    Ok(Measured { iterations: completed, elapsed, peak_rate: peak.rate(), samples: Vec::new() })
}

/// The server of `send_bw`: reposts each receive as it completes until the client's
/// [`Ctl::End`]; returns how many messages arrived.
pub fn receive<P: Provider>(
    s: &mut Side<P>,
    sock: &mut TcpStream,
    g: &Guard,
) -> Result<u64, String> {
    let mut wcs = [Wc::default(); 32];
    let (mut got, mut idle) = (0u64, Idle::default());
    loop {
        let n = s.rcq.poll(&mut wcs).map_err(|e| format!("polling the receive CQ: {e}"))?;
        if n == 0 {
            if let Some(since) = idle.due() {
                match poll_ctl(sock)? {
                    Some(Ctl::End(_)) => return Ok(got),
                    Some(c) => return Err(format!("an unexpected {c:?} during send_bw")),
                    None => g.check(since, "sends")?,
                }
            }
            continue;
        }
        idle.reset();
        for wc in &wcs[..n] {
            if !wc.status.is_success() {
                return Err(format!("a receive completed with {}", wc.status));
            }
            let (qp, slot) = s.recv_origin(wc.wr_id);
            s.post_recv(qp, slot)?;
            got += 1;
        }
    }
}
