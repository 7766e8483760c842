//! Commands: each parsed from its arguments into a typed struct and applied by one
//! function (one file per command or family). The dispatcher here checks arity, auth and
//! role in one place before any command runs.

pub mod acl;
pub mod args;
pub mod backup;
pub mod cluster;
pub mod command_table;
pub mod config;
pub mod conn;
pub mod feed_reply;
pub mod group;
pub mod hold;
pub mod introspect;
pub mod multi;
pub mod pubsub;
pub mod replication;
pub mod reserve;
pub mod room;
pub mod sale;
pub mod secret;
pub mod shutdown;
pub mod slot_move;
pub mod stream;
pub mod timed;

use crate::engine::{Engine, Lsn};
use crate::protocol::Reply;
use crate::session::{ConnState, Shared};
use crate::takeover::Takeover;

pub use timed::dispatch_timed;

/// Everything a command may touch.
pub struct Ctx<'a> {
    /// The reservation engine: sales, holds, stock.
    pub engine: &'a Engine,
    /// This connection's state (user, protocol, transaction, name).
    pub conn: &'a mut ConnState,
    /// What every connection shares: settings, users, stats, replication.
    pub shared: &'a Shared,
}

/// What running a command produced: the reply, the log position that must be durable
/// before the reply is sent, and whether to close the connection after it.
pub struct Outcome {
    /// The answer.
    pub reply: Reply,
    /// The log position to wait for before sending it; 0 for nothing.
    pub lsn: Lsn,
    /// Close the connection once the reply is sent (`QUIT`, a fatal refusal).
    pub close: bool,
    /// A blocking command (`XREAD BLOCK`) that found nothing yet: the connection sends
    /// what it has answered so far, then awaits this for the reply. Where a connection
    /// cannot wait (inside EXEC), `reply` is the non-blocking answer, as Redis gives.
    pub wait: Option<Deferred>,
    /// The connection stops being a command connection once this reply is sent: the
    /// stream goes to this function (`SUBSCRIBE`: a
    /// subscriber). If it hands the stream back, the connection takes commands again.
    pub takeover: Option<Takeover>,
}

/// The rest of a blocking command, run by the connection. Bounded in time by the command.
pub type Deferred = std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send>>;

impl From<Reply> for Outcome {
    fn from(reply: Reply) -> Self {
        Outcome {
            reply,
            lsn: 0,
            close: false,
            wait: None,
            takeover: None,
        }
    }
}

impl Outcome {
    /// A blocking command that found nothing yet: `now` is its answer where the
    /// connection cannot wait (inside EXEC), `wait` the rest of it (see `Outcome::wait`).
    pub fn deferred(now: Reply, wait: Deferred) -> Self {
        Outcome {
            wait: Some(wait),
            ..Outcome::from(now)
        }
    }

    /// The connection becomes something else once the replies so far are sent (see
    /// `Outcome::takeover`).
    pub fn takeover(t: Takeover) -> Self {
        Outcome {
            takeover: Some(t),
            ..Outcome::from(Reply::Nil)
        }
    }

    /// A reply that may leave only once `lsn` is durable.
    pub fn logged(reply: Reply, lsn: Lsn) -> Self {
        Outcome {
            reply,
            lsn,
            close: false,
            wait: None,
            takeover: None,
        }
    }
}

/// What `dispatch` answers for a command in the table that no arm runs: a wiring bug,
/// which `tests::every_table_entry_is_dispatched` catches before it ships.
const NOT_IMPLEMENTED: &str = "ERR command not implemented";

/// Runs one command. Never panics on client input; every refusal is a reply.
pub fn dispatch(ctx: &mut Ctx<'_>, argv: &[&[u8]]) -> Outcome {
    let spec = match admit(ctx, argv) {
        Ok(spec) => spec,
        // Inside MULTI a refusal also dooms the transaction (EXEC answers EXECABORT).
        Err(refusal) => return multi::refused(ctx, refusal),
    };
    // Cluster mode: a key another group owns is redirected before anything runs (and
    // before it is queued: inside MULTI the refusal dooms the transaction, as in Redis).
    if let Some(refusal) = cluster::check(ctx, spec, argv) {
        return multi::refused(ctx, refusal);
    }
    if ctx.conn.in_multi() && !multi::runs_at_once(spec) {
        return multi::queue(ctx, spec, argv);
    }
    // CLIENT LIST's `cmd`: one relaxed store into this connection's own record.
    ctx.conn.seen.last_cmd.store(
        command_table::index_of(spec) + 1,
        std::sync::atomic::Ordering::Relaxed,
    );
    if let Some(refusal) = replication_refusal(ctx, spec) {
        return Reply::err(refusal).into();
    }
    let out = run(ctx, spec, &argv[1..]).unwrap_or_else(Outcome::from);
    finish(ctx, spec, out)
}

