//! Medians over runs, the stdout tables, the ratios and the JSON document.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::targets::TargetKind;
use crate::workload::{PointResult, Status};

/// One point, summarised over all runs (medians; worst status).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub target: String,
    pub workload: String,
    pub concurrency: usize,
    pub pipeline: usize,
    pub runs: usize,
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub sellout_ms: Option<f64>,
    pub reserved: u64,
    pub units: Option<u64>,
    pub buyers: u32,
    pub status: Status,
    pub problems: Vec<String>,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn severity(s: Status) -> u8 {
    match s {
        Status::Ok => 0,
        Status::Failed => 1,
        Status::Error => 2,
        Status::Oversold => 3,
    }
}

/// Group the runs' results by point and take medians. Order: targets as given, then
/// workload, pipeline, concurrency.
pub fn summarize(runs: &[Vec<PointResult>], order: &[TargetKind]) -> Vec<Summary> {
    type Key = (usize, String, usize, usize);
    let mut groups: BTreeMap<Key, Vec<&PointResult>> = BTreeMap::new();
    for run in runs {
        for p in run {
            let t = order
                .iter()
                .position(|k| k.name() == p.target)
                .unwrap_or(usize::MAX);
            groups
                .entry((t, p.workload.clone(), p.pipeline, p.concurrency))
                .or_default()
                .push(p);
        }
    }
    groups
        .into_values()
        .filter_map(|ps| {
            let first = *ps.first()?;
            let ok: Vec<&&PointResult> = ps.iter().filter(|p| p.status != Status::Error).collect();
            let status = ps
                .iter()
                .map(|p| p.status)
                .max_by_key(|s| severity(*s))
                .unwrap_or(Status::Error);
            let mut problems: Vec<String> = Vec::new();
            for p in &ps {
                for pr in &p.problems {
                    if !problems.contains(pr) {
                        problems.push(pr.clone());
                    }
                }
            }
            let sellouts: Vec<f64> = ok.iter().filter_map(|p| p.sellout_ms).collect();
            Some(Summary {
                target: first.target.clone(),
                workload: first.workload.clone(),
                concurrency: first.concurrency,
                pipeline: first.pipeline,
                runs: ps.len(),
                ops_per_sec: median(ok.iter().map(|p| p.ops_per_sec).collect()),
                p50_us: median(ok.iter().map(|p| p.p50_us).collect()),
                p99_us: median(ok.iter().map(|p| p.p99_us).collect()),
                p999_us: median(ok.iter().map(|p| p.p999_us).collect()),
                sellout_ms: if sellouts.len() == ok.len() && !ok.is_empty() {
                    Some(median(sellouts))
                } else {
                    None
                },
                reserved: ok.iter().map(|p| p.reserved).max().unwrap_or(0),
                units: first.units,
                buyers: first.buyers,
                status,
                problems,
            })
        })
        .collect()
}

/// A ratio of stockgate to a baseline at one (C, P).
#[derive(Clone, Debug, Serialize)]
pub struct Ratio {
    pub stockgate: String,
    pub baseline: String,
    pub concurrency: usize,
    pub pipeline: usize,
    /// stockgate ops/s ÷ baseline ops/s.
    pub throughput_x: f64,
    /// stockgate p99 ÷ baseline p99 (below 1: stockgate's tail is lower).
    pub p99_ratio: f64,
}

/// The comparisons the closing note asks for: each pair has comparable durability.
pub const PAIRS: [(TargetKind, TargetKind); 6] = [
    (TargetKind::StockgateNo, TargetKind::RedisLua),
    (TargetKind::StockgateEverysec, TargetKind::RedisLuaAof),
    (TargetKind::StockgateNo, TargetKind::RedisPerUser),
    (TargetKind::StockgateAlways, TargetKind::PgHotRow),
    (TargetKind::StockgateEverysec, TargetKind::PgHotRow),
    (TargetKind::StockgateAlways, TargetKind::PgRows16),
];

