//! corelink-perf's verbs runner (`-c UC`, `-c UD`, `--use-srq`) end to end on soft, in
//! loopback, through the library: every test each transport allows, RC with a shared receive
//! queue, several queue pairs with post lists and CQ moderation, and the refusals. Tiny
//! iteration counts; no timing is asserted, only that every size reports sane figures.

use corelink_apps::perf::opts::{PerfError, PerfOpts, Test, Transport};
use corelink_apps::perf::verbs_run::run;
use corelink_apps::perf::Report;

fn opts(test: Test, transport: Transport, srq: bool, sizes: &[usize], iters: u64) -> PerfOpts {
    let mut o = PerfOpts::new(test);
    o.transport = transport;
    o.use_srq = srq;
    o.sizes = sizes.to_vec();
    o.iters = iters;
    o.check(sizes.len() > 1).expect("an allowed combination");
    assert!(o.on_verbs());
    o
}

fn perf(o: &PerfOpts) -> Vec<Report> {
    let (mut started, mut seen) = (0, 0);
    let reports = run(o, &mut |_| started += 1, &mut |_| seen += 1).expect("the run");
    assert_eq!((started, seen), (1, reports.len()));
    reports
}

/// Checks one report of `o` at `bytes`.
fn sane(o: &PerfOpts, r: &Report, bytes: usize) {
    let what = format!("{} {} {bytes} B: {r:?}", o.test.name(), o.transport.name());
    assert_eq!(r.test, o.test.name(), "{what}");
    assert_eq!(r.transport.as_deref(), Some(o.transport.name()), "{what}");
    assert_eq!(r.provider.as_deref(), Some("soft"), "{what}");
    assert_eq!(r.workers, Some(1), "{what}");
    assert_eq!((r.bytes, r.iterations), (bytes, o.iters), "{what}");
    match &r.lat {
        Some(l) => {
            assert!(l.t_min_us > 0.0, "{what}");
            assert!(l.t_min_us <= l.t_typical_us && l.t_typical_us <= l.t_max_us, "{what}");
            assert!(r.bw_avg_mbps.is_none(), "{what}");
            assert!(o.test.is_lat(), "{what}");
        }
        None => {
            let (avg, peak) = (r.bw_avg_mbps.expect("bw"), r.bw_peak_mbps.expect("peak"));
            assert!(avg > 0.0 && peak >= avg, "{what}");
            assert!(r.msg_rate_mpps.is_some_and(|m| m > 0.0), "{what}");
            assert!(!o.test.is_lat(), "{what}");
        }
    }
    let j = r.to_json();
    assert!(j.contains(&format!("\"transport\":\"{}\"", o.transport.name())), "{j}");
}

#[test]
fn every_uc_and_ud_test_runs_on_soft() {
    let runs = [
        (Test::WriteBw, Transport::Uc, vec![64, 65536]),
        (Test::WriteLat, Transport::Uc, vec![8, 4096]),
        (Test::SendBw, Transport::Uc, vec![4096]),
        (Test::SendLat, Transport::Uc, vec![2]),
        (Test::SendBw, Transport::Ud, vec![256, 1024]),
        (Test::SendLat, Transport::Ud, vec![1024]),
    ];
    for (test, transport, sizes) in runs {
        let o = opts(test, transport, false, &sizes, 40);
        let r = perf(&o);
        assert_eq!(r.iter().map(|r| r.bytes).collect::<Vec<_>>(), sizes);
        for (r, &s) in r.iter().zip(&sizes) {
            sane(&o, r, s);
        }
    }
}

#[test]
fn every_test_runs_on_rc_with_a_shared_receive_queue() {
    for test in Test::ALL {
        let o = opts(test, Transport::Rc, true, &[8], 30);
        let r = perf(&o);
        assert_eq!(r.len(), 1);
        sane(&o, &r[0], 8);
    }
}

#[test]
fn several_queue_pairs_post_lists_and_moderation() {
    for (test, transport, srq) in [
        (Test::SendBw, Transport::Ud, false),
        (Test::WriteBw, Transport::Uc, false),
        (Test::SendBw, Transport::Rc, true),
        (Test::ReadBw, Transport::Rc, true),
    ] {
        let mut o = opts(test, transport, srq, &[512], 101);
        o.qps = 3;
        o.post_list = 4;
        o.cq_mod = 7;
        o.tx_depth = 16;
        o.inline = Some(64);
        let r = perf(&o);
        sane(&o, &r[0], 512);
    }
}

#[test]
fn ud_sizes_stop_at_the_mtu_and_the_runner_refuses_what_it_lacks() {
    // soft's MTU is 1024: an -a list loses what is above it, a single -s above it is refused,
    // and no size at all means one of the MTU.
    let all = corelink_apps::perf::all_sizes();
    let o = opts(Test::SendBw, Transport::Ud, false, &all, 20);
    let r = perf(&o);
    assert_eq!(r.last().map(|r| r.bytes), Some(1024));
    assert_eq!(r.len(), all.iter().filter(|&&s| s <= 1024).count());
    let mut o = opts(Test::SendLat, Transport::Ud, false, &[2048], 20);
    assert!(matches!(run(&o, &mut |_| {}, &mut |_| {}), Err(PerfError::Usage(_))));
    o.sizes.clear();
    let r = perf(&o);
    assert_eq!((r[0].bytes, r[0].iterations), (1024, 20));
    let mut o = opts(Test::SendLat, Transport::Uc, false, &[8], 20);
    o.workers = 2;
    assert!(matches!(run(&o, &mut |_| {}, &mut |_| {}), Err(PerfError::Unsupported(_))));
    o.workers = 1;
    o.qps = 2;
    assert!(matches!(run(&o, &mut |_| {}, &mut |_| {}), Err(PerfError::Unsupported(_))));
    // What verbs forbids stays a usage error.
    for (t, c) in [(Test::ReadBw, Transport::Uc), (Test::WriteLat, Transport::Ud)] {
        let mut o = PerfOpts::new(t);
        o.transport = c;
        assert!(matches!(o.check(false), Err(PerfError::Usage(_))));
    }
}
