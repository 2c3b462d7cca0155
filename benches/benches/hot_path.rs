//! Criterion benchmarks of corelink's hot path, all on the `soft` provider (no NIC needed):
//!
//! - `ring/push_pop_same_thread`: one push and one pop of a `u64` on an SPSC ring, one thread;
//! - `ring/echo_cross_thread`: a `u64` pushed to a thread pinned to core 1, which pushes it
//!   back on a second ring; pipelined (the sender keeps the ring full), per value;
//! - `pool/get_drop_64B`: a 64-byte buffer from a worker's pool and back;
//! - `verbs/soft_write_8B_post_poll`: one signalled 8-byte RDMA write posted on an RC QP of
//!   `soft` (two contexts connected by hand) and its completion polled;
//! - `engine/client_write_8B_batch`: an engine on `soft` (control core 0, one worker on core 1)
//!   connected to itself; an external `Client` on core 0 submits a batch of 32 8-byte writes to
//!   the worker's own region and waits for their 32 completions. Reported per write (criterion's
//!   throughput is in elements: writes per second).
//!
//! The benchmark thread is pinned to core 0; the echo thread and the engine's worker to core 1.
//! Kept short (20 samples, 2 s each) so that `cargo bench -p corelink-benches` stays within a
//! couple of minutes on a 2-core machine.
// criterion's `criterion_group!` makes public functions that cannot carry docs.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corelink_config::{parse, MachineTopology};
use corelink_engine::bench_support::ring;
use corelink_engine::bench_support::Pool;
use corelink_engine::{ConnId, ConnInfo, Cx, Engine, Event, Handler, Op, Placement};
use corelink_verbs::soft::{Soft, DEVICE_NAME};
use corelink_verbs::{
    AccessFlags, Context, Cq, Mr, Pd, Provider, Qp, QpAttr, QpCap, QpInitAttr, QpType,
    RemoteRegion, SendOp, SendWr, Wc, WcStatus,
};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// Writes per batch in the engine benchmark.
const BATCH: u64 = 32;

fn pin(core: usize) {
    // Best effort: on a machine without this core the benchmark still runs, unpinned.
    let _ = core_affinity::set_for_current(core_affinity::CoreId { id: core });
}

/// Busy-waiting that yields now and then, so that it stays correct on one core.
fn spin(n: &mut u32) {
    *n = n.wrapping_add(1);
    if *n % 4096 == 0 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

fn rings(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring");
    g.throughput(Throughput::Elements(1));
    let (mut p, mut q) = ring::<u64>(1024);
    g.bench_function("push_pop_same_thread", |b| {
        b.iter(|| {
            let _ = p.push(black_box(7));
            black_box(q.pop())
        })
    });

    let (mut tx, mut far_rx) = ring::<u64>(1024);
    let (mut far_tx, mut rx) = ring::<u64>(1024);
    let echo = std::thread::spawn(move || {
        pin(1);
        let mut n = 0;
        loop {
            match far_rx.pop() {
                Some(u64::MAX) => return,
                Some(mut v) => loop {
                    match far_tx.push(v) {
                        Ok(()) => break,
                        Err(back) => v = back,
                    }
                    spin(&mut n);
                },
                None => spin(&mut n),
            }
        }
    });
    g.bench_function("echo_cross_thread", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let (mut sent, mut got) = (0u64, 0u64);
            while got < iters {
                if sent < iters && tx.push(sent).is_ok() {
                    sent += 1;
                }
                while let Some(v) = rx.pop() {
                    black_box(v);
                    got += 1;
                }
            }
            start.elapsed()
        })
    });
    let mut n = 0;
    while tx.push(u64::MAX).is_err() {
        let _ = rx.pop();
        spin(&mut n);
    }
    echo.join().expect("the echo thread");
    g.finish();
}

fn pool(c: &mut Criterion) {
    let ctx = Soft::open(DEVICE_NAME).expect("soft device");
    let pd = ctx.alloc_pd().expect("pd");
    let pool = Pool::<Soft>::new(&pd, &[(64, 1024), (4096, 64)]).expect("pool");
    c.bench_function("pool/get_drop_64B", |b| b.iter(|| black_box(pool.get(64).expect("buf"))));
}

/// One side of a hand-connected RC pair on `soft`.
struct Side {
    ctx: <Soft as Provider>::Context,
    cq: <Soft as Provider>::Cq,
    qp: <Soft as Provider>::Qp,
    mr: <Soft as Provider>::Mr,
    _pd: <Soft as Provider>::Pd,
}

