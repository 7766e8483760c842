//! What buyers watch: `GET /sale/<sku>/events`, a sale's live counts as Server-Sent
//! Events on the metrics endpoint, and the counts the buyer page (`/sale/<sku>`) shows.
//!
//! Coalesced: one sampler task per watched sale (started by its first watcher, stopped
//! with its last) reads the counts every [`READ_EVERY`] and publishes them on a
//! `tokio::sync::watch` channel when they changed, at most once per [`SAMPLE_EVERY`]. A
//! watcher holds one receiver of that channel, which keeps only the latest value: a
//! watcher that reads slowly (or not at all) skips the counts it missed and is sent the
//! newest, so it costs one pending event, never a queue; one whose writes stay blocked
//! for [`WRITE_TIMEOUT`] is disconnected. N watchers of a sale cost one sampler and one
//! write each per change.
//!
//! A buyer's page also asks for its own place (`?user=U&ticket=T`): the ticket is checked
//! once, when the stream opens, and each event then carries the place as the room has it
//! (`"you"`), read by the key the check gave (a map lookup under the room's lock, no
//! signature or hash per event).
//!
//! The same feed reaches RESP subscribers of `sale:<sku>:live` ([`resp`]): a sale watched
//! over both costs one sampler, and each change's JSON is rendered once, by the sampler.
//!
//! The counts are read-only engine reads: SALE.INFO's figures (`Engine::sale_info`,
//! under the sale's admin lock) and ROOM.INFO's (`Engine::room_info`, the room's mutex).
//! Nothing is logged and nothing moves.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::engine::{Engine, EngineError};
use stockgate_core::room::{Status, UserKey};

pub mod resp;

/// Shortest time between two events of one sale (so at most 10 a second per sale).
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How often a watched sale's counts are read: a change after a quiet spell goes out
/// within this, not up to a whole [`SAMPLE_EVERY`] later. A read is two short locked
/// reads (the sale's counters, the room's sizes), so 50 a second per watched sale cost
/// nothing next to the writes an event makes.
pub const READ_EVERY: Duration = Duration::from_millis(20);
/// A comment line is sent when nothing changed for this long (proxies close idle
/// connections; a dead watcher is found by the failed write).
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// A watcher whose socket accepts nothing for this long is disconnected.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Watchers of all sales together; one more is answered 503.
pub const MAX_WATCHERS: usize = 100_000;

/// A sale's live counts: what one event carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Units anyone may still reserve.
    pub available: i64,
    /// Units held by live reservations.
    pub held: u64,
    /// Units sold (committed).
    pub sold: u64,
    /// Buyers waiting in the sale's room (0 without a room).
    pub waiting: u32,
    /// Buyers admitted who have not reserved yet (0 without a room).
    pub admitted: u64,
    /// Whether the sale has a waiting room.
    pub room: bool,
    /// SALE.INFO's state word; `GONE` once the sale was dropped or moved away.
    pub state: &'static str,
}

/// The counts of `sku` now; `None` if the engine has no such sale.
pub fn counts(engine: &Engine, sku: &str) -> Option<Counts> {
    let v = engine.sale_info(sku).ok()?;
    let room = engine.room_info(sku).ok();
    Some(Counts {
        available: v.available,
        held: v.reserved,
        sold: v.committed,
        waiting: room.as_ref().map_or(0, |r| r.waiting),
        admitted: room.as_ref().map_or(0, |r| r.admitted),
        room: room.is_some(),
        state: v.state.as_str(),
    })
}

impl Counts {
    /// The event's JSON.
    pub fn json(&self, sku: &str) -> String {
        let mut o = String::with_capacity(160);
        let _ = write!(
            o,
            "{{\"sku\":{},\"available\":{},\"held\":{},\"sold\":{},\"waiting\":{},\"admitted\":{},\"room\":{},\"state\":\"{}\"}}",
            json_str(sku),
            self.available,
            self.held,
            self.sold,
            self.waiting,
            self.admitted,
            self.room,
            self.state
        );
        o
    }

    fn gone() -> Counts {
        Counts {
            available: 0,
            held: 0,
            sold: 0,
            waiting: 0,
            admitted: 0,
            room: false,
            state: "GONE",
        }
    }
}

/// A JSON string literal (also safe inside HTML: `<`, `>` and `&` are escaped).
pub fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '<' | '>' | '&' => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// What the sampler publishes: the counts and their JSON, rendered once per change for
/// every watcher.
#[derive(Clone, Debug)]
struct Latest {
    counts: Counts,
    json: Bytes,
}

