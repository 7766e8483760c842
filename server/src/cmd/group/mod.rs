//! Consumer-group commands of the order feed (`XGROUP`, `XREADGROUP`, `XACK`, `XPENDING`,
//! `XCLAIM`, `XAUTOCLAIM`, `XINFO GROUPS|CONSUMERS`), in Redis 7's reply shapes and
//! error texts (`t_stream.c`), so redis-py's `xreadgroup`, `xack`, `xpending`,
//! `xpending_range`, `xclaim`, `xautoclaim`, `xinfo_groups` and `xinfo_consumers` parse
//! them unmodified. One file per command (XCLAIM and XAUTOCLAIM share theirs), each a
//! typed struct parsed in one place and applied in one place; what they share is here.
//!
//! Every change is logged by `feed::groups` under the group's lock; the reply waits for
//! that record (and, as every reply that reports state, for everything logged before it
//! was computed) to be durable.

mod ack;
mod claim;
mod info;
mod pending;
mod read;
mod xgroup;

pub use ack::XAck;
pub use claim::{XAutoClaim, XClaim};
pub use info::{xinfo_consumers, xinfo_groups, xinfo_help, xinfo_sub_err};
pub use pending::XPending;
pub use read::XReadGroup;
pub use xgroup::XGroup;

use super::feed_reply::feed_error;
use super::Outcome;
use crate::engine::Lsn;
use crate::feed::groups::{Group, GroupRecord, GroupRef};
use crate::feed::{id, Feed, FeedError, Stream};
use crate::protocol::Reply;

fn id_reply(lsn: Lsn) -> Reply {
    Reply::Bulk(format!("{lsn}-0").into_bytes())
}

/// A group reply reports state: it leaves once its own record and everything logged
/// before it was computed are durable (the rule of `cmd::dispatch` for stock commands).
fn done(feed: &Feed, reply: Reply, lsn: Lsn) -> Outcome {
    Outcome::logged(reply, lsn.max(feed.last_lsn()))
}

/// A client's bytes shown in an error: at most 128 characters.
fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).chars().take(128).collect()
}

fn subcommand_error(sub: &str, cmd: &str) -> Reply {
    Reply::err(format!(
        "ERR unknown subcommand or wrong number of arguments for '{}'. Try {cmd} HELP.",
        sub.chars().take(128).collect::<String>()
    ))
}

fn help(lines: &'static [&'static str]) -> Reply {
    Reply::Array(lines.iter().map(|l| Reply::Simple(l)).collect())
}

/// The group, or the given NOGROUP error.
fn lookup(
    feed: &Feed,
    stream: &Stream,
    group: &[u8],
    err: fn(String, String) -> FeedError,
) -> Result<GroupRef, Reply> {
    std::str::from_utf8(group)
        .ok()
        .and_then(|g| feed.groups.get(stream, g))
        .ok_or_else(|| feed_error(err(stream.name(), lossy(group))))
}

fn no_group(stream: String, group: String) -> FeedError {
    FeedError::NoGroup { stream, group }
}

fn no_group_for_key(stream: String, group: String) -> FeedError {
    FeedError::NoGroupForKey { stream, group }
}

fn gone() -> Reply {
    feed_error(FeedError::GroupGone)
}

/// The group id of XGROUP CREATE/SETID as "last delivered": `$` is the log's end now,
/// every record made before the command included (`Feed::group_end`).
fn group_last(feed: &Feed, b: &[u8]) -> Result<Lsn, Reply> {
    match id::read_after(b).map_err(feed_error)? {
        Some(first) => Ok(first - 1),
        None => Ok(feed.group_end()),
    }
}

fn run(r: Result<Outcome, Reply>) -> Outcome {
    r.unwrap_or_else(Outcome::from)
}

/// A negative min-idle-time counts as 0, as in Redis.
fn min_idle_arg(b: &[u8]) -> Result<u64, Reply> {
    Ok(super::args::i64_in(b, "min-idle-time", i64::MIN, i64::MAX)?.max(0) as u64)
}

fn too_many_consumers(g: &Group, max: usize) -> FeedError {
    FeedError::GroupLimit(format!(
        "too many consumers in group '{}' (max {max})",
        g.name
    ))
}

