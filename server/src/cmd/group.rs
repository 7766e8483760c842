//! Consumer-group commands of the order feed (`XGROUP`, `XREADGROUP`, `XACK`, `XPENDING`,
//! `XCLAIM`, `XAUTOCLAIM`, `XINFO GROUPS|CONSUMERS`), in Redis 7's reply shapes and
//! error texts (`t_stream.c`), so redis-py's `xreadgroup`, `xack`, `xpending`,
//! `xpending_range`, `xclaim`, `xautoclaim`, `xinfo_groups` and `xinfo_consumers` parse
//! them unmodified.
//!
//! Every change is logged by `feed::groups` under the group's lock; the reply waits for
//! that record (and, as every reply that reports state, for everything logged before it
//! was computed) to be durable.

use super::args::{i64_in, Args};
use super::feed_reply::{entry_reply, feed, feed_error, parse_count};
use super::{Ctx, Outcome};
use crate::engine::Lsn;
use crate::feed::groups::{now_ms, Group, GroupRecord, GroupRef};
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

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).chars().take(128).collect()
}

fn sub_err(sub: &str, cmd: &str) -> Reply {
    Reply::err(format!(
        "ERR unknown subcommand or wrong number of arguments for '{}'. Try {cmd} HELP.",
        sub.chars().take(128).collect::<String>()
    ))
}

fn help(lines: &'static [&'static str]) -> Reply {
    Reply::Array(lines.iter().map(|l| Reply::Simple(l)).collect())
}

const HELP_XGROUP: &[&str] = &[
    "XGROUP <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CREATE <key> <groupname> <id|$> [option]",
    "    Create a new consumer group. Options are:",
    "    * MKSTREAM",
    "      Accepted and ignored: the feed's streams always exist.",
    "CREATECONSUMER <key> <groupname> <consumer>",
    "    Create a new consumer in the specified group.",
    "DELCONSUMER <key> <groupname> <consumer>",
    "    Remove the specified consumer.",
    "DESTROY <key> <groupname>",
    "    Remove the specified group.",
    "SETID <key> <groupname> <id|$>",
    "    Set the current group ID.",
    "HELP",
    "    Print this help.",
];

const HELP_XINFO: &[&str] = &[
    "XINFO <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CONSUMERS <key> <groupname>",
    "    Show consumers of <groupname>.",
    "GROUPS <key>",
    "    Show the stream consumer groups.",
    "STREAM <key>",
    "    Show information about the stream.",
    "HELP",
    "    Print this help.",
];

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

fn gone() -> Reply {
    feed_error(FeedError::GroupGone)
}

/// The group id of XGROUP CREATE/SETID as "last delivered": `$` is the log's end now.
fn group_last(feed: &Feed, b: &[u8]) -> Result<Lsn, Reply> {
    if b == b"$" {
        return Ok(feed.readable_lsn());
    }
    match id::read_after(b).map_err(feed_error)? {
        Some(first) => Ok(first - 1),
        None => Ok(feed.readable_lsn()),
    }
}

fn run(r: Result<Outcome, Reply>) -> Outcome {
    r.unwrap_or_else(Outcome::from)
}

/// `XGROUP CREATE|SETID|DESTROY|CREATECONSUMER|DELCONSUMER|HELP ...`
pub fn xgroup(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    run(xgroup_inner(ctx, args))
}

