//! A sale's live counts and a buyer's place, pushed by the server over RESP pub/sub
//! (docs/protocol.md section 4a, "Live counts over RESP"): `SUBSCRIBE sale:<sku>:live` or
//! `SUBSCRIBE place:<ticket>` on a connection of the watch's own, each message's JSON read
//! into a [`LiveCounts`].
//!
//! [`StockgateClient::watch_sale`](crate::StockgateClient::watch_sale) and
//! [`watch_place`](crate::StockgateClient::watch_place) give a [`LiveWatch`]: a
//! [`Stream`] of counts (or `next().await`), the counts now at once, then one per change.
//! A refused subscription is the typed [`ClientError`] (`NoSale`, `NoRoom`, `BadTicket`).
//! A lost connection ends the stream (`None`): watch again, and the first message is the
//! state then, so only intermediate states are missed. Dropping the watch closes its
//! connection, which frees the server's watcher.
//!
//! The payload is a flat JSON object (one nested object, `you`) of integers, booleans and
//! strings; it is read by the small reader below rather than a JSON crate, so that the
//! client links nothing more for it.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::error::ClientError;
use crate::types::{LiveCounts, PlaceStatus};

/// A sale's live channel.
pub fn sale_channel(sku: &str) -> String {
    format!("sale:{sku}:live")
}

/// A buyer's channel: its place and the sale's counts (the ticket `ROOM.JOIN` gave).
pub fn place_channel(ticket: &str) -> String {
    format!("place:{ticket}")
}

/// One live channel's messages as [`LiveCounts`], on a connection of its own (closed when
/// the watch is dropped).
///
/// The connection speaks RESP3, where the messages come as pushes beside the replies:
/// redis-rs's RESP2 subscriber (`aio::PubSub`) takes the error reply the server sends in
/// place of a refused subscription's confirmation for a confirmation, so a refusal would
/// look like a quiet channel; over RESP3 it is the `SUBSCRIBE` call's error.
pub struct LiveWatch {
    channel: String,
    // Held so the connection lives as long as the watch: dropping it ends the task that
    // drives the connection, which closes the socket and frees the server's watcher.
    _conn: MultiplexedConnection,
    pushes: UnboundedReceiver<PushInfo>,
    ended: bool,
}

impl std::fmt::Debug for LiveWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveWatch")
            .field("channel", &self.channel)
            .finish()
    }
}

impl LiveWatch {
    /// Subscribes to `channel` on a new connection to `info` (its TLS and credentials, in
    /// RESP3), and waits for the confirmation, or the error reply the server sends in its
    /// place. Connecting and the subscription are each bounded by `timeout`.
    pub(crate) async fn open(
        mut info: ConnectionInfo,
        channel: String,
        timeout: Duration,
    ) -> Result<LiveWatch, ClientError> {
        info.redis.protocol = ProtocolVersion::RESP3;
        let client = redis::Client::open(info).map_err(ClientError::Connection)?;
        let (tx, pushes) = unbounded_channel();
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout)
            .set_push_sender(tx);
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .map_err(|e| ClientError::Connection(crate::tls::explain(e)))?;
        conn.subscribe(&channel).await?;
        Ok(LiveWatch {
            channel,
            _conn: conn,
            pushes,
            ended: false,
        })
    }

    /// The channel watched (`sale:<sku>:live` or `place:<ticket>`).
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// The next message: `None` once the connection is lost; a payload of another shape is
    /// [`ClientError::Protocol`] (the watch goes on).
    pub async fn next(&mut self) -> Option<Result<LiveCounts, ClientError>> {
        futures::StreamExt::next(self).await
    }
}

impl Stream for LiveWatch {
    type Item = Result<LiveCounts, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if self.ended {
                return Poll::Ready(None);
            }
            let Some(push) = std::task::ready!(self.pushes.poll_recv(cx)) else {
                return Poll::Ready(None);
            };
            match push.kind {
                PushKind::Message => {}
                // The library's own push when the socket closes: nothing more will come.
                PushKind::Disconnection => {
                    self.ended = true;
                    return Poll::Ready(None);
                }
                // Confirmations and anything else are not counts.
                _ => continue,
            }
            let [Value::BulkString(channel), Value::BulkString(payload)] = push.data.as_slice()
            else {
                return Poll::Ready(Some(Err(ClientError::Protocol {
                    command: "SUBSCRIBE",
                    reply: format!("{:?}", push.data),
                })));
            };
            // One channel per connection: anything else is not this watch's.
            if channel.as_slice() != self.channel.as_bytes() {
                continue;
            }
            return Poll::Ready(Some(parse_live(payload).ok_or_else(|| {
                ClientError::Protocol {
                    command: "SUBSCRIBE",
                    reply: String::from_utf8_lossy(payload).into_owned(),
                }
            })));
        }
    }
}

