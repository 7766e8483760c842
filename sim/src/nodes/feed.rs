//! `Settings::feed` in the `RaftNode` scenario: consumers of the order feed as
//! applications run them, through the command layer (`cmd::dispatch` on the member's
//! `Shared`, whose feed is the member's own, opened as the server opens it, and whose
//! consumer groups hold the member's snapshots back: `boot::assemble`).
//!
//! - **A reader**: `XREAD COUNT n STREAMS stockgate:events <id>` on from its position,
//!   or one time in four `XRANGE` over what it read, on any member drawn, on a
//!   connection that sent `READONLY` (a follower answers from its own log). One time in
//!   forty it then lags 3 to 30 s, so that snapshots pass it: nothing holds the log for
//!   it, and a read answered "trimmed" makes it read on from where the log starts.
//! - **A materializer**: `XGROUP CREATE stockgate:events hold.m $`, then `XREAD` on
//!   from its position on the member it takes for the master, and `XGROUP SETID hold.m`
//!   to the last entry of what it read; one time in thirty it lags 3 to 30 s, its
//!   group holding every member's snapshots back meanwhile.
//! - **A group consumer**: `XGROUP CREATE … orders $`, `XREADGROUP GROUP orders w1
//!   COUNT n STREAMS stockgate:events >`, `XACK` of what it kept a drawn while, and one
//!   time in five its pending entries again (`… STREAMS stockgate:events 0`).
//!
//! Group commands are writes: sent to the member the consumer takes for the master, each
//! reply waiting for the group's commit of the LSN the command layer names; on
//! `-READONLY`, `-LOADING` or a lost connection the consumer asks discovery as the
//! command client does (`commands::discover`) and sends the command again to the member
//! named, so it follows the leadership across failovers. The checks: `feed_checks.rs`.
//! With `Settings::claims`, a second worker takes over the first's idle entries and the
//! reader sometimes blocks (`claims.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::engine::Lsn;
use stockgate_server::protocol::Reply;
use stockgate_server::raft::NodeId;
use tokio::time::{sleep, Instant};

use super::commands::{self, Answer};
use super::feed_checks::{self, count, FeedLog, HOLD, ORDERS};
use super::{Run, REPLY_TTL};
use crate::feed_rules::fields_fingerprint;

mod claims;

/// The stream every consumer reads.
const STREAM: &[u8] = b"stockgate:events";
/// Its consumer.
const WORKER: &[u8] = claims::FIRST.as_bytes();
/// Attempts of one group command before the consumer gives it up.
const ATTEMPTS: u32 = 20;

/// The consumers' own state.
struct Consumers {
    r: Arc<Run>,
    rng: StdRng,
    log: Arc<Mutex<FeedLog>>,
    /// The member the group commands go to.
    target: Option<NodeId>,
    /// The reader's position, and until when it lags.
    cursor: Lsn,
    reader_lags: Option<Instant>,
    /// The materializer's position, and until when it lags.
    position: Lsn,
    materializer_lags: Option<Instant>,
    /// Entries delivered to the worker and not yet acknowledged, since when.
    pending: BTreeMap<Lsn, Instant>,
    /// How long the worker keeps an entry before its `XACK` (drawn per run).
    ack_after: Duration,
    /// The second worker, claims and blocking reads run (`Settings::claims`).
    claims: bool,
    /// How long an entry must have waited before the second worker claims it (drawn
    /// per run, with `claims`).
    min_idle_ms: u64,
    /// Entries the second worker claimed and has not acknowledged yet, since when.
    claimed: BTreeMap<Lsn, Instant>,
}