fn xgroup_inner(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Result<Outcome, Reply> {
    let mut a = Args::new("xgroup", args);
    let sub = a.next_keyword()?;
    if sub == "HELP" && args.len() == 1 {
        return Ok(help(HELP_XGROUP).into());
    }
    let n = args.len();
    let shape_ok = match sub.as_str() {
        "CREATE" => (4..=7).contains(&n),
        "SETID" => n == 4 || n == 6,
        "DESTROY" => n == 3,
        "CREATECONSUMER" | "DELCONSUMER" => n == 4,
        _ => false,
    };
    if !shape_ok {
        return Err(sub_err(&sub, "XGROUP"));
    }
    let feed = feed(ctx)?;
    let stream = Stream::parse(a.next_bytes()?).map_err(feed_error)?;
    let gname = a.next_bytes()?;
    match sub.as_str() {
        "CREATE" => {
            let idb = a.next_bytes()?;
            while a.remaining() > 0 {
                match a.next_keyword()?.as_str() {
                    // The feed's streams always exist.
                    "MKSTREAM" => {}
                    // Redis's internal counter: accepted, not kept (lag is computed).
                    "ENTRIESREAD" if a.remaining() > 0 => {
                        a.next_i64_in("entries-read", -1, i64::MAX)?;
                    }
                    _ => return Err(sub_err(&sub, "XGROUP")),
                }
            }
            let last = group_last(&feed, idb)?;
            let name = feed.groups.check_name("group", gname).map_err(feed_error)?;
            let lsn = feed
                .groups
                .create(&stream, name, last)
                .map_err(feed_error)?;
            Ok(done(&feed, Reply::ok(), lsn))
        }
        "SETID" => {
            let idb = a.next_bytes()?;
            if a.remaining() > 0 {
                if a.next_keyword()? != "ENTRIESREAD" {
                    return Err(sub_err(&sub, "XGROUP"));
                }
                a.next_i64_in("entries-read", -1, i64::MAX)?;
            }
            let g = lookup(&feed, &stream, gname, |s, g| FeedError::NoGroupForKey {
                stream: s,
                group: g,
            })?;
            let last = group_last(&feed, idb)?;
            let lsn = feed
                .groups
                .with(&g, |g| {
                    let rec = GroupRecord::SetId {
                        stream: stream.name(),
                        group: g.name.clone(),
                        last,
                    };
                    feed.groups.change(g, rec)
                })
                .ok_or_else(gone)?;
            Ok(done(&feed, Reply::ok(), lsn))
        }
        "DESTROY" => {
            let lsn = std::str::from_utf8(gname)
                .ok()
                .and_then(|g| feed.groups.destroy(&stream, g));
            let n = i64::from(lsn.is_some());
            Ok(done(&feed, Reply::Int(n), lsn.unwrap_or(0)))
        }
        _ => {
            let g = lookup(&feed, &stream, gname, |s, g| FeedError::NoGroupForKey {
                stream: s,
                group: g,
            })?;
            let cname = a.next_bytes()?;
            let create = sub == "CREATECONSUMER";
            let max = feed.groups.limits.max_consumers;
            let consumer = if create {
                feed.groups
                    .check_name("consumer", cname)
                    .map_err(feed_error)?
            } else {
                lossy(cname)
            };
            let r = feed
                .groups
                .with(&g, |g| -> Result<(i64, Lsn), FeedError> {
                    let exists = g.consumers.get(&consumer).map(|c| c.pending.len());
                    match (create, exists) {
                        (true, Some(_)) | (false, None) => return Ok((0, 0)),
                        (true, None) if g.consumers.len() >= max => {
                            return Err(FeedError::GroupLimit(format!(
                                "too many consumers in group '{}' (max {max})",
                                g.name
                            )))
                        }
                        _ => {}
                    }
                    let rec = GroupRecord::Consumer {
                        stream: stream.name(),
                        group: g.name.clone(),
                        consumer: consumer.clone(),
                        at_ms: now_ms(),
                        delete: !create,
                    };
                    let lsn = feed.groups.change(g, rec);
                    Ok((exists.map_or(1, |p| p as i64), lsn))
                })
                .ok_or_else(gone)?
                .map_err(feed_error)?;
            Ok(done(&feed, Reply::Int(r.0), r.1))
        }
    }
}

/// Makes sure the consumer exists (logged once, when it is new) and marks it seen.
fn ensure_consumer(feed: &Feed, g: &mut Group, consumer: &str, now: u64) -> Result<Lsn, FeedError> {
    if g.consumers.contains_key(consumer) {
        g.consumer_mut(consumer, now);
        return Ok(0);
    }
    let max = feed.groups.limits.max_consumers;
    if g.consumers.len() >= max {
        return Err(FeedError::GroupLimit(format!(
            "too many consumers in group '{}' (max {max})",
            g.name
        )));
    }
    let rec = GroupRecord::Consumer {
        stream: g.stream.name(),
        group: g.name.clone(),
        consumer: consumer.to_owned(),
        at_ms: now,
        delete: false,
    };
    Ok(feed.groups.change(g, rec))
}

/// `XREADGROUP GROUP g c [COUNT n] [BLOCK ms] [NOACK] STREAMS key... id...`
pub struct XReadGroup {
    group: Vec<u8>,
    consumer: Vec<u8>,
    count: Option<u64>,
    block_ms: Option<u64>,
    noack: bool,
    /// `None`: `>` (new entries); `Some(after)`: the consumer's pending entries after it.
    streams: Vec<(Stream, Option<Lsn>)>,
}

impl XReadGroup {
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("xreadgroup", args);
        let (mut group, mut consumer) = (None, None);
        let (mut count, mut block_ms, mut noack) = (None, None, false);
        loop {
            if a.remaining() == 0 {
                return Err(Reply::syntax());
            }
            match a.next_keyword()?.as_str() {
                "COUNT" if a.remaining() > 0 => count = Some(parse_count(&mut a)?),
                "BLOCK" if a.remaining() > 0 => {
                    block_ms = Some(a.next_u64_in("timeout", 0, i64::MAX as u64)?);
                }
                "GROUP" if a.remaining() >= 2 => {
                    group = Some(a.next_bytes()?.to_vec());
                    consumer = Some(a.next_bytes()?.to_vec());
                }
                "NOACK" => noack = true,
                "STREAMS" if a.remaining() > 0 => break,
                _ => return Err(Reply::syntax()),
            }
        }
        let n = a.remaining();
        if !n.is_multiple_of(2) {
            return Err(Reply::err(
                "ERR Unbalanced 'xreadgroup' list of streams: for each stream key an ID or '>' must be specified.",
            ));
        }
        let (Some(group), Some(consumer)) = (group, consumer) else {
            return Err(Reply::err("ERR Missing GROUP option for XREADGROUP"));
        };
        let mut keys = Vec::with_capacity(n / 2);
        for _ in 0..n / 2 {
            keys.push(Stream::parse(a.next_bytes()?).map_err(feed_error)?);
        }
        let mut streams = Vec::with_capacity(n / 2);
        for k in keys {
            let b = a.next_bytes()?;
            let after = match b {
                b">" => None,
                b"$" | b"+" => {
                    return Err(Reply::err(format!(
                        "ERR The {} ID is meaningless in the context of XREADGROUP: you want to read the history of this consumer by specifying a proper ID, or use the > ID to get new messages. The {} ID would just return an empty result set.",
                        lossy(b), lossy(b)
                    )))
                }
                _ => match id::read_after(b).map_err(feed_error)? {
                    Some(first) => Some(first - 1),
                    None => return Err(feed_error(FeedError::InvalidId)),
                },
            };
            streams.push((k, after));
        }
        Ok(XReadGroup {
            group,
            consumer,
            count,
            block_ms,
            noack,
            streams,
        })
    }

    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        run(self.run(ctx))
    }

    fn run(self, ctx: &mut Ctx<'_>) -> Result<Outcome, Reply> {
        let feed = feed(ctx)?;
        let consumer = feed
            .groups
            .check_name("consumer", &self.consumer)
            .map_err(feed_error)?;
        let mut targets = Vec::with_capacity(self.streams.len());
        for (stream, after) in self.streams {
            let g = lookup(&feed, &stream, &self.group, |s, g| FeedError::NoGroupRead {
                stream: s,
                group: g,
            })?;
            targets.push((stream, g, after));
        }
        let count = feed.count(self.count);
        let proto = ctx.conn.proto;
        let durable = feed.readable_lsn();
        let (found, lsn) =
            read_groups(&feed, &targets, &consumer, count, self.noack).map_err(feed_error)?;
        let any_history = targets.iter().any(|t| t.2.is_some());
        if !found.is_empty() || any_history {
            return Ok(done(&feed, streams_reply(proto, found), lsn));
        }
        let Some(block_ms) = self.block_ms else {
            return Ok(done(&feed, Reply::Nil, lsn));
        };
        // Nothing new: the consumer's creation (if any) must still be durable before
        // the eventual answer; the deferred reply below waits for its own records.
        let slot = feed.try_block().map_err(feed_error)?;
        let deadline = feed.block_deadline(block_ms);
        let noack = self.noack;
        // The reply's records must be acknowledged as any reply's are: by the server's
        // durability (the local log, or a majority of a Raft group).
        let durability = ctx.shared.durability.clone();
        let settle = move |lsn: Lsn| {
            let d = durability.clone();
            async move { d.wait(lsn).await.map_err(FeedError::Log) }
        };
        let wait = Box::pin(async move {
            let _slot = slot;
            let mut seen = durable;
            let mut owed = lsn;
            loop {
                let Some(now) = feed.wait_new(seen, deadline).await else {
                    // Timed out (or the log stopped, and then the wait for `owed` fails).
                    return match settle(owed).await {
                        Ok(()) => Reply::Nil,
                        Err(e) => feed_error(e),
                    };
                };
                seen = now;
                match read_groups(&feed, &targets, &consumer, count, noack) {
                    Ok((found, lsn)) => {
                        owed = owed.max(lsn);
                        if !found.is_empty() {
                            return match settle(owed.max(feed.last_lsn())).await {
                                Ok(()) => streams_reply(proto, found),
                                Err(e) => feed_error(e),
                            };
                        }
                    }
                    Err(e) => return feed_error(e),
                }
            }
        });
        Ok(Outcome::deferred(Reply::Nil, wait))
    }
}

