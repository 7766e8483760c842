//! A sale's live counts over RESP: `SUBSCRIBE sale:<sku>:live` is sent, as ordinary
//! `message` pushes (RESP2 or RESP3), the JSON `/sale/<sku>/events` sends: once at once,
//! then on each change, at most every [`SAMPLE_EVERY`](super::SAMPLE_EVERY).
//!
//! A buyer follows its own place with the counts by `SUBSCRIBE place:<ticket>` (the
//! ticket `ROOM.JOIN` gave; it names the sale and the user): each message is the same JSON
//! with `"you"` added, as the event stream's `?user=&ticket=` has it. The ticket is checked
//! once, at the subscription.
//!
//! Each subscription is one watcher of the live [`Hub`] (the same sampler as the event
//! stream's, the same [`MAX_WATCHERS`](super::MAX_WATCHERS) bound), read through the
//! subscriber loop's [`Feed`]: one pending state per subscriber, never a queue.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;

use super::{Hub, Refused, Watch};
use crate::engine::{Engine, EngineError};
use crate::pubsub::{self, Feed, Feeds};
use stockgate_core::room::UserKey;

/// What a live channel's name begins with.
pub const PREFIX: &str = "sale:";
/// What a live channel's name ends with.
pub const SUFFIX: &str = ":live";

/// The sku a live channel names (`sale:<sku>:live`); `None` for any other channel.
pub fn channel_sku(channel: &[u8]) -> Option<&str> {
    let name = std::str::from_utf8(channel).ok()?;
    let sku = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    (!sku.is_empty()).then_some(sku)
}

/// What a buyer's channel's name begins with (`place:<ticket>`).
pub const PLACE_PREFIX: &str = "place:";

/// The sale, user and ticket a buyer's channel names (`place:<ticket>`, the ticket's
/// `t1|kid|sku|user|join|signature` read for its sale and user, checked when opened).
pub fn place_channel(channel: &[u8]) -> Option<(&str, &str, &str)> {
    let ticket = std::str::from_utf8(channel)
        .ok()?
        .strip_prefix(PLACE_PREFIX)?;
    let mut f = ticket.split('|');
    let (Some("t1"), Some(_kid), Some(sku), Some(user)) = (f.next(), f.next(), f.next(), f.next())
    else {
        return None;
    };
    (!sku.is_empty() && !user.is_empty()).then_some((sku, user, ticket))
}

/// A live hub over `engine` that also serves the live channels of `pubsub`; the metrics
/// endpoint's event streams take their watchers from the same hub.
pub fn attach(pubsub: &pubsub::Hub, engine: Arc<Engine>) -> Arc<Hub> {
    let hub = Arc::new(Hub::new(engine, super::MAX_WATCHERS));
    pubsub.serve_feeds(Arc::new(LiveChannels { hub: hub.clone() }));
    hub
}

/// The live channels, as the subscriber loop sees them.
pub struct LiveChannels {
    hub: Arc<Hub>,
}

impl LiveChannels {
    /// The live channels of `hub`'s sales.
    pub fn new(hub: Arc<Hub>) -> LiveChannels {
        LiveChannels { hub }
    }
}

impl Feeds for LiveChannels {
    fn owns(&self, channel: &[u8]) -> bool {
        channel_sku(channel).is_some() || channel.starts_with(PLACE_PREFIX.as_bytes())
    }

    fn open(&self, channel: &[u8]) -> Result<Box<dyn Feed>, String> {
        let (sku, place) = match channel_sku(channel) {
            Some(sku) => (sku, None),
            None => {
                let (sku, user, ticket) =
                    place_channel(channel).ok_or("BADTICKET ticket refused: malformed ticket")?;
                let key = self
                    .hub
                    .engine
                    .room_key(sku, user, ticket)
                    .map_err(place_refusal)?;
                (sku, Some(key))
            }
        };
        let place = place.map(|key| Place {
            engine: self.hub.engine.clone(),
            sku: sku.into(),
            key,
        });
        match self.hub.watch(sku) {
            Ok(w) => Ok(Box::new(LiveFeed::new(w, place))),
            Err(Refused::NoSale) => Err("NOSALE no such sale".into()),
            Err(Refused::Full) => Err(format!(
                "ERR max number of live watchers reached ({})",
                super::MAX_WATCHERS
            )),
        }
    }
}

