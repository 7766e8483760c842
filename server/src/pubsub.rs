//! PUBLISH / SUBSCRIBE, as far as Redis Sentinel needs them (Sentinels find each other
//! by publishing hellos on `__sentinel__:hello` of every node they monitor), and the
//! registry of live connections that `CLIENT KILL` acts on (Sentinel kills the clients
//! of a node it reconfigures, so they reconnect to the right primary).
//!
//! Exact channels only (no patterns); each subscriber has a bounded queue, and a
//! subscriber that does not keep up loses messages rather than slowing publishers.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::protocol::{parse_command_into, Limits};

/// Messages a subscriber may have queued before further ones are dropped.
const QUEUE: usize = 1024;
/// Channels one connection may subscribe to.
const MAX_CHANNELS: usize = 1024;

type Message = (Bytes, Bytes);
/// Subscribers of each channel: (subscription id, its queue).
type Channels = HashMap<Bytes, Vec<(u64, mpsc::Sender<Message>)>>;

#[derive(Clone, Default)]
pub struct Hub {
    channels: Arc<Mutex<Channels>>,
}

impl Hub {
    /// Delivers `msg` to the channel's subscribers; returns how many there are.
    pub fn publish(&self, channel: &[u8], msg: &[u8]) -> usize {
        let chans = self.channels.lock();
        let Some(subs) = chans.get(channel) else {
            return 0;
        };
        let m = (Bytes::copy_from_slice(channel), Bytes::copy_from_slice(msg));
        for (_, tx) in subs {
            let _ = tx.try_send(m.clone());
        }
        subs.len()
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

/// What kind of connection a client is (CLIENT KILL TYPE).
pub const KIND_NORMAL: u8 = 0;
pub const KIND_PUBSUB: u8 = 1;
pub const KIND_REPLICA: u8 = 2;

struct Entry {
    /// A duplicate of the connection's socket, owned here: shutting it down shuts the
    /// socket down, and it cannot be reused by another connection while registered.
    fd: RawFd,
    kind: Arc<AtomicU8>,
    addr: String,
}

#[derive(Clone, Default)]
pub struct Clients {
    live: Arc<Mutex<HashMap<u64, Entry>>>,
}

/// Removes a connection from the registry when dropped. Declared after the stream it
/// registers, so it is dropped (and the fd forgotten) before the stream closes the fd.
pub struct Registered {
    clients: Clients,
    id: u64,
    pub kind: Arc<AtomicU8>,
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
    Type(u8),
    Id(u64),
    Addr(String),
}

impl Clients {
    pub fn register(&self, id: u64, fd: RawFd, addr: String) -> Registered {
        let kind = Arc::new(AtomicU8::new(KIND_NORMAL));
        // SAFETY: `fd` is the caller's open socket; dup only creates a new descriptor
        // (-1 if that fails, and then CLIENT KILL cannot reach this connection).
        let fd = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        self.live.lock().insert(
            id,
            Entry {
                fd,
                kind: kind.clone(),
                addr,
            },
        );
        Registered {
            clients: self.clone(),
            id,
            kind,
        }
    }

    pub fn set_kind(&self, id: u64, kind: u8) {
        if let Some(e) = self.live.lock().get(&id) {
            e.kind.store(kind, Ordering::Relaxed);
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

/// A connection in subscriber mode: sends the confirmations for `first`, then messages,
/// and takes only (UN)SUBSCRIBE, PING, QUIT and RESET. Hands the stream back when the last
/// channel is unsubscribed (or on RESET), as Redis returns such a client to normal mode.
#[allow(clippy::too_many_arguments)]
pub async fn subscriber(
    hub: Hub,
    clients: Clients,
    id: u64,
    proto: u8,
    mut stream: TcpStream,
    mut inbuf: BytesMut,
    first: Vec<Bytes>,
    limits: Limits,
) -> Option<(TcpStream, BytesMut)> {
    let (tx, mut rx) = mpsc::channel::<Message>(QUEUE);
    let mut subs: Vec<Bytes> = Vec::new();
    let mut out = BytesMut::with_capacity(1024);
    clients.set_kind(id, KIND_PUBSUB);
    let add = |ch: Bytes, subs: &mut Vec<Bytes>, out: &mut BytesMut| {
        if !subs.contains(&ch) && subs.len() < MAX_CHANNELS {
            hub.subscribe(ch.clone(), id, tx.clone());
            subs.push(ch.clone());
        }
        confirm(out, proto, b"subscribe", Some(&ch), subs.len());
    };
    for ch in first {
        add(ch, &mut subs, &mut out);
    }
    let mut argv: Vec<Bytes> = Vec::new();
    let back = loop {
        if !out.is_empty() {
            if stream.write_all(&out).await.is_err() {
                break false;
            }
            out.clear();
        }
        tokio::select! {
            m = rx.recv() => {
                let Some((ch, msg)) = m else { break false };
                push_header(&mut out, proto, 3);
                push_bulk(&mut out, b"message");
                push_bulk(&mut out, &ch);
                push_bulk(&mut out, &msg);
            }
            r = stream.read_buf(&mut inbuf) => {
                if !matches!(r, Ok(n) if n > 0) {
                    break false;
                }
                let mut leave = None;
                loop {
                    match parse_command_into(&mut inbuf, &limits, &mut argv) {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(_) => { leave = Some(false); break; }
                    }
                    let Some(name) = argv.first().map(|a| a.to_ascii_lowercase()) else { continue };
                    match name.as_slice() {
                        b"subscribe" => {
                            for ch in argv[1..].iter().cloned() {
                                add(ch, &mut subs, &mut out);
                            }
                        }
                        b"unsubscribe" => {
                            let which: Vec<Bytes> = if argv.len() > 1 { argv[1..].to_vec() } else { subs.clone() };
                            for ch in which {
                                hub.unsubscribe(&ch, id);
                                subs.retain(|c| *c != ch);
                                confirm(&mut out, proto, b"unsubscribe", Some(&ch), subs.len());
                            }
                            if subs.is_empty() {
                                leave = Some(true);
                            }
                        }
                        b"ping" => {
                            push_header(&mut out, 2, 2);
                            push_bulk(&mut out, b"pong");
                            push_bulk(&mut out, argv.get(1).map_or(&b""[..], |b| b));
                        }
                        b"quit" => {
                            out.extend_from_slice(b"+OK\r\n");
                            leave = Some(false);
                        }
                        b"reset" => {
                            out.extend_from_slice(b"+RESET\r\n");
                            leave = Some(true);
                        }
                        other => {
                            let shown: String = String::from_utf8_lossy(other).chars().take(64).collect();
                            out.extend_from_slice(format!("-ERR Can't execute '{shown}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n").as_bytes());
                        }
                    }
                    if leave.is_some() {
                        break;
                    }
                }
                argv.clear();
                if let Some(b) = leave {
                    if !out.is_empty() && stream.write_all(&out).await.is_err() {
                        break false;
                    }
                    out.clear();
                    break b;
                }
            }
        }
    };
    for ch in &subs {
        hub.unsubscribe(ch, id);
    }
    clients.set_kind(id, KIND_NORMAL);
    back.then_some((stream, inbuf))
}