/// Starts the consumers on `rng` (a generator of their own): their task and what they
/// were acknowledged. They stop with `stop`.
pub(super) fn spawn(
    r: &Arc<Run>,
    mut rng: StdRng,
    stop: Arc<AtomicBool>,
) -> (tokio::task::JoinHandle<()>, Arc<Mutex<FeedLog>>) {
    let log = Arc::new(Mutex::new(FeedLog::default()));
    let ms = if rng.gen_range(0..5) == 0 {
        rng.gen_range(3_000..15_000)
    } else {
        rng.gen_range(0..300)
    };
    r.note(format!("feed: the worker acknowledges after {ms} ms"));
    let claims = r.kinds.claims;
    let min_idle_ms = if claims {
        let idle = rng.gen_range(500..5_000);
        r.note(format!(
            "feed: the second worker claims entries idle {idle} ms"
        ));
        idle
    } else {
        0
    };
    let c = Consumers {
        r: r.clone(),
        rng,
        log: log.clone(),
        target: None,
        cursor: 0,
        reader_lags: None,
        position: 0,
        materializer_lags: None,
        pending: BTreeMap::new(),
        ack_after: Duration::from_millis(ms),
        claims,
        min_idle_ms,
        claimed: BTreeMap::new(),
    };
    (tokio::spawn(run(c, stop)), log)
}

/// One action every 80 to 400 ms until `stop`, each followed by the check of the
/// members' groups against their logs.
async fn run(mut c: Consumers, stop: Arc<AtomicBool>) {
    let mut n = 0u64;
    while !stop.load(Ordering::Acquire) {
        sleep(Duration::from_millis(c.rng.gen_range(80..400))).await;
        n += 1;
        let who = format!("f{n}");
        if c.claims && c.rng.gen_range(0..6) == 0 {
            c.take_over(&who).await;
        } else {
            match c.rng.gen_range(0..10) {
                0..=3 => c.read(&who).await,
                4..=6 => c.materialize(&who).await,
                _ => c.consume(&who).await,
            }
        }
        feed_checks::check_groups(&c.r, &c.log);
    }
    let l = c.log.lock();
    let k = l.counts;
    c.r.note(format!(
        "feed: {} entries read, {} reads, {} delivered, {} acknowledged, {} trimmed reads, \
         {} lags, {} group commands given up",
        l.seen.len(),
        k[count::READ],
        k[count::DELIVERED],
        k[count::ACKED],
        k[count::TRIMMED],
        k[count::LAGS],
        k[count::GIVEN_UP]
    ));
    if c.claims {
        c.r.note(format!(
            "feed: {} entries claimed, {} pending listings, {} blocking reads",
            k[count::CLAIMED],
            k[count::LISTED],
            k[count::BLOCKED]
        ));
    }
}

/// `XREAD COUNT <count> [BLOCK <ms>] STREAMS stockgate:events <after>`.
fn xread<'a>(count: &'a str, block: Option<&'a str>, after: &'a str) -> Vec<&'a [u8]> {
    let mut argv: Vec<&[u8]> = vec![b"XREAD", b"COUNT", count.as_bytes()];
    if let Some(ms) = block {
        argv.extend([b"BLOCK".as_slice(), ms.as_bytes()]);
    }
    argv.extend([b"STREAMS".as_slice(), STREAM, after.as_bytes()]);
    argv
}

/// The entries of `held` kept `after` or longer: a worker's `XACK`s due.
fn due(held: &BTreeMap<Lsn, Instant>, after: Duration) -> Vec<Lsn> {
    held.iter()
        .filter(|(_, t)| t.elapsed() >= after)
        .map(|(l, _)| *l)
        .collect()
}

/// An entry id `N-0` as its LSN.
fn lsn_of(id: &[u8]) -> Option<Lsn> {
    let s = std::str::from_utf8(id).ok()?;
    s.strip_suffix("-0")?.parse().ok()
}

