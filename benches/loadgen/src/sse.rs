//! `stockgate-bench sse`: many browsers watching one sale's live counts
//! (`GET /sale/<sku>/events`, Server-Sent Events), and how late each learns of a change.
//!
//! Opens `--watchers` event streams, waits until every one has its first event, then makes
//! `--changes` changes to the sale, `--every-ms` apart: each is one `RESERVE` of one unit
//! (the token minted for `--user` by the caller), so after change `i` the sale holds
//! `held0 + i` units. A watcher's delay for change `i` is from the moment the `RESERVE`
//! was sent to the arrival of its first event with `held >= held0 + i`: an upper bound of
//! the delay from the change itself. Before the changes, the same time is spent with every
//! watcher connected and nothing changing, to show what idle watchers cost.
//!
//! With `--server-pid`, the server's CPU (utime + stime from /proc) and resident memory
//! are read around each phase. One single-threaded runtime: pin it to a core of its own
//! (`taskset`), as benches/sse_watchers.sh does. Prints a few `key value` lines.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::resp::{Reply, RespConn};

#[derive(Parser, Debug)]
#[command(
    name = "stockgate-bench sse",
    about = "N watchers of one sale's Server-Sent Events; delay from a change to each watcher"
)]
pub struct SseArgs {
    /// The server's HTTP endpoint (`--metrics-addr`).
    #[arg(long)]
    http: SocketAddr,
    /// The server's RESP address (for the changes).
    #[arg(long)]
    resp: SocketAddr,
    #[arg(long, default_value = "BENCH")]
    sku: String,
    /// The user the admission token was minted for.
    #[arg(long, default_value = "bench-user")]
    user: String,
    /// An admission token for `--user` on `--sku`.
    #[arg(long)]
    token: String,
    #[arg(long, default_value_t = 10_000)]
    watchers: usize,
    #[arg(long, default_value_t = 50)]
    changes: u32,
    /// Milliseconds between changes (more than the server's 100 ms sampling period, so
    /// every change is its own event).
    #[arg(long, default_value_t = 300)]
    every_ms: u64,
    /// The server's process id: its CPU and memory are reported.
    #[arg(long)]
    server_pid: Option<u32>,
}

/// Per watcher: when it saw each `held` value (index = held − held0) first.
type Seen = Rc<RefCell<Vec<Vec<Option<Instant>>>>>;

pub fn main(args: SseArgs) -> Result<bool> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let local = tokio::task::LocalSet::new();
    rt.block_on(local.run_until(run(args)))
}

async fn run(a: SseArgs) -> Result<bool> {
    let mut redis = RespConn::connect(a.resp).await?;
    let held0 = held(&mut redis, &a.sku).await?;
    let rss0 = a.server_pid.map(rss_kib);
    let seen: Seen = Rc::new(RefCell::new(vec![
        vec![None; a.changes as usize + 1];
        a.watchers
    ]));
    let t_open = Instant::now();
    connect_all(&a, held0, &seen).await?;
    println!("watchers {}", a.watchers);
    println!("connect_s {:.2}", t_open.elapsed().as_secs_f64());
    wait_for(&seen, 0, Duration::from_secs(120)).await?;
    if let (Some(pid), Some(r0)) = (a.server_pid, rss0) {
        let per = (rss_kib(pid).saturating_sub(r0) as f64 * 1024.0) / a.watchers as f64;
        println!("server_rss_bytes_per_watcher {per:.0}");
    }
    let phase = Duration::from_millis(a.every_ms * u64::from(a.changes));
    let idle = cpu_during(a.server_pid, tokio::time::sleep(phase)).await;
    let mut sent = Vec::with_capacity(a.changes as usize);
    let changes = async {
        for i in 0..a.changes {
            let t = Instant::now();
            reserve(&mut redis, &a, i).await?;
            sent.push(t);
            tokio::time::sleep(Duration::from_millis(a.every_ms)).await;
        }
        wait_for(&seen, a.changes as usize, Duration::from_secs(30)).await
    };
    let (busy, r) = cpu_during_result(a.server_pid, changes).await;
    r?;
    report(&seen, &sent, phase, idle, busy, a.changes)
}

