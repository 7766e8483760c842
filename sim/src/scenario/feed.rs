//! `Settings::feed`: consumers of the order feed alongside the clients, drawn from the
//! seed. The feed is every member's own (`Member::feed`, opened as `app::feed` opens a
//! server's), over its WAL, which holds committed batches only; its consumer groups
//! hold that member's snapshots back (`app::feed::snapshot_hold`).
//!
//! - **A reader** reads `stockgate:events` with what `XREAD` and `XRANGE` call
//!   (`Feed::read_after`, `Feed::scan`) on any member that is up, leader or follower.
//! - **A materializer** reads on from its position on the member taking writes, "commits"
//!   each batch, then moves its group `hold.m` to the batch's last id (`XGROUP SETID`),
//!   which it never reads through: the group only holds snapshots back. Now and then it
//!   lags for a long while.
//! - **A group consumer** reads through the group `orders` (`XREADGROUP >`: entries
//!   delivered and pending), acknowledges them a drawn while later (`XACK`), and now and
//!   then reads its pending entries again (`XREADGROUP` with an id).
//!
//! Group commands run on the member taking writes (a follower refuses them) through the
//! feed's group API as the command layer calls it (`cmd/group`); their replies wait for
//! the group's commit like any write's (`Done::Feed`). What the checks are:
//! `feed_checks.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::engine::Lsn;
use stockgate_server::feed::groups::{Group, GroupRecord};
use stockgate_server::feed::{Feed, FeedError, Stream};
use stockgate_server::raft::NodeId;
use tokio::time::{sleep, Instant};

use super::feed_checks::{self, Seen, HOLD, ORDERS};
use super::{queue_reply, Cluster, Done};

/// The group consumer's name.
const WORKER: &str = "w1";

/// What the consumers know, as their acknowledged replies told them.
#[derive(Default)]
pub(super) struct Consumers {
    /// Every entry read, for the checks.
    pub(super) seen: Seen,
    /// The reader's position: it reads on after it.
    cursor: Lsn,
    /// The materializer's position: the last entry of the last batch it "committed".
    position: Lsn,
    /// The materializer does nothing until then.
    lag_until: Option<Instant>,
    /// Per group: its creation or a change of it was acknowledged, so the group is in
    /// the group's committed state (the checks hold it to its promises from then on).
    pub(super) registered: BTreeMap<&'static str, bool>,
    /// A group command is in flight: no other of that group meanwhile.
    busy: BTreeMap<&'static str, bool>,
    /// Entries delivered to the worker, acknowledged to it, not yet XACKed: when.
    pending: BTreeMap<Lsn, Instant>,
    /// How long the worker keeps an entry before its XACK (drawn per run).
    ack_after: Duration,
    /// The newest WAL end seen on any member: every entry up to it is committed.
    pub(super) newest: Lsn,
}

/// A group command's reply (`Done::Feed`).
pub(super) enum FeedDone {
    /// `XGROUP CREATE` of a group, at its first position.
    Created(&'static str, Lsn),
    /// `XGROUP SETID hold.m` to the materializer's position.
    SetId(Lsn),
    /// `XREADGROUP` delivered these entries to the worker.
    Delivered(Vec<Lsn>),
    /// `XACK` of these entries.
    Acked(Vec<Lsn>),
}

/// The consumers' loop, until `stop`: one action every 20 to 200 ms, each followed by
/// the check of the members' groups.
pub(super) async fn run(
    c: std::sync::Arc<Cluster>,
    mut rng: StdRng,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    // Which groups this run has (a run without any snapshots as freely as before the
    // feed was simulated: groups hold every member's snapshots back).
    let (hold, orders) = draw_consumers(&c, &mut rng);
    let mut n = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        sleep(Duration::from_millis(rng.gen_range(20..200))).await;
        n += 1;
        let who = format!("f{n}");
        match rng.gen_range(0..10) {
            4..=6 if hold => materialize(&c, &mut rng, &who),
            7..=9 if orders => consume(&c, &mut rng, &who),
            _ => read(&c, &mut rng, &who),
        }
        feed_checks::check_groups(&c);
    }
}

