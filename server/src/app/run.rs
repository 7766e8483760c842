//! The server's start and stop: assembled from its settings (in the order each part
//! needs the last), its ports bound, its background tasks spawned, served until SIGTERM
//! or Ctrl-C, its log closed.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::config::Config;
use super::recover::{self, Recovered};
use super::{cluster, listen, raft, shared, single, tls};
use crate::engine::Engine;
use crate::server::{serve, Ports, Shared};

/// Starts the server `c` describes and serves until SIGTERM or Ctrl-C. The error says
/// in words why it could not start, or why it stopped.
pub fn run(c: Config) -> Result<(), String> {
    let Assembled {
        recovered,
        shared,
        member,
        tls_port,
    } = assemble(&c)?;
    let threads = c.listen.event_loops();
    // Every worker is a current-thread runtime (`server::serve` says why): this one runs
    // the first, plus the background tasks; the others get a thread each.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("stockgate")
        .build()
        .map_err(|e| e.to_string())?;
    // One loop runs one command at a time: no reply can observe a RESERVE half done.
    recovered.engine.set_concurrent_callers(threads > 1);
    let (first, extra) = listen::bind_ports(&c, tls_port, threads)?;
    let result = rt.block_on(serve_until_shutdown(
        &c, &recovered, shared, member, first, extra,
    ));
    // Everything acknowledged is already written; this makes the tail durable too.
    match recovered.durability.wal.flush_and_close() {
        Ok(lsn) => tracing::info!("WAL flushed and closed at lsn {lsn}"),
        Err(e) => tracing::error!("WAL close failed: {e}"),
    }
    rt.shutdown_timeout(Duration::from_secs(2));
    result
}

/// A server ready to bind its ports.
struct Assembled {
    recovered: Recovered,
    shared: Arc<Shared>,
    /// This process's Raft member, started once the client port is bound.
    member: Option<raft::Member>,
    /// `--tls-port`, when TLS is served.
    tls_port: Option<u16>,
}

/// The server's parts, each checked and loaded in the order the next needs it: users,
/// the slot map, TLS, the keys, the Raft storage, the engine recovered from the log,
/// the shared state over it.
fn assemble(c: &Config) -> Result<Assembled, String> {
    let users = shared::users(c)?;
    let slot_map = cluster::load(c)?;
    c.check_open_mode(users.is_some())?;
    let tls = tls::load(c)?;
    let slot_map = cluster::with_tls(c, tls.as_ref(), slot_map)?;
    std::fs::create_dir_all(&c.data_dir).map_err(|e| format!("{}: {e}", c.data_dir.display()))?;
    let keys = recover::load_keys(c)?;
    let secret_file = keys.secret_path.clone();
    let engine = c.engine_config()?;
    let member = raft::prepare(c, tls.as_ref())?;
    let recovered = recover::recover(c, engine, keys, member.is_some())?;
    let shared = shared::build(c, users, &recovered, slot_map, tls.as_ref(), secret_file)?;
    c.check_metrics_addr()?;
    Ok(Assembled {
        recovered,
        shared,
        member,
        tls_port: tls.map(|t| t.port),
    })
}

/// Everything on the runtime: the Raft member (if any), the history's first record,
/// the background tasks, and the server until a shutdown signal.
async fn serve_until_shutdown(
    c: &Config,
    r: &Recovered,
    shared: Arc<Shared>,
    member: Option<raft::Member>,
    first: Ports<std::net::TcpListener>,
    extra: Vec<Ports<std::net::TcpListener>>,
) -> Result<(), String> {
    let listener = listen::to_tokio(first)?;
    let addr = local_addr(listener.plain.as_ref())?;
    let tls_addr = local_addr(listener.tls.as_ref())?;
    if let (Some(m), Some(spec)) = (member, r.speculation.clone()) {
        // The restart after a lost leadership keeps the port this start bound; a
        // TLS-only member keeps `--port 0` (no plain port).
        let port = addr.map_or(0, |a| a.port());
        raft::start(m, spec, r, &shared, port).await?;
    }
    // A member's history begins in the group's log, by its leader.
    if r.speculation.is_none() {
        single::begin_history(r).await?;
    }
    {
        let mut out = std::io::stdout().lock();
        if let Some(addr) = addr {
            let _ = writeln!(out, "listening on {addr}");
        }
        if let Some(t) = tls_addr {
            let _ = writeln!(out, "listening on {t} (tls)");
        }
        let _ = out.flush();
    }
    let tasks = background(c, r, &shared).await?;
    let result = serve(listener, extra, r.engine.clone(), shared, shutdown_signal())
        .await
        .map_err(|e| e.to_string());
    for t in tasks {
        t.abort();
    }
    result
}

/// The address a listener is bound to, if there is one.
fn local_addr(l: Option<&TcpListener>) -> Result<Option<SocketAddr>, String> {
    l.map(|l| l.local_addr().map_err(|e| e.to_string()))
        .transpose()
}

/// The tasks beside the server, stopped when it stops: the certificate reload, a single
/// node's snapshots, the metrics sampler and endpoint, the cluster's leader probes.
async fn background(
    c: &Config,
    r: &Recovered,
    shared: &Arc<Shared>,
) -> Result<Vec<JoinHandle<()>>, String> {
    let engine = &r.engine;
    let mut tasks = Vec::new();
    if let Some(t) = shared.tls.get() {
        tasks.push(tokio::spawn(t.clone().watch(crate::tls::RELOAD_CHECK)));
    }
    if r.speculation.is_none() {
        let every = c.wal.snapshot_records;
        tasks.push(single::spawn_snapshotter(
            engine.clone(),
            r.durability.clone(),
            every,
        ));
    }
    tasks.push(tokio::spawn(crate::report::http::sample_loop(
        engine.clone(),
        shared.clone(),
    )));
    // Buyers' live counts: `sale:<sku>:live` on the RESP port, event streams on the
    // metrics endpoint, one sampler per watched sale for both.
    let live = crate::report::live::resp::attach(&shared.pubsub, engine.clone());
    if let Some(m) = &c.metrics.addr {
        let https = c.tls.metrics_tls()?;
        tasks.push(spawn_metrics_http(m, engine, shared, https, live).await?);
    }
    if let Some(cl) = shared.cluster.get() {
        tasks.push(tokio::spawn(crate::cluster::leaders::watch(cl.clone())));
    }
    Ok(tasks)
}

/// Binds `--metrics-addr` and serves the metrics and the status page there.
async fn spawn_metrics_http(
    addr: &str,
    engine: &Arc<Engine>,
    shared: &Arc<Shared>,
    https: bool,
    live: Arc<crate::report::live::Hub>,
) -> Result<JoinHandle<()>, String> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("bind --metrics-addr {addr}: {e}"))?;
    let local = l.local_addr().map_err(|e| e.to_string())?;
    let scheme = if https { "https" } else { "http" };
    tracing::info!("metrics on {scheme}://{local}/metrics, status page {scheme}://{local}/");
    eprintln!("stockgate: metrics on {scheme}://{local}/");
    let tls = match https {
        true => shared.tls.get().cloned(),
        false => None,
    };
    Ok(tokio::spawn(crate::report::http::serve(
        l,
        engine.clone(),
        shared.clone(),
        tls,
        live,
    )))
}

/// Resolves on SIGTERM or Ctrl-C (Ctrl-C alone where SIGTERM cannot be listened for).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
