//! Consumer groups over the feed's streams (`XGROUP`, `XREADGROUP`, `XACK`, `XPENDING`,
//! `XCLAIM`, `XAUTOCLAIM`), with their state in the write-ahead log.
//!
//! Every change of a group is a [`GroupRecord`], logged as an opaque WAL record (kinds
//! `wal::record::K_GROUP_*`; the engine skips them on replay). A change is applied to the
//! in-memory state by [`Group::apply`] and logged *under the group's lock*, so the log
//! order of one group's records is the order of its changes, and replaying them through
//! the same `apply` rebuilds the state exactly. The caller waits for the returned LSN to
//! be durable before it answers, like every other write.
//!
//! Snapshots delete the segments they cover, and with them old group records: before a
//! snapshot may delete anything, [`Groups::checkpoint`] logs each group's whole state as
//! one [`GroupRecord::Checkpoint`] after the snapshot's position, so recovery (the
//! snapshot, then the records after it) always meets a checkpoint of every group that
//! existed before the snapshot.
//!
//! Bounds (a client cannot grow them without limit): [`GroupLimits`]. The largest record,
//! a checkpoint at every bound, stays under the WAL's 1 MiB payload limit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{FeedError, Stream};
use crate::engine::event::{EventRef, Lsn};
use crate::wal::codec::{put_str, put_u64, DecodeError, Reader};
use crate::wal::record::{
    K_GROUP_ACKED, K_GROUP_CHECKPOINT, K_GROUP_CLAIMED, K_GROUP_CONSUMER, K_GROUP_CREATED,
    K_GROUP_DELIVERED, K_GROUP_DESTROYED, K_GROUP_SET_ID,
};

/// Limits of consumer groups, documented in docs/feed.md.
#[derive(Clone, Copy, Debug)]
pub struct GroupLimits {
    /// Groups over all streams.
    pub max_groups: usize,
    /// Consumers per group.
    pub max_consumers: usize,
    /// Pending (delivered, unacknowledged) entries per group. A `>` read delivers at
    /// most what is left; a full group is refused until entries are acknowledged.
    pub max_pending: usize,
    /// Bytes of a group or consumer name.
    pub max_name: usize,
}

impl Default for GroupLimits {
    fn default() -> Self {
        // A checkpoint at these bounds: 10,000 x ~40 B of pending entries plus
        // 1,000 x ~230 B of consumers, well under the 1 MiB record limit.
        GroupLimits {
            max_groups: 1000,
            max_consumers: 1000,
            max_pending: 10_000,
            max_name: 200,
        }
    }
}

/// One change of a group, as logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupRecord {
    Created {
        stream: String,
        group: String,
        last: Lsn,
    },
    Destroyed {
        stream: String,
        group: String,
    },
    SetId {
        stream: String,
        group: String,
        last: Lsn,
    },
    /// `XGROUP CREATECONSUMER` (`delete` false) or `DELCONSUMER` (true: its pending
    /// entries leave the group).
    Consumer {
        stream: String,
        group: String,
        consumer: String,
        at_ms: u64,
        delete: bool,
    },
    /// `XREADGROUP`: `new` entries are pending for `consumer` with one delivery (empty
    /// under NOACK), the group's last-delivered id becomes `last` (0: unchanged), and the
    /// `again` entries (a history read) count one more delivery.
    Delivered {
        stream: String,
        group: String,
        consumer: String,
        at_ms: u64,
        last: Lsn,
        new: Vec<Lsn>,
        again: Vec<Lsn>,
    },
    Acked {
        stream: String,
        group: String,
        ids: Vec<Lsn>,
    },
    /// `XCLAIM`/`XAUTOCLAIM`: `ids` now belong to `consumer`, delivered at `delivery_ms`;
    /// `bump` adds a delivery, `retry` (if set) overrides the count; `dropped` entries
    /// left the log (trimmed) and leave the pending list.
    Claimed {
        stream: String,
        group: String,
        consumer: String,
        at_ms: u64,
        delivery_ms: u64,
        ids: Vec<Lsn>,
        bump: bool,
        retry: Option<u64>,
        dropped: Vec<Lsn>,
    },
    /// A group's whole state: replaces what replay built so far. `scanned` is how far
    /// the log past `last` is known to hold no entry of the stream (the records a
    /// snapshot is about to delete may be only the groups' own).
    Checkpoint {
        stream: String,
        group: String,
        last: Lsn,
        scanned: Lsn,
        /// (name, seen_ms, active_ms or 0 for never)
        consumers: Vec<(String, u64, u64)>,
        /// (id, index into `consumers`, delivery_ms, delivery count)
        pending: Vec<(Lsn, u64, u64, u64)>,
    },
}