/// XREADGROUP's answer: as XREAD's (RESP3 a map, RESP2 pairs), nil when empty.
fn streams_reply(proto: u8, found: StreamReplies) -> Reply {
    if found.is_empty() {
        return Reply::Nil;
    }
    if proto >= 3 {
        Reply::Map(
            found
                .into_iter()
                .map(|(k, es)| (Reply::Bulk(k.into_bytes()), Reply::Array(es)))
                .collect(),
        )
    } else {
        Reply::Array(
            found
                .into_iter()
                .map(|(k, es)| Reply::Array(vec![Reply::Bulk(k.into_bytes()), Reply::Array(es)]))
                .collect(),
        )
    }
}

type Target = (Stream, GroupRef, Option<Lsn>);
/// Per stream that answers: its name and its entries' replies.
type StreamReplies = Vec<(String, Vec<Reply>)>;

/// One pass of XREADGROUP over its streams: new entries for `>` streams (those that have
/// some), the consumer's pending entries for the others (always listed, maybe empty).
/// Returns the streams' replies and the last LSN logged.
fn read_groups(
    feed: &Feed,
    targets: &[Target],
    consumer: &str,
    count: usize,
    noack: bool,
) -> Result<(StreamReplies, Lsn), FeedError> {
    let mut found = Vec::new();
    let mut lsn = 0;
    let now = now_ms();
    for (stream, g, after) in targets {
        let r = feed
            .groups
            .with(g, |g| -> Result<Option<Vec<Reply>>, FeedError> {
                lsn = lsn.max(ensure_consumer(feed, g, consumer, now)?);
                match after {
                    None => {
                        let (replies, l) =
                            deliver_new(feed, g, stream, consumer, count, noack, now)?;
                        lsn = lsn.max(l);
                        Ok((!replies.is_empty()).then_some(replies))
                    }
                    Some(after) => {
                        let (replies, l) = history(feed, g, stream, consumer, *after, count, now)?;
                        lsn = lsn.max(l);
                        Ok(Some(replies))
                    }
                }
            });
        match r {
            None => return Err(FeedError::GroupGone),
            Some(Err(e)) => return Err(e),
            Some(Ok(Some(replies))) => found.push((stream.name(), replies)),
            Some(Ok(None)) => {}
        }
    }
    Ok((found, lsn))
}

