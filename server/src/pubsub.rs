//! PUBLISH / SUBSCRIBE, as far as Redis Sentinel needs them (Sentinels find each other
//! by publishing hellos on `__sentinel__:hello` of every node they monitor), and the
//! registry of live connections that `CLIENT KILL` acts on (Sentinel kills the clients
//! of a node it reconfigures, so they reconnect to the right primary).
//!
//! Channels and glob patterns (`PSUBSCRIBE`, Redis's `*`, `?`, `[...]`, `\`: node-redis's
//! Sentinel client listens with one); each subscriber has a bounded queue, and a
//! subscriber that does not keep up loses messages rather than slowing publishers.
//!
//! Some channels carry what the server itself says ([`Feeds`]: a sale's live counts on
//! `sale:<sku>:live`). A subscriber to one is sent the channel's state at once and then
//! its newer states; only the newest unsent state is kept per subscriber, so a slow
//! subscriber skips states rather than queueing them. Clients cannot PUBLISH to them.
//! A subscriber whose socket accepts nothing for `--write-timeout-ms` is disconnected.
// CLIENT KILL reaches another connection through a duplicate of its socket (fcntl,
// shutdown, close); each call says why it is sound.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::protocol::Refusal;
use crate::protocol::{parse_command_into, Limits};
use crate::takeover::{Handback, Io};

/// Messages a subscriber may have queued before further ones are dropped.
const QUEUE: usize = 1024;
/// Channels one connection may subscribe to.
const MAX_CHANNELS: usize = 1024;

/// (the pattern it matched, for a pattern subscription; channel; message).
type Message = (Option<Bytes>, Bytes, Bytes);
/// Subscribers of each channel: (subscription id, its queue).
type Channels = HashMap<Bytes, Vec<(u64, mpsc::Sender<Message>)>>;
/// Pattern subscriptions: (pattern, subscription id, its queue).
type Patterns = Vec<(Bytes, u64, mpsc::Sender<Message>)>;

/// Channels the server publishes on itself, by name (`SUBSCRIBE` only: patterns do not
/// reach them). Defined here so the subscriber loop knows no more of what they carry.
pub trait Feeds: Send + Sync {
    /// Whether `channel` is one of them (then clients may not PUBLISH to it).
    fn owns(&self, channel: &[u8]) -> bool;
    /// A new subscriber's feed of `channel` (one it [`owns`](Feeds::owns)); `Err` is the
    /// error line (without `-`) sent in place of the subscription's confirmation.
    fn open(&self, channel: &[u8]) -> Result<Box<dyn Feed>, String>;
}

/// One subscriber's feed of one server channel.
pub trait Feed: Send {
    /// The next message: the channel's state at the first poll, then each newer state
    /// (only the newest one not yet given is kept).
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Bytes>;
}

/// The channel registry of `PUBLISH`/`SUBSCRIBE`/`PSUBSCRIBE`, shared by every connection; cloning
/// shares it.
#[derive(Clone, Default)]
pub struct Hub {
    channels: Arc<Mutex<Channels>>,
    patterns: Arc<Mutex<Patterns>>,
    feeds: Arc<OnceLock<Arc<dyn Feeds>>>,
}

impl Hub {
    /// Serves the server's own channels from `feeds` (once; false if some already are).
    pub fn serve_feeds(&self, feeds: Arc<dyn Feeds>) -> bool {
        self.feeds.set(feeds).is_ok()
    }

    /// Whether `channel` is one the server publishes on itself.
    pub fn owned(&self, channel: &[u8]) -> bool {
        self.feeds.get().is_some_and(|f| f.owns(channel))
    }

    /// Delivers `msg` to the channel's subscribers and to the patterns it matches;
    /// returns how many receivers there are (as Redis counts them).
    pub fn publish(&self, channel: &[u8], msg: &[u8]) -> usize {
        let (ch, body) = (Bytes::copy_from_slice(channel), Bytes::copy_from_slice(msg));
        let mut n = 0;
        if let Some(subs) = self.channels.lock().get(channel) {
            for (_, tx) in subs {
                let _ = tx.try_send((None, ch.clone(), body.clone()));
            }
            n += subs.len();
        }
        for (pat, _, tx) in self.patterns.lock().iter() {
            if glob_match(pat, channel) {
                let _ = tx.try_send((Some(pat.clone()), ch.clone(), body.clone()));
                n += 1;
            }
        }
        n
    }