/// A live channel message's JSON; `None` for any other shape.
pub fn parse_live(payload: &[u8]) -> Option<LiveCounts> {
    let text = std::str::from_utf8(payload).ok()?;
    let Json::Obj(fields) = Reader::parse(text)? else {
        return None;
    };
    let get = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    let int = |name: &str| match get(name)? {
        Json::Int(n) => Some(*n),
        _ => None,
    };
    let count = |name: &str| u64::try_from(int(name)?).ok();
    let string = |name: &str| match get(name)? {
        Json::Str(s) => Some(s.clone()),
        _ => None,
    };
    let room = match get("room")? {
        Json::Bool(b) => *b,
        _ => return None,
    };
    let you = match get("you") {
        None => None,
        Some(Json::Obj(place)) => Some(parse_place(place)?),
        Some(_) => return None,
    };
    Some(LiveCounts {
        sku: string("sku")?,
        available: int("available")?,
        held: int("held")?,
        sold: int("sold")?,
        waiting: count("waiting")?,
        admitted: count("admitted")?,
        room,
        state: string("state")?,
        you,
    })
}

fn parse_place(fields: &[(String, Json)]) -> Option<PlaceStatus> {
    let get = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    let int = |name: &str| match get(name)? {
        Json::Int(n) => Some(*n),
        _ => None,
    };
    let count = |name: &str| u64::try_from(int(name)?).ok();
    let Json::Str(status) = get("status")? else {
        return None;
    };
    Some(match status.as_str() {
        "WAITING" => PlaceStatus::Waiting {
            position: count("position")?,
            eta_ms: count("eta_ms")?,
        },
        "ADMITTED" => PlaceStatus::Admitted {
            until_ms: int("until_ms")?,
        },
        "BEFORE-OPEN" => PlaceStatus::BeforeOpen {
            opens_at_ms: int("opens_at_ms")?,
        },
        "RESERVED" => PlaceStatus::Reserved,
        "SOLDOUT" => PlaceStatus::SoldOut,
        "EXPIRED" => PlaceStatus::Expired,
        "LEFT" => PlaceStatus::Left,
        "GONE" => PlaceStatus::Gone,
        _ => return None,
    })
}

/// A JSON value, as far as the live payload needs: anything else (fractions, arrays) is
/// kept as `Other`, which no field accepts.
#[derive(Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Str(String),
    Obj(Vec<(String, Json)>),
    Other,
}

/// Nesting deeper than this is refused: the payload has two levels.
const MAX_DEPTH: usize = 8;