/// On a Raft group member, the refusal a command gets before anything changes: only the
/// group's writable leader takes writes (`-READONLY` on a follower or a leader without
/// a majority, `-LOADING` while it catches up). What each role may read: `raft::node`.
fn replication_refusal(ctx: &Ctx<'_>, spec: &command_table::Spec) -> Option<&'static str> {
    let repl = ctx.shared.repl.get()?;
    if spec.flags.contains(&"write") {
        repl.write_refusal()
    } else if spec.group == "stockgate" {
        repl.read_refusal(ctx.conn.stale_reads)
    } else if spec.group == "stream" {
        repl.feed_refusal()
    } else {
        None
    }
}

/// What follows every command: CLIENT LIST's view refreshed, a stock reply held until
/// what it observed is durable.
fn finish(ctx: &mut Ctx<'_>, spec: &command_table::Spec, mut out: Outcome) -> Outcome {
    if matches!(spec.name, "auth" | "hello" | "reset") {
        // What CLIENT LIST shows of this connection may have changed.
        ctx.conn.show();
    }
    if spec.group == "stockgate" {
        // Every reply of a stock command reports some state (an error, a no-op, a
        // read): it leaves only once every record logged before it was computed is
        // durable, so no reply tells of a state that a crash could still erase. Its own
        // LSN is the usual maximum; this covers what it merely observed.
        out.lsn = out.lsn.max(ctx.engine.last_lsn());
    }
    out
}

/// The command table's names to their handlers: one arm per command (a refusal of the
/// arguments is the error reply).
fn run(ctx: &mut Ctx<'_>, spec: &command_table::Spec, rest: &[&[u8]]) -> Result<Outcome, Reply> {
    match spec.name {
        "reserve" => reserve::Reserve::parse(rest).map(|c| c.apply(ctx)),
        "stock" => hold::Stock::parse(rest).map(|c| c.apply(ctx)),
        "reservation" => hold::Reservation::parse(rest).map(|c| c.apply(ctx)),
        "extend" => hold::Extend::parse(rest).map(|c| c.apply(ctx)),
        "commit" => hold::Commit::parse(rest).map(|c| c.apply(ctx)),
        "release" => hold::Release::parse(rest).map(|c| c.apply(ctx)),
        "expired" => hold::Expired::parse(rest).map(|c| c.apply(ctx)),
        "sale.create" => sale::Create::parse(rest).map(|c| c.apply(ctx)),
        "sale.info" => sale::Info::parse(rest).map(|c| c.apply(ctx)),
        "sale.list" => Ok(sale::list(ctx)),
        "sale.pause" => sale::PauseResume::parse(rest, true).map(|c| c.apply(ctx)),
        "sale.resume" => sale::PauseResume::parse(rest, false).map(|c| c.apply(ctx)),
        "sale.adjust" => sale::Adjust::parse(rest).map(|c| c.apply(ctx)),
        "sale.fence" => sale::Fence::parse(rest).map(|c| c.apply(ctx)),
        "sale.restore" => sale::Restore::parse(rest).map(|c| c.apply(ctx)),
        "sale.rebuild" => sale::Rebuild::parse(rest).map(|c| c.apply(ctx)),
        "room.open" => room::Open::parse(rest).map(|c| c.apply(ctx)),
        "room.join" => room::Join::parse(rest).map(|c| c.apply(ctx)),
        "room.status" => room::StatusCmd::parse(rest).map(|c| c.apply(ctx)),
        "room.leave" => room::Leave::parse(rest).map(|c| c.apply(ctx)),
        "room.info" => room::Info::parse(rest).map(|c| c.apply(ctx)),
        "sale.import" => Ok(slot_move::import(ctx, rest)),
        "sale.migrate" => Ok(slot_move::migrate(ctx, rest)),
        "save" => Ok(introspect::save(ctx)),
        "backup" => Ok(backup::backup(ctx, rest)),
        "auth" => conn::Auth::parse(rest).map(|c| c.apply(ctx)),
        "hello" => conn::Hello::parse(rest).map(|c| c.apply(ctx)),
        "quit" => Ok(Outcome {
            reply: Reply::ok(),
            lsn: 0,
            close: true,
            wait: None,
            takeover: None,
        }),
        "reset" => Ok(conn::reset(ctx)),
        "shutdown" => shutdown::Shutdown::parse(rest).map(|c| c.apply(ctx)),
        "ping" => Ok(conn::ping(ctx, rest)),
        "echo" => Ok(Reply::Bulk(rest[0].to_vec()).into()),
        "client" => Ok(conn::client(ctx, rest)),
        "select" => Ok(conn::select(rest)),
        "command" => Ok(introspect::command(rest)),
        "info" => Ok(introspect::info(ctx, rest)),
        "config" => Ok(config::config(ctx, rest)),
        "acl" => acl::Acl::parse(rest).map(|c| c.apply(ctx)),
        "secret.reload" => Ok(secret::reload(ctx).into()),
        "latency" => Ok(introspect::latency(ctx, rest)),
        "slowlog" => Ok(introspect::slowlog(ctx, rest)),
        "time" => Ok(introspect::time()),
        "dbsize" => Ok(Reply::Int(ctx.engine.reservation_count() as i64).into()),
        "xread" => stream::XRead::parse(rest).map(|c| c.apply(ctx)),
        "xrange" => stream::XRange::parse(rest, false).map(|c| c.apply(ctx)),
        "xrevrange" => stream::XRange::parse(rest, true).map(|c| c.apply(ctx)),
        "xlen" => stream::XLen::parse(rest).map(|c| c.apply(ctx)),
        "xinfo" => stream::XInfo::parse(rest).map(|c| c.apply(ctx)),
        "xgroup" => group::XGroup::parse(rest).map(|c| c.apply(ctx)),
        "xreadgroup" => group::XReadGroup::parse(rest).map(|c| c.apply(ctx)),
        "xack" => group::XAck::parse(rest).map(|c| c.apply(ctx)),
        "xpending" => group::XPending::parse(rest).map(|c| c.apply(ctx)),
        "xclaim" => group::XClaim::parse(rest).map(|c| c.apply(ctx)),
        "xautoclaim" => group::XAutoClaim::parse(rest).map(|c| c.apply(ctx)),
        "replicaof" | "slaveof" | "replconf" | "psync" | "sync" => {
            Ok(replication::not_served(spec.name))
        }
        "role" => Ok(replication::role(ctx)),
        "wait" => replication::Wait::parse(rest).map(|c| c.apply(ctx)),
        "publish" => Ok(pubsub::publish(ctx, rest)),
        "subscribe" => Ok(pubsub::subscribe(ctx, rest, false)),
        "psubscribe" => Ok(pubsub::subscribe(ctx, rest, true)),
        "unsubscribe" | "punsubscribe" => Ok(pubsub::unsubscribe(rest, spec.name)),
        "sentinel" => Ok(replication::sentinel(ctx, rest)),
        "raft.members" | "raft.add" | "raft.remove" | "raft.readmit" => {
            Ok(replication::raft(ctx, spec.name, rest))
        }
        "cluster" => Ok(cluster::cluster(ctx, rest)),
        "readonly" | "readwrite" | "asking" => Ok(cluster::connection_flag(ctx, spec.name)),
        "multi" => Ok(multi::multi(ctx)),
        "exec" => Ok(multi::exec(ctx)),
        "discard" => Ok(multi::discard(ctx)),
        "watch" => Ok(multi::watch()),
        "unwatch" => Ok(multi::unwatch()),
        _ => Err(Reply::err(NOT_IMPLEMENTED)),
    }
}

/// The command-table entry for a name in any case. Lowercased into a stack buffer: it
/// runs for every command, and no command name is longer than the buffer (a longer one
/// is unknown anyway).
fn lookup_name(name: &[u8]) -> Option<&'static command_table::Spec> {
    let mut buf = [0u8; 32];
    let lower = buf.get_mut(..name.len())?;
    lower.copy_from_slice(name);
    lower.make_ascii_lowercase();
    command_table::lookup(std::str::from_utf8(lower).ok()?)
}

