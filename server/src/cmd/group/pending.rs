//! `XPENDING key group [[IDLE ms] start end count [consumer]]`: a group's pending
//! entries, summed up or listed.

use super::{done, gone, id_reply, lookup, lossy, no_group, run};
use crate::cmd::args::Args;
use crate::cmd::feed_reply::{feed, feed_error};
use crate::cmd::{Ctx, Outcome};
use crate::engine::Lsn;
use crate::feed::groups::Group;
use crate::feed::{id, Stream};
use crate::protocol::Reply;

/// `XPENDING stream group [[IDLE ms] start end count [consumer]]`: the summary of a
/// group's delivered but unacknowledged entries, or the entries themselves.
#[derive(Debug, PartialEq, Eq)]
pub struct XPending {
    stream: Stream,
    group: Vec<u8>,
    /// `None`: the summary form.
    range: Option<PendingRange>,
}

/// The extended form: entries in `start..=end` (`end` `None`: an empty range), idle
/// at least `min_idle` ms, at most `count`, of one consumer or all.
#[derive(Debug, PartialEq, Eq)]
struct PendingRange {
    min_idle: u64,
    start: Lsn,
    end: Option<Lsn>,
    count: usize,
    consumer: Option<String>,
}

impl XPending {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        let n = args.len();
        if n != 2 && !(5..=8).contains(&n) {
            return Err(crate::cmd::args::syntax_error("xpending"));
        }
        let mut a = Args::new("xpending", args);
        let stream = Stream::parse(a.next_bytes()?).map_err(feed_error)?;
        let group = a.next_bytes()?.to_vec();
        if n == 2 {
            return Ok(XPending {
                stream,
                group,
                range: None,
            });
        }
        let mut min_idle = 0u64;
        if args[2].eq_ignore_ascii_case(b"IDLE") {
            a.next_bytes()?;
            min_idle = a.next_i64_in("min-idle-time", i64::MIN, i64::MAX)?.max(0) as u64;
            if n < 7 {
                return Err(a.syntax());
            }
        }
        let (start, end) = (a.next_bytes()?, a.next_bytes()?);
        let count = a.next_i64_in("count", i64::MIN, i64::MAX)?.max(0) as usize;
        let start = id::range_start(start).map_err(feed_error)?;
        let end = id::range_end(end).map_err(feed_error)?;
        let consumer = if a.remaining() > 0 {
            Some(lossy(a.next_bytes()?))
        } else {
            None
        };
        a.done()?;
        let range = PendingRange {
            min_idle,
            start,
            end,
            count,
            consumer,
        };
        Ok(XPending {
            stream,
            group,
            range: Some(range),
        })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        run(self.run(ctx))
    }

    fn run(self, ctx: &mut Ctx<'_>) -> Result<Outcome, Reply> {
        let feed = feed(ctx)?;
        let g = lookup(&feed, &self.stream, &self.group, no_group)?;
        let now = feed.groups.now_ms();
        let reply = feed
            .groups
            .with(&g, |g| match &self.range {
                None => summary(g),
                Some(range) => listing(g, range, now),
            })
            .ok_or_else(gone)?;
        Ok(done(&feed, reply, 0))
    }
}

/// `[count, first id, last id, [[consumer, count]...]]`, or `[0, nil, nil, nil]`.
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

/// `[[id, consumer, idle ms, deliveries]...]` of the entries in the range.
fn listing(g: &Group, range: &PendingRange, now: u64) -> Reply {
    let Some(end) = range.end.filter(|end| range.start <= *end) else {
        return Reply::Array(Vec::new());
    };
    let ids: Box<dyn Iterator<Item = &Lsn>> = match &range.consumer {
        Some(c) => match g.consumers.get(c) {
            Some(c) => Box::new(c.pending.range(range.start..=end)),
            None => return Reply::Array(Vec::new()),
        },
        None => Box::new(g.pending.range(range.start..=end).map(|(id, _)| id)),
    };
    let mut out = Vec::new();
    for id in ids {
        if out.len() >= range.count {
            break;
        }
        let Some(nack) = g.pending.get(id) else {
            continue;
        };
        let idle = now.saturating_sub(nack.delivery_ms);
        if range.min_idle > 0 && idle < range.min_idle {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, error_text, syntax, BAD_ID};

    fn range(words: &[&str]) -> PendingRange {
        match XPending::parse(&argv(words)).unwrap().range {
            Some(r) => r,
            None => panic!("no range for {words:?}"),
        }
    }

    #[test]
    fn xpending_forms_parse() {
        let summary = XPending::parse(&argv(&["stockgate:events", "g"])).unwrap();
        assert_eq!(summary.range, None);
        assert_eq!(
            range(&["stockgate:events", "g", "-", "+", "10"]),
            PendingRange {
                min_idle: 0,
                start: 1,
                end: Some(u64::MAX),
                count: 10,
                consumer: None,
            }
        );
        assert_eq!(
            range(&[
                "stockgate:events",
                "g",
                "idle",
                "500",
                "(5",
                "(9-0",
                "-3",
                "c1"
            ]),
            PendingRange {
                min_idle: 500,
                start: 6,
                end: Some(8),
                count: 0,
                consumer: Some("c1".into()),
            }
        );
        // A negative idle time counts as 0, as in Redis; an empty range is no error.
        let r = range(&["stockgate:events", "g", "IDLE", "-5", "5", "(0-0", "1"]);
        assert_eq!((r.min_idle, r.end), (0, None));
    }

    #[test]
    fn xpending_refusals_in_words() {
        let err = |w: &[&str]| error_text(XPending::parse(&argv(w)));
        assert_eq!(err(&["stockgate:events", "g", "-"]), syntax("xpending"));
        assert_eq!(
            err(&["stockgate:events", "g", "-", "+"]),
            syntax("xpending")
        );
        assert_eq!(
            err(&["stockgate:events", "g", "IDLE", "5", "-", "+"]),
            syntax("xpending")
        );
        assert_eq!(err(&["stockgate:events", "g", "x", "+", "1"]), BAD_ID);
        assert_eq!(
            err(&["stockgate:events", "g", "-", "+", "ten"]),
            "ERR count is not an integer (must be between -9223372036854775808 and 9223372036854775807)"
        );
        assert_eq!(
            err(&["stockgate:events", "g", "IDLE", "1e3", "-", "+", "1"]),
            "ERR min-idle-time is not an integer (must be between -9223372036854775808 and 9223372036854775807)"
        );
    }
}
