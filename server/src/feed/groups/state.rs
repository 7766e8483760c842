//! One consumer group's state and its one transition function, [`Group::apply`], run
//! live and at replay alike, so replaying a group's records rebuilds it exactly.

use std::collections::{BTreeMap, BTreeSet};

use super::GroupRecord;
use crate::engine::event::Lsn;
use crate::feed::Stream;

/// A pending entry: delivered to `consumer`, not acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nack {
    /// The consumer that holds it.
    pub consumer: String,
    /// When it was last delivered, in ms since the Unix epoch (`XPENDING`'s idle time counts from
    /// it).
    pub delivery_ms: u64,
    /// How many times it was delivered (`XPENDING`'s delivery count).
    pub count: u64,
}

/// One consumer of a group and the entries delivered to it and not acknowledged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Consumer {
    /// Last time it read or claimed (also an empty read; not logged on its own).
    pub seen_ms: u64,
    /// Last time it was given an entry (0: never).
    pub active_ms: u64,
    /// The LSNs of its pending entries.
    pub pending: BTreeSet<Lsn>,
}

/// One consumer group.
#[derive(Debug)]
pub struct Group {
    /// The stream the group reads.
    pub stream: Stream,
    /// The group's name, unique within its stream.
    pub name: String,
    /// The last-delivered id: `>` reads continue after it.
    pub last: Lsn,
    /// How far `>` reads have examined the log past `last` without finding an entry of
    /// the stream (records of other sales, the groups' own records). Not logged: after a
    /// restart the scan just starts at `last` again.
    pub scanned: Lsn,
    /// The group's consumers by name.
    pub consumers: BTreeMap<String, Consumer>,
    /// Entries delivered and not acknowledged (the pending entries list), by LSN.
    pub pending: BTreeMap<Lsn, Nack>,
    /// Removed from the registry (a holder of an old handle must not log for it).
    destroyed: bool,
}