impl Latest {
    fn new(counts: Counts, sku: &str) -> Latest {
        let json = Bytes::from(counts.json(sku));
        Latest { counts, json }
    }
}

/// Why a watcher was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No such sale: 404.
    NoSale,
    /// [`MAX_WATCHERS`] (or the hub's limit) reached: 503.
    Full,
}

/// One watched sale: its sampler and the channel it publishes on. Dropped with its last
/// watcher, which stops the sampler.
struct Feed {
    rx: watch::Receiver<Latest>,
    sampler: JoinHandle<()>,
    sku: Arc<str>,
    feeds: Weak<Mutex<HashMap<Arc<str>, Weak<Feed>>>>,
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.sampler.abort();
        if let Some(feeds) = self.feeds.upgrade() {
            let mut m = feeds.lock();
            // A new watcher may have started a new feed meanwhile: remove only a dead one.
            if m.get(&self.sku).is_some_and(|w| w.strong_count() == 0) {
                m.remove(&self.sku);
            }
        }
    }
}

/// The watched sales and the watcher count.
pub struct Hub {
    engine: Arc<Engine>,
    feeds: Arc<Mutex<HashMap<Arc<str>, Weak<Feed>>>>,
    watchers: Arc<AtomicUsize>,
    max_watchers: usize,
}

/// One watcher's hold on its sale's feed (and its place in the watcher count).
pub struct Watch {
    feed: Arc<Feed>,
    rx: watch::Receiver<Latest>,
    watchers: Arc<AtomicUsize>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.watchers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Watch {
    /// The latest counts, marked as seen.
    pub fn latest(&mut self) -> Counts {
        self.rx.borrow_and_update().counts.clone()
    }

    /// The latest counts as their JSON (what an event carries), marked as seen.
    pub fn latest_json(&mut self) -> Bytes {
        self.rx.borrow_and_update().json.clone()
    }

    /// Waits for counts newer than the last seen (never resolves if the sampler stopped,
    /// which it does only with the hub's runtime).
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The sale watched.
    pub fn sku(&self) -> &str {
        &self.feed.sku
    }
}

impl Hub {
    /// A hub over `engine` taking at most `max_watchers` watchers.
    pub fn new(engine: Arc<Engine>, max_watchers: usize) -> Hub {
        Hub {
            engine,
            feeds: Arc::new(Mutex::new(HashMap::new())),
            watchers: Arc::new(AtomicUsize::new(0)),
            max_watchers,
        }
    }

    /// Watchers connected now.
    pub fn watchers(&self) -> usize {
        self.watchers.load(Ordering::Relaxed)
    }

