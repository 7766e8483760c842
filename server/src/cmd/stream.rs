//! The order feed's commands (`XREAD`, `XRANGE`, `XREVRANGE`, `XLEN`, `XINFO STREAM`):
//! parse, read from `crate::feed`, and answer in exactly Redis's reply shapes, so stream
//! clients (redis-py's `xread`/`xrange`...) parse them unmodified.

use super::args::Args;
use super::feed_reply::{entry_reply, feed, feed_error, parse_count};
use super::{Ctx, Outcome};
use crate::engine::Lsn;
use crate::feed::{id, Entry, Feed, FeedError, Stream};
use crate::protocol::Reply;

pub(super) fn entries_reply(es: Vec<Entry>) -> Reply {
    Reply::Array(es.into_iter().map(entry_reply).collect())
}

/// XREAD's answer: RESP3 a map stream -> entries, RESP2 an array of [stream, entries];
/// nil when no stream has an entry (both as Redis).
pub(super) fn xread_reply(proto: u8, found: Vec<(String, Vec<Entry>)>) -> Reply {
    if found.is_empty() {
        return Reply::Nil;
    }
    if proto >= 3 {
        Reply::Map(
            found
                .into_iter()
                .map(|(k, es)| (Reply::Bulk(k.into_bytes()), entries_reply(es)))
                .collect(),
        )
    } else {
        Reply::Array(
            found
                .into_iter()
                .map(|(k, es)| Reply::Array(vec![Reply::Bulk(k.into_bytes()), entries_reply(es)]))
                .collect(),
        )
    }
}

/// `XREAD [COUNT n] [BLOCK ms] STREAMS key... id...`
pub struct XRead {
    count: Option<u64>,
    block_ms: Option<u64>,
    streams: Vec<(Stream, Option<Lsn>)>,
}

impl XRead {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("xread", args);
        let mut count = None;
        let mut block_ms = None;
        loop {
            if a.remaining() == 0 {
                return Err(a.syntax());
            }
            match a.next_keyword()?.as_str() {
                "COUNT" => count = Some(parse_count(&mut a)?),
                "BLOCK" => {
                    block_ms = Some(a.next_u64_in("timeout", 0, i64::MAX as u64)?);
                }
                "STREAMS" => break,
                _ => return Err(a.syntax()),
            }
        }
        let n = a.remaining();
        if n == 0 || !n.is_multiple_of(2) {
            return Err(Reply::err(
                "ERR Unbalanced 'xread' list of streams: for each stream key an ID or '$' must be specified.",
            ));
        }
        let mut keys = Vec::with_capacity(n / 2);
        for _ in 0..n / 2 {
            keys.push(Stream::parse(a.next_bytes()?).map_err(feed_error)?);
        }
        let mut streams = Vec::with_capacity(n / 2);
        for k in keys {
            let after = id::read_after(a.next_bytes()?).map_err(feed_error)?;
            // Stored as "the last LSN already seen": `read_after` gave the first to read.
            streams.push((k, after.map(|first| first - 1)));
        }
        Ok(XRead {
            count,
            block_ms,
            streams,
        })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        match self.run(ctx) {
            Ok(o) => o,
            Err(r) => r.into(),
        }
    }

    fn run(self, ctx: &mut Ctx<'_>) -> Result<Outcome, Reply> {
        let feed = feed(ctx)?;
        let count = feed.count(self.count);
        let durable = feed.readable_lsn();
        let mut cursors: Vec<(Stream, Lsn)> = self
            .streams
            .into_iter()
            .map(|(s, after)| (s, after.unwrap_or(durable)))
            .collect();
        let (found, exhausted) = poll(&feed, &mut cursors, count).map_err(feed_error)?;
        let proto = ctx.conn.proto;
        if !found.is_empty() {
            return Ok(xread_reply(proto, found).into());
        }
        let Some(block_ms) = self.block_ms else {
            if let Some(e) = exhausted {
                return Err(feed_error(e));
            }
            return Ok(Reply::Nil.into());
        };
        let slot = feed.try_block().map_err(feed_error)?;
        let deadline = feed.block_deadline(block_ms);
        let wait = Box::pin(async move {
            let _slot = slot;
            let mut seen = durable;
            loop {
                let Some(now) = feed.wait_new(seen, deadline).await else {
                    return Reply::Nil;
                };
                seen = now;
                match poll(&feed, &mut cursors, count) {
                    Ok((found, _)) if !found.is_empty() => return xread_reply(proto, found),
                    Ok(_) => {}
                    Err(e) => return feed_error(e),
                }
            }
        });
        Ok(Outcome::deferred(Reply::Nil, wait))
    }
}

