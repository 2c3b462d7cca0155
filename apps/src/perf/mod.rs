//! `corelink-perf`'s shared pieces: the result of one measured size (perftest's columns, and
//! the JSON keys other tools rely on), its table and JSON forms, and latency statistics.

pub mod baseline;
pub mod clock;
pub mod engine_run;
pub mod opts;
pub mod phase;
pub mod plot;
pub mod verbs_run;

use serde::Serialize;

/// One line of results: one test at one message size. Keys absent where they do not apply.
/// The JSON keys are stable: other tools read them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    /// Test name (`write_bw`, ..., or `baseline_memcpy`, ...).
    pub test: String,
    /// `RC`, `UC` or `UD` (absent for baselines without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// `soft` or `ibverbs` (absent for baselines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Workers (client/server pairs) that ran at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// Message size in bytes.
    pub bytes: usize,
    /// Iterations measured.
    pub iterations: u64,
    /// Peak bandwidth, MB/s (10^6 bytes per second, as perftest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bw_peak_mbps: Option<f64>,
    /// Average bandwidth, MB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bw_avg_mbps: Option<f64>,
    /// Message rate, millions of messages per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msg_rate_mpps: Option<f64>,
    /// Latency statistics in µs (one-way, as perftest reports them).
    #[serde(flatten)]
    pub lat: Option<Latency>,
}

/// Latency statistics in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    /// Minimum.
    pub t_min_us: f64,
    /// Maximum.
    pub t_max_us: f64,
    /// Median (perftest's "typical").
    pub t_typical_us: f64,
    /// Mean.
    pub t_avg_us: f64,
    /// Standard deviation.
    pub stdev_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
}

impl Latency {
    /// Statistics of `samples` (nanoseconds each), divided by `divisor` (2 for one-way from
    /// round trips). `None` without samples. Sorts `samples`.
    pub fn from_ns(samples: &mut [u64], divisor: f64) -> Option<Latency> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let us = |ns: f64| ns / 1000.0 / divisor;
        let n = samples.len();
        let pct = |p: f64| us(samples[((n as f64 * p).ceil() as usize).clamp(1, n) - 1] as f64);
        let mean = samples.iter().map(|&s| s as f64).sum::<f64>() / n as f64;
        let var = samples.iter().map(|&s| (s as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        Some(Latency {
            t_min_us: us(samples[0] as f64),
            t_max_us: us(samples[n - 1] as f64),
            t_typical_us: us(samples[n / 2] as f64),
            t_avg_us: us(mean),
            stdev_us: us(var.sqrt()),
            p99_us: pct(0.99),
            p999_us: pct(0.999),
        })
    }
}

impl Report {
    /// The report as one JSON line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// perftest's table header for this kind of report.
    pub fn header(&self) -> String {
        if self.lat.is_some() {
            format!(
                " {:<10} {:<12} {:>10} {:>10} {:>12} {:>10} {:>10} {:>10} {:>12}",
                "#bytes",
                "#iterations",
                "t_min[us]",
                "t_max[us]",
                "t_typical[us]",
                "t_avg[us]",
                "t_stdev[us]",
                "99%[us]",
                "99.9%[us]"
            )
        } else {
            format!(
                " {:<10} {:<12} {:>16} {:>16} {:>16}",
                "#bytes", "#iterations", "BW peak[MB/sec]", "BW average[MB/sec]", "MsgRate[Mpps]"
            )
        }
    }

    /// The report as one line of perftest's table.
    pub fn row(&self) -> String {
        match &self.lat {
            Some(l) => format!(
                " {:<10} {:<12} {:>10.2} {:>10.2} {:>12.2} {:>10.2} {:>10.2} {:>10.2} {:>12.2}",
                self.bytes,
                self.iterations,
                l.t_min_us,
                l.t_max_us,
                l.t_typical_us,
                l.t_avg_us,
                l.stdev_us,
                l.p99_us,
                l.p999_us
            ),
            None => format!(
                " {:<10} {:<12} {:>16.2} {:>16.2} {:>16.6}",
                self.bytes,
                self.iterations,
                self.bw_peak_mbps.unwrap_or(0.0),
                self.bw_avg_mbps.unwrap_or(0.0),
                self.msg_rate_mpps.unwrap_or(0.0)
            ),
        }
    }
}

/// A server or client on `soft` meets its peer process on a named fabric
/// (`CORELINK_SOFT_FABRIC`; `corelink-perf` when it is unset, so that the two commands need no
/// set-up). Called before anything opens `soft`.
pub(crate) fn join_soft_fabric() {
    corelink_engine::verbs::soft::default_fabric("corelink-perf");
}

/// The sizes of `-a`: powers of two from 2 bytes to 8 MiB.
pub fn all_sizes() -> Vec<usize> {
    (1..=23).map(|i| 1usize << i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_statistics() {
        let mut s: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        let l = Latency::from_ns(&mut s, 2.0).unwrap();
        assert_eq!(l.t_min_us, 0.5);
        assert_eq!(l.t_max_us, 500.0);
        assert_eq!(l.p99_us, 495.0);
        assert_eq!(l.p999_us, 499.5);
        assert!((l.t_avg_us - 250.25).abs() < 1e-9);
        assert!(Latency::from_ns(&mut [], 1.0).is_none());
    }

    #[test]
    fn json_keys_are_stable_and_absent_where_they_do_not_apply() {
        let r = Report {
            test: "write_bw".into(),
            transport: Some("RC".into()),
            provider: Some("soft".into()),
            workers: Some(1),
            bytes: 65536,
            iterations: 1000,
            bw_peak_mbps: Some(1.0),
            bw_avg_mbps: Some(1.0),
            msg_rate_mpps: Some(0.5),
            lat: None,
        };
        let j = r.to_json();
        for k in [
            "test",
            "transport",
            "provider",
            "workers",
            "bytes",
            "iterations",
            "bw_peak_mbps",
            "bw_avg_mbps",
            "msg_rate_mpps",
        ] {
            assert!(j.contains(&format!("\"{k}\":")), "{k} in {j}");
        }
        assert!(!j.contains("t_min_us"));
        let mut s = vec![1000, 2000];
        let l = Report { lat: Latency::from_ns(&mut s, 1.0), bw_peak_mbps: None, ..r };
        let j = l.to_json();
        for k in
            ["t_min_us", "t_max_us", "t_typical_us", "t_avg_us", "stdev_us", "p99_us", "p999_us"]
        {
            assert!(j.contains(&format!("\"{k}\":")), "{k} in {j}");
        }
        assert!(!j.contains("bw_peak_mbps"));
        assert_eq!(all_sizes().first(), Some(&2));
        assert_eq!(all_sizes().last(), Some(&(8 << 20)));
    }
}
