//! The registry of every consumer group, and the logging of their records: creation and
//! destruction, changes under the group's lock, checkpoints before a snapshot deletes
//! anything, and recovery from the records after the snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Group, GroupLimits, GroupRecord};
use crate::engine::event::{EventRef, Lsn};
use crate::engine::Clock;
use crate::feed::{FeedError, Stream};

/// What INFO shows of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSummary {
    /// The stream's name.
    pub stream: String,
    /// The group's name.
    pub group: String,
    /// How many consumers it has.
    pub consumers: usize,
    /// Entries delivered and not yet acknowledged.
    pub pending: usize,
    /// The LSN of the last entry delivered to the group.
    pub last: Lsn,
    /// Log records (not the group machinery's own) after the last-delivered id: the
    /// entries still to deliver for the all-events stream, an upper bound for a sale's.
    pub lag: u64,
    /// Whether the group's next `>` read would hit a trimmed position.
    pub trimmed: bool,
    /// How long (ms) the slowest unacknowledged entry has waited for its consumer since
    /// its last delivery (`XPENDING`'s largest idle time), 0 when none is pending.
    pub oldest_pending_ms: u64,
}

type Key = (String, String);

/// The registry of every group, and the logging of their records.
pub struct Groups {
    /// Where group records are logged: the WAL, or a Raft member's leader batches.
    sink: Arc<dyn crate::engine::EventSink>,
    map: Mutex<BTreeMap<Key, GroupRef>>,
    /// LSNs of recent group records, so the lag of the all-events stream does not count
    /// them (they are not entries). Bounded: past it, lag counts a few records high.
    own_lsns: Mutex<BTreeSet<Lsn>>,
    /// What changes logged here and not yet in the log let go of: by the change's LSN,
    /// the oldest position its group needed before it (an `XACK` of the oldest pending
    /// entry, a `SETID` forward, a `DESTROY`). A Raft leader's changes are in force at
    /// once but reach its log only once the group commits them, and may never: until
    /// then the snapshots must still keep what they let go of (`oldest_needed_in_log`).
    released: Mutex<BTreeMap<Lsn, Lsn>>,
    /// Bounds on names, groups and pending entries, checked before any change is logged.
    pub limits: GroupLimits,
    /// The engine's clock: delivery times, idle times and a consumer's last activity
    /// are read from it, so that they move with the time the rest of the member keeps
    /// (and with the simulation's clock, never the wall's).
    clock: Arc<dyn Clock>,
}

const OWN_LSNS: usize = 100_000;

/// A group's handle and its lock, for one command.
pub type GroupRef = Arc<Mutex<Group>>;