/// Streams that have entries, with them.
type Found = Vec<(String, Vec<Entry>)>;

/// Reads each stream after its cursor and moves the cursor past what was examined (a
/// sale stream's scan may examine records without finding one). Returns the streams that
/// have entries and, if a scan ran out of budget empty-handed, the error saying so.
fn poll(
    feed: &Feed,
    cursors: &mut [(Stream, Lsn)],
    count: usize,
) -> Result<(Found, Option<FeedError>), FeedError> {
    let mut found = Vec::new();
    let mut exhausted = None;
    for (stream, after) in cursors.iter_mut() {
        let from = after.saturating_add(1);
        let s = feed.scan(stream, from, Lsn::MAX, count, false)?;
        if s.entries.is_empty() && s.budget_exhausted && exhausted.is_none() {
            exhausted = Some(FeedError::ScanLimit {
                stream: stream.name(),
                from,
                to: s.next - 1,
            });
        }
        *after = (*after).max(s.next.saturating_sub(1));
        if !s.entries.is_empty() {
            found.push((stream.name(), s.entries));
        }
    }
    Ok((found, exhausted))
}

/// `XRANGE key start end [COUNT n]` and `XREVRANGE key end start [COUNT n]`
pub struct XRange {
    stream: Stream,
    from: Lsn,
    to: Option<Lsn>,
    count: Option<u64>,
    rev: bool,
}

impl XRange {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &[&[u8]], rev: bool) -> Result<Self, Reply> {
        let name = if rev { "xrevrange" } else { "xrange" };
        let mut a = Args::new(name, args);
        let stream = Stream::parse(a.next_bytes()?).map_err(feed_error)?;
        let (x, y) = (a.next_bytes()?, a.next_bytes()?);
        let (start, end) = if rev { (y, x) } else { (x, y) };
        let from = id::range_start(start).map_err(feed_error)?;
        let to = id::range_end(end).map_err(feed_error)?;
        let mut count = None;
        while a.remaining() > 0 {
            match a.next_keyword()?.as_str() {
                "COUNT" => count = Some(parse_count(&mut a)?),
                _ => return Err(a.syntax()),
            }
        }
        Ok(XRange {
            stream,
            from,
            to,
            count,
            rev,
        })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let feed = match feed(ctx) {
            Ok(f) => f,
            Err(r) => return r.into(),
        };
        // Without COUNT Redis answers the whole range; here at most `max_count` entries
        // (pages continue from the last id), so one reply stays bounded.
        let count = match self.count {
            Some(0) => return Reply::Array(Vec::new()).into(),
            Some(n) => n.min(feed.limits.max_count as u64) as usize,
            None => feed.limits.max_count,
        };
        let Some(to) = self.to else {
            return Reply::Array(Vec::new()).into();
        };
        match feed.scan(&self.stream, self.from, to, count, self.rev) {
            Ok(s) if s.entries.is_empty() && s.budget_exhausted => {
                feed_error(FeedError::ScanLimit {
                    stream: self.stream.name(),
                    from: self.from,
                    to: s.next - 1,
                })
                .into()
            }
            Ok(s) => {
                let mut es = s.entries;
                if self.rev {
                    es.reverse();
                }
                entries_reply(es).into()
            }
            Err(e) => feed_error(e).into(),
        }
    }
}

/// `XLEN key`
pub struct XLen {
    stream: Stream,
}