pub fn ratios(sums: &[Summary]) -> Vec<Ratio> {
    let find = |t: TargetKind, c: usize, p: usize| {
        sums.iter().find(|s| {
            s.workload == "throughput"
                && s.target == t.name()
                && s.concurrency == c
                && s.pipeline == p
                && s.status != Status::Error
                && s.ops_per_sec > 0.0
        })
    };
    let mut out = Vec::new();
    for (sg, base) in PAIRS {
        for s in sums
            .iter()
            .filter(|s| s.workload == "throughput" && s.target == sg.name())
        {
            if let (Some(a), Some(b)) = (
                find(sg, s.concurrency, s.pipeline),
                find(base, s.concurrency, s.pipeline),
            ) {
                out.push(Ratio {
                    stockgate: sg.name().into(),
                    baseline: base.name().into(),
                    concurrency: s.concurrency,
                    pipeline: s.pipeline,
                    throughput_x: a.ops_per_sec / b.ops_per_sec,
                    p99_ratio: if b.p99_us > 0.0 {
                        a.p99_us / b.p99_us
                    } else {
                        0.0
                    },
                });
            }
        }
    }
    out
}

pub fn fmt_ops(v: f64) -> String {
    if v >= 1_000_000.0 {
        format!("{:.2}M", v / 1_000_000.0)
    } else if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.2}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

pub fn fmt_us(v: f64) -> String {
    if v >= 1_000_000.0 {
        format!("{:.2}s", v / 1_000_000.0)
    } else if v >= 1000.0 {
        format!("{:.2}ms", v / 1000.0)
    } else {
        format!("{v:.0}µs")
    }
}

fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < w.len() {
                w[i] = w[i].max(c.chars().count());
            }
        }
    }
    let mut s = String::new();
    let line = |s: &mut String, cells: &[String]| {
        s.push('|');
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i].saturating_sub(c.chars().count());
            if i == 0 {
                let _ = write!(s, " {c}{} |", " ".repeat(pad));
            } else {
                let _ = write!(s, " {}{c} |", " ".repeat(pad));
            }
        }
        s.push('\n');
    };
    line(
        &mut s,
        &headers.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
    );
    s.push('|');
    for (i, wi) in w.iter().enumerate() {
        if i == 0 {
            let _ = write!(s, "{}|", "-".repeat(wi + 2));
        } else {
            let _ = write!(s, "{}:|", "-".repeat(wi + 1));
        }
    }
    s.push('\n');
    for r in rows {
        line(&mut s, r);
    }
    s
}

