//! The TCP server: accept loop, one task per connection, pipelining, limits, graceful
//! shutdown. Knows nothing of stock: commands go to `cmd::dispatch`.
//!
//! A connection reads whatever the socket has, runs every complete command in it,
//! encodes all replies into one buffer, waits once for the log position of the batch's
//! last state change to be acknowledged by the WAL, and then writes the whole buffer
//! with one syscall: one wake-up per pipelined batch, never a reply ahead of its record.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{Buf as _, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::cmd::Ctx;
use crate::engine::{Engine, Lsn};
use crate::protocol::{parse_frame, Frame, Refusal, Reply};
use crate::takeover::Handback;
// The connection and server state moved to `session` (commands need it, and must not
// depend on the network layer); these paths stay for the binary and embedders.
pub use crate::session::{
    ConnState, Durability, NoDurability, Role, ServerConfig, Shared, Stats, Users,
};

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

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
    listener: TcpListener,
    extra_workers: Vec<std::net::TcpListener>,
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    if let Ok(a) = listener.local_addr() {
        shared.local_port.store(a.port(), Ordering::Relaxed);
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let ticker = {
        let engine = engine.clone();
        let shared = shared.clone();
        let period = Duration::from_millis(shared.config.tick_ms.max(1));
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut iv = tokio::time::interval(period);
            iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = iv.tick() => {
                        // A follower expires and purges nothing itself: the leader decides
                        // and its log says so (EXPIRED still lists what is due).
                        if shared.repl.get().is_none_or(|r| !r.is_replica()) {
                            engine.tick();
                        }
                    }
                    _ = stop.changed() => break,
                }
            }
        })
    };
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
                    l.set_nonblocking(true)?;
                    let l = TcpListener::from_std(l)?;
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
    accept_loop(listener, engine, shared, stop_rx, async {
        shutdown.await;
        let _ = stop_tx.send(true);
    })
    .await;
    let _ = ticker.await;
    for h in workers {
        match tokio::task::spawn_blocking(move || h.join()).await {
            Ok(Ok(Err(e))) => tracing::warn!("worker thread: {e}"),
            Ok(Err(_)) | Err(_) => tracing::error!("worker thread panicked"),
            Ok(Ok(Ok(()))) => {}
        }
    }
    Ok(())
}

