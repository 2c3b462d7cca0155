//! corelink-perf end to end on soft (loopback, one engine connected to itself), through the
//! library: a bandwidth test over two sizes, the four latency tests and two more bandwidth
//! tests, with tiny iteration counts. No timing is asserted: only that every size reports, with
//! the right kind of figures.

use corelink_apps::perf::engine_run::run;
use corelink_apps::perf::opts::{PerfError, PerfOpts, Test, Transport};
use corelink_apps::perf::Report;

fn perf(test: Test, sizes: &[usize], iters: u64) -> Vec<Report> {
    let mut o = PerfOpts::new(test);
    o.sizes = sizes.to_vec();
    o.iters = iters;
    o.check(false).expect("a supported combination");
    let (mut started, mut seen) = (0, 0);
    let reports = run(&o, &mut |_| started += 1, &mut |_| seen += 1).expect("the run");
    assert_eq!((started, seen), (1, reports.len()));
    reports
}

#[test]
fn perf_tests_run_on_soft_loopback() {
    let r = perf(Test::WriteBw, &[64, 65536], 50);
    assert_eq!(r.iter().map(|r| r.bytes).collect::<Vec<_>>(), vec![64, 65536]);
    for r in &r {
        assert_eq!((r.test.as_str(), r.iterations, r.workers), ("write_bw", 50, Some(1)));
        let (avg, peak) = (r.bw_avg_mbps.unwrap(), r.bw_peak_mbps.unwrap());
        assert!(avg > 0.0 && peak >= avg);
        assert!(r.lat.is_none());
    }
    for t in [Test::SendLat, Test::WriteLat, Test::ReadLat, Test::AtomicLat] {
        let r = perf(t, &[8], 20);
        assert_eq!(r.len(), 1);
        let l = r[0].lat.expect("latency figures");
        assert_eq!(r[0].iterations, 20);
        assert!(l.t_min_us > 0.0 && l.t_min_us <= l.t_typical_us && l.t_typical_us <= l.t_max_us);
        assert!(r[0].bw_avg_mbps.is_none());
        assert!(r[0].to_json().contains("\"p999_us\":"));
    }
    let r = perf(Test::SendBw, &[8192], 40);
    assert_eq!((r[0].bytes, r[0].iterations), (8192, 40));
    let r = perf(Test::AtomicBw, &[8], 40);
    assert_eq!((r[0].bytes, r[0].iterations), (8, 40));
}

#[test]
fn perf_refuses_what_verbs_forbids_and_the_engine_lacks() {
    let mut o = PerfOpts::new(Test::ReadLat);
    o.transport = Transport::Uc;
    assert!(matches!(o.check(false), Err(PerfError::Usage(_))));
    let mut o = PerfOpts::new(Test::SendLat);
    o.transport = Transport::Ud;
    o.check(false).expect("UD send_lat runs on verbs (tests/perf_verbs_soft.rs)");
    assert!(o.on_verbs());
    let mut o = PerfOpts::new(Test::WriteBw);
    o.cq_mod = 0;
    assert!(matches!(o.check(false), Err(PerfError::Usage(_))));
    let mut o = PerfOpts::new(Test::WriteBw);
    o.post_list = 33;
    assert!(matches!(o.check(false), Err(PerfError::Usage(_))));
}

fn perf_with(test: Test, size: usize, iters: u64, f: impl Fn(&mut PerfOpts)) -> Report {
    let mut o = PerfOpts::new(test);
    o.sizes = vec![size];
    o.iters = iters;
    f(&mut o);
    o.check(false).expect("a supported combination");
    let r = run(&o, &mut |_| {}, &mut |_| {}).expect("the run");
    assert_eq!((r.len(), r[0].iterations), (1, iters), "{r:?}");
    r.into_iter().next().unwrap()
}

#[test]
fn scheduler_options_run_on_soft_loopback() {
    // Batching and selective signalling on and off, several QPs, the flat path.
    for (l, q) in [(1, 1), (16, 64)] {
        perf_with(Test::WriteBw, 8, 300, |o| (o.post_list, o.cq_mod) = (l, q));
    }
    perf_with(Test::WriteBw, 64, 300, |o| o.qps = 4);
    perf_with(Test::WriteBw, 8, 300, |o| o.sched.flat = true);
    perf_with(Test::WriteLat, 8, 50, |o| o.sched.flat = true);
    // A skewed read workload with merging on and off, a mixed load with priorities on and off.
    for no_merge in [false, true] {
        perf_with(Test::ReadBw, 64, 300, |o| {
            o.sched.hot_records = 4;
            o.sched.no_merge = no_merge;
        });
    }
    for no_priority in [false, true] {
        let r = perf_with(Test::ReadLat, 8, 50, |o| {
            o.sched.bg_writes = 16;
            o.sched.max_outstanding = Some(4);
            o.sched.no_priority = no_priority;
        });
        assert!(r.lat.is_some());
    }
}

#[test]
fn rpc_tests_run_beside_the_send_tests_on_soft_loopback() {
    // One process, alternating: send_lat, rpc_lat, send_bw, rpc_bw, each reporting its sizes.
    for (send, rpc) in [(Test::SendLat, Test::RpcLat), (Test::SendBw, Test::RpcBw)] {
        assert_eq!(rpc.send_counterpart(), Some(send));
        for t in [send, rpc] {
            let r = perf(t, &[8, 4096], 40);
            assert_eq!(r.iter().map(|r| r.bytes).collect::<Vec<_>>(), vec![8, 4096]);
            for r in &r {
                assert_eq!((r.test.as_str(), r.iterations), (t.name(), 40));
                if t.is_lat() {
                    let l = r.lat.expect("latency figures");
                    assert!(l.t_min_us > 0.0 && l.t_min_us <= l.t_typical_us);
                } else {
                    assert!(r.msg_rate_mpps.unwrap() > 0.0 && r.lat.is_none());
                }
            }
        }
    }
    // Messages that fill a receive but for the RPC header's room, and a timed run.
    let r = perf(Test::RpcLat, &[65536 - 28, 1 << 20], 10);
    assert_eq!(r.len(), 2);
    let mut o = PerfOpts::new(Test::RpcBw);
    o.duration = Some(std::time::Duration::from_secs(1));
    o.check(false).unwrap();
    let r = run(&o, &mut |_| {}, &mut |_| {}).expect("a timed run");
    assert!(r[0].iterations > 0);
}
