//! `XGROUP CREATE|SETID|DESTROY|CREATECONSUMER|DELCONSUMER|HELP`: a group's life and its
//! consumers'.

use super::{
    done, gone, group_last, help, lookup, lossy, no_group_for_key, run, subcommand_error,
    too_many_consumers,
};
use crate::cmd::args::Args;
use crate::cmd::feed_reply::{feed, feed_error};
use crate::cmd::{Ctx, Outcome};
use crate::engine::Lsn;
use crate::feed::groups::GroupRecord;
use crate::feed::{Feed, FeedError, Stream};
use crate::protocol::Reply;

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

/// One `XGROUP` subcommand. Group and consumer names stay bytes until the feed's limits
/// check them; ids stay bytes because `$` is the log's end when the command runs.
#[derive(Debug, PartialEq, Eq)]
pub enum XGroup {
    /// `HELP`: the subcommands, one line each.
    Help,
    /// `CREATE`: a new group on `stream` that starts after `id`.
    Create {
        /// The feed stream the group reads.
        stream: Stream,
        /// The group's name.
        group: Vec<u8>,
        /// The entry the group has seen up to (`$` for the end, `0` for the start).
        id: Vec<u8>,
    },
    /// `SETID`: moves the group's last-delivered id.
    SetId {
        /// The feed stream the group reads.
        stream: Stream,
        /// The group's name.
        group: Vec<u8>,
        /// The new last-delivered id.
        id: Vec<u8>,
    },
    /// `DESTROY`: drops the group and its pending entries.
    Destroy {
        /// The feed stream the group reads.
        stream: Stream,
        /// The group's name.
        group: Vec<u8>,
    },
    /// `CREATECONSUMER` (`create`) or `DELCONSUMER`.
    Consumer {
        /// The feed stream the group reads.
        stream: Stream,
        /// The group's name.
        group: Vec<u8>,
        /// The consumer's name.
        consumer: Vec<u8>,
        /// True to create the consumer, false to delete it and its pending entries.
        create: bool,
    },
}

impl XGroup {
    /// Reads the arguments after the command name; a refusal is the error reply to send.
    pub fn parse(args: &[&[u8]]) -> Result<Self, Reply> {
        let mut a = Args::new("xgroup", args);
        let sub = a.next_keyword()?;
        if sub == "HELP" && args.len() == 1 {
            return Ok(XGroup::Help);
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
            return Err(subcommand_error(&sub, "XGROUP"));
        }
        let stream = Stream::parse(a.next_bytes()?).map_err(feed_error)?;
        let group = a.next_bytes()?.to_vec();
        let parsed = match sub.as_str() {
            "CREATE" => {
                let id = a.next_bytes()?.to_vec();
                create_options(&mut a, &sub)?;
                XGroup::Create { stream, group, id }
            }
            "SETID" => {
                let id = a.next_bytes()?.to_vec();
                if a.remaining() > 0 {
                    if a.next_keyword()? != "ENTRIESREAD" {
                        return Err(subcommand_error(&sub, "XGROUP"));
                    }
                    a.next_i64_in("entries-read", -1, i64::MAX)?;
                }
                XGroup::SetId { stream, group, id }
            }
            "DESTROY" => XGroup::Destroy { stream, group },
            _ => XGroup::Consumer {
                stream,
                group,
                consumer: a.next_bytes()?.to_vec(),
                create: sub == "CREATECONSUMER",
            },
        };
        debug_assert_eq!(a.remaining(), 0, "XGROUP {sub}: every argument parsed");
        Ok(parsed)
    }

    /// Runs the parsed command against the connection's context and gives its reply.
    pub fn apply(self, ctx: &mut Ctx<'_>) -> Outcome {
        if self == XGroup::Help {
            return help(HELP_XGROUP).into();
        }
        run(feed(ctx).and_then(|feed| self.run(&feed)))
    }

    fn run(self, feed: &Feed) -> Result<Outcome, Reply> {
        match self {
            XGroup::Help => Ok(help(HELP_XGROUP).into()),
            XGroup::Create { stream, group, id } => {
                let last = group_last(feed, &id)?;
                let name = feed
                    .groups
                    .check_name("group", &group)
                    .map_err(feed_error)?;
                let lsn = feed
                    .groups
                    .create(&stream, name, last)
                    .map_err(feed_error)?;
                Ok(done(feed, Reply::ok(), lsn))
            }
            XGroup::SetId { stream, group, id } => {
                let g = lookup(feed, &stream, &group, no_group_for_key)?;
                let last = group_last(feed, &id)?;
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
                Ok(done(feed, Reply::ok(), lsn))
            }
            XGroup::Destroy { stream, group } => {
                let lsn = std::str::from_utf8(&group)
                    .ok()
                    .and_then(|g| feed.groups.destroy(&stream, g));
                let n = i64::from(lsn.is_some());
                Ok(done(feed, Reply::Int(n), lsn.unwrap_or(0)))
            }
            XGroup::Consumer {
                stream,
                group,
                consumer,
                create,
            } => change_consumer(feed, &stream, &group, &consumer, create),
        }
    }
}