/// Whether the run has the materializer and the group consumer (each in half the runs),
/// and how long the worker keeps an entry before its `XACK`: mostly a few hundred ms,
/// one run in five 3 to 15 s.
fn draw_consumers(c: &Cluster, rng: &mut StdRng) -> (bool, bool) {
    let (hold, orders) = (rng.gen_bool(0.5), rng.gen_bool(0.5));
    let ms = if rng.gen_range(0..5) == 0 {
        rng.gen_range(3_000..15_000)
    } else {
        rng.gen_range(0..300)
    };
    c.consumers.lock().ack_after = Duration::from_millis(ms);
    c.env.history.note(format!(
        "feed: materializer {hold}, group consumer {orders} (acknowledges after {ms} ms)"
    ));
    (hold, orders)
}

/// A member that is up and not stopped, drawn; its feed.
fn any_member(c: &Cluster, rng: &mut StdRng) -> Option<(NodeId, std::sync::Arc<Feed>)> {
    let live = c.live.lock();
    let up: Vec<_> = live
        .values()
        .filter(|m| !c.env.net.is_paused(m.id))
        .map(|m| (m.id, m.feed.clone()))
        .collect();
    (!up.is_empty()).then(|| up[rng.gen_range(0..up.len())].clone())
}

/// The member taking writes (group commands go there), its feed and its engine's clock.
fn writer_feed(c: &Cluster) -> Option<(NodeId, std::sync::Arc<Feed>, u64)> {
    let live = c.live.lock();
    super::newest_writer(&live, &c.env.net).map(|m| (m.id, m.feed.clone(), m.engine.now_ms()))
}

/// The reader: `XREAD` on from its position on any member (a member behind answers
/// nothing new), or one time in four `XRANGE` over entries read already.
fn read(c: &Cluster, rng: &mut StdRng, who: &str) {
    let Some((id, feed)) = any_member(c, rng) else {
        return;
    };
    let count = rng.gen_range(1..=100);
    if rng.gen_range(0..4) == 0 {
        let to = c.consumers.lock().cursor;
        let from = rng.gen_range(0..=to);
        match feed.scan(&Stream::All, from, to, count, false) {
            Ok(s) => feed_checks::saw(c, id, &s.entries, &format!("{who}@n{id} XRANGE")),
            Err(e) => note_error(c, &format!("{who}@n{id} XRANGE {from}-{to}"), &e),
        }
        return;
    }
    let after = c.consumers.lock().cursor;
    match feed.read_after(&Stream::All, after, count) {
        Ok(s) => {
            feed_checks::saw(c, id, &s.entries, &format!("{who}@n{id} XREAD"));
            if let Some(last) = s.entries.last() {
                c.consumers.lock().cursor = last.lsn;
            }
        }
        // Nothing holds the log for a plain reader: it resynchronises and reads on.
        Err(FeedError::Trimmed { first, .. }) => {
            c.env.history.note(format!(
                "{who}@n{id} XREAD after {after}: trimmed, on from {first}"
            ));
            c.consumers.lock().cursor = first.saturating_sub(1);
        }
        Err(e) => note_error(c, &format!("{who}@n{id} XREAD after {after}"), &e),
    }
}

fn note_error(c: &Cluster, what: &str, e: &FeedError) {
    c.env.history.note(format!("{what}: {e}"));
}

/// Whether `group`'s command may go now (none in flight), marking it in flight.
fn take_turn(c: &Cluster, group: &'static str) -> bool {
    let mut st = c.consumers.lock();
    let busy = st.busy.entry(group).or_default();
    !std::mem::replace(busy, true)
}

fn end_turn(c: &Cluster, group: &'static str) {
    c.consumers.lock().busy.insert(group, false);
}