/// The checks every command gets before it runs or is queued: known name, arity, auth and
/// role. One place, so a queued command is refused exactly as a direct one would be.
fn admit(ctx: &mut Ctx<'_>, argv: &[&[u8]]) -> Result<&'static command_table::Spec, Reply> {
    let Some(name) = argv.first() else {
        return Err(Reply::err("ERR empty command"));
    };
    let Some(spec) = lookup_name(name) else {
        let shown: String = String::from_utf8_lossy(name).chars().take(128).collect();
        return Err(Reply::err(format!("ERR unknown command '{shown}'")));
    };
    if !command_table::arity_ok(spec, argv.len()) {
        return Err(Reply::arity(spec.name));
    }
    if let Some(users) = ctx.shared.users.as_ref() {
        match ctx.conn.role {
            None if !spec.no_auth => {
                return Err(Reply::err("NOAUTH Authentication required."));
            }
            Some(role) if spec.roles & role.bit() == 0 => {
                ctx.shared
                    .stats
                    .noperm
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let user = ctx.conn.user_name.clone().unwrap_or_default();
                let _ = users;
                return Err(Reply::err(format!(
                    "NOPERM User {user} has no permissions to run the '{}' command",
                    spec.name
                )));
            }
            _ => {}
        }
    }
    Ok(spec)
}

/// What the parsers' tests beside each command share.
#[cfg(test)]
pub(crate) mod parse_tests {
    use crate::protocol::Reply;

    /// A command's arguments (after its name) as the dispatcher hands them over.
    pub fn argv<'a>(words: &[&'a str]) -> Vec<&'a [u8]> {
        words.iter().map(|w| w.as_bytes()).collect()
    }

    /// The error text a refused parse answers; panics if it parsed.
    pub fn error_text<T>(r: Result<T, Reply>) -> String {
        match r {
            Err(Reply::Error(e)) => e,
            Err(other) => panic!("not an error reply: {other:?}"),
            Ok(_) => panic!("accepted"),
        }
    }

    /// The syntax error of `cmd`, with its usage, as `args::syntax_error` words it.
    pub fn syntax(cmd: &str) -> String {
        error_text::<()>(Err(crate::cmd::args::syntax_error(cmd)))
    }
    pub const BAD_ID: &str = "ERR Invalid stream ID specified as stream command argument";
    pub const UNKNOWN_STREAM: &str =
        "ERR unknown stream 'orders': the streams are 'stockgate:events' and '{<sku>}:events'";

    pub fn arity(cmd: &str) -> String {
        format!("ERR wrong number of arguments for '{cmd}' command")
    }
}