/// Delivers up to `count` entries after the group's last-delivered id to `consumer`.
fn deliver_new(
    feed: &Feed,
    g: &mut Group,
    stream: &Stream,
    consumer: &str,
    count: usize,
    noack: bool,
    now: u64,
) -> Result<(Vec<Reply>, Lsn), FeedError> {
    let max = feed.groups.limits.max_pending;
    let room = if noack {
        count
    } else {
        max.saturating_sub(g.pending.len()).min(count)
    };
    if room == 0 {
        return Err(FeedError::PendingFull {
            group: g.name.clone(),
            max,
        });
    }
    let s = feed.scan(stream, g.next_unread(), Lsn::MAX, room, false)?;
    // Examined without an entry of this stream: later reads start after it.
    g.scanned = g.scanned.max(s.next.saturating_sub(1));
    let Some(last) = s.entries.last().map(|e| e.lsn) else {
        return Ok((Vec::new(), 0));
    };
    let ids: Vec<Lsn> = s.entries.iter().map(|e| e.lsn).collect();
    let rec = GroupRecord::Delivered {
        stream: stream.name(),
        group: g.name.clone(),
        consumer: consumer.to_owned(),
        at_ms: now,
        last,
        new: if noack { Vec::new() } else { ids },
        again: Vec::new(),
    };
    let lsn = feed.groups.change(g, rec);
    Ok((s.entries.into_iter().map(entry_reply).collect(), lsn))
}

