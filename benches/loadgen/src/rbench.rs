//! `stockgate-bench rbench`: a redis-benchmark-like fixed-count load, for what
//! redis-benchmark cannot send: a reservation followed by `WAIT numreplicas 0`, the pair
//! counted as one request (benches/pinned.sh, target `redis-wait`).
//!
//! Semantics follow redis-benchmark's so its rows and these can sit in one table: `-c`
//! connections, all opened before the clock starts; each writes `-P` requests in one
//! batch, reads all their replies, then writes the next batch; `-n` requests in total
//! (claimed batch by batch from a shared counter); every `__rand_int__` in the command is
//! replaced per request by a random number below `-r`, zero-padded to 12 digits; the
//! latency of a request is from its batch's write to its (last) reply; throughput is
//! requests over the time from the start to the last reply.
//!
//! With `--wait R`, every command is followed in the same batch by `WAIT R 0`. Redis runs
//! the command, then blocks the connection until R replicas acknowledged it (the rest of
//! the batch waits behind it), so each request costs one replication round trip; its
//! latency is until the WAIT reply, which must be an integer >= R.
//!
//! One single-threaded runtime: the load generator gets one core (`taskset`), as
//! redis-benchmark does. Prints one line on stdout:
//! `requests seconds req/s p50_ms p99_ms p999_ms errors`; exits 1 if any reply was an
//! error (the first few are shown on stderr) or a WAIT came back short.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use hdrhistogram::Histogram;

use crate::resp::{self, Reply, RespConn};

#[derive(Parser, Debug)]
#[command(
    name = "stockgate-bench rbench",
    about = "redis-benchmark-like fixed-count load; --wait adds WAIT R 0 after every command"
)]
pub struct RbenchArgs {
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(short = 'p', long)]
    port: u16,
    /// Connections.
    #[arg(short = 'c', long, default_value_t = 50)]
    clients: usize,
    /// Requests in total.
    #[arg(short = 'n', long, default_value_t = 100_000)]
    requests: u64,
    /// Pipeline depth: requests per batch per connection.
    #[arg(short = 'P', long, default_value_t = 1)]
    pipeline: usize,
    /// `__rand_int__` is replaced by a random number in [0, R).
    #[arg(short = 'r', long, default_value_t = 1_000_000_000)]
    keyspace: u64,
    /// After every command, `WAIT <R> 0` in the same batch; the pair is one request.
    #[arg(long)]
    wait: Option<u32>,
    /// Seconds the whole run may take.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

const PLACEHOLDER: &[u8] = b"__rand_int__";

/// The command as RESP with the offsets of every placeholder (12 bytes each, overwritten
/// in place per request, as redis-benchmark does).
struct Template {
    bytes: Vec<u8>,
    holes: Vec<usize>,
}

impl Template {
    fn new(args: &[String], wait: Option<u32>) -> Template {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        let mut bytes = Vec::new();
        resp::encode(&mut bytes, &a);
        let mut holes = Vec::new();
        let mut i = 0;
        while i + PLACEHOLDER.len() <= bytes.len() {
            if &bytes[i..i + PLACEHOLDER.len()] == PLACEHOLDER {
                holes.push(i);
                i += PLACEHOLDER.len();
            } else {
                i += 1;
            }
        }
        if let Some(r) = wait {
            let r = r.to_string();
            resp::encode(&mut bytes, &[b"WAIT", r.as_bytes(), b"0"]);
        }
        Template { bytes, holes }
    }
}

struct Tally {
    hist: Histogram<u64>,
    errors: u64,
    short_waits: u64,
    first_errors: Vec<String>,
    /// When this connection got its last reply.
    end: Instant,
}

