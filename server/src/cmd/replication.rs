//! Replication and Sentinel commands: REPLICAOF/SLAVEOF, ROLE, WAIT, REPLCONF,
//! PSYNC/SYNC (the link itself is `crate::repl`), PUBLISH/SUBSCRIBE (`crate::pubsub`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{Ctx, Outcome};
use crate::protocol::Reply;
use crate::session::{Replication, SyncRequest};

fn repl(ctx: &Ctx<'_>) -> Result<Arc<dyn Replication>, Reply> {
    ctx.shared.repl.get().cloned().ok_or_else(|| {
        Reply::err("ERR replication needs the write-ahead log (this server runs without one)")
    })
}

fn text(b: &[u8]) -> Option<&str> {
    std::str::from_utf8(b).ok()
}

/// `REPLICAOF host port` | `REPLICAOF NO ONE` (and `SLAVEOF`, what Sentinel sends).
pub struct ReplicaOf(Option<(String, u16)>);

impl ReplicaOf {
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        let (host, port) = (text(args[0]).unwrap_or(""), text(args[1]).unwrap_or(""));
        if host.eq_ignore_ascii_case("no") && port.eq_ignore_ascii_case("one") {
            return Ok(ReplicaOf(None));
        }
        let valid_host = !host.is_empty()
            && host.len() <= 255
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:_[]".contains(&b));
        if !valid_host {
            return Err(Reply::err("ERR Invalid master host"));
        }
        match port.parse::<u16>() {
            Ok(p) if p > 0 => Ok(ReplicaOf(Some((host.to_owned(), p)))),
            _ => Err(Reply::err("ERR Invalid master port")),
        }
    }

    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let r = match repl(ctx) {
            Ok(r) => r,
            Err(e) => return e.into(),
        };
        if let Some((h, p)) = &self.0 {
            let me = ctx
                .shared
                .local_port
                .load(std::sync::atomic::Ordering::Relaxed);
            if *p == me && (h == "127.0.0.1" || h == "localhost" || *h == ctx.shared.config.bind) {
                return Reply::err("ERR can't replicate from myself").into();
            }
        }
        match r.replicaof(self.0) {
            Ok(msg) => Reply::Simple(msg).into(),
            Err(e) => Reply::err(format!("ERR {e}")).into(),
        }
    }
}

pub fn role(ctx: &mut Ctx<'_>) -> Outcome {
    match ctx.shared.repl.get() {
        Some(r) => r.role_reply().into(),
        None => Reply::Array(vec![
            Reply::bulk("master"),
            Reply::Int(ctx.engine.last_lsn() as i64),
            Reply::Array(vec![]),
        ])
        .into(),
    }
}

/// `WAIT numreplicas timeout`: blocks until that many replicas have everything this
/// server logged so far, or the timeout (ms; 0 = up to an hour) passes; answers the count.
pub struct Wait {
    n: usize,
    timeout: Duration,
}

impl Wait {
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        let n = text(args[0])
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(Reply::not_integer)?;
        let t = text(args[1])
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(Reply::not_integer)?;
        if t < 0 {
            return Err(Reply::err("ERR timeout is negative"));
        }
        let timeout = if t == 0 {
            Duration::from_secs(3600)
        } else {
            Duration::from_millis(t as u64)
        };
        Ok(Wait {
            n: n.max(0) as usize,
            timeout,
        })
    }

    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let r = match repl(ctx) {
            Ok(r) => r,
            Err(_) => return Reply::Int(0).into(),
        };
        if r.is_replica() {
            return Reply::err("ERR WAIT cannot be used with replica instances.").into();
        }
        let lsn = ctx.engine.last_lsn();
        let (n, timeout) = (self.n, self.timeout);
        let wait: super::Deferred =
            Box::pin(async move { Reply::Int(r.wait_count(lsn, n, timeout).await as i64) });
        // Inside EXEC (no waiting there): 0.
        Outcome::deferred(Reply::Int(0), wait)
    }
}