    fn psubscribe(&self, pattern: Bytes, id: u64, tx: mpsc::Sender<Message>) {
        self.patterns.lock().push((pattern, id, tx));
    }

    fn punsubscribe(&self, pattern: &[u8], id: u64) {
        self.patterns
            .lock()
            .retain(|(p, i, _)| !(*i == id && p.as_ref() == pattern));
    }

    fn subscribe(&self, channel: Bytes, id: u64, tx: mpsc::Sender<Message>) {
        self.channels
            .lock()
            .entry(channel)
            .or_default()
            .push((id, tx));
    }

    fn unsubscribe(&self, channel: &[u8], id: u64) {
        let mut chans = self.channels.lock();
        if let Some(subs) = chans.get_mut(channel) {
            subs.retain(|(i, _)| *i != id);
            if subs.is_empty() {
                chans.remove(channel);
            }
        }
    }
}

/// Redis's glob (`stringmatchlen`): `*` any run, `?` one byte, `[abc]`, `[a-z]`, `[^x]`,
/// `\` escapes the next byte. Iterative with one backtrack point, so no pattern a client
/// sends can make it slow beyond length(pattern) x length(channel).
pub fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        let mut matched = None;
        if p < pat.len() {
            match pat[p] {
                b'*' => {
                    star = Some((p, i));
                    p += 1;
                    continue;
                }
                b'?' => matched = Some(p + 1),
                b'[' => {
                    if let Some((ok, next)) = class(pat, p, s[i]) {
                        if ok {
                            matched = Some(next);
                        }
                    } else if s[i] == b'[' {
                        matched = Some(p + 1);
                    }
                }
                b'\\' if p + 1 < pat.len() && pat[p + 1] == s[i] => matched = Some(p + 2),
                b'\\' if p + 1 < pat.len() => {}
                c if c == s[i] => matched = Some(p + 1),
                _ => {}
            }
        }
        match (matched, star) {
            (Some(np), _) => {
                p = np;
                i += 1;
            }
            (None, Some((sp, si))) => {
                p = sp + 1;
                i = si + 1;
                star = Some((sp, si + 1));
            }
            (None, None) => return false,
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

/// A `[...]` class at `pat[at]`: (whether `c` is in it, the index after it); None when
/// the bracket is not closed (then it is a literal `[`).
fn class(pat: &[u8], at: usize, c: u8) -> Option<(bool, usize)> {
    let mut j = at + 1;
    let negate = pat.get(j) == Some(&b'^');
    if negate {
        j += 1;
    }
    let mut hit = false;
    let mut first = true;
    while j < pat.len() && (pat[j] != b']' || first) {
        first = false;
        if pat[j] == b'\\' && j + 1 < pat.len() {
            hit |= pat[j + 1] == c;
            j += 2;
        } else if j + 2 < pat.len() && pat[j + 1] == b'-' && pat[j + 2] != b']' {
            let (lo, hi) = (pat[j].min(pat[j + 2]), pat[j].max(pat[j + 2]));
            hit |= (lo..=hi).contains(&c);
            j += 3;
        } else {
            hit |= pat[j] == c;
            j += 1;
        }
    }
    (j < pat.len()).then_some((hit != negate, j + 1))
}

/// What kind of connection a client is (CLIENT KILL TYPE).
pub const KIND_NORMAL: u8 = 0;
/// A connection in subscriber mode (after `SUBSCRIBE` or `PSUBSCRIBE`).
pub const KIND_PUBSUB: u8 = 1;
/// A replica's connection. stockgate serves no Redis replication, so nothing is marked so
/// and `CLIENT KILL TYPE replica` matches no connection.
pub const KIND_REPLICA: u8 = 2;

/// What `CLIENT LIST` shows of a connection that the connection itself keeps, shared
/// with its registry entry. Each connection has its own, so updating it takes no lock
/// another connection waits on.
#[derive(Default)]
pub struct Seen {
    /// The last command run: its index in the command table plus one (0: none yet). An
    /// atomic, as it is stored for every command.
    pub last_cmd: std::sync::atomic::AtomicUsize,
    /// The fields the connection's own state gives, as it last described itself; only
    /// connection commands change them.
    pub about: Mutex<About>,
}

/// A connection's own part of its `CLIENT LIST` line, in two pieces because Redis puts
/// the registry's fields between them.
#[derive(Default, Clone)]
pub struct About {
    /// `laddr=...`: before `fd=`.
    pub head: String,
    /// The `CLIENT SETNAME` name (empty: none): after `fd=`.
    pub name: String,
    /// `user=... redir=-1 resp=... lib-name=... lib-ver=...`: after `cmd=`.
    pub tail: String,
}

struct Entry {
    /// A duplicate of the connection's socket, owned here: shutting it down shuts the
    /// socket down, and it cannot be reused by another connection while registered.
    fd: RawFd,
    /// The connection's own socket, as `CLIENT LIST`'s `fd` shows it.
    shown_fd: RawFd,
    /// When it connected (a [`monotonic_ms`]), for `age`.
    since: u64,
    /// What the connection keeps for `CLIENT LIST`.
    seen: Arc<Seen>,
    kind: Arc<AtomicU8>,
    addr: String,
    /// Since when (a [`monotonic_ms`]) the connection has waited for its client to send;
    /// 0 while it runs commands, blocks or writes replies.
    waiting: Arc<AtomicU64>,
    /// The user it logged in as (`AUTH`, `HELLO ... AUTH`), for `CLIENT KILL USER` and
    /// `ACL DELUSER`.
    user: Option<String>,
}

/// Milliseconds on one clock for the whole process, never 0 (0 means "not waiting").
pub fn monotonic_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
}

