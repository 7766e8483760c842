//! The TCP server: accept loops (the plain port and, with `--tls-port`, the TLS port),
//! one task per connection, graceful shutdown. Knows nothing of stock: commands go to
//! `cmd::dispatch`. A connection's life, the same over TCP and TLS, is in `connection`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::engine::Engine;
use crate::raft::authority;
// The connection and server state moved to `session` (commands need it, and must not
// depend on the network layer); these paths stay for the binary and embedders.
pub use crate::session::{
    ConnState, Durability, NoDurability, Role, ServerConfig, Shared, Stats, Users,
};

// The one call of `Durability` an embedded engine's caller waits on
// (`stockgate_client::EngineGate::with_durability`) is the core's `WaitDurable`, so that
// the client does not link the server: the server's durabilities implement it by their
// own `wait`.
impl stockgate_core::durable::WaitDurable for crate::persist::WalDurability {
    fn wait(
        &self,
        lsn: crate::engine::Lsn,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), crate::session::NotDurable>> + Send + '_>>
    {
        Durability::wait(self, lsn)
    }
}

impl stockgate_core::durable::WaitDurable for NoDurability {
    fn wait(
        &self,
        lsn: crate::engine::Lsn,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), crate::session::NotDurable>> + Send + '_>>
    {
        Durability::wait(self, lsn)
    }
}

mod connection;

/// The listening sockets of one event loop: the plain port's (none on a TLS-only server,
/// `--port 0` with a fixed `--tls-port`), and the TLS port's when TLS is served
/// (`Shared::tls`).
pub struct Ports<L> {
    /// The plain RESP port's listener.
    pub plain: Option<L>,
    /// The TLS port's listener, when TLS is served.
    pub tls: Option<L>,
}

/// Runs the server until `shutdown` resolves; then stops accepting, lets each connection
/// finish the batch it is running, and returns once all are gone (or after 10 s).
///
/// `listener` is served on the calling runtime. Each of `extra_workers` is one more OS
/// thread with a current-thread runtime of its own and its own listener on the same
/// address (`SO_REUSEPORT`: the kernel spreads new connections over the listeners), so
/// `--threads N` is N independent event loops, one per core, each with a FIFO run queue
/// like Redis's, instead of one work-stealing runtime: no task hops between cores, no
/// LIFO slot letting one busy connection run ahead of a thousand others (the storm's
/// tail), no cross-core wake-ups. The engine is shared (its state is per-shard atomics
/// and striped locks).
pub async fn serve(
    listener: Ports<TcpListener>,
    extra_workers: Vec<Ports<std::net::TcpListener>>,
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    publish_port(&listener, &shared);
    let (stop_tx, stop_rx) = watch::channel(false);
    let ticker = spawn_ticker(engine.clone(), shared.clone(), stop_rx.clone());
    let reaper = spawn_idle_reaper(shared.clone(), stop_rx.clone());
    let workers = spawn_workers(extra_workers, &engine, &shared, &stop_rx)?;
    accept_loop(listener, engine, shared, stop_rx, async {
        shutdown.await;
        let _ = stop_tx.send(true);
    })
    .await;
    let _ = ticker.await;
    let _ = reaper.await;
    join_workers(workers).await;
    Ok(())
}

/// Records the port clients reach this server on, as INFO's tcp_port tells them: the TLS
/// one when there is no plain port.
fn publish_port(listener: &Ports<TcpListener>, shared: &Shared) {
    if let Some(Ok(a)) = listener
        .plain
        .as_ref()
        .or(listener.tls.as_ref())
        .map(TcpListener::local_addr)
    {
        shared.local_port.store(a.port(), Ordering::Relaxed);
    }
}

/// Runs the engine's timers (expiry, purges) every `tick_ms` until `stop` changes.
fn spawn_ticker(
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let period = Duration::from_millis(shared.config.tick_ms.max(1));
    tokio::spawn(async move {
        let mut iv = tokio::time::interval(period);
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = iv.tick() => {
                    // Only a member taking writes expires and purges (`may_tick`).
                    let refused = shared.repl.get().map(|r| r.write_refusal().is_some());
                    if authority::may_tick(refused) {
                        engine.tick();
                    }
                }
                _ = stop.changed() => break,
            }
        }
    })
}