/// Wall-clock time in ms since the Unix epoch, for what names itself by the time it was
/// made (a data dir set aside); consumer groups read [`Groups::now_ms`] instead.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Groups {
    /// An empty registry whose records go to `sink`, keeping time by `clock`.
    pub fn new(
        sink: Arc<dyn crate::engine::EventSink>,
        limits: GroupLimits,
        clock: Arc<dyn Clock>,
    ) -> Groups {
        Groups {
            sink,
            map: Mutex::new(BTreeMap::new()),
            own_lsns: Mutex::new(BTreeSet::new()),
            released: Mutex::new(BTreeMap::new()),
            limits,
            clock,
        }
    }

    /// Milliseconds since the Unix epoch by the registry's clock.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Logs `rec` (call with the group's lock held, after applying it) and returns its
    /// LSN: what the reply must wait for.
    pub fn log(&self, rec: &GroupRecord) -> Lsn {
        let (kind, body) = rec.encode();
        let lsn = self.sink.record(&EventRef::Opaque { kind, body: &body });
        let mut own = self.own_lsns.lock();
        own.insert(lsn);
        while own.len() > OWN_LSNS {
            own.pop_first();
        }
        lsn
    }

    /// The last LSN handed out where group records go: the WAL's, or on a Raft leader
    /// the speculation's, ahead of its WAL by the records in flight
    /// (`Feed::group_end`).
    pub fn last_lsn(&self) -> Lsn {
        self.sink.last_lsn()
    }

    /// Logs a record of another module that keeps its state in the same log (the slot
    /// map's changes, `cluster::slots`), through the same sink, so a Raft group
    /// replicates it like the groups' own.
    pub fn log_opaque(&self, kind: u8, body: &[u8]) -> Lsn {
        self.sink.record(&EventRef::Opaque { kind, body })
    }

    /// Checks a group or consumer name (`what` says which, for the message) against the length
    /// limit and UTF-8.
    pub fn check_name(&self, what: &str, name: &[u8]) -> Result<String, FeedError> {
        if name.is_empty() || name.len() > self.limits.max_name {
            return Err(FeedError::BadName(format!(
                "{what} name must be 1 to {} bytes",
                self.limits.max_name
            )));
        }
        String::from_utf8(name.to_vec())
            .map_err(|_| FeedError::BadName(format!("{what} name must be UTF-8")))
    }

    /// The group `group` of `stream`, if it exists.
    pub fn get(&self, stream: &Stream, group: &str) -> Option<GroupRef> {
        self.map
            .lock()
            .get(&(stream.name(), group.to_owned()))
            .cloned()
    }

    /// The groups of one stream, by name.
    pub fn of_stream(&self, stream: &Stream) -> Vec<GroupRef> {
        let name = stream.name();
        self.map
            .lock()
            .iter()
            .filter(|((s, _), _)| *s == name)
            .map(|(_, g)| g.clone())
            .collect()
    }

    /// How many groups there are, over all streams.
    pub fn count(&self) -> usize {
        self.map.lock().len()
    }

    /// `XGROUP CREATE`: `Ok(lsn)` or `BUSYGROUP`.
    pub fn create(&self, stream: &Stream, group: String, last: Lsn) -> Result<Lsn, FeedError> {
        let mut map = self.map.lock();
        let key = (stream.name(), group.clone());
        if map.contains_key(&key) {
            return Err(FeedError::BusyGroup);
        }
        if map.len() >= self.limits.max_groups {
            return Err(FeedError::GroupLimit(format!(
                "too many consumer groups (max {})",
                self.limits.max_groups
            )));
        }
        let rec = GroupRecord::Created {
            stream: key.0.clone(),
            group: group.clone(),
            last,
        };
        // Logged under the registry lock: no record of this group can precede it.
        let lsn = self.log(&rec);
        map.insert(
            key,
            Arc::new(Mutex::new(Group::new(stream.clone(), group, last))),
        );
        Ok(lsn)
    }

    /// `XGROUP DESTROY`: `Some(lsn)` if it existed.
    pub fn destroy(&self, stream: &Stream, group: &str) -> Option<Lsn> {
        let mut map = self.map.lock();
        let g = map.remove(&(stream.name(), group.to_owned()))?;
        let mut g = g.lock();
        g.mark_destroyed();
        let lsn = self.log(&GroupRecord::Destroyed {
            stream: stream.name(),
            group: group.to_owned(),
        });
        self.note_released(lsn, g.oldest_needed());
        Some(lsn)
    }

    /// Runs `f` on a live group under its lock: a group destroyed meanwhile is `None`.
    pub fn with<T>(&self, g: &GroupRef, f: impl FnOnce(&mut Group) -> T) -> Option<T> {
        let mut g = g.lock();
        if g.is_destroyed() {
            return None;
        }
        Some(f(&mut g))
    }

    /// Applies and logs a change of a live group (lock held throughout).
    pub fn change(&self, g: &mut Group, rec: GroupRecord) -> Lsn {
        let before = g.oldest_needed();
        g.apply(&rec);
        let lsn = self.log(&rec);
        if g.oldest_needed() > before {
            self.note_released(lsn, before);
        }
        lsn
    }

    /// The change logged at `lsn` let go of its group's positions from `from` on.
    /// Bounded as `own_lsns` is: a single node's never leave by themselves (nothing asks
    /// `oldest_needed_in_log` there), and a leader never has that many in flight, so the
    /// oldest are the ones safe to forget.
    fn note_released(&self, lsn: Lsn, from: Lsn) {
        let mut r = self.released.lock();
        let at = r.entry(lsn).or_insert(from);
        *at = (*at).min(from);
        while r.len() > OWN_LSNS {
            r.pop_first();
        }
    }

    /// Logs a checkpoint of every group; returns the last LSN logged (0: none). Run after
    /// a snapshot's roll, before the snapshot deletes anything. `prepare` runs first on
    /// each group under its lock (the feed moves `scanned` past records without entries).
    pub fn checkpoint(&self, prepare: impl Fn(&mut Group)) -> Lsn {
        let all: Vec<GroupRef> = self.map.lock().values().cloned().collect();
        let mut last = 0;
        for g in all {
            let mut g = g.lock();
            if g.is_destroyed() {
                continue;
            }
            prepare(&mut g);
            last = last.max(self.log(&g.checkpoint_record()));
        }
        last
    }

    /// [`Self::oldest_needed`] as the log up to `in_log` has the groups: a change logged
    /// here but not yet in the log (a Raft leader's, until the group commits it and this
    /// member applies it) may never be, so what it let go of is still needed. A Raft
    /// member's snapshots keep what is at or after it (`app::feed::snapshot_hold`), so no
    /// group finds its entries trimmed, whichever of the changes in flight commit.
    pub fn oldest_needed_in_log(&self, in_log: Lsn) -> Option<Lsn> {
        let released = {
            let mut r = self.released.lock();
            *r = r.split_off(&in_log.saturating_add(1));
            r.values().min().copied()
        };
        match (self.oldest_needed(), released) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The oldest log position a live group may still read: its oldest pending entry,
    /// or the one after its last-delivered id. None without groups. The groups' state as
    /// this process changed it: on a Raft leader, ahead of the log by the changes not yet
    /// committed (see [`Self::oldest_needed_in_log`]).
    pub fn oldest_needed(&self) -> Option<Lsn> {
        let all: Vec<GroupRef> = self.map.lock().values().cloned().collect();
        all.iter()
            .filter_map(|g| {
                let g = g.lock();
                let first_pending = g.pending.keys().next().copied().unwrap_or(Lsn::MAX);
                (!g.is_destroyed()).then(|| first_pending.min(g.last.saturating_add(1)))
            })
            .min()
    }

    /// A checkpoint record of every live group, logged nowhere: what a replica stores
    /// beside its snapshot (a replica must not log anything of its own).
    pub fn state_records(&self) -> Vec<GroupRecord> {
        let all: Vec<GroupRef> = self.map.lock().values().cloned().collect();
        all.iter()
            .filter_map(|g| {
                let g = g.lock();
                (!g.is_destroyed()).then(|| g.checkpoint_record())
            })
            .collect()
    }

    /// Rebuilds the groups from the group records found after the snapshot, in log
    /// order. Returns how many records were applied and how many could not be decoded
    /// (skipped: the order feed's bookkeeping never stops the server from selling).
    pub fn recover<'a>(
        &self,
        records: impl IntoIterator<Item = (Lsn, u8, &'a [u8])>,
    ) -> (usize, usize) {
        let (mut applied, mut bad) = (0, 0);
        let mut map = self.map.lock();
        for (lsn, kind, body) in records {
            let rec = match GroupRecord::decode(kind, body) {
                None => continue,
                Some(Ok(r)) => r,
                Some(Err(e)) => {
                    tracing::warn!("consumer-group record at lsn {lsn} skipped: {e}");
                    bad += 1;
                    continue;
                }
            };
            self.own_lsns.lock().insert(lsn);
            let (stream_name, group_name) = rec.key();
            let Ok(stream) = Stream::parse(stream_name.as_bytes()) else {
                bad += 1;
                continue;
            };
            let key = (stream_name.to_owned(), group_name.to_owned());
            replay(&mut map, key, stream, &rec);
            applied += 1;
        }
        (applied, bad)
    }

    /// Group records in `(after, upto]` that this process knows of (logged or
    /// recovered; the most recent `OWN_LSNS` of them).
    pub fn own_between(&self, after: Lsn, upto: Lsn) -> u64 {
        if after >= upto {
            return 0;
        }
        self.own_lsns.lock().range(after + 1..=upto).count() as u64
    }

    /// Every group, for INFO and the metrics endpoint.
    pub fn summaries(&self, durable: Lsn, first: Lsn) -> Vec<GroupSummary> {
        let all: Vec<GroupRef> = self.map.lock().values().cloned().collect();
        let now = self.now_ms();
        let mut out = Vec::with_capacity(all.len());
        for g in all {
            let g = g.lock();
            let from = g.last.max(g.scanned);
            let records = durable.saturating_sub(from);
            out.push(GroupSummary {
                stream: g.stream.name(),
                group: g.name.clone(),
                consumers: g.consumers.len(),
                pending: g.pending.len(),
                last: g.last,
                lag: records.saturating_sub(self.own_between(from, durable)),
                trimmed: g.next_unread() < first && g.last < durable,
                oldest_pending_ms: g
                    .pending
                    .values()
                    .map(|n| n.delivery_ms)
                    .min()
                    .map_or(0, |t| now.saturating_sub(t)),
            });
        }
        out
    }

    /// The lag of one group (see [`GroupSummary::lag`]).
    pub fn lag(&self, g: &Group, durable: Lsn) -> u64 {
        let from = g.last.max(g.scanned);
        durable
            .saturating_sub(from)
            .saturating_sub(self.own_between(from, durable))
    }
}

/// One recovered record's change to the registry: creation and destruction here, a
/// checkpoint (which may meet a group whose creation was deleted) or any other change
/// through the group's [`Group::apply`].
fn replay(map: &mut BTreeMap<Key, GroupRef>, key: Key, stream: Stream, rec: &GroupRecord) {
    match rec {
        GroupRecord::Created { last, .. } => {
            let group = Group::new(stream, key.1.clone(), *last);
            map.insert(key, Arc::new(Mutex::new(group)));
        }
        GroupRecord::Destroyed { .. } => {
            map.remove(&key);
        }
        GroupRecord::Checkpoint { .. } => {
            let name = key.1.clone();
            let g = map
                .entry(key)
                .or_insert_with(|| Arc::new(Mutex::new(Group::new(stream, name, 0))));
            g.lock().apply(rec);
        }
        _ => {
            if let Some(g) = map.get(&key) {
                g.lock().apply(rec);
            }
        }
    }
}