impl Group {
    pub(super) fn new(stream: Stream, name: String, last: Lsn) -> Group {
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

    /// Removed from the registry: a holder of an old handle must not change it.
    pub(super) fn is_destroyed(&self) -> bool {
        self.destroyed
    }

    pub(super) fn mark_destroyed(&mut self) {
        debug_assert!(!self.destroyed, "group '{}' destroyed twice", self.name);
        self.destroyed = true;
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

    /// Makes `consumer` the one owner of pending entry `id` (a new entry, a claimed one
    /// or one restored from a checkpoint): an entry is in exactly one consumer's list.
    fn set_owner(&mut self, id: Lsn, consumer: &str, nack: Nack) {
        debug_assert_eq!(nack.consumer, consumer);
        if let Some(old) = self.pending.insert(id, nack) {
            if old.consumer != consumer {
                if let Some(c) = self.consumers.get_mut(&old.consumer) {
                    c.pending.remove(&id);
                }
            }
        }
        if let Some(c) = self.consumers.get_mut(consumer) {
            c.pending.insert(id);
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
            } => self.consumer_changed(consumer, *at_ms, *delete),
            GroupRecord::Delivered {
                consumer,
                at_ms,
                last,
                new,
                again,
                ..
            } => self.delivered(consumer, *at_ms, *last, new, again),
            GroupRecord::Acked { ids, .. } => {
                for id in ids {
                    self.drop_pending(*id);
                }
                debug_assert!(ids.iter().all(|id| !self.pending.contains_key(id)));
            }
            GroupRecord::Claimed { .. } => self.claimed(rec),
            GroupRecord::Checkpoint {
                last,
                scanned,
                consumers,
                pending,
                ..
            } => {
                self.restore(*last, *scanned, consumers, pending);
                self.debug_check_owners(self.pending.keys());
            }
        }
        self.debug_check_counts();
    }

    /// `XGROUP CREATECONSUMER` (`delete` false) or `DELCONSUMER`: a deleted consumer's
    /// pending entries leave the group with it.
    fn consumer_changed(&mut self, consumer: &str, at_ms: u64, delete: bool) {
        if !delete {
            self.consumer_mut(consumer, at_ms);
            return;
        }
        if let Some(c) = self.consumers.remove(consumer) {
            for id in c.pending {
                let owner = self.pending.remove(&id).map(|n| n.consumer);
                debug_assert_eq!(owner.as_deref(), Some(consumer));
            }
        }
    }

    /// `XREADGROUP`: `new` entries become pending for `consumer` with one delivery, the
    /// last-delivered id moves forward to `last` (0: unchanged), `again` entries count
    /// one more delivery.
    fn delivered(&mut self, consumer: &str, at_ms: u64, last: Lsn, new: &[Lsn], again: &[Lsn]) {
        let before = self.last;
        if last > 0 {
            self.last = self.last.max(last);
        }
        debug_assert!(self.last >= before, "last-delivered id moved back");
        let c = self.consumer_mut(consumer, at_ms);
        if !new.is_empty() || !again.is_empty() {
            c.active_ms = at_ms;
        }
        for id in new {
            let nack = Nack {
                consumer: consumer.to_owned(),
                delivery_ms: at_ms,
                count: 1,
            };
            // An id cannot be new twice, but if a log says so the entry has exactly one
            // owner: the new one.
            self.set_owner(*id, consumer, nack);
        }
        for id in again {
            if let Some(n) = self.pending.get_mut(id) {
                n.count = n.count.saturating_add(1);
                n.delivery_ms = at_ms;
            }
        }
        self.debug_check_owners(new);
    }

    /// `XCLAIM`/`XAUTOCLAIM`: `ids` move to `consumer`; `dropped` ones (gone from the
    /// log) leave the pending list.
    fn claimed(&mut self, rec: &GroupRecord) {
        let GroupRecord::Claimed {
            consumer,
            at_ms,
            delivery_ms,
            ids,
            bump,
            retry,
            dropped,
            ..
        } = rec
        else {
            return;
        };
        for id in dropped {
            self.drop_pending(*id);
        }
        self.consumer_mut(consumer, *at_ms);
        for id in ids {
            let Some(n) = self.pending.get(id) else {
                continue;
            };
            let mut count = if *bump {
                n.count.saturating_add(1)
            } else {
                n.count
            };
            if let Some(r) = retry {
                count = *r;
            }
            let nack = Nack {
                consumer: consumer.clone(),
                delivery_ms: *delivery_ms,
                count,
            };
            self.set_owner(*id, consumer, nack);
            if let Some(c) = self.consumers.get_mut(consumer) {
                c.active_ms = *at_ms;
            }
        }
        self.debug_check_owners(ids);
        debug_assert!(dropped.iter().all(|id| !self.pending.contains_key(id)));
    }

    /// A checkpoint: the group's whole state replaces what replay built so far. A
    /// pending entry naming no listed consumer is left out.
    fn restore(
        &mut self,
        last: Lsn,
        scanned: Lsn,
        consumers: &[(String, u64, u64)],
        pending: &[(Lsn, u64, u64, u64)],
    ) {
        self.last = last;
        self.scanned = scanned;
        self.consumers.clear();
        self.pending.clear();
        for (name, seen, active) in consumers {
            let c = Consumer {
                seen_ms: *seen,
                active_ms: *active,
                pending: BTreeSet::new(),
            };
            self.consumers.insert(name.clone(), c);
        }
        for (id, owner, at, count) in pending {
            let Some((name, _, _)) = usize::try_from(*owner).ok().and_then(|i| consumers.get(i))
            else {
                continue;
            };
            let nack = Nack {
                consumer: name.clone(),
                delivery_ms: *at,
                count: *count,
            };
            self.set_owner(*id, name, nack);
        }
    }

    /// The invariant every transition keeps, whatever its record says: each pending
    /// entry is in its owner's list and in no other. In debug builds each transition
    /// checks the counts agree (O(consumers)) and the owners of the entries it touched.
    fn debug_check_counts(&self) {
        if cfg!(debug_assertions) {
            let listed: usize = self.consumers.values().map(|c| c.pending.len()).sum();
            debug_assert_eq!(listed, self.pending.len(), "group '{}'", self.name);
        }
    }

    /// Each of `ids` that is pending is listed by its owner.
    fn debug_check_owners<'a>(&self, ids: impl IntoIterator<Item = &'a Lsn>) {
        if cfg!(debug_assertions) {
            for id in ids {
                if let Some(n) = self.pending.get(id) {
                    let listed = self
                        .consumers
                        .get(&n.consumer)
                        .map(|c| c.pending.contains(id));
                    debug_assert_eq!(listed, Some(true), "pending entry {id} of '{}'", n.consumer);
                }
            }
        }
    }

    pub(super) fn checkpoint_record(&self) -> GroupRecord {
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

#[cfg(test)]
mod tests {
    use super::super::record::tests::every_record;
    use super::super::GroupLimits;
    use super::*;

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

    /// Whatever a record says, an entry has one owner: a checkpoint listing an id twice,
    /// or a delivery of an id another consumer holds, leaves it in one consumer's list.
    #[test]
    fn feed_group_entry_has_one_owner_whatever_the_record_says() {
        let mut g = Group::new(Stream::All, "orders".into(), 0);
        g.apply(&GroupRecord::Checkpoint {
            stream: "stockgate:events".into(),
            group: "orders".into(),
            last: 9,
            scanned: 0,
            consumers: vec![("a".into(), 1, 1), ("b".into(), 1, 1)],
            pending: vec![(5, 0, 1, 1), (5, 1, 2, 3), (6, 7, 1, 1)],
        });
        assert_eq!(g.pending.keys().copied().collect::<Vec<_>>(), vec![5]);
        assert_eq!(g.pending[&5].consumer, "b");
        assert!(g.consumers["a"].pending.is_empty());
        assert_eq!(g.consumers["b"].pending.len(), 1);
        g.apply(&GroupRecord::Delivered {
            stream: "stockgate:events".into(),
            group: "orders".into(),
            consumer: "a".into(),
            at_ms: 3,
            last: 0,
            new: vec![5, 5],
            again: vec![],
        });
        assert_eq!(g.pending[&5].consumer, "a");
        assert!(g.consumers["b"].pending.is_empty());
        assert_eq!(
            g.last, 9,
            "a delivery with last 0 keeps the last-delivered id"
        );
    }
}
