//! stockgate-bench: one command that runs the same reservation workloads against
//! stockgate (three fsync modes), Redis running the baseline Lua scripts, and a Postgres
//! row, starting and stopping every target itself on 127.0.0.1; or, with `--addr`, against
//! a stockgate deployment that is already running (target `stockgate-at-addr`).
//!
//! `cargo run --release --bin stockgate-bench -- --help`; see benches/README.md.
//! `stockgate-bench rbench --help`: a redis-benchmark-like fixed-count mode that can also
//! send `WAIT` after every command (rbench.rs; benches/pinned.sh's `redis-wait`).
//! `stockgate-bench sse --help`: many watchers of one sale's live counts, and how late each
//! learns of a change (sse.rs; benches/sse_watchers.sh).

mod chart;
mod proc;
mod rbench;
mod report;
mod resp;
mod sse;
mod targets;
mod token;
mod workload;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use stockgate_server::cli::{int_in, number_in, I64_MAX};
use targets::{Auth, Family, Remote, TargetKind, Tools};
use workload::{PointResult, PointSpec, Status, Workload};

#[derive(Parser, Debug, Clone, Serialize)]
#[command(
    name = "stockgate-bench",
    version,
    about = "Side-by-side reservation benchmark: stockgate vs Redis+Lua vs a Postgres row"
)]
struct Args {
    /// Targets to run (comma separated): stockgate-fsync-no, stockgate-fsync-everysec,
    /// stockgate-fsync-always, redis-lua, redis-lua-aof, redis-lua-per-user, pg-hot-row,
    /// pg-16-rows, or `all`.
    #[arg(long, default_value = "all", value_delimiter = ',')]
    targets: Vec<String>,
    /// Workloads to run: storm, throughput.
    #[arg(long, default_value = "storm,throughput", value_delimiter = ',')]
    workloads: Vec<String>,
    /// Storm: units on sale (U).
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true, value_parser = int_in::<u64>(1, I64_MAX))]
    storm_units: u64,
    /// Storm: distinct buyers, one request each (N).
    #[arg(long, default_value_t = 10_000, allow_negative_numbers = true, value_parser = int_in::<u32>(1, u32::MAX as i128))]
    storm_buyers: u32,
    /// Storm: concurrent connections (C).
    #[arg(long, default_value_t = 200, allow_negative_numbers = true, value_parser = int_in::<usize>(1, 100_000))]
    storm_concurrency: usize,
    /// Storm: pipeline depth per connection (P).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = int_in::<usize>(1, 10_000))]
    storm_pipeline: usize,
    /// Throughput sweep: concurrent connections (C).
    #[arg(long, default_value = "1,8,50,200,1000", value_delimiter = ',',
          allow_negative_numbers = true, value_parser = int_in::<usize>(1, 100_000))]
    concurrency: Vec<usize>,
    /// Throughput sweep: pipeline depths (P). Postgres runs P=1 only.
    #[arg(long, default_value = "1,16", value_delimiter = ',',
          allow_negative_numbers = true, value_parser = int_in::<usize>(1, 10_000))]
    pipeline: Vec<usize>,
    /// Throughput: measured seconds per point.
    #[arg(long, default_value_t = 2.0, allow_negative_numbers = true,
          value_parser = number_in(0.05, 86_400.0, "seconds"))]
    duration: f64,
    /// Throughput: warm-up seconds per point (not measured).
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true,
          value_parser = number_in(0.0, 86_400.0, "seconds"))]
    warmup: f64,
    /// Throughput: distinct buyers the requests cycle through.
    #[arg(long, default_value_t = 10_000, allow_negative_numbers = true, value_parser = int_in::<u32>(1, u32::MAX as i128))]
    throughput_buyers: u32,
    /// Repeat everything this many times; tables, chart and ratios show the median.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = int_in::<usize>(1, 1000))]
    runs: usize,
    /// Benchmark the stockgate deployment at HOST:PORT instead of starting targets (the
    /// target `stockgate-at-addr` only; nothing is started or stopped). Needs
    /// --secret-file, and --auth or --auth-file when the deployment has users: the user
    /// must be allowed SALE.CREATE (role admin), each point creates its own sale.
    #[arg(long, value_name = "HOST:PORT", conflicts_with_all = ["targets", "stockgate_bin"])]
    addr: Option<String>,
    /// With --addr: `USER:PASSWORD` every connection authenticates with. Prefer the
    /// environment variable or --auth-file: a command line can be read by other users.
    #[arg(
        long,
        value_name = "USER:PASSWORD",
        env = "STOCKGATE_BENCH_AUTH",
        hide_env_values = true
    )]
    #[serde(skip)]
    auth: Option<Secret>,
    /// With --addr: a file whose first line is `USER:PASSWORD`, or a password alone (for
    /// the user `default`, as Redis's requirepass). Wins over --auth.
    #[arg(long, requires = "addr")]
    auth_file: Option<PathBuf>,
    /// With --addr: the deployment's admission keys, the file the server takes as
    /// --secret-file (`<kid> <hex secret>` per line; the first line signs).
    #[arg(long, requires = "addr")]
    secret_file: Option<PathBuf>,
    /// Directory for results.json, chart.svg and table.txt.
    #[arg(long, default_value = "benches/results")]
    out_dir: PathBuf,
    /// Skip the SVG chart.
    #[arg(long)]
    no_chart: bool,
    /// The stockgate binary (default: $STOCKGATE_BIN, else next to this binary, else
    /// target/release/stockgate).
    #[arg(long)]
    stockgate_bin: Option<PathBuf>,
    /// The redis-server binary (default: from PATH).
    #[arg(long)]
    redis_server: Option<PathBuf>,
    /// Load-generator threads (default: the machine's core count).
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<usize>(1, 1024))]
    client_threads: Option<usize>,
    /// Seconds a target may take to start.
    #[arg(long, default_value_t = 30, allow_negative_numbers = true, value_parser = int_in::<u64>(1, 86_400))]
    start_timeout: u64,
    /// Seconds a point may run past its planned length before it is abandoned.
    #[arg(long, default_value_t = 120, allow_negative_numbers = true, value_parser = int_in::<u64>(1, 86_400))]
    point_timeout: u64,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
    /// Run nothing: re-render the tables, ratios and chart from a results.json written
    /// earlier (into --out-dir, which must differ from the file's directory to keep it).
    #[arg(long)]
    from_json: Option<PathBuf>,
}