/// The registry of live connections `CLIENT KILL` finds its targets in; cloning shares it.
#[derive(Clone, Default)]
pub struct Clients {
    live: Arc<Mutex<HashMap<u64, Entry>>>,
}

/// Removes a connection from the registry when dropped. Declared after the stream it
/// registers, so it is dropped (and the fd forgotten) before the stream closes the fd.
pub struct Registered {
    clients: Clients,
    id: u64,
    /// The connection's kind (`KIND_*`), shared with the registry so `CLIENT KILL TYPE` sees
    /// changes.
    pub kind: Arc<AtomicU8>,
    /// Since when the connection waits for its client (see [`Clients::close_idle`]).
    pub waiting: Arc<AtomicU64>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(e) = self.clients.live.lock().remove(&self.id) {
            if e.fd >= 0 {
                // SAFETY: `e.fd` is the duplicate made in `register`, owned by the entry.
                unsafe {
                    libc::close(e.fd);
                }
            }
        }
    }
}

/// Which connections `CLIENT KILL` picks.
pub enum KillFilter {
    /// Connections of one kind (`KIND_*`).
    Type(u8),
    /// The connection with this client id.
    Id(u64),
    /// The connection from this peer address (`ip:port`).
    Addr(String),
    /// The connections logged in as this user.
    User(String),
}

impl Clients {
    /// Registers connection `id` on socket `fd` from `addr`, as a normal client; it stays
    /// registered until the returned guard is dropped.
    pub fn register(&self, id: u64, fd: RawFd, addr: String, seen: Arc<Seen>) -> Registered {
        let kind = Arc::new(AtomicU8::new(KIND_NORMAL));
        let waiting = Arc::new(AtomicU64::new(0));
        // SAFETY: `fd` is the caller's open socket; dup only creates a new descriptor
        // (-1 if that fails, and then CLIENT KILL cannot reach this connection).
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        self.live.lock().insert(
            id,
            Entry {
                fd: dup,
                shown_fd: fd,
                since: monotonic_ms(),
                seen,
                kind: kind.clone(),
                addr,
                waiting: waiting.clone(),
                user: None,
            },
        );
        Registered {
            clients: self.clone(),
            id,
            kind,
            waiting,
        }
    }

