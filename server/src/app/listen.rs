//! The client port's listening sockets: the plain port's and the TLS port's, one of
//! each per event loop.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};

use socket2::{Domain, Socket, Type};

use super::config::Config;
use crate::server::Ports;

/// The listeners of the first event loop and those of the others.
pub(super) type Bound = (Ports<TcpListener>, Vec<Ports<TcpListener>>);

/// The plain port's listeners and, with TLS on `tls_port`, the TLS port's, one of each
/// per event loop. TLS only (`--port 0` with a fixed `--tls-port`): no plain ones.
pub(super) fn bind_ports(
    c: &Config,
    tls_port: Option<u16>,
    threads: usize,
) -> Result<Bound, String> {
    let (host, backlog) = (c.listen.bind.as_str(), c.listen.tcp_backlog as i32);
    let plain = match c.tls_only() {
        true => None,
        false => Some(bind_listeners(host, c.listen.port, threads, backlog)?),
    };
    let tls = match tls_port {
        Some(port) => Some(bind_listeners(host, port, threads, backlog)?),
        None => None,
    };
    let (plain, mut plain_extra) = split(plain);
    let (tls, mut tls_extra) = split(tls);
    let extra = (0..threads.saturating_sub(1))
        .map(|_| Ports {
            plain: plain_extra.next(),
            tls: tls_extra.next(),
        })
        .collect();
    Ok((Ports { plain, tls }, extra))
}

/// One port's listeners: the first loop's, and an iterator over the others'.
fn split(
    bound: Option<(TcpListener, Vec<TcpListener>)>,
) -> (Option<TcpListener>, std::vec::IntoIter<TcpListener>) {
    match bound {
        Some((first, rest)) => (Some(first), rest.into_iter()),
        None => (None, Vec::new().into_iter()),
    }
}

/// The listening sockets of `threads` event loops on one address. One loop: a plain
/// socket. More: `SO_REUSEPORT` on each, so the kernel spreads connections over them.
/// `SO_REUSEPORT` would also let a second server of the same user bind the same port and
/// silently take half the connections, so the port is first claimed by a plain socket:
/// if anything holds it, that bind fails as it would with one loop.
fn bind_listeners(
    host: &str,
    port: u16,
    threads: usize,
    backlog: i32,
) -> Result<(TcpListener, Vec<TcpListener>), String> {
    let what = |e: std::io::Error| format!("bind {host}:{port}: {e}");
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(what)?
        .next()
        .ok_or_else(|| format!("bind {host}:{port}: no address"))?;
    // As tokio's `TcpListener::bind`: SO_REUSEADDR (restart while old connections are in
    // TIME_WAIT); the backlog is `--tcp-backlog`.
    let listen = |addr: SocketAddr, reuse_port: bool| {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(what)?;
        s.set_reuse_address(true).map_err(what)?;
        if reuse_port {
            s.set_reuse_port(true).map_err(what)?;
        }
        s.bind(&addr.into()).map_err(what)?;
        s.listen(backlog).map_err(what)?;
        Ok::<_, String>(TcpListener::from(s))
    };
    let plain = listen(addr, false)?;
    if threads <= 1 {
        return Ok((plain, Vec::new()));
    }
    let addr = plain.local_addr().map_err(what)?;
    drop(plain);
    let mut all = Vec::with_capacity(threads);
    for _ in 0..threads {
        all.push(listen(addr, true)?);
    }
    let first = all.remove(0);
    Ok((first, all))
}

/// The first loop's listeners on the runtime.
pub(super) fn to_tokio(
    first: Ports<TcpListener>,
) -> Result<Ports<tokio::net::TcpListener>, String> {
    let to_tokio = |l: TcpListener| {
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        tokio::net::TcpListener::from_std(l).map_err(|e| e.to_string())
    };
    Ok(Ports {
        plain: first.plain.map(to_tokio).transpose()?,
        tls: first.tls.map(to_tokio).transpose()?,
    })
}
