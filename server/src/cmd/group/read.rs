//! `XREADGROUP GROUP g c [COUNT n] [BLOCK ms] [NOACK] STREAMS key... id...`: new entries
//! (`>`) delivered to a consumer and made pending, or its pending entries read again.

use super::{done, ensure_consumer, id_reply, lookup, lossy, run};
use crate::cmd::args::Args;
use crate::cmd::feed_reply::{entry_reply, feed, feed_error, parse_count};
use crate::cmd::{Ctx, Outcome};
use crate::engine::Lsn;
use crate::feed::groups::{Group, GroupRecord, GroupRef};
use crate::feed::{id, Feed, FeedError, Stream};
use crate::protocol::Reply;

/// `XREADGROUP GROUP g c [COUNT n] [BLOCK ms] [NOACK] STREAMS key... id...`
#[derive(Debug, PartialEq, Eq)]
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
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("xreadgroup", args);
        let (mut group, mut consumer) = (None, None);
        let (mut count, mut block_ms, mut noack) = (None, None, false);
        loop {
            if a.remaining() == 0 {
                return Err(a.syntax());
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
                _ => return Err(a.syntax()),
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
            streams.push((k, read_position(a.next_bytes()?)?));
        }
        debug_assert_eq!(a.remaining(), 0);
        debug_assert!(!streams.is_empty(), "STREAMS takes at least one key");
        Ok(XReadGroup {
            group,
            consumer,
            count,
            block_ms,
            noack,
            streams,
        })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
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
            targets.push(Target {
                stream,
                group: g,
                after,
            });
        }
        let read = GroupRead {
            count: feed.count(self.count),
            feed,
            targets,
            consumer,
            noack: self.noack,
        };
        let proto = ctx.conn.proto;
        let durable = read.feed.readable_lsn();
        let (found, lsn) = read.once().map_err(feed_error)?;
        let any_history = read.targets.iter().any(|t| t.after.is_some());
        if !found.is_empty() || any_history {
            return Ok(done(&read.feed, streams_reply(proto, found), lsn));
        }
        let Some(block_ms) = self.block_ms else {
            return Ok(done(&read.feed, Reply::Nil, lsn));
        };
        read.block(ctx, proto, block_ms, durable, lsn)
    }
}

/// A stream's id: `>` for new entries, or the id after which the consumer's pending
/// entries are read again (`$` and `+` mean nothing here, as Redis says).
fn read_position(b: &[u8]) -> Result<Option<Lsn>, Reply> {
    match b {
        b">" => Ok(None),
        b"$" | b"+" => Err(Reply::err(format!(
            "ERR The {} ID is meaningless in the context of XREADGROUP: you want to read the history of this consumer by specifying a proper ID, or use the > ID to get new messages. The {} ID would just return an empty result set.",
            lossy(b), lossy(b)
        ))),
        _ => match id::read_after(b).map_err(feed_error)? {
            Some(first) => Ok(Some(first - 1)),
            None => Err(feed_error(FeedError::InvalidId)),
        },
    }
}

/// One stream of the read: its group and where to read (see [`XReadGroup::streams`]).
struct Target {
    stream: Stream,
    group: GroupRef,
    after: Option<Lsn>,
}

/// Per stream that answers: its name and its entries' replies.
type StreamReplies = Vec<(String, Vec<Reply>)>;

/// A resolved XREADGROUP: the groups found, the consumer's checked name, the count.
struct GroupRead {
    feed: std::sync::Arc<Feed>,
    targets: Vec<Target>,
    consumer: String,
    count: usize,
    noack: bool,
}