/// `CREATE`'s options after the id: `MKSTREAM` (the feed's streams always exist) and
/// `ENTRIESREAD n` (Redis's internal counter: accepted, not kept; lag is computed).
fn create_options(a: &mut Args<'_>, sub: &str) -> Result<(), Reply> {
    while a.remaining() > 0 {
        match a.next_keyword()?.as_str() {
            "MKSTREAM" => {}
            "ENTRIESREAD" if a.remaining() > 0 => {
                a.next_i64_in("entries-read", -1, i64::MAX)?;
            }
            _ => return Err(subcommand_error(sub, "XGROUP")),
        }
    }
    Ok(())
}

/// `CREATECONSUMER` (1 if created, 0 if it existed) or `DELCONSUMER` (the pending
/// entries it had, 0 if there was no such consumer).
fn change_consumer(
    feed: &Feed,
    stream: &Stream,
    group: &[u8],
    consumer: &[u8],
    create: bool,
) -> Result<Outcome, Reply> {
    let g = lookup(feed, stream, group, no_group_for_key)?;
    let max = feed.groups.limits.max_consumers;
    let consumer = if create {
        feed.groups
            .check_name("consumer", consumer)
            .map_err(feed_error)?
    } else {
        lossy(consumer)
    };
    let (n, lsn) = feed
        .groups
        .with(&g, |g| -> Result<(i64, Lsn), FeedError> {
            let exists = g.consumers.get(&consumer).map(|c| c.pending.len());
            match (create, exists) {
                (true, Some(_)) | (false, None) => return Ok((0, 0)),
                (true, None) if g.consumers.len() >= max => return Err(too_many_consumers(g, max)),
                _ => {}
            }
            let rec = GroupRecord::Consumer {
                stream: stream.name(),
                group: g.name.clone(),
                consumer: consumer.clone(),
                at_ms: feed.groups.now_ms(),
                delete: !create,
            };
            let lsn = feed.groups.change(g, rec);
            debug_assert_eq!(g.consumers.contains_key(&consumer), create);
            Ok((exists.map_or(1, |p| p as i64), lsn))
        })
        .ok_or_else(gone)?
        .map_err(feed_error)?;
    Ok(done(feed, Reply::Int(n), lsn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::parse_tests::{argv, error_text, UNKNOWN_STREAM};

    fn parse(words: &[&str]) -> Result<XGroup, Reply> {
        XGroup::parse(&argv(words))
    }

    fn sub_error(sub: &str) -> String {
        format!("ERR unknown subcommand or wrong number of arguments for '{sub}'. Try XGROUP HELP.")
    }

    #[test]
    fn xgroup_forms_parse_with_options_in_any_order() {
        let create = |words: &[&str]| parse(words).unwrap();
        let want = XGroup::Create {
            stream: Stream::All,
            group: b"g".to_vec(),
            id: b"$".to_vec(),
        };
        assert_eq!(create(&["create", "stockgate:events", "g", "$"]), want);
        assert_eq!(
            create(&[
                "CREATE",
                "stockgate:events",
                "g",
                "$",
                "MKSTREAM",
                "ENTRIESREAD",
                "3"
            ]),
            want
        );
        assert_eq!(
            create(&[
                "CREATE",
                "stockgate:events",
                "g",
                "$",
                "entriesread",
                "-1",
                "mkstream"
            ]),
            want
        );
        assert_eq!(
            create(&["SETID", "{S-1}:events", "g", "0", "ENTRIESREAD", "7"]),
            XGroup::SetId {
                stream: Stream::Sale("S-1".into()),
                group: b"g".to_vec(),
                id: b"0".to_vec(),
            }
        );
        assert_eq!(
            create(&["DESTROY", "stockgate:events", "g"]),
            XGroup::Destroy {
                stream: Stream::All,
                group: b"g".to_vec(),
            }
        );
        assert_eq!(
            create(&["DELCONSUMER", "stockgate:events", "g", "c"]),
            XGroup::Consumer {
                stream: Stream::All,
                group: b"g".to_vec(),
                consumer: b"c".to_vec(),
                create: false,
            }
        );
        assert_eq!(create(&["help"]), XGroup::Help);
    }

    #[test]
    fn xgroup_refusals_in_words() {
        for (words, want) in [
            (&["HELP", "x"][..], sub_error("HELP")),
            (&["NOPE", "stockgate:events", "g"], sub_error("NOPE")),
            (&["CREATE", "stockgate:events", "g"], sub_error("CREATE")),
            (
                &["SETID", "stockgate:events", "g", "0", "X"],
                sub_error("SETID"),
            ),
            (
                &["SETID", "stockgate:events", "g", "0", "X", "1"],
                sub_error("SETID"),
            ),
            (&["DESTROY", "stockgate:events"], sub_error("DESTROY")),
            (
                &["CREATECONSUMER", "stockgate:events", "g"],
                sub_error("CREATECONSUMER"),
            ),
            (
                &["CREATE", "stockgate:events", "g", "$", "BOGUS"],
                sub_error("CREATE"),
            ),
            (&["CREATE", "orders", "g", "$"], UNKNOWN_STREAM.to_owned()),
            (
                &["CREATE", "stockgate:events", "g", "$", "ENTRIESREAD", "-2"],
                "ERR entries-read must be between -1 and 9223372036854775807".to_owned(),
            ),
            (
                &["SETID", "stockgate:events", "g", "$", "ENTRIESREAD", "many"],
                "ERR entries-read is not an integer (must be between -1 and 9223372036854775807)"
                    .to_owned(),
            ),
        ] {
            assert_eq!(error_text(parse(words)), want, "{words:?}");
        }
    }
}
