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
/// An export too large for one message comes in parts (see [`staging`]):
/// `SALE.IMPORT BEGIN <sku> <bytes>`, `SALE.IMPORT PART <sku> <offset> <chunk>`...,
/// `SALE.IMPORT END <sku>` (imports what was staged), `SALE.IMPORT ABORT <sku>`.
pub fn import(ctx: &Ctx<'_>, args: &[&[u8]]) -> Outcome {
    if let [blob] = args {
        return import_blob(ctx, blob);
    }
    let verb = String::from_utf8_lossy(args[0]).to_ascii_uppercase();
    let sku = args.get(1).map(|a| String::from_utf8_lossy(a).into_owned());
    let engine = ctx.engine as *const crate::engine::Engine as usize;
    let staged = match (verb.as_str(), sku, &args[2..]) {
        ("BEGIN", Some(sku), [bytes]) => {
            number(bytes).and_then(|n| staging::begin(engine, &sku, n))
        }
        ("PART", Some(sku), [offset, chunk]) => {
            number(offset).and_then(|at| staging::part(engine, &sku, at, chunk))
        }
        ("ABORT", Some(sku), []) => {
            staging::abort(engine, &sku);
            Ok(())
        }
        ("END", Some(sku), []) => {
            return match staging::end(engine, &sku) {
                Ok(blob) => import_blob(ctx, &blob),
                Err(e) => Reply::err(format!("ERR {e}")).into(),
            }
        }
        _ => return super::args::syntax_error("sale.import").into(),
    };
    match staged {
        Ok(()) => Reply::ok().into(),
        Err(e) => Reply::err(format!("ERR {e}")).into(),
    }
}

fn number(arg: &[u8]) -> Result<usize, staging::StagingError> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(staging::StagingError::NotANumber)
}

