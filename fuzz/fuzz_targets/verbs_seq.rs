//! A sequence of verbs on the `soft` provider, read from the input as a small program (at most
//! 64 operations, each chosen by a byte): two or three RC QPs connected by hand (QP 0 with
//! QP 1, QP 2 with itself), two registered regions over the target's own memory, and sends,
//! RDMA writes and reads and atomics (lengths, offsets and keys from the input: out of the
//! region's bounds, wrong or stale keys included), receives, polls, moves to ERR or RESET,
//! reconnects, deregistrations and registrations. It never panics or hangs, and the CQs
//! tell the truth: every request posted successfully (send or receive) completes exactly once,
//! on its own QP's CQ, except those a move to RESET discards (which may complete at most once);
//! nothing completes that was not posted; a successful send-side completion has its request's
//! opcode and length; a request naming a deregistered region's key fails (unless a region was
//! registered since, which may have the key again). At the end every QP moves to ERR and the
//! CQs are polled until empty.
#![no_main]

use std::alloc::Layout;
use std::collections::HashMap;

use corelink_verbs::soft::{Soft, SoftContext, SoftCq, SoftMr, SoftPd, SoftQp, DEVICE_NAME};
use corelink_verbs::{
    AccessFlags, Context, Cq, Mr, Pd, Provider, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, RemoteAddr, SendFlags, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus,
};
use libfuzzer_sys::fuzz_target;

/// Operations a program runs at most.
const MAX_OPS: usize = 64;
/// Completions each CQ holds: more than a program can post, so that none is lost to overflow.
const CQ_DEPTH: u32 = 1024;

/// The input, read a byte at a time (zeros once it runs out).
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Memory the regions are registered over, owned by the target and freed only after every
/// QP and region is gone: whatever a request names stays valid for the whole run.
struct Arena {
    ptr: *mut u8,
    layout: Layout,
}

