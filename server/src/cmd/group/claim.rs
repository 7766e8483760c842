//! `XCLAIM` and `XAUTOCLAIM`: pending entries idle long enough move to another consumer
//! (the one way an entry of a dead consumer is taken over).

use super::{done, ensure_consumer, gone, id_reply, lookup, min_idle_arg, no_group, run};
use crate::cmd::args::Args;
use crate::cmd::feed_reply::{entry_reply, feed, feed_error};
use crate::cmd::{Ctx, Outcome};
use crate::engine::Lsn;
use crate::feed::groups::{Group, GroupRecord};
use crate::feed::{id, Feed, FeedError, Stream};
use crate::protocol::Reply;

/// `XCLAIM key group consumer min-idle-time id... [IDLE ms] [TIME ms] [RETRYCOUNT n]
/// [JUSTID] [LASTID id]` (FORCE is refused: the feed cannot make an entry pending that
/// was never delivered).
#[derive(Debug, PartialEq, Eq)]
pub struct XClaim {
    stream: Stream,
    group: Vec<u8>,
    consumer: Vec<u8>,
    min_idle: u64,
    ids: Vec<Lsn>,
    delivered_at: Option<DeliveredAt>,
    retry: Option<u64>,
    justid: bool,
    /// `LASTID`: the group's last-delivered id moves up to it (0: an id with a sequence).
    last_id: Option<Lsn>,
}

/// The delivery time a claim records (default: now).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeliveredAt {
    /// `IDLE ms`: that long ago.
    IdleFor(u64),
    /// `TIME ms`: at that Unix time.
    At(u64),
}

impl DeliveredAt {
    fn ms(self, now: u64) -> u64 {
        match self {
            DeliveredAt::IdleFor(idle) => now.saturating_sub(idle),
            DeliveredAt::At(t) => t,
        }
    }
}