/// A credential from the command line or the environment: `Debug` never shows it, and
/// it is never serialised into results.json.
#[derive(Clone)]
struct Secret(String);

impl From<String> for Secret {
    fn from(s: String) -> Secret {
        Secret(s)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(hidden)")
    }
}

/// `USER:PASSWORD`, or a password alone for the user `default`.
fn parse_auth(text: &str) -> Auth {
    let text = text.trim_end_matches(['\r', '\n']);
    match text.split_once(':') {
        Some((user, password)) => Auth {
            user: user.to_string(),
            password: password.to_string(),
        },
        None => Auth {
            user: "default".into(),
            password: text.to_string(),
        },
    }
}

/// `--addr`, `--auth`/`--auth-file` and `--secret-file` as one [`Remote`]. No error
/// quotes the credentials.
async fn remote(args: &Args) -> Result<Option<Remote>> {
    let Some(addr_text) = &args.addr else {
        return Ok(None);
    };
    let addr = tokio::net::lookup_host(addr_text.as_str())
        .await
        .with_context(|| format!("--addr {addr_text}: not a reachable HOST:PORT"))?
        .next()
        .ok_or_else(|| anyhow!("--addr {addr_text}: the name has no address"))?;
    let auth = match (&args.auth, &args.auth_file) {
        (Some(s), None) => Some(parse_auth(&s.0)),
        (_, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--auth-file {}", path.display()))?;
            let first = text.lines().next().unwrap_or("").trim();
            if first.is_empty() {
                bail!(
                    "--auth-file {}: the first line is empty (expected USER:PASSWORD)",
                    path.display()
                );
            }
            Some(parse_auth(first))
        }
        (None, None) => None,
    };
    let Some(secret_path) = &args.secret_file else {
        bail!(
            "--addr needs --secret-file: the deployment's admission keys (the file its \
             server takes as --secret-file), to sign the buyers' admission tokens"
        );
    };
    let text = std::fs::read_to_string(secret_path)
        .with_context(|| format!("--secret-file {}", secret_path.display()))?;
    let keyring = stockgate_core::engine::Keyring::parse(&text)
        .map_err(|e| anyhow!("--secret-file {}: {e}", secret_path.display()))?;
    Ok(Some(Remote {
        addr,
        auth,
        keyring,
    }))
}

/// The command line for results.json, with the value of `--auth` left out.
fn recorded_command() -> Vec<String> {
    let mut out = Vec::new();
    let mut hide_next = false;
    for a in std::env::args() {
        if hide_next {
            out.push("(hidden)".into());
            hide_next = false;
        } else if a == "--auth" {
            out.push(a);
            hide_next = true;
        } else if a.starts_with("--auth=") {
            out.push("--auth=(hidden)".into());
        } else {
            out.push(a);
        }
    }
    out
}