impl XLen {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("xlen", args);
        let stream = Stream::parse(a.next_bytes()?).map_err(feed_error)?;
        a.done()?;
        Ok(XLen { stream })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        let r = feed(ctx).and_then(|f| f.len(&self.stream).map_err(feed_error));
        match r {
            Ok(n) => Reply::Int(n.min(i64::MAX as u64) as i64).into(),
            Err(r) => r.into(),
        }
    }
}

/// `XINFO STREAM key`, `XINFO GROUPS key`, `XINFO CONSUMERS key group`, `XINFO HELP`.
pub struct XInfo {
    stream: Stream,
    sub: InfoSub,
}

enum InfoSub {
    Stream,
    Groups,
    Consumers(Vec<u8>),
    Help,
}

impl XInfo {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("xinfo", args);
        let sub = a.next_keyword()?;
        if sub == "HELP" {
            return Ok(XInfo {
                stream: Stream::All,
                sub: InfoSub::Help,
            });
        }
        let shape = match (sub.as_str(), args.len()) {
            ("STREAM", 2) => Some(InfoSub::Stream),
            ("GROUPS", 2) => Some(InfoSub::Groups),
            ("CONSUMERS", 3) => Some(InfoSub::Consumers(args[2].to_vec())),
            _ => None,
        };
        let Some(sub) = shape else {
            return Err(super::group::xinfo_sub_err(&sub));
        };
        let stream = Stream::parse(a.next_bytes()?).map_err(feed_error)?;
        Ok(XInfo { stream, sub })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        match self.run(ctx) {
            Ok(r) | Err(r) => r.into(),
        }
    }

    fn run(self, ctx: &mut Ctx<'_>) -> Result<Reply, Reply> {
        let feed = feed(ctx)?;
        match &self.sub {
            InfoSub::Help => return Ok(super::group::xinfo_help()),
            InfoSub::Groups => return Ok(super::group::xinfo_groups(&feed, &self.stream)),
            InfoSub::Consumers(g) => return super::group::xinfo_consumers(&feed, &self.stream, g),
            InfoSub::Stream => {}
        }
        let durable = feed.readable_lsn();
        let len = feed.len(&self.stream).map_err(feed_error)?;
        let first = feed
            .scan(&self.stream, 1.max(feed.first_lsn()), durable, 1, false)
            .map_err(feed_error)?
            .entries
            .pop();
        let last = feed
            .scan(&self.stream, 1, durable, 1, true)
            .map_err(feed_error)?
            .entries
            .pop();
        // The all-events stream's last entry is the last durable record, unless that is
        // a consumer group's own record (not an entry).
        let last_id = match (&self.stream, &last) {
            (_, Some(e)) => e.id(),
            (Stream::All, None) => format!("{durable}-0"),
            (Stream::Sale(_), None) => "0-0".into(),
        };
        let first_id = first.as_ref().map_or("0-0".into(), |e| e.id());
        let opt = |e: Option<Entry>| e.map_or(Reply::Nil, entry_reply);
        Ok(Reply::map([
            ("length", Reply::Int(len as i64)),
            ("radix-tree-keys", Reply::Int(0)),
            ("radix-tree-nodes", Reply::Int(0)),
            ("last-generated-id", Reply::Bulk(last_id.into_bytes())),
            ("max-deleted-entry-id", Reply::bulk("0-0")),
            ("entries-added", Reply::Int(len as i64)),
            (
                "recorded-first-entry-id",
                Reply::Bulk(first_id.into_bytes()),
            ),
            (
                "groups",
                Reply::Int(feed.groups.of_stream(&self.stream).len() as i64),
            ),
            ("first-entry", opt(first)),
            ("last-entry", opt(last)),
        ]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, arity, error_text, syntax, BAD_ID, UNKNOWN_STREAM};

    #[test]
    fn xread_parses_options_in_any_order() {
        for words in [
            &[
                "COUNT",
                "5",
                "BLOCK",
                "100",
                "STREAMS",
                "stockgate:events",
                "{S}:events",
                "$",
                "9-3",
            ][..],
            &[
                "block",
                "100",
                "count",
                "5",
                "streams",
                "stockgate:events",
                "{S}:events",
                "$",
                "9",
            ],
        ] {
            let r = XRead::parse(&argv(words)).unwrap();
            assert_eq!((r.count, r.block_ms), (Some(5), Some(100)), "{words:?}");
            // `$` is resolved when the command runs; `9-3` means "after entry 9".
            assert_eq!(
                r.streams,
                vec![(Stream::All, None), (Stream::Sale("S".into()), Some(9))]
            );
        }
    }

    #[test]
    fn xread_refusals_in_words() {
        let err = |w: &[&str]| error_text(XRead::parse(&argv(w)));
        let unbalanced = "ERR Unbalanced 'xread' list of streams: for each stream key an ID or '$' must be specified.";
        assert_eq!(err(&["STREAMS"]), unbalanced);
        assert_eq!(err(&["STREAMS", "stockgate:events"]), unbalanced);
        assert_eq!(err(&["COUNT", "1"]), syntax("xread"));
        assert_eq!(
            err(&["SOON", "STREAMS", "stockgate:events", "0"]),
            syntax("xread")
        );
        assert_eq!(
            err(&["COUNT", "-1", "STREAMS", "stockgate:events", "0"]),
            "ERR count must be between 0 and 9223372036854775807"
        );
        assert_eq!(err(&["STREAMS", "orders", "0"]), UNKNOWN_STREAM);
        assert_eq!(err(&["STREAMS", "stockgate:events", ">"]), BAD_ID);
        assert_eq!(err(&["COUNT"]), arity("xread"));
    }

    #[test]
    fn xrange_and_xrevrange_parse_their_bounds() {
        let r =
            XRange::parse(&argv(&["stockgate:events", "(5", "9", "COUNT", "2"]), false).unwrap();
        assert_eq!((r.from, r.to, r.count, r.rev), (6, Some(9), Some(2), false));
        // XREVRANGE takes the end first.
        let r = XRange::parse(&argv(&["{S}:events", "+", "-"]), true).unwrap();
        assert_eq!(
            (r.from, r.to, r.count, r.rev),
            (1, Some(u64::MAX), None, true)
        );
        let r = XRange::parse(&argv(&["stockgate:events", "-", "(0-0"]), false).unwrap();
        assert_eq!(r.to, None, "an empty range");
        let err = |w: &[&str], rev| error_text(XRange::parse(&argv(w), rev));
        assert_eq!(err(&["stockgate:events", "-"], false), arity("xrange"));
        assert_eq!(err(&["stockgate:events", "+"], true), arity("xrevrange"));
        assert_eq!(
            err(&["stockgate:events", "-", "+", "LIMIT", "1"], false),
            syntax("xrange")
        );
        assert_eq!(err(&["stockgate:events", "-", "x"], false), BAD_ID);
        assert_eq!(err(&["orders", "-", "+"], false), UNKNOWN_STREAM);
    }

    #[test]
    fn xlen_and_xinfo_parse() {
        assert_eq!(
            XLen::parse(&argv(&["{S}:events"])).unwrap().stream,
            Stream::Sale("S".into())
        );
        assert_eq!(
            error_text(XLen::parse(&argv(&["stockgate:events", "x"]))),
            syntax("xlen")
        );
        assert_eq!(error_text(XLen::parse(&argv(&["orders"]))), UNKNOWN_STREAM);
        let info = XInfo::parse(&argv(&["consumers", "stockgate:events", "g"])).unwrap();
        assert!(matches!(info.sub, InfoSub::Consumers(ref g) if g == b"g"));
        assert!(matches!(
            XInfo::parse(&argv(&["help"])).unwrap().sub,
            InfoSub::Help
        ));
        assert!(matches!(
            XInfo::parse(&argv(&["GROUPS", "stockgate:events"]))
                .unwrap()
                .sub,
            InfoSub::Groups
        ));
        assert_eq!(
            error_text(XInfo::parse(&argv(&["GROUPS", "stockgate:events", "g"]))),
            "ERR unknown subcommand or wrong number of arguments for 'GROUPS'. Try XINFO HELP."
        );
        assert_eq!(
            error_text(XInfo::parse(&argv(&["STREAM", "orders"]))),
            UNKNOWN_STREAM
        );
    }
}
