//! The two workloads and the closed-loop workers that drive them.
//!
//! Every connection is its own task: it writes a batch of `P` requests in one write,
//! then reads the `P` replies, timing each reply from the moment its batch was written
//! (what redis-benchmark does). All connections are opened before the clock starts.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::targets::{self, Audit, Conn, Outcome, Plan, SaleSpec, Server, TargetKind};

#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// `units` units, `buyers` buyers with one request each.
    Storm { units: u64, buyers: u32 },
    /// Unlimited stock, `duration` measured after `warmup`.
    Throughput {
        #[serde(with = "secs")]
        duration: Duration,
        #[serde(with = "secs")]
        warmup: Duration,
        buyers: u32,
    },
}

mod secs {
    use std::time::Duration;
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

impl Workload {
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Storm { .. } => "storm",
            Workload::Throughput { .. } => "throughput",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct PointSpec {
    pub workload: Workload,
    pub concurrency: usize,
    pub pipeline: usize,
    /// Hard limit for the whole point once the clock has started.
    pub timeout: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Ok,
    /// The outcome check failed (wrong count, errors, inconsistent state).
    Failed,
    /// More units handed out than exist, or a counter below zero.
    Oversold,
    /// The target could not be run (start-up, connection or I/O failure).
    Error,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "FAILED",
            Status::Oversold => "FAILED: OVERSOLD",
            Status::Error => "ERROR",
        }
    }
}

/// All figures of one (target, workload, C, P) point.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PointResult {
    pub target: String,
    pub workload: String,
    pub concurrency: usize,
    pub pipeline: usize,
    pub units: Option<u64>,
    pub buyers: u32,
    /// Requests answered (whole run, warm-up included).
    pub requests: u64,
    /// Requests inside the measurement window (throughput) or all of them (storm).
    pub measured: u64,
    pub reserved: u64,
    pub replay: u64,
    pub soldout: u64,
    pub limit: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// Storm: from the start signal to the reply that took the last unit.
    pub sellout_ms: Option<f64>,
    /// From the start signal to the last reply.
    pub elapsed_ms: f64,
    pub audit: Option<Audit>,
    pub status: Status,
    pub problems: Vec<String>,
}

impl PointResult {
    pub fn error(target: TargetKind, spec: &PointSpec, err: &anyhow::Error) -> Self {
        let (units, buyers) = match spec.workload {
            Workload::Storm { units, buyers } => (Some(units), buyers),
            Workload::Throughput { buyers, .. } => (None, buyers),
        };
        PointResult {
            target: target.name().to_string(),
            workload: spec.workload.name().to_string(),
            concurrency: spec.concurrency,
            pipeline: spec.pipeline,
            units,
            buyers,
            requests: 0,
            measured: 0,
            reserved: 0,
            replay: 0,
            soldout: 0,
            limit: 0,
            errors: 0,
            first_error: Some(format!("{err:#}")),
            ops_per_sec: 0.0,
            p50_us: 0.0,
            p99_us: 0.0,
            p999_us: 0.0,
            max_us: 0.0,
            sellout_ms: None,
            elapsed_ms: 0.0,
            audit: None,
            status: Status::Error,
            problems: vec![format!("{err:#}")],
        }
    }
}

#[derive(Default)]
struct WorkerOut {
    lat_ns: Vec<u64>,
    requests: u64,
    reserved: u64,
    replay: u64,
    soldout: u64,
    limit: u64,
    errors: u64,
    first_error: Option<String>,
    last_success: Option<Instant>,
    sample_token: Option<String>,
    finished: Option<Instant>,
}

impl WorkerOut {
    fn tally(&mut self, o: Outcome, at: Instant, token: Option<String>) {
        self.requests += 1;
        match o {
            Outcome::Reserved => {
                self.reserved += 1;
                self.last_success = Some(at);
                if self.sample_token.is_none() {
                    self.sample_token = token;
                }
            }
            Outcome::Replay => self.replay += 1,
            Outcome::SoldOut => self.soldout += 1,
            Outcome::Limit => self.limit += 1,
            Outcome::Error(e) => {
                self.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(e);
                }
            }
        }
    }
}

/// When the clock starts and, for throughput, the measurement window.
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    measure_from: Instant,
    end: Instant,
}