/// The two registrations of a command (its table entry, its arm in `dispatch`) kept in step.
#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::command_table::{self, COMMANDS};
    use super::{dispatch, Ctx, NOT_IMPLEMENTED};
    use crate::engine::{Engine, EngineConfig, Keyring, ManualClock, NullSink, ReservationKey};
    use crate::protocol::Reply;
    use crate::session::{ConnState, NoDurability, Role, ServerConfig, Shared};

    /// The fewest arguments (after the name) the entry's arity admits.
    fn min_args(spec: &command_table::Spec) -> usize {
        (spec.arity.unsigned_abs() as usize).saturating_sub(1)
    }

    /// Sends every table entry through `dispatch`, upper-cased as clients send it, with the
    /// fewest arguments its arity admits. Placeholder arguments make most commands refuse
    /// their syntax, which still proves an arm ran; the commands that would act outside
    /// the process (SHUTDOWN, BACKUP, SUBSCRIBE) hand back a takeover or a deferred reply
    /// that is never run here. Each command gets a fresh connection, so MULTI or HELLO
    /// leave nothing behind for the next.
    #[test]
    fn every_table_entry_is_dispatched() {
        let engine = Engine::new(
            EngineConfig::default(),
            Arc::new(ManualClock::new(1_700_000_000_000)),
            Arc::new(NullSink),
            Keyring::parse(&format!("k1 {}\n", "ab".repeat(32))).unwrap(),
            ReservationKey::from_bytes(&[9u8; 32]),
        );
        let shared = Shared::new(ServerConfig::default(), None, Arc::new(NoDurability));
        let mut missing = Vec::new();
        for spec in COMMANDS {
            let name = spec.name.to_ascii_uppercase();
            let mut argv: Vec<&[u8]> = vec![name.as_bytes()];
            argv.resize(1 + min_args(spec), b"x");
            let mut conn = ConnState::new(1, Some(Role::Admin), "a".into(), "b".into());
            let mut ctx = Ctx {
                engine: &engine,
                conn: &mut conn,
                shared: &shared,
            };
            let reply = dispatch(&mut ctx, &argv).reply;
            // Refused before the match (unknown name, arity): the arm was never reached.
            let unreached = reply == Reply::arity(spec.name)
                || matches!(&reply, Reply::Error(e) if e.starts_with("ERR unknown command"));
            if reply == Reply::err(NOT_IMPLEMENTED) || unreached {
                missing.push((spec.name, reply));
            }
        }
        assert!(COMMANDS.len() > 50, "the table walked is the whole table");
        assert!(
            missing.is_empty(),
            "table entries that dispatch does not run: {missing:?}"
        );
    }
}
