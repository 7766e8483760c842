//! Moving slots between groups (docs/cluster.md, "Moving slots"): `CLUSTER SETSLOT`,
//! `COUNTKEYSINSLOT`, `GETKEYSINSLOT`, and `SALE.MIGRATE` / `SALE.IMPORT`, which hand one
//! sale over as Redis's `MIGRATE` hands over one key.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;

use super::{Ctx, Deferred, Outcome};
use crate::cluster::{key_slot, Cluster, SlotChange, SLOTS};
use crate::engine::Engine;
use crate::protocol::reply::from_engine_error;
use crate::protocol::Reply;
use crate::session::Durability;
use crate::wal::handover;

/// How long `SALE.MIGRATE` waits to connect, and then for each reply.
const LINK_TIMEOUT: Duration = Duration::from_secs(10);

fn admin_only(ctx: &Ctx<'_>, what: &str) -> Option<Reply> {
    let admin = ctx.conn.role == Some(crate::users::Role::Admin);
    (ctx.shared.users.is_some() && !admin).then(|| {
        let user = ctx.conn.user_name.clone().unwrap_or_default();
        Reply::err(format!(
            "NOPERM User {user} has no permissions to run the '{what}' command"
        ))
    })
}

fn parse_slot(arg: &[u8]) -> Result<u16, Reply> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|&s| s < SLOTS)
        .ok_or_else(|| Reply::err("ERR Invalid or out of range slot"))
}

/// `CLUSTER SETSLOT <slot> IMPORTING <id> | MIGRATING <id> | NODE <id> | STABLE`: logged
/// in the group's log, applied once logged here; the reply waits for the record.
pub fn setslot(ctx: &mut Ctx<'_>, c: &Cluster, args: &[&[u8]]) -> Outcome {
    if let Some(refusal) = admin_only(ctx, "cluster|setslot") {
        return refusal.into();
    }
    if let Some(refusal) = ctx.shared.repl.get().and_then(|r| r.write_refusal()) {
        return Reply::err(refusal).into();
    }
    let change = match parse_change(c, args) {
        Ok(change) => change,
        Err(refusal) => return refusal.into(),
    };
    let Some(feed) = ctx.shared.feed.get() else {
        return Reply::err("ERR this server keeps no log to record slot changes in").into();
    };
    let (kind, body) = change.encode();
    let lsn = feed.groups.log_opaque(kind, &body);
    c.apply(&change);
    Outcome::logged(Reply::ok(), lsn)
}

fn parse_change(c: &Cluster, args: &[&[u8]]) -> Result<SlotChange, Reply> {
    let slot = parse_slot(args[0])?;
    let how = String::from_utf8_lossy(args[1]).to_ascii_uppercase();
    let group = |i: usize| -> Result<u16, Reply> {
        let id = args.get(i).map(|a| String::from_utf8_lossy(a).into_owned());
        let id = id.ok_or_else(|| super::args::syntax_error("cluster|setslot"))?;
        c.group_of_node(&id)
            .map(|g| g as u16)
            .ok_or_else(|| Reply::err(format!("ERR I don't know about node {id}")))
    };
    let change = match (how.as_str(), args.len()) {
        ("IMPORTING", 3) => SlotChange::Importing {
            slot,
            from: group(2)?,
        },
        ("MIGRATING", 3) => SlotChange::Migrating {
            slot,
            to: group(2)?,
        },
        ("NODE", 3) => SlotChange::Node {
            slot,
            owner: group(2)?,
        },
        ("STABLE", 2) => SlotChange::Stable { slot },
        _ => {
            return Err(Reply::err(
                "ERR Invalid CLUSTER SETSLOT action or number of arguments. Try CLUSTER HELP",
            ))
        }
    };
    Ok(change)
}

fn skus_in_slot(ctx: &Ctx<'_>, slot: u16) -> Vec<String> {
    ctx.engine
        .list_sales()
        .into_iter()
        .filter(|s| key_slot(s.as_bytes()) == slot)
        .collect()
}

/// `CLUSTER COUNTKEYSINSLOT <slot>`: the sales this node holds on the slot.
pub fn count_keys(ctx: &Ctx<'_>, slot: &[u8]) -> Reply {
    match parse_slot(slot) {
        Ok(s) => Reply::Int(skus_in_slot(ctx, s).len() as i64),
        Err(r) => r,
    }
}

/// `CLUSTER GETKEYSINSLOT <slot> <count>`: up to `count` of their skus, sorted.
pub fn get_keys(ctx: &Ctx<'_>, slot: &[u8], count: &[u8]) -> Reply {
    let slot = match parse_slot(slot) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let Some(count) = std::str::from_utf8(count)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    else {
        return Reply::err("ERR Invalid number of keys");
    };
    let mut skus = skus_in_slot(ctx, slot);
    skus.truncate(count);
    Reply::Array(skus.iter().map(Reply::bulk).collect())
}

