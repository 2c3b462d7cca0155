//! `--plot FILE.svg`: the reports of a run against message size (log scale): bandwidth (peak
//! and average) and message rate for bandwidth tests, latency (typical, average, 99%) for
//! latency tests.

use std::path::Path;

use plotters::prelude::*;

use super::Report;

fn size_label(x: &f64) -> String {
    let b = *x as u64;
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

type Series<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    y_desc: &str,
    series: &[Series<'_>],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let pts = series.iter().flat_map(|s| s.2.iter());
    let (mut xmin, mut xmax, mut ymax) = (f64::MAX, 1.0f64, 0.0f64);
    for &(x, y) in pts {
        xmin = xmin.min(x);
        xmax = xmax.max(x);
        ymax = ymax.max(y);
    }
    if xmin > xmax {
        xmin = 1.0;
    }
    if xmax <= xmin {
        xmax = xmin * 2.0;
    }
    let ymax = if ymax > 0.0 { ymax * 1.1 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((xmin..xmax).log_scale(), 0.0..ymax)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("message size [bytes]")
        .y_desc(y_desc)
        .x_label_formatter(&size_label)
        .draw()
        .map_err(e)?;
    for (name, color, points) in series {
        let color = *color;
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(e)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(e)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(e)?;
    Ok(())
}

/// Draws `reports` (one test's, one per size) into an SVG file at `path`.
pub fn plot(path: &Path, title: &str, reports: &[Report]) -> Result<(), String> {
    if reports.is_empty() {
        return Err("nothing to plot".into());
    }
    let root = SVGBackend::new(path, (900, 800)).into_drawing_area();
    let e = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (top, bottom) = root.split_vertically(400);
    let pts = |f: &dyn Fn(&Report) -> Option<f64>| -> Vec<(f64, f64)> {
        reports.iter().filter_map(|r| f(r).map(|y| (r.bytes as f64, y))).collect()
    };
    if reports[0].lat.is_some() {
        let lat = |g: fn(&super::Latency) -> f64| pts(&move |r: &Report| r.lat.as_ref().map(g));
        panel(
            &top,
            &format!("{title}: latency"),
            "latency [us]",
            &[
                ("typical", BLUE, lat(|l| l.t_typical_us)),
                ("average", GREEN, lat(|l| l.t_avg_us)),
                ("99%", RED, lat(|l| l.p99_us)),
            ],
        )?;
        panel(
            &bottom,
            &format!("{title}: latency spread"),
            "latency [us]",
            &[("min", BLUE, lat(|l| l.t_min_us)), ("99.9%", RED, lat(|l| l.p999_us))],
        )?;
    } else {
        panel(
            &top,
            &format!("{title}: bandwidth"),
            "bandwidth [MB/s]",
            &[
                ("peak", RED, pts(&|r: &Report| r.bw_peak_mbps)),
                ("average", BLUE, pts(&|r: &Report| r.bw_avg_mbps)),
            ],
        )?;
        panel(
            &bottom,
            &format!("{title}: message rate"),
            "message rate [Mpps]",
            &[("rate", GREEN, pts(&|r: &Report| r.msg_rate_mpps))],
        )?;
    }
    root.present().map_err(e)?;
    Ok(())
}