fn put_ids(out: &mut Vec<u8>, ids: &[Lsn]) {
    put_u64(out, ids.len() as u64);
    // Ascending ids as deltas: a batch of 10,000 adjacent ids is ~10 KB, not 80.
    let mut prev = 0u64;
    for &id in ids {
        put_u64(out, id.wrapping_sub(prev));
        prev = id;
    }
}

fn get_ids(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<Lsn>, DecodeError> {
    let n = r.count(what)?;
    let mut v = Vec::with_capacity(n.min(1 << 16));
    let mut prev = 0u64;
    for _ in 0..n {
        prev = prev.wrapping_add(r.u64(what)?);
        v.push(prev);
    }
    Ok(v)
}

impl GroupRecord {
    pub fn key(&self) -> (&str, &str) {
        match self {
            GroupRecord::Created { stream, group, .. }
            | GroupRecord::Destroyed { stream, group }
            | GroupRecord::SetId { stream, group, .. }
            | GroupRecord::Consumer { stream, group, .. }
            | GroupRecord::Delivered { stream, group, .. }
            | GroupRecord::Acked { stream, group, .. }
            | GroupRecord::Claimed { stream, group, .. }
            | GroupRecord::Checkpoint { stream, group, .. } => (stream, group),
        }
    }

    /// The WAL kind and body.
    pub fn encode(&self) -> (u8, Vec<u8>) {
        let mut out = Vec::new();
        let (stream, group) = self.key();
        put_str(&mut out, stream);
        put_str(&mut out, group);
        let kind = match self {
            GroupRecord::Created { last, .. } => {
                put_u64(&mut out, *last);
                K_GROUP_CREATED
            }
            GroupRecord::Destroyed { .. } => K_GROUP_DESTROYED,
            GroupRecord::SetId { last, .. } => {
                put_u64(&mut out, *last);
                K_GROUP_SET_ID
            }
            GroupRecord::Consumer {
                consumer,
                at_ms,
                delete,
                ..
            } => {
                put_str(&mut out, consumer);
                put_u64(&mut out, *at_ms);
                out.push(u8::from(*delete));
                K_GROUP_CONSUMER
            }
            GroupRecord::Delivered {
                consumer,
                at_ms,
                last,
                new,
                again,
                ..
            } => {
                put_str(&mut out, consumer);
                put_u64(&mut out, *at_ms);
                put_u64(&mut out, *last);
                put_ids(&mut out, new);
                put_ids(&mut out, again);
                K_GROUP_DELIVERED
            }
            GroupRecord::Acked { ids, .. } => {
                put_ids(&mut out, ids);
                K_GROUP_ACKED
            }
            GroupRecord::Claimed {
                consumer,
                at_ms,
                delivery_ms,
                ids,
                bump,
                retry,
                dropped,
                ..
            } => {
                put_str(&mut out, consumer);
                put_u64(&mut out, *at_ms);
                put_u64(&mut out, *delivery_ms);
                put_ids(&mut out, ids);
                out.push(u8::from(*bump));
                // 0: no override; n + 1: count n.
                put_u64(&mut out, retry.map_or(0, |r| r.saturating_add(1)));
                put_ids(&mut out, dropped);
                K_GROUP_CLAIMED
            }
            GroupRecord::Checkpoint {
                last,
                scanned,
                consumers,
                pending,
                ..
            } => {
                put_u64(&mut out, *last);
                put_u64(&mut out, *scanned);
                put_u64(&mut out, consumers.len() as u64);
                for (name, seen, active) in consumers {
                    put_str(&mut out, name);
                    put_u64(&mut out, *seen);
                    put_u64(&mut out, *active);
                }
                put_u64(&mut out, pending.len() as u64);
                for (id, c, at, n) in pending {
                    put_u64(&mut out, *id);
                    put_u64(&mut out, *c);
                    put_u64(&mut out, *at);
                    put_u64(&mut out, *n);
                }
                K_GROUP_CHECKPOINT
            }
        };
        (kind, out)
    }

    /// `None`: not a group record kind.
    pub fn decode(kind: u8, body: &[u8]) -> Option<Result<GroupRecord, DecodeError>> {
        if !(K_GROUP_CREATED..=K_GROUP_CHECKPOINT).contains(&kind) {
            return None;
        }
        Some(Self::decode_body(kind, body))
    }

    fn decode_body(kind: u8, body: &[u8]) -> Result<GroupRecord, DecodeError> {
        let mut r = Reader::new(body);
        let stream = r.string("stream")?;
        let group = r.string("group")?;
        let flag = |r: &mut Reader<'_>, what| r.u8(what).map(|b| b != 0);
        let rec = match kind {
            K_GROUP_CREATED => GroupRecord::Created {
                stream,
                group,
                last: r.u64("last")?,
            },
            K_GROUP_DESTROYED => GroupRecord::Destroyed { stream, group },
            K_GROUP_SET_ID => GroupRecord::SetId {
                stream,
                group,
                last: r.u64("last")?,
            },
            K_GROUP_CONSUMER => GroupRecord::Consumer {
                stream,
                group,
                consumer: r.string("consumer")?,
                at_ms: r.u64("at_ms")?,
                delete: flag(&mut r, "delete")?,
            },
            K_GROUP_DELIVERED => GroupRecord::Delivered {
                stream,
                group,
                consumer: r.string("consumer")?,
                at_ms: r.u64("at_ms")?,
                last: r.u64("last")?,
                new: get_ids(&mut r, "new")?,
                again: get_ids(&mut r, "again")?,
            },
            K_GROUP_ACKED => GroupRecord::Acked {
                stream,
                group,
                ids: get_ids(&mut r, "ids")?,
            },
            K_GROUP_CLAIMED => GroupRecord::Claimed {
                stream,
                group,
                consumer: r.string("consumer")?,
                at_ms: r.u64("at_ms")?,
                delivery_ms: r.u64("delivery_ms")?,
                ids: get_ids(&mut r, "ids")?,
                bump: flag(&mut r, "bump")?,
                retry: r.u64("retry")?.checked_sub(1),
                dropped: get_ids(&mut r, "dropped")?,
            },
            _ => {
                let last = r.u64("last")?;
                let scanned = r.u64("scanned")?;
                let nc = r.count("consumers")?;
                let mut consumers = Vec::with_capacity(nc.min(4096));
                for _ in 0..nc {
                    consumers.push((r.string("consumer")?, r.u64("seen")?, r.u64("active")?));
                }
                let np = r.count("pending")?;
                let mut pending = Vec::with_capacity(np.min(1 << 16));
                for _ in 0..np {
                    pending.push((
                        r.u64("id")?,
                        r.u64("owner")?,
                        r.u64("delivery")?,
                        r.u64("count")?,
                    ));
                }
                GroupRecord::Checkpoint {
                    stream,
                    group,
                    last,
                    scanned,
                    consumers,
                    pending,
                }
            }
        };
        r.finish()?;
        Ok(rec)
    }
}

/// A pending entry: delivered to `consumer`, not acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nack {
    pub consumer: String,
    pub delivery_ms: u64,
    pub count: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Consumer {
    /// Last time it read or claimed (also an empty read; not logged on its own).
    pub seen_ms: u64,
    /// Last time it was given an entry (0: never).
    pub active_ms: u64,
    pub pending: BTreeSet<Lsn>,
}

/// One consumer group.
#[derive(Debug)]
pub struct Group {
    pub stream: Stream,
    pub name: String,
    /// The last-delivered id: `>` reads continue after it.
    pub last: Lsn,
    /// How far `>` reads have examined the log past `last` without finding an entry of
    /// the stream (records of other sales, the groups' own records). Not logged: after a
    /// restart the scan just starts at `last` again.
    pub scanned: Lsn,
    pub consumers: BTreeMap<String, Consumer>,
    pub pending: BTreeMap<Lsn, Nack>,
    /// Removed from the registry (a holder of an old handle must not log for it).
    destroyed: bool,
}

impl Group {
    fn new(stream: Stream, name: String, last: Lsn) -> Group {
        Group {
            stream,
            name,
            last,
            scanned: 0,
            consumers: BTreeMap::new(),
            pending: BTreeMap::new(),
            destroyed: false,
        }
    }

    /// Where the next `>` read starts examining the log.
    pub fn next_unread(&self) -> Lsn {
        self.last.max(self.scanned).saturating_add(1)
    }

    /// The consumer (created if new) with its seen time moved to `at_ms`.
    pub fn consumer_mut(&mut self, name: &str, at_ms: u64) -> &mut Consumer {
        let c = self.consumers.entry(name.to_owned()).or_default();
        c.seen_ms = c.seen_ms.max(at_ms);
        c
    }

    fn drop_pending(&mut self, id: Lsn) -> bool {
        match self.pending.remove(&id) {
            Some(n) => {
                if let Some(c) = self.consumers.get_mut(&n.consumer) {
                    c.pending.remove(&id);
                }
                true
            }
            None => false,
        }
    }

    /// The one state transition of a record, live and at replay. Create/destroy are
    /// handled by the registry.
    pub fn apply(&mut self, rec: &GroupRecord) {
        match rec {
            GroupRecord::Created { .. } | GroupRecord::Destroyed { .. } => {}
            GroupRecord::SetId { last, .. } => {
                self.last = *last;
                self.scanned = 0;
            }
            GroupRecord::Consumer {
                consumer,
                at_ms,
                delete,
                ..
            } => {
                if *delete {
                    if let Some(c) = self.consumers.remove(consumer) {
                        for id in c.pending {
                            self.pending.remove(&id);
                        }
                    }
                } else {
                    self.consumer_mut(consumer, *at_ms);
                }
            }
            GroupRecord::Delivered {
                consumer,
                at_ms,
                last,
                new,
                again,
                ..
            } => {
                if *last > 0 {
                    self.last = self.last.max(*last);
                }
                let c = self.consumer_mut(consumer, *at_ms);
                if !new.is_empty() || !again.is_empty() {
                    c.active_ms = *at_ms;
                }
                for id in new {
                    c.pending.insert(*id);
                }
                for id in new {
                    let old = self.pending.insert(
                        *id,
                        Nack {
                            consumer: consumer.clone(),
                            delivery_ms: *at_ms,
                            count: 1,
                        },
                    );
                    // An id cannot be new twice, but if a log says so the entry has
                    // exactly one owner: the new one.
                    if let Some(o) = old.filter(|o| o.consumer != *consumer) {
                        if let Some(oc) = self.consumers.get_mut(&o.consumer) {
                            oc.pending.remove(id);
                        }
                    }
                }
                for id in again {
                    if let Some(n) = self.pending.get_mut(id) {
                        n.count = n.count.saturating_add(1);
                        n.delivery_ms = *at_ms;
                    }
                }
            }
            GroupRecord::Acked { ids, .. } => {
                for id in ids {
                    self.drop_pending(*id);
                }
            }
            GroupRecord::Claimed {
                consumer,
                at_ms,
                delivery_ms,
                ids,
                bump,
                retry,
                dropped,
                ..
            } => {
                for id in dropped {
                    self.drop_pending(*id);
                }
                self.consumer_mut(consumer, *at_ms);
                for id in ids {
                    let Some(n) = self.pending.get_mut(id) else {
                        continue;
                    };
                    let prev = std::mem::replace(&mut n.consumer, consumer.clone());
                    n.delivery_ms = *delivery_ms;
                    if *bump {
                        n.count = n.count.saturating_add(1);
                    }
                    if let Some(r) = retry {
                        n.count = *r;
                    }
                    if prev != *consumer {
                        if let Some(pc) = self.consumers.get_mut(&prev) {
                            pc.pending.remove(id);
                        }
                    }
                    if let Some(c) = self.consumers.get_mut(consumer) {
                        c.pending.insert(*id);
                        c.active_ms = *at_ms;
                    }
                }
            }
            GroupRecord::Checkpoint {
                last,
                scanned,
                consumers,
                pending,
                ..
            } => {
                self.last = *last;
                self.scanned = *scanned;
                self.consumers.clear();
                self.pending.clear();
                for (name, seen, active) in consumers {
                    self.consumers.insert(
                        name.clone(),
                        Consumer {
                            seen_ms: *seen,
                            active_ms: *active,
                            pending: BTreeSet::new(),
                        },
                    );
                }
                for (id, owner, at, n) in pending {
                    let Some((name, _, _)) = consumers.get(*owner as usize) else {
                        continue;
                    };
                    if let Some(c) = self.consumers.get_mut(name) {
                        c.pending.insert(*id);
                    }
                    self.pending.insert(
                        *id,
                        Nack {
                            consumer: name.clone(),
                            delivery_ms: *at,
                            count: *n,
                        },
                    );
                }
            }
        }
    }

    fn checkpoint_record(&self) -> GroupRecord {
        let names: Vec<&String> = self.consumers.keys().collect();
        let index: BTreeMap<&str, u64> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), i as u64))
            .collect();
        GroupRecord::Checkpoint {
            stream: self.stream.name(),
            group: self.name.clone(),
            last: self.last,
            scanned: self.scanned,
            consumers: self
                .consumers
                .iter()
                .map(|(n, c)| (n.clone(), c.seen_ms, c.active_ms))
                .collect(),
            pending: self
                .pending
                .iter()
                .filter_map(|(id, n)| {
                    let i = index.get(n.consumer.as_str())?;
                    Some((*id, *i, n.delivery_ms, n.count))
                })
                .collect(),
        }
    }

    /// The oldest id the group still needs from the log: its oldest pending entry, or
    /// the entry after its last-delivered id.
    pub fn oldest_needed(&self) -> Lsn {
        let next = self.last.saturating_add(1);
        self.pending.keys().next().map_or(next, |&p| p.min(next))
    }
}