/// `SALE.IMPORT <export>`: installs a sale another group exported; `+OK` once logged.
pub fn import(ctx: &Ctx<'_>, args: &[&[u8]]) -> Outcome {
    match handover::import_sale(ctx.engine, args[0]) {
        Ok(lsn) => Outcome::logged(Reply::ok(), lsn),
        Err(e) => from_engine_error(&e).into(),
    }
}

/// `SALE.MIGRATE <host> <port> <sku>`: freezes the sale, and once the freeze is durable
/// sends it to the destination (`ASKING`, `SALE.IMPORT`), then drops it here. The network
/// part runs on a blocking thread; only this connection waits.
pub fn migrate(ctx: &Ctx<'_>, args: &[&[u8]]) -> Outcome {
    let host = String::from_utf8_lossy(args[0]).into_owned();
    let Some(port) = std::str::from_utf8(args[1])
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
    else {
        return Reply::err("ERR port must be a number from 1 to 65535").into();
    };
    let sku = String::from_utf8_lossy(args[2]).into_owned();
    let tls = match link_tls(ctx) {
        Ok(t) => t,
        Err(refusal) => return refusal.into(),
    };
    let Some(engine) = ctx.shared.engine.get().cloned() else {
        return Reply::err("ERR SALE.MIGRATE is not available on this server").into();
    };
    let freeze_lsn = match engine.freeze(&sku) {
        Ok(lsn) => lsn,
        Err(e) => return from_engine_error(&e).into(),
    };
    let blob = match handover::export_sale(&engine, &sku) {
        Ok(b) => b,
        Err(e) => {
            let _ = engine.thaw(&sku);
            return from_engine_error(&e).into();
        }
    };
    let mv = Move {
        engine,
        durability: ctx.shared.durability.clone(),
        auth: ctx
            .shared
            .cluster
            .get()
            .and_then(|c| c.probe_auth.as_ref().map(|a| a.command().to_vec())),
        addr: format!("{host}:{port}"),
        host,
        tls,
        sku,
    };
    let wait: Deferred = Box::pin(mv.run(freeze_lsn, blob));
    // Refused inside MULTI (`multi::not_in_multi`), so this answer is never sent.
    Outcome::deferred(
        Reply::err("ERR SALE.MIGRATE cannot run inside a transaction"),
        wait,
    )
}

/// The TLS settings of the link to the destination with `--tls-cluster yes` (the peer
/// connector in force now), `None` for plain TCP.
fn link_tls(ctx: &Ctx<'_>) -> Result<Option<Arc<ClientConfig>>, Reply> {
    let Some(tls) = ctx.shared.cluster.get().and_then(|c| c.peer_tls.as_ref()) else {
        return Ok(None);
    };
    match tls.peers() {
        Some((_, connector)) => Ok(Some(connector.config().clone())),
        None => Err(Reply::err(
            "ERR SALE.MIGRATE over TLS needs --tls-ca-cert-file (the CA the destination's certificate is checked against)",
        )),
    }
}

/// One sale's handover, after the freeze.
struct Move {
    engine: Arc<Engine>,
    durability: Arc<dyn Durability>,
    auth: Option<Vec<u8>>,
    addr: String,
    /// The destination's host, the name its certificate must hold over TLS.
    host: String,
    tls: Option<Arc<ClientConfig>>,
    sku: String,
}

/// How sending the export ended.
enum Sent {
    /// The destination answered `+OK`: it holds the sale durably.
    Imported,
    /// Nothing reached the destination, or it refused: the sale may open here again.
    NotThere(String),
    /// The link broke after the export left: the destination may hold it. The sale stays
    /// frozen here; `SALE.MIGRATE` again finishes (the import is idempotent).
    Unknown(String),
}

impl Move {
    async fn run(self, freeze_lsn: u64, blob: Vec<u8>) -> Reply {
        // Sent only once the freeze is durable: a restart must never find the sale open
        // here while the destination holds it.
        if let Err(e) = self.durability.wait(freeze_lsn).await {
            return Reply::err(format!("ERR SALE.MIGRATE: the freeze was not logged: {e}"));
        }
        let link = Link {
            addr: self.addr.clone(),
            host: self.host.clone(),
            tls: self.tls.clone(),
        };
        let auth = self.auth.clone();
        let sent = tokio::task::spawn_blocking(move || send(&link, auth.as_deref(), &blob))
            .await
            .unwrap_or_else(|e| Sent::Unknown(format!("the sending thread stopped: {e}")));
        match sent {
            Sent::Imported => self.drop_here().await,
            Sent::NotThere(why) => {
                if let Ok(lsn) = self.engine.thaw(&self.sku) {
                    let _ = self.durability.wait(lsn).await;
                }
                Reply::err(format!(
                    "ERR SALE.MIGRATE to {}: {why}; the sale stays here",
                    self.addr
                ))
            }
            Sent::Unknown(why) => Reply::err(format!(
                "ERR SALE.MIGRATE to {}: {why}; the sale stays frozen here: run SALE.MIGRATE again to finish",
                self.addr
            )),
        }
    }