/// Entries of a reply (`[[id, [field, value, ...]], ...]`): each as its LSN and the
/// fingerprint of its fields, or `None` for an entry shown as `[id, nil]` (a pending
/// entry the log no longer has).
fn entries(items: &[Reply]) -> Vec<(Lsn, Option<String>)> {
    let mut out = Vec::with_capacity(items.len());
    for e in items {
        let Reply::Array(pair) = e else { continue };
        let Some(lsn) = pair.first().and_then(|i| i.as_bulk()).and_then(lsn_of) else {
            continue;
        };
        let fp = match pair.get(1) {
            Some(Reply::Array(kv)) => {
                let text = |r: &Reply| {
                    String::from_utf8_lossy(r.as_bulk().unwrap_or_default()).into_owned()
                };
                let fields: Vec<(String, String)> = kv
                    .chunks(2)
                    .map(|p| (text(&p[0]), p.get(1).map(text).unwrap_or_default()))
                    .collect();
                Some(fields_fingerprint(&fields))
            }
            _ => None,
        };
        out.push((lsn, fp));
    }
    out
}

/// The entries of an `XREAD`/`XREADGROUP` reply (`[[stream, entries]]`, or nil).
fn stream_entries(reply: &Reply) -> Vec<(Lsn, Option<String>)> {
    match reply {
        Reply::Array(streams) => streams
            .iter()
            .filter_map(|s| match s {
                Reply::Array(kv) => match kv.get(1) {
                    Some(Reply::Array(es)) => Some(entries(es)),
                    _ => None,
                },
                _ => None,
            })
            .flatten()
            .collect(),
        _ => Vec::new(),
    }
}

fn is_trimmed(reply: &Reply) -> bool {
    matches!(reply, Reply::Error(e) if e.contains("was trimmed from the log"))
}

impl Consumers {
    /// Entries read on member `on` by `what`: each must show what it showed before, and
    /// they come in order, each once.
    fn saw(&self, on: NodeId, es: &[(Lsn, Option<String>)], what: &str) {
        let mut bad = Vec::new();
        if es.windows(2).any(|w| w[0].0 >= w[1].0) {
            let ids: Vec<Lsn> = es.iter().map(|e| e.0).collect();
            bad.push(format!("{what}: entries out of order or twice: {ids:?}"));
        }
        let read = es.iter().filter_map(|(l, fp)| Some((*l, fp.clone()?)));
        bad.extend(self.log.lock().seen.saw(on, read, what));
        for b in bad {
            self.r.fail(b);
        }
    }

    /// The reader: `XREAD` on from its position, or `XRANGE` over what it read, on any
    /// member drawn, stale reads accepted.
    async fn read(&mut self, who: &str) {
        if self.reader_lags.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let ids: Vec<NodeId> = self.r.ids().into_iter().collect();
        let Some(&id) = ids.get(self.rng.gen_range(0..ids.len().max(1))) else {
            return;
        };
        let Some(conn) = commands::connect(&self.r, id) else {
            return;
        };
        let count = self.rng.gen_range(1..=50u32).to_string();
        let range = self.rng.gen_range(0..4) == 0;
        let (from, to) = (self.rng.gen_range(0..=self.cursor), self.cursor);
        let (a, b) = (format!("{from}-0"), format!("{to}-0"));
        let after = format!("{}-0", self.cursor);
        let block = (self.claims && !range && self.rng.gen_range(0..3) == 0)
            .then(|| self.rng.gen_range(100..3_000u64).to_string());
        let argv: Vec<&[u8]> = if range {
            vec![
                b"XRANGE",
                STREAM,
                a.as_bytes(),
                b.as_bytes(),
                b"COUNT",
                count.as_bytes(),
            ]
        } else {
            xread(&count, block.as_deref(), &after)
        };
        let what = format!("{who}@n{id} {}", if range { "XRANGE" } else { "XREAD" });
        let answer = if block.is_some() {
            self.log.lock().counts[count::BLOCKED] += 1;
            commands::answer_blocking(&self.r, &conn, &argv).await
        } else {
            commands::answer(&self.r, &conn, &argv, true).await
        };
        let Answer::Reply(reply) = answer else {
            return;
        };
        self.log.lock().counts[count::READ] += 1;
        match &reply {
            Reply::Array(es) if range => self.saw(id, &entries(es), &what),
            Reply::Array(_) => {
                let es = stream_entries(&reply);
                if es.first().is_some_and(|e| e.0 <= self.cursor) {
                    self.r
                        .fail(format!("{what} after {after}: read {:?} again", es[0].0));
                }
                self.saw(id, &es, &what);
                if let Some(last) = es.last() {
                    self.cursor = last.0;
                }
            }
            // Nothing holds the log for a plain reader: it reads on from where it starts.
            r if is_trimmed(r) => {
                let first = conn_first(&self.r, id).unwrap_or(self.cursor);
                self.r
                    .note(format!("{what} after {after}: trimmed, on from {first}"));
                self.log.lock().counts[count::TRIMMED] += 1;
                self.cursor = self.cursor.max(first.saturating_sub(1));
            }
            other => self.r.note(format!("{what}: {other:?}")),
        }
        self.maybe_lag(true, who);
    }