    /// Records that connection `id` changed kind (`KIND_*`), for `CLIENT KILL TYPE`.
    pub fn set_kind(&self, id: u64, kind: u8) {
        if let Some(e) = self.live.lock().get(&id) {
            e.kind.store(kind, Ordering::Relaxed);
        }
    }

    /// Records the user connection `id` logged in as (`None`: logged out, `RESET`).
    pub fn set_user(&self, id: u64, user: Option<String>) {
        if let Some(e) = self.live.lock().get_mut(&id) {
            e.user = user;
        }
    }

    /// Shuts the matching connections' sockets down (their tasks then see end of file and
    /// finish as on a client's close). `skip`: the caller's own connection. Returns how
    /// many were killed.
    pub fn kill(&self, filter: &KillFilter, skip: Option<u64>) -> usize {
        let live = self.live.lock();
        let mut n = 0;
        for (id, e) in live.iter() {
            if Some(*id) == skip {
                continue;
            }
            let hit = match filter {
                KillFilter::Type(k) => e.kind.load(Ordering::Relaxed) == *k,
                KillFilter::Id(i) => i == id,
                KillFilter::Addr(a) => *a == e.addr,
                KillFilter::User(u) => e.user.as_deref() == Some(u.as_str()),
            };
            if hit && e.fd >= 0 {
                // SAFETY: the entry's own duplicate of a live connection's socket.
                unsafe {
                    libc::shutdown(e.fd, libc::SHUT_RDWR);
                }
                n += 1;
            }
        }
        n
    }
}

impl Clients {
    /// `CLIENT LIST` in Redis's line format, one line per connection in id order (only
    /// connection `only` when given: `CLIENT INFO`). `cmd_name` names a command by its
    /// [`Seen::last_cmd`]. The fields stockgate has no counterpart for (`qbuf`, `omem`,
    /// ...) carry Redis's values for an idle connection, so parsers find every field.
    pub fn list(&self, only: Option<u64>, cmd_name: impl Fn(usize) -> &'static str) -> String {
        let now = monotonic_ms();
        let live = self.live.lock();
        let mut ids: Vec<u64> = live
            .keys()
            .copied()
            .filter(|id| only.is_none_or(|o| o == *id))
            .collect();
        ids.sort_unstable();
        let mut out = String::new();
        for id in ids {
            let Some(e) = live.get(&id) else { continue };
            let waiting = e.waiting.load(Ordering::Relaxed);
            let idle = if waiting == 0 {
                0
            } else {
                now.saturating_sub(waiting) / 1000
            };
            let (flags, sub) = match e.kind.load(Ordering::Relaxed) {
                KIND_PUBSUB => ("P", 1),
                _ => ("N", 0),
            };
            let cmd = match e.seen.last_cmd.load(Ordering::Relaxed) {
                0 => "NULL",
                i => cmd_name(i - 1),
            };
            let about = e.seen.about.lock().clone();
            out.push_str(&format!(
                "id={id} addr={} {} fd={} name={} age={} idle={idle} flags={flags} db=0 sub={sub} psub=0 ssub=0 multi=-1 watch=0 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={cmd} {}\n",
                e.addr,
                about.head,
                e.shown_fd,
                about.name,
                now.saturating_sub(e.since) / 1000,
                about.tail,
            ));
        }
        out
    }

    /// Shuts down the normal connections that have waited for their client for at least
    /// `after_ms` at `now` (a [`monotonic_ms`]), as `CLIENT KILL` does, and gives their
    /// addresses. A connection's own timer closes it at the idle timeout it started
    /// waiting with; this reaches those that started waiting under another setting
    /// (`CONFIG SET timeout` while they were idle), as Redis's client cron does.
    pub fn close_idle(&self, after_ms: u64, now: u64) -> Vec<String> {
        let live = self.live.lock();
        let mut closed = Vec::new();
        for e in live.values() {
            let since = e.waiting.load(Ordering::Relaxed);
            let idle = since != 0 && now.saturating_sub(since) >= after_ms;
            if idle && e.kind.load(Ordering::Relaxed) == KIND_NORMAL && e.fd >= 0 {
                // SAFETY: the entry's own duplicate of a live connection's socket.
                unsafe {
                    libc::shutdown(e.fd, libc::SHUT_RDWR);
                }
                closed.push(e.addr.clone());
            }
        }
        closed
    }
}

