//! `XINFO GROUPS key` and `XINFO CONSUMERS key group` (`cmd::stream` parses XINFO).

use super::{help, id_reply, lookup, no_group_for_key, subcommand_error};
use crate::feed::{Feed, Stream};
use crate::protocol::Reply;

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
    let g = lookup(feed, stream, group, no_group_for_key)?;
    let now = feed.groups.now_ms();
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

/// `XINFO HELP`: the subcommands, one line each.
pub fn xinfo_help() -> Reply {
    help(HELP_XINFO)
}

/// Redis's error for an unknown `XINFO` subcommand.
pub fn xinfo_sub_err(sub: &str) -> Reply {
    subcommand_error(sub, "XINFO")
}
