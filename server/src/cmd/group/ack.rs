//! `XACK key group id...`: how many of the ids were pending and are not any more.

use super::{done, lookup, no_group, run};
use crate::cmd::args::Args;
use crate::cmd::feed_reply::{feed, feed_error};
use crate::cmd::{Ctx, Outcome};
use crate::engine::Lsn;
use crate::feed::groups::GroupRecord;
use crate::feed::{id, Stream};
use crate::protocol::Reply;

/// `XACK stream group id...`: the consumer group has the entries; they leave its
/// pending list.
#[derive(Debug, PartialEq, Eq)]
pub struct XAck {
    stream: Stream,
    group: Vec<u8>,
    /// The ids an entry can have (`<lsn>-0`); an id with a sequence number is no entry.
    ids: Vec<Lsn>,
}

impl XAck {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("xack", args);
        let stream = Stream::parse(a.next_bytes()?).map_err(feed_error)?;
        let group = a.next_bytes()?.to_vec();
        let mut ids = Vec::with_capacity(a.remaining());
        while a.remaining() > 0 {
            // All ids are checked before anything changes (Redis: all or nothing).
            if let Some(id) = id::exact(a.next_bytes()?).map_err(feed_error)? {
                ids.push(id);
            }
        }
        Ok(XAck { stream, group, ids })
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        run(self.run(ctx))
    }

    fn run(self, ctx: &mut Ctx<'_>) -> Result<Outcome, Reply> {
        let XAck {
            stream,
            group,
            mut ids,
        } = self;
        let feed = feed(ctx)?;
        let Ok(g) = lookup(&feed, &stream, &group, no_group) else {
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
                let before = g.pending.len();
                let rec = GroupRecord::Acked {
                    stream: stream.name(),
                    group: g.name.clone(),
                    ids: std::mem::take(&mut ids),
                };
                let lsn = feed.groups.change(g, rec);
                debug_assert_eq!(before - g.pending.len(), n as usize);
                (n, lsn)
            })
            .unwrap_or((0, 0));
        Ok(done(&feed, Reply::Int(n), lsn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, arity, error_text, BAD_ID, UNKNOWN_STREAM};

    #[test]
    fn xack_keeps_entry_ids_and_refuses_a_bad_one() {
        let ack = XAck::parse(&argv(&["stockgate:events", "g", "5-0", "6", "7-1", "5"])).unwrap();
        // 7-1 has a sequence number: no entry of the feed has that id.
        assert_eq!(ack.ids, vec![5, 6, 5]);
        assert_eq!(ack.group, b"g");
        assert!(XAck::parse(&argv(&["stockgate:events", "g"]))
            .unwrap()
            .ids
            .is_empty());
        let err = |w: &[&str]| error_text(XAck::parse(&argv(w)));
        assert_eq!(err(&["stockgate:events", "g", "5", "nope"]), BAD_ID);
        assert_eq!(err(&["orders", "g", "5"]), UNKNOWN_STREAM);
        assert_eq!(err(&["stockgate:events"]), arity("xack"));
    }
}