/// `XGROUP CREATE stockgate:events <group> $` on the writer (`$` as `cmd::group` takes
/// it, `Feed::group_end`); the reply waits for the commit. The position it was
/// created at, unless refused (`BUSYGROUP`: an earlier attempt's creation got through).
fn create(c: &Cluster, group: &'static str, (id, feed): (NodeId, &Feed), who: &str) -> Option<Lsn> {
    let last = feed.group_end();
    match feed.groups.create(&Stream::All, group.to_owned(), last) {
        Ok(lsn) => {
            c.env
                .history
                .note(format!("{who}@n{id} XGROUP CREATE {group} {last}"));
            let lsn = lsn.max(feed.last_lsn());
            queue_reply(
                c,
                id,
                lsn,
                Done::Feed(FeedDone::Created(group, last)),
                who.into(),
            );
            Some(last)
        }
        Err(e) => {
            note_error(c, &format!("{who}@n{id} XGROUP CREATE {group}"), &e);
            None
        }
    }
}

/// The materializer: a batch read on from its position on the writer, "committed", then
/// `XGROUP SETID hold.m` to its last entry; one time in sixty it then lags 3 to 30 s
/// (about once a run), holding every member's snapshots back meanwhile.
fn materialize(c: &Cluster, rng: &mut StdRng, who: &str) {
    let lag = c.consumers.lock().lag_until;
    if lag.is_some_and(|t| Instant::now() < t) {
        return;
    }
    let Some((id, feed, _)) = writer_feed(c) else {
        return;
    };
    if !take_turn(c, HOLD) {
        return;
    }
    let Some(g) = feed.groups.get(&Stream::All, HOLD) else {
        // Its first start (or the creation never got through): created at the log's end;
        // the position moves there too (a materializer then resynchronises from the
        // ledger).
        if let Some(last) = create(c, HOLD, (id, &feed), who) {
            c.consumers.lock().position = last;
        } else {
            end_turn(c, HOLD);
        }
        return;
    };
    let position = c.consumers.lock().position;
    let batch = match feed.read_after(&Stream::All, position, rng.gen_range(1..=200)) {
        Ok(s) => s.entries,
        Err(e) => {
            feed_checks::read_failed(c, HOLD, &format!("{who}@n{id} XREAD after {position}"), &e);
            end_turn(c, HOLD);
            return;
        }
    };
    feed_checks::saw(c, id, &batch, &format!("{who}@n{id} materializer"));
    let Some(last) = batch.last().map(|e| e.lsn) else {
        end_turn(c, HOLD);
        return;
    };
    c.consumers.lock().position = last;
    let rec = |g: &mut Group| {
        let stream = g.stream.name();
        let group = g.name.clone();
        feed.groups.change(
            g,
            GroupRecord::SetId {
                stream,
                group,
                last,
            },
        )
    };
    let Some(lsn) = feed.groups.with(&g, rec) else {
        end_turn(c, HOLD);
        return;
    };
    c.env
        .history
        .note(format!("{who}@n{id} XGROUP SETID {HOLD} {last}"));
    let lsn = lsn.max(feed.last_lsn());
    queue_reply(c, id, lsn, Done::Feed(FeedDone::SetId(last)), who.into());
    if rng.gen_range(0..60) == 0 {
        let ms = rng.gen_range(3_000..30_000);
        c.consumers.lock().lag_until = Some(Instant::now() + Duration::from_millis(ms));
        c.env
            .history
            .note(format!("{who} materializer lags {ms} ms"));
    }
}