/// The consumer's pending entries after `after` (a re-read: one more delivery each). An
/// entry the log no longer has is `[id, nil]`, as Redis answers for a deleted entry.
fn history(
    feed: &Feed,
    g: &mut Group,
    stream: &Stream,
    consumer: &str,
    after: Lsn,
    count: usize,
    now: u64,
) -> Result<(Vec<Reply>, Lsn), FeedError> {
    let ids: Vec<Lsn> = g
        .consumers
        .get(consumer)
        .map(|c| {
            c.pending
                .range(after.saturating_add(1)..)
                .take(count)
                .copied()
                .collect()
        })
        .unwrap_or_default();
    let mut replies = Vec::with_capacity(ids.len());
    let mut again = Vec::with_capacity(ids.len());
    for id in ids {
        match feed.entry_at(stream, id)? {
            Some(e) => {
                replies.push(entry_reply(e));
                again.push(id);
            }
            None => replies.push(Reply::Array(vec![id_reply(id), Reply::Nil])),
        }
    }
    if again.is_empty() {
        return Ok((replies, 0));
    }
    let rec = GroupRecord::Delivered {
        stream: stream.name(),
        group: g.name.clone(),
        consumer: consumer.to_owned(),
        at_ms: now,
        last: 0,
        new: Vec::new(),
        again,
    };
    Ok((replies, feed.groups.change(g, rec)))
}

/// `XACK key group id...`: how many of the ids were pending and are not any more.
pub fn xack(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    run((|| {
        let mut a = Args::new("xack", args);
        let stream = Stream::parse(a.next_bytes()?).map_err(feed_error)?;
        let gname = a.next_bytes()?;
        let mut ids = Vec::with_capacity(a.remaining());
        while a.remaining() > 0 {
            // All ids are checked before anything changes (Redis: all or nothing).
            if let Some(id) = id::exact(a.next_bytes()?).map_err(feed_error)? {
                ids.push(id);
            }
        }
        let feed = feed(ctx)?;
        let Ok(g) = lookup(&feed, &stream, gname, |s, g| FeedError::NoGroup {
            stream: s,
            group: g,
        }) else {
            // Redis answers 0 for an unknown key or group.
            return Ok(done(&feed, Reply::Int(0), 0));
        };
        let (n, lsn) = feed
            .groups
            .with(&g, |g| {
                ids.sort_unstable();
                ids.dedup();
                ids.retain(|id| g.pending.contains_key(id));
                if ids.is_empty() {
                    return (0, 0);
                }
                let n = ids.len() as i64;
                let rec = GroupRecord::Acked {
                    stream: stream.name(),
                    group: g.name.clone(),
                    ids: std::mem::take(&mut ids),
                };
                (n, feed.groups.change(g, rec))
            })
            .unwrap_or((0, 0));
        Ok(done(&feed, Reply::Int(n), lsn))
    })())
}