/// Run one point against an already started server: prepare the sale, open the
/// connections, start them together, collect, audit.
pub async fn run_point(
    kind: TargetKind,
    server: &Server,
    spec: &PointSpec,
    sku: &str,
) -> Result<PointResult> {
    let pipeline = if kind.supports_pipeline() {
        spec.pipeline.max(1)
    } else {
        1
    };
    let c = spec.concurrency.max(1);
    let (sale, units) = match spec.workload {
        Workload::Storm { units, buyers } => (
            SaleSpec {
                sku: sku.to_string(),
                units,
                buyers,
                storm: true,
            },
            Some(units),
        ),
        Workload::Throughput { buyers, .. } => (
            SaleSpec {
                sku: sku.to_string(),
                units: targets::UNLIMITED,
                buyers,
                storm: false,
            },
            None,
        ),
    };
    let plan = targets::prepare(kind, server, sale)
        .await
        .context("preparing the sale")?;

    // Open every connection before the clock starts (at most 64 handshakes at a time).
    let mut conns = Vec::with_capacity(c);
    let mut pending = Vec::new();
    for chunk_start in (0..c).step_by(64) {
        pending.clear();
        for _ in chunk_start..(chunk_start + 64).min(c) {
            pending.push(targets::connect(server, &plan));
        }
        for r in futures_join_all(std::mem::take(&mut pending)).await {
            conns.push(r.context("opening a benchmark connection")?);
        }
    }

    let (tx, rx) = watch::channel::<Option<Window>>(None);
    let mut workers = JoinSet::new();
    for (idx, conn) in conns.into_iter().enumerate() {
        let plan = plan.clone();
        let mut rx = rx.clone();
        let spec = *spec;
        workers.spawn(async move {
            let w = match rx.wait_for(|w| w.is_some()).await {
                Ok(w) => match *w {
                    Some(w) => w,
                    None => return Err(anyhow!("start signal lost")),
                },
                Err(_) => return Err(anyhow!("start signal lost")),
            };
            worker(conn, &plan, idx, c, pipeline, &spec, w).await
        });
    }
    let start = Instant::now();
    let window = match spec.workload {
        Workload::Storm { .. } => Window {
            start,
            measure_from: start,
            end: start + spec.timeout,
        },
        Workload::Throughput {
            duration, warmup, ..
        } => Window {
            start,
            measure_from: start + warmup,
            end: start + warmup + duration,
        },
    };
    tx.send(Some(window))
        .map_err(|_| anyhow!("no worker is listening"))?;

    let deadline = match spec.workload {
        Workload::Storm { .. } => spec.timeout,
        Workload::Throughput {
            duration, warmup, ..
        } => duration + warmup + spec.timeout,
    };
    let mut outs = Vec::with_capacity(c);
    let collected = tokio::time::timeout(deadline, async {
        while let Some(r) = workers.join_next().await {
            outs.push(r.map_err(|e| anyhow!("worker panicked: {e}"))??);
        }
        Ok::<_, anyhow::Error>(())
    })
    .await;
    match collected {
        Ok(r) => r?,
        Err(_) => {
            workers.abort_all();
            return Err(anyhow!("the point did not finish within {deadline:?}"));
        }
    }

    // Merge.
    let mut hist = Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3)
        .map_err(|e| anyhow!("histogram: {e}"))?;
    let mut total = WorkerOut::default();
    let mut measured = 0u64;
    for o in &mut outs {
        for &ns in &o.lat_ns {
            hist.saturating_record(ns.max(1));
        }
        measured += o.lat_ns.len() as u64;
        total.requests += o.requests;
        total.reserved += o.reserved;
        total.replay += o.replay;
        total.soldout += o.soldout;
        total.limit += o.limit;
        total.errors += o.errors;
        if total.first_error.is_none() {
            total.first_error = o.first_error.take();
        }
        if total.sample_token.is_none() {
            total.sample_token = o.sample_token.take();
        }
        total.last_success = total.last_success.max(o.last_success);
        total.finished = total.finished.max(o.finished);
    }
    let finished = total.finished.unwrap_or_else(Instant::now);
    let elapsed = finished.saturating_duration_since(start);
    let ops = match spec.workload {
        Workload::Storm { .. } => total.requests as f64 / elapsed.as_secs_f64().max(1e-9),
        Workload::Throughput { duration, .. } => measured as f64 / duration.as_secs_f64(),
    };
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;

    let audit = targets::audit(server, &plan, total.sample_token.as_deref())
        .await
        .context("reading the target's state back")?;

    let mut problems = Vec::new();
    let mut oversold = false;
    if total.errors > 0 {
        problems.push(format!(
            "{} error replies (first: {})",
            total.errors,
            total.first_error.clone().unwrap_or_default()
        ));
    }
    if audit.negative {
        oversold = true;
        problems.push("a stock counter went below zero".into());
    }
    let sellout_ms = match spec.workload {
        Workload::Storm { units, buyers } => {
            let expected = units.min(buyers as u64);
            if total.reserved > units || audit.handed_out > units as i64 {
                oversold = true;
                problems.push(format!(
                    "OVERSOLD: {} successes, target records {} handed out, only {units} units exist",
                    total.reserved, audit.handed_out
                ));
            }
            if total.reserved != expected {
                problems.push(format!(
                    "{} successes, expected exactly {expected}",
                    total.reserved
                ));
            }
            if audit.handed_out != total.reserved as i64 {
                problems.push(format!(
                    "clients saw {} successes, target records {}",
                    total.reserved, audit.handed_out
                ));
            }
            if total.reserved >= expected {
                total
                    .last_success
                    .map(|t| t.saturating_duration_since(start).as_secs_f64() * 1000.0)
            } else {
                None
            }
        }
        Workload::Throughput { .. } => {
            if total.soldout > 0 || total.limit > 0 || total.replay > 0 {
                problems.push(format!(
                    "unexpected replies under unlimited stock: {} sold out, {} limit, {} replay",
                    total.soldout, total.limit, total.replay
                ));
            }
            if audit.handed_out != total.reserved as i64 {
                problems.push(format!(
                    "clients saw {} successes, target records {}",
                    total.reserved, audit.handed_out
                ));
            }
            None
        }
    };
    if audit.release_exactly_once == Some(false) {
        problems.push("release did not return the unit exactly once".into());
    }
    problems.extend(audit.notes.iter().cloned());
    let status = if oversold {
        Status::Oversold
    } else if problems.is_empty() {
        Status::Ok
    } else {
        Status::Failed
    };
    let buyers = match spec.workload {
        Workload::Storm { buyers, .. } | Workload::Throughput { buyers, .. } => buyers,
    };
    Ok(PointResult {
        target: kind.name().to_string(),
        workload: spec.workload.name().to_string(),
        concurrency: c,
        pipeline,
        units,
        buyers,
        requests: total.requests,
        measured,
        reserved: total.reserved,
        replay: total.replay,
        soldout: total.soldout,
        limit: total.limit,
        errors: total.errors,
        first_error: total.first_error,
        ops_per_sec: ops,
        p50_us: us(0.5),
        p99_us: us(0.99),
        p999_us: us(0.999),
        max_us: hist.max() as f64 / 1000.0,
        sellout_ms,
        elapsed_ms: elapsed.as_secs_f64() * 1000.0,
        audit: Some(audit),
        status,
        problems,
    })
}