/// The error reply (without its `-`) for a buyer's channel that is not opened.
fn place_refusal(e: EngineError) -> String {
    match e {
        EngineError::NoSale => "NOSALE no such sale".into(),
        EngineError::NoRoom => "NOROOM no waiting room for this sale".into(),
        e => format!("BADTICKET {e}"),
    }
}

/// Whose place a buyer's feed adds to each message.
struct Place {
    engine: Arc<Engine>,
    sku: Arc<str>,
    key: UserKey,
}

impl Place {
    /// The counts' JSON with this buyer's place as it is now.
    fn render(&self, counts: &[u8]) -> Bytes {
        let mut out = Vec::with_capacity(counts.len() + 64);
        let buyer = super::Buyer {
            key: self.key,
            hold: None,
        };
        super::with_place(&mut out, counts, &self.engine, &self.sku, &buyer);
        Bytes::from(out)
    }
}

/// Resolves with the watch's next counts (and the watch, for the change after).
type NextChange = Pin<Box<dyn Future<Output = (Bytes, Watch)> + Send>>;

fn next_change(mut w: Watch) -> NextChange {
    Box::pin(async move {
        w.changed().await;
        (w.latest_json(), w)
    })
}

/// One subscriber's feed of one sale: the counts when subscribed, then each change.
/// Holding it holds the watcher (and so the sale's sampler).
struct LiveFeed {
    first: Option<Bytes>,
    next: NextChange,
    place: Option<Place>,
}

impl LiveFeed {
    fn new(mut w: Watch, place: Option<Place>) -> LiveFeed {
        LiveFeed {
            first: Some(w.latest_json()),
            next: next_change(w),
            place,
        }
    }

    fn message(&self, counts: Bytes) -> Bytes {
        match &self.place {
            Some(p) => p.render(&counts),
            None => counts,
        }
    }
}