impl GroupRead {
    /// One pass over the streams: new entries for `>` streams (those that have some),
    /// the consumer's pending entries for the others (always listed, maybe empty).
    /// Returns the streams' replies and the last LSN logged.
    fn once(&self) -> Result<(StreamReplies, Lsn), FeedError> {
        let feed = &self.feed;
        let mut found = Vec::new();
        let mut lsn = 0;
        let now = feed.groups.now_ms();
        for t in &self.targets {
            let r = feed
                .groups
                .with(&t.group, |g| -> Result<Option<Vec<Reply>>, FeedError> {
                    lsn = lsn.max(ensure_consumer(feed, g, &self.consumer, now)?);
                    let (replies, l) = match t.after {
                        None => self.deliver_new(g, &t.stream, now)?,
                        Some(after) => self.history(g, &t.stream, after, now)?,
                    };
                    lsn = lsn.max(l);
                    Ok((t.after.is_some() || !replies.is_empty()).then_some(replies))
                });
            match r {
                None => return Err(FeedError::GroupGone),
                Some(Err(e)) => return Err(e),
                Some(Ok(Some(replies))) => found.push((t.stream.name(), replies)),
                Some(Ok(None)) => {}
            }
        }
        Ok((found, lsn))
    }

    /// Delivers up to `count` entries after the group's last-delivered id.
    fn deliver_new(
        &self,
        g: &mut Group,
        stream: &Stream,
        now: u64,
    ) -> Result<(Vec<Reply>, Lsn), FeedError> {
        let feed = &self.feed;
        let max = feed.groups.limits.max_pending;
        let room = if self.noack {
            self.count
        } else {
            max.saturating_sub(g.pending.len()).min(self.count)
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
        debug_assert!(s.entries.len() <= room);
        debug_assert!(
            s.entries[0].lsn > g.last,
            "a new entry at or before the last-delivered id"
        );
        let ids: Vec<Lsn> = s.entries.iter().map(|e| e.lsn).collect();
        let rec = GroupRecord::Delivered {
            stream: stream.name(),
            group: g.name.clone(),
            consumer: self.consumer.clone(),
            at_ms: now,
            last,
            new: if self.noack { Vec::new() } else { ids },
            again: Vec::new(),
        };
        let lsn = feed.groups.change(g, rec);
        debug_assert_eq!(g.last, last);
        debug_assert!(self.noack || g.pending.len() <= max);
        Ok((s.entries.into_iter().map(entry_reply).collect(), lsn))
    }

    /// The consumer's pending entries after `after` (a re-read: one more delivery each).
    /// An entry the log no longer has is `[id, nil]`, as Redis answers for a deleted one.
    fn history(
        &self,
        g: &mut Group,
        stream: &Stream,
        after: Lsn,
        now: u64,
    ) -> Result<(Vec<Reply>, Lsn), FeedError> {
        let ids: Vec<Lsn> = g
            .consumers
            .get(&self.consumer)
            .map(|c| {
                c.pending
                    .range(after.saturating_add(1)..)
                    .take(self.count)
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        let mut replies = Vec::with_capacity(ids.len());
        let mut again = Vec::with_capacity(ids.len());
        for id in ids {
            match self.feed.entry_at(stream, id)? {
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
            consumer: self.consumer.clone(),
            at_ms: now,
            last: 0,
            new: Vec::new(),
            again,
        };
        Ok((replies, self.feed.groups.change(g, rec)))
    }

    /// Nothing new yet: the connection waits (bounded by BLOCK and the feed's limit) for
    /// new records and reads again. The consumer's creation (if any) must still be
    /// durable before the eventual answer; the deferred reply waits for its own records
    /// as any reply's are: by the server's durability (the local log, or a majority of a
    /// Raft group).
    fn block(
        self,
        ctx: &Ctx<'_>,
        proto: u8,
        block_ms: u64,
        durable: Lsn,
        lsn: Lsn,
    ) -> Result<Outcome, Reply> {
        let slot = self.feed.try_block().map_err(feed_error)?;
        let deadline = self.feed.block_deadline(block_ms);
        let durability = ctx.shared.durability.clone();
        let settle = move |lsn: Lsn| {
            let d = durability.clone();
            async move { d.wait(lsn).await.map_err(|e| FeedError::Log(e.to_string())) }
        };
        let wait = Box::pin(async move {
            let _slot = slot;
            let mut seen = durable;
            let mut owed = lsn;
            loop {
                let Some(now) = self.feed.wait_new(seen, deadline).await else {
                    // Timed out (or the log stopped, and then the wait for `owed` fails).
                    return match settle(owed).await {
                        Ok(()) => Reply::Nil,
                        Err(e) => feed_error(e),
                    };
                };
                seen = now;
                match self.once() {
                    Ok((found, lsn)) => {
                        owed = owed.max(lsn);
                        if !found.is_empty() {
                            return match settle(owed.max(self.feed.last_lsn())).await {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, error_text, syntax, BAD_ID, UNKNOWN_STREAM};

    fn parse(words: &[&str]) -> Result<XReadGroup, Reply> {
        XReadGroup::parse(&argv(words))
    }

    #[test]
    fn xreadgroup_parses_options_in_any_order() {
        let want = XReadGroup {
            group: b"g".to_vec(),
            consumer: b"c".to_vec(),
            count: Some(10),
            block_ms: Some(0),
            noack: true,
            streams: vec![(Stream::All, None), (Stream::Sale("S".into()), Some(41))],
        };
        let tail = ["STREAMS", "stockgate:events", "{S}:events", ">", "41-7"];
        for head in [
            &["GROUP", "g", "c", "COUNT", "10", "BLOCK", "0", "NOACK"][..],
            &["noack", "block", "0", "count", "10", "group", "g", "c"],
        ] {
            let words: Vec<&str> = head.iter().chain(tail.iter()).copied().collect();
            assert_eq!(parse(&words).unwrap(), want, "{words:?}");
        }
        let plain = parse(&["GROUP", "g", "c", "STREAMS", "stockgate:events", "0"]).unwrap();
        assert_eq!(plain.streams, vec![(Stream::All, Some(0))]);
        assert_eq!(
            (plain.count, plain.block_ms, plain.noack),
            (None, None, false)
        );
    }

    #[test]
    fn xreadgroup_refusals_in_words() {
        let meaningless = |id: &str| {
            format!(
                "ERR The {id} ID is meaningless in the context of XREADGROUP: you want to read the history of this consumer by specifying a proper ID, or use the > ID to get new messages. The {id} ID would just return an empty result set."
            )
        };
        for (words, want) in [
            (&["GROUP", "g", "c"][..], syntax("xreadgroup")),
            (&["GROUP", "g", "c", "STREAMS"], syntax("xreadgroup")),
            (&["GROUP", "g", "STREAMS", "stockgate:events", ">"], syntax("xreadgroup")),
            (&["FAST", "STREAMS", "stockgate:events", ">"], syntax("xreadgroup")),
            (
                &["STREAMS", "stockgate:events", ">"],
                "ERR Missing GROUP option for XREADGROUP".to_owned(),
            ),
            (
                &["GROUP", "g", "c", "STREAMS", "stockgate:events", "{S}:events", ">"],
                "ERR Unbalanced 'xreadgroup' list of streams: for each stream key an ID or '>' must be specified.".to_owned(),
            ),
            (
                &["GROUP", "g", "c", "COUNT", "-1", "STREAMS", "stockgate:events", ">"],
                "ERR count must be between 0 and 9223372036854775807".to_owned(),
            ),
            (
                &["GROUP", "g", "c", "BLOCK", "soon", "STREAMS", "stockgate:events", ">"],
                "ERR timeout is not an integer (must be between 0 and 9223372036854775807)"
                    .to_owned(),
            ),
            (&["GROUP", "g", "c", "STREAMS", "orders", ">"], UNKNOWN_STREAM.to_owned()),
            (&["GROUP", "g", "c", "STREAMS", "stockgate:events", "$"], meaningless("$")),
            (&["GROUP", "g", "c", "STREAMS", "stockgate:events", "+"], meaningless("+")),
            (&["GROUP", "g", "c", "STREAMS", "stockgate:events", "x-1"], BAD_ID.to_owned()),
        ] {
            assert_eq!(error_text(parse(words)), want, "{words:?}");
        }
    }
}