/// `REPLCONF ...`: the replica's settings before `PSYNC`. Acknowledgements travel on the
/// replication link itself (see `repl::primary`), never through here.
pub fn replconf(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    if !args.len().is_multiple_of(2) {
        return Reply::syntax().into();
    }
    for pair in args.chunks(2) {
        let key = String::from_utf8_lossy(pair[0]).to_ascii_lowercase();
        match key.as_str() {
            "listening-port" => match text(pair[1]).and_then(|s| s.parse::<u16>().ok()) {
                Some(p) => ctx.conn.repl_port = Some(p),
                None => return Reply::err("ERR invalid listening-port").into(),
            },
            "ack" | "getack" => return Outcome::from(Reply::ok()),
            _ => {}
        }
    }
    Reply::ok().into()
}

/// `PSYNC replid offset` / `SYNC`: the connection becomes a replication link.
pub fn psync(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    let r = match repl(ctx) {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    let (replid, offset) = match args {
        [id, off] => {
            let Some(off) = text(off).and_then(|s| s.parse::<i64>().ok()) else {
                return Reply::not_integer().into();
            };
            (String::from_utf8_lossy(id).into_owned(), off)
        }
        _ => ("?".to_owned(), -1),
    };
    let ip = ctx
        .conn
        .addr
        .rsplit_once(':')
        .map_or(ctx.conn.addr.as_str(), |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let req = SyncRequest {
        replid,
        offset,
        ip,
        port: ctx.conn.repl_port.unwrap_or(0),
    };
    let clients = ctx.shared.clients.clone();
    let id = ctx.conn.id;
    Outcome::takeover(Box::new(move |stream, inbuf| {
        Box::pin(async move {
            clients.set_kind(id, crate::pubsub::KIND_REPLICA);
            r.serve_replica(stream, inbuf, req).await;
            None
        })
    }))
}

pub fn publish(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    Reply::Int(ctx.shared.pubsub.publish(args[0], args[1]) as i64).into()
}

pub fn subscribe(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    let (hub, clients) = (ctx.shared.pubsub.clone(), ctx.shared.clients.clone());
    let (id, proto, limits) = (
        ctx.conn.id,
        ctx.conn.proto,
        ctx.shared.config.limits.clone(),
    );
    // The subscriber loop outlives the read buffer these arguments point into.
    let first = args.iter().map(|a| Bytes::copy_from_slice(a)).collect();
    Outcome::takeover(Box::new(move |stream, inbuf| {
        Box::pin(crate::pubsub::subscriber(
            hub, clients, id, proto, stream, inbuf, first, limits,
        ))
    }))
}

/// `UNSUBSCRIBE` outside subscriber mode: nothing to leave (Redis's answer).
pub fn unsubscribe(args: &[&[u8]]) -> Outcome {
    let ch = args.first().map_or(Reply::Nil, |c| Reply::Bulk(c.to_vec()));
    Reply::Array(vec![Reply::bulk("unsubscribe"), ch, Reply::Int(0)]).into()
}

/// `SENTINEL subcommand ...`, answered by a Raft group member from its leadership.
pub fn sentinel(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    match repl(ctx) {
        Ok(r) => r.sentinel(args).into(),
        Err(e) => e.into(),
    }
}

/// `RAFT.MEMBERS`, `RAFT.ADD`, `RAFT.REMOVE`: the reply comes when the group has decided
/// (inside EXEC, where a connection cannot wait, they are refused).
pub fn raft(ctx: &mut Ctx<'_>, name: &str, args: &[&[u8]]) -> Outcome {
    let r = match repl(ctx) {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    match r.raft(name, args) {
        Ok(fut) => Outcome::deferred(Reply::err("ERR RAFT commands cannot run inside MULTI"), fut),
        Err(e) => e.into(),
    }
}
