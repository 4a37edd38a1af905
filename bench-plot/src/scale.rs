//! Draws `scripts/bench.sh scale`: how each workload's cost grows with its
//! size N (held locks, queue length, leases expiring at once, watchers,
//! keys), one log-log panel per measured figure, each system one colour.
//!
//! Input: JSON lines, one per measured point:
//! `{"panel": "held locks: Lock+Unlock", "unit": "ms", "x": "locks held", "system": "etcd", "series": "p99",
//! "n": 10000, "value": 23.8}`. Within a panel, a system's series are told
//! apart by their line: the first series named in the input is solid, the
//! next dashed, and so on. Where a point was measured more than once (files
//! concatenated), the median value is drawn.
//!
//! Invariants: every point drawn is a measured one, never interpolated; a
//! value that a log axis cannot show (zero or less) is left out, and the
//! panel says how many were. Panels keep the order of their first line.

use std::collections::BTreeMap;

use anyhow::Context;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::FONT;

#[derive(serde::Deserialize)]
struct Row {
    panel: String,
    unit: String,
    x: String,
    system: String,
    series: String,
    n: u64,
    value: f64,
}

/// One panel's points: (system, series) -> n -> the values measured.
#[derive(Default)]
struct Panel {
    unit: String,
    x: String,
    lines: BTreeMap<(String, String), BTreeMap<u64, Vec<f64>>>,
    /// Series names in the order first seen (their dash styles).
    series: Vec<String>,
    left_out: usize,
}

/// Each system's colour; systems not named here are drawn in grey.
fn colour(system: &str) -> RGBColor {
    match system {
        "etcd" => RGBColor(214, 96, 39),
        "raftlock" => RGBColor(31, 100, 180),
        "raftlock native" => RGBColor(44, 150, 70),
        _ => RGBColor(120, 120, 120),
    }
}

pub fn draw(input: &str, out: &str, title: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(input).with_context(|| format!("reading {input}"))?;
    let mut panels: Vec<(String, Panel)> = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let row: Row = serde_json::from_str(line).with_context(|| format!("{input}:{}", i + 1))?;
        let at = match panels.iter().position(|(name, _)| *name == row.panel) {
            Some(at) => at,
            None => {
                let panel = Panel { unit: row.unit.clone(), x: row.x.clone(), ..Panel::default() };
                panels.push((row.panel.clone(), panel));
                panels.len() - 1
            }
        };
        let panel = &mut panels[at].1;
        if !panel.series.contains(&row.series) {
            panel.series.push(row.series.clone());
        }
        if row.value > 0.0 && row.value.is_finite() {
            panel.lines.entry((row.system, row.series)).or_default().entry(row.n).or_default().push(row.value);
        } else {
            panel.left_out += 1;
        }
    }
    anyhow::ensure!(!panels.is_empty(), "{input}: no points");
    let rows = panels.len().div_ceil(2);
    let root = SVGBackend::new(out, (1200, 380 * rows as u32 + 40)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, (FONT, 22))?;
    for (area, (name, panel)) in root.split_evenly((rows, 2)).iter().zip(&panels) {
        draw_panel(area, name, panel)?;
    }
    root.present()?;
    Ok(())
}

/// The median of a point's values (the lower of the middle two).
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

fn draw_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, name: &str, panel: &Panel) -> anyhow::Result<()> {
    let points: Vec<(f64, f64)> =
        panel.lines.values().flat_map(|line| line.iter().map(|(&n, v)| (n as f64, median(v)))).collect();
    if points.is_empty() {
        return Ok(());
    }
    let (x_lo, x_hi) = points.iter().fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let (y_lo, y_hi) = points.iter().fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let caption = match panel.left_out {
        0 => name.to_string(),
        n => format!("{name} ({n} not drawn: 0)"),
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            ((x_lo / 1.5)..(x_hi * 1.5)).log_scale(),
            ((y_lo / 2.0)..(y_hi * 2.0).max(y_lo * 10.0)).log_scale(),
        )?;
    // Only the labelled lines: a log axis's minor lines would grey the panel.
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_labels(6)
        .y_labels(6)
        .x_desc(panel.x.as_str())
        .y_desc(panel.unit.as_str())
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| if *y < 1.0 { format!("{y:.2}") } else { format!("{y:.0}") })
        .draw()?;
    for ((system, series), line) in &panel.lines {
        let color = colour(system);
        let points: Vec<(f64, f64)> = line.iter().map(|(&n, v)| (n as f64, median(v))).collect();
        let dashed = panel.series.iter().position(|s| s == series).unwrap_or(0) > 0;
        let label = if panel.series.len() > 1 { format!("{system} {series}") } else { system.clone() };
        let style = color.stroke_width(2);
        match dashed {
            false => chart
                .draw_series(LineSeries::new(points.clone(), style))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style)),
            true => chart
                .draw_series(DashedLineSeries::new(points.clone(), 6, 4, style))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 8, y)], style)),
        };
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