impl XClaim {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("xclaim", args);
        let stream = Stream::parse(a.next_bytes()?).map_err(feed_error)?;
        let group = a.next_bytes()?.to_vec();
        let consumer = a.next_bytes()?.to_vec();
        let min_idle = min_idle_arg(a.next_bytes()?)?;
        // The ids run up to the first argument that is no id: the options start there.
        let mut ids = Vec::new();
        let mut options: &[&[u8]] = &[];
        for (i, b) in args[4..].iter().enumerate() {
            match id::exact(b) {
                Ok(Some(id)) => ids.push(id),
                Ok(None) => {}
                Err(_) => {
                    options = &args[4 + i..];
                    break;
                }
            }
        }
        let mut claim = XClaim {
            stream,
            group,
            consumer,
            min_idle,
            ids,
            delivered_at: None,
            retry: None,
            justid: false,
            last_id: None,
        };
        claim.parse_options(options)?;
        Ok(claim)
    }

    fn parse_options(&mut self, options: &[&[u8]]) -> Result<(), Reply> {
        let mut o = Args::new("xclaim", options);
        let non_negative = |o: &mut Args<'_>, field: &'static str| -> Result<u64, Reply> {
            Ok(o.next_i64_in(field, i64::MIN, i64::MAX)?.max(0) as u64)
        };
        while o.remaining() > 0 {
            let kw = o.next_keyword()?;
            match kw.as_str() {
                "IDLE" if o.remaining() > 0 => {
                    self.delivered_at = Some(DeliveredAt::IdleFor(non_negative(&mut o, "idle")?));
                }
                "TIME" if o.remaining() > 0 => {
                    self.delivered_at = Some(DeliveredAt::At(non_negative(&mut o, "time")?));
                }
                "RETRYCOUNT" if o.remaining() > 0 => {
                    self.retry = Some(non_negative(&mut o, "retrycount")?);
                }
                "JUSTID" => self.justid = true,
                "LASTID" if o.remaining() > 0 => {
                    let id = id::exact(o.next_bytes()?).map_err(feed_error)?;
                    self.last_id = Some(id.unwrap_or(0));
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
        Ok(())
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        run(self.run(ctx))
    }

    fn run(self, ctx: &mut Ctx<'_>) -> Result<Outcome, Reply> {
        let feed = feed(ctx)?;
        let g = lookup(&feed, &self.stream, &self.group, no_group)?;
        let consumer = feed
            .groups
            .check_name("consumer", &self.consumer)
            .map_err(feed_error)?;
        let (replies, lsn) = feed
            .groups
            .with(&g, |g| -> Result<(Vec<Reply>, Lsn), FeedError> {
                let mut lsn = 0;
                if let Some(last) = self.last_id.filter(|l| *l > g.last) {
                    let rec = GroupRecord::SetId {
                        stream: self.stream.name(),
                        group: g.name.clone(),
                        last,
                    };
                    lsn = feed.groups.change(g, rec);
                }
                let now = feed.groups.now_ms();
                let claim = Claim {
                    feed: &feed,
                    stream: &self.stream,
                    consumer: &consumer,
                    min_idle: self.min_idle,
                    delivery_ms: self.delivered_at.map(|d| d.ms(now)),
                    retry: self.retry,
                    justid: self.justid,
                    limit: usize::MAX,
                };
                let claimed = claim.run(g, &self.ids)?;
                Ok((claimed.replies, lsn.max(claimed.lsn)))
            })
            .ok_or_else(gone)?
            .map_err(feed_error)?;
        Ok(done(&feed, Reply::Array(replies), lsn))
    }
}

/// `XAUTOCLAIM key group consumer min-idle-time start [COUNT n] [JUSTID]`:
/// `[next-cursor, claimed, deleted-ids]`.
#[derive(Debug, PartialEq, Eq)]
pub struct XAutoClaim {
    stream: Stream,
    group: Vec<u8>,
    consumer: Vec<u8>,
    min_idle: u64,
    start: Lsn,
    count: usize,
    justid: bool,
}

impl XAutoClaim {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("xautoclaim", args);
        let stream = Stream::parse(a.next_bytes()?).map_err(feed_error)?;
        let group = a.next_bytes()?.to_vec();
        let consumer = a.next_bytes()?.to_vec();
        let min_idle = min_idle_arg(a.next_bytes()?)?;
        let start = id::range_start(a.next_bytes()?).map_err(feed_error)?;
        let (mut count, mut justid) = (100usize, false);
        while a.remaining() > 0 {
            match a.next_keyword()?.as_str() {
                "COUNT" if a.remaining() > 0 => {
                    count = a.next_u64_in("count", 1, i64::MAX as u64)? as usize;
                }
                "JUSTID" => justid = true,
                _ => return Err(a.syntax()),
            }
        }
        debug_assert!(count >= 1);
        Ok(XAutoClaim {
            stream,
            group,
            consumer,
            min_idle,
            start,
            count,
            justid,
        })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        run(self.run(ctx))
    }

    fn run(self, ctx: &mut Ctx<'_>) -> Result<Outcome, Reply> {
        let feed = feed(ctx)?;
        let count = self.count.min(feed.limits.max_count);
        let g = lookup(&feed, &self.stream, &self.group, no_group)?;
        let consumer = feed
            .groups
            .check_name("consumer", &self.consumer)
            .map_err(feed_error)?;
        let (reply, lsn) = feed
            .groups
            .with(&g, |g| -> Result<(Reply, Lsn), FeedError> {
                // As Redis: at most 10 x COUNT pending entries examined per call.
                let candidates: Vec<Lsn> = g
                    .pending
                    .range(self.start..)
                    .take(count.saturating_mul(10))
                    .map(|(id, _)| *id)
                    .collect();
                let claim = Claim {
                    feed: &feed,
                    stream: &self.stream,
                    consumer: &consumer,
                    min_idle: self.min_idle,
                    delivery_ms: None,
                    retry: None,
                    justid: self.justid,
                    limit: count,
                };
                let claimed = claim.run(g, &candidates)?;
                let next = claimed
                    .examined_last
                    .and_then(|e| g.pending.range(e + 1..).next().map(|(id, _)| *id))
                    .unwrap_or(0);
                let reply = Reply::Array(vec![
                    id_reply(next),
                    Reply::Array(claimed.replies),
                    Reply::Array(claimed.dropped.into_iter().map(id_reply).collect()),
                ]);
                Ok((reply, claimed.lsn))
            })
            .ok_or_else(gone)?
            .map_err(feed_error)?;
        Ok(done(&feed, reply, lsn))
    }
}

/// What XCLAIM and XAUTOCLAIM share: the claim's terms.
struct Claim<'a> {
    feed: &'a Feed,
    stream: &'a Stream,
    consumer: &'a str,
    min_idle: u64,
    /// The delivery time recorded (`None`: now).
    delivery_ms: Option<u64>,
    retry: Option<u64>,
    justid: bool,
    /// Claimed plus dropped entries at most.
    limit: usize,
}

/// A claim's outcome.
struct Claimed {
    /// The claimed entries (or their ids, with JUSTID).
    replies: Vec<Reply>,
    /// Ids no longer in the log, dropped from the pending list (as Redis does for
    /// deleted entries).
    dropped: Vec<Lsn>,
    /// The last id examined: where XAUTOCLAIM's cursor continues.
    examined_last: Option<Lsn>,
    lsn: Lsn,
}