fn import_blob(ctx: &Ctx<'_>, blob: &[u8]) -> Outcome {
    match handover::import_sale(ctx.engine, blob) {
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
    // A sale frozen before this call may have reached the destination in an earlier
    // handover whose answer was lost: a link failure must then leave it frozen.
    let was_frozen = engine
        .sale_info(&sku)
        .is_ok_and(|info| info.state.is_moving());
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
        was_frozen,
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
    /// The sale was frozen before this handover began (see [`migrate`]).
    was_frozen: bool,
}

/// How sending the export ended.
enum Sent {
    /// The destination answered `+OK`: it holds the sale durably.
    Imported,
    /// The destination refused the import: the sale may open here again.
    Refused(String),
    /// The link failed before the destination could have imported anything (it was not
    /// reached, or the export's last part was never sent): the sale may open here
    /// again unless an earlier handover may have delivered it.
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
        let sku = self.sku.clone();
        let sent = tokio::task::spawn_blocking(move || send(&link, auth.as_deref(), &sku, &blob))
            .await
            .unwrap_or_else(|e| Sent::Unknown(format!("the sending thread stopped: {e}")));
        match sent {
            Sent::Imported => self.drop_here().await,
            Sent::NotThere(why) if self.was_frozen => self.frozen(&why),
            Sent::Refused(why) | Sent::NotThere(why) => self.thaw(&why).await,
            Sent::Unknown(why) => self.frozen(&why),
        }
    }

    async fn thaw(&self, why: &str) -> Reply {
        if let Ok(lsn) = self.engine.thaw(&self.sku) {
            let _ = self.durability.wait(lsn).await;
        }
        Reply::err(format!(
            "ERR SALE.MIGRATE to {}: {why}; the sale stays here",
            self.addr
        ))
    }

    fn frozen(&self, why: &str) -> Reply {
        Reply::err(format!(
            "ERR SALE.MIGRATE to {}: {why}; the sale stays frozen here: run SALE.MIGRATE again to finish",
            self.addr
        ))
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

/// Exports up to this size go as one `SALE.IMPORT <export>` (what every version of the
/// destination reads); larger ones in parts of this size, each well under what a node
/// reads as one argument.
pub const PART_BYTES: usize = 512 * 1024;

/// Sends the export: `[AUTH] ASKING SALE.IMPORT <blob>` in one write when it is small,
/// else `BEGIN`, the parts and `END`, each answered before the next is sent (a refusal
/// stops the transfer at once). Until `END` is sent the destination holds nothing but
/// staged bytes, so a failure before it is [`Sent::NotThere`].
fn send(link: &Link, auth: Option<&[u8]>, sku: &str, blob: &[u8]) -> Sent {
    // The import of a large export takes a while on the destination: its records are
    // logged (and, on a Raft group, committed) before it answers.
    let patience = LINK_TIMEOUT + Duration::from_secs((blob.len() / (4 << 20)) as u64);
    let mut conn = match connect(link, patience) {
        Ok(c) => c,
        Err(e) => return Sent::NotThere(e),
    };
    let mut req = auth.map(<[u8]>::to_vec).unwrap_or_default();
    req.extend(resp_command(&[b"ASKING"]));
    if blob.len() <= PART_BYTES {
        req.extend(resp_command(&[b"SALE.IMPORT", blob]));
        // Pipelined: the import's own answer, the last, decides (an AUTH refused before
        // it makes the import answer -NOAUTH, not run).
        let replies = if auth.is_some() { 3 } else { 2 };
        return exchange(&mut *conn, &req, replies, true);
    }
    let total = blob.len().to_string();
    req.extend(resp_command(&[
        b"SALE.IMPORT",
        b"BEGIN",
        sku.as_bytes(),
        total.as_bytes(),
    ]));
    let replies = if auth.is_some() { 3 } else { 2 };
    if let Some(failed) = answered_ok(exchange(&mut *conn, &req, replies, false)) {
        return failed;
    }
    for (i, chunk) in blob.chunks(PART_BYTES).enumerate() {
        let at = (i * PART_BYTES).to_string();
        let part = resp_command(&[
            b"SALE.IMPORT",
            b"PART",
            sku.as_bytes(),
            at.as_bytes(),
            chunk,
        ]);
        if let Some(failed) = answered_ok(exchange(&mut *conn, &part, 1, false)) {
            return failed;
        }
    }
    let end = resp_command(&[b"SALE.IMPORT", b"END", sku.as_bytes()]);
    exchange(&mut *conn, &end, 1, true)
}

/// `None` when the step was answered `+OK`, else how the transfer ended.
fn answered_ok(sent: Sent) -> Option<Sent> {
    match sent {
        Sent::Imported => None,
        failed => Some(failed),
    }
}

/// Writes `req` and reads `replies` answers; the last decides. With `last`, the request
/// may import the sale, so a failure after it was written is [`Sent::Unknown`].
fn exchange(conn: &mut dyn Stream, req: &[u8], replies: usize, last: bool) -> Sent {
    let lost = |why: String| {
        if last {
            Sent::Unknown(why)
        } else {
            Sent::NotThere(why)
        }
    };
    if let Err(e) = conn.write_all(req).and_then(|()| conn.flush()) {
        return lost(format!("sending failed: {e}"));
    }
    let mut answer = String::new();
    for _ in 0..replies {
        answer = match read_line(conn) {
            Ok(l) => l,
            Err(ReadError::SpeaksTls) => {
                return Sent::NotThere(
                    "it answers only TLS on that port: start this node with --tls-cluster yes"
                        .into(),
                )
            }
            Err(ReadError::Other(e)) => return lost(format!("no answer: {e}")),
        };
    }
    if answer == "+OK" {
        return Sent::Imported;
    }
    let shown = answer.trim_start_matches('-').to_string();
    Sent::Refused(format!("the destination refused the import: {shown}"))
}

/// TCP to the destination with the time limits, and TLS on it when asked (its handshake
/// done here: a failure leaves nothing sent).
fn connect(link: &Link, patience: Duration) -> Result<Box<dyn Stream>, String> {
    let tcp = connect_tcp(&link.addr, patience)?;
    match &link.tls {
        None => Ok(Box::new(tcp)),
        Some(cfg) => Ok(Box::new(crate::tls::peer::connect_blocking(
            tcp,
            &link.host,
            cfg.clone(),
        )?)),
    }
}

/// `patience` is how long a reply may take.
fn connect_tcp(addr: &str, patience: Duration) -> Result<TcpStream, String> {
    let sock = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve: {e}"))?
        .next()
        .ok_or("cannot resolve")?;
    let conn = TcpStream::connect_timeout(&sock, LINK_TIMEOUT)
        .map_err(|e| format!("cannot connect: {e}"))?;
    conn.set_read_timeout(Some(patience))
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

/// The destination's half of an export sent in parts: the parts are kept in memory, per
/// sale, until `END` hands the whole export to the import (which checks and logs it), so
/// nothing of an unfinished transfer is ever in the log or the engine. Bounded: at most
/// [`MAX_IMPORTS`] transfers at once and [`MAX_STAGED`] bytes declared by them in all; a
/// transfer idle for [`IDLE`] (its source gone without `END` or `ABORT`) is discarded by
/// the next `BEGIN`. A `BEGIN` for a sale already staged starts it over: a re-run of a
/// move sends the export again from its first byte.
pub(crate) mod staging {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use stockgate_core::wal::handover::MAX_EXPORT;

    /// Transfers staged at once on this node.
    pub const MAX_IMPORTS: usize = 4;
    /// Bytes all staged transfers may declare together.
    pub const MAX_STAGED: usize = 2 * MAX_EXPORT;
    /// How long a transfer may wait for its next part.
    pub const IDLE: Duration = Duration::from_secs(60);

    /// Why a part was refused; the transfer must start over with `BEGIN`.
    #[derive(Debug, thiserror::Error)]
    pub enum StagingError {
        #[error("SALE.IMPORT: a byte count or offset must be a whole number")]
        NotANumber,
        #[error("SALE.IMPORT: the export of {sku} is {bytes} bytes, more than a move carries ({MAX_EXPORT})")]
        TooLarge { sku: String, bytes: usize },
        #[error("SALE.IMPORT: {MAX_IMPORTS} imports are being received already; retry when one has finished")]
        TooMany,
        #[error("SALE.IMPORT: {bytes} more bytes would exceed the {MAX_STAGED} bytes this node stages; retry when an import has finished")]
        Full { bytes: usize },
        #[error("SALE.IMPORT: no import of {0} is being received (BEGIN first, or it was idle too long)")]
        NotBegun(String),
        #[error("SALE.IMPORT: part of {sku} at byte {at}, expected at byte {want} (of {total})")]
        OutOfOrder {
            sku: String,
            at: usize,
            want: usize,
            total: usize,
        },
        #[error("SALE.IMPORT: the export of {sku} is incomplete: {have} of {total} bytes")]
        Incomplete {
            sku: String,
            have: usize,
            total: usize,
        },
    }

    struct Staged {
        total: usize,
        bytes: Vec<u8>,
        touched: Instant,
    }

    /// By (engine, sku): the engine's address keeps two servers of one process (tests)
    /// apart.
    type Key = (usize, String);

    static STAGED: Mutex<Option<HashMap<Key, Staged>>> = Mutex::new(None);

    fn with<R>(f: impl FnOnce(&mut HashMap<Key, Staged>) -> R) -> R {
        // A panic while holding the lock leaves plain data behind: keep using it.
        let mut guard = STAGED.lock().unwrap_or_else(|p| p.into_inner());
        f(guard.get_or_insert_with(HashMap::new))
    }

    /// Starts (or starts over) receiving `total` bytes of `sku`'s export.
    pub fn begin(engine: usize, sku: &str, total: usize) -> Result<(), StagingError> {
        if total > MAX_EXPORT {
            return Err(StagingError::TooLarge {
                sku: sku.into(),
                bytes: total,
            });
        }
        with(|m| {
            m.retain(|_, s| s.touched.elapsed() < IDLE);
            m.remove(&(engine, sku.to_string()));
            if m.len() >= MAX_IMPORTS {
                return Err(StagingError::TooMany);
            }
            let declared: usize = m.values().map(|s| s.total).sum();
            if declared + total > MAX_STAGED {
                return Err(StagingError::Full { bytes: total });
            }
            let staged = Staged {
                total,
                bytes: Vec::new(),
                touched: Instant::now(),
            };
            m.insert((engine, sku.to_string()), staged);
            Ok(())
        })
    }

    /// Appends a part; it must start where the staged bytes end and stay within the
    /// declared size. A refused part discards the transfer.
    pub fn part(engine: usize, sku: &str, at: usize, chunk: &[u8]) -> Result<(), StagingError> {
        with(|m| {
            let key = (engine, sku.to_string());
            let s = m
                .get_mut(&key)
                .ok_or_else(|| StagingError::NotBegun(sku.into()))?;
            let want = s.bytes.len();
            if at != want || want + chunk.len() > s.total {
                let total = s.total;
                m.remove(&key);
                return Err(StagingError::OutOfOrder {
                    sku: sku.into(),
                    at,
                    want,
                    total,
                });
            }
            if s.bytes.is_empty() {
                // Reserved now rather than at BEGIN: a BEGIN alone costs no memory.
                s.bytes.reserve_exact(s.total);
            }
            s.bytes.extend_from_slice(chunk);
            s.touched = Instant::now();
            Ok(())
        })
    }

    /// Takes the whole export out of staging (complete or not: either way the transfer
    /// is over).
    pub fn end(engine: usize, sku: &str) -> Result<Vec<u8>, StagingError> {
        let s = with(|m| m.remove(&(engine, sku.to_string())))
            .ok_or_else(|| StagingError::NotBegun(sku.into()))?;
        if s.bytes.len() != s.total {
            return Err(StagingError::Incomplete {
                sku: sku.into(),
                have: s.bytes.len(),
                total: s.total,
            });
        }
        Ok(s.bytes)
    }

    /// Discards a transfer (the source gave up); nothing staged is nothing to do.
    pub fn abort(engine: usize, sku: &str) {
        with(|m| m.remove(&(engine, sku.to_string())));
    }
}

#[cfg(test)]
mod staging_tests {
    use super::staging::*;
    use stockgate_core::wal::handover::MAX_EXPORT;

    #[test]
    fn staged_parts_in_order_make_the_export_and_anything_else_starts_over() {
        let e = 0xdead_0001;
        begin(e, "S", 6).unwrap();
        part(e, "S", 0, b"abc").unwrap();
        assert!(matches!(
            part(e, "S", 5, b"x"),
            Err(StagingError::OutOfOrder { .. })
        ));
        // The refused part discarded the transfer.
        assert!(matches!(
            part(e, "S", 3, b"def"),
            Err(StagingError::NotBegun(_))
        ));
        begin(e, "S", 6).unwrap();
        part(e, "S", 0, b"abc").unwrap();
        assert!(matches!(end(e, "S"), Err(StagingError::Incomplete { .. })));
        begin(e, "S", 6).unwrap();
        part(e, "S", 0, b"abc").unwrap();
        part(e, "S", 3, b"def").unwrap();
        assert_eq!(end(e, "S").unwrap(), b"abcdef");
        assert!(matches!(end(e, "S"), Err(StagingError::NotBegun(_))));
        assert!(matches!(
            begin(e, "S", MAX_EXPORT + 1),
            Err(StagingError::TooLarge { .. })
        ));
        staging_is_bounded_in_transfers();
    }

    // One test: a second running at once would take transfers from the bound.
    fn staging_is_bounded_in_transfers() {
        let e = 0xdead_0002;
        for i in 0..MAX_IMPORTS {
            if begin(e, &format!("T{i}"), 1).is_err() {
                // Another test of this process holds a slot: the bound is what matters.
                break;
            }
        }
        assert!(matches!(begin(e, "T-last", 1), Err(StagingError::TooMany)));
        for i in 0..MAX_IMPORTS {
            abort(e, &format!("T{i}"));
        }
    }
}