fn side() -> Side {
    let ctx = Soft::open(DEVICE_NAME).expect("soft device");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(256).expect("cq");
    let attr = QpInitAttr::<Soft> {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        cap: QpCap::default(),
        sq_sig_all: false,
    };
    let qp = pd.create_qp(&attr).expect("qp");
    let mr = pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ALL).expect("mr");
    Side { ctx, cq, qp, mr, _pd: pd }
}

fn verbs(c: &mut Criterion) {
    let (mut a, mut b) = (side(), side());
    let ea = a.ctx.endpoint(&a.qp, 1, 0).expect("endpoint");
    let eb = b.ctx.endpoint(&b.qp, 1, 0).expect("endpoint");
    a.qp.connect_to(eb, &QpAttr::default()).expect("connect a");
    b.qp.connect_to(ea, &QpAttr::default()).expect("connect b");
    a.mr.write_at(0, &7u64.to_ne_bytes()).expect("fill");
    let sge = [a.mr.sge(0, 8).expect("sge")];
    let remote = b.mr.remote(64);
    let mut wc = [Wc::default(); 4];
    c.bench_function("verbs/soft_write_8B_post_poll", |bench| {
        bench.iter(|| {
            let wr = [SendWr::new(1, SendOp::Write(remote), &sge)];
            // SAFETY: the source region (`a.mr`) outlives the benchmark, and its completion is
            // polled below before the next post; nothing else writes it meanwhile.
            unsafe { a.qp.post_send(&wr).expect("post") };
            let mut n = 0;
            loop {
                if a.cq.poll(&mut wc).expect("poll") == 1 {
                    assert_eq!(wc[0].status, WcStatus::Success);
                    break;
                }
                spin(&mut n);
            }
        })
    });
    drop(b);
}

/// The external client drives the traffic; the handler grants the connection it accepts 64 KiB
/// of memory (every remote right) and publishes where for the client.
struct Granting<P: Provider> {
    mem: Option<corelink_engine::Memory<P>>,
    granted: Arc<Mutex<Option<RemoteRegion>>>,
}

impl<P: Provider> Handler<P> for Granting<P> {
    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        if info.initiated {
            return;
        }
        let mem = self.mem.insert(cx.register_memory(64 << 10, false).expect("memory"));
        let g = cx.grant(conn, mem, 0, 64 << 10, AccessFlags::REMOTE_ALL).expect("grant");
        *self.granted.lock().expect("lock") = Some(g.region);
    }
}

fn engine(c: &mut Criterion) {
    let map = "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\n\
               listen = \"10.201.0.1:0\"\n[worker]\nidle_after_us = 0";
    let map = parse(map).expect("core map");
    let v = map.validate(&MachineTopology::load().expect("topology")).expect("valid core map");
    let granted = Arc::new(Mutex::new(None));
    let g = granted.clone();
    let mut e = Engine::<Soft>::start(&v, Placement::RoundRobin, move |_| Granting {
        mem: None,
        granted: g.clone(),
    })
    .expect("engine");
    let addr = e.listen_addr().expect("listen address");
    let mut client = e.client(0).expect("client");
    let wait = Duration::from_secs(10);
    client.connect(addr, b"", 0).expect("connect");
    let conn = match client.wait(wait) {
        Some(Event::Connected { conn, .. }) => conn,
        e => panic!("connect failed: {e:?}"),
    };
    let region = loop {
        if let Some(r) = *granted.lock().expect("lock") {
            break r;
        }
        std::thread::yield_now();
    };
    // The payloads travel to the worker and back in the requests and completions: reused.
    let mut free: Vec<Vec<u8>> = (0..BATCH).map(|i| i.to_ne_bytes().to_vec()).collect();
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("client_write_8B_batch", |b| {
        b.iter(|| {
            for i in 0..BATCH {
                let buf = free.pop().expect("a payload");
                let mut op = Op::Write { buf, remote: region.at(i * 8), imm: None };
                let mut n = 0;
                while let Err((back, _)) = client.submit(conn, op, i) {
                    op = back;
                    spin(&mut n);
                }
            }
            for _ in 0..BATCH {
                match client.wait(wait) {
                    Some(Event::Done(d)) if d.status == WcStatus::Success => {
                        free.extend(d.buf);
                    }
                    e => panic!("{e:?}"),
                }
            }
        })
    });
    g.finish();
    drop(client);
    e.shutdown().expect("shutdown");
}

fn config() -> Criterion {
    pin(0);
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = hot_path;
    config = config();
    targets = rings, pool, verbs, engine
}
criterion_main!(hot_path);