/// `XPENDING key group [[IDLE ms] start end count [consumer]]`
pub fn xpending(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    run((|| {
        let n = args.len();
        if n != 2 && !(5..=8).contains(&n) {
            return Err(Reply::syntax());
        }
        let mut a = Args::new("xpending", args);
        let stream = Stream::parse(a.next_bytes()?).map_err(feed_error)?;
        let gname = a.next_bytes()?;
        let mut range = None;
        if n >= 5 {
            let mut min_idle = 0u64;
            if args[2].eq_ignore_ascii_case(b"IDLE") {
                a.next_bytes()?;
                min_idle = a.next_i64_in("min-idle-time", i64::MIN, i64::MAX)?.max(0) as u64;
                if n < 7 {
                    return Err(Reply::syntax());
                }
            }
            let (sb, eb) = (a.next_bytes()?, a.next_bytes()?);
            let count = a.next_i64_in("count", i64::MIN, i64::MAX)?.max(0) as usize;
            let start = id::range_start(sb).map_err(feed_error)?;
            let end = id::range_end(eb).map_err(feed_error)?;
            let consumer = if a.remaining() > 0 {
                Some(lossy(a.next_bytes()?))
            } else {
                None
            };
            a.done()?;
            range = Some((min_idle, start, end, count, consumer));
        }
        let feed = feed(ctx)?;
        let g = lookup(&feed, &stream, gname, |s, g| FeedError::NoGroup {
            stream: s,
            group: g,
        })?;
        let now = now_ms();
        let reply = feed
            .groups
            .with(&g, |g| match range {
                None => summary(g),
                Some((min_idle, start, end, count, consumer)) => {
                    let Some(end) = end else {
                        return Reply::Array(Vec::new());
                    };
                    if start > end {
                        return Reply::Array(Vec::new());
                    }
                    let mut out = Vec::new();
                    let ids: Box<dyn Iterator<Item = &Lsn>> = match &consumer {
                        Some(c) => match g.consumers.get(c) {
                            Some(c) => Box::new(c.pending.range(start..=end)),
                            None => return Reply::Array(Vec::new()),
                        },
                        None => Box::new(g.pending.range(start..=end).map(|(id, _)| id)),
                    };
                    for id in ids {
                        if out.len() >= count {
                            break;
                        }
                        let Some(nack) = g.pending.get(id) else {
                            continue;
                        };
                        let idle = now.saturating_sub(nack.delivery_ms);
                        if min_idle > 0 && idle < min_idle {
                            continue;
                        }
                        out.push(Reply::Array(vec![
                            id_reply(*id),
                            Reply::bulk(&nack.consumer),
                            Reply::Int(idle as i64),
                            Reply::Int(nack.count as i64),
                        ]));
                    }
                    Reply::Array(out)
                }
            })
            .ok_or_else(gone)?;
        Ok(done(&feed, reply, 0))
    })())
}

fn summary(g: &Group) -> Reply {
    let (Some(first), Some(last)) = (g.pending.keys().next(), g.pending.keys().next_back()) else {
        return Reply::Array(vec![Reply::Int(0), Reply::Nil, Reply::Nil, Reply::Nil]);
    };
    let per: Vec<Reply> = g
        .consumers
        .iter()
        .filter(|(_, c)| !c.pending.is_empty())
        .map(|(n, c)| {
            Reply::Array(vec![
                Reply::bulk(n),
                Reply::bulk(c.pending.len().to_string()),
            ])
        })
        .collect();
    Reply::Array(vec![
        Reply::Int(g.pending.len() as i64),
        id_reply(*first),
        id_reply(*last),
        Reply::Array(per),
    ])
}

/// A claim's outcome: the replies, the ids dropped, the last id examined, the LSN.
type Claim = (Vec<Reply>, Vec<Lsn>, Option<Lsn>, Lsn);

/// What XCLAIM and XAUTOCLAIM share: moves `ids` (pending, idle long enough, still in
/// the log) to `consumer`. Returns the claimed entries (or ids), the ids no longer in the
/// log (dropped from the pending list, as Redis does for deleted entries) and the LSN.
#[allow(clippy::too_many_arguments)]
fn claim(
    feed: &Feed,
    g: &mut Group,
    stream: &Stream,
    consumer: &str,
    ids: &[Lsn],
    min_idle: u64,
    delivery_ms: Option<u64>,
    retry: Option<u64>,
    justid: bool,
    limit: usize,
) -> Result<Claim, FeedError> {
    let now = now_ms();
    let mut lsn = ensure_consumer(feed, g, consumer, now)?;
    let (mut claimed, mut replies, mut dropped) = (Vec::new(), Vec::new(), Vec::new());
    let mut examined_last = None;
    for &id in ids {
        if claimed.len() + dropped.len() >= limit {
            break;
        }
        examined_last = Some(id);
        let Some(nack) = g.pending.get(&id) else {
            continue;
        };
        let entry = feed.entry_at(stream, id)?;
        let Some(entry) = entry else {
            dropped.push(id);
            continue;
        };
        if min_idle > 0 && now.saturating_sub(nack.delivery_ms) < min_idle {
            continue;
        }
        claimed.push(id);
        replies.push(if justid {
            id_reply(id)
        } else {
            entry_reply(entry)
        });
    }
    if !claimed.is_empty() || !dropped.is_empty() {
        let rec = GroupRecord::Claimed {
            stream: stream.name(),
            group: g.name.clone(),
            consumer: consumer.to_owned(),
            at_ms: now,
            delivery_ms: delivery_ms.unwrap_or(now),
            ids: claimed,
            bump: !justid && retry.is_none(),
            retry,
            dropped: dropped.clone(),
        };
        lsn = lsn.max(feed.groups.change(g, rec));
    }
    Ok((replies, dropped, examined_last, lsn))
}