/// Makes sure the consumer exists (logged once, when it is new) and marks it seen.
fn ensure_consumer(feed: &Feed, g: &mut Group, consumer: &str, now: u64) -> Result<Lsn, FeedError> {
    if g.consumers.contains_key(consumer) {
        g.consumer_mut(consumer, now);
        return Ok(0);
    }
    let max = feed.groups.limits.max_consumers;
    if g.consumers.len() >= max {
        return Err(too_many_consumers(g, max));
    }
    let rec = GroupRecord::Consumer {
        stream: g.stream.name(),
        group: g.name.clone(),
        consumer: consumer.to_owned(),
        at_ms: now,
        delete: false,
    };
    let lsn = feed.groups.change(g, rec);
    debug_assert!(g.consumers.contains_key(consumer));
    Ok(lsn)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::{EventRef, EventSink};
    use crate::feed::FeedLimits;
    use crate::raft::speculation::Speculation;
    use crate::wal::{Wal, WalOptions};

    /// On a Raft leader `$` is after the records in flight, which its WAL (and so its
    /// feed) does not hold yet: a follower may let a snapshot cover them before it
    /// applies the group's creation.
    #[test]
    fn group_dollar_is_after_every_record_handed_out() {
        let dir = std::env::temp_dir().join(format!("sg-group-last-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (wal, _) = Wal::open_inline(&dir, WalOptions::default()).unwrap();
        let spec = Arc::new(Speculation::new(7, 0));
        spec.open(1, 0);
        for _ in 0..3 {
            spec.record(&EventRef::Opaque {
                kind: crate::wal::record::K_SLOT_SET,
                body: b"x",
            });
        }
        let clock = Arc::new(crate::engine::ManualClock::new(1_000));
        let feed = Feed::with_group_sink(wal.clone(), spec.clone(), FeedLimits::default(), clock);
        assert_eq!(feed.readable_lsn(), 0);
        assert_eq!(group_last(&feed, b"$").ok(), Some(3));
        assert_eq!(group_last(&feed, b"2-0").ok(), Some(2));
        let _ = wal.flush_and_close();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Delivery and idle times are the engine's clock's, not the wall's: a consumer's
    /// entries become claimable when that clock has moved past the idle time (and in the
    /// simulation, whose clock runs apart from the wall, only then).
    #[test]
    fn idle_times_follow_the_engine_clock() {
        use crate::engine::{Engine, EngineConfig, Keyring, ManualClock, ReservationKey};
        use crate::session::{ConnState, NoDurability, Role, ServerConfig, Shared, SharedParts};
        let dir = std::env::temp_dir().join(format!("sg-group-clock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (wal, _) = Wal::open_inline(&dir, WalOptions::default()).unwrap();
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let keys = Keyring::parse(&format!("k1 {}\n", "ab".repeat(32))).unwrap();
        let rkey = ReservationKey::from_bytes(&[7u8; 32]);
        let sink = wal.clone();
        let engine = Arc::new(Engine::new(
            EngineConfig::default(),
            clock.clone(),
            sink,
            keys,
            rkey,
        ));
        let feed = Arc::new(Feed::new(
            wal.clone(),
            FeedLimits::default(),
            engine.clock(),
        ));
        let parts = SharedParts {
            engine: Some(engine.clone()),
            feed: Some(feed),
            ..SharedParts::default()
        };
        let shared =
            Shared::with_parts(ServerConfig::default(), None, Arc::new(NoDurability), parts);
        let mut conn = ConnState::new(
            1,
            Some(Role::Admin),
            "127.0.0.1:1".into(),
            "127.0.0.1:2".into(),
        );
        let mut run = |args: &[&str]| {
            let argv: Vec<bytes::Bytes> = args
                .iter()
                .map(|a| bytes::Bytes::from(a.to_string()))
                .collect();
            let mut ctx = crate::cmd::Ctx {
                engine: &engine,
                conn: &mut conn,
                shared: &shared,
            };
            let views = crate::cmd::multi::views(&argv);
            crate::cmd::dispatch_timed(&mut ctx, &views).reply
        };
        run(&["XGROUP", "CREATE", "stockgate:events", "g", "$"]);
        run(&["SALE.CREATE", "S1", "3"]);
        wal.sync_blocking().unwrap();
        let read = run(&[
            "XREADGROUP",
            "GROUP",
            "g",
            "a",
            "STREAMS",
            "stockgate:events",
            ">",
        ]);
        assert!(matches!(read, Reply::Array(_)), "{read:?}");
        let claim = [
            "XAUTOCLAIM",
            "stockgate:events",
            "g",
            "b",
            "60000",
            "0",
            "JUSTID",
        ];
        let claimed = |r: &Reply| match r {
            Reply::Array(parts) => {
                matches!(parts.get(1), Some(Reply::Array(ids)) if !ids.is_empty())
            }
            _ => false,
        };
        let early = run(&claim);
        assert!(
            !claimed(&early),
            "claimed before the clock moved: {early:?}"
        );
        clock.advance(61_000);
        let late = run(&claim);
        assert!(
            claimed(&late),
            "not claimed 61 s later by the engine's clock: {late:?}"
        );
        let _ = wal.flush_and_close();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
