//! A minimal pipelined RESP2 client over a tokio `TcpStream`.
//!
//! Hand-rolled on purpose: the load generator shares two cores with the server under
//! test, so the client does the least work possible per request (one buffered write per
//! batch of `P` commands, replies parsed in place from one read buffer). The same client
//! drives stockgate and Redis, so its cost is the same on both sides of a comparison.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One reply, RESP2 plus the RESP3 null.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            Reply::Bulk(Some(b)) => std::str::from_utf8(b).ok()?.parse().ok(),
            Reply::Simple(s) => s.parse().ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Reply::Simple(s) => Some(s),
            Reply::Bulk(Some(b)) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// Error replies become `Err`.
    pub fn ok(self) -> Result<Reply> {
        match self {
            Reply::Error(e) => Err(anyhow!("server replied -{e}")),
            r => Ok(r),
        }
    }
}

/// Append one command in RESP array-of-bulk-strings form.
pub fn encode(buf: &mut Vec<u8>, args: &[&[u8]]) {
    buf.push(b'*');
    push_num(buf, args.len());
    for a in args {
        buf.push(b'$');
        push_num(buf, a.len());
        buf.extend_from_slice(a);
        buf.extend_from_slice(b"\r\n");
    }
}

fn push_num(buf: &mut Vec<u8>, n: usize) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    let mut n = n;
    loop {
        i -= 1;
        tmp[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&tmp[i..]);
    buf.extend_from_slice(b"\r\n");
}

/// Parse one reply from the front of `buf`: `Ok(None)` if incomplete, else the reply and
/// the number of bytes it used.
pub fn parse(buf: &[u8]) -> Result<Option<(Reply, usize)>> {
    parse_at(buf, 0, 0)
}

fn line_end(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| from + p)
}

fn parse_int(b: &[u8]) -> Result<i64> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad integer in reply: {:?}", String::from_utf8_lossy(b)))
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Reply, usize)>> {
    if depth > 16 {
        bail!("reply nested too deeply");
    }
    let Some(&tag) = buf.get(at) else {
        return Ok(None);
    };
    let Some(end) = line_end(buf, at + 1) else {
        return Ok(None);
    };
    let line = &buf[at + 1..end];
    let next = end + 2;
    match tag {
        b'+' => Ok(Some((
            Reply::Simple(String::from_utf8_lossy(line).into_owned()),
            next,
        ))),
        b'-' => Ok(Some((
            Reply::Error(String::from_utf8_lossy(line).into_owned()),
            next,
        ))),
        b':' => Ok(Some((Reply::Int(parse_int(line)?), next))),
        b'_' => Ok(Some((Reply::Bulk(None), next))),
        b'$' => {
            let n = parse_int(line)?;
            if n < 0 {
                return Ok(Some((Reply::Bulk(None), next)));
            }
            let n = n as usize;
            if buf.len() < next + n + 2 {
                return Ok(None);
            }
            Ok(Some((
                Reply::Bulk(Some(buf[next..next + n].to_vec())),
                next + n + 2,
            )))
        }
        b'*' | b'%' | b'~' => {
            let n = parse_int(line)?;
            if n < 0 {
                return Ok(Some((Reply::Array(None), next)));
            }
            let n = if tag == b'%' { n * 2 } else { n } as usize;
            let mut items = Vec::with_capacity(n.min(1024));
            let mut pos = next;
            for _ in 0..n {
                match parse_at(buf, pos, depth + 1)? {
                    Some((r, p)) => {
                        items.push(r);
                        pos = p;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Reply::Array(Some(items)), pos)))
        }
        other => bail!("unexpected reply type byte {:?}", other as char),
    }
}

/// One connection: write a batch, then read its replies in order.
pub struct RespConn {
    stream: TcpStream,
    rbuf: BytesMut,
}

impl RespConn {
    pub async fn connect(addr: SocketAddr) -> Result<Self> {
        let stream = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr))
            .await
            .map_err(|_| anyhow!("connecting to {addr} timed out"))?
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(RespConn {
            stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
        })
    }

    pub async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream
            .write_all(bytes)
            .await
            .context("writing to server")
    }

    /// Read the next reply (waiting for more bytes as needed).
    pub async fn read_reply(&mut self) -> Result<Reply> {
        loop {
            if let Some((r, used)) = parse(&self.rbuf)? {
                self.rbuf.advance(used);
                return Ok(r);
            }
            if self.rbuf.capacity() - self.rbuf.len() < 16 * 1024 {
                self.rbuf.reserve(64 * 1024);
            }
            let n = self
                .stream
                .read_buf(&mut self.rbuf)
                .await
                .context("reading from server")?;
            if n == 0 {
                bail!("server closed the connection");
            }
        }
    }

    /// One command, one reply, with a deadline (setup and checks, not the measured path).
    pub async fn call(&mut self, args: &[&[u8]]) -> Result<Reply> {
        let mut buf = Vec::new();
        encode(&mut buf, args);
        tokio::time::timeout(Duration::from_secs(30), async {
            self.send(&buf).await?;
            self.read_reply().await
        })
        .await
        .map_err(|_| anyhow!("command {:?} timed out", String::from_utf8_lossy(args[0])))?
    }

    /// `call` with string arguments.
    pub async fn cmd(&mut self, args: &[&str]) -> Result<Reply> {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.call(&a).await
    }
}