    /// Sales with a running sampler.
    pub fn sampled_sales(&self) -> usize {
        self.feeds
            .lock()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    /// A new watcher of `sku` (must run inside the tokio runtime: it may start a sampler).
    pub fn watch(&self, sku: &str) -> Result<Watch, Refused> {
        if self.watchers.fetch_add(1, Ordering::Relaxed) >= self.max_watchers {
            self.watchers.fetch_sub(1, Ordering::Relaxed);
            return Err(Refused::Full);
        }
        // From here the count is given back by `Watch`'s drop, or below.
        let feed = match self.feed(sku) {
            Some(f) => f,
            None => {
                self.watchers.fetch_sub(1, Ordering::Relaxed);
                return Err(Refused::NoSale);
            }
        };
        let rx = feed.rx.clone();
        Ok(Watch {
            feed,
            rx,
            watchers: self.watchers.clone(),
        })
    }

    fn feed(&self, sku: &str) -> Option<Arc<Feed>> {
        let mut m = self.feeds.lock();
        if let Some(f) = m.get(sku).and_then(Weak::upgrade) {
            return Some(f);
        }
        let first = Latest::new(counts(&self.engine, sku)?, sku);
        let (tx, rx) = watch::channel(first);
        let sku: Arc<str> = sku.into();
        let sampler = tokio::spawn(sample(self.engine.clone(), sku.clone(), tx));
        let feed = Arc::new(Feed {
            rx,
            sampler,
            sku: sku.clone(),
            feeds: Arc::downgrade(&self.feeds),
        });
        m.insert(sku, Arc::downgrade(&feed));
        Some(feed)
    }
}

/// The sampler of one sale: reads its counts every [`READ_EVERY`] and publishes a change,
/// at most one per [`SAMPLE_EVERY`] (a change sooner waits for the rest of that time and
/// goes out with whatever else changed meanwhile).
async fn sample(engine: Arc<Engine>, sku: Arc<str>, tx: watch::Sender<Latest>) {
    let mut iv = tokio::time::interval(READ_EVERY);
    iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    iv.tick().await;
    let mut sent = tokio::time::Instant::now();
    loop {
        iv.tick().await;
        let now = counts(&engine, &sku).unwrap_or_else(Counts::gone);
        if tx.borrow().counts == now {
            continue;
        }
        let since = sent.elapsed();
        if since < SAMPLE_EVERY {
            // The next tick comes at once after this and reads the counts again.
            tokio::time::sleep(SAMPLE_EVERY - since).await;
            continue;
        }
        tx.send_replace(Latest::new(now, &sku));
        sent = tokio::time::Instant::now();
    }
}

/// `/sale/<sku>/events` → the sku (percent-decoded); `None` for any other path.
pub fn events_sku(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/sale/")?;
    let raw = rest.strip_suffix("/events")?;
    if raw.is_empty() || raw.contains('/') {
        return None;
    }
    Some(percent_decode(raw))
}

/// `/sale/<sku>` → the sku (percent-decoded).
pub fn page_sku(path: &str) -> Option<String> {
    let raw = path.strip_prefix("/sale/")?;
    if raw.is_empty() || raw.contains('/') {
        return None;
    }
    Some(percent_decode(raw))
}

/// `%XX` decoded (lossy UTF-8); a malformed escape is kept as it is.
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `s` safe as HTML text or a quoted attribute value.
pub fn html_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const PAGE: &str = include_str!("sale.html");

/// The buyer page of `sku`: 200 with the page if the sale exists, else 404 saying so
/// (the sku is escaped either way).
pub fn page(engine: &Engine, sku: &str) -> (&'static str, String) {
    let exists = engine.sale_info(sku).is_ok();
    let body = PAGE.replace("{{SKU}}", &html_escape(sku));
    if exists {
        ("200 OK", body)
    } else {
        let msg = format!(
            "<!doctype html><meta charset=\"utf-8\"><title>no sale</title><p>No sale {}.</p>\n",
            html_escape(sku)
        );
        ("404 Not Found", msg)
    }
}

/// Serves one watcher on `s` (the request already read): 404 for an unknown sale, 503
/// when full, else the event stream until the watcher goes or a write stays blocked.
pub async fn serve_events<S>(hub: &Hub, s: S, sku: &str, query: &str)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (mut rd, mut wr) = tokio::io::split(s);
    let you = match buyer_key(hub, sku, query) {
        Ok(you) => you,
        Err((status, body)) => return refuse_events(&mut wr, status, &body).await,
    };
    let mut w = match hub.watch(sku) {
        Ok(w) => w,
        Err(why) => {
            let (status, body) = match why {
                Refused::NoSale => ("404 Not Found", "no such sale\n"),
                Refused::Full => ("503 Service Unavailable", "too many watchers\n"),
            };
            return refuse_events(&mut wr, status, body).await;
        }
    };
    let mut out = Vec::from(
        &b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\nX-Accel-Buffering: no\r\nConnection: close\r\n\r\nretry: 2000\n\n"[..],
    );
    let mut next = Some(w.latest_json());
    let mut scratch = [0u8; 256];
    // One keep-alive timer for the stream's life, moved only when it fires: a timer made
    // per event would cost every watcher a timer-wheel insert and removal per change.
    let keep_alive = tokio::time::sleep(KEEP_ALIVE);
    tokio::pin!(keep_alive);
    let mut wrote_at = tokio::time::Instant::now();
    loop {
        if let Some(json) = next.take() {
            out.extend_from_slice(b"data: ");
            match &you {
                Some(buyer) => with_place(&mut out, &json, &hub.engine, sku, buyer),
                None => out.extend_from_slice(&json),
            }
            out.extend_from_slice(b"\n\n");
        }
        if !out.is_empty() {
            let wrote = tokio::time::timeout(WRITE_TIMEOUT, async {
                wr.write_all(&out).await?;
                wr.flush().await
            })
            .await;
            if !matches!(wrote, Ok(Ok(()))) {
                return;
            }
            out.clear();
            wrote_at = tokio::time::Instant::now();
        }
        tokio::select! {
            _ = w.changed() => next = Some(w.latest_json()),
            _ = &mut keep_alive => {
                let due = wrote_at + KEEP_ALIVE;
                if tokio::time::Instant::now() >= due {
                    out.extend_from_slice(b": keep-alive\n\n");
                    keep_alive.as_mut().reset(tokio::time::Instant::now() + KEEP_ALIVE);
                } else {
                    keep_alive.as_mut().reset(due);
                }
            }
            // The watcher sends nothing after its request: end of stream or an error
            // means it went away. Anything else it sends is ignored.
            r = rd.read(&mut scratch) => {
                if !matches!(r, Ok(n) if n > 0) {
                    return;
                }
            }
        }
    }
}

/// Whom an event stream is for: the buyer's place, and the hold it took once admitted.
#[derive(Clone)]
struct Buyer {
    key: UserKey,
    /// The hold's token (`&hold=`), for its countdown: the checkout service passes it on
    /// with the page's link once the buyer reserved.
    hold: Option<String>,
}

/// The buyer an event stream is for, from `?user=U&ticket=T[&hold=TOKEN]`: `None` without
/// user and ticket (the counts alone); a refusal (status, body) for a ticket that is not
/// this user's place in this sale's room, or a hold that is not this user's in this sale.
fn buyer_key(hub: &Hub, sku: &str, query: &str) -> Result<Option<Buyer>, (&'static str, String)> {
    let (Some(user), Some(ticket)) = (query_param(query, "user"), query_param(query, "ticket"))
    else {
        return Ok(None);
    };
    let key = match hub.engine.room_key(sku, &user, &ticket) {
        Ok(key) => key,
        Err(e @ (EngineError::NoSale | EngineError::NoRoom)) => {
            return Err(("404 Not Found", format!("{e}\n")))
        }
        Err(e) => return Err(("403 Forbidden", format!("{e}\n"))),
    };
    let hold = query_param(query, "hold");
    if let Some(token) = &hold {
        let theirs = hub
            .engine
            .reservation(token)
            .is_some_and(|(r, _)| r.sku == sku && r.user == user);
        if !theirs {
            return Err((
                "403 Forbidden",
                "no such hold of this user in this sale\n".into(),
            ));
        }
    }
    Ok(Some(Buyer { key, hold }))
}

/// Answers an event-stream request that is not taken, and ends the connection.
async fn refuse_events<W: AsyncWrite + Unpin>(wr: &mut W, status: &str, body: &str) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
        wr.write_all(head.as_bytes()).await?;
        wr.shutdown().await
    })
    .await;
}

