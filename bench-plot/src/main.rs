//! Draws `scripts/bench.sh`'s pictures: the client sweep, and with
//! `--scale` how cost grows with size (`scale`, `scripts/bench.sh scale`).
//!
//! The sweep is one SVG: for each workload
//! (put, lock), throughput against the number of clients, and p50 and p99
//! latency against the number of clients, each system (etcd, raftlock) one
//! colour.
//!
//! Input: the sweep's JSON lines, one per measured point:
//! `{"system": "etcd", "workload": "put", "clients": 16, "r": {"ops_per_sec": ..., "p50_ms": ..., "p99_ms": ...,
//! "driver": ...}}` (`r` is a `raftlockctl bench -w json` report). Usage:
//! `bench-plot SWEEP.jsonl OUT.svg TITLE`. The input may hold several runs
//! (files concatenated): where a point was measured more than once, the
//! measurement with the median throughput is drawn (its own latencies).
//!
//! Invariant: every point drawn is a measured one; a point missing from the
//! input is missing from the picture (its line joins the points around it),
//! never interpolated into a value. Caveat: SVG text is rendered by the
//! viewer, so label widths are estimates and the fonts are the viewer's.

use std::collections::BTreeMap;

use anyhow::Context;
use plotters::coord::Shift;
use plotters::prelude::*;

mod scale;

#[derive(serde::Deserialize)]
struct Point {
    system: String,
    workload: String,
    clients: u32,
    r: Report,
}

#[derive(serde::Deserialize)]
struct Report {
    ops_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// One measurement: throughput, p50 and p99 latency.
type Measured = (f64, f64, f64);
/// A system's measured points for one workload, by client count.
type Series = BTreeMap<u32, Measured>;

const SYSTEMS: [(&str, RGBColor); 2] = [("etcd", RGBColor(214, 96, 39)), ("raftlock", RGBColor(31, 100, 180))];
pub(crate) const FONT: &str = "sans-serif";

/// A workload's name in the picture, and what its requests are.
fn describe(workload: &str) -> (&str, &str) {
    match workload {
        "put" => ("put (256-byte values)", "puts/s"),
        "lock" => ("Lock+Unlock (a lock per client)", "cycles/s"),
        other => (other, "requests/s"),
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--scale") {
        anyhow::ensure!(args.len() == 5, "usage: bench-plot --scale SCALE.jsonl OUT.svg TITLE");
        return scale::draw(&args[2], &args[3], &args[4]);
    }
    anyhow::ensure!(args.len() == 4, "usage: bench-plot SWEEP.jsonl OUT.svg TITLE | --scale SCALE.jsonl OUT.svg TITLE");
    let text = std::fs::read_to_string(&args[1]).with_context(|| format!("reading {}", args[1]))?;
    // Every measurement of each point, by (workload, system, clients).
    let mut measured: BTreeMap<(String, String, u32), Vec<Measured>> = BTreeMap::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let p: Point = serde_json::from_str(line).with_context(|| format!("{}:{}", args[1], n + 1))?;
        measured.entry((p.workload, p.system, p.clients)).or_default().push((p.r.ops_per_sec, p.r.p50_ms, p.r.p99_ms));
    }
    // workload -> system -> clients -> (ops/s, p50, p99) of the median run
    let mut data: BTreeMap<String, BTreeMap<String, Series>> = BTreeMap::new();
    for ((workload, system, clients), mut runs) in measured {
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        data.entry(workload).or_default().entry(system).or_default().insert(clients, runs[(runs.len() - 1) / 2]);
    }
    anyhow::ensure!(!data.is_empty(), "{}: no points", args[1]);

    let root = SVGBackend::new(&args[2], (1200, 420 * data.len() as u32 + 40)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&args[3], (FONT, 22))?;
    for (row, (workload, systems)) in root.split_evenly((data.len(), 1)).iter().zip(&data) {
        let (left, right) = row.split_horizontally(600);
        throughput(&left, workload, systems)?;
        latency(&right, workload, systems)?;
    }
    root.present()?;
    Ok(())
}

/// The client counts' axis: logarithmic, over the counts measured.
fn clients_range(systems: &BTreeMap<String, Series>) -> std::ops::Range<f64> {
    let counts = systems.values().flat_map(|s| s.keys().copied());
    let (lo, hi) = counts.fold((u32::MAX, 1), |(lo, hi), c| (lo.min(c), hi.max(c)));
    (lo.min(hi) as f64 / 1.25)..(hi as f64 * 1.25)
}

fn throughput(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    workload: &str,
    systems: &BTreeMap<String, Series>,
) -> anyhow::Result<()> {
    let top = systems.values().flat_map(|s| s.values().map(|v| v.0)).fold(0.0, f64::max) * 1.1;
    let (name, unit) = describe(workload);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{name}: throughput"), (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(clients_range(systems).log_scale(), 0.0..top.max(1.0))?;
    chart
        .configure_mesh()
        .x_desc("concurrent clients")
        .y_desc(unit)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    for (name, color) in SYSTEMS {
        let Some(series) = systems.get(name) else { continue };
        let points: Vec<(f64, f64)> = series.iter().map(|(&c, v)| (c as f64, v.0)).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart.configure_series_labels().position(SeriesLabelPosition::UpperLeft).border_style(BLACK).draw()?;
    Ok(())
}

fn latency(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    workload: &str,
    systems: &BTreeMap<String, Series>,
) -> anyhow::Result<()> {
    let values = || systems.values().flat_map(|s| s.values().flat_map(|v| [v.1, v.2]));
    let lo = values().filter(|v| *v > 0.0).fold(f64::MAX, f64::min).min(1.0);
    let hi = values().fold(0.0, f64::max).max(lo * 10.0);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{}: latency (p50 solid, p99 dashed)", describe(workload).0), (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(clients_range(systems).log_scale(), ((lo / 1.5)..(hi * 1.5)).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("concurrent clients")
        .y_desc("milliseconds")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| if *y < 1.0 { format!("{y:.2}") } else { format!("{y:.0}") })
        .draw()?;
    for (name, color) in SYSTEMS {
        let Some(series) = systems.get(name) else { continue };
        let p50: Vec<(f64, f64)> = series.iter().map(|(&c, v)| (c as f64, v.1)).collect();
        let p99: Vec<(f64, f64)> = series.iter().map(|(&c, v)| (c as f64, v.2)).collect();
        chart
            .draw_series(LineSeries::new(p50.clone(), color.stroke_width(2)))?
            .label(format!("{name} p50"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(p50.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        chart
            .draw_series(DashedLineSeries::new(p99.clone(), 6, 4, color.stroke_width(2)))?
            .label(format!("{name} p99"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 8, y)], color.stroke_width(2)));
        chart.draw_series(p99.iter().map(|&p| TriangleMarker::new(p, 5, color.filled())))?;
    }
    chart.configure_series_labels().position(SeriesLabelPosition::UpperLeft).border_style(BLACK).draw()?;
    Ok(())
}
