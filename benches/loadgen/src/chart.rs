//! SVG chart: throughput and p99 against concurrency, one line per target, one row of
//! two panels per pipeline depth.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use crate::report::Summary;
use crate::targets::TargetKind;
use crate::workload::Status;

fn color(kind: TargetKind) -> RGBColor {
    match kind {
        TargetKind::StockgateNo => RGBColor(0, 110, 50),
        TargetKind::StockgateEverysec => RGBColor(40, 170, 80),
        TargetKind::StockgateAlways => RGBColor(120, 210, 120),
        TargetKind::RedisLua => RGBColor(200, 30, 30),
        TargetKind::RedisLuaAof => RGBColor(240, 110, 60),
        TargetKind::RedisPerUser => RGBColor(180, 90, 160),
        TargetKind::PgHotRow => RGBColor(30, 70, 200),
        TargetKind::PgRows16 => RGBColor(90, 160, 230),
        TargetKind::RedisGetDecr => RGBColor(120, 120, 120),
        TargetKind::StockgateAtAddr => RGBColor(0, 140, 140),
    }
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart: {e}")
}

/// 1-2-5 ticks between `lo` and `hi` (log axes get sparse labels otherwise).
fn ticks_125(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    if !(lo > 0.0 && hi > lo) {
        return out;
    }
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let v = decade * m;
            if v >= lo && v <= hi {
                out.push(v);
            }
        }
        decade *= 10.0;
    }
    out
}

pub fn draw(path: &Path, sums: &[Summary], targets: &[TargetKind]) -> Result<()> {
    let points: Vec<&Summary> = sums
        .iter()
        .filter(|s| s.workload == "throughput" && s.status != Status::Error && s.ops_per_sec > 0.0)
        .collect();
    let mut pipelines: Vec<usize> = points.iter().map(|s| s.pipeline).collect();
    pipelines.sort_unstable();
    pipelines.dedup();
    if pipelines.is_empty() {
        return Err(anyhow!("no throughput points to chart"));
    }
    let root = SVGBackend::new(path, (1300, 60 + 460 * pipelines.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (legend, grid) = root.split_vertically(60);
    // One legend for all panels, above them (inside a panel it hides lines).
    let present: Vec<TargetKind> = targets
        .iter()
        .copied()
        .filter(|t| points.iter().any(|s| s.target == t.name()))
        .collect();
    let per_row = 4;
    for (i, t) in present.iter().enumerate() {
        let x = 20 + (i % per_row) as i32 * 320;
        let y = 14 + (i / per_row) as i32 * 22;
        let col = color(*t);
        legend
            .draw(&PathElement::new(
                vec![(x, y + 7), (x + 28, y + 7)],
                col.stroke_width(3),
            ))
            .map_err(err)?;
        legend
            .draw(&Text::new(
                t.name().to_string(),
                (x + 36, y),
                ("sans-serif", 15).into_font(),
            ))
            .map_err(err)?;
    }
    let rows = grid.split_evenly((pipelines.len(), 2));
    let c_min = points
        .iter()
        .map(|s| s.concurrency)
        .min()
        .unwrap_or(1)
        .max(1) as f64;
    let c_max = points
        .iter()
        .map(|s| s.concurrency)
        .max()
        .unwrap_or(1)
        .max(2) as f64;
    // Ticks at the measured concurrencies.
    let mut c_ticks: Vec<f64> = points.iter().map(|s| s.concurrency as f64).collect();
    c_ticks.sort_by(|a, b| a.total_cmp(b));
    c_ticks.dedup();
    for (i, &p) in pipelines.iter().enumerate() {
        let here: Vec<&&Summary> = points.iter().filter(|s| s.pipeline == p).collect();
        for (j, metric) in ["throughput (ops/s)", "p99 latency (ms)"]
            .iter()
            .enumerate()
        {
            let value = |s: &Summary| {
                if j == 0 {
                    s.ops_per_sec
                } else {
                    s.p99_us / 1000.0
                }
            };
            let vals: Vec<f64> = here.iter().map(|s| value(s)).filter(|v| *v > 0.0).collect();
            let lo = vals.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = vals.iter().cloned().fold(0.0, f64::max);
            if vals.is_empty() {
                continue;
            }
            let area = &rows[i * 2 + j];
            let mut chart = ChartBuilder::on(area)
                .caption(format!("{metric}, pipeline {p}"), ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(
                    (c_min * 0.8..c_max * 1.25)
                        .log_scale()
                        .with_key_points(c_ticks.clone()),
                    (lo / 2.0..hi * 2.0)
                        .log_scale()
                        .with_key_points(ticks_125(lo / 2.0, hi * 2.0)),
                )
                .map_err(err)?;
            chart
                .configure_mesh()
                .light_line_style(TRANSPARENT)
                .x_desc("concurrent connections (C)")
                .y_desc(*metric)
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&|v| {
                    if j == 0 {
                        crate::report::fmt_ops(*v)
                    } else {
                        format!("{v:.2}")
                    }
                })
                .draw()
                .map_err(err)?;
            for &t in targets {
                let mut series: Vec<(f64, f64)> = here
                    .iter()
                    .filter(|s| s.target == t.name())
                    .map(|s| (s.concurrency as f64, value(s)))
                    .filter(|(_, v)| *v > 0.0)
                    .collect();
                if series.is_empty() {
                    continue;
                }
                series.sort_by(|a, b| a.0.total_cmp(&b.0));
                let col = color(t);
                chart
                    .draw_series(LineSeries::new(series.clone(), col.stroke_width(2)))
                    .map_err(err)?;
                chart
                    .draw_series(
                        series
                            .iter()
                            .map(|&(x, y)| Circle::new((x, y), 3, col.filled())),
                    )
                    .map_err(err)?;
            }
        }
    }
    root.present().map_err(err)?;
    Ok(())
}