/// One event loop's accept loop: a task per connection until `until` resolves, then
/// (after `stop` is signalled, which `until` or another loop does) the drain.
async fn accept_loop(
    listener: TcpListener,
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    stop_rx: watch::Receiver<bool>,
    until: impl Future<Output = ()>,
) {
    let mut conns = JoinSet::new();
    tokio::pin!(until);
    loop {
        tokio::select! {
            _ = &mut until => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let (stream, addr) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let st = &shared.stats;
                st.connections.fetch_add(1, Ordering::Relaxed);
                let max_clients = shared.live.max_clients();
                if st.connected.load(Ordering::Relaxed) as usize >= max_clients {
                    st.rejected.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(client = %addr, "client refused: max number of clients ({max_clients}) reached");
                    tokio::spawn(async move {
                        let mut s = stream;
                        let _ = tokio::time::timeout(Duration::from_secs(1), s.write_all(b"-ERR max number of clients reached\r\n")).await;
                    });
                    continue;
                }
                st.connected.fetch_add(1, Ordering::Relaxed);
                let (engine, shared, stop) = (engine.clone(), shared.clone(), stop_rx.clone());
                conns.spawn(async move {
                    handle(stream, addr, &engine, &shared, stop).await;
                    shared.stats.connected.fetch_sub(1, Ordering::Relaxed);
                });
            }
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    conns.abort_all();
}

async fn handle(
    mut stream: TcpStream,
    addr: SocketAddr,
    engine: &Engine,
    shared: &Shared,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let cfg = &shared.config;
    let role = if shared.users.is_some() {
        None
    } else {
        Some(Role::Admin)
    };
    let laddr = stream
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let mut conn = ConnState::new(
        NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
        role,
        addr.to_string(),
        laddr,
    );
    // For CLIENT KILL; unregistered when this function returns.
    let _registered = {
        use std::os::fd::AsRawFd as _;
        shared
            .clients
            .register(conn.id, stream.as_raw_fd(), addr.to_string())
    };
    let mut inbuf = BytesMut::with_capacity(16 * 1024);
    let mut out = BytesMut::with_capacity(16 * 1024);
    // Where the arguments of the command being run are in `inbuf`: one vector for the
    // connection's life, refilled in place by each parse.
    let mut ranges: Vec<(usize, usize)> = Vec::with_capacity(8);
    // Shutdown without a lock per request. Every connection shares one shutdown channel,
    // and polling (or re-creating) its `changed()` future takes that channel's waiter
    // lock each time: one shared lock per request on every core. Instead the future is
    // polled once, here, which registers this task's waker with the channel for good
    // (a task's waker stays valid for its whole life); from then on each turn only
    // reads the channel's version, one atomic load, and the send at shutdown wakes the
    // task through that registration.
    let probe = stop.clone();
    let stopped = stop.changed();
    tokio::pin!(stopped);
    let already = std::future::poll_fn(|cx| Poll::Ready(stopped.as_mut().poll(cx).is_ready()));
    if already.await {
        return;
    }
    let shutting_down = || {
        std::future::poll_fn(|_| {
            // A dropped sender counts as shutdown too, as `changed()` would say.
            if probe.has_changed().unwrap_or(true) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    };
    // Bytes handed back by a takeover (a subscriber's last UNSUBSCRIBE with more commands
    // behind it in the same packet) are commands already read: run them before reading.
    let mut handed_back = false;
    loop {
        if inbuf.capacity() - inbuf.len() < 4096 {
            inbuf.reserve(16 * 1024);
        }
        // Read at every batch: `CONFIG SET` reaches connections already open.
        let idle_ms = shared.live.idle_timeout_ms();
        let idle = (idle_ms > 0).then(|| Duration::from_millis(idle_ms));
        let write_timeout = Duration::from_millis(shared.live.write_timeout_ms().max(1));
        let read_bytes = if std::mem::take(&mut handed_back) {
            0
        } else {
            let read = tokio::select! {
                // Fixed order: shutdown first (an atomic load), so a client that never stops
                // sending still lets the server stop; then the socket.
                biased;
                _ = shutting_down() => return,
                r = stream.read_buf(&mut inbuf) => r,
                _ = async {
                    match idle {
                        Some(d) => tokio::time::sleep(d).await,
                        None => std::future::pending::<()>().await,
                    }
                } => {
                    shared.stats.idle_disconnects.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(client = %addr, "client dropped: idle timeout");
                    return;
                }
            };
            match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n as u64,
            }
        };
        let mut lsn: Lsn = 0;
        let mut close = false;
        let mut takeover = None;
        // Counted once per batch: the counter is shared by every connection on every
        // core, so one increment per command would bounce its cache line per command.
        let mut commands = 0u64;
        loop {
            let (len, inline) = match parse_frame(&inbuf, &cfg.limits, &mut ranges) {
                Ok(Frame::Incomplete) => break,
                Ok(Frame::Array { len }) => (len, None),
                Ok(Frame::Inline { len, args }) => (len, Some(args)),
                Err(e) => {
                    refuse(shared, &addr, conn.proto, Refusal::Protocol(e), &mut out);
                    close = true;
                    break;
                }
            };
            // The arguments are slices of the read buffer (or of the inline line's
            // words), alive only while the command runs: the buffer advances past the
            // command right after, so it never holds a reference count that would stop
            // it being reused in place.
            let argv: smallvec::SmallVec<[&[u8]; 8]> = match &inline {
                Some(words) => words.iter().map(|w| &w[..]).collect(),
                None => ranges.iter().map(|&(a, b)| &inbuf[a..b]).collect(),
            };
            let outcome = (!argv.is_empty()).then(|| {
                let mut ctx = Ctx {
                    engine,
                    conn: &mut conn,
                    shared,
                };
                crate::cmd::dispatch_timed(&mut ctx, &argv)
            });
            drop(argv);
            inbuf.advance(len);
            let Some(mut o) = outcome else {
                continue;
            };
            commands += 1;
            lsn = lsn.max(o.lsn);
            if o.takeover.is_some() {
                // SUBSCRIBE: the replies so far go out, then the stream
                // (and whatever the client sent after the command) is handed over.
                takeover = o.takeover.take();
                break;
            }
            if let Some(wait) = o.wait.take() {
                // A blocking read (XREAD BLOCK): what this batch answered so far
                // goes out first, then the connection parks until the reply.
                if !send_before_block(&mut stream, &mut out, lsn, shared, write_timeout).await {
                    return;
                }
                lsn = 0;
                o.reply = tokio::select! {
                    r = wait => r,
                    // Woken through the registration made at connect (above).
                    _ = shutting_down() => return,
                };
            }
            o.reply.encode(conn.proto, &mut out);
            if o.close {
                close = true;
                break;
            }
            let max_out = shared.live.max_output_buffer();
            if out.len() > max_out {
                shared
                    .stats
                    .obuf_disconnects
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(client = %addr, "client dropped: replies of one batch over --max-output-buffer ({max_out} bytes)");
                out.clear();
                Reply::err("ERR output buffer limit reached; closing connection")
                    .encode(conn.proto, &mut out);
                close = true;
                break;
            }
        }
        if commands > 0 {
            shared.stats.commands.fetch_add(commands, Ordering::Relaxed);
        }
        shared
            .stats
            .net_input_bytes
            .fetch_add(read_bytes, Ordering::Relaxed);
        if !close && inbuf.len() > shared.live.max_query_buffer() {
            refuse(shared, &addr, conn.proto, Refusal::QueryBuffer, &mut out);
            close = true;
        }
        // Counters of this batch are visible before its replies are.
        conn.recorder.flush(&shared.metrics);
        if lsn > 0 {
            if let Err(e) = shared.durability.wait(lsn).await {
                // Fail closed: the record may not be on disk, so no acknowledgement leaves.
                tracing::warn!("reply not acknowledged, dropping connection: {e}");
                return;
            }
        }
        if !write_replies(&mut stream, &mut out, shared, &addr, write_timeout).await {
            return;
        }
        if close {
            let _ = stream.shutdown().await;
            return;
        }
        if let Some(t) = takeover {
            let rest = std::mem::take(&mut inbuf);
            match t(stream, rest).await {
                Handback::Resume(s, b) => {
                    stream = s;
                    inbuf = b;
                    handed_back = !inbuf.is_empty();
                }
                Handback::Refused(mut s, why) => {
                    refuse(shared, &addr, conn.proto, why, &mut out);
                    if write_replies(&mut s, &mut out, shared, &addr, write_timeout).await {
                        let _ = s.shutdown().await;
                    }
                    return;
                }
                Handback::Closed => return,
            }
        }
    }
}

/// A client that broke a framing limit, in command or subscriber mode alike: counted,
/// told why in `out`; the caller closes the connection once `out` is sent.
fn refuse(shared: &Shared, addr: &SocketAddr, proto: u8, why: Refusal, out: &mut BytesMut) {
    match why {
        Refusal::Protocol(e) => {
            shared.stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
            Reply::err(format!("ERR {e}")).encode(proto, out);
        }
        Refusal::QueryBuffer => {
            shared
                .stats
                .qbuf_disconnects
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(client = %addr, "client dropped: unfinished command over --max-query-buffer ({} bytes)", shared.live.max_query_buffer());
            Reply::err("ERR Protocol error: query buffer limit exceeded").encode(proto, out);
        }
    }
}

/// Writes a batch's replies and empties `out`. False if the connection must be dropped
/// (a write error, or a client that does not read within `write_timeout`).
async fn write_replies(
    stream: &mut TcpStream,
    out: &mut BytesMut,
    shared: &Shared,
    addr: &SocketAddr,
    write_timeout: Duration,
) -> bool {
    if out.is_empty() {
        return true;
    }
    shared
        .stats
        .net_output_bytes
        .fetch_add(out.len() as u64, Ordering::Relaxed);
    // Try the write at once: the reply nearly always fits the socket buffer, and then no
    // timer is armed (a timeout costs a clock read and a reference to the runtime's timer
    // per batch). Only what did not fit waits, bounded.
    let sent = match stream.try_write(out) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
        Err(_) => return false,
    };
    let rest = &out[sent..];
    let flushed = if rest.is_empty() {
        Ok(Ok(()))
    } else {
        tokio::time::timeout(write_timeout, stream.write_all(rest)).await
    };
    match flushed {
        Ok(Ok(())) => {}
        Ok(Err(_)) => return false,
        Err(_) => {
            shared
                .stats
                .obuf_disconnects
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(client = %addr, "client dropped: did not read its replies within the write timeout");
            return false;
        }
    }
    if out.capacity() > 1024 * 1024 {
        *out = BytesMut::with_capacity(16 * 1024);
    } else {
        out.clear();
    }
    true
}

/// Before a connection blocks: wait for the batch's records, then send its replies.
/// False if the connection must close (log failure, write error or timeout).
async fn send_before_block(
    stream: &mut TcpStream,
    out: &mut BytesMut,
    lsn: Lsn,
    shared: &Shared,
    write_timeout: Duration,
) -> bool {
    if lsn > 0 && shared.durability.wait(lsn).await.is_err() {
        return false;
    }
    if out.is_empty() {
        return true;
    }
    let ok = matches!(
        tokio::time::timeout(write_timeout, stream.write_all(out)).await,
        Ok(Ok(()))
    );
    out.clear();
    ok
}