/// A negative min-idle-time counts as 0, as in Redis.
fn min_idle_arg(b: &[u8]) -> Result<u64, Reply> {
    Ok(i64_in(b, "min-idle-time", i64::MIN, i64::MAX)?.max(0) as u64)
}

/// `XCLAIM key group consumer min-idle-time id... [IDLE ms] [TIME ms] [RETRYCOUNT n]
/// [JUSTID] [LASTID id]` (FORCE is refused: the feed cannot make an entry pending that
/// was never delivered).
pub fn xclaim(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    run((|| {
        let mut a = Args::new("xclaim", args);
        let stream = Stream::parse(a.next_bytes()?).map_err(feed_error)?;
        let gname = a.next_bytes()?;
        let cname = a.next_bytes()?;
        let min_idle = min_idle_arg(a.next_bytes()?)?;
        let mut ids = Vec::new();
        let mut rest: &[&[u8]] = &[];
        for (i, b) in args[4..].iter().enumerate() {
            match id::exact(b) {
                Ok(Some(id)) => ids.push(id),
                Ok(None) => {}
                Err(_) => {
                    rest = &args[4 + i..];
                    break;
                }
            }
        }
        let now = now_ms();
        let (mut delivery, mut retry, mut justid, mut lastid) = (None, None, false, None);
        let mut o = Args::new("xclaim", rest);
        while o.remaining() > 0 {
            let kw = o.next_keyword()?;
            match kw.as_str() {
                "IDLE" if o.remaining() > 0 => {
                    delivery = Some(now.saturating_sub(
                        o.next_i64_in("idle", i64::MIN, i64::MAX)?.max(0) as u64,
                    ))
                }
                "TIME" if o.remaining() > 0 => {
                    delivery = Some(o.next_i64_in("time", i64::MIN, i64::MAX)?.max(0) as u64)
                }
                "RETRYCOUNT" if o.remaining() > 0 => {
                    retry = Some(o.next_i64_in("retrycount", i64::MIN, i64::MAX)?.max(0) as u64)
                }
                "JUSTID" => justid = true,
                "LASTID" if o.remaining() > 0 => {
                    lastid = Some(id::exact(o.next_bytes()?).map_err(feed_error)?.unwrap_or(0))
                }
                "FORCE" => {
                    return Err(Reply::err(
                        "ERR XCLAIM FORCE is not supported by stockgate's feed: only delivered entries can be pending",
                    ))
                }
                _ => {
                    return Err(Reply::err(format!(
                        "ERR Unrecognized XCLAIM option '{}'",
                        kw.chars().take(64).collect::<String>()
                    )))
                }
            }
        }
        let feed = feed(ctx)?;
        let g = lookup(&feed, &stream, gname, |s, g| FeedError::NoGroup {
            stream: s,
            group: g,
        })?;
        let consumer = feed
            .groups
            .check_name("consumer", cname)
            .map_err(feed_error)?;
        let (replies, lsn) = feed
            .groups
            .with(&g, |g| -> Result<(Vec<Reply>, Lsn), FeedError> {
                let mut lsn = 0;
                if let Some(l) = lastid.filter(|l| *l > g.last) {
                    let rec = GroupRecord::SetId {
                        stream: stream.name(),
                        group: g.name.clone(),
                        last: l,
                    };
                    lsn = feed.groups.change(g, rec);
                }
                let (replies, _, _, l) = claim(
                    &feed,
                    g,
                    &stream,
                    &consumer,
                    &ids,
                    min_idle,
                    delivery,
                    retry,
                    justid,
                    usize::MAX,
                )?;
                Ok((replies, lsn.max(l)))
            })
            .ok_or_else(gone)?
            .map_err(feed_error)?;
        Ok(done(&feed, Reply::Array(replies), lsn))
    })())
}

