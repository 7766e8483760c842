//! What the order feed's commands (`cmd::stream`, `cmd::group`) share: the feed itself,
//! its errors and entries as replies, and the `COUNT` argument.

use std::sync::Arc;

use super::args::Args;
use super::Ctx;
use crate::feed::{Entry, Feed, FeedError};
use crate::protocol::reply::from_feed_error;
use crate::protocol::Reply;

/// The feed, or the error a server without one answers.
pub(super) fn feed(ctx: &Ctx<'_>) -> Result<Arc<Feed>, Reply> {
    ctx.shared
        .feed
        .get()
        .cloned()
        .ok_or_else(|| from_feed_error(&FeedError::NoLog))
}

/// A feed error as its reply.
pub(super) fn feed_error(e: FeedError) -> Reply {
    from_feed_error(&e)
}

/// One entry: `[id, [field, value, ...]]`, as Redis.
pub(super) fn entry_reply(e: Entry) -> Reply {
    let mut kv = Vec::with_capacity(e.fields.len() * 2);
    let id = e.id();
    for (k, v) in e.fields {
        kv.push(Reply::bulk(k));
        kv.push(Reply::Bulk(v.into_bytes()));
    }
    Reply::Array(vec![Reply::Bulk(id.into_bytes()), Reply::Array(kv)])
}

/// `COUNT n` of XREAD, XRANGE, XREADGROUP...: 0 up to `i64::MAX`.
pub(super) fn parse_count(a: &mut Args<'_>) -> Result<u64, Reply> {
    a.next_u64_in("count", 0, i64::MAX as u64)
}