    /// One time in forty (the reader) or thirty (the materializer), a lag of 3 to 30 s.
    fn maybe_lag(&mut self, reader: bool, who: &str) {
        if self.rng.gen_range(0..if reader { 40 } else { 30 }) != 0 {
            return;
        }
        let ms = self.rng.gen_range(3_000..30_000);
        let until = Some(Instant::now() + Duration::from_millis(ms));
        if reader {
            self.reader_lags = until;
        } else {
            self.materializer_lags = until;
        }
        self.log.lock().counts[count::LAGS] += 1;
        let name = if reader { "reader" } else { "materializer" };
        self.r.note(format!("{who} {name} lags {ms} ms"));
    }

    /// Sends a group command (or the materializer's read) until it is answered, to the
    /// member taken for the master, asking discovery after each redirect or lost
    /// connection: the reply and the member that gave it.
    async fn send(&mut self, what: &str, argv: &[&[u8]]) -> Option<(Reply, NodeId)> {
        for _ in 0..ATTEMPTS {
            let why = match self.target {
                Some(id) => match attempt(&self.r, id, argv).await {
                    Answer::Reply(reply) => return Some((reply, id)),
                    Answer::Redirect(e) | Answer::Lost(e) => e,
                    Answer::Nowhere => "no master known".to_owned(),
                },
                None => "no master known".to_owned(),
            };
            self.r.note(format!("{what}: {why}: asks discovery"));
            sleep(Duration::from_millis(self.rng.gen_range(20..200))).await;
            self.target = commands::discover(&self.r, &mut self.rng);
        }
        self.log.lock().counts[count::GIVEN_UP] += 1;
        self.r.note(format!("{what}: given up"));
        None
    }

    /// `XGROUP CREATE stockgate:events <group> $` until answered; whether the group is
    /// there (created, or `BUSYGROUP`: an earlier attempt's creation got through).
    async fn create(&mut self, group: &'static str, who: &str) -> bool {
        let what = format!("{who} XGROUP CREATE {group}");
        let argv: [&[u8]; 5] = [b"XGROUP", b"CREATE", STREAM, group.as_bytes(), b"$"];
        let Some((reply, id)) = self.send(&what, &argv).await else {
            return false;
        };
        self.r.note(format!("{what} on n{id}: {reply:?}"));
        let made = match &reply {
            Reply::Simple("OK") => true,
            Reply::Error(e) => e.starts_with("BUSYGROUP"),
            _ => false,
        };
        if made {
            self.log.lock().registered.insert(group);
        }
        made
    }
}

/// One attempt of `argv` on member `id` (waiting for it if it is stopped, as a client's
/// command waits on a stopped server's socket).
async fn attempt(r: &Run, id: NodeId, argv: &[&[u8]]) -> Answer {
    if !super::pause::continued(r, id, REPLY_TTL).await {
        return Answer::Lost(format!("n{id} stopped: no reply within {REPLY_TTL:?}"));
    }
    let Some(c) = commands::connect(r, id) else {
        return Answer::Lost(format!("n{id} is down"));
    };
    commands::answer(r, &c, argv, false).await
}