impl Claim<'_> {
    /// Moves those of `ids` that are pending, idle long enough and still in the log to
    /// the consumer, and logs it.
    fn run(&self, g: &mut Group, ids: &[Lsn]) -> Result<Claimed, FeedError> {
        let now = self.feed.groups.now_ms();
        let mut lsn = ensure_consumer(self.feed, g, self.consumer, now)?;
        let (mut claimed, mut replies, mut dropped) = (Vec::new(), Vec::new(), Vec::new());
        let mut examined_last = None;
        for &id in ids {
            if claimed.len() + dropped.len() >= self.limit {
                break;
            }
            examined_last = Some(id);
            let Some(nack) = g.pending.get(&id) else {
                continue;
            };
            let Some(entry) = self.feed.entry_at(self.stream, id)? else {
                dropped.push(id);
                continue;
            };
            if self.min_idle > 0 && now.saturating_sub(nack.delivery_ms) < self.min_idle {
                continue;
            }
            claimed.push(id);
            replies.push(if self.justid {
                id_reply(id)
            } else {
                entry_reply(entry)
            });
        }
        if !claimed.is_empty() || !dropped.is_empty() {
            let rec = GroupRecord::Claimed {
                stream: self.stream.name(),
                group: g.name.clone(),
                consumer: self.consumer.to_owned(),
                at_ms: now,
                delivery_ms: self.delivery_ms.unwrap_or(now),
                ids: claimed.clone(),
                bump: !self.justid && self.retry.is_none(),
                retry: self.retry,
                dropped: dropped.clone(),
            };
            lsn = lsn.max(self.feed.groups.change(g, rec));
            debug_assert!(claimed.iter().all(|id| g
                .pending
                .get(id)
                .is_some_and(|n| n.consumer == self.consumer)));
        }
        Ok(Claimed {
            replies,
            dropped,
            examined_last,
            lsn,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, arity, error_text, syntax, BAD_ID};

    #[test]
    fn xclaim_parses_ids_then_options_in_any_order() {
        let words = [
            "stockgate:events",
            "g",
            "c",
            "-5",
            "3",
            "4-0",
            "4-2",
            "JUSTID",
            "RETRYCOUNT",
            "2",
            "IDLE",
            "100",
            "LASTID",
            "9",
        ];
        let c = XClaim::parse(&argv(&words)).unwrap();
        assert_eq!(c.min_idle, 0, "a negative min-idle-time counts as 0");
        assert_eq!(c.ids, vec![3, 4]);
        assert_eq!(c.delivered_at, Some(DeliveredAt::IdleFor(100)));
        assert_eq!((c.retry, c.justid, c.last_id), (Some(2), true, Some(9)));
        let words = [
            "stockgate:events",
            "g",
            "c",
            "10",
            "3",
            "TIME",
            "77",
            "lastid",
            "8-1",
        ];
        let c = XClaim::parse(&argv(&words)).unwrap();
        assert_eq!(c.delivered_at, Some(DeliveredAt::At(77)));
        assert_eq!(
            c.last_id,
            Some(0),
            "an id with a sequence number is no entry"
        );
        assert_eq!(DeliveredAt::IdleFor(100).ms(1_000), 900);
        assert_eq!(DeliveredAt::IdleFor(2_000).ms(1_000), 0);
    }

    #[test]
    fn xclaim_refusals_in_words() {
        let err = |w: &[&str]| error_text(XClaim::parse(&argv(w)));
        assert_eq!(
            err(&["stockgate:events", "g", "c", "0", "1", "FORCE"]),
            "ERR XCLAIM FORCE is not supported by stockgate's feed: only delivered entries can be pending"
        );
        assert_eq!(
            err(&["stockgate:events", "g", "c", "0", "1", "SOON"]),
            "ERR Unrecognized XCLAIM option 'SOON'"
        );
        // An option without its value is no option.
        assert_eq!(
            err(&["stockgate:events", "g", "c", "0", "1", "IDLE"]),
            "ERR Unrecognized XCLAIM option 'IDLE'"
        );
        assert_eq!(
            err(&["stockgate:events", "g", "c", "0", "1", "LASTID", "x"]),
            BAD_ID
        );
        assert_eq!(
            err(&["stockgate:events", "g", "c", "idle", "1"]),
            "ERR min-idle-time is not an integer (must be between -9223372036854775808 and 9223372036854775807)"
        );
        assert_eq!(err(&["stockgate:events", "g", "c"]), arity("xclaim"));
    }

    #[test]
    fn xautoclaim_parses_and_refuses_in_words() {
        let words = [
            "stockgate:events",
            "g",
            "c",
            "60000",
            "(5",
            "JUSTID",
            "COUNT",
            "7",
        ];
        let c = XAutoClaim::parse(&argv(&words)).unwrap();
        assert_eq!(
            (c.min_idle, c.start, c.count, c.justid),
            (60_000, 6, 7, true)
        );
        let c = XAutoClaim::parse(&argv(&["stockgate:events", "g", "c", "0", "-"])).unwrap();
        assert_eq!((c.start, c.count, c.justid), (1, 100, false));
        let err = |w: &[&str]| error_text(XAutoClaim::parse(&argv(w)));
        assert_eq!(
            err(&["stockgate:events", "g", "c", "0", "-", "COUNT", "0"]),
            "ERR count must be between 1 and 9223372036854775807"
        );
        assert_eq!(
            err(&["stockgate:events", "g", "c", "0", "-", "COUNT"]),
            syntax("xautoclaim")
        );
        assert_eq!(
            err(&["stockgate:events", "g", "c", "0", "-", "FAST"]),
            syntax("xautoclaim")
        );
        assert_eq!(err(&["stockgate:events", "g", "c", "0", "x"]), BAD_ID);
        assert_eq!(
            err(&["stockgate:events", "g", "c", "0"]),
            arity("xautoclaim")
        );
    }
}
