//! One client connection, over plain TCP or TLS alike (generic over the stream):
//! read what the socket has, run every complete command in it, encode all replies into
//! one buffer, wait once for the log position of the batch's last state change to be
//! acknowledged by the WAL, and then write the whole buffer at once: one wake-up per
//! pipelined batch, never a reply ahead of its record.
//!
//! The steps, in the order a batch goes through them: [`Connection::read_more`],
//! [`Connection::run_batch`] (each command: [`Connection::next_command`] parses and
//! dispatches it, [`Connection::answer`] encodes its reply; a blocking read parks in
//! [`Connection::block_on`]), [`Connection::account`], [`Connection::wait_durable`],
//! [`write_replies`], then [`Connection::close`] or [`Connection::take_over`] (pub/sub).
//! `MULTI` needs no step of its own: queueing and `EXEC` are commands (`cmd::multi`),
//! and an `EXEC`'s replies are one reply of its batch.

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf as _, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::cmd::{Ctx, Deferred, Outcome};
use crate::engine::{Engine, Lsn};
use crate::protocol::{parse_frame, Frame, Refusal, Reply};
use crate::pubsub::monotonic_ms;
use crate::session::{ConnState, NotDurable, Role, Shared};
use crate::takeover::{Handback, Io, Takeover};

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

/// Where a connection comes from, read off its TCP socket before any TLS wraps it.
pub(super) struct Peer {
    pub addr: SocketAddr,
    pub laddr: String,
    /// The socket, for `CLIENT KILL` (which shuts it down under the TLS layer too).
    pub fd: RawFd,
}

/// What a batch of commands read together ended with.
#[derive(Default)]
struct Batch {
    /// The highest log position a reply of the batch depends on (0: none).
    lsn: Lsn,
    /// Close once the replies are out.
    close: bool,
    /// Hand the stream over once the replies are out (`SUBSCRIBE`).
    takeover: Option<Takeover>,
    /// Commands run, counted once per batch: the counter is shared by every connection
    /// on every core, so one increment per command would bounce its cache line.
    commands: u64,
    /// Replies in `out` not sent yet (those a blocking read sent early are not).
    replies: u64,
}

/// What a client waiting on a Raft leader that stopped leading before its write committed
/// is told instead of each reply: the write may or may not take effect, so it is neither
/// acknowledged nor refused as undone; the client asks the group's leader again.
const LOST_LEADERSHIP: &str = "READONLY You can't write against a read only replica. (this stockgate node lost the Raft leadership before the write committed: it may or may not take effect; ask SENTINEL get-master-addr-by-name and retry with the same request id)";

/// The next command in the read buffer.
enum Parsed {
    /// Not complete yet: read more.
    Incomplete,
    /// A framing error, answered in `out`: the connection closes.
    Refused,
    /// An empty array or a blank inline line: skipped without a reply.
    Empty,
    Ran(Outcome),
}

struct Connection<'a, S> {
    stream: S,
    addr: SocketAddr,
    engine: &'a Engine,
    shared: &'a Shared,
    conn: ConnState,
    inbuf: BytesMut,
    out: BytesMut,
    /// Where the arguments of the command being run are in `inbuf`: one vector for the
    /// connection's life, refilled in place by each parse.
    ranges: Vec<(usize, usize)>,
    idle: Option<Duration>,
    write_timeout: Duration,
    /// Since when this connection waits for its client, as the registry sees it
    /// (`Clients::close_idle`); 0 while it works.
    waiting: Arc<AtomicU64>,
    /// Reads the shutdown channel's version (see [`handle`]).
    stop: watch::Receiver<bool>,
}

/// Serves one connection until the client leaves, a limit closes it, or the server
/// shuts down (the batch being run finishes first).
pub(super) async fn handle<S: Io>(
    stream: S,
    peer: Peer,
    engine: &Engine,
    shared: &Shared,
    mut stop: watch::Receiver<bool>,
) {
    // Shutdown without a lock per request. Every connection shares one shutdown channel,
    // and polling (or re-creating) its `changed()` future takes that channel's waiter
    // lock each time: one shared lock per request on every core. Instead the future is
    // polled once, here, which registers this task's waker with the channel for good
    // (a task's waker stays valid for its whole life, and `stopped` lives as long as the
    // connection); from then on each turn only reads the channel's version, one atomic
    // load, and the send at shutdown wakes the task through that registration.
    let probe = stop.clone();
    let stopped = stop.changed();
    tokio::pin!(stopped);
    let already = std::future::poll_fn(|cx| Poll::Ready(stopped.as_mut().poll(cx).is_ready()));
    if already.await {
        return;
    }
    let mut c = Connection::new(stream, &peer, engine, shared, probe);
    // For CLIENT KILL and the idle reaper; unregistered when this function returns.
    let registered = shared.clients.register(
        c.conn.id,
        peer.fd,
        peer.addr.to_string(),
        c.conn.seen.clone(),
    );
    c.waiting = registered.waiting.clone();
    c.run().await;
    drop(registered);
}