/// Where member `id`'s log starts now.
fn conn_first(r: &Run, id: NodeId) -> Option<Lsn> {
    r.live.lock().get(&id).map(|n| n.feed.first_lsn())
}

impl Consumers {
    /// The materializer: its group created, its position learnt (`XINFO GROUPS`), then a
    /// batch read on from it on the member taken for the master, and `XGROUP SETID
    /// hold.m` to the batch's last entry.
    async fn materialize(&mut self, who: &str) {
        if self.materializer_lags.is_some_and(|t| Instant::now() < t) {
            return;
        }
        if !self.log.lock().registered.contains(HOLD) {
            self.create(HOLD, who).await;
            return;
        }
        if self.position == 0 {
            self.position = self.group_position(who).await.unwrap_or(0);
            return;
        }
        let (count, after) = (
            self.rng.gen_range(1..=50u32).to_string(),
            format!("{}-0", self.position),
        );
        let what = format!("{who} materializer XREAD after {after}");
        let argv = xread(&count, None, &after);
        let Some((reply, id)) = self.send(&what, &argv).await else {
            return;
        };
        if let Reply::Error(e) = &reply {
            return feed_checks::group_read_failed(&self.r, HOLD, &format!("{what} on n{id}"), e);
        }
        let es = stream_entries(&reply);
        self.saw(id, &es, &format!("{what} on n{id}"));
        let Some(last) = es.last().map(|e| e.0) else {
            return;
        };
        if es[0].0 <= self.position {
            self.r
                .fail(format!("{what} on n{id}: read {} again", es[0].0));
        }
        self.position = last;
        let to = format!("{last}-0");
        let what = format!("{who} XGROUP SETID {HOLD} {to}");
        let argv: [&[u8]; 5] = [b"XGROUP", b"SETID", STREAM, HOLD.as_bytes(), to.as_bytes()];
        let Some((reply, id)) = self.send(&what, &argv).await else {
            return;
        };
        self.r.note(format!("{what} on n{id}: {reply:?}"));
        if matches!(reply, Reply::Simple("OK")) {
            let mut l = self.log.lock();
            l.hold_at = l.hold_at.max(last);
        }
        self.maybe_lag(false, who);
    }

    /// `XINFO GROUPS stockgate:events` on the member taken for the master: the
    /// materializer's group's last-delivered id, where its reading starts.
    async fn group_position(&mut self, who: &str) -> Option<Lsn> {
        let what = format!("{who} XINFO GROUPS");
        let argv: [&[u8]; 3] = [b"XINFO", b"GROUPS", STREAM];
        let (reply, id) = self.send(&what, &argv).await?;
        let Reply::Array(groups) = &reply else {
            self.r.note(format!("{what} on n{id}: {reply:?}"));
            return None;
        };
        let field = |g: &[(Reply, Reply)], name: &str| -> Option<Vec<u8>> {
            let (_, v) = g
                .iter()
                .find(|(k, _)| k.as_bulk() == Some(name.as_bytes()))?;
            v.as_bulk().map(|b| b.to_vec())
        };
        let at = groups.iter().find_map(|g| {
            let Reply::Map(g) = g else { return None };
            let last = field(g, "last-delivered-id")?;
            (field(g, "name")? == HOLD.as_bytes()).then(|| lsn_of(&last))?
        });
        self.r.note(format!("{what} on n{id}: {HOLD} at {at:?}"));
        at
    }