/// The group consumer: `XACK` of what it kept long enough, else `XREADGROUP >` (one
/// time in five its pending entries again), on the writer.
fn consume(c: &Cluster, rng: &mut StdRng, who: &str) {
    let Some((id, feed, now_ms)) = writer_feed(c) else {
        return;
    };
    if !take_turn(c, ORDERS) {
        return;
    }
    let Some(g) = feed.groups.get(&Stream::All, ORDERS) else {
        if create(c, ORDERS, (id, &feed), who).is_none() {
            end_turn(c, ORDERS);
        }
        return;
    };
    let due: Vec<Lsn> = {
        let st = c.consumers.lock();
        let ripe = |t: &&Instant| t.elapsed() >= st.ack_after;
        st.pending
            .iter()
            .filter(|(_, t)| ripe(t))
            .map(|(l, _)| *l)
            .collect()
    };
    let step = if !due.is_empty() {
        ack(c, (id, &feed), &g, due, who)
    } else if rng.gen_range(0..5) == 0 {
        reread_pending(c, (id, &feed), &g, now_ms, who)
    } else {
        deliver(c, (id, &feed), &g, (now_ms, rng.gen_range(1..=200)), who)
    };
    if !step {
        end_turn(c, ORDERS);
    }
}

/// The consumer's record if it is new (`cmd::group::ensure_consumer`); its LSN, or 0.
pub(super) fn ensure_consumer(feed: &Feed, g: &mut Group, now_ms: u64) -> Lsn {
    if g.consumers.contains_key(WORKER) {
        g.consumer_mut(WORKER, now_ms);
        return 0;
    }
    let rec = GroupRecord::Consumer {
        stream: g.stream.name(),
        group: g.name.clone(),
        consumer: WORKER.to_owned(),
        at_ms: now_ms,
        delete: false,
    };
    feed.groups.change(g, rec)
}

/// `XREADGROUP GROUP orders w1 COUNT n STREAMS stockgate:events >` as
/// `cmd::group::read` runs it: up to `count` entries after the group's last-delivered
/// id, made pending. True when a reply was queued.
fn deliver(
    c: &Cluster,
    (id, feed): (NodeId, &Feed),
    g: &stockgate_server::feed::groups::GroupRef,
    (now_ms, count): (u64, usize),
    who: &str,
) -> bool {
    let read = |g: &mut Group| -> Result<(Vec<Lsn>, Lsn), FeedError> {
        let mut lsn = ensure_consumer(feed, g, now_ms);
        let s = feed.scan(&g.stream.clone(), g.next_unread(), Lsn::MAX, count, false)?;
        g.scanned = g.scanned.max(s.next.saturating_sub(1));
        feed_checks::saw(c, id, &s.entries, &format!("{who}@n{id} XREADGROUP"));
        let ids: Vec<Lsn> = s.entries.iter().map(|e| e.lsn).collect();
        if let Some(&last) = ids.last() {
            let rec = GroupRecord::Delivered {
                stream: g.stream.name(),
                group: g.name.clone(),
                consumer: WORKER.to_owned(),
                at_ms: now_ms,
                last,
                new: ids.clone(),
                again: Vec::new(),
            };
            lsn = lsn.max(feed.groups.change(g, rec));
        }
        Ok((ids, lsn))
    };
    let what = format!("{who}@n{id} XREADGROUP {ORDERS} >");
    let read = feed.groups.with(g, read);
    delivered(c, (id, feed), read, &what, who)
}

/// `XREADGROUP GROUP orders w1 COUNT 20 STREAMS stockgate:events 0` as
/// `cmd::group::read` runs it: the worker's pending entries again, one more delivery
/// each. One the log no longer has is lost to the worker (`feed_checks::pending_lost`).
/// True when a reply was queued.
fn reread_pending(
    c: &Cluster,
    (id, feed): (NodeId, &Feed),
    g: &stockgate_server::feed::groups::GroupRef,
    now_ms: u64,
    who: &str,
) -> bool {
    let what = format!("{who}@n{id} XREADGROUP {ORDERS} 0");
    let read = |g: &mut Group| -> Result<(Vec<Lsn>, Lsn), FeedError> {
        let mut lsn = ensure_consumer(feed, g, now_ms);
        let ids: Vec<Lsn> = g
            .consumers
            .get(WORKER)
            .map(|w| w.pending.iter().take(20).copied().collect())
            .unwrap_or_default();
        let mut again = Vec::with_capacity(ids.len());
        for l in ids {
            match feed.entry_at(&g.stream, l)? {
                Some(e) => {
                    feed_checks::saw(c, id, std::slice::from_ref(&e), &what);
                    again.push(l);
                }
                None => feed_checks::pending_lost(c, (id, feed), ORDERS, l),
            }
        }
        if !again.is_empty() {
            let rec = GroupRecord::Delivered {
                stream: g.stream.name(),
                group: g.name.clone(),
                consumer: WORKER.to_owned(),
                at_ms: now_ms,
                last: 0,
                new: Vec::new(),
                again: again.clone(),
            };
            lsn = lsn.max(feed.groups.change(g, rec));
        }
        Ok((again, lsn))
    };
    let read = feed.groups.with(g, read);
    delivered(c, (id, feed), read, &what, who)
}