fn push_header(out: &mut BytesMut, proto: u8, n: usize) {
    out.extend_from_slice(format!("{}{n}\r\n", if proto >= 3 { '>' } else { '*' }).as_bytes());
}

fn push_bulk(out: &mut BytesMut, b: &[u8]) {
    out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

fn confirm(out: &mut BytesMut, proto: u8, what: &[u8], channel: Option<&[u8]>, count: usize) {
    push_header(out, proto, 3);
    push_bulk(out, what);
    match channel {
        Some(c) => push_bulk(out, c),
        None => out.extend_from_slice(if proto >= 3 { b"_\r\n" } else { b"$-1\r\n" }),
    }
    out.extend_from_slice(format!(":{count}\r\n").as_bytes());
}

/// How a subscriber loop ends.
enum End {
    /// Back to normal mode (last subscription gone, or RESET).
    Resume,
    Closed,
    Refused(Refusal),
}

/// A connection in subscriber mode: sends the confirmations for `first` (channels, or
/// patterns when `patterns`), then messages, and takes only (P)(UN)SUBSCRIBE, PING, QUIT
/// and RESET. Hands the stream back when the last channel and pattern are unsubscribed
/// (or on RESET), as Redis returns such a client to normal mode. Held to the framing
/// `limits` and to `max_query_buffer` as a command connection is: a client breaking them
/// is handed back as [`Handback::Refused`], for the connection to answer and close. A
/// client that accepts none of what is sent for `write_timeout` is disconnected.
#[allow(clippy::too_many_arguments)]
pub async fn subscriber(
    hub: Hub,
    clients: Clients,
    id: u64,
    proto: u8,
    stream: &mut dyn Io,
    mut inbuf: BytesMut,
    (patterns, first): (bool, Vec<Bytes>),
    (limits, max_query_buffer, write_timeout): (Limits, usize, Duration),
) -> Handback {
    let (tx, mut rx) = mpsc::channel::<Message>(QUEUE);
    let mut subs = Subs::default();
    let mut out = BytesMut::with_capacity(1024);
    clients.set_kind(id, KIND_PUBSUB);
    for x in first {
        subs.add(&hub, id, &tx, patterns, x, proto, &mut out);
    }
    let mut argv: Vec<Bytes> = Vec::new();
    let me = Me {
        hub: &hub,
        id,
        tx: &tx,
        proto,
    };
    let back = loop {
        if !out.is_empty() {
            if send(stream, &out, write_timeout).await.is_err() {
                break End::Closed;
            }
            out.clear();
        }
        tokio::select! {
            m = rx.recv() => {
                let Some(m) = m else { break End::Closed };
                push_message(&mut out, proto, m);
            }
            m = next_feed(&mut subs.feeds) => push_message(&mut out, proto, m),
            r = stream.read_buf(&mut inbuf) => {
                if !matches!(r, Ok(n) if n > 0) {
                    break End::Closed;
                }
                let mut leave = take_commands(&me, &mut subs, &mut inbuf, &limits, &mut argv, &mut out);
                argv.clear();
                if leave.is_none() && inbuf.len() > max_query_buffer {
                    leave = Some(End::Refused(Refusal::QueryBuffer));
                }
                if let Some(end) = leave {
                    // What was answered before leaving goes out first, as on a command
                    // connection.
                    if !out.is_empty() && send(stream, &out, write_timeout).await.is_err() {
                        break End::Closed;
                    }
                    out.clear();
                    break end;
                }
            }
        }
    };
    for ch in &subs.channels {
        hub.unsubscribe(ch, id);
    }
    for p in &subs.patterns {
        hub.punsubscribe(p, id);
    }
    clients.set_kind(id, KIND_NORMAL);
    match back {
        End::Resume => Handback::Resume(inbuf),
        End::Refused(why) => Handback::Refused(why),
        End::Closed => Handback::Closed,
    }
}

/// The subscriber a loop serves: where its subscriptions go and how it is answered.
struct Me<'a> {
    hub: &'a Hub,
    id: u64,
    tx: &'a mpsc::Sender<Message>,
    proto: u8,
}

