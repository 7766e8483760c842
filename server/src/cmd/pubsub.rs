//! PUBLISH, SUBSCRIBE/PSUBSCRIBE and UNSUBSCRIBE outside subscriber mode: the
//! connection is handed to `crate::pubsub`'s subscriber loop and back.

use bytes::Bytes;

use super::{Ctx, Outcome};
use crate::protocol::Reply;

/// `PUBLISH channel message`: the number of subscribers that received it. Refused on
/// the channels the server publishes on itself (a sale's live counts): their
/// subscribers trust what arrives there.
pub fn publish(ctx: &mut Ctx<'_>, args: &[&[u8]]) -> Outcome {
    if ctx.shared.pubsub.owned(args[0]) {
        return Reply::err("ERR this channel is published by the server only").into();
    }
    Reply::Int(ctx.shared.pubsub.publish(args[0], args[1]) as i64).into()
}

/// `SUBSCRIBE` / `PSUBSCRIBE` (`patterns`): hands the connection to the subscriber loop.
pub fn subscribe(ctx: &mut Ctx<'_>, args: &[&[u8]], patterns: bool) -> Outcome {
    let (hub, clients) = (ctx.shared.pubsub.clone(), ctx.shared.clients.clone());
    let live = &ctx.shared.live;
    let (id, proto, limits) = (
        ctx.conn.id,
        ctx.conn.proto,
        (
            ctx.shared.config.limits.clone(),
            live.max_query_buffer(),
            std::time::Duration::from_millis(live.write_timeout_ms().max(1)),
        ),
    );
    // The subscriber loop outlives the read buffer these arguments point into.
    let first = args.iter().map(|a| Bytes::copy_from_slice(a)).collect();
    Outcome::takeover(crate::takeover::takeover(move |stream, inbuf| {
        Box::pin(crate::pubsub::subscriber(
            hub,
            clients,
            id,
            proto,
            stream,
            inbuf,
            (patterns, first),
            limits,
        ))
    }))
}

/// `(P)UNSUBSCRIBE` outside subscriber mode: nothing to leave (Redis's answer).
pub fn unsubscribe(args: &[&[u8]], what: &str) -> Outcome {
    let ch = args.first().map_or(Reply::Nil, |c| Reply::Bulk(c.to_vec()));
    Reply::Array(vec![Reply::bulk(what), ch, Reply::Int(0)]).into()
}