fn rand_fill(state: &mut u64, keyspace: u64, out: &mut [u8]) {
    // xorshift64*: plenty for spreading request ids.
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    let mut n = state.wrapping_mul(0x2545_F491_4F6C_DD1D) % keyspace.max(1);
    for b in out.iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

async fn client(
    mut conn: RespConn,
    tpl: Rc<Template>,
    left: Rc<Cell<u64>>,
    pipeline: usize,
    keyspace: u64,
    wait: Option<u32>,
    seed: u64,
) -> Result<Tally> {
    let mut t = Tally {
        hist: Histogram::new_with_bounds(1, 600_000_000, 3)?,
        errors: 0,
        short_waits: 0,
        first_errors: Vec::new(),
        end: Instant::now(),
    };
    let mut rng = seed | 1;
    let mut buf = Vec::with_capacity(tpl.bytes.len() * pipeline);
    let mut cmd = tpl.bytes.clone();
    loop {
        let n = left.get().min(pipeline as u64);
        if n == 0 {
            t.end = Instant::now();
            return Ok(t);
        }
        left.set(left.get() - n);
        buf.clear();
        for _ in 0..n {
            for &h in &tpl.holes {
                rand_fill(&mut rng, keyspace, &mut cmd[h..h + PLACEHOLDER.len()]);
            }
            buf.extend_from_slice(&cmd);
        }
        let start = Instant::now();
        conn.send(&buf).await?;
        for _ in 0..n {
            let mut replies = vec![conn.read_reply().await?];
            if wait.is_some() {
                replies.push(conn.read_reply().await?);
            }
            let us = start.elapsed().as_micros().max(1) as u64;
            t.hist.saturating_record(us);
            for r in &replies {
                if let Reply::Error(e) = r {
                    t.errors += 1;
                    if t.first_errors.len() < 5 {
                        t.first_errors.push(e.clone());
                    }
                }
            }
            if let (Some(want), Some(got)) = (wait, replies.get(1)) {
                if !matches!(got, Reply::Error(_)) && got.as_int().unwrap_or(-1) < i64::from(want) {
                    t.short_waits += 1;
                }
            }
        }
    }
}

pub fn main(args: RbenchArgs) -> Result<bool> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let local = tokio::task::LocalSet::new();
    rt.block_on(local.run_until(run(args)))
}

async fn run(args: RbenchArgs) -> Result<bool> {
    if args.clients == 0 || args.pipeline == 0 {
        bail!("-c and -P must be at least 1");
    }
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .map_err(|e| anyhow!("bad address {}:{}: {e}", args.host, args.port))?;
    let tpl = Rc::new(Template::new(&args.command, args.wait));
    let mut conns = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        conns.push(RespConn::connect(addr).await?);
    }
    let left = Rc::new(Cell::new(args.requests));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(args.clients);
    for (i, conn) in conns.into_iter().enumerate() {
        let seed = nanos ^ 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(i as u64 + 1);
        tasks.push(tokio::task::spawn_local(client(
            conn,
            tpl.clone(),
            left.clone(),
            args.pipeline,
            args.keyspace,
            args.wait,
            seed,
        )));
    }
    let deadline = Duration::from_secs(args.timeout);
    let mut total = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let (mut errors, mut short, mut shown) = (0u64, 0u64, Vec::new());
    let mut end = start;
    for task in tasks {
        let left_time = deadline.saturating_sub(start.elapsed());
        let t = tokio::time::timeout(left_time, task)
            .await
            .map_err(|_| anyhow!("run took longer than {} s", args.timeout))?
            .context("client task")??;
        end = end.max(t.end);
        total.add(&t.hist)?;
        errors += t.errors;
        short += t.short_waits;
        shown.extend(t.first_errors);
    }
    let secs = end.duration_since(start).as_secs_f64().max(1e-9);
    let done = total.len();
    let ms = |q: f64| total.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{done} {secs:.3} {:.0} {:.3} {:.3} {:.3} {errors}",
        done as f64 / secs,
        ms(0.50),
        ms(0.99),
        ms(0.999)
    );
    for e in shown.iter().take(5) {
        eprintln!("rbench: error reply: -{e}");
    }
    if short > 0 {
        eprintln!("rbench: {short} WAIT replies counted fewer replicas than asked");
    }
    Ok(errors == 0 && short == 0)
}
