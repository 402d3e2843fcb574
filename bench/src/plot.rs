//! `ciphermq-bench plot`: one run of a `--json` result as an SVG image, so a
//! soak's latency and memory over time can be looked at, not only summed
//! up: latency per second (p50 and p99 of acks, p99 of deliveries, the
//! worst ack per 100 ms) above broker RSS and CPU.

use std::path::Path;

use anyhow::{bail, Context, Result};
use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;
use serde_json::Value;

use crate::args::PlotArgs;

/// Image size, pixels.
const SIZE: (u32, u32) = (1200, 900);

/// One line of a chart.
struct Series {
    label: &'static str,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// Draws the run.
pub fn run(args: &PlotArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.json)
        .with_context(|| format!("reading {}", args.json.display()))?;
    let report: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a bench result (JSON)", args.json.display()))?;
    let run = report["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["target"] == "ciphermq")
        .nth(args.run.saturating_sub(1))
        .with_context(|| format!("{} has no CipherMQ run {}", args.json.display(), args.run))?;
    draw(&args.out, &title(&report, run), run)?;
    println!("wrote {}", args.out.display());
    Ok(())
}

fn title(report: &Value, run: &Value) -> String {
    let q = &run["publish_to_ack"];
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    format!(
        "{}: {:.0} msg/s acked; ack p50 {:.2} / p99 {:.2} / p99.9 {:.2} / max {:.1} ms",
        report["scenario"]["label"].as_str().unwrap_or("ciphermq"),
        f(&run["publish_msgs_per_sec"]),
        f(&q["p50_ms"]),
        f(&q["p99_ms"]),
        f(&q["p999_ms"]),
        f(&q["max_ms"]),
    )
}

/// `(x, y)` for each value of `key` in `obj`, x stepping by `step` seconds;
/// zeros (nothing sent in that window) are left out.
fn per_window(obj: &Value, key: &str, step: f64) -> Vec<(f64, f64)> {
    obj[key]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, v)| {
            v.as_f64()
                .filter(|y| *y > 0.0)
                .map(|y| (i as f64 * step, y))
        })
        .collect()
}

fn samples(run: &Value, key: &str) -> Vec<(f64, f64)> {
    run["broker_timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| Some((s["at_secs"].as_f64()?, s[key].as_f64()?)))
        .collect()
}

fn draw(out: &Path, title: &str, run: &Value) -> Result<()> {
    let ack = &run["ack_timeline"];
    let delivery = &run["delivery_timeline"];
    let window = ack["window_ms"].as_f64().unwrap_or(100.0) / 1000.0;
    let latency = [
        Series {
            label: "ack: worst per 100 ms",
            color: RGBColor(200, 200, 200),
            points: per_window(ack, "worst_ms", window),
        },
        Series {
            label: "ack: p99 per second",
            color: RED,
            points: per_window(ack, "p99_ms_per_sec", 1.0),
        },
        Series {
            label: "ack: p50 per second",
            color: BLUE,
            points: per_window(ack, "p50_ms_per_sec", 1.0),
        },
        Series {
            label: "delivery: p99 per second",
            color: RGBColor(0, 150, 0),
            points: per_window(delivery, "p99_ms_per_sec", 1.0),
        },
    ];
    if latency.iter().all(|s| s.points.is_empty()) {
        bail!("the run has no latency timeline (a result from an older bench?)");
    }
    let rss = [Series {
        label: "broker RSS, MiB",
        color: RGBColor(120, 0, 160),
        points: samples(run, "rss_mib"),
    }];
    let cpu = [Series {
        label: "broker CPU, cores",
        color: RGBColor(200, 110, 0),
        points: samples(run, "cpu_cores"),
    }];

    let root = SVGBackend::new(out, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 18))?;
    let (top, bottom) = root.split_vertically(SIZE.1 * 55 / 100);
    let (middle, bottom) = bottom.split_vertically((SIZE.1 - 40) * 45 / 100 / 2);
    let x_end = latency
        .iter()
        .chain(&rss)
        .flat_map(|s| s.points.last().map(|p| p.0))
        .fold(1.0, f64::max);
    chart(
        &top,
        "publish → ack / delivery, ms (log)",
        x_end,
        &latency,
        true,
    )?;
    chart(&middle, "MiB", x_end, &rss, false)?;
    chart(&bottom, "cores", x_end, &cpu, false)?;
    root.present()
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

fn chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    y_desc: &str,
    x_end: f64,
    series: &[Series],
    log: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let y_max = ys.clone().fold(0.0, f64::max).max(1e-3) * 1.2;
    let y_min = ys.fold(f64::INFINITY, f64::min);
    let mut builder = ChartBuilder::on(area);
    builder
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60);
    let x = 0.0..x_end;
    if log {
        let lo = (y_min.min(y_max) * 0.8).max(0.01);
        let mut chart = builder.build_cartesian_2d(x, (lo..y_max).log_scale())?;
        lines(&mut chart, y_desc, series)
    } else {
        let mut chart = builder.build_cartesian_2d(x, 0.0..y_max)?;
        lines(&mut chart, y_desc, series)
    }
}

/// The axes, `series` and their legend.
fn lines<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    y_desc: &str,
    series: &[Series],
) -> Result<()>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(y_desc)
        .draw()?;
    for s in series {
        let color = s.color;
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color))?
            .label(s.label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    Ok(())
}