/// One OS thread per extra listener, each with a current-thread runtime running its own
/// accept loop until `stop` turns true (see [`serve`]). A runtime or thread that cannot be
/// made fails the whole server, as it starts.
fn spawn_workers(
    extra_workers: Vec<Ports<std::net::TcpListener>>,
    engine: &Arc<Engine>,
    shared: &Arc<Shared>,
    stop_rx: &watch::Receiver<bool>,
) -> std::io::Result<Vec<std::thread::JoinHandle<std::io::Result<()>>>> {
    let mut workers = Vec::with_capacity(extra_workers.len());
    for (i, l) in extra_workers.into_iter().enumerate() {
        let (engine, shared, stop) = (engine.clone(), shared.clone(), stop_rx.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let h = std::thread::Builder::new()
            .name(format!("stockgate-{}", i + 1))
            .spawn(move || {
                rt.block_on(async move {
                    let l = Ports {
                        plain: l.plain.map(tokio_listener).transpose()?,
                        tls: l.tls.map(tokio_listener).transpose()?,
                    };
                    let mut stop2 = stop.clone();
                    accept_loop(l, engine, shared, stop, async move {
                        let _ = stop2.wait_for(|s| *s).await;
                    })
                    .await;
                    Ok::<(), std::io::Error>(())
                })
            })?;
        workers.push(h);
    }
    Ok(workers)
}

/// Waits for the worker threads (off the runtime's threads), logging how any of them ended
/// badly.
async fn join_workers(workers: Vec<std::thread::JoinHandle<std::io::Result<()>>>) {
    for h in workers {
        match tokio::task::spawn_blocking(move || h.join()).await {
            Ok(Ok(Err(e))) => tracing::warn!("worker thread: {e}"),
            Ok(Err(_)) | Err(_) => tracing::error!("worker thread panicked"),
            Ok(Ok(Ok(()))) => {}
        }
    }
}

/// How often the idle reaper looks, and how far past the timeout: a connection whose own
/// timer has the current value closes itself first.
const REAP_EVERY: Duration = Duration::from_millis(500);
const REAP_GRACE_MS: u64 = 500;

/// Closes the connections idle past a timeout set while they waited (`CONFIG SET
/// timeout`; `Clients::close_idle`), checking while a timeout is set.
fn spawn_idle_reaper(
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut iv = tokio::time::interval(REAP_EVERY);
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = iv.tick() => reap_idle(&shared),
                _ = stop.changed() => break,
            }
        }
    })
}

fn reap_idle(shared: &Shared) {
    let ms = shared.live.idle_timeout_ms();
    if ms == 0 {
        return;
    }
    let now = crate::pubsub::monotonic_ms();
    for addr in shared.clients.close_idle(ms + REAP_GRACE_MS, now) {
        shared
            .stats
            .idle_disconnects
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(client = %addr, "client dropped: idle timeout (set while it waited)");
    }
}

fn tokio_listener(l: std::net::TcpListener) -> std::io::Result<TcpListener> {
    l.set_nonblocking(true)?;
    TcpListener::from_std(l)
}

/// Accepts on `l`, or never when that port is not served.
async fn accept_on(l: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match l {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// One event loop's accept loop: a task per connection until `until` resolves, then
/// (after `stop` is signalled, which `until` or another loop does) the drain.
async fn accept_loop(
    ports: Ports<TcpListener>,
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    stop_rx: watch::Receiver<bool>,
    until: impl Future<Output = ()>,
) {
    let mut conns = JoinSet::new();
    tokio::pin!(until);
    loop {
        let (accepted, tls) = tokio::select! {
            _ = &mut until => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            a = accept_on(ports.plain.as_ref()) => (a, false),
            a = accept_on(ports.tls.as_ref()) => (a, true),
        };
        let (stream, addr) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(stream) = admit(&shared, stream, addr, tls) else {
            continue;
        };
        let (engine, shared, stop) = (engine.clone(), shared.clone(), stop_rx.clone());
        conns.spawn(async move {
            open(stream, addr, tls, &engine, &shared, stop).await;
            shared.stats.connected.fetch_sub(1, Ordering::Relaxed);
        });
    }
    drop(ports);
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    conns.abort_all();
}

/// Counts a new connection and applies `--maxclients`: None when it is refused (a
/// plain client is told why; a TLS client could not read a plain reply, it is closed).
fn admit(shared: &Shared, stream: TcpStream, addr: SocketAddr, tls: bool) -> Option<TcpStream> {
    let st = &shared.stats;
    st.connections.fetch_add(1, Ordering::Relaxed);
    if tls {
        st.tls_connections.fetch_add(1, Ordering::Relaxed);
    }
    let max_clients = shared.live.max_clients();
    if st.connected.load(Ordering::Relaxed) as usize >= max_clients {
        st.rejected.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(client = %addr, "client refused: max number of clients ({max_clients}) reached");
        if !tls {
            tokio::spawn(async move {
                let mut s = stream;
                let _ = tokio::time::timeout(
                    Duration::from_secs(1),
                    s.write_all(b"-ERR max number of clients reached\r\n"),
                )
                .await;
            });
        }
        return None;
    }
    st.connected.fetch_add(1, Ordering::Relaxed);
    Some(stream)
}

/// A connection's start: the socket's options and addresses, the TLS handshake on the
/// TLS port (bounded by `tls::HANDSHAKE_TIMEOUT`), then the same connection loop for
/// both.
async fn open(
    stream: TcpStream,
    addr: SocketAddr,
    tls: bool,
    engine: &Engine,
    shared: &Shared,
    stop: watch::Receiver<bool>,
) {
    use std::os::fd::AsRawFd as _;
    let _ = stream.set_nodelay(true);
    let peer = connection::Peer {
        addr,
        laddr: stream
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default(),
        fd: stream.as_raw_fd(),
    };
    if !tls {
        return connection::handle(stream, peer, engine, shared, stop).await;
    }
    let Some(acceptor) = shared.tls.get().map(|t| t.acceptor()) else {
        return;
    };
    let st = &shared.stats;
    let hs = tokio::time::timeout(crate::tls::HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
    let stream = match hs {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            st.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
            tracing::info!(client = %addr, "TLS handshake failed: {e}");
            return;
        }
        Err(_) => {
            st.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
            tracing::info!(client = %addr, "TLS handshake timed out");
            return;
        }
    };
    st.tls_connected.fetch_add(1, Ordering::Relaxed);
    connection::handle(stream, peer, engine, shared, stop).await;
    st.tls_connected.fetch_sub(1, Ordering::Relaxed);
}