struct Reader<'a> {
    s: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    fn parse(text: &str) -> Option<Json> {
        let mut r = Reader {
            s: text.as_bytes(),
            i: 0,
        };
        let v = r.value(0)?;
        r.ws();
        (r.i == r.s.len()).then_some(v)
    }

    fn ws(&mut self) {
        while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        self.ws();
        (self.s.get(self.i) == Some(&b)).then(|| self.i += 1)
    }

    fn word(&mut self, w: &str) -> Option<()> {
        self.s[self.i..]
            .starts_with(w.as_bytes())
            .then(|| self.i += w.len())
    }

    fn value(&mut self, depth: usize) -> Option<Json> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        match *self.s.get(self.i)? {
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b'"' => self.string().map(Json::Str),
            b't' => self.word("true").map(|_| Json::Bool(true)),
            b'f' => self.word("false").map(|_| Json::Bool(false)),
            b'n' => self.word("null").map(|_| Json::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn object(&mut self, depth: usize) -> Option<Json> {
        self.eat(b'{')?;
        let mut fields = Vec::new();
        if self.eat(b'}').is_some() {
            return Some(Json::Obj(fields));
        }
        loop {
            self.ws();
            let k = self.string()?;
            self.eat(b':')?;
            fields.push((k, self.value(depth + 1)?));
            if self.eat(b',').is_none() {
                self.eat(b'}')?;
                return Some(Json::Obj(fields));
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<Json> {
        self.eat(b'[')?;
        if self.eat(b']').is_some() {
            return Some(Json::Other);
        }
        loop {
            self.value(depth + 1)?;
            if self.eat(b',').is_none() {
                self.eat(b']')?;
                return Some(Json::Other);
            }
        }
    }

    fn number(&mut self) -> Option<Json> {
        let start = self.i;
        while matches!(
            self.s.get(self.i),
            Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
        ) {
            self.i += 1;
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).ok()?;
        if let Ok(n) = text.parse::<i64>() {
            return Some(Json::Int(n));
        }
        text.parse::<f64>().ok().map(|_| Json::Other)
    }

    fn string(&mut self) -> Option<String> {
        (self.s.get(self.i) == Some(&b'"')).then_some(())?;
        self.i += 1;
        let mut out = Vec::new();
        loop {
            let b = *self.s.get(self.i)?;
            self.i += 1;
            match b {
                b'"' => return String::from_utf8(out).ok(),
                b'\\' => {
                    let e = *self.s.get(self.i)?;
                    self.i += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return None,
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                // Control characters must be escaped in JSON strings.
                0..=0x1f => return None,
                _ => out.push(b),
            }
        }
    }

    /// The character of a `\uXXXX` escape (a surrogate pair takes two).
    fn unicode_escape(&mut self) -> Option<char> {
        let hi = self.hex4()?;
        if (0xD800..0xDC00).contains(&hi) {
            self.word("\\u")?;
            let lo = self.hex4()?;
            if !(0xDC00..0xE000).contains(&lo) {
                return None;
            }
            return char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00));
        }
        char::from_u32(hi)
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.s.get(self.i..self.i + 4)?;
        let n = u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()?;
        self.i += 4;
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COUNTS: &str = r#"{"sku":"S1","available":940,"held":12,"sold":48,"waiting":1500,"admitted":30,"room":true,"state":"OPEN"}"#;

    fn with(field: &str) -> String {
        format!("{},{field}}}", COUNTS.trim_end_matches('}'))
    }

    #[test]
    fn parses_the_counts_and_every_place() {
        let want = LiveCounts {
            sku: "S1".into(),
            available: 940,
            held: 12,
            sold: 48,
            waiting: 1500,
            admitted: 30,
            room: true,
            state: "OPEN".into(),
            you: None,
        };
        assert_eq!(parse_live(COUNTS.as_bytes()), Some(want.clone()));
        assert!(!want.is_gone());
        let spaced = " { \"sku\" : \"S1\" , \"available\":940,\"held\":12,\"sold\":48,\"waiting\":1500,\"admitted\":30,\"room\":true,\"state\":\"OPEN\" } ";
        assert_eq!(parse_live(spaced.as_bytes()), Some(want));
        let places = [
            (
                r#"{"status":"WAITING","position":3,"eta_ms":1200}"#,
                PlaceStatus::Waiting {
                    position: 3,
                    eta_ms: 1200,
                },
            ),
            (
                r#"{"status":"ADMITTED","until_ms":17}"#,
                PlaceStatus::Admitted { until_ms: 17 },
            ),
            (
                r#"{"status":"BEFORE-OPEN","opens_at_ms":99}"#,
                PlaceStatus::BeforeOpen { opens_at_ms: 99 },
            ),
            (r#"{"status":"RESERVED"}"#, PlaceStatus::Reserved),
            (r#"{"status":"SOLDOUT"}"#, PlaceStatus::SoldOut),
            (r#"{"status":"EXPIRED"}"#, PlaceStatus::Expired),
            (r#"{"status":"LEFT"}"#, PlaceStatus::Left),
            (r#"{"status":"GONE"}"#, PlaceStatus::Gone),
        ];
        for (json, place) in places {
            let got = parse_live(with(&format!(r#""you":{json}"#)).as_bytes());
            assert_eq!(got.and_then(|c| c.you), Some(place), "{json}");
        }
    }

    #[test]
    fn refuses_other_shapes() {
        let missing = COUNTS.replace(r#""held":12,"#, "");
        let bad = [
            "",
            "not json",
            "[1]",
            missing.as_str(),
            &COUNTS.replace(r#""held":12"#, r#""held":"12""#),
            &COUNTS.replace(r#""held":12"#, r#""held":1.5"#),
            &COUNTS.replace(r#""room":true"#, r#""room":1"#),
            &COUNTS.replace(r#""waiting":1500"#, r#""waiting":-1"#),
            &with(r#""you":{"status":"WAITING","position":1}"#),
            &with(r#""you":{"status":"LOST"}"#),
            &with(r#""you":"WAITING""#),
            &format!("{COUNTS} trailing"),
            &COUNTS.replace("}", ""),
        ];
        for b in bad {
            assert_eq!(parse_live(b.as_bytes()), None, "{b}");
        }
    }

    #[test]
    fn reads_json_strings_escapes_and_unknown_values() {
        assert_eq!(
            Reader::parse(r#""a\"b\\c\u00e9\ud83d\ude00\n""#),
            Some(Json::Str("a\"b\\cé😀\n".into()))
        );
        assert_eq!(Reader::parse(r#""\ud83d""#), None, "a lone surrogate");
        assert_eq!(Reader::parse("\"a\u{1}\""), None, "an unescaped control");
        assert_eq!(
            Reader::parse(r#"{"a":[1,{"b":null}],"c":-2,"d":1e3}"#),
            Some(Json::Obj(vec![
                ("a".into(), Json::Other),
                ("c".into(), Json::Int(-2)),
                ("d".into(), Json::Other),
            ]))
        );
        let deep = format!("{}1{}", "[".repeat(20), "]".repeat(20));
        assert_eq!(Reader::parse(&deep), None, "nesting beyond MAX_DEPTH");
        // A string with an extra field or in another field order still reads.
        let extra = with(r#""new_field":[1,2]"#);
        assert!(parse_live(extra.as_bytes()).is_some());
    }

    #[test]
    fn channel_names() {
        assert_eq!(sale_channel("S1"), "sale:S1:live");
        assert_eq!(place_channel("t1|k|S1|u|0|sig"), "place:t1|k|S1|u|0|sig");
    }

    /// The server binary the workspace builds (`cargo build --workspace --bins`), or
    /// `STOCKGATE_BIN`, as the workspace's integration tests find it.
    fn server_bin() -> std::path::PathBuf {
        if let Ok(p) = std::env::var("STOCKGATE_BIN") {
            return p.into();
        }
        let exe = std::env::current_exe().expect("test exe path");
        let bin = exe
            .parent()
            .and_then(std::path::Path::parent)
            .expect("target/<profile>/deps")
            .join("stockgate");
        assert!(
            bin.exists(),
            "{} missing: run `cargo build --workspace --bins` before the tests",
            bin.display()
        );
        bin
    }

    /// A server (open mode) on a port of its own and a data dir of its own, killed and
    /// removed on drop.
    struct Server {
        child: std::process::Child,
        dir: std::path::PathBuf,
        addr: String,
    }

    impl Server {
        fn start() -> Server {
            use std::io::BufRead;
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir()
                .join(format!("stockgate-client-live-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let mut child = std::process::Command::new(server_bin())
                .args(["--port", "0", "--data-dir"])
                .arg(&dir)
                .env("STOCKGATE_LOG", "warn")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn stockgate");
            let mut line = String::new();
            std::io::BufReader::new(child.stdout.take().expect("stdout"))
                .read_line(&mut line)
                .expect("the server's first line");
            let addr = line
                .trim()
                .strip_prefix("listening on ")
                .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
                .to_string();
            Server { child, dir, addr }
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Reads `w` until a message for which `ok` holds (or fails after 5 s).
    async fn until(w: &mut LiveWatch, what: &str, ok: impl Fn(&LiveCounts) -> bool) -> LiveCounts {
        let mut seen = Vec::new();
        loop {
            let next = tokio::time::timeout(Duration::from_secs(5), w.next()).await;
            let c = match next {
                Ok(Some(c)) => c.expect("a well-formed message"),
                Ok(None) => panic!("{what}: the watch ended; saw {seen:?}"),
                Err(_) => panic!("{what}: not within 5 s; saw {seen:?}"),
            };
            if ok(&c) {
                return c;
            }
            seen.push(c);
        }
    }

    fn position(c: &LiveCounts) -> Option<u64> {
        match c.you {
            Some(PlaceStatus::Waiting { position, .. }) => Some(position),
            _ => None,
        }
    }

    #[tokio::test]
    async fn against_the_server_counts_joins_places_and_refusals() {
        use crate::types::RoomOptions;
        use crate::StockgateClient;

        let server = Server::start();
        let c = StockgateClient::connect(&server.addr)
            .await
            .expect("connect");

        // A sale without a room: the counts at once, then a RESERVE.
        c.sale_create("PLAIN", 5, Some(1), Some(60_000), None)
            .await
            .expect("SALE.CREATE");
        let mut w = c.watch_sale("PLAIN").await.expect("watch PLAIN");
        assert_eq!(w.channel(), "sale:PLAIN:live");
        let first = until(&mut w, "the counts now", |_| true).await;
        assert_eq!(
            (first.sku.as_str(), first.available, first.held, first.sold),
            ("PLAIN", 5, 0, 0)
        );
        assert!(!first.room && first.you.is_none() && first.state == "OPEN");
        let key = std::fs::read_to_string(server.dir.join("secret")).expect("the secret file");
        let (kid, hex) = key
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .and_then(|l| l.split_once(char::is_whitespace))
            .expect("a key line");
        let secret = crate::token::parse_secret_hex(hex).expect("the key's hex");
        let admission = crate::token::mint_admission_token(
            &secret,
            kid,
            "PLAIN",
            "alice",
            u64::try_from(crate::types::now_ms() + 60_000).expect("a time after 1970"),
        );
        let out = c
            .reserve("PLAIN", "alice", &admission, "order-1", 2)
            .await
            .expect("RESERVE");
        assert!(out.token().is_some(), "{out:?}");
        let held = until(&mut w, "the reserve", |x| x.held == 2).await;
        assert_eq!(held.available, 3);
        drop(w);

        // A 1-unit sale with a room: joins show on the sale's channel; c's place moves up
        // once a, ahead of it, leaves.
        c.sale_create("ROOMY", 1, Some(1), Some(60_000), None)
            .await
            .expect("SALE.CREATE");
        let opts = RoomOptions {
            rate: Some(1000),
            window_ms: Some(0),
            ..RoomOptions::default()
        };
        c.open_room("ROOMY", &opts).await.expect("ROOM.OPEN");
        let mut sale = c.watch_sale("ROOMY").await.expect("watch ROOMY");
        let now = until(&mut sale, "the counts now", |_| true).await;
        assert!(now.room && now.waiting == 0 && now.admitted == 0, "{now:?}");
        c.join("ROOMY", "a").await.expect("join a");
        until(&mut sale, "a's join", |x| x.admitted == 1).await;
        c.join("ROOMY", "b").await.expect("join b");
        let t = c.join("ROOMY", "c").await.expect("join c");
        assert_eq!(t.position, 2);
        until(&mut sale, "b and c waiting", |x| x.waiting == 2).await;
        let mut place = c.watch_place(&t.ticket).await.expect("watch c's place");
        let mine = until(&mut place, "the place now", |_| true).await;
        assert_eq!(position(&mine), Some(2), "{mine:?}");
        assert!(c.leave("ROOMY", "a").await.expect("leave a"));
        let moved = until(&mut place, "c moved up", |x| position(x) == Some(1)).await;
        assert_eq!((moved.waiting, moved.admitted), (1, 1));
        assert!(c.leave("ROOMY", "c").await.expect("leave c"));
        until(&mut place, "c left", |x| x.you == Some(PlaceStatus::Left)).await;

        // Refusals, typed.
        let none = c.watch_sale("NONE").await;
        assert!(matches!(none, Err(ClientError::NoSale)), "{none:?}");
        let no_room = c.watch_place("t1|k|PLAIN|u|0|sig").await;
        assert!(matches!(no_room, Err(ClientError::NoRoom)), "{no_room:?}");
        let mut parts: Vec<&str> = t.ticket.split('|').collect();
        parts[3] = "mallory";
        for forged in [
            parts.join("|"),
            "t1|nope".to_string(),
            "garbage".to_string(),
        ] {
            match c.watch_place(&forged).await {
                Err(ClientError::BadTicket(why)) => {
                    assert!(why.starts_with("ticket refused"), "{forged}: {why}")
                }
                other => panic!("{forged}: {other:?}"),
            }
        }
        // The client's connection is untouched by the watches.
        c.ping().await.expect("PING");
    }
}