async fn futures_join_all<F: std::future::Future>(futs: Vec<F>) -> Vec<F::Output> {
    // A tiny join_all over non-'static futures: poll them all concurrently in place.
    let mut slots: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    let mut futs: Vec<std::pin::Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (f, slot) in futs.iter_mut().zip(slots.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => all = false,
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    slots.into_iter().flatten().collect()
}

/// One pipelined batch on a RESP target. `window`: only completions inside it are timed
/// (throughput); `None`: all are (storm).
async fn resp_batch(
    rc: &mut crate::resp::RespConn,
    plan: &Plan,
    reqs: &[(u32, &str)],
    buf: &mut Vec<u8>,
    out: &mut WorkerOut,
    window: Option<Window>,
) -> Result<()> {
    let timed = |t: Instant| match window {
        Some(w) => t >= w.measure_from && t <= w.end,
        None => true,
    };
    buf.clear();
    if plan.kind == TargetKind::RedisGetDecr {
        // The broken pattern: read, decide in the application, then write.
        for _ in reqs {
            plan.encode_naive_get(buf);
        }
        let t0 = Instant::now();
        rc.send(buf).await?;
        let mut go = 0;
        for _ in reqs {
            let left = rc.read_reply().await?.ok()?.as_int().unwrap_or(0);
            if left > 0 {
                go += 1;
            } else {
                let t = Instant::now();
                if timed(t) {
                    out.lat_ns.push((t - t0).as_nanos() as u64);
                }
                out.tally(Outcome::SoldOut, t, None);
            }
        }
        buf.clear();
        for _ in 0..go {
            plan.encode_naive_decr(buf);
        }
        if go > 0 {
            rc.send(buf).await?;
        }
        for _ in 0..go {
            let r = rc.read_reply().await?;
            let t = Instant::now();
            if timed(t) {
                out.lat_ns.push((t - t0).as_nanos() as u64);
            }
            let o = match r {
                crate::resp::Reply::Int(_) => Outcome::Reserved,
                other => Outcome::Error(format!("{other:?}")),
            };
            out.tally(o, t, None);
        }
        return Ok(());
    }
    for (b, id) in reqs {
        plan.encode(buf, *b, id);
    }
    let t0 = Instant::now();
    rc.send(buf).await?;
    for _ in reqs {
        let reply = rc.read_reply().await?;
        let t = Instant::now();
        // Throughput: completions inside the window count (and are timed), whenever
        // their batch was sent.
        if timed(t) {
            out.lat_ns.push((t - t0).as_nanos() as u64);
        }
        let (o, tok) = plan.classify(reply);
        out.tally(o, t, tok);
    }
    Ok(())
}

async fn worker(
    mut conn: Conn,
    plan: &Plan,
    idx: usize,
    c: usize,
    pipeline: usize,
    spec: &PointSpec,
    w: Window,
) -> Result<WorkerOut> {
    let mut out = WorkerOut::default();
    let mut buf = Vec::with_capacity(512 * pipeline);
    match spec.workload {
        Workload::Storm { buyers, .. } => {
            let mine: Vec<u32> = (idx as u32..buyers).step_by(c).collect();
            out.lat_ns.reserve(mine.len());
            let req_id = "r1";
            for chunk in mine.chunks(pipeline) {
                match &mut conn {
                    Conn::Resp(rc) => {
                        let reqs: Vec<(u32, &str)> = chunk.iter().map(|&b| (b, req_id)).collect();
                        resp_batch(rc, plan, &reqs, &mut buf, &mut out, None).await?;
                    }
                    Conn::Pg(pc) => {
                        for &b in chunk {
                            let t0 = Instant::now();
                            let o = plan.pg_reserve(pc, b, req_id).await;
                            let t = Instant::now();
                            out.lat_ns.push((t - t0).as_nanos() as u64);
                            out.tally(o, t, None);
                        }
                    }
                }
            }
        }
        Workload::Throughput { buyers, .. } => {
            let buyers = buyers.max(1) as u64;
            let mut seq: u64 = 0;
            let mut ids: Vec<String> = Vec::with_capacity(pipeline);
            let mut bs: Vec<u32> = Vec::with_capacity(pipeline);
            while Instant::now() < w.end {
                ids.clear();
                bs.clear();
                for _ in 0..pipeline {
                    seq += 1;
                    bs.push(((idx as u64 * 7919 + seq) % buyers) as u32);
                    ids.push(format!("c{idx}-{seq}"));
                }
                match &mut conn {
                    Conn::Resp(rc) => {
                        let reqs: Vec<(u32, &str)> = bs
                            .iter()
                            .zip(&ids)
                            .map(|(b, id)| (*b, id.as_str()))
                            .collect();
                        resp_batch(rc, plan, &reqs, &mut buf, &mut out, Some(w)).await?;
                    }
                    Conn::Pg(pc) => {
                        let t0 = Instant::now();
                        let o = plan.pg_reserve(pc, bs[0], &ids[0]).await;
                        let t = Instant::now();
                        if t >= w.measure_from && t <= w.end {
                            out.lat_ns.push((t - t0).as_nanos() as u64);
                        }
                        if let Outcome::Error(e) = &o {
                            if out.errors > 100 {
                                return Err(anyhow!("postgres keeps failing: {e}"));
                            }
                        }
                        out.tally(o, t, None);
                    }
                }
            }
        }
    }
    out.finished = Some(Instant::now());
    if let Conn::Pg(pc) = conn {
        let _ = sqlx::Connection::close(*pc).await;
    }
    let _ = w.start;
    Ok(out)
}
