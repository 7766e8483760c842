//! The slot table as it is now: who owns each slot, and which slots are migrating or
//! importing (docs/cluster.md, "Moving slots"). It starts as the map file's and changes
//! only through `CLUSTER SETSLOT`, each change logged in the group's log (an opaque
//! record, [`K_SLOT_SET`]) so a restart and every Raft member see the same table.

use stockgate_core::wal::record::K_SLOT_SET;

use super::map::SlotMap;
use super::slot::SLOTS;

/// One `CLUSTER SETSLOT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotChange {
    /// `IMPORTING <source>`: this group takes the slot's keys from group `from`.
    Importing {
        /// The slot.
        slot: u16,
        /// The group the keys come from.
        from: u16,
    },
    /// `MIGRATING <dest>`: this group hands the slot's keys to group `to`.
    Migrating {
        /// The slot.
        slot: u16,
        /// The group the keys go to.
        to: u16,
    },
    /// `NODE <id>`: the slot belongs to group `owner`; migration states are cleared.
    Node {
        /// The slot.
        slot: u16,
        /// The new owner.
        owner: u16,
    },
    /// `STABLE`: migration states are cleared.
    Stable {
        /// The slot.
        slot: u16,
    },
}

const OP_IMPORTING: u8 = 0;
const OP_MIGRATING: u8 = 1;
const OP_NODE: u8 = 2;
const OP_STABLE: u8 = 3;

impl SlotChange {
    /// The record's kind and body: `op u8 | slot u16 LE | group u16 LE`.
    pub fn encode(&self) -> (u8, Vec<u8>) {
        let (op, slot, group) = match *self {
            SlotChange::Importing { slot, from } => (OP_IMPORTING, slot, from),
            SlotChange::Migrating { slot, to } => (OP_MIGRATING, slot, to),
            SlotChange::Node { slot, owner } => (OP_NODE, slot, owner),
            SlotChange::Stable { slot } => (OP_STABLE, slot, 0),
        };
        let mut body = vec![op];
        body.extend_from_slice(&slot.to_le_bytes());
        body.extend_from_slice(&group.to_le_bytes());
        (K_SLOT_SET, body)
    }

    /// The change a record's body holds; `None` for bytes no version wrote.
    pub fn decode(body: &[u8]) -> Option<SlotChange> {
        let [op, s0, s1, g0, g1] = *body else {
            return None;
        };
        let slot = u16::from_le_bytes([s0, s1]);
        let group = u16::from_le_bytes([g0, g1]);
        if slot >= SLOTS {
            return None;
        }
        Some(match op {
            OP_IMPORTING => SlotChange::Importing { slot, from: group },
            OP_MIGRATING => SlotChange::Migrating { slot, to: group },
            OP_NODE => SlotChange::Node { slot, owner: group },
            OP_STABLE => SlotChange::Stable { slot },
            _ => return None,
        })
    }
}

/// Per slot: its owner, and where it is migrating to or importing from (group indices).
#[derive(Debug, Clone, PartialEq)]
pub struct SlotTable {
    owner: Vec<Option<u16>>,
    migrating: Vec<Option<u16>>,
    importing: Vec<Option<u16>>,
}

impl SlotTable {
    /// The map file's owners, nothing migrating.
    pub fn from_map(map: &SlotMap) -> SlotTable {
        let n = usize::from(SLOTS);
        SlotTable {
            owner: (0..SLOTS).map(|s| map.owner(s).map(|g| g as u16)).collect(),
            migrating: vec![None; n],
            importing: vec![None; n],
        }
    }

    /// The group owning `slot`.
    pub fn owner(&self, slot: u16) -> Option<usize> {
        self.owner
            .get(usize::from(slot))
            .copied()
            .flatten()
            .map(usize::from)
    }

    /// The group `slot` is migrating to, on its owner.
    pub fn migrating(&self, slot: u16) -> Option<usize> {
        self.migrating
            .get(usize::from(slot))
            .copied()
            .flatten()
            .map(usize::from)
    }

    /// The group `slot` is importing from, on its destination.
    pub fn importing(&self, slot: u16) -> Option<usize> {
        self.importing
            .get(usize::from(slot))
            .copied()
            .flatten()
            .map(usize::from)
    }

    /// Slots with an owner.
    pub fn assigned(&self) -> usize {
        self.owner.iter().filter(|o| o.is_some()).count()
    }

    /// The inclusive slot ranges group `g` owns, in slot order.
    pub fn ranges(&self, g: usize) -> Vec<(u16, u16)> {
        let mut out: Vec<(u16, u16)> = Vec::new();
        for s in 0..SLOTS {
            if self.owner(s) != Some(g) {
                continue;
            }
            match out.last_mut() {
                Some((_, end)) if *end + 1 == s => *end = s,
                _ => out.push((s, s)),
            }
        }
        out
    }

    /// The table after `change`; a group index beyond `groups` changes nothing.
    pub fn with(&self, change: &SlotChange, groups: usize) -> SlotTable {
        let mut t = self.clone();
        let ok = |g: u16| usize::from(g) < groups;
        match *change {
            SlotChange::Importing { slot, from } if ok(from) => {
                t.importing[usize::from(slot)] = Some(from);
            }
            SlotChange::Migrating { slot, to } if ok(to) => {
                t.migrating[usize::from(slot)] = Some(to);
            }
            SlotChange::Node { slot, owner } if ok(owner) => {
                t.owner[usize::from(slot)] = Some(owner);
                t.migrating[usize::from(slot)] = None;
                t.importing[usize::from(slot)] = None;
            }
            SlotChange::Stable { slot } => {
                t.migrating[usize::from(slot)] = None;
                t.importing[usize::from(slot)] = None;
            }
            _ => {}
        }
        t
    }