/// The counts' JSON with the buyer's place added as `"you"` (the place as the room has it
/// now; `{"status":"GONE"}` once the room or the place is gone), and the hold as `"hold"`
/// (`{"state":"RESERVED","expires_at_ms":T}`, COMMITTED, RELEASED, or GONE once purged)
/// when the stream was opened with one.
fn with_place(out: &mut Vec<u8>, counts: &[u8], engine: &Engine, sku: &str, buyer: &Buyer) {
    let Some(head) = counts.strip_suffix(b"}") else {
        return out.extend_from_slice(counts);
    };
    let place = match engine.room_peek_keyed(sku, buyer.key) {
        Ok(status) => status_json(&status),
        Err(_) => r#"{"status":"GONE"}"#.to_string(),
    };
    out.extend_from_slice(head);
    out.extend_from_slice(b",\"you\":");
    out.extend_from_slice(place.as_bytes());
    if let Some(token) = &buyer.hold {
        let hold = match engine.reservation(token) {
            Some((r, _)) => format!(
                r#"{{"state":"{}","expires_at_ms":{}}}"#,
                r.state.as_str(),
                r.expires_at_ms
            ),
            None => r#"{"state":"GONE"}"#.to_string(),
        };
        out.extend_from_slice(b",\"hold\":");
        out.extend_from_slice(hold.as_bytes());
    }
    out.push(b'}');
}

/// The percent-decoded value of `name` in a query string (`+` is a space).
fn query_param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| percent_decode(&v.replace('+', " ")))
}