#[derive(Serialize)]
struct Machine {
    cores: usize,
    cpu_model: String,
    memory: String,
    os: String,
    kernel: String,
    /// /proc/loadavg when the run started and when it ended: anything else busy on the
    /// machine shows here (the benchmark's own load included at the end).
    load_average_start: String,
    load_average_end: String,
}

#[derive(Serialize)]
struct Document<'a> {
    tool: &'static str,
    tool_version: &'static str,
    generated_at_unix: u64,
    command: Vec<String>,
    machine: Machine,
    versions: std::collections::BTreeMap<String, String>,
    config: &'a Args,
    targets: Vec<TargetInfo>,
    all_ok: bool,
    summary: &'a [report::Summary],
    ratios: &'a [report::Ratio],
    runs: &'a [Vec<PointResult>],
}

#[derive(Serialize)]
struct TargetInfo {
    name: &'static str,
    description: &'static str,
}

fn main() -> ExitCode {
    // `stockgate-bench rbench ...`: the redis-benchmark-like mode (rbench.rs).
    if std::env::args().nth(1).as_deref() == Some("rbench") {
        raise_nofile_limit();
        let a = rbench::RbenchArgs::parse_from(std::env::args().skip(1));
        return match rbench::main(a) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("stockgate-bench rbench: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    if std::env::args().nth(1).as_deref() == Some("sse") {
        raise_nofile_limit();
        let a = sse::SseArgs::parse_from(std::env::args().skip(1));
        return match sse::main(a) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("stockgate-bench sse: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    let args = Args::parse();
    let threads = args.client_threads.unwrap_or_else(cores).max(1);
    raise_nofile_limit();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("stockgate-bench: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    // Everything (targets, their processes and temp dirs) lives inside `run`'s future:
    // on Ctrl-C the future is dropped, which stops and removes all of it.
    let result = rt.block_on(async {
        tokio::select! {
            r = run(args) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("stockgate-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn raise_nofile_limit() {
    // C=1000 needs ~1000 sockets here and as many in the target.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max.min(65536);
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn parse_targets(list: &[String]) -> Result<Vec<TargetKind>> {
    if list.iter().any(|t| t.trim() == "all") {
        return Ok(TargetKind::ALL.to_vec());
    }
    let mut out = Vec::new();
    for t in list {
        let k = TargetKind::parse(t).ok_or_else(|| anyhow!("unknown target {t:?}"))?;
        if !out.contains(&k) {
            out.push(k);
        }
    }
    if out.is_empty() {
        bail!("no targets selected");
    }
    Ok(out)
}

fn find_stockgate(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = explicit.or_else(|| std::env::var_os("STOCKGATE_BIN").map(PathBuf::from)) {
        return Ok(p);
    }
    let mut candidates = Vec::new();
    if let Ok(me) = std::env::current_exe() {
        if let Some(dir) = me.parent() {
            candidates.push(dir.join("stockgate"));
        }
    }
    candidates.push(PathBuf::from("target/release/stockgate"));
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow!(
                "stockgate binary not found: build it with `cargo build --release -p stockgate-server` \
                 or pass --stockgate-bin"
            )
        })
}

/// `--from-json`: the runs of an earlier results.json, rendered again.
fn replot(path: &std::path::Path, args: &Args) -> Result<bool> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let runs: Vec<Vec<PointResult>> = serde_json::from_value(doc["runs"].clone())
        .with_context(|| format!("reading the runs in {}", path.display()))?;
    let kinds: Vec<TargetKind> = TargetKind::ALL
        .into_iter()
        .filter(|k| runs.iter().flatten().any(|p| p.target == k.name()))
        .collect();
    let sums = report::summarize(&runs, &kinds);
    let ratios = report::ratios(&sums);
    let text = report::render(&sums, &ratios, runs.len());
    println!("{text}");
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    std::fs::write(args.out_dir.join("table.txt"), &text)?;
    if !args.no_chart {
        let svg = args.out_dir.join("chart.svg");
        chart::draw(&svg, &sums, &kinds)?;
        eprintln!("wrote {}", svg.display());
    }
    Ok(sums.iter().all(|s| s.status == Status::Ok))
}

async fn run(args: Args) -> Result<bool> {
    if let Some(path) = &args.from_json {
        return replot(path, &args);
    }
    let remote = remote(&args).await?;
    let kinds = if remote.is_some() {
        vec![TargetKind::StockgateAtAddr]
    } else {
        parse_targets(&args.targets)?
    };
    let load_start = loadavg();
    if let Some(one) = load_start
        .split_whitespace()
        .next()
        .and_then(|v| v.parse::<f64>().ok())
    {
        if one > 0.5 {
            eprintln!(
                "warning: load average {load_start} before the start: something else is busy, \
                 figures will be noisy"
            );
        }
    }
    let do_storm = args.workloads.iter().any(|w| w.trim() == "storm");
    let do_tput = args.workloads.iter().any(|w| w.trim() == "throughput");
    if !do_storm && !do_tput {
        bail!("no workload selected (storm, throughput)");
    }
    let needs = |f: Family| {
        kinds
            .iter()
            .any(|&k| k.family() == f && k != TargetKind::StockgateAtAddr)
    };
    let stockgate = if needs(Family::Stockgate) {
        find_stockgate(args.stockgate_bin.clone())?
    } else {
        PathBuf::from("stockgate")
    };
    let redis_server = match args.redis_server.clone() {
        Some(p) => p,
        None => match proc::which("redis-server") {
            Some(p) => p,
            None if needs(Family::Redis) => bail!(
                "redis-server not found on PATH (apt-get install -y redis-server) \
                 or pass --redis-server"
            ),
            None => PathBuf::from("redis-server"),
        },
    };
    // Targets run with their scratch dir as working directory: make paths absolute
    // (without resolving symlinks: redis-server is a link whose name picks its mode).
    let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
    let tools = Tools {
        stockgate: absolute(stockgate),
        redis_server: absolute(redis_server),
        start_timeout: Duration::from_secs(args.start_timeout),
        remote,
    };

    let timeout = Duration::from_secs(args.point_timeout);
    let mut points: Vec<PointSpec> = Vec::new();
    if do_storm {
        points.push(PointSpec {
            workload: Workload::Storm {
                units: args.storm_units,
                buyers: args.storm_buyers,
            },
            concurrency: args.storm_concurrency.max(1),
            pipeline: args.storm_pipeline.max(1),
            timeout,
        });
    }
    if do_tput {
        for &p in &args.pipeline {
            for &c in &args.concurrency {
                points.push(PointSpec {
                    workload: Workload::Throughput {
                        duration: Duration::from_secs_f64(args.duration.max(0.05)),
                        warmup: Duration::from_secs_f64(args.warmup.max(0.0)),
                        buyers: args.throughput_buyers.max(1),
                    },
                    concurrency: c.max(1),
                    pipeline: p.max(1),
                    timeout,
                });
            }
        }
    }
    let applies = |k: TargetKind, p: &PointSpec| {
        k.supports_pipeline() || matches!(p.workload, Workload::Storm { .. }) || p.pipeline == 1
    };
    let total: usize = kinds
        .iter()
        .map(|&k| points.iter().filter(|p| applies(k, p)).count())
        .sum::<usize>()
        * args.runs;
    let max_conns = points.iter().map(|p| p.concurrency).max().unwrap_or(1);

    let pb = if args.no_progress || !std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::hidden())
    } else {
        ProgressBar::new(total as u64)
    };
    pb.set_style(
        ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} (eta {eta}) {msg}")
            .map_err(|e| anyhow!("{e}"))?,
    );
    let log = |msg: String| {
        if pb.is_hidden() {
            eprintln!("{msg}");
        } else {
            pb.println(msg);
        }
    };

    let mut runs: Vec<Vec<PointResult>> = Vec::new();
    let mut sku_counter = 0u64;
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    for run_no in 0..args.runs {
        let mut results = Vec::new();
        for &kind in &kinds {
            // Postgres: one cluster per target per run (initdb is slow), reset per point.
            // stockgate and Redis: a fresh process per point (fresh memory, empty logs).
            // The deployment at --addr: one for every point, never started or stopped.
            let mut shared: Option<targets::Server> = None;
            if kind.family() == Family::Postgres || kind == TargetKind::StockgateAtAddr {
                pb.set_message(format!("starting {}", kind.name()));
                match targets::start(kind, &tools, max_conns).await {
                    Ok(s) => shared = Some(s),
                    Err(e) => {
                        for p in points.iter().filter(|p| applies(kind, p)) {
                            let r = PointResult::error(kind, p, &e);
                            log(line(run_no, &r));
                            results.push(r);
                            pb.inc(1);
                        }
                        continue;
                    }
                }
            }
            for p in points.iter().filter(|p| applies(kind, p)) {
                sku_counter += 1;
                // A deployment keeps the sales of earlier runs: a name of its own each time.
                let sku = match &tools.remote {
                    Some(_) => format!("bench-{stamp}-{run_no}-{sku_counter}"),
                    None => format!("SKU-{run_no}-{sku_counter}"),
                };
                pb.set_message(format!(
                    "run {}/{} {} {} C={} P={}",
                    run_no + 1,
                    args.runs,
                    kind.name(),
                    p.workload.name(),
                    p.concurrency,
                    p.pipeline
                ));
                let r = match shared.as_mut() {
                    Some(server) => {
                        let r = workload::run_point(kind, server, p, &sku).await;
                        let alive = server.check_alive();
                        r.and_then(|r| alive.map(|_| r))
                    }
                    None => one_shot(kind, &tools, p, &sku, max_conns).await,
                };
                let r = r.unwrap_or_else(|e| PointResult::error(kind, p, &e));
                log(line(run_no, &r));
                results.push(r);
                pb.inc(1);
            }
            if let Some(s) = shared.take() {
                if let Err(e) = s.stop().await {
                    log(format!("warning: stopping {}: {e:#}", kind.name()));
                }
            }
        }
        runs.push(results);
    }
    pb.finish_and_clear();

    let sums = report::summarize(&runs, &kinds);
    let ratios = report::ratios(&sums);
    let text = report::render(&sums, &ratios, args.runs);
    println!("{text}");
    let all_ok = sums.iter().all(|s| s.status == Status::Ok)
        && kinds
            .iter()
            .all(|k| sums.iter().any(|s| s.target == k.name()));

    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let doc = Document {
        tool: "stockgate-bench",
        tool_version: env!("CARGO_PKG_VERSION"),
        generated_at_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        command: recorded_command(),
        machine: Machine {
            load_average_start: load_start,
            ..machine()
        },
        versions: targets::versions(&tools).into_iter().collect(),
        config: &args,
        targets: kinds
            .iter()
            .map(|k| TargetInfo {
                name: k.name(),
                description: k.describe(),
            })
            .collect(),
        all_ok,
        summary: &sums,
        ratios: &ratios,
        runs: &runs,
    };
    let json_path = args.out_dir.join("results.json");
    let json = serde_json::to_string_pretty(&doc).context("serialising results")?;
    std::fs::write(&json_path, json).with_context(|| format!("writing {}", json_path.display()))?;
    let table_path = args.out_dir.join("table.txt");
    std::fs::write(&table_path, &text)
        .with_context(|| format!("writing {}", table_path.display()))?;
    eprintln!("wrote {} and {}", json_path.display(), table_path.display());
    if !args.no_chart && do_tput {
        let svg = args.out_dir.join("chart.svg");
        match chart::draw(&svg, &sums, &kinds) {
            Ok(()) => eprintln!("wrote {}", svg.display()),
            Err(e) => eprintln!("warning: no chart: {e:#}"),
        }
    }
    if !all_ok {
        eprintln!("stockgate-bench: SOME POINTS FAILED (see the table above and results.json)");
    }
    Ok(all_ok)
}

/// Start a target, run one point, stop it.
async fn one_shot(
    kind: TargetKind,
    tools: &Tools,
    p: &PointSpec,
    sku: &str,
    max_conns: usize,
) -> Result<PointResult> {
    let mut server = targets::start(kind, tools, max_conns)
        .await
        .with_context(|| format!("starting {}", kind.name()))?;
    let r = workload::run_point(kind, &server, p, sku).await;
    let alive = server.check_alive();
    let stopped = server.stop().await;
    let r = r?;
    alive?;
    stopped?;
    Ok(r)
}

fn line(run_no: usize, r: &PointResult) -> String {
    let extra = match r.sellout_ms {
        Some(ms) => format!(" sold out in {ms:.0}ms"),
        None => String::new(),
    };
    format!(
        "run {} {:<26} {:<10} C={:<4} P={:<2} {:>9} ops/s p50 {:>8} p99 {:>8}{} {}{}",
        run_no + 1,
        r.target,
        r.workload,
        r.concurrency,
        r.pipeline,
        report::fmt_ops(r.ops_per_sec),
        report::fmt_us(r.p50_us),
        report::fmt_us(r.p99_us),
        extra,
        r.status.label(),
        if r.problems.is_empty() {
            String::new()
        } else {
            format!(" ({})", r.problems.join("; "))
        }
    )
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn machine() -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let memory = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let os = read("/etc/os-release")
        .lines()
        .find(|l| l.starts_with("PRETTY_NAME="))
        .map(|l| {
            l.trim_start_matches("PRETTY_NAME=")
                .trim_matches('"')
                .to_string()
        })
        .unwrap_or_default();
    Machine {
        cores: cores(),
        cpu_model,
        memory,
        os,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        load_average_start: String::new(),
        load_average_end: loadavg(),
    }
}