    /// The group consumer: its group created, then `XACK` of what it kept long enough,
    /// else `XREADGROUP >` (one time in five its pending entries again).
    async fn consume(&mut self, who: &str) {
        if !self.log.lock().registered.contains(ORDERS) {
            self.create(ORDERS, who).await;
            return;
        }
        let due = due(&self.pending, self.ack_after);
        if !due.is_empty() {
            self.ack(due, who).await;
        } else {
            let again = self.rng.gen_range(0..5) == 0;
            self.read_group(again, who).await;
        }
    }

    /// `XACK stockgate:events orders <ids>`: once acknowledged, never pending again.
    async fn ack(&mut self, ids: Vec<Lsn>, who: &str) {
        let words: Vec<String> = ids.iter().map(|l| format!("{l}-0")).collect();
        let mut argv: Vec<&[u8]> = vec![b"XACK", STREAM, ORDERS.as_bytes()];
        argv.extend(words.iter().map(|w| w.as_bytes()));
        let what = format!("{who} XACK {ORDERS} {} entries", ids.len());
        let Some((reply, id)) = self.send(&what, &argv).await else {
            return;
        };
        self.r.note(format!("{what} on n{id}: {reply:?}"));
        if !matches!(reply, Reply::Int(_)) {
            return;
        }
        let mut l = self.log.lock();
        l.counts[count::ACKED] += ids.len() as u64;
        for i in ids {
            self.pending.remove(&i);
            self.claimed.remove(&i);
            l.acked.insert(i);
        }
    }

    /// `XREADGROUP GROUP orders w1 COUNT n STREAMS stockgate:events >` (new entries,
    /// each after every entry an acknowledged one delivered), or with `0` when `again`
    /// (the worker's pending entries: none it acknowledged, none trimmed).
    async fn read_group(&mut self, again: bool, who: &str) {
        let count = self.rng.gen_range(1..=50u32).to_string();
        let from: &[u8] = if again { b"0" } else { b">" };
        let argv: [&[u8]; 9] = [
            b"XREADGROUP",
            b"GROUP",
            ORDERS.as_bytes(),
            WORKER,
            b"COUNT",
            count.as_bytes(),
            b"STREAMS",
            STREAM,
            from,
        ];
        let what = format!(
            "{who} XREADGROUP {ORDERS} {}",
            String::from_utf8_lossy(from)
        );
        let Some((reply, id)) = self.send(&what, &argv).await else {
            return;
        };
        let what = format!("{what} on n{id}");
        if let Reply::Error(e) = &reply {
            return feed_checks::group_read_failed(&self.r, ORDERS, &what, e);
        }
        let es = stream_entries(&reply);
        self.r.note(format!("{what}: {} entries", es.len()));
        self.saw(id, &es, &what);
        let now = Instant::now();
        let mut l = self.log.lock();
        let mut bad = Vec::new();
        if again {
            for (lsn, fp) in &es {
                if l.acked.contains(lsn) {
                    bad.push(format!(
                        "{what}: entry {lsn}-0 pending again after its XACK was acknowledged"
                    ));
                }
                if fp.is_none() {
                    bad.push(format!(
                        "{what}: consumer group {ORDERS} finds its pending entry {lsn}-0 trimmed"
                    ));
                }
                if l.claimed.contains(lsn) {
                    bad.push(format!(
                        "{what}: entry {lsn}-0 pending for {} again after {} claimed it",
                        claims::FIRST,
                        claims::SECOND
                    ));
                }
                self.pending.entry(*lsn).or_insert(now);
            }
        } else {
            if let Some((first, _)) = es.first().filter(|e| e.0 <= l.delivered) {
                bad.push(format!("{what}: entry {first}-0 delivered again (an acknowledged XREADGROUP delivered up to {}-0)", l.delivered));
            }
            if let Some((last, _)) = es.last() {
                l.delivered = l.delivered.max(*last);
            }
            l.counts[count::DELIVERED] += es.len() as u64;
            self.pending.extend(es.iter().map(|e| (e.0, now)));
        }
        drop(l);
        for b in bad {
            self.r.fail(b);
        }
    }
}
