//! `weir report`'s plots, drawn with `plotters` into SVG strings: throughput over time, ack
//! latency percentiles over time, the latency's percentile distribution (HdrHistogram's plot:
//! percentiles on a `1 / (1 - q)` axis) and checkpoint durations per phase.

use plotters::prelude::*;

use super::data::{Checkpoint, Load};

const SIZE: (u32, u32) = (860, 380);
const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing a plot: {e:?}")
}

/// A line chart of `series` (name, points) over `x`, in an SVG string.
fn lines(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(&str, Vec<(f64, f64)>)],
    log_y: bool,
) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let all = series.iter().flat_map(|(_, p)| p.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for (x, y) in all {
            (x0, x1, y0, y1) = (x0.min(*x), x1.max(*x), y0.min(*y), y1.max(*y));
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        let mut chart = ChartBuilder::on(&root);
        chart.caption(title, ("sans-serif", 20)).margin(12).x_label_area_size(40).y_label_area_size(70);
        macro_rules! draw {
            ($chart:expr) => {{
                let mut c = $chart;
                c.configure_mesh().x_desc(x_desc).y_desc(y_desc).light_line_style(WHITE).draw().map_err(err)?;
                for (i, (name, points)) in series.iter().enumerate() {
                    let color = COLORS[i % COLORS.len()];
                    c.draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
                        .map_err(err)?
                        .label(*name)
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                }
                c.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(err)?;
            }};
        }
        if log_y {
            let lo = y0.max(1e-3) / 1.5;
            let hi = (y1.max(lo * 10.0)) * 1.5;
            draw!(chart.build_cartesian_2d(x0..x1, (lo..hi).log_scale()).map_err(err)?);
        } else {
            let hi = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
            draw!(chart.build_cartesian_2d(x0..x1, 0.0..hi).map_err(err)?);
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Events acknowledged per second, over the load.
pub fn throughput(load: &Load) -> anyhow::Result<String> {
    // (end, events, seconds) per interval; the last, short one (the load's end) joins the one
    // before, so that its few acks over a few milliseconds do not read as a burst.
    let mut spans: Vec<(f64, u64, f64)> = Vec::new();
    for i in load.intervals.iter().filter(|i| i.length_s > 0.0) {
        match spans.last_mut() {
            Some(last) if i.length_s < 0.5 => {
                *last = (i.at_s + i.length_s, last.1 + i.histogram.len(), last.2 + i.length_s);
            }
            _ => spans.push((i.at_s + i.length_s, i.histogram.len(), i.length_s)),
        }
    }
    let points: Vec<(f64, f64)> = spans.iter().map(|(end, n, len)| (*end, *n as f64 / len / 1e6)).collect();
    lines(
        "Throughput",
        "seconds since the load started",
        "M events acknowledged / s",
        &[("acknowledged", points)],
        false,
    )
}

/// Ack latency p50, p90, p99 and max per interval.
pub fn latency_over_time(load: &Load) -> anyhow::Result<String> {
    let mut series = Vec::new();
    for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)] {
        let points = load
            .intervals
            .iter()
            .filter(|i| !i.histogram.is_empty())
            .map(|i| (i.at_s + i.length_s, i.histogram.value_at_quantile(q) as f64 / 1000.0))
            .collect();
        series.push((name, points));
    }
    lines("Ack latency over time", "seconds since the load started", "ms (log scale)", &series, true)
}

/// The whole load's ack latency by percentile.
pub fn distribution(load: &Load) -> anyhow::Result<String> {
    let h = &load.total;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        // x = 1 / (1 - q): 1 (p0) to 10^6 (p99.9999), where the tail is readable.
        let mut points = Vec::new();
        let mut x = 1.0f64;
        while x <= 1e6 {
            let q = 1.0 - 1.0 / x;
            points.push((x, (h.value_at_quantile(q) as f64 / 1000.0).max(1e-3)));
            x *= 1.05;
        }
        let hi = points.iter().map(|p| p.1).fold(1e-3, f64::max) * 1.5;
        let lo = points.iter().map(|p| p.1).fold(f64::MAX, f64::min) / 1.5;
        let mut chart = ChartBuilder::on(&root)
            .caption("Ack latency by percentile", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((1.0..1e6).log_scale(), (lo..hi).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("ms (log scale)")
            .light_line_style(WHITE)
            .x_label_formatter(&|x| percentile_label(*x))
            .draw()
            .map_err(err)?;
        chart.draw_series(LineSeries::new(points, COLORS[0].stroke_width(2))).map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn percentile_label(x: f64) -> String {
    let p = 100.0 * (1.0 - 1.0 / x);
    if p < 1e-9 { "0%".into() } else { format!("{}%", trim(p)) }
}

fn trim(p: f64) -> String {
    let s = format!("{p:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Committed checkpoints' durations per phase, by start.
pub fn checkpoints(cps: &[Checkpoint], zero_ms: f64) -> anyhow::Result<String> {
    let at = |c: &Checkpoint| (c.started_ms - zero_ms) / 1000.0;
    let committed: Vec<&Checkpoint> = cps.iter().filter(|c| c.committed).collect();
    let series: Vec<(&str, Vec<(f64, f64)>)> = vec![
        ("trigger to commit", committed.iter().map(|c| (at(c), c.end_to_end_ms.max(1e-3))).collect()),
        ("alignment", committed.iter().map(|c| (at(c), c.alignment_ms.max(1e-3))).collect()),
        ("synchronous snapshot", committed.iter().map(|c| (at(c), c.snapshot_ms.max(1e-3))).collect()),
        ("upload", committed.iter().map(|c| (at(c), c.upload_ms.max(1e-3))).collect()),
    ];
    lines(
        "Checkpoint durations per phase",
        "checkpoint start, seconds since the load started",
        "ms (log scale)",
        &series,
        true,
    )
}