/// The text report: storm table, throughput table, ratio table, headline checks.
pub fn render(sums: &[Summary], ratios: &[Ratio], runs: usize) -> String {
    let mut out = String::new();
    let storm: Vec<&Summary> = sums.iter().filter(|s| s.workload == "storm").collect();
    if !storm.is_empty() {
        let _ = writeln!(
            out,
            "\nStorm (median of {runs} run(s)): sell U units to N buyers, one request each\n"
        );
        let rows: Vec<Vec<String>> = storm
            .iter()
            .map(|s| {
                vec![
                    s.target.clone(),
                    format!("{}/{}", s.units.unwrap_or(0), s.buyers),
                    s.concurrency.to_string(),
                    s.pipeline.to_string(),
                    s.sellout_ms
                        .map(|v| format!("{v:.0}ms"))
                        .unwrap_or_else(|| "-".into()),
                    fmt_us(s.p50_us),
                    fmt_us(s.p99_us),
                    fmt_us(s.p999_us),
                    s.reserved.to_string(),
                    s.status.label().to_string(),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "target",
                "U/N",
                "C",
                "P",
                "sold out in",
                "p50",
                "p99",
                "p99.9",
                "reserved",
                "outcome",
            ],
            &rows,
        ));
    }
    let tput: Vec<&Summary> = sums.iter().filter(|s| s.workload == "throughput").collect();
    if !tput.is_empty() {
        let _ = writeln!(
            out,
            "\nThroughput (median of {runs} run(s)): unlimited stock, closed loop, C connections x pipeline P\n"
        );
        let rows: Vec<Vec<String>> = tput
            .iter()
            .map(|s| {
                vec![
                    s.target.clone(),
                    s.concurrency.to_string(),
                    s.pipeline.to_string(),
                    fmt_ops(s.ops_per_sec),
                    fmt_us(s.p50_us),
                    fmt_us(s.p99_us),
                    fmt_us(s.p999_us),
                    s.status.label().to_string(),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "target", "C", "P", "ops/s", "p50", "p99", "p99.9", "outcome",
            ],
            &rows,
        ));
    }
    if !ratios.is_empty() {
        let _ = writeln!(
            out,
            "\nRatios (throughput: stockgate ÷ baseline; p99: stockgate ÷ baseline, below 1 is better)\n"
        );
        let rows: Vec<Vec<String>> = ratios
            .iter()
            .map(|r| {
                vec![
                    format!("{} ÷ {}", r.stockgate, r.baseline),
                    r.concurrency.to_string(),
                    r.pipeline.to_string(),
                    format!("{:.1}x", r.throughput_x),
                    format!("{:.2}", r.p99_ratio),
                ]
            })
            .collect();
        out.push_str(&table(&["pair", "C", "P", "throughput", "p99"], &rows));
    }
    out.push_str(&headlines(ratios));
    let bad: Vec<&Summary> = sums.iter().filter(|s| s.status != Status::Ok).collect();
    if bad.is_empty() {
        let _ = writeln!(
            out,
            "\nOutcome checks: all {} points passed; no target oversold.",
            sums.len()
        );
    } else {
        let _ = writeln!(
            out,
            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
        );
        for s in bad {
            let _ = writeln!(
                out,
                "!!! {} {} C={} P={}: {} — {}",
                s.target,
                s.workload,
                s.concurrency,
                s.pipeline,
                s.status.label(),
                s.problems.join("; ")
            );
        }
        let _ = writeln!(
            out,
            "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
        );
    }
    out
}

fn headlines(ratios: &[Ratio]) -> String {
    let mut out = String::new();
    let get = |sg: TargetKind, base: TargetKind, c: usize, p: usize| {
        ratios.iter().find(|r| {
            r.stockgate == sg.name()
                && r.baseline == base.name()
                && r.concurrency == c
                && r.pipeline == p
        })
    };
    let mut lines = Vec::new();
    for (sg, base) in [
        (TargetKind::StockgateNo, TargetKind::RedisLua),
        (TargetKind::StockgateEverysec, TargetKind::RedisLuaAof),
    ] {
        if let Some(r) = get(sg, base, 50, 16) {
            lines.push(format!(
                "C=50 P=16  {} vs {}: {:.2}x throughput (target >= 5x) {}, p99 ratio {:.2} (target < 1) {}",
                r.stockgate,
                r.baseline,
                r.throughput_x,
                if r.throughput_x >= 5.0 { "MET" } else { "NOT MET" },
                r.p99_ratio,
                if r.p99_ratio < 1.0 { "MET" } else { "NOT MET" }
            ));
        }
    }
    for sg in [TargetKind::StockgateAlways, TargetKind::StockgateEverysec] {
        if let Some(r) = get(sg, TargetKind::PgHotRow, 200, 1) {
            lines.push(format!(
                "C=200 P=1  {} vs {}: {:.2}x throughput (target >= 50x) {}",
                r.stockgate,
                r.baseline,
                r.throughput_x,
                if r.throughput_x >= 50.0 {
                    "MET"
                } else {
                    "NOT MET"
                }
            ));
        }
    }
    if !lines.is_empty() {
        let _ = writeln!(out, "\nHeadline targets:");
        for l in lines {
            let _ = writeln!(out, "  {l}");
        }
    }
    out
}