    /// The changes that turn the map file's table into this one: what a snapshot
    /// re-logs before it deletes the records that made them.
    pub fn changes_from(&self, base: &SlotTable) -> Vec<SlotChange> {
        let mut out = Vec::new();
        for s in 0..SLOTS {
            let i = usize::from(s);
            if let (Some(o), true) = (self.owner[i], self.owner[i] != base.owner[i]) {
                out.push(SlotChange::Node { slot: s, owner: o });
            }
            if let Some(to) = self.migrating[i] {
                out.push(SlotChange::Migrating { slot: s, to });
            }
            if let Some(from) = self.importing[i] {
                out.push(SlotChange::Importing { slot: s, from });
            }
        }
        out
    }
}

/// The slot records a Raft snapshot's state file carries, folded: per slot its last
/// owner set by `NODE` and the migration states in force, instead of every `SETSLOT`
/// ever logged. Replayed over the map file's table (the same map) they give the same
/// table as the records they replace, and their number is bounded by the slots (at
/// most three per slot) however many moves ran. Undecodable bodies are dropped, as
/// applying them skips them; other kinds pass through unchanged.
pub fn compact_records(records: Vec<(u8, Vec<u8>)>, groups: usize) -> Vec<(u8, Vec<u8>)> {
    let n = usize::from(SLOTS);
    let mut folded = SlotTable {
        owner: vec![None; n],
        migrating: vec![None; n],
        importing: vec![None; n],
    };
    let mut out = Vec::new();
    for (kind, body) in records {
        if kind != K_SLOT_SET {
            out.push((kind, body));
        } else if let Some(c) = SlotChange::decode(&body) {
            folded = folded.with(&c, groups);
        }
    }
    let none = SlotTable {
        owner: vec![None; n],
        migrating: vec![None; n],
        importing: vec![None; n],
    };
    out.extend(folded.changes_from(&none).iter().map(SlotChange::encode));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> SlotMap {
        SlotMap::parse(&format!(
            "group a 0-99\nnode {:040x} 127.0.0.1:7001\ngroup b 100-16383\nnode {:040x} 127.0.0.1:7002\n",
            1, 2
        ))
        .unwrap()
    }

    #[test]
    fn slot_changes_round_trip_and_apply() {
        for c in [
            SlotChange::Importing { slot: 5, from: 1 },
            SlotChange::Migrating { slot: 16383, to: 0 },
            SlotChange::Node { slot: 0, owner: 1 },
            SlotChange::Stable { slot: 7 },
        ] {
            let (kind, body) = c.encode();
            assert_eq!(kind, K_SLOT_SET);
            assert_eq!(SlotChange::decode(&body), Some(c));
        }
        assert_eq!(SlotChange::decode(&[9, 0, 0, 0, 0]), None);
        assert_eq!(SlotChange::decode(&[2, 0xff, 0xff, 0, 0]), None);
        assert_eq!(SlotChange::decode(&[2, 0, 0]), None);
        let base = SlotTable::from_map(&map());
        let t = base
            .with(&SlotChange::Migrating { slot: 50, to: 1 }, 2)
            .with(&SlotChange::Migrating { slot: 60, to: 9 }, 2);
        assert_eq!(t.migrating(50), Some(1));
        assert_eq!(t.migrating(60), None, "no such group");
        let t = t.with(&SlotChange::Node { slot: 50, owner: 1 }, 2);
        assert_eq!((t.owner(50), t.migrating(50)), (Some(1), None));
        assert_eq!(t.ranges(0), vec![(0, 49), (51, 99)]);
        assert_eq!(t.ranges(1), vec![(50, 50), (100, 16383)]);
        let again = t
            .changes_from(&base)
            .iter()
            .fold(base.clone(), |acc, c| acc.with(c, 2));
        assert_eq!(again, t);
    }

    #[test]
    fn compacted_records_give_the_same_table_and_stay_bounded() {
        let base = SlotTable::from_map(&map());
        let mut live = base.clone();
        let mut recs = Vec::new();
        // Slot 50 moves to b and back forty times, slot 60 is left mid-move, slot 70
        // gets a change naming a group the map has not (ignored live, so dropped too).
        let mut log = |c: SlotChange, live: &mut SlotTable| {
            *live = live.with(&c, 2);
            recs.push(c.encode());
        };
        for i in 0..40u16 {
            let (from, to) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
            log(SlotChange::Migrating { slot: 50, to }, &mut live);
            log(SlotChange::Importing { slot: 50, from }, &mut live);
            log(
                SlotChange::Node {
                    slot: 50,
                    owner: to,
                },
                &mut live,
            );
        }
        log(SlotChange::Migrating { slot: 60, to: 1 }, &mut live);
        log(SlotChange::Node { slot: 70, owner: 9 }, &mut live);
        log(SlotChange::Importing { slot: 80, from: 1 }, &mut live);
        log(SlotChange::Stable { slot: 80 }, &mut live);
        recs.push((K_SLOT_SET, vec![9, 9]));
        let n = recs.len();
        let compact = compact_records(recs, 2);
        assert_eq!(
            compact.len(),
            2,
            "of {n}: slot 50's owner and slot 60's migration"
        );
        let replayed = compact
            .iter()
            .filter_map(|(_, b)| SlotChange::decode(b))
            .fold(base.clone(), |t, c| t.with(&c, 2));
        assert_eq!(replayed, live);
        assert_eq!(replayed.owner(50), Some(0), "moved back on the 40th move");
        assert_eq!(
            compact_records(compact.clone(), 2),
            compact,
            "a fixed point"
        );
    }
}