async fn held(c: &mut RespConn, sku: &str) -> Result<u64> {
    let r = c.cmd(&["SALE.INFO", sku]).await?;
    let Reply::Array(Some(items)) = r.ok()? else {
        bail!("SALE.INFO: not a map");
    };
    for kv in items.chunks(2) {
        if kv[0].as_str() == Some("reserved") {
            return kv
                .get(1)
                .and_then(Reply::as_int)
                .map(|v| v as u64)
                .ok_or_else(|| anyhow!("SALE.INFO reserved: not an integer"));
        }
    }
    bail!("SALE.INFO has no reserved field")
}

async fn reserve(c: &mut RespConn, a: &SseArgs, i: u32) -> Result<()> {
    let req = format!("sse-{}-{i}", std::process::id());
    let r = c.cmd(&["RESERVE", &a.sku, &a.user, &a.token, &req]).await?;
    match r {
        Reply::Error(e) => bail!("RESERVE: -{e}"),
        _ => Ok(()),
    }
}

async fn connect_all(a: &SseArgs, held0: u64, seen: &Seen) -> Result<()> {
    let path = format!("/sale/{}/events", a.sku);
    for w in 0..a.watchers {
        let s = TcpStream::connect(a.http)
            .await
            .with_context(|| format!("watcher {w}: connecting to {}", a.http))?;
        let (seen, path) = (seen.clone(), path.clone());
        tokio::task::spawn_local(async move {
            if let Err(e) = watch(s, &path, w, held0, seen).await {
                eprintln!("watcher {w}: {e:#}");
            }
        });
    }
    Ok(())
}

/// Reads one event stream until it ends, noting when each `held` value first arrived.
async fn watch(mut s: TcpStream, path: &str, w: usize, held0: u64, seen: Seen) -> Result<()> {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        let now = Instant::now();
        buf.extend_from_slice(&chunk[..n]);
        while let Some(end) = find(&buf, b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            if let Some(h) = held_in(&event) {
                let i = h.saturating_sub(held0) as usize;
                let mut seen = seen.borrow_mut();
                for slot in seen[w].iter_mut().take(i + 1) {
                    slot.get_or_insert(now);
                }
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The `held` field of a `data: {json}` event.
fn held_in(event: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(event).ok()?;
    let json = text.lines().find_map(|l| l.strip_prefix("data: "))?;
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    v.get("held")?.as_u64()
}

/// Waits until every watcher has seen change `i`.
async fn wait_for(seen: &Seen, i: usize, limit: Duration) -> Result<()> {
    let end = Instant::now() + limit;
    loop {
        let missing = seen.borrow().iter().filter(|w| w[i].is_none()).count();
        if missing == 0 {
            return Ok(());
        }
        if Instant::now() > end {
            bail!("{missing} watchers never saw change {i} within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn report(
    seen: &Seen,
    sent: &[Instant],
    phase: Duration,
    idle: Option<f64>,
    busy: Option<f64>,
    changes: u32,
) -> Result<bool> {
    let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    for w in seen.borrow().iter() {
        for (i, t0) in sent.iter().enumerate() {
            if let Some(t) = w[i + 1] {
                h.saturating_record(t.saturating_duration_since(*t0).as_micros().max(1) as u64);
            }
        }
    }
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!("deliveries {}", h.len());
    println!("delay_ms_p50 {:.1}", ms(0.5));
    println!("delay_ms_p99 {:.1}", ms(0.99));
    println!("delay_ms_max {:.1}", h.max() as f64 / 1000.0);
    let secs = phase.as_secs_f64();
    if let (Some(i), Some(b)) = (idle, busy) {
        println!("server_cpu_idle_percent {:.1}", i / secs * 100.0);
        println!("server_cpu_changing_percent {:.1}", b / secs * 100.0);
        println!(
            "server_cpu_ms_per_change {:.2}",
            (b - i).max(0.0) * 1000.0 / f64::from(changes)
        );
    }
    Ok(h.max() <= 200_000)
}

async fn cpu_during<F: std::future::Future>(pid: Option<u32>, f: F) -> Option<f64> {
    cpu_during_result(pid, f).await.0
}

/// The server's CPU seconds while `f` runs.
async fn cpu_during_result<F: std::future::Future>(
    pid: Option<u32>,
    f: F,
) -> (Option<f64>, F::Output) {
    let before = pid.and_then(cpu_secs);
    let out = f.await;
    let after = pid.and_then(cpu_secs);
    (before.zip(after).map(|(b, a)| a - b), out)
}

fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf with a valid name has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks / hz)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}