impl Feed for LiveFeed {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Bytes> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(self.message(first));
        }
        let (json, w) = ready!(self.next.as_mut().poll(cx));
        self.next = next_change(w);
        Poll::Ready(self.message(json))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::engine;
    use super::*;
    use crate::pubsub::Clients;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    #[test]
    fn channel_names() {
        assert_eq!(channel_sku(b"sale:AB:live"), Some("AB"));
        assert_eq!(channel_sku(b"sale:a:b:live"), Some("a:b"));
        assert_eq!(channel_sku(b"sale::live"), None);
        assert_eq!(channel_sku(b"sale:AB"), None);
        assert_eq!(channel_sku(b"__sentinel__:hello"), None);
        assert_eq!(channel_sku(b"sale:\xff:live"), None);
    }

    /// Reads from `c` until what was read contains `want` (within 5 s): all of it.
    async fn read_until(c: &mut DuplexStream, got: &mut Vec<u8>, want: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !String::from_utf8_lossy(got).contains(want) {
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout_at(deadline, c.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("no {want:?} in {:?}", String::from_utf8_lossy(got)))
                .unwrap();
            assert!(n > 0, "closed");
            got.extend_from_slice(&buf[..n]);
        }
    }

    /// The subscriber loop on `server`, subscribed to `sale:S1:live`, sending with
    /// `write_timeout`; resolves with whether it handed the connection back.
    fn spawn_subscriber(
        ps: &pubsub::Hub,
        mut server: DuplexStream,
        write_timeout: Duration,
    ) -> tokio::task::JoinHandle<bool> {
        let ps = ps.clone();
        tokio::spawn(async move {
            let back = pubsub::subscriber(
                ps,
                Clients::default(),
                1,
                2,
                &mut server,
                Default::default(),
                (false, vec![Bytes::from_static(b"sale:S1:live")]),
                (Default::default(), 1 << 20, write_timeout),
            )
            .await;
            matches!(back, crate::takeover::Handback::Resume(_))
        })
    }

    /// A subscriber that does not read costs one pending state, not a queue: when it
    /// reads again it gets what was being written and then the newest counts. One that
    /// never reads is dropped after the write timeout, and its watcher with it.
    #[tokio::test]
    async fn a_slow_subscriber_skips_to_the_newest_and_a_stuck_one_is_dropped() {
        let e = engine();
        e.create_sale("S1", 100, Some(1), None, None).unwrap();
        let ps = pubsub::Hub::default();
        let live = attach(&ps, e.clone());
        // 64 bytes in flight: the first message already fills the pipe.
        let (mut client, server) = tokio::io::duplex(64);
        let task = spawn_subscriber(&ps, server, Duration::from_secs(10));
        while live.watchers() == 0 {
            tokio::task::yield_now().await;
        }
        for _ in 0..6 {
            e.adjust("S1", -1).unwrap();
            tokio::time::sleep(super::super::SAMPLE_EVERY * 2).await;
        }
        let mut got = Vec::new();
        read_until(&mut client, &mut got, "\"available\":94,").await;
        let text = String::from_utf8_lossy(&got).into_owned();
        let sent = text.matches("\"available\":").count();
        assert!(sent <= 3, "6 changes unread, {sent} messages: {text}");
        assert!(text.contains("\"available\":100,"), "{text}");
        client.write_all(b"UNSUBSCRIBE\r\n").await.unwrap();
        read_until(
            &mut client,
            &mut got,
            "unsubscribe\r\n$12\r\nsale:S1:live\r\n:0\r\n",
        )
        .await;
        assert!(task.await.unwrap());

        let (_client, server) = tokio::io::duplex(64);
        let t0 = std::time::Instant::now();
        let task = spawn_subscriber(&ps, server, Duration::from_millis(300));
        e.adjust("S1", -1).unwrap();
        let back = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("dropped after the write timeout")
            .unwrap();
        assert!(!back, "closed, not handed back");
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert_eq!((live.sampled_sales(), live.watchers()), (0, 0));
    }

    /// The subscriber loop with a live channel: the counts at once, a change, an
    /// unknown sale refused, PUBLISH refused, and the sampler gone with the
    /// subscription.
    #[tokio::test]
    async fn a_subscriber_gets_the_counts_and_unsubscribing_stops_the_sampler() {
        let e = engine();
        e.create_sale("S1", 5, Some(1), None, None).unwrap();
        let ps = pubsub::Hub::default();
        let live = attach(&ps, e.clone());
        assert!(ps.owned(b"sale:S1:live") && !ps.owned(b"news"));
        assert_eq!(ps.publish(b"sale:S1:live", b"x"), 0);
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let task = spawn_subscriber(&ps, server, Duration::from_secs(5));
        let mut got = Vec::new();
        read_until(&mut client, &mut got, "\"available\":5,").await;
        let text = String::from_utf8_lossy(&got).into_owned();
        assert!(
            text.starts_with("*3\r\n$9\r\nsubscribe\r\n$12\r\nsale:S1:live\r\n:1\r\n*3\r\n$7\r\nmessage\r\n$12\r\nsale:S1:live\r\n"),
            "{text}"
        );
        assert_eq!((live.sampled_sales(), live.watchers()), (1, 1));
        // An event stream of the same sale shares the sampler.
        let sse = live.watch("S1").unwrap();
        assert_eq!((live.sampled_sales(), live.watchers()), (1, 2));
        drop(sse);
        e.adjust("S1", -2).unwrap();
        read_until(&mut client, &mut got, "\"available\":3,").await;
        client
            .write_all(b"SUBSCRIBE sale:NOPE:live\r\n")
            .await
            .unwrap();
        read_until(&mut client, &mut got, "-NOSALE no such sale\r\n").await;
        client.write_all(b"UNSUBSCRIBE\r\n").await.unwrap();
        let back = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        assert!(back, "back to commands after the last UNSUBSCRIBE");
        assert_eq!((live.sampled_sales(), live.watchers()), (0, 0));
    }
}