/// `XAUTOCLAIM key group consumer min-idle-time start [COUNT n] [JUSTID]`:
/// `[next-cursor, claimed, deleted-ids]`.
pub fn xautoclaim(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    run((|| {
        let mut a = Args::new("xautoclaim", args);
        let stream = Stream::parse(a.next_bytes()?).map_err(feed_error)?;
        let gname = a.next_bytes()?;
        let cname = a.next_bytes()?;
        let min_idle = min_idle_arg(a.next_bytes()?)?;
        let start = id::range_start(a.next_bytes()?).map_err(feed_error)?;
        let (mut count, mut justid) = (100usize, false);
        while a.remaining() > 0 {
            match a.next_keyword()?.as_str() {
                "COUNT" if a.remaining() > 0 => {
                    count = a.next_u64_in("count", 1, i64::MAX as u64)? as usize;
                }
                "JUSTID" => justid = true,
                _ => return Err(Reply::syntax()),
            }
        }
        let feed = feed(ctx)?;
        count = count.min(feed.limits.max_count);
        let g = lookup(&feed, &stream, gname, |s, g| FeedError::NoGroup {
            stream: s,
            group: g,
        })?;
        let consumer = feed
            .groups
            .check_name("consumer", cname)
            .map_err(feed_error)?;
        let (reply, lsn) = feed
            .groups
            .with(&g, |g| -> Result<(Reply, Lsn), FeedError> {
                // As Redis: at most 10 x COUNT pending entries examined per call.
                let candidates: Vec<Lsn> = g
                    .pending
                    .range(start..)
                    .take(count.saturating_mul(10))
                    .map(|(id, _)| *id)
                    .collect();
                let (replies, dropped, examined, lsn) = claim(
                    &feed,
                    g,
                    &stream,
                    &consumer,
                    &candidates,
                    min_idle,
                    None,
                    None,
                    justid,
                    count,
                )?;
                let next = examined
                    .and_then(|e| g.pending.range(e + 1..).next().map(|(id, _)| *id))
                    .unwrap_or(0);
                Ok((
                    Reply::Array(vec![
                        id_reply(next),
                        Reply::Array(replies),
                        Reply::Array(dropped.into_iter().map(id_reply).collect()),
                    ]),
                    lsn,
                ))
            })
            .ok_or_else(gone)?
            .map_err(feed_error)?;
        Ok(done(&feed, reply, lsn))
    })())
}

/// `XINFO GROUPS key`
pub fn xinfo_groups(feed: &Feed, stream: &Stream) -> Reply {
    let durable = feed.readable_lsn();
    let groups = feed.groups.of_stream(stream);
    let mut out = Vec::with_capacity(groups.len());
    for g in groups {
        let g = g.lock();
        // The lag is known exactly for the all-events stream; a sale's stream would need
        // a scan, and Redis also answers nil when it cannot tell.
        let lag = match stream {
            Stream::All => Reply::Int(feed.groups.lag(&g, durable) as i64),
            Stream::Sale(_) => Reply::Nil,
        };
        out.push(Reply::map([
            ("name", Reply::bulk(&g.name)),
            ("consumers", Reply::Int(g.consumers.len() as i64)),
            ("pending", Reply::Int(g.pending.len() as i64)),
            ("last-delivered-id", id_reply(g.last)),
            ("entries-read", Reply::Nil),
            ("lag", lag),
        ]));
    }
    Reply::Array(out)
}

/// `XINFO CONSUMERS key group`
pub fn xinfo_consumers(feed: &Feed, stream: &Stream, group: &[u8]) -> Result<Reply, Reply> {
    let g = lookup(feed, stream, group, |s, g| FeedError::NoGroupForKey {
        stream: s,
        group: g,
    })?;
    let now = now_ms();
    let g = g.lock();
    Ok(Reply::Array(
        g.consumers
            .iter()
            .map(|(name, c)| {
                let inactive = if c.active_ms == 0 {
                    -1
                } else {
                    now.saturating_sub(c.active_ms) as i64
                };
                Reply::map([
                    ("name", Reply::bulk(name)),
                    ("pending", Reply::Int(c.pending.len() as i64)),
                    ("idle", Reply::Int(now.saturating_sub(c.seen_ms) as i64)),
                    ("inactive", Reply::Int(inactive)),
                ])
            })
            .collect(),
    ))
}

pub fn xinfo_help() -> Reply {
    help(HELP_XINFO)
}

pub fn xinfo_sub_err(sub: &str) -> Reply {
    sub_err(sub, "XINFO")
}
