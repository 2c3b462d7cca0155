//! `corelink-perf baseline raw_write` on soft: write_bw's loop on the verbs runner over RC (no
//! engine), through the library and through the binary. A few thousand iterations; no timing is
//! asserted, only that it reports a positive message rate with write_bw's keys.

use std::process::Command;

use corelink_apps::perf::opts::{PerfError, PerfOpts, Test, Transport};
use corelink_apps::perf::verbs_run::run;

fn raw_write(iters: u64, post_list: u32, cq_mod: u32) -> PerfOpts {
    let mut o = PerfOpts::new(Test::WriteBw);
    o.raw = true;
    o.sizes = vec![8];
    o.iters = iters;
    o.post_list = post_list;
    o.cq_mod = cq_mod;
    o.check(false).expect("RC writes");
    assert!(o.on_verbs());
    o
}

#[test]
fn raw_write_reports_a_positive_message_rate() {
    for (l, q) in [(16, 64), (1, 1)] {
        let o = raw_write(4000, l, q);
        let r = run(&o, &mut |_| {}, &mut |_| {}).expect("the run");
        assert_eq!(r.len(), 1);
        let r = &r[0];
        assert_eq!(r.test, "baseline_raw_write");
        assert_eq!((r.bytes, r.iterations), (8, 4000));
        assert_eq!(r.transport.as_deref(), Some("RC"));
        assert_eq!(r.provider.as_deref(), Some("soft"));
        assert!(r.msg_rate_mpps.is_some_and(|m| m > 0.0), "{r:?}");
        let (avg, peak) = (r.bw_avg_mbps.expect("avg"), r.bw_peak_mbps.expect("peak"));
        assert!(avg > 0.0 && peak >= avg, "{r:?}");
        assert!(r.lat.is_none());
    }
}

#[test]
fn raw_write_is_rc_only() {
    let mut o = PerfOpts::new(Test::WriteBw);
    o.raw = true;
    o.transport = Transport::Uc;
    assert!(matches!(o.check(false), Err(PerfError::Usage(_))));
}

/// The binary routes `baseline raw_write` to the verbs runner and prints write_bw's JSON keys.
#[test]
fn the_binary_runs_baseline_raw_write() {
    let out = Command::new(env!("CARGO_BIN_EXE_corelink-perf"))
        .args(["baseline", "raw_write", "-n", "3000", "-l", "16", "-Q", "64", "--json"])
        .output()
        .expect("corelink-perf runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = String::from_utf8(out.stdout).expect("utf-8");
    let j: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON object");
    assert_eq!(j["test"], "baseline_raw_write");
    assert_eq!(j["bytes"], 8);
    assert_eq!(j["iterations"], 3000);
    for k in ["transport", "provider", "workers", "bw_peak_mbps", "bw_avg_mbps", "msg_rate_mpps"] {
        assert!(j.get(k).is_some(), "{k} in {line}");
    }
    assert!(j["msg_rate_mpps"].as_f64().is_some_and(|m| m > 0.0), "{line}");
    let bad = Command::new(env!("CARGO_BIN_EXE_corelink-perf"))
        .args(["baseline", "raw_write", "-c", "UD"])
        .output()
        .expect("corelink-perf runs");
    assert_eq!(bad.status.code(), Some(2));
}

/// The other raw baselines: each latency test as a verbs loop on RC, through the binary, with
/// the test's latency keys under `baseline_raw_TEST`; the RPC tests and unknown names are
/// usage errors.
#[test]
fn the_binary_runs_the_raw_latency_baselines() {
    for t in ["read_lat", "atomic_lat", "send_lat", "write_lat"] {
        let out = Command::new(env!("CARGO_BIN_EXE_corelink-perf"))
            .args(["baseline", &format!("raw_{t}"), "-s", "8", "-n", "500", "--json"])
            .output()
            .expect("corelink-perf runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{t}: {stderr}");
        let line = String::from_utf8(out.stdout).expect("utf-8");
        let j: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON object");
        assert_eq!(j["test"], format!("baseline_raw_{t}"));
        assert_eq!(j["transport"], "RC");
        assert_eq!(j["iterations"], 500);
        assert!(j["t_typical_us"].as_f64().is_some_and(|t| t > 0.0), "{line}");
    }
    for bad in ["raw_rpc_lat", "raw_nothing"] {
        let out = Command::new(env!("CARGO_BIN_EXE_corelink-perf"))
            .args(["baseline", bad])
            .output()
            .expect("corelink-perf runs");
        assert_eq!(out.status.code(), Some(2), "{bad}");
    }
}