/// The next message of any of a subscriber's server channels (never, without one).
fn next_feed(
    feeds: &mut [(Bytes, Box<dyn Feed>)],
) -> impl std::future::Future<Output = Message> + '_ {
    std::future::poll_fn(move |cx| {
        for (ch, f) in feeds.iter_mut() {
            if let Poll::Ready(m) = f.poll_next(cx) {
                return Poll::Ready((None, ch.clone(), m));
            }
        }
        Poll::Pending
    })
}

/// A published message as a subscriber receives it (`message`, or `pmessage` with the
/// pattern that matched).
fn push_message(out: &mut BytesMut, proto: u8, (pat, ch, msg): Message) {
    match pat {
        None => {
            push_header(out, proto, 3);
            push_bulk(out, b"message");
        }
        Some(p) => {
            push_header(out, proto, 4);
            push_bulk(out, b"pmessage");
            push_bulk(out, &p);
        }
    }
    push_bulk(out, &ch);
    push_bulk(out, &msg);
}

/// Runs the whole commands `inbuf` holds, answering into `out`, until one ends subscriber
/// mode (or the bytes are not RESP): how the loop ends then.
fn take_commands(
    me: &Me<'_>,
    subs: &mut Subs,
    inbuf: &mut BytesMut,
    limits: &Limits,
    argv: &mut Vec<Bytes>,
    out: &mut BytesMut,
) -> Option<End> {
    loop {
        match parse_command_into(inbuf, limits, argv) {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => return Some(End::Refused(Refusal::Protocol(e))),
        }
        let Some(name) = argv.first().map(|a| a.to_ascii_lowercase()) else {
            continue;
        };
        if let Some(end) = subscriber_command(me, subs, &name, argv, out) {
            return Some(end);
        }
    }
}

/// One command in subscriber mode: (P)(UN)SUBSCRIBE, PING, QUIT, RESET; anything else
/// is refused in words. Gives how the loop ends if this command ends it.
fn subscriber_command(
    me: &Me<'_>,
    subs: &mut Subs,
    name: &[u8],
    argv: &[Bytes],
    out: &mut BytesMut,
) -> Option<End> {
    match name {
        b"subscribe" | b"psubscribe" => {
            let pat = name == b"psubscribe";
            for x in argv[1..].iter().cloned() {
                subs.add(me.hub, me.id, me.tx, pat, x, me.proto, out);
            }
        }
        b"unsubscribe" | b"punsubscribe" => {
            let pat = name == b"punsubscribe";
            subs.remove(me.hub, me.id, pat, &argv[1..], me.proto, out);
            if subs.count() == 0 {
                return Some(End::Resume);
            }
        }
        b"ping" => {
            push_header(out, 2, 2);
            push_bulk(out, b"pong");
            push_bulk(out, argv.get(1).map_or(&b""[..], |b| b));
        }
        b"quit" => {
            out.extend_from_slice(b"+OK\r\n");
            return Some(End::Closed);
        }
        b"reset" => {
            out.extend_from_slice(b"+RESET\r\n");
            return Some(End::Resume);
        }
        other => {
            let shown: String = String::from_utf8_lossy(other).chars().take(64).collect();
            out.extend_from_slice(format!("-ERR Can't execute '{shown}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n").as_bytes());
        }
    }
    None
}