/// `/sale/<sku>/ticket?user=U&ticket=T`: the buyer's place as JSON (status, position and
/// wait, or the admission's end), read without moving the room; 400 without both
/// parameters, 404 for a sale or room that does not exist, 403 for a ticket that is not
/// this user's of this sale.
pub fn ticket_json(engine: &Engine, sku: &str, query: &str) -> (&'static str, String) {
    let (Some(user), Some(ticket)) = (query_param(query, "user"), query_param(query, "ticket"))
    else {
        return (
            "400 Bad Request",
            r#"{"error":"needs user and ticket"}"#.into(),
        );
    };
    match engine.room_peek(sku, &user, &ticket) {
        Ok(status) => ("200 OK", status_json(&status)),
        Err(e @ (EngineError::NoSale | EngineError::NoRoom)) => (
            "404 Not Found",
            format!(r#"{{"error":"{}"}}"#, json_escape(&e.to_string())),
        ),
        Err(e) => (
            "403 Forbidden",
            format!(r#"{{"error":"{}"}}"#, json_escape(&e.to_string())),
        ),
    }
}

fn status_json(s: &Status) -> String {
    match *s {
        Status::Waiting { position, eta_ms } => {
            format!(r#"{{"status":"WAITING","position":{position},"eta_ms":{eta_ms}}}"#)
        }
        Status::Admitted { until_ms } => {
            format!(r#"{{"status":"ADMITTED","until_ms":{until_ms}}}"#)
        }
        Status::BeforeOpen { opens_at_ms } => {
            format!(r#"{{"status":"BEFORE-OPEN","opens_at_ms":{opens_at_ms}}}"#)
        }
        Status::Reserved => r#"{"status":"RESERVED"}"#.into(),
        Status::SoldOut => r#"{"status":"SOLDOUT"}"#.into(),
        Status::Expired => r#"{"status":"EXPIRED"}"#.into(),
        Status::Left => r#"{"status":"LEFT"}"#.into(),
    }
}

/// `s` safe inside a JSON string.
fn json_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c if (c as u32) < 0x20 => vec![' '],
            c => vec![c],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineConfig, Keyring, ManualClock, NullSink, ReservationKey};

    /// An engine on a fixed clock and test keys (also for `resp`'s tests).
    pub(super) fn engine() -> Arc<Engine> {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let keys = Keyring::parse(&format!("k1 {}\n", "ab".repeat(32))).unwrap();
        Arc::new(Engine::new(
            EngineConfig::default(),
            clock,
            Arc::new(NullSink),
            keys,
            ReservationKey::from_bytes(&[7u8; 32]),
        ))
    }

    #[test]
    fn paths_and_escapes() {
        assert_eq!(events_sku("/sale/AB/events").as_deref(), Some("AB"));
        assert_eq!(events_sku("/sale/A%42/events").as_deref(), Some("AB"));
        assert_eq!(events_sku("/sale//events"), None);
        assert_eq!(events_sku("/sale/A/B/events"), None);
        assert_eq!(page_sku("/sale/AB").as_deref(), Some("AB"));
        assert_eq!(page_sku("/sale/AB/x"), None);
        assert_eq!(percent_decode("%3Cs%3E%zz%4"), "<s>%zz%4");
        assert_eq!(
            html_escape("<script>\"'&"),
            "&lt;script&gt;&quot;&#39;&amp;"
        );
        assert_eq!(json_str("a\"</script>"), "\"a\\\"\\u003c/script\\u003e\"");
    }

    #[test]
    fn the_page_escapes_the_sku() {
        let e = engine();
        let (status, body) = page(&e, "<script>alert(1)</script>");
        assert_eq!(status, "404 Not Found");
        assert!(!body.contains("<script>alert"), "{body}");
        assert!(body.contains("&lt;script&gt;alert(1)"), "{body}");
        e.create_sale("S1", 5, Some(1), None, None).unwrap();
        let (status, body) = page(&e, "S1");
        assert_eq!(status, "200 OK");
        assert!(body.contains("data-sku=\"S1\""), "{body}");
        assert!(!body.contains("{{SKU}}"));
    }

    #[tokio::test]
    async fn one_sampler_per_sale_dropped_with_the_last_watcher_and_a_limit() {
        let e = engine();
        e.create_sale("S1", 5, Some(1), None, None).unwrap();
        let hub = Hub::new(e.clone(), 2);
        assert_eq!(hub.watch("NOPE").err(), Some(Refused::NoSale));
        assert_eq!(hub.watchers(), 0);
        let mut a = hub.watch("S1").unwrap();
        let b = hub.watch("S1").unwrap();
        assert_eq!(hub.sampled_sales(), 1);
        assert_eq!(hub.watch("S1").err(), Some(Refused::Full));
        assert_eq!(hub.watchers(), 2);
        let first = a.latest();
        assert_eq!((first.available, first.held, first.sold), (5, 0, 0));
        assert_eq!(first.state, "OPEN");
        assert!(!first.room);
        e.adjust("S1", -2).unwrap();
        tokio::time::timeout(Duration::from_secs(2), a.changed())
            .await
            .expect("a change within 2 s");
        assert_eq!(a.latest().available, 3);
        drop(a);
        assert_eq!(hub.sampled_sales(), 1);
        drop(b);
        assert_eq!(hub.sampled_sales(), 0);
        assert_eq!(hub.watchers(), 0);
        assert!(hub.feeds.lock().is_empty());
        // A new watcher starts a new sampler from the current counts.
        let mut c = hub.watch("S1").unwrap();
        assert_eq!(c.latest().available, 3);
    }
}