impl Arena {
    fn new(len: usize) -> Arena {
        let layout = Layout::from_size_align(len, 4096).expect("a small power-of-two alignment");
        // SAFETY: the layout has a non-zero size (every arena is at least 64 bytes).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Arena { ptr, layout }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed(layout)` and is freed once, here.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Rights a region is registered with, chosen by a byte (some refused: remote writes and
/// atomics need LOCAL_WRITE).
fn access(b: u8) -> AccessFlags {
    match b % 6 {
        0 | 1 => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ALL,
        2 => AccessFlags::LOCAL_WRITE,
        3 => AccessFlags::REMOTE_READ,
        4 => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        _ => AccessFlags::REMOTE_WRITE, // refused
    }
}

/// A posted request the CQs owe a completion for.
#[derive(Debug)]
struct Posted {
    qp: usize,
    /// The send-side opcode and length a success reports (`None`: a receive).
    send: Option<(WcOpcode, u32)>,
    /// Whether it must complete (false once a move to RESET may have discarded it).
    required: bool,
    /// `Some(n)`: it names a deregistered region's key, posted after `n` registrations; it
    /// must fail unless a registration came since (which may have issued the key again).
    stale: Option<u64>,
}

struct Run {
    ctx: SoftContext,
    qps: Vec<SoftQp>,
    cqs: Vec<SoftCq>,
    peers: Vec<usize>,
    attr: QpAttr,
    /// Each region's base address and length (fixed: its arena), its region while
    /// registered, and its keys as last registered (stale once deregistered).
    regions: Vec<(u64, usize, Option<SoftMr>, u32, u32)>,
    posted: HashMap<u64, Posted>,
    next_wr_id: u64,
    /// Registrations so far.
    registrations: u64,
}

impl Run {
    /// Connects QP `i` to its peer by hand, from RESET: INIT, RTR with the peer's number, RTS.
    fn connect(&mut self, i: usize) {
        let dest = self.ctx.endpoint(&self.qps[self.peers[i]], 1, 0).expect("endpoint");
        self.qps[i].connect_to(dest, &self.attr).expect("RESET to RTS");
    }

    /// Moves QP `i` to RESET: what it had posted may be discarded without completions.
    fn reset(&mut self, i: usize) {
        self.qps[i].modify(&QpAttr { state: QpState::Reset, ..self.attr }).expect("to RESET");
        for p in self.posted.values_mut().filter(|p| p.qp == i) {
            p.required = false;
        }
    }

    fn track(&mut self, qp: usize, send: Option<(WcOpcode, u32)>, keys: &[u32]) {
        let stale = keys.iter().any(|&k| self.is_dead(k)).then_some(self.registrations);
        self.posted.insert(self.next_wr_id, Posted { qp, send, required: true, stale });
        self.next_wr_id += 1;
    }

    /// Whether `key` is a deregistered region's and no live region's (0, the rkey of a region
    /// without remote rights, is neither).
    fn is_dead(&self, key: u32) -> bool {
        let (mut dead, mut live) = (false, false);
        for r in &self.regions {
            let is = key != 0 && (r.3 == key || r.4 == key);
            dead |= is && r.2.is_none();
            live |= is && r.2.is_some();
        }
        dead && !live
    }

    /// Polls QP `i`'s CQ once; returns how many completions it had.
    fn poll(&mut self, i: usize) -> usize {
        let mut wcs = [Wc::default(); 16];
        let n = self.cqs[i].poll(&mut wcs).expect("poll");
        for wc in &wcs[..n] {
            let Some(p) = self.posted.remove(&wc.wr_id) else {
                panic!("completion of a request not posted, or completed twice: {wc:?}");
            };
            assert_eq!(p.qp, i, "{wc:?} of QP {} came on CQ {i}", p.qp);
            assert_eq!(wc.qp_num, self.qps[i].qp_num(), "{wc:?}");
            if wc.status != WcStatus::Success {
                continue;
            }
            // (A write with immediate takes a receive but none of its buffers.)
            if wc.opcode != WcOpcode::RecvRdmaWithImm {
                assert!(p.stale != Some(self.registrations), "{wc:?} used a deregistered key");
            }
            match p.send {
                Some((opcode, len)) => assert_eq!((wc.opcode, wc.byte_len), (opcode, len)),
                None => assert!(matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)),
            }
        }
        n
    }

    /// A gather/scatter entry from the input: region `r`'s key (or a stale or made-up one) at
    /// an offset and length that may leave the region.
    fn sge(&self, input: &mut Input<'_>) -> Sge {
        let r = &self.regions[usize::from(input.u8() % 2)];
        let (offset, length) = (input.u16() % 4200, u32::from(input.u16() % 4200));
        let lkey = match input.u8() % 8 {
            0 => input.u16().into(),
            _ => r.3,
        };
        Sge { addr: r.0 + u64::from(offset), length, lkey }
    }

    /// An inline payload from the input: always inside an arena (the device reads it without
    /// a key), up to 80 bytes (beyond max_inline_data is refused at post).
    fn inline_sge(&self, input: &mut Input<'_>) -> Sge {
        let r = &self.regions[usize::from(input.u8() % 2)];
        let length = usize::from(input.u8() % 81).min(r.1);
        let offset = usize::from(input.u16()) % (r.1 - length + 1);
        Sge { addr: r.0 + offset as u64, length: length as u32, lkey: 0 }
    }

    /// A remote location from the input: a region's rkey (or a wrong or made-up one) at an
    /// offset that may leave it.
    fn remote(&self, input: &mut Input<'_>) -> RemoteAddr {
        let r = &self.regions[usize::from(input.u8() % 2)];
        let offset = u64::from(input.u16() % 4200);
        let rkey = match input.u8() % 8 {
            0 => r.4 ^ 0x100,
            1 => 0,
            _ => r.4,
        };
        RemoteAddr { addr: r.0 + offset, rkey }
    }

    fn post_send(&mut self, input: &mut Input<'_>) {
        let qp = usize::from(input.u8()) % self.qps.len();
        let inline = input.u8() & 7 == 0;
        let nsge = usize::from(input.u8() % 3);
        let sgl: Vec<Sge> = (0..nsge)
            .map(|_| if inline { self.inline_sge(input) } else { self.sge(input) })
            .collect();
        let len = sgl.iter().map(|s| s.length).fold(0u32, u32::saturating_add);
        let kind = input.u8() % 7;
        let remote = self.remote(input);
        let imm = u32::from(input.u16());
        let (op, opcode) = match kind {
            0 => (SendOp::<Soft>::Send, WcOpcode::Send),
            1 => (SendOp::SendWithImm(imm), WcOpcode::Send),
            2 => (SendOp::Write(remote), WcOpcode::RdmaWrite),
            3 => (SendOp::WriteWithImm(remote, imm), WcOpcode::RdmaWrite),
            4 => (SendOp::Read(remote), WcOpcode::RdmaRead),
            5 => (
                SendOp::CompareSwap { remote, compare: 0, swap: u64::from(imm) },
                WcOpcode::CompSwap,
            ),
            _ => (SendOp::FetchAdd { remote, add: u64::from(imm) }, WcOpcode::FetchAdd),
        };
        let flags =
            if inline { SendFlags::SIGNALED | SendFlags::INLINE } else { SendFlags::SIGNALED };
        let id = self.next_wr_id;
        let wr = SendWr::new(id, op, &sgl).flags(flags);
        // SAFETY: every address the list names is inside an arena, which outlives every QP and
        // region (an inline payload is readable now); the device reaches a non-inline entry
        // only through a registered region containing it, and no Rust reference into an arena
        // is ever made.
        match unsafe { self.qps[qp].post_send(&[wr]) } {
            Ok(()) => {
                // The keys the device checks: those of non-empty local entries, and the rkey
                // of a one-sided request that moves bytes.
                let mut keys: Vec<u32> =
                    sgl.iter().filter(|s| s.length > 0 && !inline).map(|s| s.lkey).collect();
                if kind >= 5 || (kind >= 2 && len > 0) {
                    keys.push(remote.rkey);
                }
                self.track(qp, Some((opcode, len)), &keys);
            }
            Err(e) => assert!(matches!(e, corelink_verbs::Error::PostSend { index: 0, .. })),
        }
    }

    fn post_recv(&mut self, input: &mut Input<'_>) {
        let qp = usize::from(input.u8()) % self.qps.len();
        let nsge = usize::from(input.u8() % 3);
        let sgl: Vec<Sge> = (0..nsge).map(|_| self.sge(input)).collect();
        let wr = RecvWr { wr_id: self.next_wr_id, sgl: &sgl };
        // SAFETY: as in `post_send`: the arenas outlive every QP, and the device writes only
        // through a registered region containing the entry.
        match unsafe { self.qps[qp].post_recv(&[wr]) } {
            Ok(()) => {
                let keys: Vec<u32> = sgl.iter().filter(|s| s.length > 0).map(|s| s.lkey).collect();
                self.track(qp, None, &keys);
            }
            Err(e) => assert!(matches!(e, corelink_verbs::Error::PostRecv { index: 0, .. })),
        }
    }
}

fn register(pd: &SoftPd, base: u64, len: usize, access: AccessFlags) -> Option<SoftMr> {
    // SAFETY: `base..base+len` is an arena, valid for reads and writes until after every
    // region and QP is dropped, and never referenced from Rust.
    unsafe { pd.register_raw(base as *mut u8, len, access) }.ok()
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let setup = input.u8();
    let nqps = 2 + usize::from(setup & 1);
    let attr = QpAttr {
        rnr_retry: (setup >> 1) % 8,
        retry_cnt: (setup >> 4) % 8,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    // Declared first, so dropped last: after every QP and region.
    let arenas: Vec<Arena> =
        (0..2).map(|_| Arena::new(64 + 8 * usize::from(input.u16() % 505))).collect();

    let ctx = Soft::open(DEVICE_NAME).expect("soft0");
    let pd = ctx.alloc_pd().expect("pd");
    let cap = QpCap { max_send_wr: 8, max_recv_wr: 8, ..QpCap::default() };
    let cqs: Vec<SoftCq> = (0..nqps).map(|_| ctx.create_cq(CQ_DEPTH).expect("cq")).collect();
    let qps: Vec<SoftQp> = cqs
        .iter()
        .map(|cq| {
            let init = QpInitAttr::<Soft> {
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap,
                sq_sig_all: false,
            };
            pd.create_qp(&init).expect("qp")
        })
        .collect();
    let regions = arenas
        .iter()
        .map(|a| {
            let (base, len) = (a.ptr as u64, a.layout.size());
            let mr = register(&pd, base, len, access(input.u8()));
            let keys = mr.as_ref().map_or((0, 0), |m| (m.lkey(), m.rkey()));
            (base, len, mr, keys.0, keys.1)
        })
        .collect();
    let mut run = Run {
        ctx,
        qps,
        cqs,
        peers: vec![1, 0, 2],
        attr,
        regions,
        posted: HashMap::new(),
        next_wr_id: 1,
        registrations: 0,
    };
    for i in 0..nqps {
        run.connect(i);
    }

    for _ in 0..MAX_OPS {
        if input.is_empty() {
            break;
        }
        match input.u8() % 10 {
            0..=2 => run.post_send(&mut input),
            3 | 4 => run.post_recv(&mut input),
            5 => {
                let qp = usize::from(input.u8()) % nqps;
                run.poll(qp);
            }
            6 => {
                let qp = usize::from(input.u8()) % nqps;
                run.qps[qp].modify(&QpAttr { state: QpState::Err, ..attr }).expect("to ERR");
            }
            7 => {
                // To RESET, and back up when the next byte says so.
                let qp = usize::from(input.u8()) % nqps;
                run.reset(qp);
                if input.u8() & 1 == 0 {
                    run.connect(qp);
                }
            }
            8 => {
                // Deregisters a region, or registers it again (its keys may change).
                let r = &mut run.regions[usize::from(input.u8() % 2)];
                let rights = access(input.u8());
                if r.2.take().is_none() {
                    r.2 = register(&pd, r.0, r.1, rights);
                    if let Some(m) = &r.2 {
                        (r.3, r.4) = (m.lkey(), m.rkey());
                        run.registrations += 1;
                    }
                }
            }
            _ => {
                for qp in 0..nqps {
                    run.poll(qp);
                }
            }
        }
    }

    // Every QP to ERR (its requests flush), then the CQs until empty.
    for qp in &mut run.qps {
        qp.modify(&QpAttr { state: QpState::Err, ..attr }).expect("to ERR");
    }
    for _ in 0..1000 {
        let got: usize = (0..nqps).map(|qp| run.poll(qp)).sum();
        if got == 0 && !run.posted.values().any(|p| p.required) {
            break;
        }
    }
    let missing: Vec<_> = run.posted.iter().filter(|(_, p)| p.required).collect();
    assert!(missing.is_empty(), "requests that never completed: {missing:?}");

    drop(run);
    drop(pd);
    drop(arenas);
});