/// What INFO shows of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSummary {
    pub stream: String,
    pub group: String,
    pub consumers: usize,
    pub pending: usize,
    pub last: Lsn,
    /// Log records (not the group machinery's own) after the last-delivered id: the
    /// entries still to deliver for the all-events stream, an upper bound for a sale's.
    pub lag: u64,
    /// Whether the group's next `>` read would hit a trimmed position.
    pub trimmed: bool,
}

type Key = (String, String);

/// The registry of every group, and the logging of their records.
pub struct Groups {
    /// Where group records are logged: the WAL, or a Raft member's leader batches.
    wal: Arc<dyn crate::engine::EventSink>,
    map: Mutex<BTreeMap<Key, Arc<Mutex<Group>>>>,
    /// LSNs of recent group records, so the lag of the all-events stream does not count
    /// them (they are not entries). Bounded: past it, lag counts a few records high.
    own: Mutex<BTreeSet<Lsn>>,
    pub limits: GroupLimits,
}

const OWN_LSNS: usize = 100_000;

/// A group's handle and its lock, for one command.
pub type GroupRef = Arc<Mutex<Group>>;

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Groups {
    pub fn new(wal: Arc<dyn crate::engine::EventSink>, limits: GroupLimits) -> Groups {
        Groups {
            wal,
            map: Mutex::new(BTreeMap::new()),
            own: Mutex::new(BTreeSet::new()),
            limits,
        }
    }

    /// Logs `rec` (call with the group's lock held, after applying it) and returns its
    /// LSN: what the reply must wait for.
    pub fn log(&self, rec: &GroupRecord) -> Lsn {
        let (kind, body) = rec.encode();
        let lsn = self.wal.record(&EventRef::Opaque { kind, body: &body });
        let mut own = self.own.lock();
        own.insert(lsn);
        while own.len() > OWN_LSNS {
            own.pop_first();
        }
        lsn
    }

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
        g.destroyed = true;
        Some(self.log(&GroupRecord::Destroyed {
            stream: stream.name(),
            group: group.to_owned(),
        }))
    }

    /// Runs `f` on a live group under its lock: a group destroyed meanwhile is `None`.
    pub fn with<T>(&self, g: &GroupRef, f: impl FnOnce(&mut Group) -> T) -> Option<T> {
        let mut g = g.lock();
        if g.destroyed {
            return None;
        }
        Some(f(&mut g))
    }

    /// Applies and logs a change of a live group (lock held throughout).
    pub fn change(&self, g: &mut Group, rec: GroupRecord) -> Lsn {
        g.apply(&rec);
        self.log(&rec)
    }

    /// Logs a checkpoint of every group; returns the last LSN logged (0: none). Run after
    /// a snapshot's roll, before the snapshot deletes anything. `prepare` runs first on
    /// each group under its lock (the feed moves `scanned` past records without entries).
    pub fn checkpoint(&self, prepare: impl Fn(&mut Group)) -> Lsn {
        let all: Vec<GroupRef> = self.map.lock().values().cloned().collect();
        let mut last = 0;
        for g in all {
            let mut g = g.lock();
            if g.destroyed {
                continue;
            }
            prepare(&mut g);
            last = last.max(self.log(&g.checkpoint_record()));
        }
        last
    }

    /// The oldest log position a live group may still read: its oldest pending entry,
    /// or the one after its last-delivered id (both replicated, so every member computes
    /// the same). None without groups. A Raft member's snapshots keep what is at or after
    /// it (`crate::raft::snapshot`), so no group finds its entries trimmed.
    pub fn oldest_needed(&self) -> Option<Lsn> {
        let all: Vec<GroupRef> = self.map.lock().values().cloned().collect();
        all.iter()
            .filter_map(|g| {
                let g = g.lock();
                let first_pending = g.pending.keys().next().copied().unwrap_or(Lsn::MAX);
                (!g.destroyed).then(|| first_pending.min(g.last.saturating_add(1)))
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
                (!g.destroyed).then(|| g.checkpoint_record())
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
            self.own.lock().insert(lsn);
            let (s, gname) = rec.key();
            let Ok(stream) = Stream::parse(s.as_bytes()) else {
                bad += 1;
                continue;
            };
            let key = (s.to_owned(), gname.to_owned());
            match &rec {
                GroupRecord::Created { last, .. } => {
                    map.insert(
                        key.clone(),
                        Arc::new(Mutex::new(Group::new(stream, key.1, *last))),
                    );
                }
                GroupRecord::Destroyed { .. } => {
                    map.remove(&key);
                }
                GroupRecord::Checkpoint { .. } => {
                    let g = map.entry(key.clone()).or_insert_with(|| {
                        Arc::new(Mutex::new(Group::new(stream, key.1.clone(), 0)))
                    });
                    g.lock().apply(&rec);
                }
                _ => {
                    if let Some(g) = map.get(&key) {
                        g.lock().apply(&rec);
                    }
                }
            }
            applied += 1;
        }
        (applied, bad)
    }

    /// Group records in `(after, upto]` that this process knows of (logged or
    /// recovered; the most recent [`OWN_LSNS`] of them).
    pub fn own_between(&self, after: Lsn, upto: Lsn) -> u64 {
        if after >= upto {
            return 0;
        }
        self.own.lock().range(after + 1..=upto).count() as u64
    }

    /// Every group, for INFO and the metrics endpoint.
    pub fn summaries(&self, durable: Lsn, first: Lsn) -> Vec<GroupSummary> {
        let all: Vec<GroupRef> = self.map.lock().values().cloned().collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn every_record() -> Vec<GroupRecord> {
        let (s, g) = ("stockgate:events".to_owned(), "orders".to_owned());
        vec![
            GroupRecord::Created {
                stream: s.clone(),
                group: g.clone(),
                last: 7,
            },
            GroupRecord::SetId {
                stream: s.clone(),
                group: g.clone(),
                last: u64::MAX,
            },
            GroupRecord::Consumer {
                stream: s.clone(),
                group: g.clone(),
                consumer: "c1".into(),
                at_ms: 5,
                delete: true,
            },
            GroupRecord::Delivered {
                stream: s.clone(),
                group: g.clone(),
                consumer: "c1".into(),
                at_ms: 9,
                last: 30,
                new: vec![10, 11, 30],
                again: vec![],
            },
            GroupRecord::Acked {
                stream: s.clone(),
                group: g.clone(),
                ids: vec![11],
            },
            GroupRecord::Claimed {
                stream: s.clone(),
                group: g.clone(),
                consumer: "c2".into(),
                at_ms: 100,
                delivery_ms: 90,
                ids: vec![10],
                bump: true,
                retry: Some(0),
                dropped: vec![3],
            },
            GroupRecord::Checkpoint {
                stream: s.clone(),
                group: g.clone(),
                last: 30,
                scanned: 41,
                consumers: vec![("c1".into(), 1, 0), ("c2".into(), 2, 3)],
                pending: vec![(10, 1, 90, 2), (30, 0, 9, 1)],
            },
            GroupRecord::Destroyed {
                stream: s,
                group: g,
            },
        ]
    }

    #[test]
    fn feed_group_records_round_trip() {
        for rec in every_record() {
            let (kind, body) = rec.encode();
            assert_eq!(GroupRecord::decode(kind, &body).unwrap().unwrap(), rec);
            // A damaged body is an error, never a panic or a wrong record.
            for cut in 0..body.len() {
                if let Some(Ok(r)) = GroupRecord::decode(kind, &body[..cut]) {
                    panic!("truncated body decoded as {r:?}");
                }
            }
        }
        assert!(GroupRecord::decode(1, &[]).is_none());
    }

    /// The largest group record a client can cause, a checkpoint of a group at every
    /// bound with the widest values, fits in one WAL record: logging it can never fail
    /// (a record that cannot be logged stops the log).
    #[test]
    fn feed_group_checkpoint_at_every_bound_fits_in_a_record() {
        let l = GroupLimits::default();
        let name = |i: usize| format!("{i:0>width$}", width = l.max_name);
        let mut g = Group::new(Stream::All, name(0), u64::MAX);
        g.scanned = u64::MAX;
        for c in 0..l.max_consumers {
            g.consumers.insert(
                name(c),
                Consumer {
                    seen_ms: u64::MAX,
                    active_ms: u64::MAX,
                    pending: BTreeSet::new(),
                },
            );
        }
        for i in 0..l.max_pending as u64 {
            let id = u64::MAX - i * 1_000_003;
            g.pending.insert(
                id,
                Nack {
                    consumer: name(l.max_consumers - 1),
                    delivery_ms: u64::MAX,
                    count: u64::MAX,
                },
            );
        }
        let (_, body) = g.checkpoint_record().encode();
        assert!(
            body.len() + 2 < crate::wal::record::MAX_PAYLOAD,
            "{} bytes",
            body.len()
        );
    }

    #[test]
    fn feed_group_apply_and_checkpoint_agree() {
        let mut g = Group::new(Stream::All, "orders".into(), 0);
        for rec in &every_record()[3..6] {
            g.apply(rec);
        }
        // 11 acked; 10 claimed by c2 with its count overridden to 0; 30 still c1's.
        assert_eq!(g.pending.keys().copied().collect::<Vec<_>>(), vec![10, 30]);
        assert_eq!(g.pending[&10].consumer, "c2");
        assert_eq!(g.pending[&10].count, 0);
        assert_eq!(g.consumers["c1"].pending.len(), 1);
        assert_eq!(g.oldest_needed(), 10);
        let cp = g.checkpoint_record();
        let mut h = Group::new(Stream::All, "orders".into(), 0);
        h.apply(&cp);
        assert_eq!(h.pending, g.pending);
        assert_eq!(h.consumers, g.consumers);
        assert_eq!(h.last, 30);
    }
}