/// Resolves once the connection has waited `idle` (None: never), the live setting
/// consulted again when that time is up: a timeout raised or turned off while the
/// connection waited lets it wait on (the registry's reaper covers one lowered or turned
/// on: `Clients::close_idle`).
async fn idle_for(idle: Option<Duration>, live: &crate::live::LiveSettings) {
    let Some(first) = idle else {
        return std::future::pending().await;
    };
    let started = tokio::time::Instant::now();
    let mut wait = first;
    loop {
        tokio::time::sleep_until(started + wait).await;
        match live.idle_timeout_ms() {
            0 => return std::future::pending().await,
            ms if Duration::from_millis(ms) > wait => wait = Duration::from_millis(ms),
            _ => return,
        }
    }
}

/// Resolves once the server is shutting down: one atomic load per poll.
fn shutting_down(probe: &watch::Receiver<bool>) -> impl Future<Output = ()> + '_ {
    std::future::poll_fn(move |_| {
        // A dropped sender counts as shutdown too, as `changed()` would say.
        if probe.has_changed().unwrap_or(true) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
}

impl<'a, S: Io> Connection<'a, S> {
    fn new(
        stream: S,
        peer: &Peer,
        engine: &'a Engine,
        shared: &'a Shared,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let role = if shared.users.is_some() {
            None
        } else {
            Some(Role::Admin)
        };
        let conn = ConnState::new(
            NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
            role,
            peer.addr.to_string(),
            peer.laddr.clone(),
        );
        Connection {
            stream,
            addr: peer.addr,
            engine,
            shared,
            conn,
            inbuf: BytesMut::with_capacity(16 * 1024),
            out: BytesMut::with_capacity(16 * 1024),
            ranges: Vec::with_capacity(8),
            idle: None,
            write_timeout: Duration::ZERO,
            waiting: Arc::default(),
            stop,
        }
    }

    /// The connection's life: batch after batch.
    async fn run(&mut self) {
        // Bytes handed back by a takeover (a subscriber's last UNSUBSCRIBE with more
        // commands behind it in the same packet) are commands already read: run them
        // before reading.
        let mut handed_back = false;
        loop {
            if self.inbuf.capacity() - self.inbuf.len() < 4096 {
                self.inbuf.reserve(16 * 1024);
            }
            self.read_settings();
            let read_bytes = if std::mem::take(&mut handed_back) {
                0
            } else {
                match self.read_more().await {
                    Some(n) => n,
                    None => return,
                }
            };
            let Some(mut batch) = self.run_batch().await else {
                return;
            };
            self.account(&mut batch, read_bytes);
            if !self.wait_durable(batch.lsn, batch.replies).await {
                return;
            }
            if !self.write().await {
                return;
            }
            if batch.close {
                return self.close().await;
            }
            if let Some(t) = batch.takeover {
                match self.take_over(t).await {
                    Some(more) => handed_back = more,
                    None => return,
                }
            }
        }
    }

    /// The timeouts, read at every batch: `CONFIG SET` reaches connections already open.
    fn read_settings(&mut self) {
        let live = &self.shared.live;
        let idle_ms = live.idle_timeout_ms();
        self.idle = (idle_ms > 0).then(|| Duration::from_millis(idle_ms));
        self.write_timeout = Duration::from_millis(live.write_timeout_ms().max(1));
    }

    /// Reads what the socket has. None: the connection is over (the client left, the
    /// idle timeout passed, or the server is shutting down).
    async fn read_more(&mut self) -> Option<u64> {
        let (idle, live) = (self.idle, &self.shared.live);
        self.waiting.store(monotonic_ms(), Ordering::Relaxed);
        let read = tokio::select! {
            // Fixed order: shutdown first (an atomic load), so a client that never stops
            // sending still lets the server stop; then the socket.
            biased;
            _ = shutting_down(&self.stop) => None,
            r = self.stream.read_buf(&mut self.inbuf) => Some(r),
            _ = idle_for(idle, live) => {
                self.shared.stats.idle_disconnects.fetch_add(1, Ordering::Relaxed);
                tracing::info!(client = %self.addr, "client dropped: idle timeout");
                None
            }
        };
        self.waiting.store(0, Ordering::Relaxed);
        match read? {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n as u64),
        }
    }

    /// Runs every complete command in the read buffer, replies into `out`. None: drop
    /// the connection at once (shutdown or a failed write while a read blocked).
    async fn run_batch(&mut self) -> Option<Batch> {
        let mut b = Batch::default();
        loop {
            let mut o = match self.next_command() {
                Parsed::Incomplete => break,
                Parsed::Refused => {
                    b.replies += 1;
                    b.close = true;
                    break;
                }
                Parsed::Empty => continue,
                Parsed::Ran(o) => o,
            };
            b.commands += 1;
            b.lsn = b.lsn.max(o.lsn);
            if o.takeover.is_some() {
                // SUBSCRIBE: the replies so far go out, then the stream (and whatever
                // the client sent after the command) is handed over.
                b.takeover = o.takeover.take();
                break;
            }
            if let Some(wait) = o.wait.take() {
                o.reply = self.block_on(wait, &mut b.lsn).await?;
                // The replies before it went out before it blocked.
                b.replies = 0;
            }
            b.replies += 1;
            if self.answer(&o) {
                b.close = true;
                break;
            }
        }
        Some(b)
    }

    /// Parses the next command in the read buffer and dispatches it.
    fn next_command(&mut self) -> Parsed {
        let cfg = &self.shared.config;
        let (len, inline) = match parse_frame(&self.inbuf, &cfg.limits, &mut self.ranges) {
            Ok(Frame::Incomplete) => return Parsed::Incomplete,
            Ok(Frame::Array { len }) => (len, None),
            Ok(Frame::Inline { len, args }) => (len, Some(args)),
            Err(e) => {
                let why = Refusal::Protocol(e);
                refuse(self.shared, &self.addr, self.conn.proto, why, &mut self.out);
                return Parsed::Refused;
            }
        };
        // The arguments are slices of the read buffer (or of the inline line's words),
        // alive only while the command runs: the buffer advances past the command right
        // after, so it never holds a reference count that would stop it being reused in
        // place.
        let argv: smallvec::SmallVec<[&[u8]; 8]> = match &inline {
            Some(words) => words.iter().map(|w| &w[..]).collect(),
            None => self
                .ranges
                .iter()
                .map(|&(a, b)| &self.inbuf[a..b])
                .collect(),
        };
        let outcome = (!argv.is_empty()).then(|| {
            let mut ctx = Ctx {
                engine: self.engine,
                conn: &mut self.conn,
                shared: self.shared,
            };
            crate::cmd::dispatch_timed(&mut ctx, &argv)
        });
        drop(argv);
        self.inbuf.advance(len);
        match outcome {
            Some(o) => Parsed::Ran(o),
            None => Parsed::Empty,
        }
    }

    /// A blocking read (XREAD BLOCK): what this batch answered so far goes out first
    /// (after its records), then the connection parks until the reply. None: drop the
    /// connection (a failed write, or shutdown).
    async fn block_on(&mut self, wait: Deferred, lsn: &mut Lsn) -> Option<Reply> {
        let sent = send_before_block(
            &mut self.stream,
            &mut self.out,
            *lsn,
            self.shared,
            self.write_timeout,
        );
        if !sent.await {
            return None;
        }
        *lsn = 0;
        tokio::select! {
            r = wait => Some(r),
            // Woken through the registration made at connect (`handle`).
            _ = shutting_down(&self.stop) => None,
        }
    }

    /// Encodes a command's reply. True: the batch ends and the connection closes after
    /// it (QUIT, or the batch's replies outgrew `--max-output-buffer`).
    fn answer(&mut self, o: &Outcome) -> bool {
        o.reply.encode(self.conn.proto, &mut self.out);
        if o.close {
            return true;
        }
        let max = self.shared.live.max_output_buffer();
        if self.out.len() <= max {
            return false;
        }
        self.shared
            .stats
            .obuf_disconnects
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(client = %self.addr, "client dropped: replies of one batch over --max-output-buffer ({max} bytes)");
        self.out.clear();
        Reply::err("ERR output buffer limit reached; closing connection")
            .encode(self.conn.proto, &mut self.out);
        true
    }

    /// The batch's counters, and the query-buffer limit on what is left unfinished.
    fn account(&mut self, b: &mut Batch, read_bytes: u64) {
        let stats = &self.shared.stats;
        if b.commands > 0 {
            stats.commands.fetch_add(b.commands, Ordering::Relaxed);
        }
        stats
            .net_input_bytes
            .fetch_add(read_bytes, Ordering::Relaxed);
        if !b.close && self.inbuf.len() > self.shared.live.max_query_buffer() {
            let why = Refusal::QueryBuffer;
            refuse(self.shared, &self.addr, self.conn.proto, why, &mut self.out);
            b.close = true;
        }
        // Counters of this batch are visible before its replies are.
        self.conn.recorder.flush(&self.shared.metrics);
    }

    /// Waits until the log has the batch's records. False: it cannot say they are
    /// durable, so no acknowledgement may leave (fail closed) and the connection ends: a
    /// Raft leader that lost the leadership first answers each of the `replies` waiting
    /// with `-READONLY` (the client learns at once where to go, not at its socket
    /// timeout); a failed log just drops it.
    async fn wait_durable(&mut self, lsn: Lsn, replies: u64) -> bool {
        if lsn == 0 {
            return true;
        }
        match self.shared.durability.wait(lsn).await {
            Ok(()) => true,
            Err(NotDurable::LostLeadership) => {
                tracing::info!(client = %self.addr, "replies withheld: {}", NotDurable::LostLeadership);
                self.out.clear();
                for _ in 0..replies {
                    Reply::err(LOST_LEADERSHIP).encode(self.conn.proto, &mut self.out);
                }
                if self.write().await {
                    self.close().await;
                }
                false
            }
            Err(e) => {
                tracing::warn!("reply not acknowledged, dropping connection: {e}");
                false
            }
        }
    }

    async fn write(&mut self) -> bool {
        let (shared, addr, t) = (self.shared, &self.addr, self.write_timeout);
        write_replies(&mut self.stream, &mut self.out, shared, addr, t).await
    }

    /// Ends the connection after its last replies (TLS: with a close_notify).
    async fn close(&mut self) {
        let _ = self.stream.shutdown().await;
    }

    /// Lends the stream to a takeover (a subscriber). Some(more): back to commands,
    /// `more` if the client already sent some; None: the connection is over.
    async fn take_over(&mut self, t: Takeover) -> Option<bool> {
        let rest = std::mem::take(&mut self.inbuf);
        let io: &mut dyn Io = &mut self.stream;
        match t(io, rest).await {
            Handback::Resume(b) => {
                self.inbuf = b;
                Some(!self.inbuf.is_empty())
            }
            Handback::Refused(why) => {
                refuse(self.shared, &self.addr, self.conn.proto, why, &mut self.out);
                if self.write().await {
                    self.close().await;
                }
                None
            }
            Handback::Closed => None,
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

/// Writes and flushes as much as the socket takes now, without waiting: `(bytes taken,
/// everything flushed)`. The reply nearly always fits the socket buffer, and then no
/// timer is armed (a timeout costs a clock read and a reference to the runtime's timer
/// per batch). Polled with a waker that does nothing: a stream that is not ready is
/// polled again, with the task's own waker, by the bounded wait that follows.
fn try_send_now<S: AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &[u8],
) -> std::io::Result<(usize, bool)> {
    let mut cx = Context::from_waker(Waker::noop());
    let sent = match Pin::new(&mut *stream).poll_write(&mut cx, buf) {
        Poll::Ready(r) => r?,
        Poll::Pending => 0,
    };
    // TLS holds encrypted bytes back until flushed; TCP's flush does nothing.
    let flushed = sent == buf.len()
        && matches!(
            Pin::new(&mut *stream).poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        );
    Ok((sent, flushed))
}

/// Writes a batch's replies and empties `out`. False if the connection must be dropped
/// (a write error, or a client that does not read within `write_timeout`).
async fn write_replies<S: AsyncWrite + Unpin>(
    stream: &mut S,
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
    let Ok((sent, flushed)) = try_send_now(stream, out) else {
        return false;
    };
    if !flushed {
        let rest = &out[sent..];
        let finish = async {
            stream.write_all(rest).await?;
            stream.flush().await
        };
        match tokio::time::timeout(write_timeout, finish).await {
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
async fn send_before_block<S: AsyncWrite + Unpin>(
    stream: &mut S,
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
    let send = async {
        stream.write_all(out).await?;
        stream.flush().await
    };
    let ok = matches!(tokio::time::timeout(write_timeout, send).await, Ok(Ok(())));
    out.clear();
    ok
}