/// Writes and flushes (a TLS stream holds encrypted bytes back until flushed); a client
/// that accepts nothing for `timeout` is an error, so its connection ends and what it
/// held (its queue, its feeds) is freed.
async fn send(stream: &mut dyn Io, out: &[u8], timeout: Duration) -> std::io::Result<()> {
    let write = async {
        stream.write_all(out).await?;
        stream.flush().await
    };
    match tokio::time::timeout(timeout, write).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(
                "subscriber dropped: did not read its messages within the write timeout"
            );
            Err(std::io::ErrorKind::TimedOut.into())
        }
    }
}

/// One connection's channels and patterns (bounded together by [`MAX_CHANNELS`]), and
/// the feeds of the server channels among the channels.
#[derive(Default)]
struct Subs {
    channels: Vec<Bytes>,
    patterns: Vec<Bytes>,
    feeds: Vec<(Bytes, Box<dyn Feed>)>,
}

impl Subs {
    fn count(&self) -> usize {
        self.channels.len() + self.patterns.len()
    }

    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        hub: &Hub,
        id: u64,
        tx: &mpsc::Sender<Message>,
        pattern: bool,
        x: Bytes,
        proto: u8,
        out: &mut BytesMut,
    ) {
        let room = self.count() < MAX_CHANNELS;
        let list = if pattern {
            &mut self.patterns
        } else {
            &mut self.channels
        };
        if !list.contains(&x) && room {
            if pattern {
                hub.psubscribe(x.clone(), id, tx.clone());
            } else if let Some(feeds) = hub.feeds.get().filter(|f| f.owns(&x)) {
                // Not in the channel registry: only its feed writes to it.
                match feeds.open(&x) {
                    Ok(feed) => self.feeds.push((x.clone(), feed)),
                    Err(why) => {
                        out.extend_from_slice(format!("-{why}\r\n").as_bytes());
                        return;
                    }
                }
            } else {
                hub.subscribe(x.clone(), id, tx.clone());
            }
            list.push(x.clone());
        }
        let what: &[u8] = if pattern { b"psubscribe" } else { b"subscribe" };
        confirm(out, proto, what, Some(&x), self.count());
    }

    /// `which` empty: all of that kind.
    fn remove(
        &mut self,
        hub: &Hub,
        id: u64,
        pattern: bool,
        which: &[Bytes],
        proto: u8,
        out: &mut BytesMut,
    ) {
        let what: &[u8] = if pattern {
            b"punsubscribe"
        } else {
            b"unsubscribe"
        };
        let list = if pattern {
            &self.patterns
        } else {
            &self.channels
        };
        let which: Vec<Bytes> = if which.is_empty() {
            list.clone()
        } else {
            which.to_vec()
        };
        if which.is_empty() {
            confirm(out, proto, what, None, self.count());
        }
        for x in which {
            if pattern {
                hub.punsubscribe(&x, id);
                self.patterns.retain(|c| *c != x);
            } else {
                hub.unsubscribe(&x, id);
                self.channels.retain(|c| *c != x);
                // Dropping a feed lets its source stop (the last one stops a sampler).
                self.feeds.retain(|(c, _)| *c != x);
            }
            confirm(out, proto, what, Some(&x), self.count());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn glob_matches_as_redis_does() {
        for (p, s, want) in [
            ("*", "anything", true),
            ("__sentinel__:*", "__sentinel__:hello", true),
            ("+switch-master", "+switch-master", true),
            ("+switch-*", "+sdown", false),
            ("h?llo", "hello", true),
            ("h?llo", "hllo", false),
            ("h[ae]llo", "hallo", true),
            ("h[^e]llo", "hello", false),
            ("h[a-b]llo", "hbllo", true),
            ("h\\*llo", "h*llo", true),
            ("h\\*llo", "hello", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("[unclosed", "[unclosed", true),
            ("", "", true),
            ("", "x", false),
        ] {
            assert_eq!(glob_match(p.as_bytes(), s.as_bytes()), want, "{p} ~ {s}");
        }
        // No blow-up on a hostile pattern.
        let p = "*a".repeat(200);
        let s = "a".repeat(5000) + "b";
        assert!(!glob_match(p.as_bytes(), s.as_bytes()));
    }
}