/// What an `XREADGROUP` of the group consumer delivered: its reply queued behind the
/// group change's LSN (true), nothing to reply yet (false), or the read refused.
fn delivered(
    c: &Cluster,
    (id, feed): (NodeId, &Feed),
    read: Option<Result<(Vec<Lsn>, Lsn), FeedError>>,
    what: &str,
    who: &str,
) -> bool {
    match read {
        Some(Ok((ids, lsn))) if lsn > 0 => {
            c.env.history.note(format!("{what}: {} entries", ids.len()));
            let lsn = lsn.max(feed.last_lsn());
            queue_reply(c, id, lsn, Done::Feed(FeedDone::Delivered(ids)), who.into());
            true
        }
        Some(Ok(_)) | None => false,
        Some(Err(e)) => {
            feed_checks::read_failed(c, ORDERS, what, &e);
            false
        }
    }
}

/// `XACK stockgate:events orders <ids>` as `cmd::group::ack` runs it: only ids still
/// pending are acknowledged. True when a reply was queued.
fn ack(
    c: &Cluster,
    (id, feed): (NodeId, &Feed),
    g: &stockgate_server::feed::groups::GroupRef,
    mut ids: Vec<Lsn>,
    who: &str,
) -> bool {
    let run = |g: &mut Group| {
        ids.retain(|l| g.pending.contains_key(l));
        if ids.is_empty() {
            return 0;
        }
        let rec = GroupRecord::Acked {
            stream: g.stream.name(),
            group: g.name.clone(),
            ids: ids.clone(),
        };
        feed.groups.change(g, rec)
    };
    let lsn = feed.groups.with(g, run).unwrap_or(0);
    c.env
        .history
        .note(format!("{who}@n{id} XACK {ORDERS} {} entries", ids.len()));
    let lsn = lsn.max(feed.last_lsn());
    queue_reply(c, id, lsn, Done::Feed(FeedDone::Acked(ids)), who.into());
    true
}

/// A group command's reply: `Ok` once the group committed its records.
pub(super) fn reply(c: &Cluster, who: &str, done: FeedDone, r: Result<(), String>) {
    let group = match &done {
        FeedDone::Created(g, _) => *g,
        FeedDone::SetId(_) => HOLD,
        FeedDone::Delivered(_) | FeedDone::Acked(_) => ORDERS,
    };
    end_turn(c, group);
    if let Err(e) = r {
        c.env.history.note(format!("{who} unanswered: {e}"));
        return;
    }
    let mut st = c.consumers.lock();
    st.registered.insert(group, true);
    let what = match &done {
        FeedDone::Created(g, at) => format!("{g} created at {at}"),
        FeedDone::SetId(at) => format!("{HOLD} at {at}"),
        FeedDone::Delivered(ids) => format!("{} delivered", ids.len()),
        FeedDone::Acked(ids) => format!("{} acknowledged", ids.len()),
    };
    c.env.history.note(format!("{who} acked: {what}"));
    match done {
        FeedDone::Delivered(ids) => {
            let now = Instant::now();
            st.pending.extend(ids.into_iter().map(|l| (l, now)));
        }
        FeedDone::Acked(ids) => {
            for l in ids {
                st.pending.remove(&l);
            }
        }
        FeedDone::Created(..) | FeedDone::SetId(_) => {}
    }
}