    async fn drop_here(&self) -> Reply {
        match self.engine.drop_sale(&self.sku) {
            Ok(lsn) => match self.durability.wait(lsn).await {
                Ok(()) => Reply::ok(),
                Err(e) => Reply::err(format!("ERR SALE.MIGRATE: the drop was not logged: {e}")),
            },
            // Dropped already (a concurrent SALE.MIGRATE of the same sale finished).
            Err(crate::engine::EngineError::NoSale) => Reply::ok(),
            Err(e) => from_engine_error(&e),
        }
    }
}

fn resp_command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Where the export goes, and how.
struct Link {
    addr: String,
    host: String,
    tls: Option<Arc<ClientConfig>>,
}

/// A byte stream to the destination: TCP, or TLS over it.
trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

/// Why reading a reply failed.
enum ReadError {
    /// A TLS alert came back to plain bytes: the destination serves TLS only there, so it
    /// ran none of them.
    SpeaksTls,
    Other(String),
}

/// Sends `[AUTH] ASKING SALE.IMPORT <blob>` in one write and reads the replies.
fn send(link: &Link, auth: Option<&[u8]>, blob: &[u8]) -> Sent {
    let mut conn = match connect(link) {
        Ok(c) => c,
        Err(e) => return Sent::NotThere(e),
    };
    let mut req = auth.map(<[u8]>::to_vec).unwrap_or_default();
    req.extend(resp_command(&[b"ASKING"]));
    req.extend(resp_command(&[b"SALE.IMPORT", blob]));
    if let Err(e) = conn.write_all(&req).and_then(|()| conn.flush()) {
        return Sent::Unknown(format!("sending failed: {e}"));
    }
    // Pipelined: the import's own answer, the last, decides (an AUTH refused before it
    // makes the import answer -NOAUTH, not run).
    let replies = if auth.is_some() { 3 } else { 2 };
    let mut last = String::new();
    for _ in 0..replies {
        last = match read_line(&mut conn) {
            Ok(l) => l,
            Err(ReadError::SpeaksTls) => {
                return Sent::NotThere(
                    "it answers only TLS on that port: start this node with --tls-cluster yes"
                        .into(),
                )
            }
            Err(ReadError::Other(e)) => return Sent::Unknown(format!("no answer: {e}")),
        };
    }
    if last == "+OK" {
        return Sent::Imported;
    }
    let shown = last.trim_start_matches('-').to_string();
    Sent::NotThere(format!("the destination refused the import: {shown}"))
}

/// TCP to the destination with the time limits, and TLS on it when asked (its handshake
/// done here: a failure leaves nothing sent).
fn connect(link: &Link) -> Result<Box<dyn Stream>, String> {
    let tcp = connect_tcp(&link.addr)?;
    match &link.tls {
        None => Ok(Box::new(tcp)),
        Some(cfg) => Ok(Box::new(crate::tls::peer::connect_blocking(
            tcp,
            &link.host,
            cfg.clone(),
        )?)),
    }
}

fn connect_tcp(addr: &str) -> Result<TcpStream, String> {
    let sock = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve: {e}"))?
        .next()
        .ok_or("cannot resolve")?;
    let conn = TcpStream::connect_timeout(&sock, LINK_TIMEOUT)
        .map_err(|e| format!("cannot connect: {e}"))?;
    conn.set_read_timeout(Some(LINK_TIMEOUT))
        .and_then(|_| conn.set_write_timeout(Some(LINK_TIMEOUT)))
        .map_err(|e| format!("cannot set timeouts: {e}"))?;
    Ok(conn)
}

/// The first byte of a TLS alert record, which no RESP reply starts with.
const TLS_ALERT: u8 = 0x15;

/// One reply line (a simple string or an error), at most 4 KiB.
fn read_line(conn: &mut dyn Stream) -> Result<String, ReadError> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < 4096 {
        match conn.read(&mut b) {
            Ok(0) => return Err(ReadError::Other("the connection closed".into())),
            Ok(_) if line.is_empty() && b[0] == TLS_ALERT => return Err(ReadError::SpeaksTls),
            Ok(_) => line.push(b[0]),
            Err(e) => return Err(ReadError::Other(e.to_string())),
        }
        if line.ends_with(b"\r\n") {
            line.truncate(line.len() - 2);
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
    }
    Err(ReadError::Other("an answer too long".into()))
}
